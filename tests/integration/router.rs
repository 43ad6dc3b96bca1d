//! The REST router driven with `tower::ServiceExt::oneshot`: no listener, no
//! nats-server. Auth, the error mapping and request parsing at the edge.

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use loomem::app::config::Config;
use loomem::app::Engine;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::fixture::{daemon_env, Options, ADMIN_TOKEN, TOKEN_A};

async fn router() -> (axum::Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        embedded: true,
        ..Options::with_auth()
    };
    let (path, env) = daemon_env(&dir.path().join("data"), None, &opts);
    let mut cfg = Config::load(&path, &env).unwrap();
    cfg.server.tokens.push(loomem::service::auth::ScopedToken {
        name: "agent-a".into(),
        token_env: "TEST_TOKEN_A".into(),
        streams: vec!["a".into()],
    });
    let engine = Engine::start(cfg, &env).await.unwrap();
    (loomem::api::router(engine), dir)
}

async fn send(
    app: &axum::Router,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (StatusCode, Option<String>, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let challenge = resp
        .headers()
        .get(header::WWW_AUTHENTICATE)
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        challenge,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_open_and_everything_else_needs_a_key() {
    let (app, _dir) = router().await;
    let (s, _, body) = send(&app, "GET", "/health", None, "").await;
    assert_eq!((s, body), (StatusCode::OK, json!({"status": "ok"})));
    let (s, challenge, body) = send(&app, "POST", "/v1/store", None, r#"{"content":"x"}"#).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(challenge.as_deref(), Some("Bearer"));
    assert!(body["detail"].is_string(), "{body}");
    let (s, _, _) = send(&app, "GET", "/v1/status", Some("wrong"), "").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _, who) = send(&app, "GET", "/v1/whoami", Some(TOKEN_A), "").await;
    assert_eq!(s, StatusCode::OK, "{who}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_4xx_with_a_detail_naming_the_problem() {
    let (app, _dir) = router().await;
    let admin = Some(ADMIN_TOKEN);
    let (s, _, body) = send(&app, "POST", "/v1/store", admin, "{not json").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    let (s, _, body) = send(&app, "POST", "/v1/store", admin, r#"{"content": 5}"#).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["detail"].as_str().unwrap().starts_with("content"),
        "{body}"
    );
    let (s, _, body) = send(
        &app,
        "POST",
        "/v1/sql",
        admin,
        r#"{"sql": "SELECT 1", "format": "xml"}"#,
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["detail"].as_str().unwrap().starts_with("format"),
        "{body}"
    );
    let (s, _, body) = send(&app, "POST", "/admin/jobs/nope/run", admin, "{}").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("no job `nope`"),
        "{body}"
    );
    let (s, _, body) = send(&app, "GET", "/v1/nowhere", admin, "").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    // A scoped key cannot name another stream.
    let (s, _, body) = send(
        &app,
        "POST",
        "/v1/store",
        Some(TOKEN_A),
        r#"{"content": "x", "stream": "b"}"#,
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
}
