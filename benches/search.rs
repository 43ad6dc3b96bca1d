//! Search latency at 10k and 100k memories in one stream, and on a
//! multi-tenant store of 1M memories over 1,000 streams: the full hybrid path
//! of `POST /v1/search` (query embedding with MiniLM, BM25, vector and graph
//! legs, fusion, ranking) minus HTTP.
//!
//! `cargo bench --bench search` (scenarios:
//! `LOOMEM_BENCH_SIZES=10000,100000,1000000x1000,1000000x1000:arrival`,
//! where `ROWSxSTREAMS` spreads the rows over streams with Zipf-distributed
//! sizes, the largest ~13% of the rows, and asks each query of a random
//! stream; `LOOMEM_BENCH_BUILD_ONLY=1` only builds the tables;
//! `LOOMEM_BENCH_SEED` draws other queries and streams;
//! `LOOMEM_BENCH_SLOW_MS=N` names each timed search of N ms or more with its
//! stream's size; a `:arrival` suffix stores the rows interleaved across
//! streams, in fragments the writer's merges make of 8,192-row commits, as
//! writers into many streams leave a table under the default configuration,
//! where without it each stream's rows lie together in one fragment; a
//! cached arrival table is first given the merges this build would make of
//! it, unless `LOOMEM_BENCH_KEEP_LAYOUT` is set). Other
//! `LOOMEM_*` overrides of `config.toml` apply, e.g.
//! `LOOMEM_SEARCH__VECTOR_FEEDBACK=0`.
//!
//! A one-stream store holds real text by default: the turns of LongMemEval_S
//! (`../shared/datasets/longmemeval/sessions.jsonl.gz`: its 98,780 user turns,
//! then assistant turns), each with its MiniLM vector, and is asked the
//! benchmark's questions (`s.questions.jsonl.gz`) and the opening words of its
//! turns. A multi-tenant store is synthetic by default: 12 words each from a
//! 4,000-word Zipf-distributed vocabulary, with random unit vectors (embedding
//! 1M texts with MiniLM would take over an hour here), asked 4 such words.
//! `ROWS[xSTREAMS]:synthetic` or `:longmemeval` chooses; `search_*/NAME` in the
//! output ends in `-longmemeval` for real text.
//! Tables are built once under `~/.cache/loomem/bench-data/` and reused. At and
//! above `search.vector_index_min_rows` (100k) the vector leg uses the
//! IVF-HNSW-SQ index where a search goes to Lance (the hot index holds streams
//! within `storage.hot_index_mb`). Besides criterion's estimate, p50, p95 and
//! p99 over 300 queries, the same with 16 concurrent searchers, and the
//! resident memory are printed per size; every measurement asks queries not
//! asked before (a repeated query skips its embedding).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};

#[path = "shared/log.rs"]
mod log;
#[path = "shared/longmemeval.rs"]
mod longmemeval;

use loomem::app::config::Config;
use loomem::app::Engine;
use loomem::core::model::{chunks_to_batch, Chunk};
use loomem::core::Caller;
use loomem::service::search::{self, SearchRequest};
use loomem::store::Store;

const DIM: usize = 384;
const BATCH: usize = 50_000;
const STREAM: &str = "bench";

/// Where a store's memories and queries come from.
#[derive(Clone, Copy, PartialEq)]
enum Text {
    /// LongMemEval_S turns with MiniLM vectors; its questions.
    LongMemEval,
    /// Zipf-drawn made-up words with random vectors.
    Synthetic,
}

/// How a store's rows lie in its table.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    /// Each stream's rows side by side, the table merged into one fragment
    /// (as the `compact` job leaves a table whose streams were imported one
    /// after the other).
    Grouped,
    /// The rows in the order many writers into many streams store them,
    /// interleaved, in commits of the routine merges' size
    /// (`storage.target_rows_per_fragment`, 8,192 by default), then
    /// merged as the writer merges them (as the default configuration, whose
    /// scheduler is off, keeps a table).
    Arrival,
}

/// A store to search: `rows` memories in `streams` streams.
#[derive(Clone, Copy)]
struct Scenario {
    rows: usize,
    streams: usize,
    text: Text,
    layout: Layout,
}

impl Scenario {
    /// `ROWS[xSTREAMS][:synthetic|:longmemeval][:arrival]`.
    fn parse(spec: &str) -> Scenario {
        let usage = "LOOMEM_BENCH_SIZES: ROWS[xSTREAMS][:synthetic|:longmemeval][:arrival]";
        let mut parts = spec.trim().split(':');
        let size = parts.next().unwrap_or_default();
        let number = |s: &str| s.parse().expect(usage);
        let (rows, streams) = match size.split_once('x') {
            Some((rows, streams)) => (number(rows), number(streams)),
            None => (number(size), 1),
        };
        let (mut text, mut layout) = (None, Layout::Grouped);
        for part in parts {
            match part {
                "synthetic" => text = Some(Text::Synthetic),
                "longmemeval" => text = Some(Text::LongMemEval),
                "arrival" => layout = Layout::Arrival,
                _ => panic!("{usage}"),
            }
        }
        let text = text.unwrap_or(match streams {
            1 => Text::LongMemEval,
            _ => Text::Synthetic,
        });
        Scenario {
            rows,
            streams,
            text,
            layout,
        }
    }

    fn name(&self) -> String {
        let size = match self.streams {
            1 => self.rows.to_string(),
            n => format!("{}x{n}", self.rows),
        };
        let size = match self.layout {
            Layout::Grouped => size,
            Layout::Arrival => format!("{size}-arrival"),
        };
        match self.text {
            Text::Synthetic => size,
            Text::LongMemEval => format!("{size}-longmemeval"),
        }
    }

    fn stream(&self, i: usize) -> String {
        match self.streams {
            1 => STREAM.to_string(),
            _ => format!("t{i:04}"),
        }
    }

    /// Rows per stream: Zipf (stream i gets a share of 1/(i+1)), the
    /// rounding left to the first.
    fn sizes(&self) -> Vec<usize> {
        let h: f64 = (1..=self.streams).map(|i| 1.0 / i as f64).sum();
        let mut sizes: Vec<usize> = (1..=self.streams)
            .map(|i| ((self.rows as f64 / h) / i as f64).floor().max(1.0) as usize)
            .collect();
        let given: usize = sizes.iter().sum();
        sizes[0] += self.rows.saturating_sub(given);
        sizes
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Zipf-like rank in 0..n: small ranks are common.
    fn zipf(&mut self, n: usize) -> usize {
        let u = self.unit().max(1e-6);
        ((n as f32).powf(u) - 1.0) as usize % n
    }
}

fn vocabulary() -> Vec<String> {
    const SYL: &[&str] = &[
        "ka", "lo", "mi", "ren", "tor", "vi", "sa", "del", "po", "nu", "gra", "shi", "ber", "ta",
        "quin", "ma", "zo", "fel",
    ];
    let mut words = Vec::new();
    'outer: for a in SYL {
        for b in SYL {
            for c in SYL {
                words.push(format!("{a}{b}{c}"));
                if words.len() == 4000 {
                    break 'outer;
                }
            }
        }
    }
    words
}

fn text(rng: &mut Rng, vocab: &[String], words: usize) -> String {
    (0..words)
        .map(|_| vocab[rng.zipf(vocab.len())].as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first `rows` turns of LongMemEval_S's sessions: every user turn, then
/// assistant turns.
fn longmemeval_turns(rows: usize) -> Vec<String> {
    let (user, assistant): (Vec<_>, Vec<_>) = longmemeval::turns()
        .into_iter()
        .partition(|(_, role, _)| role == "user");
    let turns: Vec<String> = user
        .into_iter()
        .chain(assistant)
        .map(|(_, _, text)| text)
        .take(rows)
        .collect();
    assert_eq!(turns.len(), rows, "LongMemEval_S has fewer turns");
    turns
}

/// 1,500 distinct queries: LongMemEval_S's questions, placed where the
/// percentiles of one pass are measured (from the 421st on), then the first
/// 8 words of turns drawn at random.
fn longmemeval_queries(turns: &[String], rng: &mut Rng) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut queries: Vec<String> = longmemeval::questions()
        .into_iter()
        .filter(|q| seen.insert(q.clone()))
        .collect();
    while queries.len() < 1500 {
        let opening = words_of(&turns[rng.next() as usize % turns.len()], 8);
        if seen.insert(opening.clone()) {
            queries.push(opening);
        }
    }
    queries.rotate_right(420);
    queries
}

/// A text's first `n` words.
fn words_of(text: &str, n: usize) -> String {
    text.split_whitespace()
        .take(n)
        .collect::<Vec<_>>()
        .join(" ")
}

fn data_dir(scenario: Scenario) -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    PathBuf::from(home).join(format!(
        ".cache/loomem/bench-data/search-{}",
        scenario.name()
    ))
}

/// Build the table of the scenario's memories with its indexes, unless
/// already there (`turns`: a real-text scenario's memories).
async fn build(
    dir: &Path,
    scenario: Scenario,
    turns: &[String],
    cfg: &Config,
    env: &HashMap<String, String>,
) {
    let (rows, index_min_rows) = (scenario.rows, cfg.search.vector_index_min_rows);
    let store = Store::open(dir, DIM, 100_000).await.unwrap();
    let have = store.count(&loomem::store::Filter::new()).await.unwrap();
    if have == rows && (rows < index_min_rows || store.has_vector_index().await) {
        if scenario.layout == Layout::Arrival && std::env::var("LOOMEM_BENCH_KEEP_LAYOUT").is_err()
        {
            // A table cached by an earlier build catches up with what this
            // build's merges make of it (nothing when there is nothing to do);
            // `LOOMEM_BENCH_KEEP_LAYOUT` measures it as it lies.
            let fragment_rows = cfg.storage.target_rows_per_fragment;
            let started = Instant::now();
            loomem::store::maintain::merge_fragments_in_tiers(
                store.chunks_table(),
                fragment_rows,
                loomem::store::CHUNK_ORDER,
            )
            .await
            .unwrap();
            let fragments = store
                .chunks_table()
                .stats()
                .await
                .unwrap()
                .fragment_stats
                .num_fragments;
            eprintln!(
                "tier merges of the cached table: {:?}, {fragments} fragments",
                started.elapsed()
            );
        }
        return;
    }
    assert_eq!(have, 0, "{} holds {have} rows; delete it", dir.display());
    let started = Instant::now();
    let vocab = vocabulary();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let table = store.chunks_table();
    let embedder = match scenario.text {
        Text::Synthetic => None,
        Text::LongMemEval => {
            let embedder = loomem::providers::embed::from_config(&cfg.embed, env).unwrap();
            assert_eq!(
                embedder.model(),
                "all-MiniLM-L6-v2",
                "real text is embedded with MiniLM"
            );
            Some(embedder)
        }
    };
    let owner: Vec<usize> = scenario
        .sizes()
        .into_iter()
        .enumerate()
        .flat_map(|(s, n)| std::iter::repeat_n(s, n))
        .collect();
    // An arrival table's rows, each taken when its turn to be stored comes.
    let mut arrivals: Vec<Option<Chunk>> = Vec::new();
    for start in (0..rows).step_by(BATCH) {
        let end = (start + BATCH).min(rows);
        let (texts, vectors): (Vec<String>, Vec<Vec<f32>>) = match &embedder {
            None => (start..end)
                .map(|_| {
                    let text = text(&mut rng, &vocab, 12);
                    let mut v: Vec<f32> = (0..DIM).map(|_| rng.unit() - 0.5).collect();
                    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                    v.iter_mut().for_each(|x| *x /= norm);
                    (text, v)
                })
                .unzip(),
            Some(embedder) => {
                let texts = turns[start..end].to_vec();
                let mut vectors = Vec::with_capacity(texts.len());
                for part in texts.chunks(256) {
                    vectors.extend(embedder.embed(part).await.unwrap());
                }
                eprintln!("embedded {end} of {rows} turns in {:?}", started.elapsed());
                (texts, vectors)
            }
        };
        let chunks: Vec<Chunk> = texts
            .into_iter()
            .zip(vectors)
            .enumerate()
            .map(|(k, (text, v))| {
                let i = start + k;
                let mut c = Chunk::new(
                    format!("m-{i}"),
                    scenario.stream(owner[i]),
                    text,
                    1_700_000_000_000_000 + i as i64 * 10_000_000,
                );
                c.embedding = Some(v);
                c.embed_model = Some("all-MiniLM-L6-v2".into());
                c
            })
            .collect();
        match scenario.layout {
            Layout::Grouped => {
                table
                    .add(chunks_to_batch(&chunks, DIM).unwrap())
                    .execute()
                    .await
                    .unwrap();
            }
            Layout::Arrival => arrivals.extend(chunks.into_iter().map(Some)),
        }
    }
    match scenario.layout {
        Layout::Grouped => {
            table
                .optimize(lancedb::table::OptimizeAction::Compact {
                    options: Default::default(),
                    remap_options: None,
                })
                .await
                .unwrap();
        }
        Layout::Arrival => {
            // The n-th row stored is row n × stride (mod rows): a step
            // coprime with the count visits every row once and moves from
            // stream to stream, as writers into many streams do. Each
            // fragment is one commit of the routine merges' size.
            let stride = (7919..)
                .find(|s| gcd(*s, rows) == 1)
                .expect("a coprime stride");
            let fragment_rows = cfg.storage.target_rows_per_fragment;
            for start in (0..rows).step_by(fragment_rows) {
                let end = (start + fragment_rows).min(rows);
                let chunks: Vec<Chunk> = (start..end)
                    .map(|n| {
                        let mut c = arrivals[n * stride % rows].take().unwrap();
                        c.created_at = 1_700_000_000_000_000 + n as i64 * 10_000_000;
                        c.updated_at = c.created_at;
                        c
                    })
                    .collect();
                table
                    .add(chunks_to_batch(&chunks, DIM).unwrap())
                    .execute()
                    .await
                    .unwrap();
            }
            // What the writer's merges make of them.
            loomem::store::maintain::merge_fragments_in_tiers(
                table,
                fragment_rows,
                loomem::store::CHUNK_ORDER,
            )
            .await
            .unwrap();
        }
    }
    table
        .optimize(lancedb::table::OptimizeAction::Index(Default::default()))
        .await
        .unwrap();
    store.ensure_vector_index(index_min_rows).await.unwrap();
    store.close().await;
    eprintln!("built {rows} memories in {:?}", started.elapsed());
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The ids of the `k` chunks nearest `vector` by cosine, by a flat scan.
async fn exact_nearest(store: &Store, vector: &[f32], k: usize) -> Vec<String> {
    use futures::TryStreamExt;
    use lancedb::query::{ExecutableQuery, QueryBase, Select};
    let batches: Vec<arrow_array::RecordBatch> = store
        .chunks_table()
        .query()
        .nearest_to(vector)
        .unwrap()
        .distance_type(lancedb::DistanceType::Cosine)
        .bypass_vector_index()
        .select(Select::columns(&["id"]))
        .limit(k)
        .execute()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    batches
        .iter()
        .flat_map(|b| {
            let ids = b.column_by_name("id").unwrap().as_any();
            let ids = ids.downcast_ref::<arrow_array::StringArray>().unwrap();
            ids.iter().flatten().map(str::to_string).collect::<Vec<_>>()
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// This process's resident memory in MiB: its own (`RssAnon`), and the
/// pages of files it maps (`RssFile`: its binary, and the table's data files
/// the hot index's loads read through a mapping, which are the page cache's).
fn resident_mib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024)
    };
    (field("RssAnon:"), field("RssFile:"))
}

/// One search as the bench asks it.
fn request(query: &str, stream: String, mode: &str) -> SearchRequest {
    SearchRequest {
        query: query.to_string(),
        stream: Some(stream),
        dry_run: true,
        mode: Some(mode.into()),
        ..Default::default()
    }
}

fn report(label: &str, times: &mut [Duration]) {
    times.sort();
    println!(
        "{label}: p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms over {} queries",
        percentile(times, 0.50).as_secs_f64() * 1e3,
        percentile(times, 0.95).as_secs_f64() * 1e3,
        percentile(times, 0.99).as_secs_f64() * 1e3,
        times.len(),
    );
}

fn bench_search(c: &mut Criterion) {
    // As `loomem` does, before any other thread exists.
    loomem::providers::embed::minilm::kernel_threads();
    loomem::store::maintain::lance_threads();
    log::init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let scenarios: Vec<Scenario> = std::env::var("LOOMEM_BENCH_SIZES")
        .unwrap_or_else(|_| "10000,100000,1000000x1000,1000000x1000:arrival".into())
        .split(',')
        .map(Scenario::parse)
        .collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let vocab = vocabulary();
    let mut group = c.benchmark_group("search_hybrid");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(10));
    for scenario in scenarios {
        let name = scenario.name();
        let dir = data_dir(scenario);
        // The caller's `LOOMEM_*` overrides (e.g. `LOOMEM_SEARCH__VECTOR_FEEDBACK=0`)
        // apply; the data directory and the bus are the bench's.
        let mut env: HashMap<String, String> = std::env::vars()
            .filter(|(k, _)| k.starts_with("LOOMEM_") && k.contains("__"))
            .collect();
        env.insert("LOOMEM_STORAGE__DATA_DIR".into(), dir.display().to_string());
        env.insert("LOOMEM_BUS__KIND".into(), "embedded".into());
        let cfg = Config::load(&root.join("config.toml"), &env).unwrap();
        let turns = match scenario.text {
            Text::Synthetic => Vec::new(),
            Text::LongMemEval => longmemeval_turns(scenario.rows),
        };
        rt.block_on(build(&dir, scenario, &turns, &cfg, &env));
        if std::env::var("LOOMEM_BENCH_BUILD_ONLY").is_ok() {
            continue;
        }
        let engine: Arc<Engine> = rt.block_on(Engine::start(cfg, &env)).unwrap();
        let caller = Caller::admin("bench");
        // `LOOMEM_BENCH_SEED` draws other queries (and, on a multi-tenant
        // store, other streams); 42 by default.
        let seed = std::env::var("LOOMEM_BENCH_SEED")
            .map_or(42, |s| s.parse().expect("LOOMEM_BENCH_SEED: a number"));
        let mut rng = Rng(seed);
        // Distinct sets for each measurement: a query asked before is served
        // from the query-vector cache, which would hide the embedding. Each
        // query goes to a stream drawn at random (the one stream when there
        // is one).
        // (A synthetic query draws its stream, then its words, as before
        // session 55, so the synthetic scenarios ask what they asked then.)
        let queries: Vec<(String, String)> = match scenario.text {
            Text::Synthetic => (0..1500)
                .map(|_| {
                    let stream = scenario.stream(rng.next() as usize % scenario.streams);
                    (text(&mut rng, &vocab, 4), stream)
                })
                .collect(),
            Text::LongMemEval => longmemeval_queries(&turns, &mut rng)
                .into_iter()
                .map(|q| (q, scenario.stream(rng.next() as usize % scenario.streams)))
                .collect(),
        };
        let (legs, warm, timed, again, concurrent) = (
            &queries[..400],
            &queries[400..420],
            &queries[420..720],
            &queries[720..1020],
            &queries[1020..],
        );
        let run = |(q, stream): &(String, String), mode: &str| {
            rt.block_on(search::search(
                &engine,
                &caller,
                request(q, stream.clone(), mode),
            ))
            .unwrap()
        };
        // The query embedding alone, then each leg alone (the vector leg
        // includes the embedding).
        let mut t: Vec<Duration> = legs
            .iter()
            .take(100)
            .map(|(q, _)| {
                let s = Instant::now();
                rt.block_on(engine.embedder.embed_query(q)).unwrap();
                s.elapsed()
            })
            .collect();
        report(&format!("embed_query/{name}"), &mut t);
        for (k, mode) in ["bm25", "vector", "graph"].into_iter().enumerate() {
            let mut t: Vec<Duration> = legs[100 * (k + 1)..100 * (k + 2)]
                .iter()
                .map(|q| {
                    let s = Instant::now();
                    run(q, mode);
                    s.elapsed()
                })
                .collect();
            report(&format!("search_{mode}/{name}"), &mut t);
        }
        // The vector leg's recall@10 against an exact search (Lance's flat
        // scan, the index bypassed), from the hot index and from Lance's
        // ANN index, which a search uses when the hot index does not hold
        // the stream; and the ANN search's own time.
        if scenario.streams == 1 && rt.block_on(engine.store.has_vector_index()) {
            let filter = loomem::store::Filter::new().stream(STREAM);
            // How many of `found` the exact search found too.
            let overlap = |found: Vec<loomem::store::Scored>, exact: &[String]| {
                found.iter().filter(|s| exact.contains(&s.id)).count()
            };
            let (mut hot, mut ann, mut ann_times) = (0, 0, Vec::new());
            let asked = &legs[..100];
            for (q, _) in asked {
                let v = rt.block_on(engine.embedder.embed_query(q)).unwrap();
                let exact = rt.block_on(exact_nearest(&engine.store, &v, 10));
                let found = rt.block_on(engine.store.search_vector(None, &v, &filter, 10));
                hot += overlap(found.unwrap(), &exact);
                let t = Instant::now();
                let found = rt.block_on(engine.store.search_vector_lance(None, &v, &filter, 10));
                ann_times.push(t.elapsed());
                ann += overlap(found.unwrap(), &exact);
            }
            let recall = |n: usize| n as f64 / (10 * asked.len()) as f64;
            println!(
                "vector recall@10 against an exact search/{name}: hot index {:.3}, Lance IVF-HNSW-SQ {:.3} over {} queries",
                recall(hot),
                recall(ann),
                asked.len(),
            );
            report(
                &format!("search_vector_lance/{name} (the ANN search alone)"),
                &mut ann_times,
            );
        }
        // Warm up caches (index pages, the model), then the percentiles.
        for q in warm {
            run(q, "hybrid");
        }
        // In one stream every query finds something; a small stream of a
        // multi-tenant store may hold nothing close enough, which is an answer.
        // `LOOMEM_BENCH_SLOW_MS=N`: name each timed search of N ms or more,
        // with its stream's size (what a first search met).
        let slow: Option<f64> = std::env::var("LOOMEM_BENCH_SLOW_MS")
            .ok()
            .map(|ms| ms.parse().expect("LOOMEM_BENCH_SLOW_MS: milliseconds"));
        let sizes = scenario.sizes();
        let timed_run = |queries: &[(String, String)]| -> Vec<Duration> {
            queries
                .iter()
                .map(|q| {
                    let t = Instant::now();
                    let r = run(q, "hybrid");
                    let took = t.elapsed();
                    if slow.is_some_and(|ms| took.as_secs_f64() * 1e3 >= ms) {
                        let rows = q.1[1..].parse().map_or(scenario.rows, |i: usize| sizes[i]);
                        eprintln!(
                            "slow: {} ({rows} memories) took {:.1} ms",
                            q.1,
                            took.as_secs_f64() * 1e3
                        );
                    }
                    assert!(
                        scenario.streams > 1 || !r.results.is_empty(),
                        "no results for {}",
                        q.0
                    );
                    took
                })
                .collect()
        };
        report(
            &format!(
                "search_hybrid/{name} (vector index: {})",
                rt.block_on(engine.store.has_vector_index())
            ),
            &mut timed_run(timed),
        );
        if scenario.streams > 1 {
            // The same streams again, new questions: the streams the first
            // pass loaded are served from memory while the budget holds them.
            let again: Vec<(String, String)> = again
                .iter()
                .zip(timed)
                .map(|((q, _), (_, stream))| (q.clone(), stream.clone()))
                .collect();
            report(
                &format!("search_hybrid/{name}, the same streams again"),
                &mut timed_run(&again),
            );
        }
        // 16 searchers at once, each with its own queries.
        let searchers = 16;
        let began = Instant::now();
        let mut times: Vec<Duration> = rt.block_on(async {
            let tasks: Vec<_> = concurrent
                .chunks(concurrent.len() / searchers)
                .take(searchers)
                .map(|qs| {
                    let (engine, caller, qs) = (engine.clone(), caller.clone(), qs.to_vec());
                    tokio::spawn(async move {
                        let mut t = Vec::new();
                        for (q, stream) in qs {
                            let s = Instant::now();
                            search::search(&engine, &caller, request(&q, stream, "hybrid"))
                                .await
                                .unwrap();
                            t.push(s.elapsed());
                        }
                        t
                    })
                })
                .collect();
            let mut all = Vec::new();
            for task in tasks {
                all.extend(task.await.unwrap());
            }
            all
        });
        let secs = began.elapsed().as_secs_f64();
        println!(
            "search_hybrid/{name} with {searchers} concurrent searchers: {:.0} queries/s",
            times.len() as f64 / secs,
        );
        report(
            &format!("search_hybrid/{name} with {searchers} concurrent searchers"),
            &mut times,
        );
        let (hot_bytes, hot_streams) = engine.store.hot_usage();
        let (own, files) = resident_mib();
        println!(
            "resident memory with {name} memories: {own} MiB, and {files} MiB of mapped files (hot index: {} MiB in {hot_streams} streams)",
            hot_bytes >> 20,
        );
        // Fresh queries (mostly unseen, so mostly embedded) for criterion too.
        let mut fresh = Rng(7 + scenario.rows as u64);
        group.bench_function(&name, |b| {
            b.iter(|| {
                let stream = scenario.stream(fresh.next() as usize % scenario.streams);
                let query = match scenario.text {
                    Text::Synthetic => text(&mut fresh, &vocab, 4),
                    Text::LongMemEval => words_of(&turns[fresh.next() as usize % turns.len()], 8),
                };
                run(&(query, stream), "hybrid")
            })
        });
        rt.block_on(engine.shutdown());
    }
    group.finish();
}

criterion_group!(benches, bench_search);
criterion_main!(benches);
