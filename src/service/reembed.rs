//! Re-embedding: `embed-missing` fills in chunks without a vector of the current
//! model (none at all, or one another model made); `re-embed-all` redoes every
//! chunk. Both run as background jobs over the caller's streams, batch by batch,
//! and write through the chunk writer so a concurrent update is never lost: a
//! chunk whose content changed since it was read keeps its newer state.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::Caller;
use crate::service::tasks::{Task, TaskState};
use crate::service::Services;
use crate::store::Filter;

/// A caller's embedding jobs never overlap; two callers' jobs may.
pub fn group(caller: &str) -> String {
    format!("embed:{caller}")
}

/// Texts per embedding call: small enough that a search's query embedding does
/// not wait long behind a job batch.
const JOB_BATCH: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Missing,
    All,
}

impl Scope {
    fn kind(self) -> &'static str {
        match self {
            Scope::Missing => "embed_missing",
            Scope::All => "re_embed_all",
        }
    }
}

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedJobRequest {
    /// Wait for the job to end (default) or answer 202 at once with its id.
    #[serde(default)]
    pub wait: Option<bool>,
}

/// The reference's answer (`total_missing`, `embedded`, `failed`) plus the job.
#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct EmbedJobResponse {
    pub status: &'static str,
    pub job_id: String,
    pub total_missing: usize,
    pub embedded: usize,
    pub failed: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where to poll while it runs.
    pub progress_url: String,
}

impl EmbedJobResponse {
    pub fn from_job(job: &Task) -> EmbedJobResponse {
        let v = job.view();
        EmbedJobResponse {
            status: match v.state {
                TaskState::Running => "running",
                TaskState::Succeeded => "ok",
                TaskState::Failed => "failed",
                TaskState::Cancelled => "cancelled",
            },
            progress_url: format!("/v1/jobs/{}", v.job_id),
            job_id: v.job_id,
            total_missing: v.total,
            embedded: v.done,
            failed: v.failed,
            error: v.error,
        }
    }
}

/// The chunks a job over `scope` must (re)embed, within the caller's streams.
pub fn stale_filter(engine: &Services, caller: &Caller, scope: Scope) -> Filter {
    let filter = Filter::new().visible_to(caller);
    match scope {
        Scope::Missing => filter.stale_for(engine.embedder.model()),
        Scope::All => filter,
    }
}

/// Start a job (or 409 when the caller has one running) and return it.
pub async fn start(engine: &Arc<Services>, caller: &Caller, scope: Scope) -> Result<Arc<Task>> {
    let job = engine
        .jobs
        .start(scope.kind(), group(&caller.name), &caller.name)
        .map_err(|running| {
            Error::Conflict(format!(
                "an embedding job of yours is already running: {} (see /v1/jobs/{}; DELETE it to cancel)",
                running.view().kind,
                running.id()
            ))
        })?;
    let ids = match engine.store.ids(&stale_filter(engine, caller, scope)).await {
        Ok(ids) => ids,
        Err(e) => {
            job.finish(Some(e.to_string()));
            return Err(e.into());
        }
    };
    job.set_total(ids.len());
    tracing::info!(job = %job.id(), kind = scope.kind(), chunks = ids.len(), "embedding job started");
    tokio::spawn(run(engine.clone(), job.clone(), ids));
    Ok(job)
}

async fn run(engine: Arc<Services>, job: Arc<Task>, ids: Vec<String>) {
    let model = engine.embedder.model().to_string();
    let mut last_error = None;
    for batch in ids.chunks(JOB_BATCH) {
        // A cancel drops the batch in hand: its vectors are not written (or,
        // when the commit was already sent, written whole; both are right).
        let result = tokio::select! {
            biased;
            _ = job.cancelled() => break,
            r = embed_batch(&engine, &model, batch) => r,
        };
        match result {
            // A chunk changed meanwhile was embedded by the pipeline with the
            // current model, a deleted one needs nothing: both count as done.
            Ok((written, skipped)) => {
                job.progress(written + skipped, 0);
                if skipped > 0 {
                    tracing::debug!(skipped, "chunks changed or deleted while being re-embedded");
                }
            }
            Err(e) => {
                tracing::warn!(job = %job.id(), error = %e, "embedding batch failed");
                job.progress(0, batch.len());
                last_error = Some(e.to_string());
            }
        }
    }
    let view = job.view();
    // A job whose every batch failed has failed; partial failures are counted.
    let error = last_error.filter(|_| view.done == 0 && view.failed > 0);
    job.finish(error);
    let view = job.view();
    tracing::info!(job = %view.job_id, done = view.done, failed = view.failed, "embedding job ended");
}

/// Embed one batch of chunks and write the vectors; returns (written, skipped).
async fn embed_batch(engine: &Services, model: &str, ids: &[String]) -> Result<(usize, usize)> {
    let chunks = engine.store.find(&Filter::new().ids(ids), None).await?;
    let texts: Vec<String> = chunks.iter().map(|c| c.content.clone()).collect();
    let vectors = engine.embedder.embed(&texts).await?;
    let mut fresh: HashMap<String, (String, Vec<f32>)> = chunks
        .into_iter()
        .zip(vectors)
        .map(|(c, v)| (c.id, (c.content_hash, v)))
        .collect();
    let model = model.to_string();
    let written = engine
        .store
        .modify(
            ids.to_vec(),
            Box::new(move |chunk| match fresh.remove(&chunk.id) {
                Some((hash, vector)) if hash == chunk.content_hash => {
                    chunk.embedding = Some(vector);
                    chunk.embed_model = Some(model.clone());
                    true
                }
                _ => false,
            }),
        )
        .await?;
    Ok((written, ids.len() - written))
}
