//! `reembed`: embed the memories without a vector of the current model (new
//! ones whose embedding failed, or every one after a provider switch), as
//! `POST /v1/embed-missing` does, in batches.

use super::{JobContext, JobReport};
use crate::core::error::Result;
use crate::core::Caller;
use crate::service::reembed::{self, Scope};

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {}

#[derive(Debug, serde::Serialize)]
struct Report {
    total_missing: usize,
    embedded: usize,
    failed: usize,
}

pub async fn run_once(ctx: &JobContext) -> Result<JobReport> {
    let _: Params = super::params(ctx, "reembed")?;
    let engine = &ctx.services;
    if ctx.dry_run {
        let missing = engine
            .store
            .count(&crate::store::Filter::new().stale_for(engine.embedder.model()))
            .await?;
        return super::report(&Report {
            total_missing: missing,
            embedded: 0,
            failed: 0,
        });
    }
    let job = reembed::start(engine, &Caller::admin("scheduler"), Scope::Missing).await?;
    let view = job.wait().await;
    if let Some(e) = view.error {
        return Err(crate::core::error::Error::Internal(e));
    }
    super::report(&Report {
        total_missing: view.total,
        embedded: view.done,
        failed: view.failed,
    })
}
