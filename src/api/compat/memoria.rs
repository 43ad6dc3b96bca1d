//! Memoria's REST API (`shared/reference/memoria-api.md`) under
//! `/compat/memoria`: its paths, field names and answers, each mapped onto a
//! loomem service function. A Memoria user is a loomem key; its memories live
//! in the key's default stream. Features loomem lacks answer 501 naming them.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, Uri};
use axum::routing::{any, delete, get, post, put, MethodRouter};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::{ApiJson, ApiQuery};
use crate::app::Engine;
use crate::core::error::{Error, Result};
use crate::core::Caller;
use crate::service;

const BASE: &str = "/compat/memoria";

/// Memoria's routes as loomem serves them (behind the auth middleware).
pub fn routes() -> Vec<(&'static str, MethodRouter<Arc<Engine>>)> {
    vec![
        ("/compat/memoria/v1/memories", get(list).post(store_one)),
        ("/compat/memoria/v1/memories/batch", post(store_batch)),
        ("/compat/memoria/v1/memories/retrieve", post(retrieve)),
        ("/compat/memoria/v1/memories/search", post(search)),
        (
            "/compat/memoria/v1/memories/correct",
            post(correct_by_query),
        ),
        ("/compat/memoria/v1/memories/purge", post(purge)),
        ("/compat/memoria/v1/memories/{id}", delete(forget)),
        ("/compat/memoria/v1/memories/{id}/correct", put(correct)),
        ("/compat/memoria/v1/memories/{id}/feedback", post(feedback)),
        ("/compat/memoria/v1/feedback/stats", get(feedback_stats)),
        ("/compat/memoria/v1/observe", post(observe)),
        ("/compat/memoria/v1/profiles/me", get(profile)),
        ("/compat/memoria/v1/consolidate", post(consolidate)),
        (
            "/compat/memoria/v1/snapshots",
            post(snapshot_create).get(snapshot_list),
        ),
        (
            "/compat/memoria/v1/snapshots/{name}",
            get(snapshot_detail).delete(snapshot_delete),
        ),
        (
            "/compat/memoria/v1/snapshots/{name}/rollback",
            post(snapshot_rollback),
        ),
        (
            "/compat/memoria/v1/branches",
            post(branch_create).get(branch_list),
        ),
        ("/compat/memoria/v1/branches/{name}", delete(branch_drop)),
        (
            "/compat/memoria/v1/branches/{name}/checkout",
            post(branch_checkout),
        ),
        ("/compat/memoria/v1/branches/{name}/diff", get(branch_diff)),
        (
            "/compat/memoria/v1/branches/{name}/merge",
            post(branch_merge),
        ),
        ("/compat/memoria/{*rest}", any(unsupported)),
    ]
}

/// Memoria's features with no loomem equivalent: a path prefix and the name
/// the 501 gives.
pub const UNSUPPORTED: &[(&str, &str)] = &[
    ("/v1/snapshots/", "snapshot diffs"),
    (
        "/v1/governance",
        "governance (quarantine and stale cleanup)",
    ),
    (
        "/v1/reflect",
        "reflection through Memoria's API (use loomem's POST /v1/reflect)",
    ),
    (
        "/v1/extract-entities",
        "LLM entity extraction through Memoria's API (use loomem's POST /v1/extract-entities)",
    ),
    (
        "/v1/entities",
        "the entity list (use loomem's GET /v1/graph/entity/{name} or SQL over `entities`)",
    ),
    ("/v1/feedback/by-tier", "feedback by trust tier"),
    ("/v1/retrieval-params", "retrieval parameter tuning"),
    ("/v1/sessions/", "episodic session summaries"),
    ("/v1/tasks/", "task polling"),
    ("/auth/keys", "Memoria's key API (use loomem's /admin/keys)"),
    ("/admin/", "Memoria's admin API"),
];

/// The Memoria user: the key, working in the branch it checked out (its
/// memories are that branch's stream, and only those).
pub struct User(Caller);

impl FromRequestParts<Arc<Engine>> for User {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, engine: &Arc<Engine>) -> Result<Self> {
        let caller = Caller::from_request_parts(parts, engine).await?;
        Ok(User(match service::branch::checked_out(engine, &caller) {
            Some(stream) => Caller {
                streams: Some(vec![stream]),
                ..caller
            },
            None => caller,
        }))
    }
}

/// Anything else under `/compat/memoria`: 501 for a Memoria feature loomem
/// lacks, 404 for a path Memoria does not have.
async fn unsupported(uri: Uri) -> Error {
    let path = uri.path().strip_prefix(BASE).unwrap_or(uri.path());
    match UNSUPPORTED
        .iter()
        .find(|(prefix, _)| path.starts_with(prefix))
    {
        Some((_, feature)) => Error::NotImplemented(format!(
            "Memoria's {feature} is not available in loomem's Memoria compatibility API"
        )),
        None => Error::NotFound(format!("Memoria has no route `{path}`")),
    }
}

/// A loomem answer passed through as it is.
fn as_json<T: serde::Serialize>(answer: T) -> Result<Json<Value>> {
    serde_json::to_value(answer)
        .map(Json)
        .map_err(|e| Error::Internal(e.to_string()))
}

/// A loomem memory (as `GET /v1/memories/{id}` shows it) as Memoria's
/// MemoryResponse.
fn memory(view: &Value) -> Value {
    json!({
        "memory_id": view["id"],
        "content": view["content"],
        "memory_type": view["memory_type"],
        "session_id": view["session_id"],
        "confidence": view["confidence"],
        "created_at": view["created_at"],
        "updated_at": view["updated_at"],
    })
}

async fn memory_by_id(engine: &Engine, caller: &Caller, id: &str) -> Result<Value> {
    Ok(memory(&service::edit::get(engine, caller, id).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    limit: Option<usize>,
    cursor: Option<String>,
    memory_type: Option<String>,
}

/// `GET /v1/memories`: `{items, next_cursor}`.
async fn list(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let page = service::listing::page(
        &engine,
        &caller,
        &service::listing::ListQuery {
            types: q.memory_type,
            limit: Some(q.limit.unwrap_or(50)),
            cursor: q.cursor,
            ..Default::default()
        },
    )
    .await?;
    Ok(Json(json!({
        "items": page.memories.iter().map(memory).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewMemory {
    content: String,
    memory_type: Option<String>,
    session_id: Option<String>,
}

impl NewMemory {
    fn request(self) -> service::memory::StoreRequest {
        service::memory::StoreRequest {
            content: self.content,
            memory_type: Some(self.memory_type.unwrap_or_else(|| "semantic".into())),
            session_id: self.session_id,
            ..Default::default()
        }
    }
}

/// `POST /v1/memories`: 201 with the stored memory.
async fn store_one(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    ApiJson(req): ApiJson<NewMemory>,
) -> Result<(StatusCode, Json<Value>)> {
    let stored = service::memory::store(&engine, &caller, req.request()).await?;
    Ok((
        StatusCode::CREATED,
        Json(memory_by_id(&engine, &caller, &stored.id).await?),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    memories: Vec<NewMemory>,
}

/// `POST /v1/memories/batch`: 201 with `{items}`, one per memory in order
/// (an item that could not be stored has `error`).
async fn store_batch(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    ApiJson(req): ApiJson<Batch>,
) -> Result<(StatusCode, Json<Value>)> {
    let answer = service::bulk::store(
        &engine,
        &caller,
        service::bulk::BatchStoreRequest {
            memories: req.memories.into_iter().map(NewMemory::request).collect(),
            wait: None,
        },
    )
    .await?;
    let mut items = Vec::with_capacity(answer.results.len());
    for r in &answer.results {
        let id = r.duplicate_of.as_ref().or(r.id.as_ref());
        items.push(match (id, &r.error) {
            (Some(id), None) => memory_by_id(&engine, &caller, id).await?,
            _ => json!({"memory_id": r.id, "error": r.error}),
        });
    }
    Ok((StatusCode::CREATED, Json(json!({ "items": items }))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Retrieve {
    query: String,
    top_k: Option<usize>,
    memory_types: Option<Vec<String>>,
    session_id: Option<String>,
    /// false, true (timing), "verbose" or "analyze" (loomem's trace).
    explain: Option<Value>,
}

/// Memoria's retrieve and search: loomem's hybrid search; with a
/// `session_id`, retrieve puts that session's memories first.
async fn find(engine: &Engine, caller: &Caller, req: Retrieve, by_session: bool) -> Result<Value> {
    let explain = match &req.explain {
        None | Some(Value::Bool(false)) | Some(Value::Null) => None,
        Some(Value::Bool(true)) => Some("timing"),
        Some(Value::String(s)) if s == "verbose" || s == "analyze" => Some("trace"),
        Some(_) => {
            return Err(Error::invalid(
                "explain",
                "must be false, true, \"verbose\" or \"analyze\"",
            ))
        }
    };
    let started = std::time::Instant::now();
    let ask = |session_id: Option<String>| service::search::SearchRequest {
        query: req.query.clone(),
        top_k: req.top_k,
        memory_types: req.memory_types.clone(),
        session_id,
        trace: explain == Some("trace"),
        ..Default::default()
    };
    let mut found =
        service::search::search_on_reads(&engine.services, caller.clone(), ask(None)).await?;
    if let (true, Some(session)) = (by_session, &req.session_id) {
        // The session's own hits first, then the rest in their order.
        let own = service::search::search_on_reads(
            &engine.services,
            caller.clone(),
            ask(Some(session.clone())),
        )
        .await?;
        let first: std::collections::HashSet<String> =
            own.results.iter().map(|r| r.chunk_id.clone()).collect();
        let rest = found
            .results
            .into_iter()
            .filter(|r| !first.contains(&r.chunk_id));
        let mut merged: Vec<_> = own.results.into_iter().chain(rest).collect();
        merged.truncate(req.top_k.unwrap_or(10));
        found.results = merged;
    }
    let mut results = Vec::with_capacity(found.results.len());
    for r in &found.results {
        let mut m = memory_by_id(engine, caller, &r.chunk_id).await?;
        m["score"] = json!(r.score_final);
        results.push(m);
    }
    let mut out = json!({ "results": results });
    match explain {
        Some("timing") => out["explain"] = json!({"duration_ms": started.elapsed().as_millis()}),
        Some(_) => {
            out["explain"] = json!({
                "duration_ms": started.elapsed().as_millis(),
                "trace": found.trace_metadata,
            })
        }
        None => {}
    }
    Ok(out)
}

/// `POST /v1/memories/retrieve`.
async fn retrieve(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    ApiJson(req): ApiJson<Retrieve>,
) -> Result<Json<Value>> {
    Ok(Json(find(&engine, &caller, req, true).await?))
}

/// `POST /v1/memories/search`: as retrieve, without session priority.
async fn search(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    ApiJson(req): ApiJson<Retrieve>,
) -> Result<Json<Value>> {
    Ok(Json(find(&engine, &caller, req, false).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Correction {
    query: Option<String>,
    new_content: String,
    reason: Option<String>,
}

/// A correction as Memoria answers it: the new memory and what it matched.
async fn corrected(
    engine: &Engine,
    caller: &Caller,
    done: service::edit::Corrected,
) -> Result<Json<Value>> {
    let id = done
        .id
        .clone()
        .unwrap_or_else(|| done.matched_memory_id.clone());
    let mut m = memory_by_id(engine, caller, &id).await?;
    m["matched_memory_id"] = json!(done.matched_memory_id);
    m["status"] = json!(done.status);
    Ok(Json(m))
}

/// `PUT /v1/memories/{id}/correct`.
async fn correct(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<Correction>,
) -> Result<Json<Value>> {
    if req.query.is_some() {
        return Err(Error::invalid("query", "is for POST /v1/memories/correct"));
    }
    let done = service::edit::correct(
        &engine,
        &caller,
        &id,
        service::edit::CorrectRequest {
            new_content: req.new_content,
            reason: req.reason,
            dry_run: false,
        },
    )
    .await?;
    corrected(&engine, &caller, done).await
}

/// `POST /v1/memories/correct`: the best match of `query` is corrected.
async fn correct_by_query(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    ApiJson(req): ApiJson<Correction>,
) -> Result<Json<Value>> {
    let query = req
        .query
        .ok_or_else(|| Error::invalid("query", "is required"))?;
    let done = service::edit::correct_by_query(
        &engine,
        &caller,
        service::edit::CorrectByQueryRequest {
            query,
            new_content: req.new_content,
            stream: None,
            reason: req.reason,
            dry_run: false,
        },
    )
    .await?;
    corrected(&engine, &caller, done).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reason {
    reason: Option<String>,
}

/// `DELETE /v1/memories/{id}?reason=…`: the reason goes into the memory's
/// history (through loomem's bulk delete of one id, which also snapshots).
async fn forget(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<Reason>,
) -> Result<Json<Value>> {
    let done = service::bulk::delete(
        &engine,
        &caller,
        service::bulk::BulkDeleteRequest {
            ids: Some(vec![id.clone()]),
            reason: q.reason,
            ..Default::default()
        },
    )
    .await?;
    if !done.not_found.is_empty() {
        return Err(Error::NotFound(format!("memory `{id}` not found")));
    }
    if !done.kept_immutable.is_empty() {
        return Err(Error::Conflict(format!("memory `{id}` is immutable")));
    }
    Ok(Json(json!({"deleted": true, "memory_id": id})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Purge {
    memory_ids: Option<Vec<String>>,
    memory_types: Option<Vec<String>>,
    before: Option<String>,
    reason: Option<String>,
}

/// `POST /v1/memories/purge`: `{purged, snapshot_name}`; the snapshot is
/// taken before anything goes.
async fn purge(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    ApiJson(req): ApiJson<Purge>,
) -> Result<Json<Value>> {
    let filtered = req.memory_types.is_some() || req.before.is_some();
    let filter = filtered.then(|| service::listing::ListQuery {
        types: req.memory_types.map(|t| t.join(",")),
        created_before: req.before,
        ..Default::default()
    });
    if req.memory_ids.is_none() && filter.is_none() {
        return Err(Error::invalid(
            "memory_ids",
            "give memory_ids, memory_types or before (a purge of everything is POST /v1/purge-namespace)",
        ));
    }
    let done = service::bulk::delete(
        &engine,
        &caller,
        service::bulk::BulkDeleteRequest {
            ids: req.memory_ids,
            filter,
            reason: req.reason,
            dry_run: false,
            confirmed: true,
        },
    )
    .await?;
    Ok(Json(json!({
        "purged": done.deleted_count,
        "snapshot_name": done.snapshot,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Signal {
    signal: String,
    context: Option<String>,
}

/// Memoria's signals as loomem's usefulness (0–4) and harm.
fn signal(s: &str) -> Result<(i64, bool)> {
    match s {
        "useful" => Ok((3, false)),
        "irrelevant" => Ok((0, false)),
        "outdated" => Ok((1, false)),
        "wrong" => Ok((0, true)),
        _ => Err(Error::invalid(
            "signal",
            "must be useful, irrelevant, outdated or wrong",
        )),
    }
}

/// `POST /v1/memories/{id}/feedback`: 201 with `{feedback_id}`.
async fn feedback(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<Signal>,
) -> Result<(StatusCode, Json<Value>)> {
    let (usefulness, harmful) = signal(&req.signal)?;
    let _ = req.context; // Memoria keeps it; loomem's feedback has no note.
    let done = service::feedback::record(
        &engine,
        &caller,
        service::feedback::FeedbackRequest {
            chunk_id: id,
            usefulness,
            harmful,
        },
    )
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"feedback_id": done.feedback_id})),
    ))
}

/// `GET /v1/feedback/stats`: counts per Memoria signal (loomem's own
/// feedback counted by the same mapping: usefulness 2–4 is useful, 1
/// outdated, 0 irrelevant, harmful wrong).
async fn feedback_stats(State(engine): State<Arc<Engine>>, caller: Caller) -> Result<Json<Value>> {
    let s = service::feedback::stats(
        &engine,
        &caller,
        &service::feedback::StatsQuery {
            stream: None,
            top: Some(0),
        },
    )
    .await?;
    let u = s.by_usefulness;
    let wrong = s.harmful.min(u[0]);
    Ok(Json(json!({
        "useful": u[2] + u[3] + u[4],
        "irrelevant": u[0] - wrong,
        "outdated": u[1],
        "wrong": wrong,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Observe {
    messages: Vec<service::conversation::MessageIn>,
    session_id: Option<String>,
}

/// `POST /v1/observe`: the conversation's facts, stored (loomem's ingest).
async fn observe(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    ApiJson(req): ApiJson<Observe>,
) -> Result<Json<Value>> {
    let done = service::conversation::ingest(
        &engine,
        &caller,
        service::conversation::IngestRequest {
            messages: Some(req.messages),
            session_id: req.session_id,
            ..Default::default()
        },
    )
    .await?;
    let memories: Vec<Value> = done
        .facts
        .iter()
        .map(|f| {
            json!({
                "memory_id": f.existing_id.as_ref().unwrap_or(&f.id),
                "content": f.content,
                "memory_type": f.memory_type,
                "status": f.status,
            })
        })
        .collect();
    Ok(Json(
        json!({ "memories": memories, "stored": done.stored_ids.len() }),
    ))
}

/// `GET /v1/profiles/me`: loomem's profile of the key's default stream.
async fn profile(State(engine): State<Arc<Engine>>, User(caller): User) -> Result<Json<Value>> {
    let p = service::context::profile(&engine, &caller, None).await?;
    as_json(p)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Force {
    force: Option<bool>,
}

/// `POST /v1/consolidate?force=…`: loomem's dream over the key's default
/// stream (near copies merged, contradictions resolved). loomem has no
/// cooldown: `force` is accepted and changes nothing.
async fn consolidate(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    ApiQuery(q): ApiQuery<Force>,
) -> Result<Json<Value>> {
    let _ = q.force;
    let report = service::dream::dream(&engine, &caller, Default::default()).await?;
    as_json(report)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSnapshot {
    name: String,
    description: Option<String>,
}

/// `POST /v1/snapshots`: loomem snapshots every table, so only an admin key
/// may take one (403 otherwise).
async fn snapshot_create(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    ApiJson(req): ApiJson<NewSnapshot>,
) -> Result<(StatusCode, Json<Value>)> {
    caller.require_admin()?;
    let _ = req.description; // loomem's snapshots are named, not described.
    let s = service::snapshot::create(&engine.store, &req.name).await?;
    Ok((StatusCode::CREATED, Json(snapshot_view(&s))))
}

fn snapshot_view(s: &service::snapshot::Snapshot) -> Value {
    let mut v = serde_json::to_value(s).unwrap_or_default();
    v["snapshot_name"] = v["name"].clone();
    v
}

/// `GET /v1/snapshots`.
async fn snapshot_list(State(engine): State<Arc<Engine>>, caller: Caller) -> Result<Json<Value>> {
    caller.require_admin()?;
    let all = service::snapshot::list(&engine.store).await?;
    Ok(Json(Value::Array(all.iter().map(snapshot_view).collect())))
}

/// `GET /v1/snapshots/{name}`: the snapshot (loomem has no per-memory
/// detail of a snapshot; `detail`, `limit`, `offset` are accepted).
async fn snapshot_detail(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    caller.require_admin()?;
    let all = service::snapshot::list(&engine.store).await?;
    all.iter()
        .find(|s| s.name == name)
        .map(|s| Json(snapshot_view(s)))
        .ok_or_else(|| Error::NotFound(format!("no snapshot `{name}`")))
}

/// `DELETE /v1/snapshots/{name}`.
async fn snapshot_delete(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    caller.require_admin()?;
    service::snapshot::delete(&engine.store, &name).await?;
    Ok(Json(json!({ "deleted": name })))
}

/// `POST /v1/snapshots/{name}/rollback`.
async fn snapshot_rollback(
    State(engine): State<Arc<Engine>>,
    User(caller): User,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    caller.require_admin()?;
    let r = service::snapshot::rollback(&engine, &name).await?;
    as_json(r)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewBranch {
    name: String,
}

/// `POST /v1/branches`: a branch of the key's default stream (loomem copies
/// its memories into the stream `<stream>~<name>`), 201.
async fn branch_create(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<NewBranch>,
) -> Result<(StatusCode, Json<Value>)> {
    let made = service::branch::create(
        &engine,
        &caller,
        service::branch::NewBranch {
            name: req.name,
            stream: None,
        },
    )
    .await?;
    Ok((StatusCode::CREATED, as_json(made)?))
}

/// `GET /v1/branches`: `main` and each branch, the checked-out one `active`.
async fn branch_list(State(engine): State<Arc<Engine>>, caller: Caller) -> Result<Json<Value>> {
    let active = service::branch::checked_out(&engine, &caller);
    let found = service::branch::list(&engine, &caller, &Default::default()).await?;
    let mut out = vec![json!({"name": "main", "active": active.is_none()})];
    for b in found.branches {
        let mut v = serde_json::to_value(&b).unwrap_or_default();
        v["active"] = json!(active.as_deref() == Some(b.stream.as_str()));
        out.push(v);
    }
    Ok(Json(json!({ "branches": out })))
}

/// `POST /v1/branches/{name}/checkout`: the key's Memoria calls work in the
/// branch from now on (`main` goes back).
async fn branch_checkout(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    service::branch::checkout(&engine, &caller, &name).await?;
    Ok(Json(json!({"branch": name, "active": true})))
}

/// `GET /v1/branches/{name}/diff`: what the branch added, changed and
/// removed against main.
async fn branch_diff(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    as_json(service::branch::diff(&engine, &caller, &name, &Default::default()).await?)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Merge {
    strategy: Option<String>,
}

/// `POST /v1/branches/{name}/merge` `{strategy}`: `append` (the branch's
/// new and changed memories) or `mirror` (its removals too).
async fn branch_merge(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(name): Path<String>,
    ApiJson(req): ApiJson<Merge>,
) -> Result<Json<Value>> {
    let done = service::branch::merge(
        &engine,
        &caller,
        &name,
        service::branch::MergeRequest {
            stream: None,
            strategy: req.strategy,
            dry_run: false,
        },
    )
    .await?;
    as_json(done)
}

/// `DELETE /v1/branches/{name}`: drop it (the key goes back to main if it
/// had it checked out).
async fn branch_drop(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    as_json(service::branch::drop(&engine, &caller, &name, &Default::default()).await?)
}
