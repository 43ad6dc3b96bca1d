//! The enrichment stages seen through the API: dedupe, supersession, entities.

use serde_json::json;

use crate::fixture::{Daemon, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_editors_supersedes_the_old_fact_and_history_shows_both() {
    let d = Daemon::start(Options::default()).await;
    let old = d.store("I use VSCode for all my coding", "dev").await;
    let new = d.store("I switched to Cursor last week", "dev").await;

    // One latest memory: the default search no longer returns the old fact.
    let ids = d
        .search_ids(json!({"query": "coding with VSCode or Cursor", "stream": "dev"}))
        .await;
    assert!(ids.contains(&new), "{ids:?}");
    assert!(!ids.contains(&old), "{ids:?}");
    // The superseded one comes back, marked, when asked for.
    let (_, resp) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "VSCode coding", "stream": "dev", "include_superseded": true, "trace": true})),
        )
        .await;
    let hit = resp["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["chunk_id"] == old.as_str())
        .unwrap()
        .clone();
    assert!(
        hit["content"].as_str().unwrap().starts_with("[UPDATED] "),
        "{hit}"
    );
    assert_eq!(hit["trace_info"]["is_latest"], false);
    assert_eq!(hit["trace_info"]["superseded_by"], new.as_str());

    let (s, h) = d
        .call("GET", &format!("/v1/memories/{old}/history"), None)
        .await;
    assert_eq!(s, 200, "{h}");
    let versions = h["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2);
    assert_eq!(versions[0]["chunk_id"], old.as_str());
    assert_eq!(versions[0]["is_current"], false);
    assert!(versions[0]["valid_until"].is_string());
    assert_eq!(versions[1]["chunk_id"], new.as_str());
    assert_eq!(versions[1]["version"], 2);
    assert_eq!(versions[1]["is_current"], true);
    let events: Vec<&str> = h["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert!(
        events.contains(&"superseded") && events.contains(&"supersedes"),
        "{events:?}"
    );
    assert!(
        h["events"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("switched to"),
        "{h}"
    );

    // Nothing was deleted.
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["chunks"], 2);

    // Bitemporal: before the switch the old fact held, after it the new one.
    let before = versions[0]["created_at"].as_str().unwrap();
    let ids = d
        .search_ids(json!({"query": "coding editor VSCode Cursor", "stream": "dev", "include_superseded": true, "valid_at": before}))
        .await;
    assert_eq!(ids, vec![old.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_about_a_named_person_supersedes_like_the_users_own() {
    let d = Daemon::start(Options::default()).await;
    let old = d.store("Alice uses VSCode as her editor", "team").await;
    let new = d
        .store("Alice switched from VSCode to Cursor as her editor", "team")
        .await;
    let row = d
        .sql(&format!(
            "SELECT subject, superseded_by FROM chunks WHERE id = '{old}'"
        ))
        .await;
    assert_eq!(row[0]["superseded_by"], new.as_str(), "{row:?}");
    assert_eq!(row[0]["subject"], "Alice", "{row:?}");
    let ids = d
        .search_ids(json!({"query": "Which editor does Alice use?", "stream": "team"}))
        .await;
    assert_eq!(ids.first(), Some(&new), "{ids:?}");
    assert!(!ids.contains(&old), "{ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_restore_returns_the_existing_id() {
    let d = Daemon::start(Options::default()).await;
    let first = d.store("Alice is allergic to peanuts", "x").await;
    let (s, again) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "alice is  allergic to PEANUTS", "stream": "x"})),
        )
        .await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["status"], "duplicate", "{again}");
    assert_eq!(again["id"], first.as_str(), "{again}");
    assert_eq!(again["duplicate_of"], first.as_str(), "{again}");
    let elsewhere = d.store("Alice is allergic to peanuts", "y").await;
    assert_ne!(first, elsewhere, "dedupe is per stream");
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["chunks"], 2);
    let dedupe = st["pipelines"]["store"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "dedupe")
        .unwrap()
        .clone();
    assert_eq!(dedupe["dropped"]["duplicate"], 1, "{dedupe}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entities_are_extracted_normalised_and_filterable() {
    let d = Daemon::start(Options::default()).await;
    let a = d
        .store("My colleague Bob uses VS Code at Acme Labs", "g")
        .await;
    let b = d.store("Bob said vscode crashed again", "g").await;
    d.store("The weather in Lisbon was lovely", "g").await;
    let mut ids = d
        .search_ids(json!({"query": "Bob", "stream": "g", "entity": "VSCode"}))
        .await;
    ids.sort();
    let mut want = vec![a, b];
    want.sort();
    assert_eq!(ids, want);
    assert!(d
        .search_ids(json!({"query": "Bob", "stream": "g", "entity": "Lisbon"}))
        .await
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_near_duplicate_leaves_nothing_in_the_graph() {
    let d = Daemon::start(Options::embedded()).await;
    let text = |name: &str| {
        format!("Yesterday at the long harbour market in Lisbon I met {name} and we talked for hours about boats, bread, weather, music and the old trams")
    };
    let kept = d.store(&text("Zorab"), "g").await;
    let (s, r) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": text("Zorac"), "stream": "g"})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        r["status"], "duplicate",
        "the hash embedder sees a near-copy: {r}"
    );
    // The names of the text that was not stored are not in the graph, and
    // the entities it shares with the kept memory point at that one only.
    let (s, gone) = d.call("GET", "/v1/graph/entity/Zorac?stream=g", None).await;
    assert_eq!(s, 404, "{gone}");
    let (s, city) = d
        .call("GET", "/v1/graph/entity/Lisbon?stream=g", None)
        .await;
    assert_eq!(s, 200, "{city}");
    assert_eq!(city["chunk_ids"], json!([kept]), "{city}");
    let (s, name) = d.call("GET", "/v1/graph/entity/Zorab?stream=g", None).await;
    assert_eq!(s, 200, "{name}");
    assert_eq!(name["chunk_ids"], json!([kept]), "{name}");
}
