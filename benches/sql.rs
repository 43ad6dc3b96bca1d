//! SQL over 1M chunks: a GROUP BY and a filtered scan, admin and stream-scoped.
//!
//! `cargo bench --bench sql`

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use loomem::core::model::{chunks_to_batch, Chunk};
use loomem::core::Caller;
use loomem::service::sql::{query, SqlLimits, SqlRequest};
use loomem::store::Store;

const ROWS: usize = 1_000_000;
const TYPES: &[&str] = &[
    "fact",
    "preference",
    "project",
    "decision",
    "observation",
    "general",
];

fn bench_sql(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(rt.block_on(Store::open(tmp.path(), 384, 100_000)).unwrap());
    rt.block_on(async {
        let table = store.chunks_table();
        for start in (0..ROWS).step_by(100_000) {
            let chunks: Vec<Chunk> = (start..start + 100_000)
                .map(|i| {
                    let mut c = Chunk::new(
                        format!("id-{i}"),
                        format!("s{}", i % 20),
                        format!("memory {i} about topic {} and person {}", i % 997, i % 89),
                        1_700_000_000_000_000 + (i as i64) * 1_000_000,
                    );
                    c.memory_type = TYPES[i % TYPES.len()].to_string();
                    c.importance = (i % 30) as f32 / 10.0;
                    c
                })
                .collect();
            table
                .add(chunks_to_batch(&chunks, 384).unwrap())
                .execute()
                .await
                .unwrap();
        }
    });
    let limits = SqlLimits {
        timeout: Duration::from_secs(120),
        memory_bytes: 1 << 30,
        default_max_rows: 1_000_000,
        max_rows_cap: 1_000_000,
    };
    let admin = Caller::admin("bench");
    let scoped = Caller::scoped("s3", vec!["s3".into()]);
    let mut group = c.benchmark_group("sql_1m");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(10);
    let cases = [
        (
            "group_by_stream_type",
            "SELECT stream, memory_type, count(*) AS n, avg(importance) AS imp FROM chunks GROUP BY stream, memory_type",
            &admin,
        ),
        (
            "filtered_scan",
            "SELECT id, content FROM chunks WHERE stream = 's3' AND memory_type = 'preference' AND importance > 1.5",
            &admin,
        ),
        ("scoped_group_by", "SELECT memory_type, count(*) AS n FROM chunks GROUP BY memory_type", &scoped),
    ];
    for (name, sql, caller) in cases {
        let req = SqlRequest {
            sql: sql.into(),
            params: vec![],
            format: None,
            max_rows: None,
        };
        group.bench_function(name, |b| {
            b.iter(|| rt.block_on(query(&store, caller, &limits, &req)).unwrap());
        });
    }
    group.finish();
}

criterion_group!(benches, bench_sql);
criterion_main!(benches);
