//! `[search]`: fusion weights, ranking factors and the access counters.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchConfig {
    /// How the legs' candidates become one score.
    #[serde(default)]
    pub fusion: Fusion,
    /// Reciprocal-rank-fusion constant k (`fusion = "rrf"`).
    pub rrf_k: f32,
    pub bm25_weight: f32,
    pub vector_weight: f32,
    /// Candidates each leg returns before fusion.
    pub candidates: usize,
    /// Vector hits less similar than this (cosine) are not candidates.
    pub min_similarity: f32,
    /// Fusion weight of the entity-graph leg (entities named in the query).
    #[serde(default = "default_graph_weight")]
    pub graph_weight: f32,
    /// How much age counts: a result's score is multiplied by
    /// `(1 - decay_weight) + decay_weight * 0.5^(age / half_life)`; pinned
    /// memories are exempt. 0 turns decay off.
    #[serde(default = "default_decay_weight")]
    pub decay_weight: f32,
    /// Half-life in days per memory type; `default` covers the unlisted ones.
    #[serde(default = "default_half_lives")]
    pub half_life_days: BTreeMap<String, f64>,
    /// Score multiplied by `importance ^ importance_weight`.
    #[serde(default = "default_importance_weight")]
    pub importance_weight: f32,
    /// Each feedback signal moves the score by this fraction (usefulness 4:
    /// `+w`, 0: `-w`, harmful: `-2w`), within [0.1, 3].
    #[serde(default = "default_feedback_weight")]
    pub feedback_weight: f32,
    /// Implicit boost of recalled memories: `1 + access_boost * ln(1 + access_count)`.
    #[serde(default = "default_access_boost")]
    pub access_boost: f32,
    /// A conversation turn (a memory whose metadata names its `role`) by the
    /// speaker the query is not about is multiplied by this: the assistant's
    /// turns, unless the query asks what the assistant said ("you
    /// recommended", "our previous chat"); then the user's. 1 turns it off.
    #[serde(default = "default_assistant_weight")]
    pub assistant_weight: f32,
    /// A memory recorded within a month or a year the query names ("in
    /// March", "last year", resolved against the request's `now`) scores
    /// `1 + time_weight` times as much; 0 = off.
    #[serde(default = "default_time_weight")]
    pub time_weight: f32,
    /// The same for a day the query names ("last Saturday", "two weeks
    /// ago"; the day with a day either side): `1 + time_weight_day`.
    #[serde(default = "default_time_weight_day")]
    pub time_weight_day: f32,
    /// The BM25 leg leaves out the words that only make the query a question
    /// ("how many", "did I", "my") and the spans of time it reaches back over
    /// ("in the past three months"); see [`super::question`].
    #[serde(default = "default_strip_question_words")]
    pub strip_question_words: bool,
    /// Pseudo-relevance feedback for the vector leg: the query vector moves
    /// toward the mean of its first `vector_feedback_docs` hits by this much
    /// (`q + w * mean`, normalised) and re-scores the leg's pool (8 ×
    /// `candidates` nearest), so memories like the best matches but unlike
    /// the question's wording are found too. 0 = off.
    #[serde(default = "default_vector_feedback")]
    pub vector_feedback: f32,
    /// How many of the vector leg's first hits the feedback averages.
    #[serde(default = "default_vector_feedback_docs")]
    pub vector_feedback_docs: usize,
    /// With `group_sessions`, a session scores as its best result plus this
    /// times the sum of its other results' scores (see [`super::sessions`]).
    #[serde(default = "default_session_rest_weight")]
    pub session_rest_weight: f32,
    /// With `group_sessions`, the sessions are ranked over the first this
    /// many results (or `top_k`, if more), each leg searching at least as
    /// deep, so which conversations a query is about does not hang on how
    /// many results the caller reads (see [`super::sessions`]).
    #[serde(default = "default_session_pool")]
    pub session_pool: usize,
    /// Results whose word sets overlap at least this much (Jaccard) collapse into the best one.
    #[serde(default = "default_near_duplicate")]
    pub near_duplicate: f32,
    /// Access counters are buffered and written in one commit this often.
    #[serde(default = "default_access_flush_ms")]
    pub access_flush_ms: u64,
    /// Above this many embedded rows the vector leg uses an ANN index (IVF-HNSW-SQ),
    /// built in the background; below it the search is exact.
    #[serde(default = "default_vector_index_min_rows")]
    pub vector_index_min_rows: usize,
    /// The Linux nice value (0–19) of the threads searches and context packs
    /// run on (see [`crate::service::reads`]): above the pipeline's 0, so
    /// that when searches keep every CPU busy the stores still get theirs.
    #[serde(default = "default_read_niceness")]
    pub read_niceness: i32,
}

fn default_read_niceness() -> i32 {
    5
}

/// How the legs' candidates become one score.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fusion {
    /// The weighted mean of each leg's relevance in [0, 1]: cosine similarity
    /// for the vector leg, the score over the leg's best for BM25 and graph.
    #[default]
    Score,
    /// Reciprocal-rank fusion: `Σ weight / (rrf_k + rank)`.
    Rrf,
}

/// The shipped `config.toml`'s `[search]` (what the tests rank with).
#[cfg(test)]
pub(crate) fn shipped() -> SearchConfig {
    let shipped: toml::Table = toml::from_str(include_str!("../../../config.toml")).unwrap();
    shipped["search"].clone().try_into().unwrap()
}

impl SearchConfig {
    /// The half-life of a memory type, in days.
    pub fn half_life(&self, memory_type: &str) -> f64 {
        self.half_life_days
            .get(memory_type)
            .or_else(|| self.half_life_days.get("default"))
            .copied()
            .unwrap_or(60.0)
    }
}

fn default_graph_weight() -> f32 {
    0.1
}

fn default_decay_weight() -> f32 {
    0.3
}

fn default_importance_weight() -> f32 {
    0.1
}

fn default_feedback_weight() -> f32 {
    0.1
}

fn default_access_boost() -> f32 {
    0.02
}

fn default_assistant_weight() -> f32 {
    0.5
}

fn default_time_weight() -> f32 {
    0.15
}

fn default_time_weight_day() -> f32 {
    0.5
}

fn default_strip_question_words() -> bool {
    true
}

fn default_vector_feedback() -> f32 {
    0.35
}

fn default_vector_feedback_docs() -> usize {
    5
}

fn default_session_rest_weight() -> f32 {
    0.1
}

fn default_session_pool() -> usize {
    100
}

fn default_near_duplicate() -> f32 {
    0.9
}

fn default_access_flush_ms() -> u64 {
    2000
}

fn default_vector_index_min_rows() -> usize {
    100_000
}

fn default_half_lives() -> BTreeMap<String, f64> {
    [
        ("correction", 180.0),
        ("preference", 180.0),
        ("decision", 90.0),
        ("general", 60.0),
        ("project", 30.0),
        ("observation", 14.0),
        ("default", 60.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}
