//! Snapshots: tag, list, roll back (every memory table, caches included),
//! survive compaction's pruning, retention in the scheduled job, admin only.

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, TOKEN_A};

async fn contents(d: &Daemon) -> Vec<String> {
    d.sql("SELECT content FROM chunks ORDER BY content")
        .await
        .iter()
        .map(|r| r["content"].as_str().unwrap().to_string())
        .collect()
}

async fn feedback_rows(d: &Daemon) -> Value {
    d.sql("SELECT count(*) AS n FROM feedback").await[0]["n"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_restores_every_table_and_survives_pruning() {
    let d = Daemon::start(Options::with_auth().env(
        "LOOMEM_SCHEDULER__JOBS__COMPACT__PARAMS__PRUNE_OLDER_THAN_HOURS",
        "0",
    ))
    .await;
    let a = d.store("Alpha likes green tea", "s").await;
    let b = d.store("Beta plays the oboe", "s").await;

    let (s, snap) = d
        .call("POST", "/v1/snapshots", Some(json!({"name": "before"})))
        .await;
    assert_eq!(s, 201, "{snap}");
    assert_eq!(snap["versions"].as_object().unwrap().len(), 6, "{snap}");
    let (s, again) = d
        .call("POST", "/v1/snapshots", Some(json!({"name": "before"})))
        .await;
    assert_eq!(s, 409, "{again}");
    let (s, bad) = d
        .call("POST", "/v1/snapshots", Some(json!({"name": "../x"})))
        .await;
    assert_eq!(s, 422, "{bad}");

    // Changes after the snapshot: a new memory, a deletion, feedback.
    d.store("Gamma moved to Lisbon", "s").await;
    let (s, del) = d.call("POST", "/v1/delete", Some(json!({"id": a}))).await;
    assert_eq!(s, 200, "{del}");
    let (s, fb) = d
        .call(
            "POST",
            "/v1/feedback",
            Some(json!({"chunk_id": b, "usefulness": 4})),
        )
        .await;
    assert_eq!(s, 201, "{fb}");
    assert_eq!(
        contents(&d).await,
        vec!["Beta plays the oboe", "Gamma moved to Lisbon"]
    );

    // Compaction prunes every untagged old version; the tagged one stays.
    let (s, run) = d
        .call("POST", "/admin/jobs/compact/run", Some(json!({})))
        .await;
    assert_eq!(
        (s, run["status"].as_str()),
        (200, Some("succeeded")),
        "{run}"
    );

    // Agent keys may not touch snapshots.
    let (s, _) = d
        .call_as(Some(TOKEN_A), "POST", "/v1/snapshots/before/rollback", None)
        .await;
    assert_eq!(s, 403);
    let (s, _) = d.call("POST", "/v1/snapshots/nope/rollback", None).await;
    assert_eq!(s, 404);

    let (s, rb) = d.call("POST", "/v1/snapshots/before/rollback", None).await;
    assert_eq!(s, 200, "{rb}");
    assert_eq!(
        contents(&d).await,
        vec!["Alpha likes green tea", "Beta plays the oboe"]
    );
    assert_eq!(feedback_rows(&d).await, 0);
    // The feedback tallies were recounted: no boost left on Beta.
    let (_, found) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "oboe", "stream": "s", "trace": true, "dry_run": true})),
        )
        .await;
    assert_eq!(found["results"][0]["chunk_id"], b.as_str(), "{found}");
    assert_eq!(
        found["results"][0]["trace_info"]["factors"]["feedback"], 1.0,
        "{found}"
    );
    // The pipeline writes again after the rollback.
    d.store("Delta arrives on Monday", "s").await;
    assert_eq!(contents(&d).await.len(), 3);
    let (_, st) = d.call("GET", "/admin/workers/status", None).await;
    assert_eq!(st["paused"], false, "{st}");

    let (s, list) = d.call("GET", "/v1/snapshots", None).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["snapshots"][0]["name"], "before", "{list}");
    let (s, _) = d.call("DELETE", "/v1/snapshots/before", None).await;
    assert_eq!(s, 200);
    let (_, list) = d.call("GET", "/v1/snapshots", None).await;
    assert_eq!(list["snapshots"], json!([]), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_job_keeps_the_newest_of_its_own() {
    let d = Daemon::start(
        Options::default().env("LOOMEM_SCHEDULER__JOBS__SNAPSHOT__PARAMS__KEEP", "2"),
    )
    .await;
    d.store("Something to keep", "s").await;
    let (s, _) = d
        .call("POST", "/v1/snapshots", Some(json!({"name": "manual"})))
        .await;
    assert_eq!(s, 201);
    let mut created = Vec::new();
    for _ in 0..3 {
        let (s, run) = d
            .call("POST", "/admin/jobs/snapshot/run", Some(json!({})))
            .await;
        assert_eq!(
            (s, run["status"].as_str()),
            (200, Some("succeeded")),
            "{run}"
        );
        created.push(run["report"]["created"].as_str().unwrap().to_string());
        // Names carry the second.
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
    let (_, list) = d.call("GET", "/v1/snapshots", None).await;
    let mut names: Vec<String> = list["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    let mut want = vec!["manual".to_string(), created[1].clone(), created[2].clone()];
    want.sort();
    assert_eq!(names, want);
}

/// A snapshot made before the `relations` table existed has no tag on it: it
/// is still listed, and rolling back to it empties `relations` (it held
/// nothing then) while the other tables go back as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_older_than_the_relations_table_still_rolls_back() {
    let d = Daemon::start(Options::default()).await;
    let a = d.store("Gamma writes haiku", "s").await;
    let b = d.store("Gamma reads them aloud", "s").await;
    let (s, _) = d
        .call("POST", "/v1/snapshots", Some(json!({"name": "old"})))
        .await;
    assert_eq!(s, 201);
    // What an older loomem left: no tag on the table it did not have.
    let db = lancedb::connect(d.data_dir.to_str().unwrap())
        .execute()
        .await
        .unwrap();
    let relations = db.open_table("relations").execute().await.unwrap();
    relations.tags().await.unwrap().delete("old").await.unwrap();

    let (s, r) = d
        .call(
            "POST",
            "/v1/relations",
            Some(json!({"from_id": a, "to_id": b, "relation": "follows"})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let c = d.store("Gamma sells a chapbook", "s").await;
    let (_, list) = d.call("GET", "/v1/snapshots", None).await;
    let old = list["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "old")
        .cloned()
        .unwrap_or_else(|| panic!("the old snapshot is listed: {list}"));
    assert!(old["versions"].get("relations").is_none(), "{old}");

    let (s, r) = d.call("POST", "/v1/snapshots/old/rollback", None).await;
    assert_eq!(s, 200, "{r}");
    let (_, rel) = d.call("GET", "/v1/relations", None).await;
    assert_eq!(rel["relations"], json!([]));
    let (s, _) = d.call("GET", &format!("/v1/memories/{c}"), None).await;
    assert_eq!(s, 404, "the memory stored after the snapshot is gone");
    let (s, _) = d.call("DELETE", "/v1/snapshots/old", None).await;
    assert_eq!(s, 200, "and it can be deleted");
}
