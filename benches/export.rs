//! Export and restore of 100k memories with 384-d embeddings: the lossless
//! JSONL export, a Parquet query export, and the restore of the JSONL into an
//! empty data directory.
//!
//! `cargo bench --bench export`

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

use loomem::core::model::Chunk;
use loomem::core::Caller;
use loomem::service::export::{restore, Export, ExportFormat};
use loomem::service::sql::SqlLimits;
use loomem::store::Store;

const ROWS: usize = 100_000;
const DIM: usize = 384;

fn chunk(i: usize) -> Chunk {
    let mut c = Chunk::new(
        format!("id-{i:07}"),
        format!("s{}", i % 20),
        format!("memory {i} about topic {} and person {}", i % 997, i % 89),
        1_700_000_000_000_000 + (i as i64) * 1_000_000,
    );
    c.tags = vec![format!("t{}", i % 7)];
    c.entities = vec![format!("person{}", i % 89)];
    c.valid_from = Some(c.created_at);
    c.embedding = Some(
        (0..DIM)
            .map(|d| ((i * 31 + d) % 97) as f32 / 97.0)
            .collect(),
    );
    c.embed_model = Some("bench".into());
    c
}

fn bench_export(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(rt.block_on(Store::open(tmp.path(), DIM, 100_000)).unwrap());
    rt.block_on(async {
        for start in (0..ROWS).step_by(20_000) {
            let chunks: Vec<Chunk> = (start..start + 20_000).map(chunk).collect();
            store.upsert(chunks).await.unwrap();
        }
    });
    let limits = SqlLimits {
        timeout: Duration::from_secs(600),
        memory_bytes: 4 << 30,
        default_max_rows: 1_000,
        max_rows_cap: 1_000_000,
    };
    let admin = Caller::admin("bench");
    let export = |format| Export {
        store: &store,
        caller: &admin,
        limits: &limits,
        format,
        sql: None,
    };
    // Exports are written to a file, as every route writes them.
    let out = tmp.path().join("export.out");
    rt.block_on(export(ExportFormat::Jsonl).write_to(&out))
        .unwrap();
    let lossless = std::fs::read(&out).unwrap();
    eprintln!(
        "lossless export of {ROWS} memories: {:.1} MB",
        lossless.len() as f64 / 1e6
    );
    let text = String::from_utf8(lossless).unwrap();

    let mut group = c.benchmark_group("export_100k");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(60));
    group.bench_function("lossless_jsonl", |b| {
        b.iter(|| {
            rt.block_on(export(ExportFormat::Jsonl).write_to(&out))
                .unwrap()
        })
    });
    group.bench_function("parquet_query", |b| {
        b.iter(|| {
            rt.block_on(export(ExportFormat::Parquet).write_to(&out))
                .unwrap()
        })
    });
    group.bench_function("restore_into_empty_dir", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().unwrap();
                let fresh = rt.block_on(Store::open(dir.path(), DIM, 100_000)).unwrap();
                (dir, fresh)
            },
            |(dir, fresh)| {
                let report = rt.block_on(restore(&fresh, &admin, &text)).unwrap();
                assert_eq!(report.accepted, ROWS);
                rt.block_on(fresh.close());
                drop(dir);
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, bench_export);
criterion_main!(benches);
