//! Feedback on recalled memories (`POST /v1/feedback`, MCP `memory_feedback`):
//! every signal is a row of the `feedback` table; a per-memory tally kept in
//! memory (rebuilt from the table at start) feeds search ranking.

use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::model::now_micros;
use crate::core::Caller;
use crate::service::Services;
pub use crate::store::feedback::{FeedbackBook, FeedbackRow, Tally};

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackRequest {
    #[schemars(length(min = 1))]
    pub chunk_id: String,
    #[schemars(range(min = 0, max = 4))]
    pub usefulness: i64,
    #[serde(default)]
    pub harmful: bool,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct FeedbackResponse {
    pub feedback_id: String,
    pub chunk_id: String,
    pub usefulness: i32,
    pub harmful: bool,
    /// Every signal this memory has received.
    pub tally: Tally,
    /// The multiplier search now applies to this memory's score.
    pub ranking_factor: f32,
}

/// Record one signal on a memory the caller can see.
pub async fn record(
    engine: &Services,
    caller: &Caller,
    req: FeedbackRequest,
) -> Result<FeedbackResponse> {
    if !(0..=4).contains(&req.usefulness) {
        return Err(Error::invalid(
            "usefulness",
            "must be an integer from 0 (not useful) to 4 (crucial)",
        ));
    }
    let chunk = crate::service::memory::visible(engine, caller, &req.chunk_id).await?;
    let row = FeedbackRow {
        id: uuid::Uuid::new_v4().to_string(),
        stream: chunk.stream,
        chunk_id: chunk.id,
        usefulness: req.usefulness as i32,
        harmful: req.harmful,
        caller: caller.name.clone(),
        created_at: now_micros(),
    };
    let tally = engine.store.feedback.add(&row).await?;
    Ok(FeedbackResponse {
        feedback_id: row.id,
        chunk_id: row.chunk_id,
        usefulness: row.usefulness,
        harmful: row.harmful,
        tally,
        ranking_factor: tally.factor(engine.cfg.search.feedback_weight),
    })
}
