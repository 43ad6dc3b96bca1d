//! Durability: what was stored survives a restart, graceful or by signal.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::fixture::{daemon_env, Daemon, Options};
use crate::nats::{free_port, NatsServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_every_stored_memory() {
    let d = Daemon::start(Options::default()).await;
    let data = d.data_dir.clone();
    let mut ids = Vec::new();
    for i in 0..25 {
        ids.push(
            d.store(&format!("fact {i}: the heron nests by lake {i}"), "r")
                .await,
        );
    }
    let (nats, dir) = d.stop().await;

    let d = Daemon::start_with(&data, nats, Options::default()).await;
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["chunks"], 25);
    let mut found = d
        .search_ids(json!({"query": "heron lake", "stream": "r", "top_k": 100}))
        .await;
    found.sort();
    ids.sort();
    assert_eq!(found, ids);
    drop(d);
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_and_flushes_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let nats = NatsServer::start(&dir.path().join("nats"));
    let (config, env) = daemon_env(&data, Some(&nats.url()), &Options::default());
    let port = free_port();
    let mut child = spawn_daemon(&config, &env, port).await;
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let resp: serde_json::Value = http
        .post(format!("{url}/v1/store"))
        .json(&json!({"content": "The binary stored this", "stream": "bin"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = resp["id"].as_str().unwrap().to_string();

    let pid = child.id().unwrap();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "exit status {exit:?}");

    let d = Daemon::start_at(&data, Options::default()).await;
    assert_eq!(
        d.search_ids(json!({"query": "binary stored", "stream": "bin"}))
            .await,
        vec![id]
    );
}

async fn spawn_daemon(
    config: &std::path::Path,
    env: &std::collections::HashMap<String, String>,
    port: u16,
) -> tokio::process::Child {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_loomem"))
        .args(["serve", "--config"])
        .arg(config)
        .envs(env)
        .env("LOOMEM_SERVER__PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    for _ in 0..400 {
        if http
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await
            .is_ok()
        {
            return child;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("daemon never answered /health");
}

async fn status(url: &str) -> serde_json::Value {
    reqwest::get(format!("{url}/v1/status"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn chunk_count(url: &str) -> u64 {
    status(url).await["chunks"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_20000_memory_import_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start(&dir.path().join("nats"));
    kill_9_during_an_import(dir.path(), &nats.url(), Options::default(), 20_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_an_import_on_a_three_node_cluster_and_a_bucket_loses_and_duplicates_nothing()
{
    let dir = tempfile::tempdir().unwrap();
    let cluster = crate::cluster::NatsCluster::start(&dir.path().join("nats"));
    let moto = crate::moto::Moto::start().await;
    moto.bucket("loomem-crash").await;
    cluster.ready().await;
    // moto is one Python process that lists every key of the bucket to find a
    // table's latest version: a 20,000-memory import (the node-kill test's,
    // tests/integration/cluster.rs) outgrows it, so this one imports 5,000 in
    // batches of 500.
    let opts = Options::default()
        .env("LOOMEM_BUS__REPLICAS", "3")
        .env("LOOMEM_BUS__BATCH_SIZE", "500")
        .envs(moto.env("s3://loomem-crash/data"));
    kill_9_during_an_import(dir.path(), &cluster.urls(), opts, 5_000).await;
    assert!(moto
        .keys("loomem-crash", "data/chunks.lance/")
        .await
        .iter()
        .any(|k| k.ends_with(".lance")));
    assert!(!dir.path().join("data").exists());
}

/// Import `total` memories into a loomem process on `nats_url`, kill it -9
/// part-way, start it again and import the file again: every memory once.
async fn kill_9_during_an_import(
    dir: &std::path::Path,
    nats_url: &str,
    opts: Options,
    total: usize,
) {
    let data = dir.join("data");
    let (config, mut env) = daemon_env(&data, Some(nats_url), &opts);
    // Redeliver unacknowledged messages soon after the crash, but not so soon
    // that a batch slowed by a loaded machine (other tests run alongside) is
    // redelivered while still in hand: the worker does not extend its ack
    // deadline while it works (yet).
    env.insert("LOOMEM_BUS__ACK_WAIT_MS".into(), "10000".into());
    let file: String = (0..total)
        .map(|i| {
            format!(
                "{{\"content\":\"memory {i}: the heron at pond {} ate {} fish\"}}\n",
                i % 97,
                i % 13
            )
        })
        .collect();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let import = |file: String, url: String| async move {
        reqwest::Client::new()
            .post(format!("{url}/v1/import?format=jsonl&stream=crash"))
            .body(file)
            .send()
            .await
    };

    let mut child = spawn_daemon(&config, &env, port).await;
    let first = tokio::spawn(import(file.clone(), url.clone()));
    // Kill -9 once the pipeline is part-way through.
    let started = std::time::Instant::now();
    loop {
        let n = chunk_count(&url).await;
        if n >= 1000 {
            assert!(n < total as u64, "the import finished before the crash");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "import never got going"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let _ = first.await; // the HTTP import may have been cut off: that is the point

    // Restart and finish the import by running it again.
    let mut child = spawn_daemon(&config, &env, port).await;
    let report: serde_json::Value = import(file, url.clone())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(report["read"], total);
    assert_eq!(report["rejected"], json!([]));
    // Recovery must keep making progress, however busy the machine: fail only
    // when the count stands still for four minutes (the count moves a batch of
    // up to 2,048 at a time, and a debug build on a loaded machine takes over a
    // minute for one).
    let (mut seen, mut moved) = (0, std::time::Instant::now());
    loop {
        let n = chunk_count(&url).await;
        if n >= total as u64 {
            break;
        }
        if n > seen {
            (seen, moved) = (n, std::time::Instant::now());
        }
        assert!(
            moved.elapsed() < Duration::from_secs(240),
            "stuck at {n} for 240 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Let any redelivery of the crashed batch play out: once the bus holds
    // nothing pending and nothing delivered but unacknowledged (the crashed
    // process's messages come back after the ack wait), no write is left to
    // arrive. Then count again.
    let started = std::time::Instant::now();
    let st = loop {
        let st = status(&url).await;
        let lag = &st["bus"]["lag"];
        if lag["pending"] == 0 && lag["ack_pending"] == 0 {
            break st;
        }
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "the bus never drained: {st}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(st["chunks"], total, "{st}");
    assert_eq!(st["dead_letters"], 0, "{st}");
    child.start_kill().unwrap();
    child.wait().await.unwrap();
}
