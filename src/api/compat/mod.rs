//! The peers' own REST APIs, served by loomem so their clients work
//! unchanged: each route maps a peer's request onto a loomem service
//! function and its answer back into the peer's shape — never a second
//! implementation. Their contract is the peer's document in
//! `shared/reference/`, not loomem's OpenAPI description.

pub mod memoria;
pub mod neuroloom;

use axum::Json;
use serde_json::{json, Value};

/// This process, as the peers' readiness probes name it.
fn instance_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| uuid::Uuid::new_v4().to_string())
}

/// A peer's liveness probe: `"ok"`, no key needed.
pub async fn health_text() -> &'static str {
    "ok"
}

/// A peer's readiness probe: `{"status":"ok","instance_id"}`, no key needed.
pub async fn health_instance() -> Json<Value> {
    Json(json!({"status": "ok", "instance_id": instance_id()}))
}
