//! The peers' own REST APIs, served by loomem so their clients work
//! unchanged: each route maps a peer's request onto a loomem service
//! function and its answer back into the peer's shape — never a second
//! implementation. Their contract is the peer's document in
//! `shared/reference/`, not loomem's OpenAPI description.

pub mod memoclaw;
pub mod memoria;
pub mod neuroloom;

use axum::Json;
use serde_json::{json, Value};

use crate::app::Engine;
use crate::core::error::{Error, Result};
use crate::core::Caller;
use crate::service;
use crate::service::listing::ListQuery;

/// The memories a listing query matches, `offset` memories skipped and at
/// most `limit` answered (the peers page by offset; loomem by cursor), with
/// the number matching in all.
async fn offset_page(
    engine: &Engine,
    caller: &Caller,
    query: &ListQuery,
    offset: usize,
    limit: usize,
) -> Result<(Vec<Value>, usize)> {
    let mut skip = offset;
    let mut cursor = None;
    let mut views = Vec::new();
    loop {
        let page = service::listing::page(
            engine,
            caller,
            &ListQuery {
                limit: Some(500),
                cursor,
                ..query.clone()
            },
        )
        .await?;
        let n = page.memories.len();
        views.extend(page.memories.into_iter().skip(skip));
        skip = skip.saturating_sub(n);
        cursor = page.next_cursor;
        if views.len() >= limit || cursor.is_none() {
            views.truncate(limit);
            return Ok((views, page.total));
        }
    }
}

/// Every memory a listing query matches (for exports and aggregates).
async fn all(engine: &Engine, caller: &Caller, query: &ListQuery) -> Result<Vec<Value>> {
    Ok(offset_page(engine, caller, query, 0, usize::MAX).await?.0)
}

/// A count the peer bounds: `default` when absent, else 1 to `max`.
fn limit_of(field: &str, v: Option<usize>, default: usize, max: usize) -> Result<usize> {
    let n = v.unwrap_or(default);
    if !(1..=max).contains(&n) {
        return Err(Error::invalid(
            field,
            format!("must be between 1 and {max}"),
        ));
    }
    Ok(n)
}

/// Delete these memories through loomem's bulk delete (a safety snapshot
/// first; immutable ones stay), the reason naming the peer's API; how many
/// went (none asked: none, no snapshot).
async fn delete_ids(
    engine: &Engine,
    caller: &Caller,
    ids: Vec<String>,
    why: &str,
) -> Result<usize> {
    if ids.is_empty() {
        return Ok(0);
    }
    let done = service::bulk::delete(
        engine,
        caller,
        service::bulk::BulkDeleteRequest {
            ids: Some(ids),
            reason: Some(why.to_string()),
            ..Default::default()
        },
    )
    .await?;
    Ok(done.deleted_count)
}

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
