//! Reading memory back and tending it: feedback on results, context packs,
//! ambient snippets, the profile, the MEMORY.md proposal, the entity graph,
//! associations, quality reflection and dream consolidation.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;

use super::{ApiJson, ApiQuery};
use crate::app::Engine;
use crate::core::error::Result;
use crate::core::Caller;
use crate::service::context::{self, Ambient, AmbientRequest, ContextPack, ContextPackRequest};
use crate::service::feedback::{self, FeedbackRequest, FeedbackResponse};
use crate::service::graph::{self, EntityView, GraphQuery, GraphStats};

pub async fn feedback(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<FeedbackRequest>,
) -> Result<(axum::http::StatusCode, Json<FeedbackResponse>)> {
    let answer = feedback::record(&engine, &caller, req).await?;
    Ok((axum::http::StatusCode::CREATED, Json(answer)))
}

pub async fn context_pack(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<ContextPackRequest>,
) -> Result<Json<ContextPack>> {
    Ok(Json(context::context_pack(&engine, &caller, req).await?))
}

pub async fn ambient(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<AmbientRequest>,
) -> Result<Json<Ambient>> {
    Ok(Json(context::ambient(&engine, &caller, req).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileQuery {
    stream: Option<String>,
    /// `json` (default) or `markdown` (adds a `markdown` rendering).
    format: Option<String>,
}

pub async fn profile(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ProfileQuery>,
) -> Result<Json<serde_json::Value>> {
    let markdown = match q.format.as_deref() {
        None | Some("json") => false,
        Some("markdown") => true,
        Some(other) => {
            return Err(crate::core::error::Error::invalid(
                "format",
                format!("`{other}`: must be json or markdown"),
            ))
        }
    };
    let p = context::profile(&engine, &caller, q.stream.as_deref()).await?;
    let mut body =
        serde_json::to_value(&p).map_err(|e| crate::core::error::Error::Internal(e.to_string()))?;
    if markdown {
        body["markdown"] = serde_json::Value::String(p.markdown());
    }
    Ok(Json(body))
}

pub async fn memory_md(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<context::MemoryMdQuery>,
) -> Result<Json<context::MemoryMd>> {
    Ok(Json(context::memory_md(&engine, &caller, q).await?))
}

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

pub async fn reflect(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<crate::service::reflect::ReflectRequest>,
) -> Result<Json<crate::service::reflect::Reflection>> {
    Ok(Json(
        crate::service::reflect::reflect(&engine, &caller, req).await?,
    ))
}

pub async fn dream(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<crate::service::dream::DreamRequest>,
) -> Result<Json<crate::service::dream::DreamReport>> {
    Ok(Json(
        crate::service::dream::dream(&engine, &caller, req).await?,
    ))
}
