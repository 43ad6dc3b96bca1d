//! `compact`: Lance maintenance of every table — merge small fragments, fold
//! new rows into the indexes (FTS, BTree, vector), prune versions older than
//! `prune_older_than_hours` (168) that no tag holds.

use serde_json::json;

use super::{JobContext, JobReport};
use crate::core::error::Result;
use crate::store::StoreError;

pub async fn run_once(ctx: &JobContext) -> Result<JobReport> {
    let hours = ctx
        .params
        .get("prune_older_than_hours")
        .and_then(|v| v.as_integer())
        .unwrap_or(168);
    let mut tables = serde_json::Map::new();
    let mut names: Vec<_> = ctx.services.store.tables().into_iter().collect();
    names.sort_by_key(|(n, _)| *n);
    for (name, table) in names {
        let before = table.stats().await.map_err(StoreError::from)?;
        if !ctx.dry_run {
            use lancedb::table::OptimizeAction;
            table
                .optimize(OptimizeAction::Compact {
                    options: Default::default(),
                    remap_options: None,
                })
                .await
                .map_err(StoreError::from)?;
            table
                .optimize(OptimizeAction::Index(Default::default()))
                .await
                .map_err(StoreError::from)?;
            table
                .optimize(OptimizeAction::Prune {
                    older_than: chrono::Duration::try_hours(hours),
                    delete_unverified: None,
                    error_if_tagged_old_versions: Some(false),
                })
                .await
                .map_err(StoreError::from)?;
        }
        let after = table.stats().await.map_err(StoreError::from)?;
        tables.insert(
            name.to_string(),
            json!({
                "rows": after.num_rows,
                "fragments_before": before.fragment_stats.num_fragments,
                "fragments_after": after.fragment_stats.num_fragments,
                "small_fragments_after": after.fragment_stats.num_small_fragments,
            }),
        );
    }
    Ok(json!({ "tables": tables }))
}
