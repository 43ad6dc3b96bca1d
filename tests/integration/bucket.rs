//! The data in an S3-compatible bucket: a real moto server (PyPI
//! `moto[server]`, installed by scripts/setup-tests.sh) holds every table;
//! two daemons write and search it through one JetStream consumer, and both
//! restart onto it with every memory.

use serde_json::json;

use crate::fixture::{Daemon, Options};
use crate::jetstream::{both_wrote, wait_status};
use crate::moto::Moto;
use crate::nats::NatsServer;

const BUCKET: &str = "loomem-it";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_share_a_bucket_and_both_restart_onto_every_memory() {
    const N: usize = 1200;
    let moto = Moto::start().await;
    moto.bucket(BUCKET).await;
    let dir = tempfile::tempdir().unwrap();
    // Nothing of the data is kept here: the daemons get this path only to
    // show that it stays empty.
    let local = dir.path().join("data");
    let nats = NatsServer::start(&dir.path().join("nats"));
    let url = nats.url();
    let opts = Options::default()
        .envs(moto.env(&format!("s3://{BUCKET}/deploy")))
        .env("LOOMEM_BUS__BATCH_SIZE", "50")
        .env("LOOMEM_STORAGE__READ_CONSISTENCY_MS", "0")
        // Each process's hot index follows only its own writes (README).
        .env("LOOMEM_STORAGE__HOT_INDEX_MB", "0")
        .env(
            "LOOMEM_SCHEDULER__JOBS__EXPORT__PARAMS__EXPORTS",
            &format!(
                "[{{ format = \"jsonl\", path = \"s3://{BUCKET}/exports/{{stream}}.jsonl\" }}]"
            ),
        );
    let a = Daemon::start_with(&local, Some(nats), opts.clone()).await;
    let b = Daemon::start_with(&local, Some(NatsServer::external(&url)), opts.clone()).await;

    let file: String = (0..N)
        .map(|i| {
            format!(
                "{{\"content\":\"bucket item {i} filed on shelf {}\"}}\n",
                i % 11
            )
        })
        .collect();
    let (s, report) = a
        .post_raw("/v1/import?format=jsonl&stream=pool", file.into_bytes())
        .await;
    assert_eq!(s, 200, "{report}");
    let note = b
        .store("The heron on the north pond is called Augustine", "notes")
        .await;
    for d in [&a, &b] {
        wait_status(d, 180, "every memory", |st| st["chunks"] == N + 1).await;
    }
    // Both processes took part of the import from the shared consumer.
    both_wrote(&a, &b).await;
    // Each finds what the other wrote.
    let found = a
        .search_ids(json!({"query": "heron Augustine", "stream": "notes", "mode": "bm25"}))
        .await;
    assert_eq!(found, vec![note.clone()]);
    let found = b
        .search_ids(
            json!({"query": "bucket item 777", "stream": "pool", "mode": "bm25", "top_k": 3}),
        )
        .await;
    assert!(!found.is_empty());

    // The tables and the deployment's id key are objects in the bucket; the
    // local path was never made.
    let keys = moto.keys(BUCKET, "deploy/").await;
    assert!(keys.iter().any(|k| k == "deploy/id-key"), "{keys:?}");
    assert!(
        keys.iter().any(|k| k.starts_with("deploy/chunks.lance/")),
        "{keys:?}"
    );
    assert!(!local.exists(), "nothing is written to {}", local.display());

    // The export job writes a stream's memories into the bucket.
    let (s, run) = b
        .call(
            "POST",
            "/admin/jobs/export/run",
            Some(json!({"dry_run": false})),
        )
        .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["status"], "succeeded", "{run}");
    let notes = moto
        .get(BUCKET, "exports/notes.jsonl")
        .await
        .expect("exported");
    assert!(notes.contains("Augustine"), "{notes}");
    let pool = moto
        .get(BUCKET, "exports/pool.jsonl")
        .await
        .expect("exported");
    assert!(pool.lines().filter(|l| l.contains("bucket item")).count() >= N);

    // Stop both; start both again on the bucket: every memory is there.
    let (nats, _) = a.stop().await;
    b.stop().await;
    let a = Daemon::start_with(&local, nats, opts.clone()).await;
    let b = Daemon::start_with(&local, Some(NatsServer::external(&url)), opts).await;
    for d in [&a, &b] {
        wait_status(d, 60, "every memory after the restart", |st| {
            st["chunks"] == N + 1
        })
        .await;
    }
    let distinct = b.sql("SELECT COUNT(DISTINCT id) AS n FROM chunks").await;
    assert_eq!(distinct[0]["n"], N + 1);
    let found = b
        .search_ids(json!({"query": "heron Augustine", "stream": "notes", "mode": "bm25"}))
        .await;
    assert_eq!(found, vec![note.clone()]);

    // A snapshot and a rollback on the bucket (one process, as the README says).
    b.stop().await;
    let (s, _) = a
        .call("POST", "/v1/snapshots", Some(json!({"name": "before"})))
        .await;
    assert_eq!(s, 201);
    let (s, r) = a
        .call("POST", "/v1/delete", Some(json!({"id": note})))
        .await;
    assert_eq!(s, 200, "{r}");
    assert!(a
        .search_ids(json!({"query": "heron Augustine", "stream": "notes", "mode": "bm25"}))
        .await
        .is_empty());
    let (s, r) = a.call("POST", "/v1/snapshots/before/rollback", None).await;
    assert_eq!(s, 200, "{r}");
    let found = a
        .search_ids(json!({"query": "heron Augustine", "stream": "notes", "mode": "bm25"}))
        .await;
    assert_eq!(found, vec![note]);
}
