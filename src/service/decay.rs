//! Importance decay: importance fades with each memory type's half-life (the
//! `[search.half_life_days]` table), counted from the memory's last decay (or
//! its creation) so repeated runs compound correctly; pinned and immutable
//! memories are never changed; memories past `expires_at` are deleted
//! (immutable ones excepted). The `decay` job runs it on a schedule.

use serde::Serialize;
use serde_json::json;

use crate::core::error::Result;
use crate::core::model::{now_micros, Chunk};
use crate::core::time::DAY_MICROS;
use crate::service::search::config::SearchConfig;
use crate::store::{Filter, Store};

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

/// What a decay pass did (or, dry, would do).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecayReport {
    pub decayed: usize,
    pub expired_deleted: u64,
    pub min_importance: f32,
}

/// Decay every current, unpinned, mutable memory, never below `floor`, and
/// delete the expired ones; with `dry_run`, count only.
pub async fn decay(
    store: &Store,
    cfg: &SearchConfig,
    floor: f32,
    dry_run: bool,
) -> Result<DecayReport> {
    let now = now_micros();
    let ids = store
        .ids(&Filter::new().current().unpinned().mutable())
        .await?;
    let mut decayed = 0;
    for batch in ids.chunks(BATCH) {
        if dry_run {
            decayed += batch.len();
            continue;
        }
        let cfg = cfg.clone();
        decayed += store
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
    let expired_deleted = if dry_run {
        store.count(&expired).await? as u64
    } else {
        store.delete(&expired).await?
    };
    Ok(DecayReport {
        decayed,
        expired_deleted,
        min_importance: floor,
    })
}
