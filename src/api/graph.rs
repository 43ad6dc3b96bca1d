//! The entity graph of a stream and the associations it suggests.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;

use super::{ApiJson, ApiQuery};
use crate::app::Engine;
use crate::core::error::Result;
use crate::core::Caller;
use crate::service::graph::{self, EntityView, GraphQuery, GraphStats};
use crate::service::graph_rank;

pub async fn graph_entity(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<GraphQuery>,
) -> Result<Json<EntityView>> {
    Ok(Json(
        graph::entity(&engine, &caller, &name, q.stream.as_deref()).await?,
    ))
}

pub async fn graph_stats(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<GraphQuery>,
) -> Result<Json<GraphStats>> {
    Ok(Json(
        graph::stats(&engine, &caller, q.stream.as_deref()).await?,
    ))
}

pub async fn associate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<crate::service::associate::AssociateRequest>,
) -> Result<Json<crate::service::associate::Associations>> {
    Ok(Json(
        crate::service::associate::associate(&engine, &caller, req).await?,
    ))
}

use crate::service::relations;

/// `POST /v1/relations`.
pub async fn relate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<relations::RelateRequest>,
) -> Result<Json<relations::Relation>> {
    Ok(Json(relations::create(&engine, &caller, req).await?))
}

/// `GET /v1/relations`.
pub async fn relations_list(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<relations::RelationsQuery>,
) -> Result<Json<relations::Relations>> {
    Ok(Json(relations::list(&engine, &caller, &q).await?))
}

/// `DELETE /v1/relations/{id}`.
pub async fn unrelate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<relations::Unrelated>> {
    Ok(Json(relations::delete(&engine, &caller, &id).await?))
}

/// `GET /v1/memories/{id}/related`.
pub async fn related(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<relations::RelatedQuery>,
) -> Result<Json<relations::Related>> {
    Ok(Json(relations::related(&engine, &caller, &id, &q).await?))
}

/// `GET /v1/graph/explore`.
pub async fn explore(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<relations::ExploreQuery>,
) -> Result<Json<relations::Subgraph>> {
    Ok(Json(relations::explore(&engine, &caller, &q).await?))
}

/// `GET /v1/graph/path`.
pub async fn path(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<relations::PathQuery>,
) -> Result<Json<relations::Path>> {
    Ok(Json(relations::path(&engine, &caller, &q).await?))
}

/// `POST /v1/graph/analyze`.
pub async fn analyze(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<graph_rank::AnalyzeRequest>,
) -> Result<Json<graph_rank::Analysis>> {
    Ok(Json(graph_rank::analyze(&engine, &caller, &req).await?))
}

/// `GET /v1/graph/rank`.
pub async fn rank(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<graph_rank::RankQuery>,
) -> Result<Json<graph_rank::Ranking>> {
    Ok(Json(graph_rank::rank(&engine, &caller, &q).await?))
}

/// `GET /v1/graph/communities`.
pub async fn communities(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<graph_rank::CommunitiesQuery>,
) -> Result<Json<graph_rank::Communities>> {
    Ok(Json(graph_rank::communities(&engine, &caller, &q).await?))
}
