//! The `llm_calls` table: every LLM request with its tokens and cost, for
//! the per-stream daily budget.

use arrow_array::RecordBatch;
use futures::TryStreamExt;
use lancedb::query::{ExecutableQuery, QueryBase, Select};

use super::filter::{sql_str, ts_lit};
use super::Result;

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde::{Deserialize, Serialize};

use crate::core::model::Micros;

/// One row of `llm_calls`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LlmCall {
    pub id: String,
    pub stream: String,
    /// What the call was for: `ingest`, `ner`, `judge`.
    pub purpose: String,
    pub model: String,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_usd: f64,
    /// `ok`, or `error` (the request failed; `error` says why).
    pub status: String,
    pub error: Option<String>,
    pub latency_ms: i64,
    pub created_at: Micros,
}

pub fn call_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("purpose", DataType::Utf8, false),
        Field::new("model", DataType::Utf8, false),
        Field::new("prompt_tokens", DataType::Int64, false),
        Field::new("completion_tokens", DataType::Int64, false),
        Field::new("cost_usd", DataType::Float64, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("error", DataType::Utf8, true),
        Field::new("latency_ms", DataType::Int64, false),
        Field::new(
            "created_at",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
    ]))
}

impl super::Store {
    /// Record one LLM call (tokens, cost, outcome).
    pub async fn add_llm_call(&self, row: &LlmCall) -> Result<()> {
        let batch = crate::store::graph::rows_to_batch(call_schema(), std::slice::from_ref(row))?;
        self.llm_calls.add(batch).execute().await?;
        Ok(())
    }

    /// Dollars the LLM calls of `stream` cost since `since`.
    pub async fn llm_spent(&self, stream: &str, since: crate::core::model::Micros) -> Result<f64> {
        let batches: Vec<RecordBatch> = self
            .llm_calls
            .query()
            .only_if(format!(
                "stream = {} AND created_at >= {}",
                sql_str(stream),
                ts_lit(since)
            ))
            .select(Select::columns(&["cost_usd"]))
            .execute()
            .await?
            .try_collect()
            .await?;
        let mut total = 0.0;
        for b in &batches {
            if let Some(col) = b
                .column(0)
                .as_any()
                .downcast_ref::<arrow_array::Float64Array>()
            {
                total += col.iter().flatten().sum::<f64>();
            }
        }
        Ok(total)
    }
}
