//! Dream consolidation through `POST /v1/dream` on a seeded stream.

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options};

async fn put(d: &Daemon, body: Value) -> String {
    let (status, resp) = d.call("POST", "/v1/store", Some(body)).await;
    assert_eq!(status, 200, "{resp}");
    resp["id"].as_str().unwrap().to_string()
}

async fn rows(d: &Daemon, sql: &str) -> Value {
    let (s, r) = d.call("POST", "/v1/sql", Some(json!({ "sql": sql }))).await;
    assert_eq!(s, 200, "{r}");
    r["rows"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dream_merges_groups_resolves_contradictions_and_explains_itself() {
    let d = Daemon::start(Options::embedded()).await;
    let owns = put(&d, json!({"content": "Dana owns the payments dashboard", "stream": "s", "subject": "Dana", "created_at": "2026-02-01"})).await;
    let reviews = put(&d, json!({"content": "Dana reviews the payments dashboard every Friday", "stream": "s", "subject": "Dana", "created_at": "2026-02-03"})).await;
    let old = put(&d, json!({"content": "User prefers VSCode as the main editor", "stream": "s", "subject": "user", "memory_type": "preference", "created_at": "2026-01-01"})).await;
    let new = put(&d, json!({"content": "User prefers Cursor as the main editor", "stream": "s", "subject": "user", "memory_type": "preference", "created_at": "2026-03-01"})).await;
    let alone = put(
        &d,
        json!({"content": "The office wifi password rotates monthly", "stream": "s"}),
    )
    .await;
    let knobs = json!({"stream": "s", "related_similarity": 0.3, "contradiction_similarity": 0.3, "similarity": 0.95});
    let with = |extra: Value| {
        let mut b = knobs.clone();
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let before = rows(
        &d,
        "SELECT id, superseded_by, level FROM chunks ORDER BY id",
    )
    .await;

    // A dry run reports the plan and changes nothing.
    let (s, plan) = d
        .call("POST", "/v1/dream", Some(with(json!({"dry_run": true}))))
        .await;
    assert_eq!(s, 200, "{plan}");
    assert_eq!(plan["chunks_processed"], 5);
    assert_eq!(plan["groups_found"], 1, "{plan}");
    assert_eq!(plan["facts_merged"], 2);
    assert_eq!(plan["contradictions_resolved"], 1);
    assert_eq!(plan["contradictions"][0]["superseded"], old.as_str());
    assert_eq!(plan["contradictions"][0]["by"], new.as_str());
    let mut sources: Vec<String> =
        serde_json::from_value(plan["groups"][0]["sources"].clone()).unwrap();
    sources.sort();
    let mut dana = vec![owns.clone(), reviews.clone()];
    dana.sort();
    assert_eq!(sources, dana);
    assert_eq!(
        rows(
            &d,
            "SELECT id, superseded_by, level FROM chunks ORDER BY id"
        )
        .await,
        before
    );

    // The real run.
    let (s, done) = d.call("POST", "/v1/dream", Some(knobs.clone())).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(done["groups_found"], 1);
    assert_eq!(done["cost_usd"], 0.0);
    let l1 = done["groups"][0]["l1_id"].as_str().unwrap().to_string();
    let content = done["groups"][0]["content"].as_str().unwrap();
    assert!(
        content.contains("owns the payments dashboard") && content.contains("every Friday"),
        "{content}"
    );
    let l1_row = rows(
        &d,
        &format!("SELECT level, source, subject, content FROM chunks WHERE id = '{l1}'"),
    )
    .await;
    assert_eq!(l1_row[0]["level"], 1);
    assert_eq!(l1_row[0]["source"], "consolidation");
    assert_eq!(l1_row[0]["subject"], "Dana");
    for id in [&owns, &reviews] {
        let r = rows(
            &d,
            &format!("SELECT superseded_by FROM chunks WHERE id = '{id}'"),
        )
        .await;
        assert_eq!(r[0]["superseded_by"], l1.as_str());
    }
    let r = rows(
        &d,
        &format!("SELECT superseded_by, valid_until FROM chunks WHERE id = '{old}'"),
    )
    .await;
    assert_eq!(r[0]["superseded_by"], new.as_str());
    assert!(!r[0]["valid_until"].is_null(), "validity closed: {r}");
    let r = rows(
        &d,
        &format!("SELECT superseded_by FROM chunks WHERE id = '{alone}'"),
    )
    .await;
    assert!(r[0]["superseded_by"].is_null());

    // Search now finds the consolidated memory, not its sources.
    let ids = d
        .search_ids(json!({"query": "Dana payments dashboard", "stream": "s"}))
        .await;
    assert_eq!(ids[0], l1, "{ids:?}");
    assert!(!ids.contains(&owns) && !ids.contains(&reviews));

    // History explains every step.
    let (_, h) = d
        .call("GET", &format!("/v1/memories/{owns}/history"), None)
        .await;
    let merged = h["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "merged")
        .expect("merged event");
    assert!(merged["reason"].as_str().unwrap().contains(&l1), "{h}");
    let (_, h) = d
        .call("GET", &format!("/v1/memories/{old}/history"), None)
        .await;
    let sup = h["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "superseded")
        .expect("superseded event");
    assert!(
        sup["reason"]
            .as_str()
            .unwrap()
            .starts_with("dream: a newer preference about user wins"),
        "{h}"
    );
    assert_eq!(
        h["versions"].as_array().unwrap().last().unwrap()["chunk_id"],
        new.as_str()
    );

    // Nothing left to do on a second run.
    let (_, again) = d.call("POST", "/v1/dream", Some(knobs)).await;
    assert_eq!(again["groups_found"], 0, "{again}");
    assert_eq!(again["contradictions_resolved"], 0);
    let (s, err) = d
        .call("POST", "/v1/dream", Some(json!({"similarity": 3})))
        .await;
    assert_eq!(s, 422, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_quiet_after_writes_is_dreamed_once_by_itself() {
    let d = crate::fixture::Daemon::start(
        crate::fixture::Options::default().env("LOOMEM_SCHEDULER__DREAM_AFTER_IDLE_SECS", "1"),
    )
    .await;
    for content in [
        "Dana owns the payments dashboard",
        "Dana owns the payments dashboard and its alerts",
    ] {
        put(
            &d,
            json!({"content": content, "stream": "quiet", "subject": "Dana"}),
        )
        .await;
    }
    let idle_runs = |d: &crate::fixture::Daemon| {
        let d = d.url.clone();
        async move {
            let body: serde_json::Value = reqwest::get(format!("{d}/v1/jobs?job=dream"))
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            body["runs"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["trigger"] == "idle")
                .cloned()
                .collect::<Vec<_>>()
        }
    };
    let started = std::time::Instant::now();
    let runs = loop {
        let runs = idle_runs(&d).await;
        if !runs.is_empty() {
            break runs;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "no idle dream"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(runs[0]["status"], "succeeded", "{runs:?}");
    assert_eq!(runs[0]["report"]["stream"], "quiet", "{runs:?}");
    assert_eq!(runs[0]["report"]["chunks_processed"], 2, "{runs:?}");
    assert_eq!(runs[0]["report"]["facts_merged"], 2, "{runs:?}");
    // Nothing new was written: no second dream.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(idle_runs(&d).await.len(), 1);
}
