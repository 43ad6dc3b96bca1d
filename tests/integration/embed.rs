//! Embedding providers: the real MiniLM model against sentence-transformers'
//! own vectors, semantic recall through the daemon, the OpenAI-compatible
//! provider against a local stand-in server, and re-embedding jobs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loomem::app::config::Config;
use loomem::providers::embed::config::Precision;
use loomem::providers::embed::{dot, Embedder, MiniLmEmbedder, StaticEmbedder};
use serde_json::{json, Value};

use crate::fixture::{repo_root, Daemon, Options};

/// The model directory the default config points at (where setup installs it).
fn model_dir() -> std::path::PathBuf {
    let mut env = HashMap::new();
    if let Ok(dir) = std::env::var("LOOMEM_EMBED__MODEL_DIR") {
        env.insert("LOOMEM_EMBED__MODEL_DIR".to_string(), dir);
    }
    Config::load(&repo_root().join("config.toml"), &env)
        .expect("config loads")
        .embed
        .model_dir
}

fn minilm() -> MiniLmEmbedder {
    minilm_in(Precision::default())
}

fn minilm_in(precision: Precision) -> MiniLmEmbedder {
    MiniLmEmbedder::load(&model_dir(), 256, 32, precision, 0)
        .expect("the model is installed by scripts/setup.sh")
}

struct Golden {
    text: String,
    vector: Vec<f32>,
}

fn golden() -> Vec<Golden> {
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("tests/fixtures/minilm_golden.json")).unwrap(),
    )
    .unwrap();
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Golden {
            text: c["text"].as_str().unwrap().to_string(),
            vector: serde_json::from_value(c["vector"].clone()).unwrap(),
        })
        .collect()
}

/// Each precision against sentence-transformers' vectors: bf16 to cosine
/// 0.999, int8 (the default) to 0.99 (0.993 at worst when measured), and
/// int8 to 0.99 of bf16.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_matches_sentence_transformers() {
    let cases = golden();
    let texts: Vec<String> = cases.iter().map(|c| c.text.clone()).collect();
    let mut by_precision = Vec::new();
    for (precision, floor) in [(Precision::Bf16, 0.999), (Precision::Int8, 0.99)] {
        let model = minilm_in(precision);
        // All at once (in sub-batches sorted by length; on candle padded
        // together), one by one and as queries.
        let batched = model.embed(&texts).await.unwrap();
        for (i, case) in cases.iter().enumerate() {
            let single = model.embed(&texts[i..=i]).await.unwrap().remove(0);
            // The query thread: its kernels over every CPU (on candle, short
            // texts multiplied straight from the weights).
            let query = model.embed_query(&texts[i]).await.unwrap();
            assert_eq!(batched[i].len(), 384);
            let norm: f32 = batched[i].iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "not unit length: {norm}");
            // A query's pass against the batch's (other threads, other
            // neighbours): the same vector to within rounding.
            let same = dot(&query, &batched[i]);
            assert!(
                same >= 0.9999,
                "{precision:?}: query against batched: cosine {same}"
            );
            for (how, v) in [
                ("batched", &batched[i]),
                ("single", &single),
                ("query", &query),
            ] {
                let cos = dot(v, &case.vector);
                assert!(
                    cos >= floor,
                    "{precision:?} {how} cosine {cos} for {:?}",
                    case.text
                );
            }
        }
        by_precision.push(batched);
    }
    for (bf16, int8) in by_precision[0].iter().zip(&by_precision[1]) {
        let cos = dot(bf16, int8);
        assert!(cos >= 0.99, "int8 against bf16: cosine {cos}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_concurrent_calls_each_get_their_own_vectors() {
    let model = Arc::new(minilm());
    let cases = golden();
    let mut calls = Vec::new();
    for chunk in cases.chunks(2) {
        let model = model.clone();
        let texts: Vec<String> = chunk.iter().map(|c| c.text.clone()).collect();
        let expected: Vec<Vec<f32>> = chunk.iter().map(|c| c.vector.clone()).collect();
        calls.push(tokio::spawn(async move {
            let got = model.embed(&texts).await.unwrap();
            (got, expected)
        }));
    }
    for call in calls {
        let (got, expected) = call.await.unwrap();
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(&expected) {
            assert!(dot(g, e) >= 0.99);
        }
    }
}

/// The nice value of each of this process's threads whose name `matches` (Linux).
fn niceness_of_threads(matches: impl Fn(&str) -> bool) -> Vec<i64> {
    threads(matches).into_iter().map(|(_, nice)| nice).collect()
}

/// The name and nice value of each of this process's threads whose name
/// `matches` (Linux).
fn threads(matches: impl Fn(&str) -> bool) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !matches(comm.trim_end()) {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // After the command's closing parenthesis: state is field 3, nice 19.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .collect();
        out.push((comm.trim_end().to_string(), fields[16].parse().unwrap()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipelines_embedding_runs_at_its_configured_niceness() {
    let model = MiniLmEmbedder::load(&model_dir(), 256, 32, Precision::default(), 7)
        .expect("the model is installed by scripts/setup.sh");
    model.embed(&["a pass".to_string()]).await.unwrap();
    model.embed_query("a query").await.unwrap();
    // Thread names are cut at 15 bytes: `loomem-minilm-query` is
    // `loomem-minilm-q`. The kernels run on each lane's own pools, a
    // single-threaded pool per CPU.
    let bulk_threads =
        || niceness_of_threads(|n| n == "loomem-minilm" || n.starts_with("loomem-bulk-"));
    let query = niceness_of_threads(|n| n == "loomem-minilm-q" || n.starts_with("loomem-qry-"));
    // By name (`loomem-qry-{pool}.0`): the other tests of this process
    // may hold models of their own, whose pools have the same names. A pool
    // thread names itself when it first runs, which on a busy machine may
    // come after the query or the pass: wait for the names, with a deadline.
    let cpus = std::thread::available_parallelism().unwrap().get();
    let kernel_names = || -> std::collections::BTreeSet<String> {
        threads(|n| n.starts_with("loomem-qry-"))
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    };
    // The other models run their passes at nice 0, so this one's threads
    // are those at 7: its inference thread and a pool thread per CPU.
    let ours = |bulk: &[i64]| bulk.iter().filter(|&&n| n == 7).count();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (mut kernels, mut bulk) = (kernel_names(), bulk_threads());
    while (kernels.len() < cpus || ours(&bulk) <= cpus) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        (kernels, bulk) = (kernel_names(), bulk_threads());
    }
    assert!(!bulk.is_empty() && !query.is_empty(), "{bulk:?} {query:?}");
    assert_eq!(
        kernels.len(),
        cpus,
        "the query lane has a kernel thread for each CPU: {kernels:?}"
    );
    assert!(
        kernels.iter().all(|k| k.ends_with(".0")),
        "each of the query lane's pools has one thread: {kernels:?}"
    );
    assert!(
        ours(&bulk) > cpus,
        "the pipeline's passes run at the nice value they were given, each sub-batch on a kernel thread of its own: {bulk:?}"
    );
    assert!(
        query.iter().all(|&n| n == 0),
        "queries run at nice 0: {query:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_query_does_not_wait_for_a_batch_pass() {
    let model = Arc::new(minilm());
    // A pass of long texts that takes seconds on this machine.
    let long: Vec<String> = (0..192)
        .map(|i| format!("Note {i}: {}", "the quarterly planning meeting covered the migration of the billing service, the hiring plan and the slow exports; ".repeat(8)))
        .collect();
    let mut bulk = Box::pin(model.embed(&long));
    assert!(
        futures::poll!(bulk.as_mut()).is_pending(),
        "the batch is queued"
    );
    // Give the inference thread a moment to take the batch up. This only makes
    // the check below sharp: with one lane the query would wait for the pass.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let query = "What IDE does the user prefer?";
    let q = model.embed_query(query).await.unwrap();
    assert!(
        futures::poll!(bulk.as_mut()).is_pending(),
        "the batch pass ended before the query was answered"
    );
    let same = model.embed(&[query.to_string()]).await.unwrap().remove(0);
    assert!(dot(&q, &same) > 0.9999, "both lanes embed alike");
    assert_eq!(bulk.await.unwrap().len(), 192);
}

#[tokio::test]
async fn a_missing_model_is_a_startup_error_naming_the_setup_command() {
    let empty = tempfile::tempdir().unwrap();
    let err = MiniLmEmbedder::load(empty.path(), 256, 32, Precision::default(), 0)
        .err()
        .expect("must fail");
    let message = err.to_string();
    assert!(message.contains("scripts/setup.sh"), "{message}");
    assert!(
        message.contains(&empty.path().display().to_string()),
        "{message}"
    );

    // The daemon refuses to start rather than falling back to another provider.
    let data = tempfile::tempdir().unwrap();
    let mut env = HashMap::new();
    env.insert("LOOMEM_EMBED__PROVIDER".to_string(), "minilm".to_string());
    env.insert(
        "LOOMEM_EMBED__MODEL_DIR".to_string(),
        empty.path().display().to_string(),
    );
    env.insert("LOOMEM_BUS__KIND".to_string(), "embedded".to_string());
    env.insert(
        "LOOMEM_STORAGE__DATA_DIR".to_string(),
        data.path().display().to_string(),
    );
    let cfg = Config::load(&repo_root().join("config.toml"), &env).unwrap();
    let err = loomem::app::Engine::start(cfg, &env)
        .await
        .err()
        .expect("must fail");
    assert!(err.to_string().contains("scripts/setup.sh"), "{err}");
}

/// Stores `memory` and four unrelated memories (it comes second) in stream
/// `dev`; the ids in order.
async fn store_among_four(d: &Daemon, memory: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for text in [
        "The team standup moved to 9:30 every Monday",
        memory,
        "Bought oat milk, eggs and sourdough bread",
        "The flight to Lisbon leaves on Friday evening",
        "Quarterly revenue grew twelve percent",
    ] {
        ids.push(d.store(text, "dev").await);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semantic_recall_ranks_the_ide_preference_first_without_bm25() {
    let d = Daemon::start(
        Options::embedded()
            .minilm()
            .env("LOOMEM_SEARCH__BM25_WEIGHT", "0"),
    )
    .await;
    let ids = store_among_four(&d, "Prefers Cursor over VSCode for AI features").await;
    let (_, resp) = d
        .call(
            "POST",
            "/v1/search",
            Some(
                json!({"query": "What IDE does the user prefer?", "stream": "dev", "trace": true}),
            ),
        )
        .await;
    let results = resp["results"].as_array().unwrap();
    assert_eq!(results[0]["chunk_id"], ids[1].as_str(), "{resp}");
    // Vector leg only: no BM25 rank on the hit.
    assert!(
        results[0]["trace_info"]["bm25_rank"].is_null(),
        "{}",
        results[0]
    );
    let (_, status) = d.call("GET", "/v1/status", None).await;
    assert_eq!(status["embedder"]["model"], "all-MiniLM-L6-v2");
    assert_eq!(status["embedder"]["dim"], 384);
    assert_eq!(status["embedder"]["stale"], 0);
    assert_eq!(status["config_summary"]["embeddings_count"], 5);
    assert_eq!(status["config_summary"]["vector_enabled"], true);
}

/// A model directory of links to the installed model's files, with the static
/// table distilled into it once for every test of this binary (a distillation
/// runs the model over the whole vocabulary: a minute or more here).
///
/// A static is never dropped, so the directory is not a `TempDir` (it would
/// stay behind in the system's temp directory, 45 MB a run): it is this
/// process's directory under cargo's scratch directory for tests, and each
/// run first removes those of processes that are gone.
fn distilled_model_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let scratch = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        for entry in std::fs::read_dir(scratch).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let gone = name
                .to_str()
                .and_then(|n| n.strip_prefix("static-model-"))
                .is_some_and(|pid| !std::path::Path::new("/proc").join(pid).exists());
            if gone {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = scratch.join(format!("static-model-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for f in loomem::providers::embed::minilm::MODEL_FILES {
            std::os::unix::fs::symlink(model_dir().join(f), dir.join(f)).unwrap();
        }
        StaticEmbedder::load(&dir, 256).expect("distils from the installed model");
        dir
    })
    .as_path()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_embedder_is_distilled_once_and_keeps_meaning() {
    let dir = tokio::task::spawn_blocking(distilled_model_dir)
        .await
        .unwrap();
    let table = dir.join(loomem::providers::embed::distilled::TABLE_FILE);
    let model = StaticEmbedder::load(dir, 256).unwrap();
    assert!(
        table.is_file(),
        "the distilled table is saved beside the model"
    );
    assert_eq!(model.model(), "static-all-MiniLM-L6-v2");
    assert_eq!(model.dim(), 384);
    let texts: Vec<String> = [
        "I adopted a puppy last week",
        "We brought home a new dog",
        "The quarterly tax return is due in April",
        "My flight to Lisbon was delayed by three hours",
        "The airline postponed my plane to Portugal",
        "",
    ]
    .map(String::from)
    .to_vec();
    let v = model.embed(&texts).await.unwrap();
    for x in &v[..5] {
        let norm: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "not unit length: {norm}");
    }
    assert!(v[5].iter().all(|x| *x == 0.0), "no token, no direction");
    // Paraphrases with no word in common are closer than unrelated texts.
    assert!(
        dot(&v[0], &v[1]) > dot(&v[0], &v[2]) + 0.1,
        "dog: {} tax: {}",
        dot(&v[0], &v[1]),
        dot(&v[0], &v[2])
    );
    assert!(
        dot(&v[3], &v[4]) > dot(&v[3], &v[0]) + 0.1,
        "plane: {} dog: {}",
        dot(&v[3], &v[4]),
        dot(&v[3], &v[0])
    );

    // Loaded again: the saved table, not a second distillation.
    let saved = std::fs::metadata(&table).unwrap().modified().unwrap();
    let again = StaticEmbedder::load(dir, 256).unwrap();
    assert_eq!(again.embed(&texts).await.unwrap(), v);
    assert_eq!(
        std::fs::metadata(&table).unwrap().modified().unwrap(),
        saved
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_stores_and_recalls_with_the_static_embedder() {
    let dir = tokio::task::spawn_blocking(distilled_model_dir)
        .await
        .unwrap();
    let d = Daemon::start(
        Options::embedded()
            .env("LOOMEM_EMBED__PROVIDER", "static")
            .env("LOOMEM_EMBED__MODEL_DIR", &dir.display().to_string())
            .env("LOOMEM_SEARCH__BM25_WEIGHT", "0"),
    )
    .await;
    let ids = store_among_four(&d, "Adopted a golden retriever puppy named Biscuit").await;
    let (_, resp) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "What kind of dog does the user have?", "stream": "dev"})),
        )
        .await;
    assert_eq!(resp["results"][0]["chunk_id"], ids[1].as_str(), "{resp}");
    let (_, status) = d.call("GET", "/v1/status", None).await;
    assert_eq!(status["embedder"]["model"], "static-all-MiniLM-L6-v2");
    assert_eq!(status["config_summary"]["embeddings_count"], 5);
}

/// A local stand-in for an OpenAI-compatible embeddings API: vectors from a
/// word hash, the first request of all answered 503, every request recorded;
/// while `hold` is set, requests wait.
struct StubApi {
    url: String,
    dim: usize,
    requests: Arc<AtomicUsize>,
    /// Requests that reached the stand-in, held or not.
    arrived: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<(Option<String>, Value)>>>,
    hold: tokio::sync::watch::Sender<bool>,
}

impl StubApi {
    /// `options` with the `openai` provider pointed at this stand-in (model
    /// `stub-embed-1`, key `sk-test-123` through `STUB_KEY`).
    fn configure(&self, options: Options) -> Options {
        options
            .env("LOOMEM_EMBED__PROVIDER", "openai")
            .env("LOOMEM_EMBED__BASE_URL", &self.url)
            .env("LOOMEM_EMBED__MODEL", "stub-embed-1")
            .env("LOOMEM_EMBED__DIM", &self.dim.to_string())
            .env("LOOMEM_EMBED__API_KEY_ENV", "STUB_KEY")
            .env("STUB_KEY", "sk-test-123")
    }
}

async fn stub_api(dim: usize) -> StubApi {
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;
    let requests = Arc::new(AtomicUsize::new(0));
    let arrived = Arc::new(AtomicUsize::new(0));
    let seen: Arc<Mutex<Vec<(Option<String>, Value)>>> = Default::default();
    let hold = tokio::sync::watch::channel(false).0;
    let (r, a, s, h) = (
        requests.clone(),
        arrived.clone(),
        seen.clone(),
        hold.clone(),
    );
    let app = axum::Router::new().route(
        "/v1/embeddings",
        post(move |headers: HeaderMap, axum::Json(body): axum::Json<Value>| {
            let (r, s, mut h) = (r.clone(), s.clone(), h.subscribe());
            a.fetch_add(1, Ordering::SeqCst);
            async move {
                let _ = h.wait_for(|held| !*held).await;
                let auth = headers
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_string());
                s.lock().unwrap().push((auth, body.clone()));
                if r.fetch_add(1, Ordering::SeqCst) == 0 {
                    return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({})));
                }
                let data: Vec<Value> = body["input"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .enumerate()
                    .map(|(i, t)| json!({"index": i, "embedding": word_vector(t.as_str().unwrap(), dim)}))
                    .collect();
                (StatusCode::OK, axum::Json(json!({"data": data, "model": body["model"]})))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    StubApi {
        url,
        dim,
        requests,
        arrived,
        seen,
        hold,
    }
}

/// Sum of one-hot word buckets (not normalised: the provider must normalise).
fn word_vector(text: &str, dim: usize) -> Vec<f32> {
    let mut v = vec![0.0; dim];
    for w in text.split_whitespace() {
        let h = w
            .to_lowercase()
            .bytes()
            .fold(7usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
        v[h % dim] += 3.0;
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_provider_batches_retries_and_records_its_model() {
    let api = stub_api(16).await;
    let d = Daemon::start(
        api.configure(Options::embedded())
            .env("LOOMEM_EMBED__BATCH_SIZE", "2")
            .env("LOOMEM_SEARCH__BM25_WEIGHT", "0"),
    )
    .await;
    // Three memories in one import: requests of at most two texts each.
    let lines = [
        "apples and pears",
        "trains to Berlin",
        "green tea in the morning",
    ]
    .map(|t| json!({ "content": t }).to_string())
    .join("\n");
    let (status, body) = d
        .post_raw("/v1/import?format=jsonl&stream=s", lines.into_bytes())
        .await;
    assert_eq!(status, 200, "{body}");
    let mut rows = Vec::new();
    for _ in 0..200 {
        let (_, resp) = d
            .call(
                "POST",
                "/v1/sql",
                Some(
                    json!({"sql": "SELECT id, content, embed_model FROM chunks ORDER BY content"}),
                ),
            )
            .await;
        rows = resp["rows"].as_array().cloned().unwrap_or_default();
        if rows.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(
        rows.iter().all(|r| r["embed_model"] == "stub-embed-1"),
        "{rows:?}"
    );
    assert_eq!(rows[0]["content"], "apples and pears");
    let ids = d
        .search_ids(json!({"query": "trains Berlin", "stream": "s"}))
        .await;
    assert_eq!(rows[2]["content"], "trains to Berlin");
    assert_eq!(
        ids.first(),
        rows[2]["id"].as_str().map(String::from).as_ref(),
        "{ids:?}"
    );

    let seen = api.seen.lock().unwrap().clone();
    // The 503 was retried; every request carried the key and the model.
    assert!(api.requests.load(Ordering::SeqCst) >= 3);
    assert!(seen
        .iter()
        .all(|(auth, body)| auth.as_deref() == Some("Bearer sk-test-123")
            && body["model"] == "stub-embed-1"));
    assert!(seen
        .iter()
        .all(|(_, body)| body["input"].as_array().unwrap().len() <= 2));
}

/// The worker takes a batch only once one of its two slots is free: writes
/// that arrive while both batches in flight wait (here on a held embedding
/// API) go into the next batch together, instead of a batch pulled from the
/// first few milliseconds' arrivals waiting half empty for a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_arrive_while_both_batches_wait_form_the_next_batch() {
    let api = stub_api(16).await;
    let d = Daemon::start(
        api.configure(Options::default())
            .env("LOOMEM_BUS__BATCH_SIZE", "64")
            .env("LOOMEM_EMBED__BATCH_SIZE", "64"),
    )
    .await;
    api.hold.send_replace(true);
    let store = |content: String| {
        let d = &d;
        async move {
            let (status, resp) = d
                .call(
                    "POST",
                    "/v1/store",
                    Some(json!({"content": content, "stream": "s", "wait": false})),
                )
                .await;
            assert_eq!(status, 200, "{resp}");
        }
    };
    // Two batches of one memory each, both held in the embedding API.
    for n in 1..=2 {
        store(format!("Opening note number {n} about the garden")).await;
        wait_until("a held embedding request", || {
            api.arrived.load(Ordering::SeqCst) >= n
        })
        .await;
    }
    // Sixty more while both slots are taken, one at a time.
    let words = ["apple", "river", "violin", "granite", "pepper", "comet"];
    let texts: Vec<String> = (0..60)
        .map(|i| {
            format!(
                "{} {} {} entry {i}",
                words[i % 6],
                words[(i / 6) % 6],
                words[(i / 36) % 6]
            )
        })
        .collect();
    for t in &texts {
        store(t.clone()).await;
    }
    api.hold.send_replace(false);
    let embedded = || -> Vec<usize> {
        api.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, body)| body["input"].as_array().map_or(0, Vec::len))
            .collect()
    };
    wait_until("every text embedded", || {
        embedded().iter().sum::<usize>() >= 62
    })
    .await;
    let sizes = embedded();
    assert!(
        sizes.contains(&60),
        "the sixty writes were embedded as one batch: requests of {sizes:?}"
    );
}

/// Poll `ok` until it holds; fail after a minute, naming `what`.
async fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !ok() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_model_marks_chunks_stale_until_embed_missing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Written with the hash embedder (same dimension, another vector space).
    let d = Daemon::start_at(&data, Options::embedded()).await;
    let cursor = d
        .store("Prefers Cursor over VSCode for AI features", "dev")
        .await;
    d.store("Bought oat milk, eggs and sourdough bread", "dev")
        .await;
    d.store("The flight to Lisbon leaves on Friday evening", "other")
        .await;
    d.stop().await;

    let opts = Options {
        auth: true,
        embedded: true,
        ..Default::default()
    }
    .minilm()
    .env("LOOMEM_SEARCH__BM25_WEIGHT", "0");
    let d = Daemon::start_at(&data, opts).await;
    let (_, status) = d.call("GET", "/v1/status", None).await;
    assert_eq!(status["embedder"]["stale"], 3, "{status}");
    assert_eq!(status["config_summary"]["embeddings_count"], 0);
    // Stale vectors are not compared with the new model's query vector.
    let ids = d
        .search_ids(json!({"query": "What IDE does the user prefer?", "stream": "dev"}))
        .await;
    assert!(ids.is_empty(), "{ids:?}");

    // A scoped key re-embeds only its own streams.
    let (code, body) = d
        .call_as(
            Some(crate::fixture::TOKEN_A),
            "POST",
            "/v1/embed-missing",
            None,
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["total_missing"], 0, "{body}");

    let (code, body) = d.call("POST", "/v1/embed-missing", None).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "ok");
    assert_eq!(
        (
            body["total_missing"].clone(),
            body["embedded"].clone(),
            body["failed"].clone()
        ),
        (json!(3), json!(3), json!(0)),
        "{body}"
    );
    let ids = d
        .search_ids(json!({"query": "What IDE does the user prefer?", "stream": "dev"}))
        .await;
    assert_eq!(ids.first(), Some(&cursor), "{ids:?}");
    let (_, status) = d.call("GET", "/v1/status", None).await;
    assert_eq!(status["embedder"]["stale"], 0, "{status}");

    // re-embed-all in the background: 202 with a job to poll.
    let (code, body) = d
        .call("POST", "/v1/re-embed-all", Some(json!({"wait": false})))
        .await;
    assert_eq!(code, 202, "{body}");
    let job = body["job_id"].as_str().unwrap().to_string();
    let mut view = Value::Null;
    for _ in 0..200 {
        view = d.call("GET", &format!("/v1/jobs/{job}"), None).await.1;
        if view["state"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(view["state"], "succeeded", "{view}");
    assert_eq!(
        (view["total"].clone(), view["done"].clone()),
        (json!(3), json!(3))
    );
    // Another caller cannot read the admin's job.
    let (code, _) = d
        .call_as(
            Some(crate::fixture::TOKEN_A),
            "GET",
            &format!("/v1/jobs/{job}"),
            None,
        )
        .await;
    assert_eq!(code, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedding_jobs_are_per_caller_and_their_owner_can_cancel_them() {
    use crate::fixture::{TOKEN_A, TOKEN_B};
    let api = stub_api(16).await;
    let d = Daemon::start(api.configure(Options::with_auth())).await;
    for (token, text) in [(TOKEN_A, "apples and pears"), (TOKEN_B, "trains to Berlin")] {
        let (code, body) = d
            .call_as(
                Some(token),
                "POST",
                "/v1/store",
                Some(json!({"content": text})),
            )
            .await;
        assert_eq!(code, 200, "{body}");
    }
    let d = &d;
    let start = |token| async move {
        d.call_as(
            Some(token),
            "POST",
            "/v1/re-embed-all",
            Some(json!({"wait": false})),
        )
        .await
    };
    let job_of = |body: &Value| body["job_id"].as_str().unwrap().to_string();

    // Embedding stalls: B's job stays running.
    api.hold.send_replace(true);
    let (code, body) = start(TOKEN_B).await;
    assert_eq!(code, 202, "{body}");
    let b_job = job_of(&body);
    let (code, body) = start(TOKEN_B).await;
    assert_eq!(code, 409, "one job at a time per caller: {body}");
    // B's running job does not hold A's back.
    let (code, body) = start(TOKEN_A).await;
    assert_eq!(code, 202, "{body}");
    let a_job = job_of(&body);

    // A can neither cancel nor see B's job: the same answer as no job at all.
    let (code, body) = d
        .call_as(Some(TOKEN_A), "DELETE", &format!("/v1/jobs/{b_job}"), None)
        .await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body, json!({ "detail": format!("no job {b_job}") }));
    let (_, view) = d
        .call_as(Some(TOKEN_B), "GET", &format!("/v1/jobs/{b_job}"), None)
        .await;
    assert_eq!(view["state"], "running", "{view}");

    // B cancels its own while the embedding call is still held.
    let (code, view) = d
        .call_as(Some(TOKEN_B), "DELETE", &format!("/v1/jobs/{b_job}"), None)
        .await;
    assert_eq!(code, 200, "{view}");
    assert_eq!(view["state"], "cancelled", "{view}");
    assert_eq!(view["done"], 0, "{view}");
    let (_, status) = d.call_as(Some(TOKEN_B), "GET", "/v1/status", None).await;
    assert!(status["embedder"]["job"].is_null(), "{status}");
    // The slot is free again; cancelling an ended job changes nothing.
    let (code, body) = start(TOKEN_B).await;
    assert_eq!(code, 202, "{body}");
    let b_again = job_of(&body);
    let (code, view) = d
        .call_as(Some(TOKEN_B), "DELETE", &format!("/v1/jobs/{b_job}"), None)
        .await;
    assert_eq!((code, view["state"].clone()), (200, json!("cancelled")));

    // Released, the other jobs finish their work.
    api.hold.send_replace(false);
    for (token, job) in [(TOKEN_A, a_job), (TOKEN_B, b_again)] {
        let mut view = Value::Null;
        for _ in 0..400 {
            view = d
                .call_as(Some(token), "GET", &format!("/v1/jobs/{job}"), None)
                .await
                .1;
            if view["state"] != "running" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(view["state"], "succeeded", "{view}");
        assert_eq!(
            (view["total"].clone(), view["done"].clone()),
            (json!(1), json!(1))
        );
    }
}
