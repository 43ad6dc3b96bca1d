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

const N: &str = "/compat/neuroloom/api/v1/memories";

/// A Neuroloom memory object: its documented fields and their types.
fn is_neuroloom_memory(v: &Value) -> bool {
    let num_or_null = |f: &str| v[f].is_number() || v[f].is_null();
    v["id"].is_string()
        && v["memory_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("mem-"))
        && v["workspace_id"].is_string()
        && v["title"].is_string()
        && v["narrative"].is_string()
        && v["memory_type"].is_string()
        && v["tags"].is_array()
        && v["concepts"].is_array()
        && v["source_files"].is_array()
        && v["importance_score"].is_number()
        && v["confidence_score"].is_number()
        && num_or_null("pagerank_score")
        && (v["community_label"].is_string() || v["community_label"].is_null())
        && v["access_count"].is_number()
        && v["retrieval_count"].is_number()
        && v["is_consolidated"].is_boolean()
        && v["created_at"].is_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neurolooms_documented_requests_answer_in_its_shapes() {
    let d = Daemon::start(Options::with_auth()).await;
    let n = |method: &'static str, path: String, body: Option<Value>| {
        let d = &d;
        async move {
            d.call_token(TOKEN_A, method, &format!("{N}{path}"), body)
                .await
        }
    };

    // Token, not Bearer.
    let (s, _) = d
        .call_as(Some(TOKEN_A), "GET", &format!("{N}/"), None)
        .await;
    assert_eq!(s, 401);
    let (s, _) = d
        .call_token("not-a-key", "GET", &format!("{N}/"), None)
        .await;
    assert_eq!(s, 401);

    // Store: the documented request, 201 with the documented object.
    let (s, m) = n("POST", "/store".into(), Some(json!({
        "title": "Prefer async SQLAlchemy for all DB calls",
        "narrative": "All database operations must use async/await. Sync calls block the event loop and cause latency spikes under load.",
        "memory_type": "pattern",
        "tags": ["sqlalchemy", "async", "backend"],
        "concepts": ["async", "database", "performance"],
        "source_files": ["api/neuroloom_api/database.py"],
        "importance_score": 0.9,
        "confidence_score": 0.95,
    }))).await;
    assert_eq!(s, 201, "{m}");
    assert!(is_neuroloom_memory(&m), "{m}");
    assert_eq!(
        (
            m["importance_score"].as_f64(),
            m["confidence_score"].as_f64().map(|c| (c * 100.0).round())
        ),
        (Some(0.9), Some(95.0))
    );
    assert_eq!(m["concepts"], json!(["async", "database", "performance"]));
    assert_eq!(m["source_files"], json!(["api/neuroloom_api/database.py"]));
    assert_eq!(
        (m["pagerank_score"].clone(), m["community_label"].clone()),
        (Value::Null, Value::Null)
    );
    let sql = m["memory_id"].as_str().unwrap().to_string();
    assert!(sql.len() == 20, "mem- and 16 characters: {sql}");
    let (s, pool) = n("POST", "/store".into(), Some(json!({"title": "Use connection pooling for all DB connections", "narrative": "Every database connection comes from the shared async pool; never open one per request.", "memory_type": "pattern", "tags": ["database"]}))).await;
    assert_eq!(s, 201, "{pool}");
    assert_eq!(pool["importance_score"], 0.5, "the default");
    let pool = pool["memory_id"].as_str().unwrap().to_string();
    let (_, decision) = n("POST", "/store".into(), Some(json!({"title": "Chose Postgres", "narrative": "We chose Postgres over MySQL for the billing service.", "memory_type": "decision", "importance_score": 0.2}))).await;
    let decision = decision["memory_id"].as_str().unwrap().to_string();
    let (s, e) = n(
        "POST",
        "/store".into(),
        Some(json!({"title": "x", "narrative": "y", "importance_score": 1.5})),
    )
    .await;
    assert_eq!(s, 422, "{e}");
    assert!(e["detail"].as_str().unwrap().contains("importance_score"));

    // List: an array, by importance, filtered, with limit and offset.
    let (s, l) = n(
        "GET",
        "/?memory_type=pattern&limit=10&ordering=-importance_score".into(),
        None,
    )
    .await;
    assert_eq!(s, 200, "{l}");
    let l = l.as_array().unwrap().clone();
    assert_eq!(l.len(), 2);
    assert!(l.iter().all(is_neuroloom_memory));
    assert_eq!(l[0]["memory_id"], sql.as_str(), "0.9 before 0.5");
    let (_, page2) = n("GET", "/?limit=1&offset=1".into(), None).await;
    assert_eq!(page2.as_array().unwrap().len(), 1);
    assert_eq!(page2[0]["memory_id"], pool.as_str(), "{page2}");
    let (s, e) = n("GET", "/?ordering=retrieval_count".into(), None).await;
    assert_eq!(s, 422, "{e}");
    let (s, _) = n("GET", "/?pruning_candidates=true".into(), None).await;
    assert_eq!(s, 501);

    // Relationships, related, explore and path.
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/relations",
            Some(json!({"from_id": sql, "to_id": pool, "relation": "references"})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let (s, g) = d
        .call_as(Some(TOKEN_A), "POST", "/v1/graph/analyze", Some(json!({})))
        .await;
    assert_eq!(s, 200, "{g}");
    let (s, detail) = n("GET", format!("/{sql}"), None).await;
    assert_eq!(s, 200, "{detail}");
    assert!(is_neuroloom_memory(&detail), "{detail}");
    assert!(
        detail["pagerank_score"].is_number(),
        "after the graph job: {detail}"
    );
    assert!(detail["community_label"].is_string(), "{detail}");
    let out = detail["outgoing_relationships"].as_array().unwrap();
    assert_eq!(out.len(), 1, "{detail}");
    assert_eq!(
        (
            out[0]["target_memory_id"].as_str(),
            out[0]["relationship_type"].as_str()
        ),
        (Some(pool.as_str()), Some("references"))
    );
    assert_eq!(detail["incoming_relationships"], json!([]));
    assert_eq!(
        (
            detail["feedback_positive_count"].as_u64(),
            detail["feedback_negative_count"].as_u64()
        ),
        (Some(0), Some(0))
    );
    let (_, back) = n("GET", format!("/{pool}"), None).await;
    assert_eq!(
        back["incoming_relationships"][0]["source_memory_id"],
        sql.as_str()
    );
    let (s, e) = n("GET", "/mem-notexist".into(), None).await;
    assert_eq!(
        (s, e["detail"].as_str()),
        (404, Some("Memory 'mem-notexist' not found."))
    );

    let (s, rel) = n(
        "GET",
        format!("/{sql}/related?limit=5&similarity_threshold=0.0"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{rel}");
    let rel = rel.as_array().unwrap();
    assert!(!rel.is_empty() && rel.len() <= 5);
    assert!(rel.iter().all(|m| is_neuroloom_memory(m)
        && m["memory_id"] != sql.as_str()
        && m["similarity"].is_number()));
    let (s, _) = n("GET", format!("/{sql}/related?limit=51"), None).await;
    assert_eq!(s, 422);

    let (s, x) = n("POST", "/explore".into(), Some(json!({"query": "async database calls", "max_nodes": 30, "relationship_types": ["references", "shares_entity"], "min_edge_confidence": 0.7, "seed_limit": 5}))).await;
    assert_eq!(s, 200, "{x}");
    assert!(
        x["seed_memories"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == sql.as_str()),
        "{x}"
    );
    let nodes = x["nodes"].as_array().unwrap();
    assert!(
        nodes.iter().any(|n| n["memory_id"] == pool.as_str()),
        "reached by the link: {x}"
    );
    assert!(nodes
        .iter()
        .all(|n| n["title"].is_string() && n["importance_score"].is_number()));
    assert!(
        x["edges"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["source_memory_id"] == sql.as_str()
                && e["target_memory_id"] == pool.as_str()
                && e["relationship_type"] == "references"),
        "{x}"
    );

    let (s, p) = n("POST", "/path".into(), Some(json!({"source_memory_id": sql, "target_memory_id": pool, "max_depth": 5, "relationship_types": ["references", "related_to", "similar_to"]}))).await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(p["path"], json!([sql, pool]));
    assert_eq!(
        (
            p["depth"].as_u64(),
            p["edges"][0]["relationship_type"].as_str()
        ),
        (Some(1), Some("references"))
    );
    let (_, p) = n(
        "POST",
        "/path".into(),
        Some(json!({"source_memory_id": sql, "target_memory_id": decision})),
    )
    .await;
    assert_eq!(p, json!({"path": [], "edges": [], "depth": 0}), "no path");

    // Update: scores in place; a new narrative is a new version.
    let (s, u) = n("PATCH", format!("/{pool}"), Some(json!({"importance_score": 0.95, "tags": ["sqlalchemy", "async", "critical"], "concepts": ["pooling"]}))).await;
    assert_eq!(s, 200, "{u}");
    assert_eq!(
        (u["memory_id"].as_str(), u["importance_score"].as_f64()),
        (Some(pool.as_str()), Some(0.95))
    );
    assert_eq!(
        (u["tags"][2].as_str(), u["concepts"].clone()),
        (Some("critical"), json!(["pooling"]))
    );
    assert_eq!(u["source_files"], json!([]), "kept");
    let (s, u) = n(
        "PATCH",
        format!("/{decision}"),
        Some(json!({"narrative": "We chose Postgres 16 over MySQL for billing."})),
    )
    .await;
    assert_eq!(s, 200, "{u}");
    assert_eq!(
        u["narrative"],
        "We chose Postgres 16 over MySQL for billing."
    );
    let (s, e) = n(
        "PATCH",
        format!("/{pool}"),
        Some(json!({"confidence_score": 2})),
    )
    .await;
    assert_eq!(s, 422, "{e}");

    // Access and retrieval events count.
    let (s, a) = n("POST", format!("/{sql}/access"), None).await;
    assert_eq!(s, 200, "{a}");
    let before = a["access_count"].as_i64().unwrap();
    let (_, a) = n("POST", format!("/{sql}/retrieval"), None).await;
    assert_eq!(a["retrieval_count"].as_i64().unwrap(), before + 1, "{a}");
    assert!(a["last_accessed_at"].is_string());

    // Delete: 204; batch delete: the count actually deleted; over 100: 422.
    let (s, _) = n("DELETE", format!("/{sql}"), None).await;
    assert_eq!(s, 204);
    let (s, _) = n("DELETE", format!("/{sql}"), None).await;
    assert_eq!(s, 404);
    let (s, b) = n(
        "POST",
        "/batch-delete".into(),
        Some(json!({"memory_ids": [pool, "mem-zz9988776655aabb", "mem-cc1122334455ddee"]})),
    )
    .await;
    assert_eq!((s, b.clone()), (200, json!({"deleted_count": 1})), "{b}");
    let many: Vec<String> = (0..101).map(|i| format!("mem-{i:016}")).collect();
    let (s, _) = n(
        "POST",
        "/batch-delete".into(),
        Some(json!({"memory_ids": many})),
    )
    .await;
    assert_eq!(s, 422);

    // Another key's workspace is not reachable.
    let (_, theirs) = d.call_token(TOKEN_B, "GET", &format!("{N}/"), None).await;
    assert_eq!(theirs, json!([]), "{theirs}");
}
