//! `dream` on a schedule: [`crate::dream`] on every stream that has
//! unconsolidated memories and has been quiet for `idle_minutes` (30) — its
//! newest memory is at least that old.
//!
//! Params: `idle_minutes`, and the dream knobs `similarity`,
//! `related_similarity`, `contradiction_similarity`, `max_cost_usd`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{JobContext, JobReport};
use crate::core::error::Result;
use crate::core::model::now_micros;
use crate::core::Caller;
use crate::service::dream::{dream, DreamRequest};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    #[serde(default = "default_idle_minutes")]
    idle_minutes: f64,
    similarity: Option<f32>,
    related_similarity: Option<f32>,
    contradiction_similarity: Option<f32>,
    max_cost_usd: Option<f64>,
}

fn default_idle_minutes() -> f64 {
    30.0
}

#[derive(Debug, Default, Serialize)]
struct Report {
    streams: usize,
    streams_not_idle: usize,
    groups_found: usize,
    facts_merged: usize,
    contradictions_resolved: usize,
    cost_usd: f64,
}

pub async fn run_once(ctx: &JobContext) -> Result<JobReport> {
    let engine = &ctx.services;
    let p: Params = super::params(ctx, "dream")?;
    let idle = p.idle_minutes;
    let newest: BTreeMap<String, i64> = engine
        .store
        .latest_write_by_stream(&crate::store::Filter::new().level(0).current())
        .await?;
    let quiet_since = now_micros() - (idle * 60e6) as i64;
    let caller = Caller::admin("scheduler");
    let mut report = Report::default();
    for (stream, last) in newest {
        if last > quiet_since {
            report.streams_not_idle += 1;
            continue;
        }
        let req = DreamRequest {
            stream: Some(stream),
            dry_run: ctx.dry_run,
            similarity: p.similarity,
            related_similarity: p.related_similarity,
            contradiction_similarity: p.contradiction_similarity,
            max_chunks: None,
            max_cost_usd: p.max_cost_usd,
        };
        let r = dream(engine, &caller, req).await?;
        report.streams += 1;
        report.groups_found += r.groups_found;
        report.facts_merged += r.facts_merged;
        report.contradictions_resolved += r.contradictions_resolved;
        report.cost_usd += r.cost_usd;
    }
    super::report(&report)
}
