//! `compact`: the full maintenance pass over every table (see
//! [`crate::store::maintain::full_pass`]): merge small fragments (the chunk
//! table's as its writer does, in tiers ordered by stream), fold new rows
//! into the indexes (FTS, BTree, vector), prune versions older than
//! `prune_older_than_hours` (168) that no tag holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{JobContext, JobReport};
use crate::core::error::Result;
use crate::store::maintain::{full_pass, PassReport};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    #[serde(default = "default_prune_hours")]
    prune_older_than_hours: i64,
}

fn default_prune_hours() -> i64 {
    168
}

#[derive(Debug, Serialize)]
struct Report {
    tables: BTreeMap<&'static str, PassReport>,
}

pub async fn run_once(ctx: &JobContext) -> Result<JobReport> {
    let params: Params = super::params(ctx, "compact")?;
    let mut report = Report {
        tables: BTreeMap::new(),
    };
    let mut names: Vec<_> = ctx.services.store.tables().into_iter().collect();
    names.sort_by_key(|(n, _)| *n);
    for (name, table) in names {
        if name == crate::store::CHUNKS && !ctx.dry_run {
            // Its merge would fail a vector index build in progress.
            ctx.services.store.vector_build_finished().await;
        }
        let merge = ctx.services.store.pass_merge(name);
        let prune = chrono::Duration::try_hours(params.prune_older_than_hours);
        let pass = full_pass(&table, merge, prune, ctx.dry_run).await?;
        report.tables.insert(name, pass);
    }
    super::report(&report)
}
