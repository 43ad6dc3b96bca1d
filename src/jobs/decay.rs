//! `decay`: importance fades with each memory type's half-life (the
//! `[search.half_life_days]` table), counted from the memory's last decay (or
//! its creation) so repeated runs compound correctly; pinned and immutable
//! memories are never changed; memories past `expires_at` are deleted
//! (immutable ones excepted).
//!
//! Params: `min_importance` (0.1) — importance never falls below it.

use serde_json::json;

use super::{JobContext, JobReport};
use crate::core::error::Result;
use crate::core::model::{now_micros, Chunk};
use crate::core::time::DAY_MICROS;
use crate::store::Filter;

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

/// Memories changed per commit.
const BATCH: usize = 1000;

/// When the memory's importance last decayed, from `extraction_meta.decay.at`.
fn last_decay(c: &Chunk) -> i64 {
    c.extraction_meta
        .as_deref()
        .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
        .and_then(|m| m["decay"]["at"].as_i64())
        .unwrap_or(c.created_at)
}

pub async fn run_once(ctx: &JobContext) -> Result<JobReport> {
    let engine = &ctx.services;
    let p: Params = super::params(ctx, "decay")?;
    let floor = p.min_importance;
    let now = now_micros();
    let cfg = engine.cfg.search.clone();
    let ids = engine
        .store
        .ids(&Filter::new().current().unpinned().mutable())
        .await?;
    let mut decayed = 0;
    for batch in ids.chunks(BATCH) {
        if ctx.dry_run {
            decayed += batch.len();
            continue;
        }
        let cfg = cfg.clone();
        decayed += engine
            .store
            .modify(
                batch.to_vec(),
                Box::new(move |c: &mut Chunk| {
                    if c.pinned || c.immutable || c.importance <= floor {
                        return false;
                    }
                    let days = (now - last_decay(c)).max(0) as f64 / DAY_MICROS as f64;
                    let factor = 0.5f64.powf(days / cfg.half_life(&c.memory_type)) as f32;
                    let next = (c.importance * factor).max(floor);
                    if (c.importance - next).abs() < 1e-4 {
                        return false;
                    }
                    c.importance = next;
                    let mut meta: serde_json::Value = c
                        .extraction_meta
                        .as_deref()
                        .and_then(|m| serde_json::from_str(m).ok())
                        .filter(serde_json::Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    meta["decay"] = json!({ "at": now });
                    c.extraction_meta = Some(meta.to_string());
                    true
                }),
            )
            .await?;
    }
    let expired = Filter::new().expired(now).mutable();
    let deleted = if ctx.dry_run {
        engine.store.count(&expired).await? as u64
    } else {
        engine.store.delete(&expired).await?
    };
    Ok(json!({ "decayed": decayed, "expired_deleted": deleted, "min_importance": floor }))
}
