//! Bad input gets a clear 4xx with `{"detail": …}` and stores nothing.

use serde_json::json;

use crate::fixture::{Daemon, Options};

fn detail(body: &serde_json::Value) -> &str {
    body["detail"]
        .as_str()
        .unwrap_or_else(|| panic!("no detail in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_error_code_with_a_detail() {
    let d = Daemon::start(Options::default()).await;

    let (s, body) = d
        .post_raw("/v1/store", b"{\"content\": \"unterminated".to_vec())
        .await;
    assert_eq!(s, 400);
    assert!(detail(&body).contains("malformed JSON"), "{body}");

    let (s, body) = d
        .call("POST", "/v1/store", Some(json!({"stream": "s"})))
        .await;
    assert_eq!(s, 422);
    assert!(detail(&body).contains("content"), "{body}");

    let (s, body) = d
        .call("POST", "/v1/store", Some(json!({"content": 5})))
        .await;
    assert_eq!(s, 422);
    assert!(detail(&body).starts_with("content:"), "{body}");

    let (s, body) = d
        .call("POST", "/v1/store", Some(json!({"content": "   "})))
        .await;
    assert_eq!(s, 422);
    assert!(detail(&body).starts_with("content:"), "{body}");

    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "x", "contnet": "typo"})),
        )
        .await;
    assert_eq!(s, 422);
    assert!(detail(&body).contains("contnet"), "{body}");

    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "x", "level": 7})),
        )
        .await;
    assert_eq!(s, 422);
    assert!(detail(&body).starts_with("level:"), "{body}");

    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "x", "metadata": [1]})),
        )
        .await;
    assert_eq!(s, 422);
    assert!(detail(&body).starts_with("metadata:"), "{body}");

    let (s, body) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "x", "top_k": "ten"})),
        )
        .await;
    assert_eq!(s, 422);
    assert!(detail(&body).starts_with("top_k:"), "{body}");

    let (s, body) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "x", "top_k": 0})),
        )
        .await;
    assert_eq!(s, 422);
    assert!(detail(&body).starts_with("top_k:"), "{body}");

    let (s, body) = d
        .call("POST", "/v1/search", Some(json!({"query": ""})))
        .await;
    assert_eq!(s, 422);
    assert!(detail(&body).starts_with("query:"), "{body}");

    let (s, body) = d
        .call("POST", "/v1/delete", Some(json!({"id": "no-such-id"})))
        .await;
    assert_eq!(s, 404);
    assert!(detail(&body).contains("no-such-id"), "{body}");

    let (s, body) = d.call("GET", "/v1/nothing-here", None).await;
    assert_eq!(s, 404);
    assert!(detail(&body).contains("/v1/nothing-here"), "{body}");

    // Nothing above stored anything.
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["chunks"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_over_a_million_characters_is_413() {
    let d = Daemon::start(Options::default()).await;
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "a".repeat(1_000_001)})),
        )
        .await;
    assert_eq!(s, 413, "{body}");
    assert!(detail(&body).contains("1000000"), "{body}");
    // Exactly the limit is fine.
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "word ".repeat(200_000)})),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    // Within the character limit but past the bus's message size (NATS max_payload,
    // 1 MiB by default): a clear 413, not a 503.
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "é".repeat(600_000)})),
        )
        .await;
    assert_eq!(s, 413, "{body}");
    assert!(detail(&body).contains("too large for the bus"), "{body}");
    // A body whose declared length passes the server's byte limit is refused
    // before any of it is read: only the head is sent, and the 413 comes back.
    // (Sending the whole body raced the server's early answer: the client
    // could still be writing when the refused connection closed.)
    let head = format!(
        "POST /v1/store HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        9 * 1024 * 1024,
        host = d.url.trim_start_matches("http://"),
        auth = d
            .token()
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default(),
    );
    let answer = raw_exchange(&d.url, head.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("server.max_body_bytes"), "{answer}");
}

/// Write `request` on a new connection to the daemon at `url` and read its
/// answer to the end (the request asks to close).
async fn raw_exchange(url: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .expect("connect");
    socket.write_all(request).await.expect("request head sent");
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        socket.read_to_end(&mut answer),
    )
    .await
    .expect("an answer without the body being sent")
    .expect("answer read");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_post_is_refused_with_415_and_stores_nothing() {
    // `curl -d '{…}'` without a content type sends a form, and so does a
    // cross-site page: neither reaches the handler.
    let d = Daemon::start(Options::default()).await;
    let resp = d
        .http
        .post(format!("{}/v1/store", d.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(r#"{"content":"User prefers dark mode","stream":"100"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 415);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("application/json"),
        "{body}"
    );
    assert_eq!(d.sql("SELECT count(*) AS n FROM chunks").await[0]["n"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chosen_id_cannot_take_over_another_streams_memory() {
    let d = Daemon::start(Options::default()).await;
    let (s, _) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "mine", "stream": "a", "id": "fixed-1"})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "theirs", "stream": "b", "id": "fixed-1"})),
        )
        .await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(
        d.search_ids(json!({"query": "mine", "stream": "a"})).await,
        vec!["fixed-1".to_string()]
    );
    // Re-storing the same id in the same stream replaces it (idempotent upsert).
    let (s, _) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "mine again", "stream": "a", "id": "fixed-1"})),
        )
        .await;
    assert_eq!(s, 200);
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["chunks"], 1);
}
