//! Feedback on recalled memories (`POST /v1/feedback`, MCP `memory_feedback`):
//! every signal is a row of the `feedback` table; a per-memory tally kept in
//! memory (rebuilt from the table at start) feeds search ranking.

use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::model::now_micros;
use crate::core::Caller;
use crate::service::Services;
pub use crate::store::feedback::{FeedbackBook, FeedbackRow, Tally};

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackRequest {
    #[schemars(length(min = 1))]
    pub chunk_id: String,
    #[schemars(range(min = 0, max = 4))]
    pub usefulness: i64,
    #[serde(default)]
    pub harmful: bool,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct FeedbackResponse {
    pub feedback_id: String,
    pub chunk_id: String,
    pub usefulness: i32,
    pub harmful: bool,
    /// Every signal this memory has received.
    pub tally: Tally,
    /// The multiplier search now applies to this memory's score.
    pub ranking_factor: f32,
}

/// Record one signal on a memory the caller can see.
pub async fn record(
    engine: &Services,
    caller: &Caller,
    req: FeedbackRequest,
) -> Result<FeedbackResponse> {
    if !(0..=4).contains(&req.usefulness) {
        return Err(Error::invalid(
            "usefulness",
            "must be an integer from 0 (not useful) to 4 (crucial)",
        ));
    }
    let chunk = crate::service::memory::visible(engine, caller, &req.chunk_id).await?;
    let row = FeedbackRow {
        id: uuid::Uuid::new_v4().to_string(),
        stream: chunk.stream,
        chunk_id: chunk.id,
        usefulness: req.usefulness as i32,
        harmful: req.harmful,
        caller: caller.name.clone(),
        created_at: now_micros(),
    };
    let tally = engine.store.feedback.add(&row).await?;
    Ok(FeedbackResponse {
        feedback_id: row.id,
        chunk_id: row.chunk_id,
        usefulness: row.usefulness,
        harmful: row.harmful,
        tally,
        ranking_factor: tally.factor(engine.cfg.search.feedback_weight),
    })
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsQuery {
    /// One stream (default: every stream the key sees).
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
    /// How many memories to name as most useful and most harmful (5; at most 100).
    #[schemars(range(min = 0, max = 100))]
    pub top: Option<usize>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Rated {
    pub chunk_id: String,
    pub tally: Tally,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct FeedbackStats {
    /// Signals recorded.
    pub signals: usize,
    /// Signals marked harmful.
    pub harmful: usize,
    /// Signals by usefulness, 0 (not useful) to 4 (crucial).
    pub by_usefulness: [usize; 5],
    /// Memories with at least one signal.
    pub memories_rated: usize,
    /// Highest summed signal first.
    pub most_useful: Vec<Rated>,
    /// Most harmful signals first (then the lowest summed signal).
    pub most_harmful: Vec<Rated>,
}

/// `GET /v1/feedback/stats`: what the feedback on the key's streams adds up to.
pub async fn stats(engine: &Services, caller: &Caller, q: &StatsQuery) -> Result<FeedbackStats> {
    let top = q.top.unwrap_or(5);
    if top > 100 {
        return Err(Error::invalid("top", "must be at most 100"));
    }
    let filter = match &q.stream {
        Some(s) => crate::store::Filter::new().stream(&caller.resolve_stream(Some(s))?),
        None => crate::store::Filter::new().visible_to(caller),
    };
    let batches = crate::store::scan(engine.store.feedback.table(), &filter).await?;
    let mut stats = FeedbackStats {
        signals: 0,
        harmful: 0,
        by_usefulness: [0; 5],
        memories_rated: 0,
        most_useful: Vec::new(),
        most_harmful: Vec::new(),
    };
    let mut ids = std::collections::BTreeSet::new();
    for b in &batches {
        let c = crate::core::model::Columns::new(b);
        for r in 0..b.num_rows() {
            let (Some(id), Some(u)) = (c.str("chunk_id", r), c.i32("usefulness", r)) else {
                continue;
            };
            stats.signals += 1;
            stats.harmful += usize::from(c.bool("harmful", r).unwrap_or(false));
            stats.by_usefulness[u.clamp(0, 4) as usize] += 1;
            ids.insert(id);
        }
    }
    stats.memories_rated = ids.len();
    let rated: Vec<Rated> = ids
        .into_iter()
        .map(|id| Rated {
            tally: engine.store.feedback.tally(&id),
            chunk_id: id,
        })
        .collect();
    let mut useful: Vec<&Rated> = rated.iter().filter(|r| r.tally.signal > 0.0).collect();
    useful.sort_by(|a, b| b.tally.signal.total_cmp(&a.tally.signal));
    let mut harmful: Vec<&Rated> = rated.iter().filter(|r| r.tally.harmful > 0).collect();
    harmful.sort_by(|a, b| {
        b.tally
            .harmful
            .cmp(&a.tally.harmful)
            .then(a.tally.signal.total_cmp(&b.tally.signal))
    });
    let pick = |v: Vec<&Rated>| {
        v.into_iter()
            .take(top)
            .map(|r| Rated {
                chunk_id: r.chunk_id.clone(),
                tally: r.tally,
            })
            .collect()
    };
    stats.most_useful = pick(useful);
    stats.most_harmful = pick(harmful);
    Ok(stats)
}

/// How many signals on one memory the caller can see were positive
/// (usefulness 3–4, not harmful) and negative (usefulness 0–1, or harmful).
pub async fn polarity(engine: &Services, caller: &Caller, id: &str) -> Result<(usize, usize)> {
    let chunk = crate::service::memory::visible(engine, caller, id).await?;
    let scope = crate::store::Filter::new().stream(&chunk.stream);
    let batches = crate::store::scan(engine.store.feedback.table(), &scope).await?;
    let (mut positive, mut negative) = (0, 0);
    for b in &batches {
        let c = crate::core::model::Columns::new(b);
        for r in 0..b.num_rows() {
            if c.str("chunk_id", r).as_deref() != Some(chunk.id.as_str()) {
                continue;
            }
            let usefulness = c.i32("usefulness", r).unwrap_or(2);
            if c.bool("harmful", r).unwrap_or(false) || usefulness <= 1 {
                negative += 1;
            } else if usefulness >= 3 {
                positive += 1;
            }
        }
    }
    Ok((positive, negative))
}
