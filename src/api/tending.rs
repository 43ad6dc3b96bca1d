//! Tending memory: feedback on results, quality reflection and dream
//! consolidation.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;

use super::ApiJson;
use crate::app::Engine;
use crate::core::error::Result;
use crate::core::Caller;
use crate::service::feedback::{self, FeedbackRequest, FeedbackResponse};

pub async fn feedback(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<FeedbackRequest>,
) -> Result<(axum::http::StatusCode, Json<FeedbackResponse>)> {
    let answer = feedback::record(&engine, &caller, req).await?;
    Ok((axum::http::StatusCode::CREATED, Json(answer)))
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

/// `GET /v1/feedback/stats`.
pub async fn feedback_stats(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    super::ApiQuery(q): super::ApiQuery<feedback::StatsQuery>,
) -> Result<Json<feedback::FeedbackStats>> {
    Ok(Json(feedback::stats(&engine, &caller, &q).await?))
}
