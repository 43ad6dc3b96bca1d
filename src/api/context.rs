//! What an agent loads before it works: the context pack, ambient snippets,
//! the profile and the MEMORY.md proposal.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;

use super::{ApiJson, ApiQuery};
use crate::app::Engine;
use crate::core::error::Result;
use crate::core::Caller;
use crate::service::context::{self, Ambient, AmbientRequest, ContextPack, ContextPackRequest};

pub async fn context_pack(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<ContextPackRequest>,
) -> Result<Json<ContextPack>> {
    Ok(Json(
        context::context_pack_on_reads(&engine.services, caller, req).await?,
    ))
}

pub async fn ambient(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<AmbientRequest>,
) -> Result<Json<Ambient>> {
    Ok(Json(
        context::ambient_on_reads(&engine.services, caller, req).await?,
    ))
}

#[derive(schemars::JsonSchema, Deserialize)]
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
