//! `/admin/keys`: keys made at runtime (admin only; the route table says so
//! too). The secret is in the answer to create and rotate, and nowhere else.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;

use super::ApiJson;
use crate::app::Engine;
use crate::core::error::Result;
use crate::core::Caller;
use crate::service::keys::{self, CreateKey, KeyView, KeyWithSecret, RotateKey};

pub async fn create(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<CreateKey>,
) -> Result<(StatusCode, Json<KeyWithSecret>)> {
    caller.require_admin()?;
    Ok((
        StatusCode::CREATED,
        Json(keys::create(&engine.keys, req).await?),
    ))
}

#[derive(schemars::JsonSchema, Serialize)]
pub struct KeyList {
    keys: Vec<KeyView>,
}

pub async fn list(State(engine): State<Arc<Engine>>, caller: Caller) -> Result<Json<KeyList>> {
    caller.require_admin()?;
    Ok(Json(KeyList {
        keys: keys::list(&engine.keys).await?,
    }))
}

pub async fn rotate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<RotateKey>,
) -> Result<Json<KeyWithSecret>> {
    caller.require_admin()?;
    Ok(Json(keys::rotate(&engine.keys, &id, req).await?))
}

pub async fn revoke(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<KeyView>> {
    caller.require_admin()?;
    Ok(Json(keys::revoke(&engine.keys, &id).await?))
}
