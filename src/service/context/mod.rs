//! What an agent loads before it works: the stream's profile (`GET
//! /v1/profile`, MCP `memory_profile`), a token-budgeted context pack (`POST
//! /v1/context-pack`, `memory_context`), ambient snippets for the start of a
//! turn (`POST /v1/ambient`) and a MEMORY.md proposal (`GET
//! /v1/generate-memory-md`). Every budget is counted with [`crate::core::tokens`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Chunk, Micros};
use crate::core::time::{parse_instant, to_rfc3339, DAY_MICROS};
use crate::core::tokens;
use crate::core::Caller;
use crate::service::search::{self, rank::Factors, SearchRequest};
use crate::service::Services;
use crate::store::Filter;

/// Most stable facts and recent items a profile lists.
const MAX_STABLE: usize = 30;
const MAX_RECENT: usize = 15;
/// "Recent" is the last week.
const RECENT_DAYS: i64 = 7;
/// How long a profile is served from the cache (a write to the stream ends it sooner).
const PROFILE_TTL: Duration = Duration::from_secs(3600);
/// Most memories read to build a profile or a MEMORY.md.
const SCAN_LIMIT: usize = 50_000;
/// Memory types that describe a moment or a plan rather than a lasting truth.
const TRANSIENT_TYPES: &[&str] = &["event", "plan", "observation", "project"];

/// The latest, unexpired memories of a stream (no embeddings), at most `limit`.
async fn latest(
    engine: &Services,
    stream: &str,
    extra: Filter,
    limit: usize,
) -> Result<Vec<Chunk>> {
    let filter = Filter::new()
        .stream(stream)
        .current()
        .unexpired(now_micros())
        .with(extra);
    Ok(engine
        .store
        .read_hits(None, &filter, limit)
        .await?
        .into_iter()
        .map(|h| h.chunk)
        .collect())
}

/// The `limit` newest of the stream's latest, unexpired memories, newest first.
pub async fn newest(engine: &Services, stream: &str, limit: usize) -> Result<Vec<Chunk>> {
    let mut all = latest(engine, stream, Filter::new(), SCAN_LIMIT).await?;
    all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    all.truncate(limit);
    Ok(all)
}

/// How much a memory's standing (decay, importance, feedback, recall count)
/// and extraction confidence recommend it, independent of any query.
fn standing(engine: &Services, c: &Chunk, now: Micros) -> f32 {
    let f = Factors::of(
        &engine.cfg.search,
        c,
        engine.store.feedback.tally(&c.id),
        now,
    );
    f.product() * c.confidence.clamp(0.05, 1.0) * if c.pinned { 1.5 } else { 1.0 }
}

fn by_score_then_recency(a: &(f32, Chunk), b: &(f32, Chunk)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0)
        .then_with(|| b.1.created_at.cmp(&a.1.created_at))
        .then_with(|| a.1.id.cmp(&b.1.id))
}

// ---------------------------------------------------------------- profile

mod ambient;
mod memory_md;
mod pack;
mod profile;

pub use ambient::*;
pub use memory_md::*;
pub use pack::*;
pub use profile::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unused_budget_flows_to_the_sections_that_need_it() {
        // Profile needs little; relevant needs a lot.
        let a = allocate(1000, &SHARES, &[50, 2000, 100]);
        assert_eq!(a, vec![50, 850, 100]);
        assert!(a.iter().sum::<usize>() <= 1000);
        // Everything needed more than its share: the shares stand.
        assert_eq!(
            allocate(1000, &SHARES, &[5000, 5000, 5000]),
            vec![200, 500, 300]
        );
        // A section not asked for has no share; its part flows on.
        let b = allocate(1000, &[0.0, 0.5, 0.0], &[0, 5000, 0]);
        assert_eq!(b, vec![0, 1000, 0]);
    }

    #[test]
    fn summary_sentence_is_short_and_closed() {
        assert_eq!(sentence("Uses Cursor. Also VSCode."), "Uses Cursor.");
        assert_eq!(sentence("Uses Cursor"), "Uses Cursor.");
    }
}
