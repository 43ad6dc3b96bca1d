//! MiniLM (all-MiniLM-L6-v2, candle, CPU) throughput and latency: texts per
//! second at batch sizes 1, 8, 32 and 128 for short (~16 tokens) and long
//! (~200 tokens) texts, and the latency of one short query; the same for the
//! static embedder distilled from it.
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

criterion_group!(benches, bench);
criterion_main!(benches);
