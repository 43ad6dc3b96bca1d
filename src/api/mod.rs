//! The REST API: `router(engine)` builds every route. Handlers are thin: parse,
//! call one service function, shape the answer.

mod branches;
mod compat;
mod context;
mod error;
mod graph;
mod jobs;
mod keys;
mod memories;
mod oauth;
pub mod openapi;
mod request;
pub mod server;
mod tending;
mod ui;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::{middleware, Json, Router};

use crate::app::Engine;
use crate::core::error::{Error, Result};
use crate::core::{Caller, Role};
use crate::service::reembed;
use crate::service::search::{self, SearchRequest, SearchResponse};
use crate::service::status;

pub use request::{parse_json, ApiJson, ApiJsonArray, ApiQuery};

/// Every protected route (all but `/health`), in one table: the router is
/// built from it and the attack suite reads its paths, so a route cannot be
/// added without the suite knowing. `/mcp` is nested beside it.
fn routes() -> Vec<(&'static str, MethodRouter<Arc<Engine>>)> {
    vec![
        ("/v1/store", post(memories::store)),
        ("/v1/ingest", post(memories::ingest)),
        ("/v1/delete", post(memories::delete)),
        ("/api/memories/{id}", delete(memories::delete_rest)),
        ("/v1/purge-namespace", post(memories::purge)),
        ("/v1/import", post(memories::import)),
        ("/v1/memories/{id}/history", get(memories::history)),
        (
            "/v1/memories/{id}",
            get(memories::get_one).patch(memories::edit),
        ),
        ("/v1/memories", get(memories::list)),
        ("/v1/memories/count", get(memories::count)),
        (
            "/v1/memories/batch",
            post(memories::batch_store).patch(memories::batch_edit),
        ),
        ("/v1/memories/bulk-delete", post(memories::bulk_delete)),
        ("/v1/memories/{id}/correct", put(memories::correct)),
        ("/v1/memories/correct", post(memories::correct_by_query)),
        ("/v1/streams", get(memories::streams)),
        ("/v1/tags", get(memories::tags)),
        ("/v1/search", post(search_handler)),
        ("/v1/feedback", post(tending::feedback)),
        ("/v1/feedback/stats", get(tending::feedback_stats)),
        ("/v1/context-pack", post(context::context_pack)),
        ("/v1/ambient", post(context::ambient)),
        ("/v1/profile", get(context::profile)),
        ("/v1/generate-memory-md", get(context::memory_md)),
        ("/v1/graph/entity/{name}", get(graph::graph_entity)),
        ("/v1/graph/stats", get(graph::graph_stats)),
        ("/v1/graph/explore", get(graph::explore)),
        ("/v1/graph/path", get(graph::path)),
        ("/v1/graph/analyze", post(graph::analyze)),
        ("/v1/graph/rank", get(graph::rank)),
        ("/v1/graph/communities", get(graph::communities)),
        (
            "/v1/relations",
            post(graph::relate).get(graph::relations_list),
        ),
        ("/v1/relations/{id}", delete(graph::unrelate)),
        ("/v1/memories/{id}/related", get(graph::related)),
        ("/v1/associate", post(graph::associate)),
        ("/v1/reflect", post(tending::reflect)),
        ("/v1/dream", post(tending::dream)),
        ("/v1/sql", post(sql_handler)),
        ("/v1/export", post(export_handler)),
        ("/v1/embed-missing", post(embed_missing)),
        ("/v1/re-embed-all", post(re_embed_all)),
        ("/v1/jobs/{id}", get(job_status).delete(job_cancel)),
        ("/v1/jobs", get(jobs::runs)),
        ("/admin/jobs/{name}/run", post(jobs::run)),
        ("/admin/jobs", get(jobs::schedule)),
        (
            "/v1/dead-letters/{id}/retry",
            post(memories::retry_dead_letter),
        ),
        (
            "/v1/snapshots",
            post(jobs::snapshot_create).get(jobs::snapshot_list),
        ),
        ("/v1/snapshots/{name}", delete(jobs::snapshot_delete)),
        ("/v1/branches", post(branches::create).get(branches::list)),
        ("/v1/branches/{name}", delete(branches::drop)),
        ("/v1/branches/{name}/diff", get(branches::diff)),
        ("/v1/branches/{name}/merge", post(branches::merge)),
        (
            "/v1/snapshots/{name}/rollback",
            post(jobs::snapshot_rollback),
        ),
        ("/v1/boost", post(jobs::boost)),
        ("/v1/retag-all", post(jobs::retag_all)),
        ("/v1/score-all", post(jobs::score_all)),
        ("/v1/reset-importance", post(jobs::reset_importance)),
        ("/v1/reset-backfill", post(jobs::reset_backfill)),
        ("/v1/build-graph", post(jobs::build_graph)),
        ("/v1/extract-entities", post(jobs::extract_entities)),
        ("/admin/workers/pause", post(jobs::pause)),
        ("/admin/workers/resume", post(jobs::resume)),
        ("/admin/workers/status", get(jobs::status)),
        ("/admin/keys", post(keys::create).get(keys::list)),
        ("/admin/keys/{id}/rotate", post(keys::rotate)),
        ("/admin/keys/{id}", delete(keys::revoke)),
        ("/v1/status", get(status)),
        ("/v1/namespaces", get(namespaces)),
        ("/v1/whoami", get(whoami)),
        ("/openapi.json", get(openapi_json)),
        ("/metrics", get(metrics)),
    ]
    .into_iter()
    .chain(compat::memoclaw::routes())
    .chain(compat::memoria::routes())
    .chain(compat::neuroloom::routes())
    .collect()
}

/// The role each operation needs, by method and route: one table for the
/// whole router. An operation missing here needs an admin key (fail closed);
/// a test checks every operation the router answers has an entry.
pub fn needs() -> Vec<(&'static str, &'static str, Role)> {
    use Role::{Admin, Reader, Writer};
    vec![
        ("POST", "/v1/store", Writer),
        ("POST", "/v1/ingest", Writer),
        ("POST", "/v1/delete", Writer),
        ("DELETE", "/api/memories/{id}", Writer),
        ("POST", "/v1/purge-namespace", Writer),
        ("POST", "/v1/import", Writer),
        ("GET", "/v1/memories/{id}/history", Reader),
        ("GET", "/v1/memories/{id}", Reader),
        ("PATCH", "/v1/memories/{id}", Writer),
        ("GET", "/v1/memories", Reader),
        ("GET", "/v1/memories/count", Reader),
        ("POST", "/v1/memories/batch", Writer),
        ("PATCH", "/v1/memories/batch", Writer),
        ("POST", "/v1/memories/bulk-delete", Writer),
        ("PUT", "/v1/memories/{id}/correct", Writer),
        ("POST", "/v1/memories/correct", Writer),
        ("GET", "/v1/streams", Reader),
        ("GET", "/v1/tags", Reader),
        ("POST", "/v1/search", Reader),
        ("POST", "/v1/feedback", Writer),
        ("GET", "/v1/feedback/stats", Reader),
        ("POST", "/v1/context-pack", Reader),
        ("POST", "/v1/ambient", Reader),
        ("GET", "/v1/profile", Reader),
        ("GET", "/v1/generate-memory-md", Reader),
        ("GET", "/v1/graph/entity/{name}", Reader),
        ("GET", "/v1/graph/stats", Reader),
        ("GET", "/v1/graph/explore", Reader),
        ("GET", "/v1/graph/path", Reader),
        ("POST", "/v1/graph/analyze", Writer),
        ("GET", "/v1/graph/rank", Reader),
        ("GET", "/v1/graph/communities", Reader),
        ("POST", "/v1/relations", Writer),
        ("GET", "/v1/relations", Reader),
        ("DELETE", "/v1/relations/{id}", Writer),
        ("GET", "/v1/memories/{id}/related", Reader),
        ("POST", "/v1/associate", Reader),
        ("POST", "/v1/reflect", Writer),
        ("POST", "/v1/dream", Writer),
        ("POST", "/v1/sql", Reader),
        ("POST", "/v1/export", Reader),
        ("POST", "/v1/embed-missing", Writer),
        ("POST", "/v1/re-embed-all", Writer),
        ("GET", "/v1/jobs/{id}", Reader),
        ("DELETE", "/v1/jobs/{id}", Writer),
        ("GET", "/v1/jobs", Admin),
        ("POST", "/admin/jobs/{name}/run", Admin),
        ("GET", "/admin/jobs", Admin),
        ("POST", "/v1/dead-letters/{id}/retry", Writer),
        ("POST", "/v1/snapshots", Admin),
        ("GET", "/v1/snapshots", Admin),
        ("DELETE", "/v1/snapshots/{name}", Admin),
        ("POST", "/v1/snapshots/{name}/rollback", Admin),
        ("POST", "/v1/branches", Writer),
        ("GET", "/v1/branches", Reader),
        ("DELETE", "/v1/branches/{name}", Writer),
        ("GET", "/v1/branches/{name}/diff", Reader),
        ("POST", "/v1/branches/{name}/merge", Writer),
        ("POST", "/v1/boost", Writer),
        ("POST", "/v1/retag-all", Writer),
        ("POST", "/v1/score-all", Writer),
        ("POST", "/v1/reset-importance", Writer),
        ("POST", "/v1/reset-backfill", Writer),
        ("POST", "/v1/build-graph", Writer),
        ("POST", "/v1/extract-entities", Writer),
        ("POST", "/admin/workers/pause", Admin),
        ("POST", "/admin/workers/resume", Admin),
        ("GET", "/admin/workers/status", Admin),
        ("POST", "/admin/keys", Admin),
        ("GET", "/admin/keys", Admin),
        ("POST", "/admin/keys/{id}/rotate", Admin),
        ("DELETE", "/admin/keys/{id}", Admin),
        ("GET", "/v1/status", Reader),
        ("GET", "/v1/namespaces", Reader),
        ("GET", "/v1/whoami", Reader),
        ("GET", "/openapi.json", Reader),
        ("GET", "/metrics", Admin),
        // MemoClaw's API (`compat::memoclaw`).
        ("POST", "/compat/memoclaw/v1/store", Writer),
        ("POST", "/compat/memoclaw/v1/store/batch", Writer),
        ("POST", "/compat/memoclaw/v1/recall", Reader),
        ("POST", "/compat/memoclaw/v1/search", Reader),
        ("POST", "/compat/memoclaw/v1/context", Reader),
        ("GET", "/compat/memoclaw/v1/memories", Reader),
        ("GET", "/compat/memoclaw/v1/memories/count", Reader),
        ("POST", "/compat/memoclaw/v1/memories/bulk-delete", Writer),
        ("PATCH", "/compat/memoclaw/v1/memories/batch", Writer),
        ("POST", "/compat/memoclaw/v1/memories/extract", Writer),
        ("POST", "/compat/memoclaw/v1/memories/consolidate", Writer),
        ("GET", "/compat/memoclaw/v1/memories/{id}", Reader),
        ("PATCH", "/compat/memoclaw/v1/memories/{id}", Writer),
        ("DELETE", "/compat/memoclaw/v1/memories/{id}", Writer),
        ("GET", "/compat/memoclaw/v1/memories/{id}/history", Reader),
        ("GET", "/compat/memoclaw/v1/memories/{id}/graph", Reader),
        ("GET", "/compat/memoclaw/v1/memories/{id}/relations", Reader),
        (
            "POST",
            "/compat/memoclaw/v1/memories/{id}/relations",
            Writer,
        ),
        (
            "DELETE",
            "/compat/memoclaw/v1/memories/{id}/relations/{relation_id}",
            Writer,
        ),
        ("POST", "/compat/memoclaw/v1/ingest", Writer),
        ("GET", "/compat/memoclaw/v1/suggested", Reader),
        ("GET", "/compat/memoclaw/v1/export", Reader),
        ("POST", "/compat/memoclaw/v1/import", Writer),
        ("POST", "/compat/memoclaw/v1/migrate", Writer),
        ("GET", "/compat/memoclaw/v1/namespaces", Reader),
        ("GET", "/compat/memoclaw/v1/core-memories", Reader),
        ("GET", "/compat/memoclaw/v1/tags", Reader),
        ("GET", "/compat/memoclaw/v1/stats", Reader),
        // Memoria's API (`compat::memoria`).
        ("GET", "/compat/memoria/v1/memories", Reader),
        ("POST", "/compat/memoria/v1/memories", Writer),
        ("POST", "/compat/memoria/v1/memories/batch", Writer),
        ("POST", "/compat/memoria/v1/memories/retrieve", Reader),
        ("POST", "/compat/memoria/v1/memories/search", Reader),
        ("POST", "/compat/memoria/v1/memories/correct", Writer),
        ("POST", "/compat/memoria/v1/memories/purge", Writer),
        ("DELETE", "/compat/memoria/v1/memories/{id}", Writer),
        ("PUT", "/compat/memoria/v1/memories/{id}/correct", Writer),
        ("POST", "/compat/memoria/v1/memories/{id}/feedback", Writer),
        ("GET", "/compat/memoria/v1/feedback/stats", Reader),
        ("POST", "/compat/memoria/v1/observe", Writer),
        ("GET", "/compat/memoria/v1/profiles/me", Reader),
        ("POST", "/compat/memoria/v1/consolidate", Writer),
        ("POST", "/compat/memoria/v1/snapshots", Admin),
        ("GET", "/compat/memoria/v1/snapshots", Admin),
        ("GET", "/compat/memoria/v1/snapshots/{name}", Admin),
        ("DELETE", "/compat/memoria/v1/snapshots/{name}", Admin),
        (
            "POST",
            "/compat/memoria/v1/snapshots/{name}/rollback",
            Admin,
        ),
        ("POST", "/compat/memoria/v1/branches", Writer),
        ("GET", "/compat/memoria/v1/branches", Reader),
        ("DELETE", "/compat/memoria/v1/branches/{name}", Writer),
        (
            "POST",
            "/compat/memoria/v1/branches/{name}/checkout",
            Reader,
        ),
        ("GET", "/compat/memoria/v1/branches/{name}/diff", Reader),
        ("POST", "/compat/memoria/v1/branches/{name}/merge", Writer),
        // Neuroloom's API (`compat::neuroloom`).
        ("POST", "/compat/neuroloom/api/v1/memories/store", Writer),
        ("GET", "/compat/neuroloom/api/v1/memories/", Reader),
        ("GET", "/compat/neuroloom/api/v1/memories", Reader),
        (
            "POST",
            "/compat/neuroloom/api/v1/memories/batch-delete",
            Writer,
        ),
        ("POST", "/compat/neuroloom/api/v1/memories/explore", Reader),
        ("POST", "/compat/neuroloom/api/v1/memories/path", Reader),
        (
            "GET",
            "/compat/neuroloom/api/v1/memories/{memory_id}",
            Reader,
        ),
        (
            "PATCH",
            "/compat/neuroloom/api/v1/memories/{memory_id}",
            Writer,
        ),
        (
            "DELETE",
            "/compat/neuroloom/api/v1/memories/{memory_id}",
            Writer,
        ),
        (
            "GET",
            "/compat/neuroloom/api/v1/memories/{memory_id}/related",
            Reader,
        ),
        (
            "POST",
            "/compat/neuroloom/api/v1/memories/{memory_id}/access",
            Writer,
        ),
        (
            "POST",
            "/compat/neuroloom/api/v1/memories/{memory_id}/retrieval",
            Writer,
        ),
        // The rest of Memoria's paths: 501 naming the feature, or 404.
        ("GET", "/compat/memoria/{*rest}", Reader),
        ("POST", "/compat/memoria/{*rest}", Reader),
        ("PUT", "/compat/memoria/{*rest}", Reader),
        ("PATCH", "/compat/memoria/{*rest}", Reader),
        ("DELETE", "/compat/memoria/{*rest}", Reader),
    ]
}

/// The role `method` on `route` needs (see [`needs`]); MCP's tools store as
/// well as search, so `/mcp` needs a writer. A method the route does not
/// have needs no more than a reader: the router answers it 405 (every
/// method a route has is in the table, a unit test checks).
pub(crate) fn need(method: &str, route: &str) -> Role {
    if route == "/mcp" || route.starts_with("/mcp/") {
        return Role::Writer;
    }
    let table = needs();
    if let Some((_, _, role)) = table.iter().find(|(m, r, _)| *m == method && *r == route) {
        return *role;
    }
    if table.iter().any(|(_, r, _)| *r == route) {
        Role::Reader
    } else {
        Role::Admin
    }
}

/// Whether the router has `method` on `route` (MCP: every method).
pub(crate) fn declared(method: &str, route: &str) -> bool {
    route == "/mcp"
        || route.starts_with("/mcp/")
        || needs().iter().any(|(m, r, _)| *m == method && *r == route)
}

/// Whether `method` on `route` spends the expensive budget of the rate
/// limits: SQL, exports, dreams, re-embedding, running a job, a bulk delete
/// (it snapshots every table), and ingesting
/// a conversation when an LLM extracts its facts.
pub(crate) fn expensive(method: &str, route: &str, llm: bool) -> bool {
    matches!(
        (method, route),
        ("POST", "/v1/sql")
            | ("POST", "/v1/export")
            | ("POST", "/v1/dream")
            | ("POST", "/v1/reflect")
            | ("POST", "/v1/re-embed-all")
            | ("POST", "/v1/embed-missing")
            | ("POST", "/v1/extract-entities")
            | ("POST", "/admin/jobs/{name}/run")
            | ("POST", "/v1/memories/bulk-delete")
            | ("POST", "/v1/graph/analyze")
            | ("POST", "/v1/branches")
            | ("POST", "/v1/branches/{name}/merge")
            | ("POST", "/compat/memoria/v1/branches")
            | ("POST", "/compat/memoria/v1/branches/{name}/merge")
            | ("POST", "/compat/memoria/v1/memories/purge")
            | ("POST", "/compat/memoria/v1/consolidate")
            | ("POST", "/compat/memoclaw/v1/memories/bulk-delete")
            | ("POST", "/compat/memoclaw/v1/memories/consolidate")
            | ("GET", "/compat/memoclaw/v1/export")
    ) || (llm && method == "POST" && route == "/v1/ingest")
}

/// The path of every protected route, `/mcp` included (for the attack suite).
pub fn route_paths() -> Vec<&'static str> {
    let mut paths: Vec<&'static str> = routes().into_iter().map(|(p, _)| p).collect();
    paths.push("/mcp");
    paths
}

pub fn router(engine: Arc<Engine>) -> Router {
    let max_body = engine.cfg.server.max_body_bytes;
    let protected = routes()
        .into_iter()
        .fold(Router::new(), |r, (path, handler)| r.route(path, handler))
        .nest_service("/mcp", crate::mcp::http_service(engine.clone()))
        .route_layer(middleware::from_fn_with_state(
            engine.clone(),
            request::require_auth,
        ));
    Router::new()
        .route("/health", get(health))
        .route("/compat/memoria/health", get(compat::health_text))
        .route(
            "/compat/memoria/health/instance",
            get(compat::health_instance),
        )
        .route("/ui", get(ui::index))
        .route("/ui/", get(ui::index))
        .route("/ui/{file}", get(ui::asset))
        .route(
            "/.well-known/oauth-authorization-server",
            get(oauth::server_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource",
            get(oauth::resource_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(oauth::resource_metadata),
        )
        .route("/oauth/register", post(oauth::register))
        .route(
            "/oauth/authorize",
            get(oauth::authorize_page).post(oauth::authorize),
        )
        .route("/oauth/token", post(oauth::token))
        .route("/oauth/revoke", post(oauth::revoke))
        .merge(protected)
        .fallback(not_found)
        .layer(middleware::from_fn(move |req, next| {
            refuse_declared_oversize(max_body, req, next)
        }))
        .layer(middleware::from_fn(count_request))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(engine)
}

/// A body whose declared length (`Content-Length`) passes
/// `server.max_body_bytes` is a 413 before a byte of it is read; a body sent
/// without a length is cut off at the limit while it is read.
async fn refuse_declared_oversize(
    max: usize,
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(n) if n > max as u64 => Error::TooLarge(format!(
            "request body is too large: {n} bytes, the limit is {max} (server.max_body_bytes)"
        ))
        .into_response(),
        _ => next.run(req).await,
    }
}

/// Count every request and its latency by method, matched route (the route's
/// pattern, never the raw path, so ids do not become labels) and status.
async fn count_request(
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().as_str().to_string();
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    let m = crate::core::metrics::metrics();
    let status = response.status();
    let labels = [method.as_str(), route.as_str(), status.as_str()];
    m.http_requests.with_label_values(&labels).inc();
    crate::core::metrics::observe(
        &m.http_seconds.with_label_values(&labels),
        started.elapsed(),
    );
    response
}

/// `GET /metrics`: the Prometheus text exposition (admin).
async fn metrics(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
) -> Result<axum::response::Response> {
    use axum::response::IntoResponse;
    let body = status::metrics(&engine, &caller).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response())
}

/// `GET /openapi.json`: the OpenAPI 3.1 description of every route.
async fn openapi_json() -> Json<serde_json::Value> {
    Json(openapi::document())
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

async fn not_found(uri: axum::http::Uri) -> Error {
    Error::NotFound(format!("no route for {}", uri.path()))
}

async fn search_handler(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<SearchRequest>,
) -> Result<Json<SearchResponse>> {
    Ok(Json(
        search::search_on_reads(&engine.services, caller, req).await?,
    ))
}

async fn sql_handler(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<crate::service::sql::SqlRequest>,
) -> Result<axum::response::Response> {
    use axum::response::IntoResponse;
    let format: crate::service::sql::OutputFormat =
        req.format.as_deref().unwrap_or("json").parse()?;
    let result =
        crate::service::sql::query(&engine.store, &caller, &engine.cfg.sql.limits(), &req).await?;
    let (content_type, body) = crate::service::sql::render(&result, format)?;
    Ok(([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response())
}

/// `POST /v1/export`: the file `loomem export --url` writes.
async fn export_handler(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<crate::service::export::ExportRequest>,
) -> Result<axum::response::Response> {
    use axum::response::IntoResponse;
    let format: crate::service::export::ExportFormat = req
        .format
        .parse()
        .map_err(|e: String| Error::invalid("format", e))?;
    let caller = crate::service::export::narrow(&caller, req.stream.as_deref())?;
    let limits = engine.cfg.sql.limits();
    let export = crate::service::export::Export {
        store: &engine.store,
        caller: &caller,
        limits: &limits,
        format,
        sql: req.sql.as_deref(),
    };
    let (file, bytes) = export.write_unlinked(&engine.cfg.spool_dir()).await?;
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                format.content_type().to_string(),
            ),
            (axum::http::header::CONTENT_LENGTH, bytes.to_string()),
        ],
        axum::body::Body::from_stream(read_in_pieces(file)),
    )
        .into_response())
}

/// A file's bytes as a stream of pieces, for a response body.
fn read_in_pieces(
    file: std::fs::File,
) -> impl futures::Stream<Item = std::io::Result<axum::body::Bytes>> {
    use tokio::io::AsyncReadExt;
    const PIECE: usize = 256 * 1024;
    let file = Some(tokio::fs::File::from_std(file));
    futures::stream::unfold(file, |file| async move {
        let mut file = file?;
        let mut buf = vec![0u8; PIECE];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(axum::body::Bytes::from(buf)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}

async fn status(State(engine): State<Arc<Engine>>, caller: Caller) -> Result<Json<status::Status>> {
    Ok(Json(status::status(&engine, &caller).await?))
}

async fn namespaces(caller: Caller) -> Json<status::Namespaces> {
    Json(status::namespaces(&caller))
}

async fn whoami(caller: Caller) -> Json<status::WhoAmI> {
    Json(status::whoami(&caller))
}

async fn embed_missing(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<reembed::EmbedJobRequest>,
) -> Result<axum::response::Response> {
    embed_job(engine, caller, req, reembed::Scope::Missing).await
}

async fn re_embed_all(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<reembed::EmbedJobRequest>,
) -> Result<axum::response::Response> {
    embed_job(engine, caller, req, reembed::Scope::All).await
}

/// Start the job; answer when it ends, or at once (202) with `"wait": false`.
async fn embed_job(
    engine: Arc<Engine>,
    caller: Caller,
    req: reembed::EmbedJobRequest,
    scope: reembed::Scope,
) -> Result<axum::response::Response> {
    use axum::response::IntoResponse;
    let wait = req.wait.unwrap_or(true);
    let job = reembed::start(&engine.services, &caller, scope).await?;
    if !wait {
        let body = Json(reembed::EmbedJobResponse::from_job(&job));
        return Ok((axum::http::StatusCode::ACCEPTED, body).into_response());
    }
    job.wait().await;
    Ok(Json(reembed::EmbedJobResponse::from_job(&job)).into_response())
}

async fn job_status(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<crate::service::tasks::TaskView>> {
    Ok(Json(engine.jobs.visible(&caller, &id)?.view()))
}

async fn job_cancel(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<crate::service::tasks::TaskView>> {
    Ok(Json(engine.jobs.cancel(&caller, &id).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_declares_the_role_it_needs() {
        let declared: std::collections::BTreeSet<(String, &str)> = needs()
            .into_iter()
            .map(|(m, r, _)| (m.to_string(), r))
            .collect();
        for op in openapi::operations() {
            if op.path == "/health" {
                continue;
            }
            assert!(
                declared.contains(&(op.method.to_uppercase(), op.path)),
                "{} {} has no entry in needs()",
                op.method,
                op.path
            );
        }
        assert_eq!(
            need("GET", "/v1/not-in-the-table"),
            Role::Admin,
            "fail closed"
        );
        assert_eq!(need("POST", "/mcp"), Role::Writer);
        assert_eq!(need("PUT", "/admin/keys"), Role::Reader, "the router's 405");
    }
}
