//! The ordinary agent workload, the way a user meets it: a real daemon on a
//! port (JetStream, the shipped config, MiniLM unless `LOOMEM_EMBED__PROVIDER`
//! says otherwise), W writers each storing one chat turn per
//! `POST /v1/store` into S streams (a session's turns go to one stream), and
//! R searchers asking LongMemEval questions of random streams all the while.
//! Figures are printed per phase of `LOOMEM_WORKLOAD_PHASE` stores, so a
//! latency that grows with the number of commits shows.
//!
//! `just bench --bench workload` (needs `nats-server` and the model, `just
//! setup`; the text comes from `../shared/datasets/longmemeval/`, or
//! `LOOMEM_WORKLOAD_DATA`). Knobs: `LOOMEM_WORKLOAD_TURNS` (6000),
//! `LOOMEM_WORKLOAD_WRITERS` (8), `LOOMEM_WORKLOAD_STREAMS` (10),
//! `LOOMEM_WORKLOAD_SEARCHERS` (2), `LOOMEM_WORKLOAD_PHASE` (1000),
//! `LOOMEM_WORKLOAD_SEARCH_RATE` (searches a second in all; 0, the default:
//! each searcher asks again as soon as it has its answer). Other `LOOMEM_*`
//! variables configure the daemon as they would `loomem serve`
//! (`LOOMEM_BUS__KIND=embedded` runs it on the in-process bus).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loomem::app::config::Config;

#[path = "shared/log.rs"]
mod log;
#[path = "shared/longmemeval.rs"]
mod longmemeval;
#[path = "../tests/integration/nats.rs"]
#[allow(dead_code)]
mod nats;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: a number")))
        .unwrap_or(default)
}

/// Up to `n` user turns of at most 2,000 bytes, with the session each came from.
fn turns(n: usize) -> Vec<(usize, String)> {
    longmemeval::turns()
        .into_iter()
        .filter(|(_, role, text)| role == "user" && text.len() <= 2000)
        .map(|(s, _, text)| (s, text))
        .take(n)
        .collect()
}

/// Texts a second the embedder manages alone on `texts`, a batch per round
/// of the `writers`.
async fn embedded_alone(
    embedder: &dyn loomem::providers::embed::Embedder,
    texts: &[String],
    writers: usize,
) -> f64 {
    let t = Instant::now();
    for batch in texts.chunks(writers.max(1)) {
        embedder.embed(batch).await.unwrap();
    }
    texts.len() as f64 / t.elapsed().as_secs_f64()
}

/// The `store` pipeline's counters: each stage's batches and microseconds.
async fn stage_counters(http: &reqwest::Client, base: &str) -> HashMap<String, (u64, u64)> {
    let status: serde_json::Value = http
        .get(format!("{base}/v1/status"))
        .send()
        .await
        .expect("status")
        .json()
        .await
        .expect("status body");
    status["pipelines"]["store"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            Some((
                s["stage"].as_str()?.to_string(),
                (s["batches"].as_u64()?, s["total_micros"].as_u64()?),
            ))
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

/// Latencies gathered in the current phase.
#[derive(Default)]
struct Phase {
    stores: Vec<Duration>,
    searches: Vec<Duration>,
    /// Searches while writing that asked their question for the first time
    /// in the run, so the server embedded it (a question asked again comes
    /// from its query cache): the whole search, and the server's embed phase.
    embedded: Vec<(Duration, Duration)>,
    /// The questions asked so far.
    asked: std::collections::HashSet<String>,
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        // `cargo bench` asks harness-less benches to list themselves.
        return;
    }
    log::init();
    // As `loomem` does, before any other thread exists.
    loomem::providers::embed::minilm::kernel_threads();
    loomem::store::maintain::lance_threads();
    let total = knob("LOOMEM_WORKLOAD_TURNS", 6000);
    let writers = knob("LOOMEM_WORKLOAD_WRITERS", 8);
    let streams = knob("LOOMEM_WORKLOAD_STREAMS", 10);
    let searchers = knob("LOOMEM_WORKLOAD_SEARCHERS", 2);
    let phase_len = knob("LOOMEM_WORKLOAD_PHASE", 1000).max(1);
    // Searches a second over all searchers; 0: each asks again as soon as
    // it has its answer.
    let search_rate = knob("LOOMEM_WORKLOAD_SEARCH_RATE", 0);
    let turns = Arc::new(turns(total));
    let questions = Arc::new(longmemeval::questions());
    let total = turns.len();

    // The clients' runtime (named, so a profile tells its threads from the
    // daemon's).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("workload-client")
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let nats = nats::NatsServer::start(&dir.path().join("nats"));
    let mut env: HashMap<String, String> = HashMap::new();
    for (k, v) in std::env::vars() {
        if k.starts_with("LOOMEM_") && !k.starts_with("LOOMEM_WORKLOAD") {
            env.insert(k, v);
        }
    }
    env.insert(
        "LOOMEM_STORAGE__DATA_DIR".into(),
        dir.path().join("data").display().to_string(),
    );
    // JetStream, the shipped bus, unless the run says otherwise.
    env.entry("LOOMEM_BUS__KIND".into())
        .or_insert_with(|| "jetstream".into());
    env.insert("LOOMEM_BUS__NATS_URL".into(), nats.url());
    env.insert("LOOMEM_SERVER__PORT".into(), "0".into());
    let cfg = Config::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml"),
        &env,
    )
    .unwrap();
    let provider = cfg.embed.provider;
    // The ceiling a store rate is judged against: the embedder alone on these
    // turns, a batch per round of the writers, on an idle machine.
    let (ceiling, query_alone, phase_ceilings) = rt.block_on(async {
        let embedder = loomem::providers::embed::from_config(&cfg.embed, &env).unwrap();
        let sample: Vec<String> = turns.iter().take(256).map(|(_, t)| t.clone()).collect();
        embedder.embed(&sample[..8]).await.unwrap();
        let rate = embedded_alone(embedder.as_ref(), &sample, writers).await;
        // And each question embedded alone, as a search would, on the idle
        // machine: what the searches while writing are judged against.
        let mut alone = Vec::new();
        for q in questions.iter().take(200) {
            let t = Instant::now();
            embedder.embed_query(q).await.unwrap();
            alone.push(t.elapsed());
        }
        alone.sort();
        // Each phase's turns embedded alone, the same way: text length
        // moves from phase to phase, and the store rate with it, so a
        // phase's rate is judged against its own turns' ceiling.
        let mut per_phase = Vec::new();
        for phase in turns.chunks(phase_len) {
            let texts: Vec<String> = phase.iter().map(|(_, t)| t.clone()).collect();
            per_phase.push(embedded_alone(embedder.as_ref(), &texts, writers).await);
        }
        (rate, alone, per_phase)
    });
    // The daemon on a runtime of its own, built as `loomem serve` builds
    // its: the writers' and searchers' requests and answers are the
    // clients' work, done on the clients' threads, not queued among the
    // daemon's tasks as no user's client is.
    let daemon = tokio::runtime::Runtime::new().unwrap();
    let listener = daemon
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = daemon.spawn(loomem::api::server::serve(cfg, env, listener, async {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();
    rt.block_on(async {
        let started = Instant::now();
        while http.get(format!("{base}/health")).send().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "daemon did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });

    let chars = turns.iter().map(|(_, t)| t.chars().count()).sum::<usize>() as f64 / total as f64;
    println!(
        "workload: {total} turns ({chars:.0} characters on average), {writers} writers, {streams} streams, {searchers} searchers ({}), embedder {provider:?} ({ceiling:.0} texts/s alone on these turns)",
        if search_rate > 0 {
            format!("{search_rate} searches/s in all")
        } else {
            "each asking again at once".to_string()
        }
    );
    println!(
        "  a question embedded alone, on the idle machine (200 of them): p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms",
        percentile(&query_alone, 0.5),
        percentile(&query_alone, 0.95),
        percentile(&query_alone, 0.99),
    );
    println!("| stored | characters a turn | store/s | embedder alone on these turns, texts/s | store/s ÷ embedder alone | store p50 / p95 ms | search p50 / p95 ms | searches | embed / write ms a batch |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let phase_ceilings = Arc::new(phase_ceilings);
    // The pipeline's counters at the last phase's end, to report each
    // phase's own stage times.
    let counters = Arc::new(tokio::sync::Mutex::new(
        rt.block_on(stage_counters(&http, &base)),
    ));
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let writing = Arc::new(AtomicBool::new(true));
    let phase = Arc::new(Mutex::new(Phase::default()));
    let all = Arc::new(Mutex::new(Phase::default()));
    let began = Instant::now();
    let phase_began = Arc::new(Mutex::new(Instant::now()));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..writers {
            let (http, base, turns, next, done) = (
                http.clone(),
                base.clone(),
                turns.clone(),
                next.clone(),
                done.clone(),
            );
            let (phase, all, phase_began) = (phase.clone(), all.clone(), phase_began.clone());
            let (phase_ceilings, counters) = (phase_ceilings.clone(), counters.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((session, text)) = turns.get(i) else {
                        return;
                    };
                    let t = Instant::now();
                    let r = http
                        .post(format!("{base}/v1/store"))
                        .json(&serde_json::json!({
                            "content": text,
                            "stream": format!("agent-{}", session % streams),
                        }))
                        .send()
                        .await
                        .expect("store");
                    let status = r.status();
                    assert!(
                        status.is_success(),
                        "store: {status} {}",
                        r.text().await.unwrap_or_default()
                    );
                    let took = t.elapsed();
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    let report = {
                        let mut p = phase.lock().unwrap();
                        p.stores.push(took);
                        all.lock().unwrap().stores.push(took);
                        (n % phase_len == 0 || n == turns.len()).then(|| std::mem::take(&mut *p))
                    };
                    if let Some(mut p) = report {
                        let secs = {
                            let mut b = phase_began.lock().unwrap();
                            let s = b.elapsed().as_secs_f64();
                            *b = Instant::now();
                            s
                        };
                        p.stores.sort();
                        p.searches.sort();
                        let first = (n - 1) / phase_len * phase_len;
                        let chars = turns[first..n]
                            .iter()
                            .map(|(_, t)| t.chars().count())
                            .sum::<usize>() as f64
                            / (n - first) as f64;
                        let rate = p.stores.len() as f64 / secs;
                        let ceiling = phase_ceilings[(n - 1) / phase_len];
                        let stages = {
                            let now = stage_counters(&http, &base).await;
                            let mut last = counters.lock().await;
                            let per_batch = |stage: &str| {
                                let (b, us) = now.get(stage).copied().unwrap_or_default();
                                let (b0, us0) = last.get(stage).copied().unwrap_or_default();
                                (us - us0) as f64 / (b - b0).max(1) as f64 / 1e3
                            };
                            let line = format!("{:.1} / {:.1}", per_batch("embed"), per_batch("write"));
                            *last = now;
                            line
                        };
                        println!(
                            "| {n} | {chars:.0} | {rate:.0} | {ceiling:.0} | {:.2} | {:.0} / {:.0} | {:.1} / {:.1} | {} | {stages} |",
                            rate / ceiling,
                            percentile(&p.stores, 0.5),
                            percentile(&p.stores, 0.95),
                            percentile(&p.searches, 0.5),
                            percentile(&p.searches, 0.95),
                            p.searches.len(),
                        );
                    }
                }
            }));
        }
        let mut search_tasks = Vec::new();
        for s in 0..searchers {
            let (http, base, questions, writing) = (
                http.clone(),
                base.clone(),
                questions.clone(),
                writing.clone(),
            );
            let (phase, all) = (phase.clone(), all.clone());
            search_tasks.push(tokio::spawn(async move {
                let mut k = s * 7919;
                let mut pace = (search_rate > 0).then(|| {
                    let mut i = tokio::time::interval(Duration::from_secs_f64(
                        searchers as f64 / search_rate as f64,
                    ));
                    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    i
                });
                while writing.load(Ordering::Relaxed) {
                    if let Some(pace) = &mut pace {
                        pace.tick().await;
                    }
                    k += 1;
                    let q = &questions[k % questions.len()];
                    let t = Instant::now();
                    let r = http
                        .post(format!("{base}/v1/search"))
                        .json(&serde_json::json!({
                            "query": q,
                            "stream": format!("agent-{}", k % streams),
                            "top_k": 10,
                            "trace": true,
                        }))
                        .send()
                        .await
                        .expect("search");
                    assert!(r.status().is_success(), "search: {}", r.status());
                    let body: serde_json::Value = r.json().await.expect("search body");
                    let took = t.elapsed();
                    let embed = body["trace_metadata"]["timings_us"]["embed"]
                        .as_u64()
                        .unwrap_or(0);
                    phase.lock().unwrap().searches.push(took);
                    let mut all = all.lock().unwrap();
                    all.searches.push(took);
                    if all.asked.insert(q.clone()) {
                        all.embedded.push((took, Duration::from_micros(embed)));
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        writing.store(false, Ordering::Relaxed);
        for t in search_tasks {
            t.await.unwrap();
        }
    });
    let secs = began.elapsed().as_secs_f64();
    let mut all = std::mem::take(&mut *all.lock().unwrap());
    all.stores.sort();
    all.searches.sort();
    println!(
        "\nwhole run: {} stores in {secs:.1} s = {:.1} memories/s; store p50 {:.0} ms, p95 {:.0} ms, p99 {:.0} ms; {} searches while writing ({:.0}/s): p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms",
        all.stores.len(),
        all.stores.len() as f64 / secs,
        percentile(&all.stores, 0.5),
        percentile(&all.stores, 0.95),
        percentile(&all.stores, 0.99),
        all.searches.len(),
        all.searches.len() as f64 / secs,
        percentile(&all.searches, 0.5),
        percentile(&all.searches, 0.95),
        percentile(&all.searches, 0.99),
    );
    let (mut took, mut embed): (Vec<Duration>, Vec<Duration>) =
        all.embedded.iter().copied().unzip();
    took.sort();
    embed.sort();
    if !took.is_empty() {
        println!(
            "  {} of them asked their question for the first time, so it was embedded (the rest came from the query cache): p50 {:.1} ms, p95 {:.1} ms, of which the embedding p50 {:.1} ms, p95 {:.1} ms",
            took.len(),
            percentile(&took, 0.5),
            percentile(&took, 0.95),
            percentile(&embed, 0.5),
            percentile(&embed, 0.95),
        );
    }
    // Searches after the writes, on the store as it is left, with the
    // server's own account of each phase.
    const PHASES: [&str; 6] = ["embed", "vector", "bm25", "graph", "fetch", "rank"];
    let (after, phases): (Vec<Duration>, Vec<Vec<u64>>) = rt.block_on(async {
        let mut t = Vec::new();
        let mut phases = vec![Vec::new(); PHASES.len()];
        for k in 0..300 {
            let q = &questions[k % questions.len()];
            let s = Instant::now();
            let r = http
                .post(format!("{base}/v1/search"))
                .json(&serde_json::json!({"query": q, "stream": format!("agent-{}", k % streams), "top_k": 10, "trace": true}))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
            let body: serde_json::Value = r.json().await.unwrap();
            t.push(s.elapsed());
            for (p, name) in phases.iter_mut().zip(PHASES) {
                p.push(body["trace_metadata"]["timings_us"][name].as_u64().unwrap_or(0));
            }
        }
        t.sort();
        for p in &mut phases {
            p.sort_unstable();
        }
        (t, phases)
    });
    println!(
        "searches after the writes (300, one at a time): p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms",
        percentile(&after, 0.5),
        percentile(&after, 0.95),
        percentile(&after, 0.99),
    );
    let line: Vec<String> = PHASES
        .iter()
        .zip(&phases)
        .map(|(name, p)| format!("{name} {:.1}", p[p.len() / 2] as f64 / 1e3))
        .collect();
    println!(
        "  the server's phases, p50 ms (the legs overlap; embed is part of vector): {}",
        line.join(", ")
    );
    // Where a store's time went: the pipeline's own counters, per batch.
    let status: serde_json::Value = rt.block_on(async {
        http.get(format!("{base}/v1/status"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    for (pipeline, stages) in status["pipelines"].as_object().into_iter().flatten() {
        let stages = stages.as_array().cloned().unwrap_or_default();
        let batches = stages
            .first()
            .and_then(|s| s["batches"].as_u64())
            .unwrap_or(0);
        if batches == 0 {
            continue;
        }
        let line: Vec<String> = stages
            .iter()
            .map(|s| {
                format!(
                    "{} {:.1}",
                    s["stage"].as_str().unwrap_or("?"),
                    s["total_micros"].as_u64().unwrap_or(0) as f64 / batches as f64 / 1e3
                )
            })
            .collect();
        let records = stages
            .first()
            .and_then(|s| s["records_in"].as_u64())
            .unwrap_or(0);
        println!(
            "pipeline {pipeline}: {batches} batches of {:.1} on average; ms per batch: {}",
            records as f64 / batches as f64,
            line.join(", ")
        );
    }
    let _ = stop.send(());
    daemon.block_on(server).unwrap().unwrap();
    drop(nats);
}
