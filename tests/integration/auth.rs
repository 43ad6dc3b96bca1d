//! Bearer auth on every endpoint but /health, and stream scoping per key.

use serde_json::json;

use crate::fixture::{Daemon, Options, ADMIN_TOKEN, TOKEN_A};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_but_health_needs_a_key() {
    let d = Daemon::start(Options::with_auth()).await;
    let (s, body) = d.call_as(None, "GET", "/health", None).await;
    assert_eq!((s, body), (200, json!({"status": "ok"})));

    let endpoints = [
        ("POST", "/v1/store", Some(json!({"content": "x"}))),
        ("POST", "/v1/search", Some(json!({"query": "x"}))),
        ("POST", "/v1/delete", Some(json!({"id": "x"}))),
        ("DELETE", "/api/memories/x", None),
        ("POST", "/v1/purge-namespace", Some(json!({"stream": "a"}))),
        ("GET", "/v1/status", None),
        ("GET", "/v1/namespaces", None),
        ("GET", "/v1/whoami", None),
    ];
    for (method, path, body) in endpoints {
        for token in [None, Some("wrong-token")] {
            let (s, resp) = d.call_as(token, method, path, body.clone()).await;
            assert_eq!(s, 401, "{method} {path} with {token:?}: {resp}");
            assert!(
                resp["detail"].as_str().unwrap().contains("API key"),
                "{resp}"
            );
        }
    }
    let (s, me) = d
        .call_as(Some(ADMIN_TOKEN), "GET", "/v1/whoami", None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(me["role"], "admin");
    assert_eq!(me["auth_mode"], "token");
    assert_eq!(me["accessible_streams"], json!(["*"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_key_sees_only_its_streams() {
    let d = Daemon::start(Options::with_auth()).await;
    let b_id = d.store("The launch code word is pelican", "b").await;
    let (s, body) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/store",
            Some(json!({"content": "The launch code word is heron"})),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let a_id = body["id"].as_str().unwrap().to_string();

    // Its default stream is its first one.
    let (_, me) = d.call_as(Some(TOKEN_A), "GET", "/v1/whoami", None).await;
    assert_eq!(me["active_stream"], "a");
    assert_eq!(me["accessible_streams"], json!(["a", "a2"]));

    let (s, resp) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/search",
            Some(json!({"query": "launch code word"})),
        )
        .await;
    assert_eq!(s, 200);
    let ids: Vec<&str> = resp["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["chunk_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![a_id.as_str()]);

    for body in [
        json!({"query": "launch", "stream": "b"}),
        json!({"query": "launch", "streams": ["a", "b"]}),
    ] {
        let (s, resp) = d
            .call_as(Some(TOKEN_A), "POST", "/v1/search", Some(body))
            .await;
        assert_eq!(s, 403, "{resp}");
    }
    let (s, _) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/store",
            Some(json!({"content": "sneaky", "stream": "b"})),
        )
        .await;
    assert_eq!(s, 403);
    // Deleting another stream's memory looks exactly like deleting nothing.
    let (s, _) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/delete",
            Some(json!({"id": b_id})),
        )
        .await;
    assert_eq!(s, 404);
    let (s, _) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/purge-namespace",
            Some(json!({"stream": "b", "dry_run": false, "confirmed": true})),
        )
        .await;
    assert_eq!(s, 403);
    assert_eq!(
        d.search_ids(json!({"query": "pelican", "stream": "b"}))
            .await,
        vec![b_id]
    );

    // Status counts only its streams; namespaces only those it may use.
    let (_, st) = d.call_as(Some(TOKEN_A), "GET", "/v1/status", None).await;
    assert_eq!(st["chunks"], 1);
    let (_, st) = d
        .call_as(Some(ADMIN_TOKEN), "GET", "/v1/status", None)
        .await;
    assert_eq!(st["chunks"], 2);
    let (_, ns) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/namespaces", None)
        .await;
    assert_eq!(ns["namespaces"], json!({}));
}
