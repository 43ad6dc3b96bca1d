//! loomem on a three-node NATS JetStream cluster, the stream at three
//! replicas: an import of 20,000 memories during which one node is killed -9
//! and then the stream's leader stores every memory exactly once, and writes
//! go on without restarting loomem. And processes sharing one bus run each
//! scheduled instant, and each quiet stream's dream, once.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options};
use crate::jetstream::wait_status;
pub(crate) use crate::nats::NatsCluster;

const N: usize = 20_000;

/// Wait until `pred` holds of the LOOMEM stream's info (its cluster part).
async fn wait_stream(
    js: &async_nats::jetstream::Context,
    what: &str,
    pred: impl Fn(&async_nats::jetstream::stream::Info) -> bool,
) -> async_nats::jetstream::stream::Info {
    let started = Instant::now();
    loop {
        if let Ok(mut s) = js.get_stream("LOOMEM").await {
            if let Ok(info) = s.info().await {
                if pred(info) {
                    return info.clone();
                }
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn leader(info: &async_nats::jetstream::stream::Info) -> Option<usize> {
    let name = info.cluster.as_ref()?.leader.clone()?;
    (0..3).find(|&i| NatsCluster::name(i) == name)
}

fn all_current(info: &async_nats::jetstream::stream::Info) -> bool {
    info.cluster.as_ref().is_some_and(|c| {
        c.leader.is_some()
            && c.replicas.len() == 2
            && c.replicas.iter().all(|r| r.current && !r.offline)
    })
}

fn stored(st: &Value) -> usize {
    st["chunks"].as_u64().unwrap_or(0) as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_survives_a_killed_node_and_a_killed_stream_leader() {
    let dir = tempfile::tempdir().unwrap();
    eprintln!("cluster under {}", dir.path().display());
    let mut cluster = NatsCluster::start(&dir.path().join("nats"));
    let urls = cluster.urls();
    cluster.ready().await;
    let js = cluster.jetstream().await;
    let d = Daemon::start_with(
        &dir.path().join("data"),
        None,
        Options::default()
            .env("LOOMEM_BUS__KIND", "jetstream")
            .env("LOOMEM_BUS__NATS_URL", &urls)
            .env("LOOMEM_BUS__REPLICAS", "3")
            .env("LOOMEM_BUS__BATCH_SIZE", "250")
            .env("LOOMEM_BUS__PUBLISH_TIMEOUT_MS", "2000"),
    )
    .await;
    let info = wait_stream(&js, "three replicas", all_current).await;
    assert_eq!(info.config.num_replicas, 3);

    // The import: ids chosen by the file, so sending it again after a
    // failure stores nothing twice. It goes on in the background.
    let file: String = (0..N)
        .map(|i| format!("{}\n", json!({"id": format!("c-{i}"), "content": format!("cluster record {i} about topic {}", i % 37)})))
        .collect();
    let (url, http) = (d.url.clone(), d.http.clone());
    let import = tokio::spawn(async move {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let sent = http
                .post(format!("{url}/v1/import?format=jsonl&stream=cl"))
                .body(file.clone())
                .send()
                .await;
            if let Ok(r) = sent {
                let status = r.status().as_u16();
                let body: Value = r.json().await.unwrap_or_default();
                if status == 200 && body["rejected"].as_array().is_some_and(|r| r.is_empty()) {
                    return attempts;
                }
            }
            assert!(attempts < 60, "the import never went through");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });

    // Kill -9 a node that does not lead the stream, while memories arrive.
    let st = wait_status(&d, 120, "the first memories", |st| stored(st) > 0).await;
    let before = stored(&st);
    let info = wait_stream(&js, "a leader", |i| leader(i).is_some()).await;
    let follower = (0..3).find(|&i| Some(i) != leader(&info)).unwrap();
    cluster.kill(follower);
    eprintln!("killed follower n{follower} at {before} stored");
    wait_status(&d, 120, "progress without a follower", |st| {
        stored(st) > before || stored(st) == N
    })
    .await;
    cluster.restart(follower);
    wait_stream(&js, "the follower caught up", all_current).await;

    // Then kill -9 the stream's leader.
    let before = stored(&wait_status(&d, 10, "a status", |_| true).await);
    let info = wait_stream(&js, "a leader", |i| leader(i).is_some()).await;
    let old = leader(&info).unwrap();
    cluster.kill(old);
    eprintln!("killed leader n{old} at {before} stored");
    let elected = wait_stream(&js, "a new leader", |i| leader(i).is_some_and(|l| l != old)).await;
    assert_ne!(leader(&elected), Some(old));
    wait_status(&d, 180, "progress under the new leader", |st| {
        stored(st) > before || stored(st) == N
    })
    .await;
    cluster.restart(old);

    let attempts = import.await.expect("the import task");
    eprintln!("import accepted after {attempts} attempt(s)");
    let st = wait_status(&d, 300, "every memory", |st| stored(st) >= N).await;
    assert_eq!(stored(&st), N, "{st}");
    let rows = d.sql("SELECT count(*) AS n, count(DISTINCT content) AS texts FROM chunks WHERE stream = 'cl'").await;
    assert_eq!(
        rows[0],
        json!({"n": N, "texts": N}),
        "each memory once ({attempts} import attempts)"
    );
    assert_eq!(st["dead_letters"], 0, "{st}");

    // Writes go on, through the same loomem.
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "written after the failovers", "stream": "cl"})),
        )
        .await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("stored")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_sharing_the_bus_run_each_scheduled_instant_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let nats = crate::nats::NatsServer::start(&dir.path().join("nats"));
    let url = nats.url();
    let opts = Options::default()
        .env("LOOMEM_SCHEDULER__ENABLED", "true")
        .env("LOOMEM_SCHEDULER__JOBS__DECAY__CRON", "*/2 * * * * *")
        .env("LOOMEM_STORAGE__READ_CONSISTENCY_MS", "0");
    let a = Daemon::start_with(&data, Some(nats), opts.clone()).await;
    let _b = Daemon::start_with(&data, Some(crate::nats::NatsServer::external(&url)), opts).await;
    // Both run the scheduler; each even second's run is claimed by one.
    let started = Instant::now();
    let runs = loop {
        let (s, body) = a.call("GET", "/v1/jobs?job=decay&limit=100", None).await;
        assert_eq!(s, 200, "{body}");
        let runs: Vec<Value> = body["runs"].as_array().cloned().unwrap_or_default();
        if runs.len() >= 5 {
            break runs;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "too few runs: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut at: Vec<chrono::DateTime<chrono::Utc>> = runs
        .iter()
        .map(|r| r["started_at"].as_str().unwrap().parse().unwrap())
        .collect();
    at.sort();
    for pair in at.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= chrono::Duration::milliseconds(1500),
            "two runs of one instant, {} ms apart: {runs:?}",
            gap.num_milliseconds()
        );
    }
    assert!(runs.iter().all(|r| r["status"] == "succeeded"), "{runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_sharing_the_bus_dream_a_quiet_stream_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let nats = crate::nats::NatsServer::start(&dir.path().join("nats"));
    let url = nats.url();
    let opts = Options::default()
        .env("LOOMEM_SCHEDULER__DREAM_AFTER_IDLE_SECS", "1")
        .env("LOOMEM_BUS__BATCH_SIZE", "20")
        // A message a write, so a burst's messages are many to share.
        .env("LOOMEM_BUS__PACK_WRITES", "1")
        .env("LOOMEM_STORAGE__READ_CONSISTENCY_MS", "0");
    let a = Daemon::start_with(&data, Some(nats), opts.clone()).await;
    let b = Daemon::start_with(&data, Some(crate::nats::NatsServer::external(&url)), opts).await;
    // Each burst is split between the two (one consumer); each process finds
    // the stream quiet a second after its own last write, and settles it:
    // dreams it, or finds that the other took the stream's lease and dreamed.
    let ds = [&a, &b];
    let mut wrote_both = false;
    for round in 1..=4usize {
        let before = [tallies(&a).await, tallies(&b).await];
        let file: String = (0..200)
            .map(|i| format!("{{\"content\":\"round {round} note {i} about the quiet stream\"}}\n"))
            .collect();
        let (s, report) = a
            .post_raw("/v1/import?format=jsonl&stream=quiet", file.into_bytes())
            .await;
        assert_eq!(s, 200, "{report}");
        let started = Instant::now();
        loop {
            let now = [tallies(&a).await, tallies(&b).await];
            // (The dream's own memories do not go through the import.)
            if now[0].0 + now[1].0 < 200 * round as u64 {
                assert!(
                    started.elapsed() < Duration::from_secs(90),
                    "burst {round} not stored: {now:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            // Every process that wrote in this burst has settled it.
            let settled = (0..2).all(|p| now[p].0 == before[p].0 || now[p].1 > before[p].1);
            if settled && idle_dreams(&a).await >= round {
                wrote_both |= (0..2).all(|p| now[p].0 > before[p].0);
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "burst {round} never settled: {before:?} → {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(idle_dreams(ds[round % 2]).await, round, "one dream a burst");
    }
    assert!(wrote_both, "no burst was split between the processes");
}

/// A daemon's memories written by its import pipeline, and the quiet spells
/// its idle dream settled (dreamed here or elsewhere).
async fn tallies(d: &Daemon) -> (u64, u64) {
    let (s, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(s, 200, "{st}");
    let written = crate::jetstream::import_written(&st);
    let idle = &st["idle_dreams"];
    let settled = idle["dreamed"].as_u64().unwrap() + idle["dreamed_elsewhere"].as_u64().unwrap();
    (written, settled)
}

/// How many dreams the daemon's run log holds that were set off by quiet.
async fn idle_dreams(d: &Daemon) -> usize {
    let (s, body) = d.call("GET", "/v1/jobs?job=dream&limit=100", None).await;
    assert_eq!(s, 200, "{body}");
    body["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["trigger"] == "idle")
        .count()
}
