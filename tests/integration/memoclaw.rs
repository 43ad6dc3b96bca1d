//! MemoClaw's API served by loomem under `/compat/memoclaw`: every request
//! example of its reference (`shared/reference/memoclaw-api.md`) replayed,
//! the answers checked for the documented fields and what they mean, and a
//! MemoClaw client kept to its key's namespaces.

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, TOKEN_A, TOKEN_B};

const C: &str = "/compat/memoclaw";

async fn claw(
    d: &Daemon,
    token: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    d.call_as(Some(token), method, &format!("{C}{path}"), body)
        .await
}

/// A MemoClaw memory object: the fields its clients read, with their types.
fn is_memory(v: &Value) -> bool {
    v["id"].is_string()
        && v["content"].is_string()
        && v["metadata"]["tags"].is_array()
        && v["importance"].is_f64()
        && v["memory_type"].is_string()
        && v["namespace"].is_string()
        && v["pinned"].is_boolean()
        && v["created_at"].is_string()
        && v["updated_at"].is_string()
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|m| m["id"].as_str().expect("an id").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memoclaws_documented_requests_answer_in_its_shapes() {
    let d = Daemon::start(Options::with_auth()).await;
    let a = |method: &'static str, path: String, body: Option<Value>| {
        let d = &d;
        async move { claw(d, TOKEN_A, method, &path, body).await }
    };

    // Store (the reference's request; its namespace is the key's second stream).
    let (s, st) = a(
        "POST",
        "/v1/store".into(),
        Some(json!({
            "content": "User prefers dark mode and minimal notifications",
            "metadata": {"tags": ["preferences", "ui"]},
            "importance": 0.8,
            "namespace": "a2",
            "memory_type": "preference",
            "expires_at": "2036-06-01T00:00:00Z",
            "immutable": false
        })),
    )
    .await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(st["stored"], true);
    assert!(st["tokens_used"].as_u64().unwrap() > 0, "{st}");
    let dark = st["id"].as_str().unwrap().to_string();
    let (_, m) = a("GET", format!("/v1/memories/{dark}"), None).await;
    assert!(is_memory(&m), "{m}");
    assert_eq!(
        m["importance"], 0.8,
        "the importance the client set reads back: {m}"
    );
    assert_eq!(m["namespace"], "a2");
    assert_eq!(m["memory_type"], "preference");
    assert_eq!(m["metadata"]["tags"], json!(["preferences", "ui"]));
    assert!(
        m["metadata"].get("memoclaw").is_none(),
        "loomem's bookkeeping stays hidden: {m}"
    );
    assert!(
        m["expires_at"].as_str().unwrap().starts_with("2036-06-01"),
        "{m}"
    );
    assert!(m["relations"].is_array(), "{m}");

    // Bad input: MemoClaw's limits, each a 422 naming the field.
    for (body, field) in [
        (json!({"content": "x", "importance": 1.5}), "importance"),
        (
            json!({"content": "x", "memory_type": "fact"}),
            "memory_type",
        ),
        (
            json!({"content": "x", "expires_at": "2001-01-01T00:00:00Z"}),
            "expires_at",
        ),
        (json!({"content": "x".repeat(8193)}), "content"),
        (
            json!({"content": "x", "metadata": {"tags": (0..11).map(|i| format!("t{i}")).collect::<Vec<_>>()}}),
            "metadata.tags",
        ),
    ] {
        let (s, e) = a("POST", "/v1/store".into(), Some(body)).await;
        assert_eq!(s, 422, "{e}");
        assert!(e["detail"].as_str().unwrap().contains(field), "{e}");
    }

    // Store batch: ids in order, a bad item refuses the whole batch.
    let (s, b) = a(
        "POST",
        "/v1/store/batch".into(),
        Some(json!({"memories": [
            {"content": "User uses VSCode with vim bindings", "metadata": {"tags": ["tools"]}},
            {"content": "User prefers TypeScript over JavaScript", "importance": 0.9}
        ]})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        (b["stored"].clone(), b["count"].clone()),
        (json!(true), json!(2)),
        "{b}"
    );
    let batch: Vec<String> = b["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let (s, e) = a(
        "POST",
        "/v1/store/batch".into(),
        Some(json!({"memories": [
            {"content": "fine"}, {"content": "bad", "importance": -1}
        ]})),
    )
    .await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["detail"]
            .as_str()
            .unwrap()
            .contains("memories[1].importance"),
        "{e}"
    );
    let (_, c) = a("GET", "/v1/memories/count".into(), None).await;
    assert_eq!(
        c["count"], 3,
        "nothing of the refused batch was stored: {c}"
    );

    // Recall: semantic, filtered by tag and type, with a similarity.
    let (s, r) = a(
        "POST",
        "/v1/recall".into(),
        Some(json!({
            "query": "what are the user's editor preferences?",
            "limit": 5,
            "min_similarity": 0.7,
            "namespace": "a2",
            "filters": {"tags": ["preferences"], "after": "2025-01-01", "memory_type": "preference"}
        })),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert!(r["query_tokens"].as_u64().unwrap() > 0);
    for m in r["memories"].as_array().unwrap() {
        assert!(
            is_memory(m) && m["similarity"].as_f64().unwrap() >= 0.7,
            "{r}"
        );
    }
    let (_, r) = a(
        "POST",
        "/v1/recall".into(),
        Some(json!({
            "query": "vim bindings in VSCode", "min_similarity": 0.05, "include_relations": true
        })),
    )
    .await;
    let found = ids(&r["memories"]);
    assert_eq!(found.first(), Some(&batch[0]), "{r}");
    assert!(r["memories"][0]["relations"].is_array(), "{r}");
    let (_, r) = a("POST", "/v1/recall".into(), Some(json!({
        "query": "vim bindings in VSCode", "min_similarity": 0.05, "filters": {"tags": ["preferences"]}
    }))).await;
    assert!(
        !ids(&r["memories"]).contains(&batch[0]),
        "the tag filter holds: {r}"
    );

    // Full-text search.
    let (s, f) = a(
        "POST",
        "/v1/search".into(),
        Some(json!({
            "query": "TypeScript", "limit": 10, "namespace": "default"
        })),
    )
    .await;
    assert_eq!(s, 200, "{f}");
    assert_eq!(ids(&f["memories"]), vec![batch[1].clone()], "{f}");
    assert_eq!(f["total"], 1);
    let (s, f) = a("POST", "/v1/search".into(), Some(json!({
        "query": "PostgreSQL migration", "limit": 10, "namespace": "a2", "memory_type": "decision", "tags": ["architecture"]
    }))).await;
    assert_eq!((s, f["total"].clone()), (200, json!(0)), "{f}");

    // List with offset paging, in MemoClaw's envelope.
    let (s, l) = a("GET", "/v1/memories?limit=2&offset=0".into(), None).await;
    assert_eq!(s, 200, "{l}");
    assert_eq!(
        (l["total"].clone(), l["limit"].clone(), l["offset"].clone()),
        (json!(3), json!(2), json!(0))
    );
    assert!(
        l["memories"].as_array().unwrap().iter().all(is_memory),
        "{l}"
    );
    let (_, l2) = a("GET", "/v1/memories?limit=2&offset=2".into(), None).await;
    let mut every = ids(&l["memories"]);
    every.extend(ids(&l2["memories"]));
    every.sort();
    let mut expected = vec![dark.clone(), batch[0].clone(), batch[1].clone()];
    expected.sort();
    assert_eq!(every, expected);
    let (_, l) = a(
        "GET",
        "/v1/memories?limit=20&offset=0&namespace=a2".into(),
        None,
    )
    .await;
    assert_eq!(ids(&l["memories"]), vec![dark.clone()], "{l}");
    let (_, c) = a("GET", "/v1/memories/count?namespace=default".into(), None).await;
    assert_eq!(c["count"], 2, "{c}");

    // Update: fields in place; new text re-embedded (a new version, a new id).
    let (s, u) = a(
        "PATCH",
        format!("/v1/memories/{}", batch[1]),
        Some(json!({
            "importance": 0.95, "expires_at": "2036-06-01T00:00:00Z"
        })),
    )
    .await;
    assert_eq!(s, 200, "{u}");
    assert_eq!(
        (u["id"].as_str(), u["importance"].clone()),
        (Some(batch[1].as_str()), json!(0.95)),
        "{u}"
    );
    assert!(u["updated_at"].is_string() && u["expires_at"].as_str().unwrap().starts_with("2036"));
    let (s, u) = a(
        "PATCH",
        format!("/v1/memories/{}", batch[1]),
        Some(json!({
            "content": "User prefers 2-space indentation (not tabs)"
        })),
    )
    .await;
    assert_eq!(s, 200, "{u}");
    assert_eq!(u["content"], "User prefers 2-space indentation (not tabs)");
    assert_eq!(
        u["importance"], 0.95,
        "the new version keeps the fields: {u}"
    );
    let indent = u["id"].as_str().unwrap().to_string();
    assert_ne!(indent, batch[1]);
    let (_, f) = a(
        "POST",
        "/v1/search".into(),
        Some(json!({"query": "indentation tabs"})),
    )
    .await;
    assert_eq!(
        ids(&f["memories"]),
        vec![indent.clone()],
        "the new text is indexed: {f}"
    );
    let (_, h) = a("GET", format!("/v1/memories/{indent}/history"), None).await;
    let events = h["history"].as_array().unwrap();
    assert!(
        events.iter().all(|e| e["id"].is_string()
            && e["memory_id"].is_string()
            && e["changes"].is_object()
            && e["created_at"].is_string()),
        "{h}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["changes"]["content"] == "User prefers 2-space indentation (not tabs)"),
        "{h}"
    );
    assert!(
        events.iter().any(|e| e["memory_id"] == json!(batch[1])
            && e["changes"]["reason"]
                .as_str()
                .unwrap()
                .contains("importance")),
        "{h}"
    );
    for (body, status) in [
        (json!({}), 422),
        (json!({"namespace": "a2"}), 501),
        (json!({"importance": 2}), 422),
    ] {
        let (s, e) = a(
            "PATCH",
            format!("/v1/memories/{indent}"),
            Some(body.clone()),
        )
        .await;
        assert_eq!(s, status, "{body} → {e}");
    }

    // Batch update, and immutability.
    let (s, bu) = a("PATCH", "/v1/memories/batch".into(), Some(json!({"updates": [
        {"id": batch[0], "importance": 0.9, "pinned": true},
        {"id": indent, "content": "User prefers 4-space indentation", "importance": 0.8, "immutable": true}
    ]}))).await;
    assert_eq!(s, 200, "{bu}");
    assert_eq!(bu["updated"], 2, "{bu}");
    assert_eq!(bu["memories"][0]["pinned"], true);
    let locked = bu["memories"][1]["id"].as_str().unwrap().to_string();
    assert_eq!(bu["memories"][1]["immutable"], true, "{bu}");
    let (s, e) = a(
        "PATCH",
        format!("/v1/memories/{locked}"),
        Some(json!({"importance": 0.1})),
    )
    .await;
    assert_eq!(s, 409, "{e}");
    let (s, e) = a("DELETE", format!("/v1/memories/{locked}"), None).await;
    assert_eq!(s, 409, "{e}");

    // Relations: create, list, the graph, delete.
    let (s, rel) = a(
        "POST",
        format!("/v1/memories/{}/relations", batch[0]),
        Some(json!({
            "target_id": locked, "relation_type": "related_to", "metadata": {}
        })),
    )
    .await;
    assert_eq!(s, 201, "{rel}");
    assert_eq!(
        (
            rel["source_id"].as_str(),
            rel["target_id"].as_str(),
            rel["relation_type"].as_str()
        ),
        (
            Some(batch[0].as_str()),
            Some(locked.as_str()),
            Some("related_to")
        )
    );
    let (_, billing) = a(
        "POST",
        "/v1/store".into(),
        Some(json!({"content": "User works on the billing project", "memory_type": "project"})),
    )
    .await;
    let billing = billing["id"].as_str().unwrap().to_string();
    let (_, rel2) = a(
        "POST",
        format!("/v1/memories/{locked}/relations"),
        Some(json!({
            "target_id": billing, "relation_type": "supports", "metadata": {"why": "same user"}
        })),
    )
    .await;
    assert_eq!(rel2["metadata"]["why"], "same user", "{rel2}");
    let (_, listed) = a("GET", format!("/v1/memories/{locked}/relations"), None).await;
    assert_eq!(listed["relations"].as_array().unwrap().len(), 2, "{listed}");
    let (s, e) = a(
        "POST",
        format!("/v1/memories/{}/relations", batch[0]),
        Some(json!({"target_id": locked, "relation_type": "no spaces allowed"})),
    )
    .await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["detail"].as_str().unwrap().contains("relation_type"),
        "{e}"
    );
    let (s, g) = a(
        "GET",
        format!("/v1/memories/{}/graph?depth=2&limit=50", batch[0]),
        None,
    )
    .await;
    assert_eq!(s, 200, "{g}");
    let reached: Vec<(String, u64)> = g["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["id"].as_str().unwrap().to_string(),
                n["depth"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        reached,
        vec![
            (batch[0].clone(), 0),
            (locked.clone(), 1),
            (billing.clone(), 2)
        ],
        "{g}"
    );
    assert_eq!(g["edges"].as_array().unwrap().len(), 2, "{g}");
    let (_, g) = a(
        "GET",
        format!("/v1/memories/{}/graph?depth=1", batch[0]),
        None,
    )
    .await;
    assert_eq!(g["nodes"].as_array().unwrap().len(), 2, "{g}");
    let (_, g) = a(
        "GET",
        format!("/v1/memories/{}/graph?relation_types=supports", batch[0]),
        None,
    )
    .await;
    assert_eq!(
        g["nodes"].as_array().unwrap().len(),
        1,
        "only supports links are walked: {g}"
    );
    let (s, _) = a(
        "GET",
        format!("/v1/memories/{}/graph?depth=6", batch[0]),
        None,
    )
    .await;
    assert_eq!(s, 422);
    let rid = rel["id"].as_str().unwrap();
    let (s, _) = a(
        "DELETE",
        format!("/v1/memories/{billing}/relations/{rid}"),
        None,
    )
    .await;
    assert_eq!(s, 404, "a relation is deleted through a memory it links");
    let (s, del) = a(
        "DELETE",
        format!("/v1/memories/{}/relations/{rid}", batch[0]),
        None,
    )
    .await;
    assert_eq!((s, del["deleted"].clone()), (200, json!(true)), "{del}");

    // Context: text within the budget, structured with metadata.
    let (s, cx) = a("POST", "/v1/context".into(), Some(json!({
        "query": "user preferences and project context", "namespace": "default",
        "max_memories": 5, "max_tokens": 2000, "format": "text", "include_metadata": false, "summarize": false
    }))).await;
    assert_eq!(s, 200, "{cx}");
    let text = cx["context"].as_str().unwrap();
    assert!(
        cx["memories_used"].as_u64().unwrap() >= 1 && text.starts_with("- "),
        "{cx}"
    );
    assert!(cx["tokens"].as_u64().unwrap() <= 2000);
    let (_, cx) = a(
        "POST",
        "/v1/context".into(),
        Some(json!({
            "query": "indentation", "format": "structured", "include_metadata": true
        })),
    )
    .await;
    assert!(
        cx["context"][0]["memory_type"].is_string() && cx["context"][0]["importance"].is_f64(),
        "{cx}"
    );
    let (s, _) = a(
        "POST",
        "/v1/context".into(),
        Some(json!({"query": "x", "max_tokens": 50})),
    )
    .await;
    assert_eq!(s, 422);

    // Namespaces, tags, core memories, stats, suggested.
    let (_, ns) = a("GET", "/v1/namespaces".into(), None).await;
    let mut names: Vec<(String, u64)> = ns["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                n["count"].as_u64().unwrap(),
            )
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![("a2".to_string(), 1), ("default".to_string(), 3)],
        "{ns}"
    );
    assert!(ns["namespaces"][0]["last_memory_at"].is_string());
    let (_, t) = a("GET", "/v1/tags?namespace=a2".into(), None).await;
    let mut tags: Vec<&str> = t["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    tags.sort();
    assert_eq!(
        (tags, t["total"].clone()),
        (vec!["preferences", "ui"], json!(2)),
        "{t}"
    );
    let (_, core) = a("GET", "/v1/core-memories?limit=10".into(), None).await;
    assert_eq!(
        core["memories"][0]["id"],
        json!(batch[0]),
        "pinned first: {core}"
    );
    assert_eq!(core["total"], 4);
    let (_, stats) = a("GET", "/v1/stats".into(), None).await;
    assert_eq!(stats["total_memories"], 4, "{stats}");
    assert_eq!(stats["pinned_count"], 1);
    assert_eq!(stats["by_namespace"], json!({"a2": 1, "default": 3}));
    assert!(stats["avg_importance"].as_f64().unwrap() > 0.5, "{stats}");
    let (s, sg) = a(
        "GET",
        "/v1/suggested?limit=5&namespace=default&category=fresh".into(),
        None,
    )
    .await;
    assert_eq!(s, 200, "{sg}");
    assert!(
        sg["categories"]["stale"].is_u64() && sg["categories"]["fresh"].is_u64(),
        "{sg}"
    );
    assert!(
        sg["suggested"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["category"] == "fresh"),
        "{sg}"
    );
    let (s, _) = a("GET", "/v1/suggested?category=ancient".into(), None).await;
    assert_eq!(s, 422);

    // Export in each format, then import the JSON into another namespace's
    // key: ids and times kept; importing it again skips every memory.
    let (s, ex) = a(
        "GET",
        "/v1/export?format=json&namespace=default".into(),
        None,
    )
    .await;
    assert_eq!(s, 200, "{ex}");
    assert_eq!(ex.as_array().unwrap().len(), 3, "{ex}");
    let (s, csv) = a("GET", "/v1/export?format=csv".into(), None).await;
    assert_eq!(s, 200);
    let csv = csv.as_str().unwrap();
    assert!(
        csv.starts_with("id,content,memory_type,namespace,importance,tags"),
        "{csv}"
    );
    assert_eq!(csv.lines().count(), 5, "{csv}");
    let (_, md) = a(
        "GET",
        "/v1/export?format=markdown&namespace=a2".into(),
        None,
    )
    .await;
    assert!(
        md.as_str().unwrap().contains("User prefers dark mode"),
        "{md}"
    );
    let (s, _) = a("GET", "/v1/export?format=xml".into(), None).await;
    assert_eq!(s, 422);
    let (s, im) = claw(&d, TOKEN_B, "POST", "/v1/import", Some(ex.clone())).await;
    assert_eq!(s, 200, "{im}");
    assert_eq!(im["imported"], 3, "{im}");
    let (_, theirs) = claw(&d, TOKEN_B, "GET", "/v1/memories", None).await;
    let texts = |list: &Value| {
        let mut t: Vec<String> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect();
        t.sort();
        t
    };
    assert_eq!(texts(&theirs["memories"]), texts(&ex), "{theirs}");
    assert!(
        ids(&theirs["memories"])
            .iter()
            .all(|id| !ids(&ex).contains(id)),
        "ids another stream holds are not taken over: {theirs}"
    );
    let exported = ex.clone();
    let created: Vec<&Value> = ex
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["created_at"])
        .collect();
    assert!(
        theirs["memories"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| created.contains(&&m["created_at"])),
        "{theirs}"
    );
    let (_, again) = claw(&d, TOKEN_B, "POST", "/v1/import", Some(ex)).await;
    assert_eq!(
        (again["imported"].clone(), again["skipped"].clone()),
        (json!(0), json!(3)),
        "{again}"
    );
    let (s, e) = claw(
        &d,
        TOKEN_B,
        "POST",
        "/v1/import",
        Some(json!({"memories": []})),
    )
    .await;
    assert_eq!(s, 422, "{e}");

    // Migrate markdown files (the reference's request), then again: every
    // section deduplicated.
    let files = json!({"files": [
        {"filename": "2026-01-15.md", "content": "## User preferences\n\nPrefers dark mode and vim keybindings.\n\n## Project update\n\nDeployed v2.1 to production."},
        {"filename": "decisions.md", "content": "## Architecture decision\n\nDecided to use Postgres with pgvector instead of Pinecone."}
    ]});
    let (s, mg) = a("POST", "/v1/migrate".into(), Some(files.clone())).await;
    assert_eq!(s, 201, "{mg}");
    assert_eq!(
        mg,
        json!({"files_processed": 2, "memories_created": 3, "memories_deduplicated": 0})
    );
    let (_, f) = a(
        "POST",
        "/v1/search".into(),
        Some(json!({"query": "Postgres pgvector"})),
    )
    .await;
    let decision = &f["memories"][0];
    assert_eq!(
        (
            decision["memory_type"].as_str(),
            decision["importance"].as_f64()
        ),
        (Some("decision"), Some(0.9)),
        "{f}"
    );
    let tags = &decision["metadata"]["tags"];
    assert!(
        tags.as_array().unwrap().contains(&json!("migrated"))
            && tags
                .as_array()
                .unwrap()
                .contains(&json!("architecture-decision")),
        "{f}"
    );
    assert!(
        decision["metadata"]["content_hash"].as_str().unwrap().len() == 64,
        "{f}"
    );
    let (_, f) = a(
        "POST",
        "/v1/search".into(),
        Some(json!({"query": "Deployed production"})),
    )
    .await;
    assert!(
        f["memories"][0]["created_at"]
            .as_str()
            .unwrap()
            .starts_with("2026-01-15"),
        "the file's date: {f}"
    );
    assert!(
        f["memories"][0]["metadata"]["tags"]
            .as_array()
            .unwrap()
            .contains(&json!("2026-01-15")),
        "{f}"
    );
    let (_, mg) = a("POST", "/v1/migrate".into(), Some(files)).await;
    assert_eq!(
        (
            mg["memories_created"].clone(),
            mg["memories_deduplicated"].clone()
        ),
        (json!(0), json!(3)),
        "{mg}"
    );

    // Ingest and extract: facts from a conversation, auto-related.
    let (s, ing) = a("POST", "/v1/ingest".into(), Some(json!({
        "messages": [
            {"role": "user", "content": "I switched from Slack to Discord last week."},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "Also, the dashboard deadline is April 15th."}
        ],
        "namespace": "default", "session_id": "session-123", "agent_id": "agent-1", "auto_relate": true
    }))).await;
    assert_eq!(s, 200, "{ing}");
    let stored = ing["memory_ids"].as_array().unwrap().len();
    assert!(stored >= 2 && ing["facts_stored"] == json!(stored), "{ing}");
    assert_eq!(ing["relations_created"], json!(stored - 1), "{ing}");
    assert!(ing["facts_extracted"].as_u64().unwrap() >= ing["facts_stored"].as_u64().unwrap());
    let first = ing["memory_ids"][0].as_str().unwrap();
    let (_, one) = a("GET", format!("/v1/memories/{first}"), None).await;
    assert_eq!(
        (one["session_id"].as_str(), one["agent_id"].as_str()),
        (Some("session-123"), Some("agent-1")),
        "{one}"
    );
    assert_eq!(one["relations"].as_array().unwrap().len(), 1, "{one}");
    let (s, ex) = a(
        "POST",
        "/v1/memories/extract".into(),
        Some(json!({
            "messages": [
                {"role": "user", "content": "I switched from Slack to Discord last week."},
                {"role": "assistant", "content": "Got it!"}
            ],
            "namespace": "default", "session_id": "session-123", "agent_id": "agent-1"
        })),
    )
    .await;
    assert_eq!(s, 200, "{ex}");
    assert!(
        ex["facts_deduplicated"].as_u64().unwrap() >= 1,
        "the same facts again: {ex}"
    );
    let (s, _) = a(
        "POST",
        "/v1/ingest".into(),
        Some(json!({"namespace": "default"})),
    )
    .await;
    assert_eq!(s, 422);

    // Consolidate: a dry run first, then the merge.
    for _ in 0..2 {
        a(
            "POST",
            "/v1/store".into(),
            Some(json!({"content": "The deploy window is Friday at 4pm UTC"})),
        )
        .await;
    }
    a(
        "POST",
        "/v1/store".into(),
        Some(json!({"content": "The deploy window is on Friday at 4pm UTC"})),
    )
    .await;
    let (s, dry) = a(
        "POST",
        "/v1/memories/consolidate".into(),
        Some(json!({
            "namespace": "default", "min_similarity": 0.85, "mode": "rule", "dry_run": true
        })),
    )
    .await;
    assert_eq!(s, 200, "{dry}");
    assert!(
        dry["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["merged_into"].is_null()),
        "{dry}"
    );
    assert_eq!(dry["memories_created"], 0);
    let (s, e) = a(
        "POST",
        "/v1/memories/consolidate".into(),
        Some(json!({"mode": "llm"})),
    )
    .await;
    assert_eq!(s, 409, "no LLM is configured: {e}");

    // Delete one, then the rest in bulk (immutable memories stay).
    let (s, del) = a("DELETE", format!("/v1/memories/{dark}"), None).await;
    assert_eq!(del, json!({"deleted": true, "id": dark}), "{s}");
    let (_, all) = a("GET", "/v1/memories?limit=100".into(), None).await;
    let (s, bd) = a(
        "POST",
        "/v1/memories/bulk-delete".into(),
        Some(json!({"ids": ids(&all["memories"])})),
    )
    .await;
    assert_eq!(s, 200, "{bd}");
    assert_eq!(
        bd["deleted"],
        json!(all["total"].as_u64().unwrap() - 1),
        "{bd}"
    );
    let (_, left) = a("GET", "/v1/memories".into(), None).await;
    assert_eq!(ids(&left["memories"]), vec![locked.clone()], "{left}");

    // The export imported back: ids and times kept; the memory still there
    // (immutable) skipped.
    let (_, back) = a("POST", "/v1/import".into(), Some(exported.clone())).await;
    assert_eq!(
        (back["imported"].clone(), back["skipped"].clone()),
        (json!(2), json!(1)),
        "{back}"
    );
    let (_, left) = a("GET", "/v1/memories?namespace=default".into(), None).await;
    let mut now = ids(&left["memories"]);
    now.sort();
    let mut before = ids(&exported);
    before.sort();
    assert_eq!(now, before, "{left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memoclaw_client_sees_only_its_keys_namespaces() {
    let d = Daemon::start(Options::with_auth()).await;
    let (_, theirs) = claw(&d, TOKEN_B, "POST", "/v1/store", Some(json!({"content": "Bob's pelican is named Percy", "metadata": {"tags": ["secret-tag"]}}))).await;
    let (_, mine) = claw(
        &d,
        TOKEN_A,
        "POST",
        "/v1/store",
        Some(json!({"content": "Alice's parrot is named Kiwi"})),
    )
    .await;
    let theirs = theirs["id"].as_str().unwrap().to_string();
    assert!(mine["id"].is_string(), "{mine}");

    // A namespace the key does not hold: refused, on reads and writes.
    for (method, path, body) in [
        (
            "POST",
            "/v1/store",
            Some(json!({"content": "x", "namespace": "b"})),
        ),
        (
            "POST",
            "/v1/recall",
            Some(json!({"query": "pelican", "namespace": "b"})),
        ),
        ("GET", "/v1/memories?namespace=b", None),
        ("GET", "/v1/export?namespace=b", None),
        (
            "POST",
            "/v1/memories/consolidate",
            Some(json!({"namespace": "b"})),
        ),
    ] {
        let (s, e) = claw(&d, TOKEN_A, method, path, body).await;
        assert_eq!(s, 403, "{method} {path}: {e}");
    }
    // Without a namespace, reads cover the key's own streams only.
    for (method, path, body) in [
        (
            "POST",
            "/v1/recall",
            Some(json!({"query": "pelican named Percy", "min_similarity": 0.0})),
        ),
        (
            "POST",
            "/v1/search",
            Some(json!({"query": "pelican Percy"})),
        ),
        (
            "POST",
            "/v1/context",
            Some(json!({"query": "pelican Percy"})),
        ),
        ("GET", "/v1/memories", None),
        ("GET", "/v1/export?format=csv", None),
        ("GET", "/v1/namespaces", None),
        ("GET", "/v1/tags", None),
        ("GET", "/v1/stats", None),
        ("GET", "/v1/core-memories", None),
        ("GET", "/v1/suggested", None),
    ] {
        let (s, body) = claw(&d, TOKEN_A, method, path, body).await;
        assert_eq!(s, 200, "{path}: {body}");
        let text = body.to_string();
        assert!(
            !text.contains("Percy") && !text.contains("secret-tag") && !text.contains("\"b\""),
            "{path} leaks: {text}"
        );
    }
    // Their memory by id: not found, whatever the operation.
    for (method, path, body) in [
        ("GET", format!("/v1/memories/{theirs}"), None),
        (
            "PATCH",
            format!("/v1/memories/{theirs}"),
            Some(json!({"importance": 0.1})),
        ),
        ("DELETE", format!("/v1/memories/{theirs}"), None),
        ("GET", format!("/v1/memories/{theirs}/history"), None),
        ("GET", format!("/v1/memories/{theirs}/graph"), None),
        ("GET", format!("/v1/memories/{theirs}/relations"), None),
        (
            "POST",
            format!("/v1/memories/{theirs}/relations"),
            Some(json!({"target_id": mine["id"]})),
        ),
    ] {
        let (s, e) = claw(&d, TOKEN_A, method, &path, body).await;
        assert_eq!(s, 404, "{method} {path}: {e}");
    }
    let (_, bd) = claw(
        &d,
        TOKEN_A,
        "POST",
        "/v1/memories/bulk-delete",
        Some(json!({"ids": [theirs]})),
    )
    .await;
    assert_eq!(bd["deleted"], 0, "{bd}");
    let (_, im) = claw(
        &d,
        TOKEN_A,
        "POST",
        "/v1/import",
        Some(json!([{"id": theirs, "content": "overwritten"}])),
    )
    .await;
    assert_eq!(im["imported"], 1, "{im}");
    let (_, mine) = claw(&d, TOKEN_A, "GET", "/v1/memories?limit=100", None).await;
    let copy = mine["memories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["content"] == "overwritten")
        .expect("imported under a new id");
    assert_ne!(
        copy["id"],
        json!(theirs),
        "another stream's id is not taken over"
    );
    let (_, still) = claw(&d, TOKEN_B, "GET", &format!("/v1/memories/{theirs}"), None).await;
    assert_eq!(still["content"], "Bob's pelican is named Percy", "{still}");
}
