//! Every core endpoint through the real HTTP server.

use serde_json::json;

use crate::fixture::{Daemon, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_then_search_finds_the_memory_with_trace() {
    let d = Daemon::start(Options::default()).await;
    let id = d.store("User prefers dark mode in all tools", "100").await;
    d.store("The quarterly invoice was paid on Tuesday", "100")
        .await;
    d.store("Alice is allergic to peanuts", "100").await;

    let (status, resp) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "dark mode", "stream": "100", "trace": true})),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    let results = resp["results"].as_array().unwrap();
    assert_eq!(results[0]["chunk_id"], id.as_str());
    assert_eq!(results[0]["content"], "User prefers dark mode in all tools");
    let score = results[0]["score_final"].as_f64().unwrap();
    assert!(score > 0.0 && score <= 1.0, "{score}");
    let info = &results[0]["trace_info"];
    assert_eq!(info["level"], "L0");
    assert_eq!(info["is_latest"], true);
    assert_eq!(info["version"], 1);
    // First-person preference: typed and weighted as the reference says.
    assert_eq!(info["memory_type"], "preference");
    assert_eq!(info["importance"], 2.0);
    assert!(info["created_at"].as_i64().unwrap() > 1_700_000_000);
    assert_eq!(info["legs"]["bm25"]["rank"], 1, "{info}");
    let meta = &resp["trace_metadata"];
    assert!(meta["total_results_before_topk"].as_u64().unwrap() >= 1);
    assert!(meta["search_latency_us"].as_u64().unwrap() > 0);
    assert_eq!(meta["query_complexity"], "simple");
    // Where the time went: each leg that ran, the read of the candidates; the
    // embedding is part of the vector leg, and no phase outlasts the search.
    let t = &meta["timings_us"];
    let us = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("{k} in {t}"));
    for phase in ["bm25", "vector", "graph", "fetch", "rank"] {
        assert!(
            us(phase) <= meta["search_latency_us"].as_u64().unwrap(),
            "{t}"
        );
    }
    assert!(us("bm25") > 0 && us("vector") > 0 && us("fetch") > 0, "{t}");
    assert!(us("embed") <= us("vector"), "{t}");
    assert_eq!(us("as_of"), 0, "{t}");

    // Without trace, no trace fields.
    let (_, plain) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "dark mode", "stream": "100"})),
        )
        .await;
    assert!(plain["results"][0].get("trace_info").is_none());
    assert!(plain.get("trace_metadata").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_stream_and_top_k() {
    let d = Daemon::start(Options::default()).await;
    for i in 0..12 {
        let (s, _) = d
            .call(
                "POST",
                "/v1/store",
                Some(json!({"content": format!("note number {i} about gardening")})),
            )
            .await;
        assert_eq!(s, 200);
    }
    let ids = d.search_ids(json!({"query": "gardening"})).await;
    assert_eq!(ids.len(), 10, "default top_k is 10");
    let ids = d
        .search_ids(json!({"query": "gardening", "top_k": 3}))
        .await;
    assert_eq!(ids.len(), 3);
    let ids = d
        .search_ids(json!({"query": "gardening", "stream": "__user_default__", "top_k": 50}))
        .await;
    assert_eq!(ids.len(), 12);
    let ids = d
        .search_ids(json!({"query": "gardening", "stream": "elsewhere"}))
        .await;
    assert!(ids.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_isolated_in_search() {
    let d = Daemon::start(Options::default()).await;
    let a = d.store("Project Falcon launches in March", "A").await;
    let b = d.store("Project Falcon launches in May", "B").await;
    assert_eq!(
        d.search_ids(json!({"query": "Project Falcon launch", "stream": "A"}))
            .await,
        vec![a.clone()]
    );
    assert_eq!(
        d.search_ids(json!({"query": "Project Falcon launch", "stream": "B"}))
            .await,
        vec![b.clone()]
    );
    let mut both = d
        .search_ids(json!({"query": "Project Falcon launch", "streams": ["A", "B"]}))
        .await;
    both.sort();
    let mut want = vec![a, b];
    want.sort();
    assert_eq!(both, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_labels_resolve_to_streams() {
    let d = Daemon::start(Options::default()).await;
    let id = d.store("Weekly sync is on Thursdays", "personal").await;
    assert_eq!(
        d.search_ids(json!({"query": "weekly sync", "stream": "100"}))
            .await,
        vec![id]
    );
    let (s, ns) = d.call("GET", "/v1/namespaces", None).await;
    assert_eq!(s, 200);
    assert_eq!(ns["namespaces"]["personal"], "100");
    assert_eq!(ns["namespaces"]["work"], "110");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_sanitizes_and_redacts_before_storing() {
    let d = Daemon::start(Options::default()).await;
    let id = d
        .store(
            "<p>Contact <b>jan@example.com</b> or +48 601 234 567; card 4111 1111 1111 1111</p>",
            "s",
        )
        .await;
    let (_, resp) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "contact card", "stream": "s"})),
        )
        .await;
    assert_eq!(resp["results"][0]["chunk_id"], id.as_str());
    assert_eq!(
        resp["results"][0]["content"],
        "Contact [EMAIL] or [PHONE]; card [CARD]"
    );

    let (_, status) = d.call("GET", "/v1/status", None).await;
    let stages = status["pipelines"]["store"].as_array().unwrap();
    let names: Vec<&str> = stages
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec![
            "sanitize",
            "redact_pii",
            "extract_entities",
            "embed",
            "dedupe",
            "score_surprise",
            "detect_contradictions",
            "write"
        ]
    );
    assert_eq!(stages[7]["records_out"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markup_only_content_is_rejected_not_stored() {
    let d = Daemon::start(Options::default()).await;
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "<div><br/></div>", "stream": "s"})),
        )
        .await;
    assert_eq!(s, 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().starts_with("content:"),
        "{body}"
    );
    let (_, status) = d.call("GET", "/v1/status", None).await;
    assert_eq!(status["chunks"], 0);
    assert_eq!(
        status["pipelines"]["store"][0]["dropped"]["empty_after_sanitize"],
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_accepts_the_reference_fields() {
    let d = Daemon::start(Options::default()).await;
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({
                "content": "User prefers dark mode in all tools",
                "stream": "100",
                "level": 1,
                "metadata": {"source": "user-stated"},
                "user_id": "alice",
                "app_id": "claude"
            })),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let id = body["id"].as_str().unwrap();
    assert_eq!(uuid_version(id), Some(4), "{id}");
    let (_, resp) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "dark mode", "stream": "100", "trace": true})),
        )
        .await;
    assert_eq!(resp["results"][0]["trace_info"]["level"], "L1");
}

fn uuid_version(id: &str) -> Option<usize> {
    let parts: Vec<&str> = id.split('-').collect();
    (parts.len() == 5)
        .then(|| parts[2][..1].parse().ok())
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_endpoints_remove_only_visible_memories() {
    let d = Daemon::start(Options::default()).await;
    let keep = d.store("Keep this memory about sailing", "s").await;
    let gone = d.store("Delete this memory about sailing", "s").await;

    let (s, body) = d
        .call("POST", "/v1/delete", Some(json!({"id": gone})))
        .await;
    assert_eq!(s, 200);
    assert_eq!(body, json!({"status": "deleted", "id": gone}));
    assert_eq!(
        d.search_ids(json!({"query": "sailing", "stream": "s"}))
            .await,
        vec![keep.clone()]
    );

    let (s, body) = d
        .call("POST", "/v1/delete", Some(json!({"id": gone})))
        .await;
    assert_eq!(s, 404, "{body}");
    assert!(body["detail"].as_str().unwrap().contains(&gone));

    // The REST form with a non-matching namespace leaves the memory alone.
    let (s, _) = d
        .call("DELETE", &format!("/api/memories/{keep}?ns=other"), None)
        .await;
    assert_eq!(s, 404);
    assert_eq!(
        d.search_ids(json!({"query": "sailing", "stream": "s"}))
            .await,
        vec![keep.clone()]
    );
    let (s, body) = d
        .call("DELETE", &format!("/api/memories/{keep}?ns=s"), None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(body, json!({"deleted": true, "id": keep}));
    assert!(d
        .search_ids(json!({"query": "sailing", "stream": "s"}))
        .await
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_is_a_dry_run_until_confirmed() {
    let d = Daemon::start(Options::default()).await;
    let mut ids = vec![
        d.store("alpha one", "p").await,
        d.store("alpha two", "p").await,
    ];
    ids.sort();
    let other = d.store("alpha three", "q").await;

    let (s, body) = d
        .call("POST", "/v1/purge-namespace", Some(json!({"stream": "p"})))
        .await;
    assert_eq!(s, 200);
    assert_eq!(body["dry_run"], true);
    assert_eq!(body["deleted_count"], 2);
    assert_eq!(body["deleted_ids"], json!(ids));
    assert_eq!(
        d.search_ids(json!({"query": "alpha", "stream": "p"}))
            .await
            .len(),
        2
    );

    let (s, body) = d
        .call(
            "POST",
            "/v1/purge-namespace",
            Some(json!({"stream": "p", "dry_run": false})),
        )
        .await;
    assert_eq!(s, 422);
    assert!(
        body["detail"].as_str().unwrap().starts_with("confirmed:"),
        "{body}"
    );
    assert_eq!(
        d.search_ids(json!({"query": "alpha", "stream": "p"}))
            .await
            .len(),
        2
    );

    let (s, body) = d
        .call(
            "POST",
            "/v1/purge-namespace",
            Some(json!({"stream": "p", "dry_run": false, "confirmed": true})),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(body["status"], "ok");
    assert_eq!(body["deleted_count"], 2);
    assert!(d
        .search_ids(json!({"query": "alpha", "stream": "p"}))
        .await
        .is_empty());
    assert_eq!(
        d.search_ids(json!({"query": "alpha", "stream": "q"})).await,
        vec![other]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn date_filters_bound_the_creation_time() {
    let d = Daemon::start(Options::default()).await;
    let id = d.store("Bought a new espresso machine", "s").await;
    let today = chrono::Utc::now().date_naive();
    let day = |offset: i64| (today + chrono::Duration::days(offset)).to_string();
    let q = |extra: serde_json::Value| {
        let mut body = json!({"query": "espresso machine", "stream": "s"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    assert_eq!(
        d.search_ids(q(json!({"date_from": day(0), "date_to": day(0)})))
            .await,
        vec![id.clone()]
    );
    assert!(d
        .search_ids(q(json!({"date_from": day(1)})))
        .await
        .is_empty());
    assert!(d
        .search_ids(q(json!({"date_to": day(-1)})))
        .await
        .is_empty());
    assert_eq!(
        d.search_ids(q(json!({"time_filter": "today"}))).await,
        vec![id.clone()]
    );
    // "today" counts from `now` when one is given: a year on, it is not today.
    assert!(d
        .search_ids(q(json!({"time_filter": "today", "now": day(365)})))
        .await
        .is_empty());
    let (s, body) = d
        .call(
            "POST",
            "/v1/search",
            Some(q(json!({"date_from": "last tuesday"}))),
        )
        .await;
    assert_eq!(s, 422);
    assert!(
        body["detail"].as_str().unwrap().starts_with("date_from:"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_modes_choose_the_legs() {
    let d = Daemon::start(Options::embedded()).await;
    let id = d.store("User prefers dark mode in all tools", "s").await;
    for (mode, legs) in [
        ("bm25", vec!["bm25"]),
        ("vector", vec!["vector"]),
        ("hybrid", vec!["bm25", "vector"]),
    ] {
        let (status, resp) = d
            .call(
                "POST",
                "/v1/search",
                Some(json!({"query": "dark mode", "stream": "s", "trace": true, "mode": mode})),
            )
            .await;
        assert_eq!(status, 200, "{resp}");
        assert_eq!(
            resp["results"][0]["chunk_id"],
            id.as_str(),
            "{mode}: {resp}"
        );
        let mut got: Vec<&String> = resp["results"][0]["trace_info"]["legs"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        got.sort();
        assert_eq!(got, legs, "{mode}");
    }
    let (status, resp) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "dark mode", "mode": "psychic"})),
        )
        .await;
    assert_eq!(status, 422);
    assert!(
        resp["detail"].as_str().unwrap().starts_with("mode:"),
        "{resp}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_whoami_describe_the_engine() {
    let d = Daemon::start(Options::default()).await;
    d.store("one memory", "s").await;
    let (s, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(s, 200);
    assert_eq!(st["status"], "ok");
    assert_eq!(st["config_summary"]["rocksdb_keys"], 1);
    assert_eq!(st["config_summary"]["embeddings_count"], 1);
    assert_eq!(st["config_summary"]["vector_enabled"], true);
    assert_eq!(st["embedder"]["dim"], 384);
    assert_eq!(st["bus"]["kind"], "jetstream");
    assert_eq!(st["bus"]["connected"], true);
    let (s, me) = d.call("GET", "/v1/whoami", None).await;
    assert_eq!(s, 200);
    assert_eq!(me["auth_mode"], "passthrough");
    assert_eq!(me["role"], "admin");
    assert_eq!(me["active_stream"], "__user_default__");
}
