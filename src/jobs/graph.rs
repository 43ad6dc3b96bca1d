//! `graph` on a schedule: [`crate::service::graph_rank::analyze_all`] —
//! each stream's PageRank and Louvain communities into `graph_metrics`.
//!
//! Params: `only_changed` (false) — skip a stream with no memory newer than
//! its metrics (deletions and new links then wait for a full run).

use super::{JobContext, JobReport};
use crate::core::error::Result;
use crate::service::graph_rank::analyze_all;

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    #[serde(default)]
    only_changed: bool,
}

pub async fn run_once(ctx: &JobContext) -> Result<JobReport> {
    let p: Params = super::params(ctx, "graph")?;
    super::report(&analyze_all(&ctx.services, p.only_changed, ctx.dry_run).await?)
}
