//! MemoClaw's HTTP API (`shared/reference/memoclaw-api.md`) under
//! `/compat/memoclaw`: its paths, fields and answers, each mapped onto
//! loomem's service functions. A namespace is a stream (`default`, or none
//! on a write, is the key's default stream; none on a read is every stream
//! the key sees); importance is 0–1 (loomem's 0–10 scaled down), and the
//! value a client set is kept in the memory's metadata under `memoclaw`, so
//! it reads back as written although loomem's pipeline weighs its own.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post, MethodRouter};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::super::{ApiJson, ApiJsonArray, ApiQuery};
use crate::app::Engine;
use crate::core::error::{Error, Result};
use crate::core::model::now_micros;
use crate::core::time::{parse_instant, to_rfc3339, DAY_MICROS};
use crate::core::{tokens, Caller};
use crate::service;
use crate::service::listing::ListQuery;

pub fn routes() -> Vec<(&'static str, MethodRouter<Arc<Engine>>)> {
    vec![
        ("/compat/memoclaw/v1/store", post(store)),
        ("/compat/memoclaw/v1/store/batch", post(store_batch)),
        ("/compat/memoclaw/v1/recall", post(recall)),
        ("/compat/memoclaw/v1/search", post(search)),
        ("/compat/memoclaw/v1/context", post(context)),
        ("/compat/memoclaw/v1/memories", get(list)),
        ("/compat/memoclaw/v1/memories/count", get(count)),
        (
            "/compat/memoclaw/v1/memories/bulk-delete",
            post(bulk_delete),
        ),
        ("/compat/memoclaw/v1/memories/batch", patch(batch_update)),
        ("/compat/memoclaw/v1/memories/extract", post(extract)),
        (
            "/compat/memoclaw/v1/memories/consolidate",
            post(consolidate),
        ),
        (
            "/compat/memoclaw/v1/memories/{id}",
            get(detail).patch(update).delete(remove),
        ),
        ("/compat/memoclaw/v1/memories/{id}/history", get(history)),
        ("/compat/memoclaw/v1/memories/{id}/graph", get(graph)),
        (
            "/compat/memoclaw/v1/memories/{id}/relations",
            get(relations).post(relate),
        ),
        (
            "/compat/memoclaw/v1/memories/{id}/relations/{relation_id}",
            delete(unrelate),
        ),
        ("/compat/memoclaw/v1/ingest", post(ingest)),
        ("/compat/memoclaw/v1/suggested", get(suggested)),
        ("/compat/memoclaw/v1/export", get(export)),
        ("/compat/memoclaw/v1/import", post(import)),
        ("/compat/memoclaw/v1/migrate", post(migrate)),
        ("/compat/memoclaw/v1/namespaces", get(namespaces)),
        ("/compat/memoclaw/v1/core-memories", get(core_memories)),
        ("/compat/memoclaw/v1/tags", get(tags)),
        ("/compat/memoclaw/v1/stats", get(stats)),
    ]
}

/// Where a memory's MemoClaw fields live in its loomem metadata.
const KEPT: &str = "memoclaw";

/// MemoClaw's 0–1 importance is loomem's 0–10 scaled down.
const IMPORTANCE_SCALE: f64 = 10.0;

/// The memory types MemoClaw knows (loomem's half-lives for them are
/// MemoClaw's: `[search.half_life_days]`).
const TYPES: &[&str] = &[
    "correction",
    "preference",
    "decision",
    "project",
    "observation",
    "general",
];

const MAX_CONTENT_CHARS: usize = 8192;
const MAX_TAGS: usize = 10;
const MAX_BATCH: usize = 100;

// ---------------------------------------------------------------- mapping

/// The stream a write goes to: `default` (or none) is the key's default.
fn stream_of(caller: &Caller, namespace: Option<&str>) -> Result<String> {
    match namespace.map(str::trim) {
        None | Some("default") => Ok(caller.default_stream().to_string()),
        Some(ns) => caller
            .resolve_stream(Some(ns))
            .map_err(|e| renamed(e, "namespace")),
    }
}

/// The stream a read is narrowed to, if it names a namespace.
fn filter_stream(caller: &Caller, namespace: Option<&str>) -> Result<Option<String>> {
    namespace.map(|ns| stream_of(caller, Some(ns))).transpose()
}

/// A stream as MemoClaw names it.
fn namespace_of(caller: &Caller, stream: &str) -> String {
    if stream == caller.default_stream() {
        "default".into()
    } else {
        stream.into()
    }
}

/// A field error renamed (loomem's `stream` is MemoClaw's `namespace`, an
/// item's field is `memories[i].field`).
fn renamed(e: Error, field: &str) -> Error {
    match e {
        Error::Invalid { message, .. } => Error::invalid(field, message),
        other => other,
    }
}

fn at_item(list: &str, index: usize, e: Error) -> Error {
    match e {
        Error::Invalid { field, message } => {
            Error::invalid(&format!("{list}[{index}].{field}"), message)
        }
        other => other,
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A loomem memory view as MemoClaw's memory object.
fn memory(caller: &Caller, view: &Value) -> Value {
    let kept = &view["metadata"][KEPT];
    let mut metadata = match &view["metadata"] {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    metadata.remove(KEPT);
    metadata.insert(
        "tags".into(),
        match &view["tags"] {
            Value::Array(t) => Value::Array(t.clone()),
            _ => json!([]),
        },
    );
    let importance = kept["importance"].as_f64().unwrap_or_else(|| {
        (view["importance"].as_f64().unwrap_or(0.0) / IMPORTANCE_SCALE).min(1.0)
    });
    json!({
        "id": view["id"],
        "content": view["content"],
        "metadata": metadata,
        "importance": round3(importance),
        "memory_type": view["memory_type"],
        "namespace": namespace_of(caller, view["stream"].as_str().unwrap_or_default()),
        "session_id": view["session_id"],
        "agent_id": view["agent_id"],
        "pinned": view["pinned"],
        "immutable": view["immutable"],
        "access_count": view["access_count"],
        "last_accessed_at": view["last_accessed_at"],
        "expires_at": view["expires_at"],
        "created_at": view["created_at"],
        "updated_at": view["updated_at"],
    })
}

async fn memory_by_id(engine: &Engine, caller: &Caller, id: &str) -> Result<Value> {
    Ok(memory(
        caller,
        &service::edit::get(engine, caller, id).await?,
    ))
}

/// A relation as MemoClaw's relation object.
fn relation(r: &crate::store::relations::RelationRow) -> Value {
    let metadata = r
        .note
        .as_deref()
        .and_then(|n| serde_json::from_str::<Value>(n).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({
        "id": r.id,
        "source_id": r.from_id,
        "target_id": r.to_id,
        "relation_type": r.relation,
        "metadata": metadata,
        "created_at": to_rfc3339(r.created_at),
    })
}

fn check_importance(v: Option<f64>) -> Result<()> {
    match v {
        Some(x) if !x.is_finite() || !(0.0..=1.0).contains(&x) => {
            Err(Error::invalid("importance", "must be between 0 and 1"))
        }
        _ => Ok(()),
    }
}

fn check_type(v: Option<&str>) -> Result<()> {
    match v {
        Some(t) if !TYPES.contains(&t) => Err(Error::invalid(
            "memory_type",
            format!("`{t}`: must be one of {}", TYPES.join(", ")),
        )),
        _ => Ok(()),
    }
}

fn check_content(content: &str) -> Result<()> {
    if content.trim().is_empty() {
        return Err(Error::invalid("content", "must not be empty"));
    }
    let n = content.chars().count();
    if n > MAX_CONTENT_CHARS {
        return Err(Error::invalid(
            "content",
            format!("{n} characters; at most {MAX_CONTENT_CHARS}"),
        ));
    }
    Ok(())
}

/// `expires_at` must lie in the future (null passes: it clears).
fn check_expiry(v: Option<&Value>) -> Result<()> {
    match v {
        None | Some(Value::Null) => Ok(()),
        Some(v) => {
            if parse_instant("expires_at", v)? <= now_micros() {
                return Err(Error::invalid("expires_at", "must be in the future"));
            }
            Ok(())
        }
    }
}

/// Tags (if the metadata names them) and the rest of the metadata.
type Split = (Option<Vec<String>>, Map<String, Value>);

/// MemoClaw's `metadata` split into loomem's tags and the rest.
fn split_metadata(metadata: Option<&Value>) -> Result<Split> {
    let mut m = match metadata {
        None | Some(Value::Null) => return Ok((None, Map::new())),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(Error::invalid("metadata", "must be an object")),
    };
    m.remove(KEPT);
    let tags = match m.remove("tags") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let tags: Option<Vec<String>> = items
                .iter()
                .map(|t| t.as_str().map(str::to_string))
                .collect();
            let tags = tags.ok_or_else(|| Error::invalid("metadata.tags", "must be strings"))?;
            if tags.len() > MAX_TAGS {
                return Err(Error::invalid(
                    "metadata.tags",
                    format!("at most {MAX_TAGS} tags"),
                ));
            }
            Some(tags)
        }
        Some(_) => return Err(Error::invalid("metadata.tags", "must be an array")),
    };
    Ok((tags, m))
}

/// The metadata loomem keeps: the client's, with MemoClaw's importance.
fn kept_metadata(mut user: Map<String, Value>, importance: f64) -> Value {
    user.insert(KEPT.into(), json!({"importance": importance}));
    Value::Object(user)
}

// ---------------------------------------------------------------- store

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewMemory {
    content: String,
    metadata: Option<Value>,
    importance: Option<f64>,
    namespace: Option<String>,
    memory_type: Option<String>,
    session_id: Option<String>,
    agent_id: Option<String>,
    expires_at: Option<Value>,
    pinned: Option<bool>,
    immutable: Option<bool>,
}

/// A MemoClaw memory as loomem's store request, checked.
fn store_request(caller: &Caller, m: NewMemory) -> Result<service::memory::StoreRequest> {
    check_content(&m.content)?;
    check_importance(m.importance)?;
    check_type(m.memory_type.as_deref())?;
    check_expiry(m.expires_at.as_ref())?;
    let (tags, user) = split_metadata(m.metadata.as_ref())?;
    let importance = m.importance.unwrap_or(0.5);
    Ok(service::memory::StoreRequest {
        content: m.content,
        stream: Some(stream_of(caller, m.namespace.as_deref())?),
        metadata: Some(kept_metadata(user, importance)),
        tags: tags.unwrap_or_default(),
        importance: Some((importance * IMPORTANCE_SCALE) as f32),
        memory_type: Some(m.memory_type.unwrap_or_else(|| "general".into())),
        session_id: m.session_id,
        agent_id: m.agent_id,
        expires_at: m.expires_at.filter(|v| !v.is_null()),
        pinned: m.pinned,
        immutable: m.immutable,
        ..Default::default()
    })
}

/// `POST /v1/store`: `{id, stored, tokens_used}` (a repeat of a stored
/// memory answers that memory's id and `duplicate_of`).
async fn store(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<NewMemory>,
) -> Result<Json<Value>> {
    let tokens_used = tokens::count(&req.content);
    let done = service::memory::store(&engine, &caller, store_request(&caller, req)?).await?;
    let mut out = json!({"id": done.id, "stored": true, "tokens_used": tokens_used});
    if let Some(d) = done.duplicate_of {
        out["duplicate_of"] = json!(d);
    }
    Ok(Json(out))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewMemories {
    memories: Vec<NewMemory>,
}

/// Store checked requests in one batch: per item, the memory's id or why
/// not, and how many were repeats of stored memories.
struct Batch {
    ids: Vec<Option<String>>,
    stored: usize,
    duplicates: usize,
    errors: Vec<Value>,
    /// Items refused because their id is another memory's.
    conflicts: Vec<usize>,
}

async fn store_all(
    engine: &Engine,
    caller: &Caller,
    memories: Vec<service::memory::StoreRequest>,
) -> Result<Batch> {
    let mut out = Batch {
        ids: Vec::with_capacity(memories.len()),
        stored: 0,
        duplicates: 0,
        errors: Vec::new(),
        conflicts: Vec::new(),
    };
    if memories.is_empty() {
        return Ok(out);
    }
    let answer = service::bulk::store(
        engine,
        caller,
        service::bulk::BatchStoreRequest {
            memories,
            wait: None,
        },
    )
    .await?;
    for r in answer.results {
        match r.status {
            "stored" | "pending" => out.stored += 1,
            "duplicate" => out.duplicates += 1,
            "conflict" if r.id.is_some() => {
                out.conflicts.push(r.index);
                out.errors
                    .push(json!({"index": r.index, "error": r.error.clone()}));
            }
            _ => out.errors.push(json!({
                "index": r.index,
                "error": r.error.clone().unwrap_or_else(|| r.status.to_string()),
            })),
        }
        out.ids.push(r.id.filter(|_| r.error.is_none()));
    }
    Ok(out)
}

/// `POST /v1/store/batch`: at most 100; every item is checked before any is
/// stored (422 naming `memories[i].field`).
async fn store_batch(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<NewMemories>,
) -> Result<Json<Value>> {
    if req.memories.is_empty() || req.memories.len() > MAX_BATCH {
        return Err(Error::invalid(
            "memories",
            format!("1 to {MAX_BATCH} memories"),
        ));
    }
    let tokens_used: usize = req.memories.iter().map(|m| tokens::count(&m.content)).sum();
    let requests = req
        .memories
        .into_iter()
        .enumerate()
        .map(|(i, m)| store_request(&caller, m).map_err(|e| at_item("memories", i, e)))
        .collect::<Result<Vec<_>>>()?;
    let done = store_all(&engine, &caller, requests).await?;
    let mut out = json!({
        "ids": done.ids,
        "stored": done.errors.is_empty(),
        "count": done.ids.iter().flatten().count(),
        "tokens_used": tokens_used,
    });
    if !done.errors.is_empty() {
        out["errors"] = json!(done.errors);
    }
    Ok(Json(out))
}

// ---------------------------------------------------------------- recall

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecallFilters {
    tags: Option<Vec<String>>,
    after: Option<Value>,
    before: Option<Value>,
    memory_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Recall {
    query: String,
    limit: Option<usize>,
    min_similarity: Option<f32>,
    namespace: Option<String>,
    #[serde(default)]
    filters: RecallFilters,
    session_id: Option<String>,
    agent_id: Option<String>,
    #[serde(default)]
    include_relations: bool,
}

/// The streams a read covers: the namespace's, or every stream the key sees.
async fn read_streams(
    engine: &Engine,
    caller: &Caller,
    namespace: Option<&str>,
) -> Result<Vec<String>> {
    if let Some(s) = filter_stream(caller, namespace)? {
        return Ok(vec![s]);
    }
    let held = service::listing::streams(engine, caller).await?;
    let mut streams: Vec<String> = held.streams.into_iter().map(|s| s.stream).collect();
    if streams.is_empty() {
        streams.push(caller.default_stream().to_string());
    }
    Ok(streams)
}

/// Memory objects of what a search ranked, each with `similarity` (the
/// cosine of the vector leg, when it found the memory) and `score`.
async fn ranked(
    engine: &Engine,
    caller: &Caller,
    found: Vec<service::search::Ranked>,
    include_relations: bool,
) -> Result<Vec<Value>> {
    let mut out = Vec::with_capacity(found.len());
    for r in found {
        let mut m = memory(caller, &service::edit::view(&r.chunk));
        m["similarity"] = json!(r
            .legs
            .get("vector")
            .map(|l| round3(f64::from(1.0 - l.score))));
        m["score"] = json!(round3(f64::from(r.score)));
        if include_relations {
            let links = service::relations::list(
                engine,
                caller,
                &service::relations::RelationsQuery {
                    memory_id: Some(r.chunk.id.clone()),
                    ..Default::default()
                },
            )
            .await?;
            m["relations"] = links.relations.iter().map(relation).collect();
        }
        out.push(m);
    }
    Ok(out)
}

/// `POST /v1/recall`: loomem's hybrid search, keeping the memories whose
/// embedding is at least `min_similarity` (0.5) like the query's, in the
/// hybrid order.
async fn recall(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Recall>,
) -> Result<Json<Value>> {
    let limit = super::limit_of("limit", req.limit, 10, 100)?;
    let min_similarity = req.min_similarity.unwrap_or(0.5);
    if !(0.0..=1.0).contains(&min_similarity) {
        return Err(Error::invalid("min_similarity", "must be between 0 and 1"));
    }
    check_type(req.filters.memory_type.as_deref())?;
    let found = service::search::recall(
        &engine,
        &caller,
        &service::search::SearchRequest {
            query: req.query.clone(),
            top_k: Some(limit),
            streams: Some(read_streams(&engine, &caller, req.namespace.as_deref()).await?),
            date_from: req.filters.after,
            date_to: req.filters.before,
            memory_types: req.filters.memory_type.map(|t| vec![t]),
            tags: req.filters.tags,
            session_id: req.session_id,
            agent_id: req.agent_id,
            min_similarity: Some(min_similarity),
            ..Default::default()
        },
    )
    .await?;
    let semantic: Vec<_> = found
        .results
        .into_iter()
        .filter(|r| r.legs.contains_key("vector"))
        .collect();
    Ok(Json(json!({
        "memories": ranked(&engine, &caller, semantic, req.include_relations).await?,
        "query_tokens": tokens::count(&req.query),
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Search {
    query: String,
    limit: Option<usize>,
    namespace: Option<String>,
    memory_type: Option<String>,
    tags: Option<Vec<String>>,
}

/// `POST /v1/search`: loomem's BM25 leg alone.
async fn search(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Search>,
) -> Result<Json<Value>> {
    let limit = super::limit_of("limit", req.limit, 10, 100)?;
    check_type(req.memory_type.as_deref())?;
    let found = service::search::recall(
        &engine,
        &caller,
        &service::search::SearchRequest {
            query: req.query,
            top_k: Some(limit),
            streams: Some(read_streams(&engine, &caller, req.namespace.as_deref()).await?),
            memory_types: req.memory_type.map(|t| vec![t]),
            tags: req.tags,
            mode: Some("bm25".into()),
            ..Default::default()
        },
    )
    .await?;
    let memories = ranked(&engine, &caller, found.results, false).await?;
    Ok(Json(json!({"total": memories.len(), "memories": memories})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContextRequest {
    query: String,
    namespace: Option<String>,
    max_memories: Option<usize>,
    max_tokens: Option<usize>,
    format: Option<String>,
    #[serde(default)]
    include_metadata: bool,
    #[serde(default)]
    summarize: bool,
}

/// `POST /v1/context`: the best memories for the query (hybrid search), as
/// lines of text or structured JSON, within `max_tokens`.
async fn context(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<ContextRequest>,
) -> Result<Json<Value>> {
    let max_memories = super::limit_of("max_memories", req.max_memories, 10, 100)?;
    let max_tokens = req.max_tokens.unwrap_or(4000);
    if !(100..=16000).contains(&max_tokens) {
        return Err(Error::invalid(
            "max_tokens",
            "must be between 100 and 16000",
        ));
    }
    let structured = match req.format.as_deref().unwrap_or("text") {
        "text" => false,
        "structured" => true,
        other => {
            return Err(Error::invalid(
                "format",
                format!("`{other}`: must be text or structured"),
            ))
        }
    };
    if req.summarize {
        return Err(Error::NotImplemented(
            "MemoClaw's `summarize` (an LLM merging memories in the context) is not available in loomem; loomem's dream merges near copies in the store".into(),
        ));
    }
    let found = service::search::recall(
        &engine,
        &caller,
        &service::search::SearchRequest {
            query: req.query,
            top_k: Some(max_memories),
            streams: Some(read_streams(&engine, &caller, req.namespace.as_deref()).await?),
            ..Default::default()
        },
    )
    .await?;
    let memories = ranked(&engine, &caller, found.results, false).await?;
    let mut lines: Vec<String> = Vec::new();
    let mut items: Vec<Value> = Vec::new();
    let mut spent = 0;
    for m in &memories {
        let item = if req.include_metadata {
            json!({"content": m["content"], "memory_type": m["memory_type"], "importance": m["importance"], "tags": m["metadata"]["tags"]})
        } else {
            json!({"content": m["content"]})
        };
        let line = if structured {
            item.to_string()
        } else if req.include_metadata {
            format!(
                "- {} [{}, importance {}, tags: {}]",
                m["content"].as_str().unwrap_or_default(),
                m["memory_type"].as_str().unwrap_or_default(),
                m["importance"],
                tag_list(m, ", ")
            )
        } else {
            format!("- {}", m["content"].as_str().unwrap_or_default())
        };
        let cost = tokens::count(&line) + 1;
        if spent + cost > max_tokens {
            break;
        }
        spent += cost;
        lines.push(line);
        items.push(item);
    }
    let (context, tokens) = if structured {
        let text = Value::Array(items.clone()).to_string();
        (Value::Array(items), tokens::count(&text))
    } else {
        let text = lines.join("\n");
        let n = tokens::count(&text);
        (Value::String(text), n)
    };
    Ok(Json(json!({
        "context": context,
        "memories_used": lines.len(),
        "tokens": tokens,
    })))
}

// ---------------------------------------------------------------- listing

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    limit: Option<usize>,
    offset: Option<usize>,
    namespace: Option<String>,
    memory_type: Option<String>,
    /// Comma-separated; any of them.
    tags: Option<String>,
    session_id: Option<String>,
    agent_id: Option<String>,
    pinned: Option<bool>,
    /// `created_at` (newest first, the default) or `importance`.
    sort_by: Option<String>,
    /// Export and stats filters: created after / before.
    after: Option<String>,
    before: Option<String>,
    /// Export: `json`, `csv` or `markdown`.
    format: Option<String>,
    /// Suggested: `stale`, `fresh`, `hot` or `decaying`.
    category: Option<String>,
}

impl ListParams {
    fn query(&self, caller: &Caller) -> Result<ListQuery> {
        check_type(self.memory_type.as_deref())?;
        let order = match self.sort_by.as_deref().unwrap_or("created_at") {
            "created_at" | "newest" => "newest",
            "importance" => "importance",
            other => {
                return Err(Error::invalid(
                    "sort_by",
                    format!("`{other}`: must be created_at or importance"),
                ))
            }
        };
        Ok(ListQuery {
            stream: filter_stream(caller, self.namespace.as_deref())?,
            types: self.memory_type.clone(),
            tags: self.tags.clone(),
            session_id: self.session_id.clone(),
            agent_id: self.agent_id.clone(),
            pinned: self.pinned,
            created_after: self.after.clone(),
            created_before: self.before.clone(),
            order: Some(order.into()),
            ..Default::default()
        })
    }
}

/// `GET /v1/memories`: `{memories, total, limit, offset}`.
async fn list(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let limit = super::limit_of("limit", q.limit, 20, 500)?;
    let offset = q.offset.unwrap_or(0);
    let (views, total) =
        super::offset_page(&engine, &caller, &q.query(&caller)?, offset, limit).await?;
    let memories: Vec<Value> = views.iter().map(|v| memory(&caller, v)).collect();
    Ok(Json(json!({
        "memories": memories,
        "total": total,
        "limit": limit,
        "offset": offset,
    })))
}

/// `GET /v1/memories/count`: `{count}`.
async fn count(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let n = service::listing::count(&engine, &caller, &q.query(&caller)?).await?;
    Ok(Json(json!({"count": n.count})))
}

/// `GET /v1/memories/{id}`: the memory with its relations.
async fn detail(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let mut m = memory_by_id(&engine, &caller, &id).await?;
    m["relations"] = links(&engine, &caller, &id).await?.into();
    Ok(Json(m))
}

async fn links(engine: &Engine, caller: &Caller, id: &str) -> Result<Vec<Value>> {
    let found = service::relations::list(
        engine,
        caller,
        &service::relations::RelationsQuery {
            memory_id: Some(id.to_string()),
            ..Default::default()
        },
    )
    .await?;
    Ok(found.relations.iter().map(relation).collect())
}

// ---------------------------------------------------------------- updates

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Update {
    content: Option<String>,
    metadata: Option<Value>,
    importance: Option<f64>,
    memory_type: Option<String>,
    namespace: Option<String>,
    #[serde(default, deserialize_with = "crate::core::time::present")]
    expires_at: Option<Value>,
    pinned: Option<bool>,
    immutable: Option<bool>,
}

/// What can be told wrong about an update without reading the memory.
fn check_update(u: &Update) -> Result<()> {
    if u.content.is_none()
        && u.metadata.is_none()
        && u.importance.is_none()
        && u.memory_type.is_none()
        && u.namespace.is_none()
        && u.expires_at.is_none()
        && u.pinned.is_none()
        && u.immutable.is_none()
    {
        return Err(Error::invalid("body", "at least one field to update"));
    }
    if let Some(c) = &u.content {
        check_content(c)?;
    }
    check_importance(u.importance)?;
    check_type(u.memory_type.as_deref())?;
    check_expiry(u.expires_at.as_ref())?;
    split_metadata(u.metadata.as_ref())?;
    Ok(())
}

/// Apply a checked update: the memory object after it (a new text is a new
/// version in loomem, with a new id).
async fn apply_update(engine: &Engine, caller: &Caller, id: &str, u: Update) -> Result<Value> {
    let current = service::edit::get(engine, caller, id).await?;
    if let Some(ns) = u.namespace.as_deref() {
        if stream_of(caller, Some(ns))? != current["stream"].as_str().unwrap_or_default() {
            return Err(Error::NotImplemented(
                "moving a memory to another namespace is not available in loomem (store it there and delete this one)".into(),
            ));
        }
    }
    let (tags, metadata) = if u.metadata.is_some() || u.importance.is_some() {
        let (tags, user) = match &u.metadata {
            Some(m) => split_metadata(Some(m))?,
            None => split_metadata(Some(&current["metadata"]))
                .map(|(_, user)| (None, user))
                .unwrap_or((None, Map::new())),
        };
        let importance = u
            .importance
            .or_else(|| current["metadata"][KEPT]["importance"].as_f64())
            .unwrap_or_else(|| current["importance"].as_f64().unwrap_or(0.0) / IMPORTANCE_SCALE);
        (tags, Some(kept_metadata(user, importance)))
    } else {
        (None, None)
    };
    let done = service::edit::edit(
        engine,
        caller,
        id,
        service::edit::EditRequest {
            content: u.content,
            tags,
            memory_type: u.memory_type,
            importance: u.importance.map(|i| (i * IMPORTANCE_SCALE) as f32),
            pinned: u.pinned,
            immutable: u.immutable,
            expires_at: u.expires_at,
            metadata,
            reason: Some("updated through MemoClaw's API".into()),
            ..Default::default()
        },
    )
    .await?;
    memory_by_id(engine, caller, &done.id).await
}

/// `PATCH /v1/memories/{id}`: the memory object after the update.
async fn update(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<Update>,
) -> Result<Json<Value>> {
    check_update(&req)?;
    Ok(Json(apply_update(&engine, &caller, &id, req).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateItem {
    id: String,
    #[serde(flatten)]
    update: Update,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Updates {
    updates: Vec<Value>,
}

/// `PATCH /v1/memories/batch`: every item checked first (422 naming
/// `updates[i].field`), then applied in order; an item whose memory is
/// missing, immutable or superseded is reported in `errors`.
async fn batch_update(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Updates>,
) -> Result<Json<Value>> {
    if req.updates.is_empty() || req.updates.len() > MAX_BATCH {
        return Err(Error::invalid("updates", format!("1 to {MAX_BATCH} items")));
    }
    let mut items = Vec::with_capacity(req.updates.len());
    for (i, raw) in req.updates.into_iter().enumerate() {
        let item = parse_item(raw).map_err(|e| at_item("updates", i, e))?;
        check_update(&item.update).map_err(|e| at_item("updates", i, e))?;
        items.push(item);
    }
    let mut memories = Vec::new();
    let mut errors = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        match apply_update(&engine, &caller, &item.id, item.update).await {
            Ok(m) => memories.push(m),
            Err(e @ (Error::NotFound(_) | Error::Conflict(_) | Error::NotImplemented(_))) => {
                errors.push(json!({"index": index, "id": item.id, "error": e.to_string()}))
            }
            Err(e) => return Err(e),
        }
    }
    let mut out = json!({"updated": memories.len(), "memories": memories});
    if !errors.is_empty() {
        out["errors"] = json!(errors);
    }
    Ok(Json(out))
}

/// One batch item (serde cannot refuse unknown fields beside a flattened
/// struct, so `id` is taken out by hand).
fn parse_item(raw: Value) -> Result<UpdateItem> {
    let Value::Object(mut map) = raw else {
        return Err(Error::invalid("body", "must be an object"));
    };
    let id = match map.remove("id") {
        Some(Value::String(id)) if !id.trim().is_empty() => id,
        _ => return Err(Error::invalid("id", "a memory id is required")),
    };
    let update = serde_json::from_value(Value::Object(map))
        .map_err(|e| Error::invalid("body", e.to_string()))?;
    Ok(UpdateItem { id, update })
}

/// `DELETE /v1/memories/{id}`: `{deleted, id}` (409 for an immutable one).
async fn remove(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    service::memory::delete(&engine, &caller, &id, None).await?;
    Ok(Json(json!({"deleted": true, "id": id})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ids {
    ids: Vec<String>,
}

/// `POST /v1/memories/bulk-delete`: `{deleted}`; immutable memories stay.
/// loomem snapshots the tables first (`POST /v1/snapshots/{name}/rollback`
/// undoes it).
async fn bulk_delete(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Ids>,
) -> Result<Json<Value>> {
    let n = super::delete_ids(
        &engine,
        &caller,
        req.ids,
        "bulk delete through MemoClaw's API",
    )
    .await?;
    Ok(Json(json!({"deleted": n})))
}

// ---------------------------------------------------------------- ingest

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ingest {
    messages: Option<Vec<service::conversation::MessageIn>>,
    text: Option<String>,
    namespace: Option<String>,
    session_id: Option<String>,
    agent_id: Option<String>,
    #[serde(default)]
    auto_relate: bool,
}

/// loomem's conversation ingest (the LLM extractor when configured, else the
/// rules), answered in MemoClaw's counts.
async fn extract_facts(
    engine: &Engine,
    caller: &Caller,
    req: Ingest,
) -> Result<(Value, Vec<String>)> {
    if req.messages.is_none() && req.text.is_none() {
        return Err(Error::invalid("messages", "give messages or text"));
    }
    let tokens_used = req.text.as_deref().map(tokens::count).unwrap_or(0)
        + req
            .messages
            .iter()
            .flatten()
            .map(|m| tokens::count(&m.content))
            .sum::<usize>();
    let done = service::conversation::ingest(
        engine,
        caller,
        service::conversation::IngestRequest {
            content: req.text,
            messages: req.messages,
            stream: Some(stream_of(caller, req.namespace.as_deref())?),
            session_id: req.session_id,
            agent_id: req.agent_id,
            source: Some("memoclaw".into()),
            ..Default::default()
        },
    )
    .await?;
    let answer = json!({
        "memory_ids": done.stored_ids,
        "facts_extracted": done.facts.len(),
        "facts_stored": done.stored_ids.len(),
        "facts_deduplicated": done.facts.iter().filter(|f| f.status == "duplicate").count(),
        "tokens_used": tokens_used,
    });
    Ok((answer, done.stored_ids))
}

/// `POST /v1/ingest`; with `auto_relate`, each stored fact is linked
/// `related_to` the next one from the same conversation.
async fn ingest(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Ingest>,
) -> Result<Json<Value>> {
    let relate = req.auto_relate;
    let (mut answer, ids) = extract_facts(&engine, &caller, req).await?;
    let mut created = 0;
    if relate {
        for pair in ids.windows(2) {
            service::relations::create(
                &engine,
                &caller,
                service::relations::RelateRequest {
                    from_id: pair[0].clone(),
                    to_id: pair[1].clone(),
                    relation: "related_to".into(),
                    weight: None,
                    note: Some("extracted from the same conversation".into()),
                },
            )
            .await?;
            created += 1;
        }
    }
    answer["relations_created"] = json!(created);
    Ok(Json(answer))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Extract {
    messages: Vec<service::conversation::MessageIn>,
    namespace: Option<String>,
    session_id: Option<String>,
    agent_id: Option<String>,
}

/// `POST /v1/memories/extract`.
async fn extract(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Extract>,
) -> Result<Json<Value>> {
    let (answer, _) = extract_facts(
        &engine,
        &caller,
        Ingest {
            messages: Some(req.messages),
            text: None,
            namespace: req.namespace,
            session_id: req.session_id,
            agent_id: req.agent_id,
            auto_relate: false,
        },
    )
    .await?;
    Ok(Json(answer))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Consolidate {
    namespace: Option<String>,
    min_similarity: Option<f32>,
    mode: Option<String>,
    #[serde(default)]
    dry_run: bool,
}

/// `POST /v1/memories/consolidate`: loomem's dream over the namespace (near
/// copies merged into a consolidated memory; the sources stay, superseded).
/// `rule` merges extractively; `llm` lets the configured LLM write the merge.
async fn consolidate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Consolidate>,
) -> Result<Json<Value>> {
    let min_similarity = req.min_similarity.unwrap_or(0.85);
    if !(0.0..=1.0).contains(&min_similarity) {
        return Err(Error::invalid("min_similarity", "must be between 0 and 1"));
    }
    let max_cost_usd = match req.mode.as_deref().unwrap_or("rule") {
        "rule" => Some(0.0),
        "llm" if engine.llm.is_none() => {
            return Err(Error::Conflict(
                "mode `llm` needs an LLM configured ([llm]); use mode `rule`".into(),
            ))
        }
        "llm" => None,
        other => {
            return Err(Error::invalid(
                "mode",
                format!("`{other}`: must be rule or llm"),
            ))
        }
    };
    let report = service::dream::dream(
        &engine,
        &caller,
        service::dream::DreamRequest {
            stream: Some(stream_of(&caller, req.namespace.as_deref())?),
            dry_run: req.dry_run,
            similarity: Some(min_similarity),
            max_cost_usd,
            ..Default::default()
        },
    )
    .await?;
    let clusters: Vec<Value> = report
        .groups
        .iter()
        .map(|g| {
            json!({
                "memory_ids": g.sources,
                "merged_into": (!report.dry_run).then_some(&g.l1_id),
                "content": g.content,
            })
        })
        .collect();
    Ok(Json(json!({
        "clusters_found": report.groups_found,
        "memories_merged": report.facts_merged,
        "memories_created": if report.dry_run { 0 } else { report.groups.len() },
        "dry_run": report.dry_run,
        "clusters": clusters,
    })))
}

// ---------------------------------------------------------------- review

/// Which review category a memory falls in, if any (the first that fits):
/// `stale` — important (≥ 0.7) and untouched for 30 days; `decaying` — not
/// pinned and unused for longer than its type's half-life; `hot` — used at
/// least 3 times, the last within a week; `fresh` — under a week old and
/// never used.
fn category(m: &Value, half_life_days: f64, now: i64) -> Option<&'static str> {
    let at = |k: &str| m[k].as_str().and_then(crate::core::time::parse_instant_str);
    let created = at("created_at").unwrap_or(now);
    let touched = at("last_accessed_at").unwrap_or(created);
    let idle_days = (now - touched) as f64 / DAY_MICROS as f64;
    let uses = m["access_count"].as_i64().unwrap_or(0);
    let importance = m["importance"].as_f64().unwrap_or(0.0);
    if importance >= 0.7 && idle_days >= 30.0 {
        Some("stale")
    } else if m["pinned"] != json!(true) && idle_days >= half_life_days {
        Some("decaying")
    } else if uses >= 3 && idle_days <= 7.0 {
        Some("hot")
    } else if uses == 0 && (now - created) as f64 <= 7.0 * DAY_MICROS as f64 {
        Some("fresh")
    } else {
        None
    }
}

/// `GET /v1/suggested`: memories to review, the most important first, with
/// how many fall in each category.
async fn suggested(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let limit = super::limit_of("limit", q.limit, 10, 100)?;
    if let Some(c) = q.category.as_deref() {
        if !["stale", "fresh", "hot", "decaying"].contains(&c) {
            return Err(Error::invalid(
                "category",
                format!("`{c}`: must be stale, fresh, hot or decaying"),
            ));
        }
    }
    let now = now_micros();
    let views = super::all(&engine, &caller, &q.query(&caller)?).await?;
    let mut counts: BTreeMap<&str, usize> =
        ["stale", "fresh", "hot", "decaying"].map(|c| (c, 0)).into();
    let mut chosen = Vec::new();
    for v in &views {
        let mut m = memory(&caller, v);
        let half_life = engine
            .cfg
            .search
            .half_life(m["memory_type"].as_str().unwrap_or_default());
        let Some(c) = category(&m, half_life, now) else {
            continue;
        };
        *counts.entry(c).or_default() += 1;
        if q.category.as_deref().is_none_or(|want| want == c) {
            m["category"] = json!(c);
            chosen.push(m);
        }
    }
    chosen.sort_by(|a, b| {
        b["importance"]
            .as_f64()
            .unwrap_or(0.0)
            .total_cmp(&a["importance"].as_f64().unwrap_or(0.0))
    });
    let total = chosen.len();
    chosen.truncate(limit);
    Ok(Json(json!({
        "suggested": chosen,
        "categories": counts,
        "total": total,
    })))
}

/// `GET /v1/core-memories`: pinned memories and the most important, then
/// the most used, each once.
async fn core_memories(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let limit = super::limit_of("limit", q.limit, 10, 100)?;
    let base = ListParams {
        sort_by: Some("importance".into()),
        ..q
    }
    .query(&caller)?;
    let mut seen = HashSet::new();
    let mut views = Vec::new();
    for pinned in [Some(true), None] {
        let query = ListQuery {
            pinned: pinned.or(base.pinned),
            ..base.clone()
        };
        for v in super::offset_page(&engine, &caller, &query, 0, limit)
            .await?
            .0
        {
            if seen.insert(v["id"].to_string()) {
                views.push(memory(&caller, &v));
            }
        }
    }
    let key = |m: &Value| {
        (
            m["pinned"] == json!(true),
            m["importance"].as_f64().unwrap_or(0.0),
            m["access_count"].as_i64().unwrap_or(0),
        )
    };
    views.sort_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        kb.0.cmp(&ka.0)
            .then(kb.1.total_cmp(&ka.1))
            .then(kb.2.cmp(&ka.2))
    });
    views.truncate(limit);
    Ok(Json(json!({"total": views.len(), "memories": views})))
}

/// `GET /v1/namespaces`: each namespace with its memories and the last one's
/// time.
async fn namespaces(State(engine): State<Arc<Engine>>, caller: Caller) -> Result<Json<Value>> {
    let held = service::listing::streams(&engine, &caller).await?;
    let list: Vec<Value> = held
        .streams
        .iter()
        .map(|s| {
            json!({
                "name": namespace_of(&caller, &s.stream),
                "count": s.memories,
                "last_memory_at": s.last_write,
            })
        })
        .collect();
    Ok(Json(json!({"total": list.len(), "namespaces": list})))
}

/// `GET /v1/tags`.
async fn tags(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let found = service::listing::tags(&engine, &caller, &q.query(&caller)?).await?;
    let names: Vec<&str> = found.tags.iter().map(|t| t.tag.as_str()).collect();
    Ok(Json(json!({"total": names.len(), "tags": names})))
}

/// `GET /v1/stats`: totals, pinned, never accessed, average importance, and
/// counts by type and by namespace.
async fn stats(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let views = super::all(&engine, &caller, &q.query(&caller)?).await?;
    let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_namespace: BTreeMap<String, usize> = BTreeMap::new();
    let (mut pinned, mut never, mut importance) = (0, 0, 0.0);
    for v in &views {
        let m = memory(&caller, v);
        pinned += usize::from(m["pinned"] == json!(true));
        never += usize::from(m["access_count"].as_i64().unwrap_or(0) == 0);
        importance += m["importance"].as_f64().unwrap_or(0.0);
        *by_type
            .entry(m["memory_type"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
        *by_namespace
            .entry(m["namespace"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    let n = views.len();
    Ok(Json(json!({
        "total_memories": n,
        "pinned_count": pinned,
        "never_accessed": never,
        "avg_importance": if n == 0 { 0.0 } else { round3(importance / n as f64) },
        "by_type": by_type,
        "by_namespace": by_namespace,
    })))
}

// ---------------------------------------------------------------- graph

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewRelation {
    target_id: String,
    relation_type: Option<String>,
    metadata: Option<Value>,
}

/// `POST /v1/memories/{id}/relations`: 201 with the relation.
async fn relate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<NewRelation>,
) -> Result<(StatusCode, Json<Value>)> {
    let note = match req.metadata {
        None | Some(Value::Null) => None,
        Some(m @ Value::Object(_)) => Some(m.to_string()).filter(|s| s != "{}"),
        Some(_) => return Err(Error::invalid("metadata", "must be an object")),
    };
    let made = service::relations::create(
        &engine,
        &caller,
        service::relations::RelateRequest {
            from_id: id,
            to_id: req.target_id,
            relation: req.relation_type.unwrap_or_else(|| "related_to".into()),
            weight: None,
            note,
        },
    )
    .await
    .map_err(renamed_relation)?;
    Ok((StatusCode::CREATED, Json(relation(&made.relation))))
}

/// loomem's field names in a relation error as MemoClaw's.
fn renamed_relation(e: Error) -> Error {
    match e {
        Error::Invalid { field, message } => Error::invalid(
            match field.as_str() {
                "relation" => "relation_type",
                "to_id" => "target_id",
                other => other,
            },
            message,
        ),
        other => other,
    }
}

/// `GET /v1/memories/{id}/relations`.
async fn relations(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    service::edit::get(&engine, &caller, &id).await?;
    Ok(Json(
        json!({"relations": links(&engine, &caller, &id).await?}),
    ))
}

/// `DELETE /v1/memories/{id}/relations/{relation_id}`: 404 unless the
/// relation touches the memory.
async fn unrelate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path((id, relation_id)): Path<(String, String)>,
) -> Result<Json<Value>> {
    let touching = links(&engine, &caller, &id).await?;
    if !touching.iter().any(|r| r["id"] == json!(relation_id)) {
        return Err(Error::NotFound(format!(
            "memory `{id}` has no relation `{relation_id}`"
        )));
    }
    service::relations::delete(&engine, &caller, &relation_id).await?;
    Ok(Json(json!({"deleted": true, "id": relation_id})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphParams {
    depth: Option<usize>,
    limit: Option<usize>,
    relation_types: Option<String>,
}

/// `GET /v1/memories/{id}/graph`: the memories reached from this one over
/// relations (of `relation_types`, if given) within `depth` hops, nearest
/// first, and the relations among them. loomem walks at most 4 hops.
async fn graph(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<GraphParams>,
) -> Result<Json<Value>> {
    let depth = q.depth.unwrap_or(2);
    if !(1..=5).contains(&depth) {
        return Err(Error::invalid("depth", "must be between 1 and 5"));
    }
    let limit = super::limit_of("limit", q.limit, 50, 200)?;
    let types: Option<Vec<&str>> = q.relation_types.as_deref().map(|t| {
        t.split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .collect()
    });
    let sub = service::relations::explore(
        &engine,
        &caller,
        &service::relations::ExploreQuery {
            from: id.clone(),
            stream: None,
            hops: Some(depth.min(4)),
            max_nodes: Some(500),
        },
    )
    .await?;
    let edges: Vec<&service::relations::Edge> = sub
        .edges
        .iter()
        .filter(|e| e.kind != "mentions")
        .filter(|e| types.as_ref().is_none_or(|t| t.contains(&e.kind.as_str())))
        .collect();
    let mut next: HashMap<&str, Vec<&str>> = HashMap::new();
    for e in &edges {
        next.entry(&e.from).or_default().push(&e.to);
        next.entry(&e.to).or_default().push(&e.from);
    }
    // Breadth first over the relations alone.
    let mut reached: Vec<(String, usize)> = vec![(id.clone(), 0)];
    let mut seen: HashSet<&str> = HashSet::from([id.as_str()]);
    let mut queue = VecDeque::from([(id.as_str(), 0)]);
    while let Some((node, d)) = queue.pop_front() {
        if d == depth {
            continue;
        }
        for n in next.get(node).into_iter().flatten() {
            if reached.len() < limit && seen.insert(n) {
                reached.push((n.to_string(), d + 1));
                queue.push_back((n, d + 1));
            }
        }
    }
    let mut nodes = Vec::with_capacity(reached.len());
    for (node, d) in &reached {
        let mut m = memory_by_id(&engine, &caller, node).await?;
        m["depth"] = json!(d);
        nodes.push(m);
    }
    let kept: HashSet<&str> = reached.iter().map(|(n, _)| n.as_str()).collect();
    let edges: Vec<Value> = edges
        .iter()
        .filter(|e| kept.contains(e.from.as_str()) && kept.contains(e.to.as_str()))
        .map(|e| json!({"source_id": e.from, "target_id": e.to, "relation_type": e.kind}))
        .collect();
    Ok(Json(
        json!({"memory_id": id, "nodes": nodes, "edges": edges}),
    ))
}

/// `GET /v1/memories/{id}/history`: every recorded change of the memory and
/// its earlier versions, oldest first.
async fn history(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let h = service::memory::history(&engine, &caller, &id, None).await?;
    let text: HashMap<&str, &str> = h
        .versions
        .iter()
        .map(|v| (v.chunk_id.as_str(), v.content.as_str()))
        .collect();
    let rows: Vec<Value> = h
        .events
        .iter()
        .map(|e| {
            let mut changes = json!({"event": e.event, "reason": e.reason});
            if e.event == "edited" {
                changes["content"] = json!(text.get(e.chunk_id.as_str()));
            }
            json!({
                "id": e.id,
                "memory_id": e.chunk_id,
                "changes": changes,
                "created_at": to_rfc3339(e.created_at),
            })
        })
        .collect();
    Ok(Json(json!({"history": rows})))
}

// ---------------------------------------------------------------- export

/// `GET /v1/export`: the memories matching the filters as a JSON array of
/// memory objects (what `POST /v1/import` reads), CSV or Markdown.
async fn export(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Response> {
    let format = q.format.clone().unwrap_or_else(|| "json".into());
    if !["json", "csv", "markdown"].contains(&format.as_str()) {
        return Err(Error::invalid(
            "format",
            format!("`{format}`: must be json, csv or markdown"),
        ));
    }
    let views = super::all(&engine, &caller, &q.query(&caller)?).await?;
    let memories: Vec<Value> = views.iter().map(|v| memory(&caller, v)).collect();
    let (content_type, body) = match format.as_str() {
        "json" => ("application/json", Value::Array(memories).to_string()),
        "csv" => ("text/csv; charset=utf-8", csv(&memories)),
        _ => ("text/markdown; charset=utf-8", markdown(&memories)),
    };
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

const CSV_COLUMNS: &[&str] = &[
    "id",
    "content",
    "memory_type",
    "namespace",
    "importance",
    "tags",
    "pinned",
    "immutable",
    "session_id",
    "agent_id",
    "expires_at",
    "created_at",
    "updated_at",
];

/// The strings of a JSON array, joined.
fn strings(items: &[Value], sep: &str) -> String {
    items
        .iter()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join(sep)
}

/// A memory object's tags, joined.
fn tag_list(m: &Value, sep: &str) -> String {
    m["metadata"]["tags"]
        .as_array()
        .map(|t| strings(t, sep))
        .unwrap_or_default()
}

fn csv(memories: &[Value]) -> String {
    let cell = |v: &Value| -> String {
        let s = match v {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            Value::Array(items) => strings(items, ";"),
            other => other.to_string(),
        };
        if s.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s
        }
    };
    let mut out = CSV_COLUMNS.join(",") + "\n";
    for m in memories {
        let row: Vec<String> = CSV_COLUMNS
            .iter()
            .map(|c| match *c {
                "tags" => cell(&m["metadata"]["tags"]),
                c => cell(&m[c]),
            })
            .collect();
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

fn markdown(memories: &[Value]) -> String {
    let mut out = String::from("# Memories\n");
    for m in memories {
        let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
        out.push_str(&format!(
            "\n## {} · {} · {}\n\n{}\n\n- importance: {}\n- tags: {}\n- id: {}\n",
            s("namespace"),
            s("memory_type"),
            s("created_at"),
            s("content"),
            m["importance"],
            tag_list(m, ", "),
            s("id"),
        ));
    }
    out
}

/// The fields of an exported memory object that a store request takes.
const IMPORTED: &[&str] = &[
    "content",
    "metadata",
    "importance",
    "namespace",
    "memory_type",
    "session_id",
    "agent_id",
    "expires_at",
    "pinned",
    "immutable",
];

/// `POST /v1/import`: a JSON array of memory objects (as `GET /v1/export`
/// writes them). An object whose id is already stored is skipped, as is a
/// repeat of a stored memory; an object that cannot be stored is skipped and
/// named in `errors`. Ids and creation times are kept.
async fn import(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJsonArray(items): ApiJsonArray,
) -> Result<Json<Value>> {
    const MAX_IMPORT: usize = 10_000;
    if items.len() > MAX_IMPORT {
        return Err(Error::invalid(
            "body",
            format!("at most {MAX_IMPORT} memories a request"),
        ));
    }
    let mut errors: Vec<Value> = Vec::new();
    let mut skipped = 0;
    let mut requests = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        let Value::Object(obj) = item else {
            errors.push(json!({"index": index, "error": "not an object"}));
            continue;
        };
        let id = obj.get("id").and_then(Value::as_str).map(str::to_string);
        if let Some(id) = &id {
            if service::edit::get(&engine, &caller, id).await.is_ok() {
                skipped += 1;
                continue;
            }
        }
        let fields: Map<String, Value> = obj
            .iter()
            .filter(|(k, v)| IMPORTED.contains(&k.as_str()) && !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let parsed = serde_json::from_value::<NewMemory>(Value::Object(fields))
            .map_err(|e| Error::invalid("memory", e.to_string()))
            .and_then(|m| store_request(&caller, m));
        match parsed {
            Ok(mut r) => {
                r.id = id;
                r.created_at = obj.get("created_at").cloned().filter(|v| !v.is_null());
                requests.push((index, r));
            }
            Err(e) => errors.push(json!({"index": index, "error": e.to_string()})),
        }
    }
    let mut imported = 0;
    for chunk in requests.chunks(500) {
        let batch: Vec<_> = chunk.iter().map(|(_, r)| r.clone()).collect();
        let done = store_all(&engine, &caller, batch).await?;
        // An id that is another memory's (in a stream this key cannot see,
        // or an immutable one): the memory is imported under a new id.
        let again: Vec<_> = done
            .conflicts
            .iter()
            .map(|&i| service::memory::StoreRequest {
                id: None,
                ..chunk[i].1.clone()
            })
            .collect();
        let retried = store_all(&engine, &caller, again).await?;
        imported += done.stored + retried.stored;
        skipped += done.duplicates + retried.duplicates;
        let index = |e: &Value| e["index"].as_u64().unwrap_or(0) as usize;
        let first = done
            .errors
            .iter()
            .filter(|e| !done.conflicts.contains(&index(e)))
            .map(|e| (index(e), e));
        let second = retried.errors.iter().map(|e| (done.conflicts[index(e)], e));
        for (at, e) in first.chain(second) {
            errors.push(json!({"index": chunk[at].0, "error": e["error"]}));
        }
    }
    skipped += errors.len();
    let mut out = json!({"imported": imported, "skipped": skipped});
    if !errors.is_empty() {
        out["errors"] = json!(errors);
    }
    Ok(Json(out))
}

// ---------------------------------------------------------------- migrate

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MarkdownFile {
    filename: String,
    content: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Migrate {
    files: Vec<MarkdownFile>,
    namespace: Option<String>,
}

/// The `YYYY-MM-DD` a file's name starts with (a daily note), if any.
fn file_date(filename: &str) -> Option<&str> {
    let stem = filename.rsplit('/').next().unwrap_or(filename);
    let date = stem.get(..10)?;
    crate::core::time::is_date_only(date)
        .then_some(date)
        .filter(|d| crate::core::time::parse_instant_str(d).is_some())
}

/// A markdown file's memories: one per `## ` section (with its heading), or
/// the whole file when it has none; shorter than 5 characters skipped, cut
/// at 8,000 characters.
fn sections(content: &str) -> Vec<(Option<String>, String)> {
    let mut out: Vec<(Option<String>, String)> = Vec::new();
    let mut heading: Option<String> = None;
    let mut body = String::new();
    let mut flush = |heading: &Option<String>, body: &str| {
        let text = match heading {
            Some(h) if body.trim().is_empty() => h.clone(),
            Some(h) => format!("{h}\n\n{}", body.trim()),
            None => body.trim().to_string(),
        };
        if text.chars().count() >= 5 {
            out.push((heading.clone(), text.chars().take(8000).collect()));
        }
    };
    for line in content.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            flush(&heading, &body);
            heading = Some(h.trim().to_string());
            body.clear();
        } else {
            body.push_str(line);
            body.push('\n');
        }
    }
    flush(&heading, &body);
    out
}

/// MemoClaw's type and importance for a migrated section, from its words.
fn classify(text: &str, daily: bool) -> (&'static str, f64) {
    let t = text.to_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| t.contains(w));
    if has(&[
        "correction",
        "actually,",
        "not true",
        "was wrong",
        "corrected",
    ]) {
        ("correction", 0.9)
    } else if has(&["decided", "decision", "we chose", "will use", "instead of"]) {
        ("decision", 0.9)
    } else if has(&["prefer", "likes ", "favorite", "favourite", "dislike"]) {
        ("preference", 0.8)
    } else if has(&["project", "deployed", "release", "milestone", "roadmap"]) {
        ("project", 0.7)
    } else if daily {
        ("observation", 0.6)
    } else {
        ("general", 0.5)
    }
}

/// A tag from a heading: lower-case words joined by `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// `POST /v1/migrate`: markdown files as memories (201). Each section is
/// stored with tags from its heading and the file's date (plus `migrated`
/// and `openclaw`), its type and importance from its words, created at the
/// file's date; a section whose SHA-256 is already stored in the namespace
/// (or earlier in the request) is counted as deduplicated.
async fn migrate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Migrate>,
) -> Result<(StatusCode, Json<Value>)> {
    if req.files.is_empty() || req.files.len() > 10 {
        return Err(Error::invalid("files", "1 to 10 files"));
    }
    let stream = stream_of(&caller, req.namespace.as_deref())?;
    let (mut processed, mut created, mut deduplicated) = (0, 0, 0);
    let mut errors = Vec::new();
    let mut hashes = HashSet::new();
    for file in req.files {
        let date = file_date(&file.filename).map(str::to_string);
        let mut requests = Vec::new();
        for (heading, text) in sections(&file.content) {
            let hash = hex(&Sha256::digest(text.as_bytes()));
            let id = format!(
                "mc-{}",
                &hex(&Sha256::digest(format!("{stream}\n{text}").as_bytes()))[..32]
            );
            if !hashes.insert(hash.clone())
                || service::edit::get(&engine, &caller, &id).await.is_ok()
            {
                deduplicated += 1;
                continue;
            }
            let (memory_type, importance) = classify(&text, date.is_some());
            let mut tags: Vec<String> = heading.as_deref().map(slug).into_iter().collect();
            tags.extend(date.clone());
            tags.extend(["migrated".to_string(), "openclaw".to_string()]);
            tags.retain(|t| !t.is_empty());
            tags.dedup();
            tags.truncate(MAX_TAGS);
            let mut meta = Map::new();
            meta.insert("content_hash".into(), json!(hash));
            meta.insert("source_file".into(), json!(file.filename));
            requests.push(service::memory::StoreRequest {
                id: Some(id),
                content: text,
                stream: Some(stream.clone()),
                title: heading,
                tags,
                memory_type: Some(memory_type.into()),
                importance: Some((importance * IMPORTANCE_SCALE) as f32),
                metadata: Some(kept_metadata(meta, importance)),
                created_at: date.as_ref().map(|d| json!(d)),
                source: Some("migrate".into()),
                ..Default::default()
            });
        }
        match store_all(&engine, &caller, requests).await {
            Ok(done) if done.errors.is_empty() => {
                processed += 1;
                created += done.stored;
                deduplicated += done.duplicates;
            }
            Ok(done) => {
                created += done.stored;
                deduplicated += done.duplicates;
                errors.push(json!({"filename": file.filename, "error": done.errors[0]["error"]}));
            }
            Err(e) => errors.push(json!({"filename": file.filename, "error": e.to_string()})),
        }
    }
    let mut out = json!({
        "files_processed": processed,
        "memories_created": created,
        "memories_deduplicated": deduplicated,
    });
    if !errors.is_empty() {
        out["errors"] = json!(errors);
    }
    Ok((StatusCode::CREATED, Json(out)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_files_split_into_sections_with_their_headings() {
        let s = sections("## User preferences\n\nPrefers dark mode.\n\n## Project update\n\nDeployed v2.1.\n\n## x\n");
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[0].0.as_deref(), Some("User preferences"));
        assert_eq!(s[0].1, "User preferences\n\nPrefers dark mode.");
        assert_eq!(s[1].1, "Project update\n\nDeployed v2.1.");
        let whole = sections("Just a note without headers.");
        assert_eq!(
            whole,
            vec![(None, "Just a note without headers.".to_string())]
        );
        assert!(sections("hey").is_empty());
    }

    #[test]
    fn migrated_sections_get_memoclaws_types_and_importance() {
        assert_eq!(
            classify("Decided to use Postgres", false),
            ("decision", 0.9)
        );
        assert_eq!(classify("Prefers dark mode", false), ("preference", 0.8));
        assert_eq!(
            classify("Deployed v2.1 to production", false),
            ("project", 0.7)
        );
        assert_eq!(classify("Walked the dog", true), ("observation", 0.6));
        assert_eq!(classify("Walked the dog", false), ("general", 0.5));
        assert_eq!(file_date("2026-01-15.md"), Some("2026-01-15"));
        assert_eq!(file_date("decisions.md"), None);
        assert_eq!(slug("User preferences!"), "user-preferences");
    }

    #[test]
    fn csv_cells_are_quoted_when_they_must_be() {
        let m = json!({"id": "a", "content": "say \"hi\", then go", "metadata": {"tags": ["x", "y"]}, "importance": 0.5});
        let out = csv(&[m]);
        let row = out.lines().nth(1).unwrap();
        assert!(row.starts_with("a,\"say \"\"hi\"\", then go\","), "{row}");
        assert!(row.contains(",x;y,"), "{row}");
    }
}
