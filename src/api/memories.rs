//! Writing and deleting memories.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;

use super::{ApiJson, ApiQuery};
use crate::app::Engine;
use crate::core::error::{Error, Result};
use crate::core::Caller;
use crate::service::conversation::{self, IngestRequest, IngestResponse};
use crate::service::import::{self, Format, ImportReport};
use crate::service::memory::{self, PurgeRequest, PurgeResponse, StoreRequest, StoreResponse};

pub async fn store(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<StoreRequest>,
) -> Result<Json<StoreResponse>> {
    Ok(Json(memory::store(&engine, &caller, req).await?))
}

pub async fn ingest(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<IngestRequest>,
) -> Result<Json<IngestResponse>> {
    Ok(Json(conversation::ingest(&engine, &caller, req).await?))
}

#[derive(schemars::JsonSchema, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteRequest {
    id: String,
    /// Also erase it from earlier table versions (admin only).
    #[serde(default)]
    forget: bool,
}

pub async fn delete(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<DeleteRequest>,
) -> Result<Json<serde_json::Value>> {
    let deleted = memory::delete_by_id(&engine, &caller, &req.id, req.forget).await?;
    Ok(Json(serde_json::json!(deleted)))
}

#[derive(schemars::JsonSchema, Deserialize)]
pub struct NsQuery {
    ns: Option<String>,
}

pub async fn delete_rest(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<NsQuery>,
) -> Result<Json<serde_json::Value>> {
    let stream = match q.ns.as_deref() {
        Some(ns) => Some(caller.resolve_stream(Some(ns))?),
        None => None,
    };
    memory::delete(&engine, &caller, &id, stream.as_deref()).await?;
    Ok(Json(serde_json::json!({ "deleted": true, "id": id })))
}

pub async fn purge(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<PurgeRequest>,
) -> Result<Json<PurgeResponse>> {
    Ok(Json(memory::purge(&engine, &caller, req).await?))
}

#[derive(schemars::JsonSchema, Deserialize)]
pub struct ImportQuery {
    format: Option<String>,
    stream: Option<String>,
}

/// The body is the file itself (`curl --data-binary @file.jsonl`).
pub async fn import(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ImportQuery>,
    body: axum::body::Bytes,
) -> Result<Json<ImportReport>> {
    let format: Format = q
        .format
        .as_deref()
        .unwrap_or("jsonl")
        .parse()
        .map_err(|e: String| Error::invalid("format", e))?;
    let text = std::str::from_utf8(&body)
        .map_err(|e| Error::BadRequest(format!("the body is not UTF-8: {e}")))?;
    Ok(Json(
        import::import_text(
            import::Destination::services(&engine),
            &caller,
            format,
            q.stream.as_deref(),
            text,
            |_, _| {},
        )
        .await?,
    ))
}

#[derive(schemars::JsonSchema, Deserialize)]
pub struct HistoryQuery {
    limit: Option<usize>,
}

pub async fn history(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<HistoryQuery>,
) -> Result<Json<memory::History>> {
    Ok(Json(memory::history(&engine, &caller, &id, q.limit).await?))
}

/// `GET /v1/memories/{id}`: one memory the key can see.
pub async fn get_one(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>> {
    Ok(Json(
        crate::service::edit::get(&engine, &caller, &id).await?,
    ))
}

/// `PATCH /v1/memories/{id}`: edit a memory (new text makes a new version).
pub async fn edit(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<crate::service::edit::EditRequest>,
) -> Result<Json<crate::service::edit::Edited>> {
    Ok(Json(
        crate::service::edit::edit(&engine, &caller, &id, req).await?,
    ))
}

/// `POST /v1/dead-letters/{id}/retry`.
pub async fn retry_dead_letter(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<memory::Retried>> {
    Ok(Json(
        memory::retry_dead_letter(&engine, &caller, &id).await?,
    ))
}

/// `GET /v1/memories`: a page of the memories the filters match.
pub async fn list(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<crate::service::listing::ListQuery>,
) -> Result<Json<crate::service::listing::Page>> {
    Ok(Json(
        crate::service::listing::page(&engine, &caller, &q).await?,
    ))
}

/// `GET /v1/memories/count`.
pub async fn count(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<crate::service::listing::ListQuery>,
) -> Result<Json<crate::service::listing::Count>> {
    Ok(Json(
        crate::service::listing::count(&engine, &caller, &q).await?,
    ))
}

/// `POST /v1/memories/batch`.
pub async fn batch_store(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<crate::service::bulk::BatchStoreRequest>,
) -> Result<Json<crate::service::bulk::BatchAnswer>> {
    Ok(Json(
        crate::service::bulk::store(&engine, &caller, req).await?,
    ))
}

/// `PATCH /v1/memories/batch`.
pub async fn batch_edit(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<crate::service::bulk::BatchEditRequest>,
) -> Result<Json<crate::service::bulk::BatchAnswer>> {
    Ok(Json(
        crate::service::bulk::edit(&engine, &caller, req).await?,
    ))
}

/// `POST /v1/memories/bulk-delete`.
pub async fn bulk_delete(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<crate::service::bulk::BulkDeleteRequest>,
) -> Result<Json<crate::service::bulk::BulkDeleted>> {
    Ok(Json(
        crate::service::bulk::delete(&engine, &caller, req).await?,
    ))
}

/// `PUT /v1/memories/{id}/correct`.
pub async fn correct(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<crate::service::edit::CorrectRequest>,
) -> Result<Json<crate::service::edit::Corrected>> {
    Ok(Json(
        crate::service::edit::correct(&engine, &caller, &id, req).await?,
    ))
}

/// `POST /v1/memories/correct`.
pub async fn correct_by_query(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<crate::service::edit::CorrectByQueryRequest>,
) -> Result<Json<crate::service::edit::Corrected>> {
    Ok(Json(
        crate::service::edit::correct_by_query(&engine, &caller, req).await?,
    ))
}

/// `GET /v1/streams`.
pub async fn streams(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
) -> Result<Json<crate::service::listing::Streams>> {
    Ok(Json(
        crate::service::listing::streams(&engine, &caller).await?,
    ))
}

/// `GET /v1/tags`.
pub async fn tags(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<crate::service::listing::ListQuery>,
) -> Result<Json<crate::service::listing::Tags>> {
    Ok(Json(
        crate::service::listing::tags(&engine, &caller, &q).await?,
    ))
}
