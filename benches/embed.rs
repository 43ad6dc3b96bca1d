//! MiniLM (all-MiniLM-L6-v2, candle, CPU) throughput and latency: texts per
//! second at batch sizes 1, 8, 32 and 128 for short (~16 tokens) and long
//! (~200 tokens) texts, and the latency of one short query; the same for the
//! static embedder distilled from it.
//!
//! `kernels/…`: MiniLM's four dense layers alone on the int8 kernel this CPU
//! runs (`LOOMEM_INT8_KERNEL=vnni` or `avx2` in the environment to compare
//! the kernels), and its attention, on one thread.
//!
//! `cargo bench --bench embed` (the model must be installed: `just setup`).

use std::collections::HashMap;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use loomem::app::config::Config;
use loomem::providers::embed::{Embedder, MiniLmEmbedder, StaticEmbedder};

const SHORT: &[&str] = &[
    "Prefers Cursor over VSCode for AI features and inline completions",
    "The standup moved to 9:30 every Monday in the big room",
    "Anna is allergic to peanuts and avoids Thai takeaway food",
    "Deploys to production happen on Tuesdays after the review call",
];

/// ~200 tokens: a paragraph of meeting notes.
fn long_text(i: usize) -> String {
    let sentence = "The quarterly planning meeting covered the migration of the billing service to the new cluster, \
        the hiring plan for the data team, and the customer complaints about slow exports; ";
    format!("Note {i}: {}", sentence.repeat(5))
}

fn config() -> Config {
    Config::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml"),
        &std::env::vars().collect::<HashMap<_, _>>(),
    )
    .expect("config loads")
}

fn bench(c: &mut Criterion) {
    // As `loomem` does (candle reads these when it first runs a kernel).
    loomem::providers::embed::minilm::kernel_threads();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cfg = config();
    let minilm = MiniLmEmbedder::load(
        &cfg.embed.model_dir,
        cfg.embed.max_tokens,
        128,
        cfg.embed.precision,
        cfg.embed.batch_niceness,
    )
    .expect("model installed (just setup)");
    let distilled = StaticEmbedder::load(&cfg.embed.model_dir, cfg.embed.max_tokens)
        .expect("model installed (just setup)");
    bench_model(c, &rt, "minilm", &minilm);
    bench_model(c, &rt, "static", &distilled);
}

fn bench_model(c: &mut Criterion, rt: &tokio::runtime::Runtime, name: &str, model: &dyn Embedder) {
    for (kind, make) in [
        (
            "short",
            (|i: usize| format!("{} #{i}", SHORT[i % SHORT.len()])) as fn(usize) -> String,
        ),
        ("long", long_text as fn(usize) -> String),
    ] {
        let mut group = c.benchmark_group(format!("{name}/{kind}"));
        group.sample_size(10);
        for batch in [1usize, 8, 32, 128] {
            if kind == "long" && batch == 128 {
                // ~5 s a pass on 2 cores; 32 already shows the per-text cost.
                continue;
            }
            let texts: Vec<String> = (0..batch).map(make).collect();
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_with_input(BenchmarkId::from_parameter(batch), &texts, |b, texts| {
                b.iter(|| rt.block_on(model.embed(texts)).unwrap())
            });
        }
        group.finish();
    }
    // One query as search embeds it: a short question, alone, through the
    // query path (MiniLM's query thread).
    let query = "What IDE does the user prefer?";
    c.bench_function(&format!("{name}/query_latency"), |b| {
        b.iter(|| rt.block_on(model.embed_query(query)).unwrap())
    });
}

/// One pass of 208 tokens (four texts of 52) through each of MiniLM's dense
/// layers and its attention, on one thread as a sub-batch runs.
fn kernels(c: &mut Criterion) {
    use loomem_kernels::{int8, nn, testing::values, Dense};
    let Some(kernel) = int8::kernel() else {
        return;
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let (texts, len) = (4, 52);
    let rows = texts * len;
    let mut group = c.benchmark_group("kernels");
    group.throughput(Throughput::Elements(rows as u64));
    println!("kernels: int8 on {kernel:?}");
    for (name, inputs, outputs) in [
        ("qkv", 384, 1152),
        ("attn_out", 384, 384),
        ("intermediate", 384, 1536),
        ("out", 1536, 384),
    ] {
        let layer = int8::Linear::new(&values(inputs * outputs, 1), &values(outputs, 2))
            .expect("the kernel runs here");
        let x = values(rows * inputs, 3);
        let (mut out, mut xs) = (Vec::new(), Vec::new());
        // The timing loop itself on the pool's one thread, as a sub-batch's
        // pass runs (no hand-over to it each pass).
        group.bench_function(format!("int8/{name}"), |b| {
            pool.install(|| b.iter(|| layer.forward_into(&x, &mut out, &mut xs)))
        });
    }
    let qkv = values(rows * 1152, 4);
    let spans: Vec<_> = (0..texts).map(|t| t * len..(t + 1) * len).collect();
    let mut out = vec![0.0f32; rows * 384];
    group.bench_function(format!("attention/{texts}x{len}"), |b| {
        b.iter(|| nn::attention(&qkv, 384, 12, &spans, &mut out))
    });
    group.finish();
}

criterion_group!(benches, bench, kernels);
criterion_main!(benches);
