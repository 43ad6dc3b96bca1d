//! Branches of a stream: make one, compare it with its base, merge it back,
//! drop it (`service::branch`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::{ApiJson, ApiQuery};
use crate::app::Engine;
use crate::core::error::Result;
use crate::core::Caller;
use crate::service::branch::{self, Branch, BranchQuery, Branches, Diff, Dropped, Merged};

pub async fn create(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<branch::NewBranch>,
) -> Result<(StatusCode, Json<Branch>)> {
    Ok((
        StatusCode::CREATED,
        Json(branch::create(&engine, &caller, req).await?),
    ))
}

pub async fn list(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<BranchQuery>,
) -> Result<Json<Branches>> {
    Ok(Json(branch::list(&engine, &caller, &q).await?))
}

pub async fn diff(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<BranchQuery>,
) -> Result<Json<Diff>> {
    Ok(Json(branch::diff(&engine, &caller, &name, &q).await?))
}

pub async fn merge(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(name): Path<String>,
    ApiJson(req): ApiJson<branch::MergeRequest>,
) -> Result<Json<Merged>> {
    Ok(Json(branch::merge(&engine, &caller, &name, req).await?))
}

pub async fn drop(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<BranchQuery>,
) -> Result<Json<Dropped>> {
    Ok(Json(branch::drop(&engine, &caller, &name, &q).await?))
}
