//! `dream` on a schedule: [`crate::dream`] on every stream that has
//! unconsolidated memories and has been quiet for `idle_minutes` (30) — its
//! newest memory is at least that old.
//!
//! Params: `idle_minutes`, and the dream knobs `similarity`,
//! `related_similarity`, `contradiction_similarity`, `max_cost_usd`.

use std::collections::BTreeMap;

use serde_json::json;

use super::{JobContext, JobReport};
use crate::core::error::Result;
use crate::core::model::now_micros;
use crate::core::Caller;
use crate::service::dream::{dream, DreamRequest};

fn float(ctx: &JobContext, key: &str) -> Option<f64> {
    ctx.params
        .get(key)
        .and_then(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64)))
}

pub async fn run_once(ctx: &JobContext) -> Result<JobReport> {
    let engine = &ctx.services;
    let idle = float(ctx, "idle_minutes").unwrap_or(30.0);
    let newest: BTreeMap<String, i64> = engine
        .store
        .latest_write_by_stream(&crate::store::Filter::new().level(0).current())
        .await?;
    let quiet_since = now_micros() - (idle * 60e6) as i64;
    let caller = Caller::admin("scheduler");
    let (mut streams, mut groups, mut merged, mut resolved, mut cost) = (0, 0, 0, 0, 0.0);
    let mut skipped_busy = 0;
    for (stream, last) in newest {
        if last > quiet_since {
            skipped_busy += 1;
            continue;
        }
        let req = DreamRequest {
            stream: Some(stream),
            dry_run: ctx.dry_run,
            similarity: float(ctx, "similarity").map(|x| x as f32),
            related_similarity: float(ctx, "related_similarity").map(|x| x as f32),
            contradiction_similarity: float(ctx, "contradiction_similarity").map(|x| x as f32),
            max_chunks: None,
            max_cost_usd: float(ctx, "max_cost_usd"),
        };
        let r = dream(engine, &caller, req).await?;
        streams += 1;
        groups += r.groups_found;
        merged += r.facts_merged;
        resolved += r.contradictions_resolved;
        cost += r.cost_usd;
    }
    Ok(json!({
        "streams": streams,
        "streams_not_idle": skipped_busy,
        "groups_found": groups,
        "facts_merged": merged,
        "contradictions_resolved": resolved,
        "cost_usd": cost,
    }))
}
