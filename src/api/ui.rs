//! `/ui`: the console, three static files compiled into the binary (no
//! build step, nothing fetched at run time). They hold no data and need no
//! key: the page signs in with an API key and calls the REST API with it
//! like any other client.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::core::error::Error;

const INDEX: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/app.js");
const STYLE: &str = include_str!("../../ui/app.css");

/// The page's own sources only; no inline script, no other origin.
const CSP: &str = "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// `GET /ui`.
pub async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/{file}`.
pub async fn asset(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "" | "index.html" => index().await,
        "app.js" => file("text/javascript; charset=utf-8", SCRIPT),
        "app.css" => file("text/css; charset=utf-8", STYLE),
        _ => Error::NotFound(format!("no console file `{name}`")).into_response(),
    }
}
