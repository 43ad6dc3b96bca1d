//! Neuroloom's Memories API (`shared/reference/neuroloom-memories-api.md`)
//! under `/compat/neuroloom`: `Authorization: Token <key>`, `mem-…` ids, 0–1
//! importance, memory objects with PageRank and community — each route mapped
//! onto loomem's service functions. A workspace is the key's default stream.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post, MethodRouter};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::{ApiJson, ApiQuery};
use crate::app::Engine;
use crate::core::error::{Error, Result};
use crate::core::Caller;
use crate::service;

pub const BASE: &str = "/compat/neuroloom/";

/// Neuroloom's 0–1 importance is loomem's 0–10 scaled down.
const IMPORTANCE_SCALE: f64 = 10.0;

pub fn routes() -> Vec<(&'static str, MethodRouter<Arc<Engine>>)> {
    vec![
        ("/compat/neuroloom/api/v1/memories/store", post(store)),
        ("/compat/neuroloom/api/v1/memories/", get(list)),
        ("/compat/neuroloom/api/v1/memories", get(list)),
        (
            "/compat/neuroloom/api/v1/memories/batch-delete",
            post(batch_delete),
        ),
        ("/compat/neuroloom/api/v1/memories/explore", post(explore)),
        ("/compat/neuroloom/api/v1/memories/path", post(path)),
        (
            "/compat/neuroloom/api/v1/memories/{memory_id}",
            get(detail).patch(update).delete(remove),
        ),
        (
            "/compat/neuroloom/api/v1/memories/{memory_id}/related",
            get(related),
        ),
        (
            "/compat/neuroloom/api/v1/memories/{memory_id}/access",
            post(access),
        ),
        (
            "/compat/neuroloom/api/v1/memories/{memory_id}/retrieval",
            post(access),
        ),
    ]
}

/// The Neuroloom fields loomem keeps in a memory's metadata.
const KEPT: &str = "neuroloom";

fn not_found(id: &str) -> Error {
    Error::NotFound(format!("Memory '{id}' not found."))
}

/// A not-found as Neuroloom words it; any other error as it is.
fn named(e: Error, id: &str) -> Error {
    match e {
        Error::NotFound(_) => not_found(id),
        other => other,
    }
}

/// A loomem memory view as Neuroloom's memory object.
fn memory(view: &Value, metrics: Option<&(f64, i64)>) -> Value {
    let kept = &view["metadata"][KEPT];
    let list = |v: &Value| if v.is_array() { v.clone() } else { json!([]) };
    // The score the client set (loomem's pipeline weighs its own importance
    // by surprise); else loomem's importance on Neuroloom's scale.
    let importance = kept["importance_score"].as_f64().unwrap_or_else(|| {
        (view["importance"].as_f64().unwrap_or(0.0) / IMPORTANCE_SCALE).min(1.0)
    });
    json!({
        "id": kept["id"],
        "memory_id": view["id"],
        "workspace_id": view["stream"],
        "title": view["title"],
        "narrative": view["content"],
        "memory_type": view["memory_type"],
        "tags": list(&view["tags"]),
        "concepts": list(&kept["concepts"]),
        "source_files": list(&kept["source_files"]),
        "importance_score": (importance * 1000.0).round() / 1000.0,
        "confidence_score": view["confidence"],
        "pagerank_score": metrics.map(|m| m.0),
        "community_label": metrics.map(|m| format!("community-{}", m.1)),
        "access_count": view["access_count"],
        "retrieval_count": view["access_count"],
        "last_accessed_at": view["last_accessed_at"],
        "source_session_id": view["session_id"],
        "is_consolidated": view["level"].as_i64().unwrap_or(0) > 0,
        "consolidated_from": Value::Null,
        "created_at": view["created_at"],
        "updated_at": view["updated_at"],
    })
}

/// Memory objects of these views, with their graph metrics.
async fn memories(engine: &Engine, caller: &Caller, views: &[Value]) -> Result<Vec<Value>> {
    let ids: Vec<String> = views
        .iter()
        .filter_map(|v| v["id"].as_str().map(str::to_string))
        .collect();
    let metrics = service::graph_rank::of_memories(engine, caller, &ids).await?;
    Ok(views
        .iter()
        .map(|v| memory(v, v["id"].as_str().and_then(|id| metrics.get(id))))
        .collect())
}

async fn one(engine: &Engine, caller: &Caller, id: &str) -> Result<Value> {
    let view = service::edit::get(engine, caller, id)
        .await
        .map_err(|e| named(e, id))?;
    Ok(memories(engine, caller, &[view]).await?.remove(0))
}

fn score(field: &str, v: Option<f64>, default: f64) -> Result<f64> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && (0.0..=1.0).contains(&x) => Ok(x),
        Some(_) => Err(Error::invalid(field, "must be between 0.0 and 1.0")),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewMemory {
    title: String,
    narrative: String,
    memory_type: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    concepts: Vec<String>,
    #[serde(default)]
    source_files: Vec<String>,
    importance_score: Option<f64>,
    confidence_score: Option<f64>,
}

/// `POST /api/v1/memories/store`: 201 with the memory object.
async fn store(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<NewMemory>,
) -> Result<(StatusCode, Json<Value>)> {
    if req.title.trim().is_empty() || req.title.chars().count() > 500 {
        return Err(Error::invalid("title", "1 to 500 characters"));
    }
    let importance = score("importance_score", req.importance_score, 0.5)?;
    let confidence = score("confidence_score", req.confidence_score, 0.5)?;
    let uuid = uuid::Uuid::new_v4();
    let memory_id = format!("mem-{}", &uuid.simple().to_string()[..16]);
    let stored = service::memory::store(
        &engine,
        &caller,
        service::memory::StoreRequest {
            id: Some(memory_id),
            title: Some(req.title),
            content: req.narrative,
            memory_type: Some(req.memory_type.unwrap_or_else(|| "general".into())),
            tags: req.tags,
            importance: Some((importance * IMPORTANCE_SCALE) as f32),
            confidence: Some(confidence as f32),
            metadata: Some(json!({KEPT: {
                "id": uuid.to_string(),
                "importance_score": importance,
                "concepts": req.concepts,
                "source_files": req.source_files,
            }})),
            ..Default::default()
        },
    )
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(one(&engine, &caller, &stored.id).await?),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    memory_type: Option<String>,
    limit: Option<usize>,
    offset: Option<usize>,
    ordering: Option<String>,
    pruning_candidates: Option<bool>,
}

/// `GET /api/v1/memories/`: an array of memory objects, `limit` + `offset`.
async fn list(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let limit = super::limit_of("limit", q.limit, 50, 500)?;
    let order = match q.ordering.as_deref().unwrap_or("-importance_score") {
        "-importance_score" => "importance",
        "-created_at" => "newest",
        "created_at" => "oldest",
        other => {
            return Err(Error::invalid(
                "ordering",
                format!("`{other}`: loomem orders by -importance_score, -created_at or created_at"),
            ))
        }
    };
    if q.pruning_candidates == Some(true) {
        return Err(Error::NotImplemented(
            "Neuroloom's pruning_candidates filter is not available in loomem".into(),
        ));
    }
    let query = service::listing::ListQuery {
        types: q.memory_type.clone(),
        order: Some(order.into()),
        ..Default::default()
    };
    let (views, _) =
        super::offset_page(&engine, &caller, &query, q.offset.unwrap_or(0), limit).await?;
    Ok(Json(Value::Array(
        memories(&engine, &caller, &views).await?,
    )))
}

/// `GET /api/v1/memories/{memory_id}`: the memory with its relationships.
async fn detail(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let mut m = one(&engine, &caller, &id).await?;
    let links = service::relations::list(
        &engine,
        &caller,
        &service::relations::RelationsQuery {
            memory_id: Some(id.clone()),
            relation: None,
            stream: None,
        },
    )
    .await?;
    let edge = |r: &crate::store::relations::RelationRow| {
        json!({
            "id": r.id,
            "source_memory_id": r.from_id,
            "target_memory_id": r.to_id,
            "relationship_type": r.relation,
            "discovery_method": if r.created_by == "auto_relate" { "embedding_similarity" } else { "manual" },
            "confidence": r.weight.min(1.0),
            "is_bidirectional": false,
            "context": r.note,
            "created_at": crate::core::time::to_rfc3339(r.created_at),
        })
    };
    let (out, inc): (Vec<_>, Vec<_>) = links.relations.iter().partition(|r| r.from_id == id);
    m["outgoing_relationships"] = out.into_iter().map(edge).collect();
    m["incoming_relationships"] = inc.into_iter().map(edge).collect();
    let stats = service::feedback::polarity(&engine, &caller, &id).await?;
    m["feedback_positive_count"] = json!(stats.0);
    m["feedback_negative_count"] = json!(stats.1);
    Ok(Json(m))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Update {
    title: Option<String>,
    narrative: Option<String>,
    tags: Option<Vec<String>>,
    concepts: Option<Vec<String>>,
    source_files: Option<Vec<String>>,
    importance_score: Option<f64>,
    confidence_score: Option<f64>,
}

/// `PATCH /api/v1/memories/{memory_id}`: the updated memory object. A new
/// narrative is a new version in loomem, with a new `memory_id`.
async fn update(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<Update>,
) -> Result<Json<Value>> {
    let current = service::edit::get(&engine, &caller, &id)
        .await
        .map_err(|_| not_found(&id))?;
    let metadata =
        if req.concepts.is_some() || req.source_files.is_some() || req.importance_score.is_some() {
            let mut meta = if current["metadata"].is_object() {
                current["metadata"].clone()
            } else {
                json!({})
            };
            if !meta[KEPT].is_object() {
                meta[KEPT] = json!({});
            }
            if let Some(c) = req.concepts {
                meta[KEPT]["concepts"] = json!(c);
            }
            if let Some(f) = req.source_files {
                meta[KEPT]["source_files"] = json!(f);
            }
            if let Some(i) = req.importance_score {
                meta[KEPT]["importance_score"] = json!(i);
            }
            Some(meta)
        } else {
            None
        };
    let importance = req
        .importance_score
        .map(|s| score("importance_score", Some(s), 0.0))
        .transpose()?;
    let confidence = req
        .confidence_score
        .map(|s| score("confidence_score", Some(s), 0.0))
        .transpose()?;
    if req.title.as_ref().is_some_and(|t| t.chars().count() > 500) {
        return Err(Error::invalid("title", "at most 500 characters"));
    }
    let done = service::edit::edit(
        &engine,
        &caller,
        &id,
        service::edit::EditRequest {
            content: req.narrative,
            title: req.title,
            tags: req.tags,
            importance: importance.map(|s| (s * IMPORTANCE_SCALE) as f32),
            confidence: confidence.map(|c| c as f32),
            metadata,
            reason: Some("updated through Neuroloom's API".into()),
            ..Default::default()
        },
    )
    .await?;
    Ok(Json(one(&engine, &caller, &done.id).await?))
}

/// `DELETE /api/v1/memories/{memory_id}`: 204; its relationships go too.
async fn remove(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    service::memory::delete(&engine, &caller, &id, None)
        .await
        .map_err(|e| named(e, &id))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchDelete {
    memory_ids: Vec<String>,
}

/// `POST /api/v1/memories/batch-delete`: `{deleted_count}`, at most 100 ids.
async fn batch_delete(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<BatchDelete>,
) -> Result<Json<Value>> {
    if req.memory_ids.len() > 100 {
        return Err(Error::invalid("memory_ids", "at most 100 items"));
    }
    let n = super::delete_ids(
        &engine,
        &caller,
        req.memory_ids,
        "batch delete through Neuroloom's API",
    )
    .await?;
    Ok(Json(json!({"deleted_count": n})))
}

/// Search results as Neuroloom's: memory objects with a `similarity`.
async fn results(
    engine: &Engine,
    caller: &Caller,
    found: &[service::search::SearchResult],
) -> Result<Vec<Value>> {
    let mut views = Vec::with_capacity(found.len());
    for r in found {
        views.push(service::edit::get(engine, caller, &r.chunk_id).await?);
    }
    let mut out = memories(engine, caller, &views).await?;
    for (m, r) in out.iter_mut().zip(found) {
        m["similarity"] = json!(r.score_final);
    }
    Ok(out)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RelatedParams {
    limit: Option<usize>,
    similarity_threshold: Option<f32>,
}

/// `GET /api/v1/memories/{memory_id}/related`: the memories most like it
/// (cosine of their embeddings at least `similarity_threshold`).
async fn related(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<RelatedParams>,
) -> Result<Json<Value>> {
    let limit = super::limit_of("limit", q.limit, 10, 50)?;
    let threshold = q.similarity_threshold.unwrap_or(0.75);
    if !(0.0..=1.0).contains(&threshold) {
        return Err(Error::invalid(
            "similarity_threshold",
            "must be between 0.0 and 1.0",
        ));
    }
    let source = service::edit::get(&engine, &caller, &id)
        .await
        .map_err(|_| not_found(&id))?;
    let found = service::search::search_on_reads(
        &engine.services,
        caller.clone(),
        service::search::SearchRequest {
            query: source["content"]
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(4000)
                .collect(),
            top_k: Some(limit + 1),
            stream: source["stream"].as_str().map(str::to_string),
            mode: Some("vector".into()),
            min_similarity: Some(threshold),
            // The cosine of the two memories' embeddings, nothing moved.
            vector_feedback: Some(false),
            dry_run: true,
            ..Default::default()
        },
    )
    .await?;
    let others: Vec<_> = found
        .results
        .into_iter()
        .filter(|r| r.chunk_id != id)
        .take(limit)
        .collect();
    Ok(Json(Value::Array(
        results(&engine, &caller, &others).await?,
    )))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Explore {
    query: String,
    max_nodes: Option<usize>,
    relationship_types: Option<Vec<String>>,
    min_edge_confidence: Option<f32>,
    seed_limit: Option<usize>,
}

/// A memory-to-memory edge as Neuroloom draws it.
fn neuro_edge(from: &str, to: &str, kind: &str, confidence: f32) -> Value {
    json!({
        "source_memory_id": from,
        "target_memory_id": to,
        "relationship_type": kind,
        "confidence": confidence,
    })
}

/// `POST /api/v1/memories/explore`: the best matches of `query` as seeds,
/// then loomem's graph walk (two hops: links, and memories naming the same
/// entity, drawn as `shares_entity` edges) from each, memories only.
async fn explore(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Explore>,
) -> Result<Json<Value>> {
    let max_nodes = super::limit_of("max_nodes", req.max_nodes, 50, 200)?;
    let seed_limit = super::limit_of("seed_limit", req.seed_limit, 5, 50)?;
    // loomem's edges here carry no confidence of their own: each is 1.0.
    let edges_wanted = req.min_edge_confidence.unwrap_or(0.0) <= 1.0;
    let seeds = service::search::search_on_reads(
        &engine.services,
        caller.clone(),
        service::search::SearchRequest {
            query: req.query,
            top_k: Some(seed_limit),
            dry_run: true,
            ..Default::default()
        },
    )
    .await?;
    let mut nodes: Vec<String> = Vec::new();
    let mut edges: BTreeSet<(String, String, String)> = BTreeSet::new();
    let allowed = |kind: &str| {
        req.relationship_types
            .as_ref()
            .is_none_or(|t| t.iter().any(|k| k == kind))
    };
    for seed in &seeds.results {
        let sub = service::relations::explore(
            &engine,
            &caller,
            &service::relations::ExploreQuery {
                from: seed.chunk_id.clone(),
                stream: None,
                hops: Some(2),
                max_nodes: Some(500),
            },
        )
        .await?;
        for n in sub.nodes.iter().filter(|n| n.node.kind == "memory") {
            if nodes.len() < max_nodes && !nodes.contains(&n.node.id) {
                nodes.push(n.node.id.clone());
            }
        }
        let mut mentions: HashMap<&str, Vec<&str>> = HashMap::new();
        for e in &sub.edges {
            if e.kind == "mentions" {
                mentions
                    .entry(e.to.as_str())
                    .or_default()
                    .push(e.from.as_str());
            } else if allowed(&e.kind) && edges_wanted {
                edges.insert((e.from.clone(), e.to.clone(), e.kind.clone()));
            }
        }
        if allowed("shares_entity") && edges_wanted {
            for members in mentions.values() {
                for (i, a) in members.iter().enumerate() {
                    for b in &members[i + 1..] {
                        edges.insert((a.to_string(), b.to_string(), "shares_entity".into()));
                    }
                }
            }
        }
    }
    let kept: BTreeSet<&String> = nodes.iter().collect();
    let mut views = Vec::with_capacity(nodes.len());
    for id in &nodes {
        views.push(service::edit::get(&engine, &caller, id).await?);
    }
    let objects = memories(&engine, &caller, &views).await?;
    Ok(Json(json!({
        "nodes": objects.iter().map(|m| json!({
            "memory_id": m["memory_id"],
            "title": m["title"],
            "memory_type": m["memory_type"],
            "importance_score": m["importance_score"],
            "pagerank_score": m["pagerank_score"],
            "community_label": m["community_label"],
        })).collect::<Vec<_>>(),
        "edges": edges
            .iter()
            .filter(|(a, b, _)| kept.contains(a) && kept.contains(b))
            .map(|(a, b, k)| neuro_edge(a, b, k, 1.0))
            .collect::<Vec<_>>(),
        "seed_memories": seeds.results.iter().map(|r| &r.chunk_id).collect::<Vec<_>>(),
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PathRequest {
    source_memory_id: String,
    target_memory_id: String,
    max_depth: Option<usize>,
    relationship_types: Option<Vec<String>>,
}

/// `POST /api/v1/memories/path`: loomem's shortest path, memories only (a
/// step through an entity both name is a `shares_entity` edge).
async fn path(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<PathRequest>,
) -> Result<Json<Value>> {
    let max_depth = req.max_depth.unwrap_or(5);
    let none = json!({"path": [], "edges": [], "depth": 0});
    let found = service::relations::path(
        &engine,
        &caller,
        &service::relations::PathQuery {
            from: req.source_memory_id.clone(),
            to: req.target_memory_id.clone(),
            stream: None,
        },
    )
    .await?;
    if !found.found {
        return Ok(Json(none));
    }
    let mut path = vec![found.nodes[0].id.clone()];
    let mut edges = Vec::new();
    for (i, n) in found.nodes.iter().enumerate().skip(1) {
        if n.kind != "memory" {
            continue;
        }
        let prev = path.last().expect("the source").clone();
        let kind = if found.nodes[i - 1].kind == "memory" {
            found.edges[i - 1].kind.clone()
        } else {
            "shares_entity".to_string()
        };
        if req
            .relationship_types
            .as_ref()
            .is_some_and(|t| !t.contains(&kind))
        {
            return Ok(Json(none));
        }
        edges.push(neuro_edge(&prev, &n.id, &kind, 1.0));
        path.push(n.id.clone());
    }
    let depth = edges.len();
    if depth > max_depth {
        return Ok(Json(none));
    }
    Ok(Json(json!({"path": path, "edges": edges, "depth": depth})))
}

/// `POST …/{memory_id}/access` and `…/retrieval`: one access counted now;
/// the updated memory object. loomem keeps one counter for both (searches
/// count it too), so `access_count` and `retrieval_count` are the same.
async fn access(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let view = service::edit::record_access(&engine, &caller, &id)
        .await
        .map_err(|e| named(e, &id))?;
    Ok(Json(memories(&engine, &caller, &[view]).await?.remove(0)))
}
