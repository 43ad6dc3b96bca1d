//! The peers' APIs served by loomem: every request example of Memoria's
//! reference (`shared/reference/memoria-api.md`) replayed under
//! `/compat/memoria`, its answers checked for the documented fields and
//! types, and a Memoria client's day (store, retrieve, correct, feedback,
//! purge, delete) within the key's own memories.

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, ADMIN_TOKEN, TOKEN_A, TOKEN_B};

const M: &str = "/compat/memoria";

async fn memoria(
    d: &Daemon,
    token: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    d.call_as(Some(token), method, &format!("{M}{path}"), body)
        .await
}

/// A MemoryResponse: the fields a Memoria client reads, with their types.
fn is_memory(v: &Value) -> bool {
    v["memory_id"].is_string()
        && v["content"].is_string()
        && v["memory_type"].is_string()
        && v["created_at"].is_string()
        && (v["session_id"].is_null() || v["session_id"].is_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memorias_documented_requests_answer_in_its_shapes() {
    let d = Daemon::start(Options::with_auth()).await;
    let a = |method: &'static str, path: &'static str, body: Option<Value>| {
        let d = &d;
        async move { memoria(d, TOKEN_A, method, path, body).await }
    };

    // Store: 201 with a MemoryResponse; semantic by default.
    let (s, m) = a("POST", "/v1/memories", Some(json!({"content": "The staging database is Postgres 16", "memory_type": "semantic", "session_id": null}))).await;
    assert_eq!(s, 201, "{m}");
    assert!(is_memory(&m), "{m}");
    assert_eq!(m["memory_type"], "semantic");
    let (_, plain) = a(
        "POST",
        "/v1/memories",
        Some(json!({"content": "Deploys happen on Tuesdays"})),
    )
    .await;
    assert_eq!(plain["memory_type"], "semantic", "{plain}");
    let db = m["memory_id"].as_str().unwrap().to_string();

    // Batch store.
    let (s, b) = a("POST", "/v1/memories/batch", Some(json!({"memories": [{"content": "Alice prefers dark mode"}, {"content": "The user is called Alice", "memory_type": "profile"}]}))).await;
    assert_eq!(s, 201, "{b}");
    let items = b["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert!(items.iter().all(is_memory), "{b}");
    assert_eq!(items[1]["memory_type"], "profile");

    // List: {items, next_cursor}, filtered by type, paged by cursor.
    let (s, l) = a("GET", "/v1/memories?limit=50&memory_type=semantic", None).await;
    assert_eq!(s, 200, "{l}");
    let listed = l["items"].as_array().unwrap();
    assert!(
        listed
            .iter()
            .all(|m| is_memory(m) && m["memory_type"] == "semantic"),
        "{l}"
    );
    assert_eq!(listed.len(), 3, "{l}");
    let (_, p1) = a("GET", "/v1/memories?limit=2", None).await;
    assert_eq!(p1["items"].as_array().unwrap().len(), 2);
    let cursor = p1["next_cursor"]
        .as_str()
        .expect("a next cursor")
        .to_string();
    let (_, p2) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!("{M}/v1/memories?limit=50&cursor={cursor}"),
            None,
        )
        .await;
    assert_eq!(p2["items"].as_array().unwrap().len(), 2, "{p2}");
    assert!(p2["next_cursor"].is_null(), "{p2}");

    // Retrieve and search, with every form of explain.
    for explain in [
        json!(false),
        json!(true),
        json!("verbose"),
        json!("analyze"),
    ] {
        let (s, r) = a("POST", "/v1/memories/retrieve", Some(json!({"query": "which database does staging use", "top_k": 10, "memory_types": ["semantic"], "session_id": null, "explain": explain}))).await;
        assert_eq!(s, 200, "{r}");
        let results = r["results"].as_array().unwrap();
        assert_eq!(results[0]["memory_id"], db.as_str(), "{r}");
        assert!(
            results
                .iter()
                .all(|m| is_memory(m) && m["score"].is_number()),
            "{r}"
        );
        assert_eq!(r.get("explain").is_some(), explain != json!(false), "{r}");
    }
    let (s, r) = a(
        "POST",
        "/v1/memories/search",
        Some(json!({"query": "dark mode", "top_k": 10, "explain": false})),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["results"][0]["content"], "Alice prefers dark mode");
    let (s, e) = a(
        "POST",
        "/v1/memories/search",
        Some(json!({"query": "x", "explain": "loud"})),
    )
    .await;
    assert_eq!(s, 422, "{e}");

    // Correct by id and by query: the new version, and what it matched.
    let (s, c) = d
        .call_as(
            Some(TOKEN_A),
            "PUT",
            &format!("{M}/v1/memories/{db}/correct"),
            Some(
                json!({"new_content": "The staging database is Postgres 17", "reason": "upgraded"}),
            ),
        )
        .await;
    assert_eq!(s, 200, "{c}");
    assert!(is_memory(&c), "{c}");
    assert_eq!(
        (c["matched_memory_id"].as_str(), c["content"].as_str()),
        (
            Some(db.as_str()),
            Some("The staging database is Postgres 17")
        )
    );
    let db2 = c["memory_id"].as_str().unwrap().to_string();
    assert_ne!(db2, db);
    let (s, c) = a("POST", "/v1/memories/correct", Some(json!({"query": "deploy day", "new_content": "Deploys happen on Thursdays", "reason": "moved"}))).await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["matched_memory_id"], plain["memory_id"], "{c}");
    assert_eq!(c["content"], "Deploys happen on Thursdays");

    // Feedback: 201 {feedback_id}; 404 unknown memory; 422 bad signal; stats.
    let fb = format!("/v1/memories/{db2}/feedback");
    for signal in ["useful", "useful", "irrelevant", "outdated", "wrong"] {
        let (s, f) = d
            .call_as(
                Some(TOKEN_A),
                "POST",
                &format!("{M}{fb}"),
                Some(json!({"signal": signal, "context": "helped answer the question"})),
            )
            .await;
        assert_eq!(s, 201, "{f}");
        assert!(f["feedback_id"].is_string(), "{f}");
    }
    let (s, _) = a(
        "POST",
        "/v1/memories/no-such-memory/feedback",
        Some(json!({"signal": "useful"})),
    )
    .await;
    assert_eq!(s, 404);
    let (s, e) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            &format!("{M}{fb}"),
            Some(json!({"signal": "meh"})),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    let (s, st) = a("GET", "/v1/feedback/stats", None).await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(
        st,
        json!({"useful": 2, "irrelevant": 1, "outdated": 1, "wrong": 1})
    );

    // Observe: a conversation's facts stored.
    let (s, o) = a("POST", "/v1/observe", Some(json!({"messages": [{"role": "user", "content": "I moved to Lisbon last month and I work at Acme Labs"}]}))).await;
    assert_eq!(s, 200, "{o}");
    assert!(!o["memories"].as_array().unwrap().is_empty(), "{o}");
    assert!(o["memories"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["memory_id"].is_string() && m["content"].is_string()));

    // Profile.
    let (s, p) = a("GET", "/v1/profiles/me", None).await;
    assert_eq!(s, 200, "{p}");
    assert!(p.is_object(), "{p}");

    // Consolidate (loomem's dream).
    let (s, r) = a("POST", "/v1/consolidate?force=false", None).await;
    assert_eq!(s, 200, "{r}");

    // Snapshots: an admin's (loomem's snapshots cover every table).
    let (s, _) = a(
        "POST",
        "/v1/snapshots",
        Some(json!({"name": "mine", "description": "before cleanup"})),
    )
    .await;
    assert_eq!(s, 403);
    let admin = |method: &'static str, path: &'static str, body: Option<Value>| {
        let d = &d;
        async move { memoria(d, ADMIN_TOKEN, method, path, body).await }
    };
    let (s, snap) = admin(
        "POST",
        "/v1/snapshots",
        Some(json!({"name": "before-cleanup", "description": "before cleanup"})),
    )
    .await;
    assert_eq!(s, 201, "{snap}");
    assert_eq!(snap["name"], "before-cleanup");
    let (s, all) = admin("GET", "/v1/snapshots", None).await;
    assert_eq!(s, 200, "{all}");
    assert!(all
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["name"] == "before-cleanup"));
    let (s, one) = admin(
        "GET",
        "/v1/snapshots/before-cleanup?detail=brief&limit=50&offset=0",
        None,
    )
    .await;
    assert_eq!(
        (s, one["name"].as_str()),
        (200, Some("before-cleanup")),
        "{one}"
    );

    // Bulk purge: {purged, snapshot_name}; the snapshot restores.
    let (s, pg) = a(
        "POST",
        "/v1/memories/purge",
        Some(json!({"memory_ids": [items[0]["memory_id"]], "reason": "cleanup"})),
    )
    .await;
    assert_eq!(s, 200, "{pg}");
    assert_eq!(pg["purged"], 1);
    assert!(pg["snapshot_name"].is_string(), "{pg}");
    let (s, pg) = a("POST", "/v1/memories/purge", Some(json!({"memory_types": ["profile"], "before": "2999-01-01T00:00:00", "reason": "cleanup"}))).await;
    assert_eq!((s, pg["purged"].as_u64()), (200, Some(1)), "{pg}");
    let (s, e) = a("POST", "/v1/memories/purge", Some(json!({}))).await;
    assert_eq!(s, 422, "{e}");

    // Delete with a reason, kept in the history.
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "DELETE",
            &format!("{M}/v1/memories/{db2}?reason=obsolete"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let (s, _) = d
        .call_as(
            Some(TOKEN_A),
            "DELETE",
            &format!("{M}/v1/memories/{db2}?reason=again"),
            None,
        )
        .await;
    assert_eq!(s, 404);
    let h = d
        .sql(&format!(
            "SELECT event, reason FROM history WHERE chunk_id = '{db2}'"
        ))
        .await;
    assert_eq!(h[0]["event"], "deleted", "{h:?}");
    assert!(
        h[0]["reason"].as_str().unwrap().starts_with("obsolete"),
        "{h:?}"
    );

    let (s, r) = admin("POST", "/v1/snapshots/before-cleanup/rollback", None).await;
    assert_eq!(s, 200, "{r}");
    let (s, _) = admin("DELETE", "/v1/snapshots/before-cleanup", None).await;
    assert_eq!(s, 200);

    // What loomem does not have: 501 naming it; what Memoria has not: 404.
    for (method, path, feature) in [
        ("POST", "/v1/branches", "branches"),
        ("GET", "/v1/branches", "branches"),
        ("POST", "/v1/branches/x/checkout", "branches"),
        ("GET", "/v1/snapshots/before-cleanup/diff?limit=50", "diff"),
        ("POST", "/v1/governance?force=false", "governance"),
        ("POST", "/v1/reflect?force=false", "reflect"),
        ("POST", "/v1/extract-entities", "entity"),
        ("GET", "/v1/entities", "entity"),
        ("GET", "/v1/feedback/by-tier", "tier"),
        ("POST", "/v1/retrieval-params/tune", "retrieval"),
        ("GET", "/v1/retrieval-params", "retrieval"),
        ("POST", "/v1/sessions/s1/summary", "session"),
        ("GET", "/v1/tasks/t1", "task"),
        ("POST", "/auth/keys", "key"),
        ("GET", "/admin/stats", "admin"),
    ] {
        let (s, e) = d
            .call_as(
                Some(TOKEN_A),
                method,
                &format!("{M}{path}"),
                Some(json!({})),
            )
            .await;
        assert_eq!(s, 501, "{method} {path}: {e}");
        assert!(
            e["detail"].as_str().unwrap().contains(feature),
            "{method} {path}: {e}"
        );
    }
    let (s, _) = a("GET", "/v1/teleport", None).await;
    assert_eq!(s, 404);

    // Health probes, open.
    let r = d
        .http
        .get(format!("{}{M}/health", d.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), r.text().await.unwrap()),
        (200, "ok".to_string())
    );
    let (s, h) = d
        .call_as(None, "GET", &format!("{M}/health/instance"), None)
        .await;
    assert_eq!((s, h["status"].as_str()), (200, Some("ok")));
    assert!(h["instance_id"].is_string());
    // Everything else needs a key.
    let (s, _) = d
        .call_as(None, "GET", &format!("{M}/v1/memories"), None)
        .await;
    assert_eq!(s, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memoria_client_sees_only_its_keys_memories() {
    let d = Daemon::start(Options::with_auth()).await;
    let (s, theirs) = memoria(
        &d,
        TOKEN_B,
        "POST",
        "/v1/memories",
        Some(json!({"content": "Bob's pelican is named Percy"})),
    )
    .await;
    assert_eq!(s, 201, "{theirs}");
    let (s, mine) = memoria(
        &d,
        TOKEN_A,
        "POST",
        "/v1/memories",
        Some(json!({"content": "Alice's parrot is named Kiwi"})),
    )
    .await;
    assert_eq!(s, 201, "{mine}");
    let (_, r) = memoria(
        &d,
        TOKEN_A,
        "POST",
        "/v1/memories/retrieve",
        Some(json!({"query": "pelican named Percy", "top_k": 10})),
    )
    .await;
    assert!(!r.to_string().contains("Percy"), "{r}");
    let (_, l) = memoria(&d, TOKEN_A, "GET", "/v1/memories", None).await;
    assert_eq!(l["items"].as_array().unwrap().len(), 1, "{l}");
    let id = theirs["memory_id"].as_str().unwrap();
    for (method, path, body) in [
        ("DELETE", format!("/v1/memories/{id}"), None),
        (
            "PUT",
            format!("/v1/memories/{id}/correct"),
            Some(json!({"new_content": "no"})),
        ),
        (
            "POST",
            format!("/v1/memories/{id}/feedback"),
            Some(json!({"signal": "wrong"})),
        ),
    ] {
        let (s, _) = d
            .call_as(Some(TOKEN_A), method, &format!("{M}{path}"), body)
            .await;
        assert_eq!(s, 404, "{method} {path}");
    }
    let (_, pg) = memoria(
        &d,
        TOKEN_A,
        "POST",
        "/v1/memories/purge",
        Some(json!({"memory_ids": [id]})),
    )
    .await;
    assert_eq!(pg["purged"], 0, "{pg}");
    let (_, still) = memoria(&d, TOKEN_B, "GET", "/v1/memories", None).await;
    assert_eq!(still["items"][0]["content"], "Bob's pelican is named Percy");
}
