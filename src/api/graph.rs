//! The entity graph of a stream and the associations it suggests.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;

use super::{ApiJson, ApiQuery};
use crate::app::Engine;
use crate::core::error::Result;
use crate::core::Caller;
use crate::service::graph::{self, EntityView, GraphQuery, GraphStats};

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
