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

mod activity;
mod graph;
mod transfer;

use activity::{consolidate, core_memories, extract, ingest, namespaces, stats, suggested, tags};
use graph::{graph, history, relate, relations, unrelate};
use transfer::{export, import, migrate};

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
        .map(|(i, m)| {
            store_request(&caller, m).map_err(|e| service::bulk::at_item("memories", i, e))
        })
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
    // A scoped key's streams are its list; only an unscoped key needs the
    // streams that hold memories looked up.
    if let Some(streams) = &caller.streams {
        return Ok(streams.clone());
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
            // `similarity` is the cosine to the query itself.
            vector_feedback: Some(false),
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

/// One item of a batch update (read by [`parse_item`]).
#[derive(Debug)]
struct UpdateItem {
    id: String,
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
        let item = parse_item(raw).map_err(|e| service::bulk::at_item("updates", i, e))?;
        check_update(&item.update).map_err(|e| service::bulk::at_item("updates", i, e))?;
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
