//! Ingestion throughput: each hot stage on a 512-record batch, the int8
//! coding of a vector (`vector/quantize_i8_384`), and the whole path
//! (publish → JetStream → pipeline → Lance commit) with the `hash`
//! embedder, in records per second.
//!
//! `cargo bench --bench ingest` (needs `nats-server` on PATH; `just setup`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

use loomem::app::config::Config;
use loomem::app::Engine;
use loomem::core::model::Chunk;
use loomem::core::Caller;
use loomem::pipeline::{stages, BuildContext, Record};
use loomem::providers::embed::HashEmbedder;
use loomem::store::{Filter, Store};

#[path = "shared/log.rs"]
mod log;
#[path = "../tests/integration/moto.rs"]
#[allow(dead_code)]
mod moto;
#[path = "../tests/integration/nats.rs"]
#[allow(dead_code)]
mod nats;

const NAMES: &[&str] = &[
    "Alice", "Bob", "Carol", "Dmitri", "Eve", "Farah", "Gustavo", "Hana",
];
const THINGS: &[&str] = &[
    "prefers dark mode in VS Code",
    "is learning Rust for the billing project",
    "moved from Berlin to Lisbon",
    "booked a flight to Tokyo",
    "drinks oat milk flat whites",
    "runs the Kubernetes cluster at Acme Labs",
    "wants the dashboard project shipped by April 15th",
    "switched to Cursor for AI features",
    "is allergic to peanuts",
    "plays the cello on Thursdays",
];

/// `n` distinct, realistic memories (a few with HTML or PII to clean).
fn texts(n: usize, salt: &str) -> Vec<String> {
    (0..n)
        .map(|i| {
            let name = NAMES[i % NAMES.len()];
            let thing = THINGS[(i / NAMES.len()) % THINGS.len()];
            match i % 10 {
                0 => format!("<p>{name} {thing}</p> (note {salt}{i})"),
                1 => format!(
                    "{name} {thing}; reach them at {}.{i}@example.com (note {salt}{i})",
                    name.to_lowercase()
                ),
                _ => format!("{name} {thing} (note {salt}{i})"),
            }
        })
        .collect()
}

fn records(n: usize) -> Vec<Record> {
    texts(n, "s")
        .into_iter()
        .enumerate()
        .map(|(i, t)| Record::new(Chunk::new(format!("r{i}"), "bench".into(), t, i as i64)))
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn bench_stages(c: &mut Criterion) {
    loomem::store::maintain::lance_threads();
    let rt = runtime();
    let tmp = tempfile::tempdir().unwrap();
    let ctx = rt.block_on(async {
        BuildContext {
            store: Arc::new(Store::open(tmp.path(), 384, 8192).await.unwrap()),
            embedder: Arc::new(HashEmbedder::new(384)),
            llm: None,
            ner: None,
            dir: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines"),
        }
    });
    let mut group = c.benchmark_group("stage");
    group.throughput(Throughput::Elements(512));
    let params = |text: &str| -> toml::Table { text.parse().unwrap() };
    for (name, p) in [
        ("sanitize", params("")),
        ("redact_pii", params("")),
        (
            "extract_entities",
            params("dictionary_file = \"dictionaries/entities.toml\"\npopulate_graph = false"),
        ),
        ("embed", params("")),
    ] {
        let stage = stages::build(name, p, &ctx).unwrap();
        group.bench_function(name, |b| {
            b.iter_batched(
                || records(512),
                |mut batch| rt.block_on(stage.process(&mut batch)).unwrap(),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
    // The within-batch scans of a bulk batch (`bus.batch_size`, one stream,
    // embedded): every row against every earlier one.
    let mut group = c.benchmark_group("stage");
    group.throughput(Throughput::Elements(BULK_BATCH as u64));
    let embed = stages::build("embed", params(""), &ctx).unwrap();
    let embedded = rt.block_on(async {
        let mut batch = records(BULK_BATCH);
        embed.process(&mut batch).await.unwrap();
        batch
    });
    for (name, p) in [
        (
            "dedupe",
            params("near_against_store = false\nnear_within_batch = true"),
        ),
        ("score_surprise", params("against_store = false")),
    ] {
        let stage = stages::build(name, p, &ctx).unwrap();
        group.bench_function(format!("{name}_{BULK_BATCH}"), |b| {
            b.iter_batched(
                || embedded.clone(),
                |mut batch| rt.block_on(stage.process(&mut batch)).unwrap(),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
    // The int8 copy of a vector, as the hot index files every row it loads
    // or takes from a commit, and the dedupe scan codes each record.
    let mut group = c.benchmark_group("vector");
    group.throughput(Throughput::Elements(1000));
    let vectors: Vec<Vec<f32>> = (0..1000u32)
        .map(|i| {
            let mut v: Vec<f32> = (0..384)
                .map(|j| ((i * 384 + j) as f32 * 0.37).sin())
                .collect();
            loomem::core::vector::l2_normalize(&mut v);
            v
        })
        .collect();
    let mut codes = vec![0i8; 384];
    group.bench_function("quantize_i8_384", |b| {
        b.iter(|| {
            vectors
                .iter()
                .map(|v| loomem::core::vector::quantize_i8(v, &mut codes))
                .sum::<f32>()
        })
    });
    group.finish();
}

/// A bulk import's batch: the default `bus.batch_size` until session 42
/// (4,096 since), kept so the stage figures compare across sessions.
const BULK_BATCH: usize = 2048;

/// A daemon engine on a temp dir or a bucket, fed through its own bus.
struct Rig {
    engine: Arc<Engine>,
    _nats: Option<nats::NatsServer>,
    _cluster: Option<nats::NatsCluster>,
    _moto: Option<moto::Moto>,
    _dir: tempfile::TempDir,
}

/// The bus a case publishes to.
#[derive(Clone, Copy, PartialEq)]
enum BusAt {
    Embedded,
    /// One nats-server.
    Node,
    /// Three nats-servers, the stream at three replicas.
    Cluster,
}

/// Where a case keeps its tables.
#[derive(Clone, Copy, PartialEq)]
enum DataAt {
    Disk,
    /// A moto S3 server on loopback.
    Bucket,
}

fn rig(rt: &tokio::runtime::Runtime, bus: BusAt, data: DataAt, provider: &str) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let nats = (bus == BusAt::Node).then(|| nats::NatsServer::start(&dir.path().join("nats")));
    let cluster = (bus == BusAt::Cluster).then(|| {
        let c = nats::NatsCluster::start(&dir.path().join("nats"));
        rt.block_on(c.ready());
        c
    });
    let mut env: HashMap<String, String> = HashMap::new();
    env.insert(
        "LOOMEM_STORAGE__DATA_DIR".into(),
        dir.path().join("data").display().to_string(),
    );
    let moto = (data == DataAt::Bucket).then(|| {
        let m = rt.block_on(moto::Moto::start());
        rt.block_on(m.bucket("loomem-bench"));
        env.extend(m.env("s3://loomem-bench/data"));
        m
    });
    env.insert("LOOMEM_EMBED__PROVIDER".into(), provider.into());
    // Other overrides from the bench's own environment (LOOMEM_BUS__BATCH_SIZE=…).
    for (k, v) in std::env::vars() {
        if k.starts_with("LOOMEM_") && !env.contains_key(&k) {
            env.insert(k, v);
        }
    }
    let url = match (&nats, &cluster) {
        (Some(n), _) => Some(n.url()),
        (_, Some(c)) => {
            env.insert("LOOMEM_BUS__REPLICAS".into(), "3".into());
            Some(c.urls())
        }
        _ => None,
    };
    match url {
        Some(url) => {
            env.insert("LOOMEM_BUS__KIND".into(), "jetstream".into());
            env.insert("LOOMEM_BUS__NATS_URL".into(), url);
        }
        None => {
            env.insert("LOOMEM_BUS__KIND".into(), "embedded".into());
        }
    }
    let cfg = Config::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml"),
        &env,
    )
    .unwrap();
    let engine = rt.block_on(Engine::start(cfg, &env)).unwrap();
    Rig {
        engine,
        _nats: nats,
        _cluster: cluster,
        _moto: moto,
        _dir: dir,
    }
}

/// (label, bus, tables, embedder, memories per iteration; `LOOMEM_BENCH_CASES`
/// picks labels, comma-separated). MiniLM runs fewer: the model, not the
/// pipeline, sets its pace (~2.5 ms per text on 2 cores). The cluster and
/// bucket cases run on loopback: three nats-servers and a moto server share
/// the machine's two cores with loomem.
const CASES: [(&str, BusAt, DataAt, &str, usize); 7] = [
    ("jetstream", BusAt::Node, DataAt::Disk, "hash", 5000),
    ("embedded", BusAt::Embedded, DataAt::Disk, "hash", 5000),
    (
        "jetstream_static",
        BusAt::Node,
        DataAt::Disk,
        "static",
        5000,
    ),
    (
        "jetstream_minilm",
        BusAt::Node,
        DataAt::Disk,
        "minilm",
        1000,
    ),
    ("cluster", BusAt::Cluster, DataAt::Disk, "hash", 5000),
    ("bucket", BusAt::Node, DataAt::Bucket, "hash", 5000),
    (
        "cluster_bucket",
        BusAt::Cluster,
        DataAt::Bucket,
        "hash",
        5000,
    ),
];

/// One import of `n` memories into a stream of its own, through the bus and
/// the `import` pipeline; the time until all are committed.
fn import_once(
    rt: &tokio::runtime::Runtime,
    rig: &Rig,
    label: &str,
    round: usize,
    n: usize,
) -> Duration {
    let stream = format!("bench-{round}");
    let text: String = texts(n, &format!("{label}{round}-"))
        .into_iter()
        .map(|t| serde_json::json!({ "content": t }).to_string() + "\n")
        .collect();
    rt.block_on(async {
        let engine = &rig.engine;
        let parsed = loomem::service::import::parse(
            loomem::service::import::Format::Jsonl,
            &text,
            Some(&stream),
            &Caller::admin("bench"),
            &engine.ids,
        )
        .unwrap();
        let pipeline = engine.pipelines.get("import").unwrap();
        let before = written(&pipeline.stats());
        let started = Instant::now();
        loomem::service::import::publish(&engine.bus, Some(&engine.store), parsed, |_, _| {})
            .await
            .unwrap();
        // The write stage's own counter says when the rows
        // are committed; the table is asked once they are
        // (a count of a large table, every 2 ms, took the
        // CPU the import needed). Until then, or if some
        // were dropped, it is asked every 100 ms.
        let filter = Filter::new().stream(&stream);
        let mut asked = Instant::now();
        loop {
            let done = written(&pipeline.stats()) >= before + n as u64;
            if done || asked.elapsed() >= Duration::from_millis(100) {
                if engine.store.count(&filter).await.unwrap() >= n {
                    break;
                }
                asked = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        started.elapsed()
    })
}

/// Records the pipeline's write stage has committed so far.
fn written(stats: &[loomem::pipeline::StageStatsSnapshot]) -> u64 {
    stats
        .iter()
        .find(|s| s.stage == "write")
        .map_or(0, |s| s.records_out)
}

fn bench_e2e(c: &mut Criterion) {
    loomem::store::maintain::lance_threads();
    log::init();
    let rt = runtime();
    let mut group = c.benchmark_group("ingest_e2e");
    group.sample_size(10);
    // `LOOMEM_BENCH_E2E_SECS`: a longer run grows the table further (the
    // vector index is first built a minute in, at ~300,000 rows).
    let secs = std::env::var("LOOMEM_BENCH_E2E_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    group.measurement_time(Duration::from_secs(secs));
    let picked = std::env::var("LOOMEM_BENCH_CASES").ok();
    for (label, bus, data, provider, n) in CASES {
        if picked
            .as_deref()
            .is_some_and(|p| !p.split(',').any(|l| l == label))
        {
            continue;
        }
        let rig = rig(&rt, bus, data, provider);
        let mut round = 0;
        let mut wall = Duration::ZERO;
        group.throughput(Throughput::Elements(n as u64));
        // `LOOMEM_BENCH_E2E_IMPORTS=k`: exactly k imports instead of
        // criterion's plan, whose count of iterations (and so the size the
        // table grows to, which sets the pace) follows the warm-up: the
        // fixed size to compare two builds or settings by.
        let fixed: Option<usize> = std::env::var("LOOMEM_BENCH_E2E_IMPORTS")
            .ok()
            .and_then(|s| s.parse().ok());
        match fixed {
            Some(k) => {
                for _ in 0..k {
                    round += 1;
                    wall += import_once(&rt, &rig, label, round, n);
                }
                eprintln!(
                    "\n{label}: {k} imports of {n}: {:.0} records/s",
                    (k * n) as f64 / wall.as_secs_f64()
                );
            }
            None => {
                group.bench_function(format!("{label}_import_{n}"), |b| {
                    b.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            round += 1;
                            total += import_once(&rt, &rig, label, round, n);
                        }
                        wall += total;
                        total
                    })
                });
            }
        }
        // Per-stage share of the pipeline's time over the whole run.
        let stats = rig.engine.pipelines.get("import").unwrap().stats();
        let records: u64 = stats.first().map(|s| s.records_in).unwrap_or(0);
        if records == 0 {
            // Filtered out on the command line.
            rt.block_on(rig.engine.shutdown());
            continue;
        }
        eprintln!("\nper-stage time, {label} (import pipeline, {records} records):");
        for s in &stats {
            eprintln!(
                "  {:<22} {:>8.1} µs/record  {:>10.0} records/s",
                s.stage,
                s.total_micros as f64 / records.max(1) as f64,
                records as f64 / (s.total_micros.max(1) as f64 / 1e6)
            );
        }
        // The pipeline's cost beyond the embedder: everything the wall clock saw
        // (bus, every other stage, commit) over the embed stage's own time.
        if let Some(embed) = stats.iter().find(|s| s.stage == "embed") {
            let wall_per = wall.as_micros() as f64 / records.max(1) as f64;
            let embed_per = embed.total_micros as f64 / records.max(1) as f64;
            eprintln!(
                "  end to end {wall_per:.1} µs/record, embed {embed_per:.1}: overhead {:.1}% of the embedder's time",
                100.0 * (wall_per - embed_per) / embed_per
            );
        }
        // What the writer's merges made of the chunk table at the end of the
        // run (a merge may still be running): fragments under the routine
        // size, the routine merges' (under twice it) and the second tier's.
        let target = rig.engine.cfg.storage.target_rows_per_fragment;
        let layout = rt.block_on(async {
            let table = rig.engine.store.chunks_table();
            let manifest = table.as_native().unwrap().manifest().await.unwrap();
            let mut tiers = [0usize; 3];
            for f in manifest.fragments.iter() {
                let rows = f.physical_rows.unwrap_or(0);
                tiers[usize::from(rows >= target) + usize::from(rows >= target * 2)] += 1;
            }
            tiers
        });
        eprintln!(
            "  chunk table: {} fragments under {target} rows, {} under {}, {} of the second tier",
            layout[0],
            layout[1],
            target * 2,
            layout[2]
        );
        rt.block_on(rig.engine.shutdown());
    }
    group.finish();
}

/// An agent's store as the writer sees it: one commit of 8 new memories (a
/// batch of eight concurrent `/v1/store` calls), into a table that grows by
/// each of criterion's thousands of iterations, with the writer's own
/// fragment merges and index refreshes running as they do in the daemon.
fn bench_small_commits(c: &mut Criterion) {
    loomem::store::maintain::lance_threads();
    let rt = runtime();
    let tmp = tempfile::tempdir().unwrap();
    let store = rt.block_on(Store::open(tmp.path(), 384, 8192)).unwrap();
    let texts = texts(8, "c");
    let embed = HashEmbedder::new(384);
    let vectors = rt
        .block_on(loomem::providers::embed::Embedder::embed(&embed, &texts))
        .unwrap();
    let mut round = 0usize;
    let mut group = c.benchmark_group("store");
    group.throughput(Throughput::Elements(8));
    group.bench_function("small_commit_8", |b| {
        b.iter_batched(
            || {
                round += 1;
                texts
                    .iter()
                    .zip(&vectors)
                    .enumerate()
                    .map(|(i, (t, v))| {
                        let mut c = Chunk::new(
                            format!("c{round}-{i}"),
                            format!("agent-{}", i % 4),
                            format!("{t} (round {round})"),
                            round as i64,
                        );
                        c.embedding = Some(v.clone());
                        c
                    })
                    .collect::<Vec<_>>()
            },
            |rows| {
                rt.block_on(store.commit_batch(loomem::store::WriteBatch {
                    fresh: Vec::new(),
                    rows,
                    side: Vec::new(),
                    refuse: false,
                    history: Vec::new(),
                }))
                .unwrap()
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
    eprintln!("\nstore/small_commit_8: {round} commits in all");
}

criterion_group!(benches, bench_stages, bench_small_commits, bench_e2e);
criterion_main!(benches);
