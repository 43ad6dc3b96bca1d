//! `decay` on a schedule: [`crate::service::decay::decay`] over every stream.
//!
//! Params: `min_importance` (0.1) — importance never falls below it.

use super::{JobContext, JobReport};
use crate::core::error::Result;
use crate::service::decay::decay;

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    /// Importance never falls below it.
    #[serde(default = "default_floor")]
    min_importance: f32,
}

fn default_floor() -> f32 {
    0.1
}

pub async fn run_once(ctx: &JobContext) -> Result<JobReport> {
    let p: Params = super::params(ctx, "decay")?;
    let s = &ctx.services;
    super::report(&decay(&s.store, &s.cfg.search, p.min_importance, ctx.dry_run).await?)
}
