//! Hybrid recall: the query is read for each leg (see [`question`]), then a
//! BM25 leg (the hot index's postings, else Lance's full-text index), a vector
//! leg and an entity-graph leg run concurrently over the same prefilter and
//! fuse (`search.fusion`: the weighted mean of each leg's relevance by
//! default, or weighted reciprocal rank). The fused score is then weighed by
//! the memory's standing (decay, importance, feedback, recall count, see
//! [`rank`]) and near-identical results collapse. Every filter is pushed down
//! into Lance, so a filter never empties a truncated top-k.

pub mod access;
pub mod config;
pub mod graph_leg;
pub mod queries;
pub mod question;
pub mod rank;
pub mod sessions;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::{Datelike, Duration as ChronoDuration, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Chunk, Micros};
use crate::core::time::{is_date_only, parse_instant, to_secs, DAY_MICROS};
use crate::core::Caller;
use crate::service::Services;
use crate::store::{AsOf, AsOfError, Filter, Scored};
use config::Fusion;
use rank::Factors;

/// Largest `top_k` accepted.
pub const MAX_TOP_K: usize = 1000;
/// `top_k` for aggregation questions ("how many …").
const AGGREGATION_TOP_K: usize = 30;

#[derive(schemars::JsonSchema, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    #[schemars(length(min = 1, max = 4000), regex(pattern = r"\S"))]
    pub query: String,
    #[schemars(range(min = 1, max = 1000))]
    pub top_k: Option<usize>,
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
    pub streams: Option<Vec<String>>,
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub date_from: Option<serde_json::Value>,
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub date_to: Option<serde_json::Value>,
    pub entity: Option<String>,
    #[serde(default)]
    pub trace: bool,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub valid_at: Option<serde_json::Value>,
    #[serde(default)]
    pub include_superseded: bool,
    pub fact_type: Option<String>,
    pub subject: Option<String>,
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_confidence: Option<f64>,
    /// `today`, `this_week` or `this_month` (MCP `memory_search`).
    #[schemars(regex(pattern = r"^(today|this_week|this_month)$"))]
    pub time_filter: Option<String>,
    /// Which legs run: `hybrid` (default), `bm25` or `vector`.
    #[schemars(regex(pattern = r"^(hybrid|bm25|vector)$"))]
    pub mode: Option<String>,
    /// The instant relative filters (`time_filter`) and decay count from;
    /// default now (a benchmark asks as of the question's date).
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub now: Option<serde_json::Value>,
    /// Search the store as it was: a table version (a number) or an instant
    /// (a date or RFC 3339 string: the last version committed by then).
    pub as_of: Option<serde_json::Value>,
    /// Memory types, any of them (`fact_type` is one).
    pub memory_types: Option<Vec<String>>,
    pub tags: Option<Vec<String>>,
    /// `any` (default) or `all` of `tags`.
    #[schemars(regex(pattern = r"^(any|all)$"))]
    pub tags_mode: Option<String>,
    pub session_id: Option<String>,
    pub agent_id: Option<String>,
    pub user_id: Option<String>,
    /// The vector leg keeps hits at least this similar (default
    /// `search.min_similarity`).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_similarity: Option<f32>,
    /// Whether the vector leg moves the query toward its first hits and looks
    /// again (default: on when `search.vector_feedback` > 0). Off, the leg's
    /// scores are the hits' cosine to the query itself.
    pub vector_feedback: Option<bool>,
    /// Each result lists its links to other memories (`POST /v1/relations`).
    #[serde(default)]
    pub include_relations: bool,
    /// The response adds `sessions`: the conversations of the first
    /// `search.session_pool` results (or `top_k`, if more), best first (see
    /// [`sessions`]).
    #[serde(default)]
    pub group_sessions: bool,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct SearchResponse {
    pub results: Vec<SearchResult>,
    /// With `group_sessions`: the results' sessions, best first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<Vec<sessions::SessionHit>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_metadata: Option<TraceMetadata>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct SearchResult {
    pub chunk_id: String,
    pub content: String,
    pub score_final: f32,
    /// With `include_relations`: its links, each with the other memory's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relations: Option<Vec<ResultLink>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_info: Option<TraceInfo>,
}

#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct ResultLink {
    pub relation_id: String,
    pub relation: String,
    /// `outgoing` (this memory → `memory_id`) or `incoming`.
    pub direction: &'static str,
    pub memory_id: String,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct TraceInfo {
    pub level: String,
    pub source: Option<String>,
    pub is_latest: bool,
    pub created_at: i64,
    pub memory_type: String,
    pub importance: f32,
    pub access_count: i64,
    pub version: i32,
    pub superseded_by: Option<String>,
    pub stream: String,
    /// 1-based rank and raw score in each leg that found it (BM25 score,
    /// cosine distance, graph weight).
    pub legs: HashMap<&'static str, LegTrace>,
    /// The fused score before the factors (`search.fusion`: score or RRF;
    /// the name is kept from when RRF was the only fusion).
    pub rrf: f32,
    /// What the memory's standing multiplied the fused score by.
    pub factors: Factors,
}

#[derive(schemars::JsonSchema, Debug, Clone, Copy, Serialize)]
pub struct LegTrace {
    pub rank: usize,
    pub score: f32,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct TraceMetadata {
    pub total_results_before_topk: usize,
    pub dedup_removed: usize,
    pub search_latency_us: u64,
    pub query_complexity: &'static str,
    pub top_k: usize,
    pub streams: Vec<String>,
    pub filter: String,
    /// The table version searched, when `as_of` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of_version: Option<u64>,
    /// Where the time went, in microseconds.
    pub timings_us: Timings,
}

/// The phases of one search, in microseconds. The three legs run at the same
/// time, so their times overlap; `embed` is part of `vector`.
#[derive(schemars::JsonSchema, Debug, Clone, Copy, Default, Serialize)]
pub struct Timings {
    /// Opening a past version (`as_of`).
    pub as_of: u64,
    /// The query's embedding (next to nothing when it was cached).
    pub embed: u64,
    /// The vector leg, embedding included.
    pub vector: u64,
    pub bm25: u64,
    pub graph: u64,
    /// Reading the candidates the BM25 and vector legs found.
    pub fetch: u64,
    /// Fusion, ranking factors, near-duplicate collapse, top-k.
    pub rank: u64,
}

impl Timings {
    /// Count one search's phases (and its `total`) in the metrics.
    fn record(&self, total: u64) {
        let h = &crate::core::metrics::metrics().search_seconds;
        for (phase, us) in [
            ("total", total),
            ("embed", self.embed),
            ("bm25", self.bm25),
            ("vector", self.vector),
            ("graph", self.graph),
            ("fetch", self.fetch),
            ("rank", self.rank),
        ] {
            crate::core::metrics::observe_micros(&h.with_label_values(&[phase]), us);
        }
    }
}

fn micros_since(t: Instant) -> u64 {
    t.elapsed().as_micros() as u64
}

/// The streams a search covers: `streams` when given, else `stream`, else the caller's default.
fn resolve_streams(caller: &Caller, req: &SearchRequest) -> Result<Vec<String>> {
    match &req.streams {
        Some(list) if !list.is_empty() => {
            let mut out = Vec::new();
            for s in list {
                let s = caller.resolve_stream(Some(s))?;
                if !out.contains(&s) {
                    out.push(s);
                }
            }
            Ok(out)
        }
        _ => Ok(vec![caller.resolve_stream(req.stream.as_deref())?]),
    }
}

/// The prefilter of a request, pushed down into every leg.
pub fn build_filter(streams: &[String], req: &SearchRequest, now: Micros) -> Result<Filter> {
    let mut f = Filter::new().in_streams(streams).unexpired(now);
    if !req.include_superseded {
        f = f.current();
    }
    if let Some(v) = &req.date_from {
        f = f.created_since(parse_instant("date_from", v)?);
    }
    if let Some(v) = &req.date_to {
        let t = parse_instant("date_to", v)?;
        // A bare date includes the whole day.
        f = if v.as_str().is_some_and(is_date_only) {
            f.created_before(t + DAY_MICROS)
        } else {
            f.created_until(t)
        };
    }
    if let Some(v) = &req.valid_at {
        f = f.valid_at(parse_instant("valid_at", v)?);
    }
    if let Some(e) = req
        .entity
        .as_deref()
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        f = f.mentions(e);
    }
    if let Some(t) = req
        .fact_type
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        f = f.memory_type(&t.to_lowercase());
    }
    if let Some(s) = req
        .subject
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        f = f.subject(s);
    }
    if let Some(c) = req.min_confidence {
        if !(0.0..=1.0).contains(&c) {
            return Err(Error::invalid("min_confidence", "must be between 0 and 1"));
        }
        f = f.min_confidence(c);
    }
    if let Some(tf) = &req.time_filter {
        f = f.created_since(time_filter_start(tf, now)?);
    }
    let types: Vec<String> = req
        .memory_types
        .iter()
        .flatten()
        .map(|t| t.trim().to_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    if !types.is_empty() {
        f = f.memory_types(&types);
    }
    let tags: Vec<&str> = req
        .tags
        .iter()
        .flatten()
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .collect();
    match req.tags_mode.as_deref().unwrap_or("any") {
        "any" => f = f.tagged_any(&tags),
        "all" => {
            for t in &tags {
                f = f.tagged(t);
            }
        }
        other => {
            return Err(Error::invalid(
                "tags_mode",
                format!("`{other}`: must be any or all"),
            ))
        }
    }
    if let Some(v) = &req.session_id {
        f = f.session(v);
    }
    if let Some(v) = &req.agent_id {
        f = f.agent(v);
    }
    if let Some(v) = &req.user_id {
        f = f.user(v);
    }
    Ok(f)
}

fn time_filter_start(tf: &str, now: Micros) -> Result<Micros> {
    let now = Utc
        .timestamp_micros(now)
        .single()
        .ok_or_else(|| Error::Internal("clock".into()))?;
    let today = now.date_naive();
    let day = match tf {
        "today" => today,
        "this_week" => {
            today - ChronoDuration::days(i64::from(today.weekday().num_days_from_monday()))
        }
        "this_month" => today.with_day(1).expect("day 1 exists"),
        _ => {
            return Err(Error::invalid(
                "time_filter",
                "must be one of today, this_week, this_month",
            ))
        }
    };
    Ok(day
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc()
        .timestamp_micros())
}

fn is_aggregation(query: &str) -> bool {
    let q = query.to_lowercase();
    [
        "how many",
        "how much",
        "how often",
        "count of",
        "number of",
        "list all",
        "total ",
    ]
    .iter()
    .any(|p| q.contains(p))
}

fn complexity(query: &str) -> &'static str {
    match query.split_whitespace().count() {
        0..=3 => "simple",
        4..=10 => "medium",
        _ => "complex",
    }
}

struct Fused {
    chunk: Arc<Chunk>,
    score: f32,
    /// Where each leg (in the order `fuse` was given them) ranked it.
    legs: [Option<(&'static str, LegTrace)>; LEGS],
}

/// The search's legs: BM25, vector, graph.
const LEGS: usize = 3;

impl Fused {
    /// Where the leg called `name` ranked the memory.
    #[cfg(test)]
    fn leg(&self, name: &str) -> Option<&LegTrace> {
        self.legs
            .iter()
            .flatten()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t)
    }
}

/// One recalled memory: fused score, factors, final score.
pub struct Ranked {
    pub chunk: Chunk,
    pub score: f32,
    pub rrf: f32,
    pub factors: Factors,
    pub legs: HashMap<&'static str, LegTrace>,
}

/// A result beyond the top k that a session's score counts
/// (`group_sessions`, `search.session_pool`).
pub struct Pooled {
    pub session_id: Option<String>,
    pub chunk_id: String,
    pub score: f32,
}

/// What a search found and how.
pub struct Recall {
    pub results: Vec<Ranked>,
    /// With `group_sessions`: the pool's results after `results`, best first.
    pub pooled: Vec<Pooled>,
    pub total_before_top_k: usize,
    pub dedup_removed: usize,
    pub top_k: usize,
    pub streams: Vec<String>,
    pub filter: String,
    pub as_of_version: Option<u64>,
    pub timings: Timings,
}

fn parse_as_of(v: &serde_json::Value) -> Result<AsOf> {
    match v {
        serde_json::Value::Number(n) => n.as_u64().map(AsOf::Version).ok_or_else(|| {
            Error::invalid("as_of", "a number must be a table version (a whole number)")
        }),
        serde_json::Value::String(_) => Ok(AsOf::Instant(parse_instant("as_of", v)?)),
        _ => Err(Error::invalid(
            "as_of",
            "must be a table version (number) or a date/timestamp (string)",
        )),
    }
}

/// How a leg's raw score becomes a relevance in [0, 1].
#[derive(Debug, Clone, Copy)]
enum Scale {
    /// The raw score is a cosine distance: relevance = similarity.
    Distance,
    /// Relevance = score / the leg's best score (BM25, graph weights).
    OfBest,
}

/// One leg's hits, best first, and how much it counts.
struct Leg {
    name: &'static str,
    weight: f32,
    scale: Scale,
    /// Each memory with the leg's raw score.
    hits: Vec<(Arc<Chunk>, f32)>,
}

/// The legs fused into one list, best first; every score in [0, 1].
/// `Fusion::Score`: the weighted mean of each leg's relevance (a leg that
/// missed a memory adds 0). `Fusion::Rrf`: `Σ weight / (k + rank)`, over what
/// a memory ranked first by every leg would get.
fn fuse(legs: Vec<Leg>, fusion: Fusion, k: f32) -> Vec<Fused> {
    assert!(legs.len() <= LEGS, "{} legs", legs.len());
    let total: f32 = legs.iter().map(|l| l.weight).sum();
    let rrf_max: f32 = legs.iter().map(|l| l.weight / (k + 1.0)).sum();
    let mut by_id: HashMap<String, Fused> = HashMap::new();
    for (n, leg) in legs.into_iter().enumerate() {
        let best = leg.hits.iter().map(|h| h.1).fold(0.0f32, f32::max);
        for (i, (chunk, score)) in leg.hits.into_iter().enumerate() {
            let rank = i + 1;
            let part = match fusion {
                Fusion::Rrf => leg.weight / (k + rank as f32),
                Fusion::Score => {
                    let relevance = match leg.scale {
                        Scale::Distance => 1.0 - score,
                        Scale::OfBest if best > 0.0 => score / best,
                        Scale::OfBest => 0.0,
                    };
                    leg.weight * relevance.clamp(0.0, 1.0)
                }
            };
            let e = by_id.entry(chunk.id.clone()).or_insert_with(|| Fused {
                chunk,
                score: 0.0,
                legs: [None; LEGS],
            });
            e.score += part;
            e.legs[n] = Some((leg.name, LegTrace { rank, score }));
        }
    }
    let norm = match fusion {
        Fusion::Rrf => rrf_max,
        Fusion::Score => total,
    };
    let mut out: Vec<Fused> = by_id.into_values().collect();
    for f in &mut out {
        if norm > 0.0 {
            f.score /= norm;
        }
    }
    out.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| b.chunk.created_at.cmp(&a.chunk.created_at))
            .then_with(|| a.chunk.id.cmp(&b.chunk.id))
    });
    out
}

/// [`search`] on the read runtime (see [`crate::service::reads`]): what the
/// HTTP and MCP edges call.
pub async fn search_on_reads(
    engine: &std::sync::Arc<Services>,
    caller: Caller,
    req: SearchRequest,
) -> Result<SearchResponse> {
    crate::service::reads::read(
        engine,
        move |s| async move { search(&s, &caller, req).await },
    )
    .await
}

pub async fn search(
    engine: &Services,
    caller: &Caller,
    req: SearchRequest,
) -> Result<SearchResponse> {
    let started = Instant::now();
    let recall = recall(engine, caller, &req).await?;
    let query = req.query.trim();
    let links = match req.include_relations && !recall.results.is_empty() {
        true => {
            let ids: Vec<&str> = recall.results.iter().map(|r| r.chunk.id.as_str()).collect();
            links_of(engine, &recall.streams, &ids).await?
        }
        false => std::collections::HashMap::new(),
    };
    let sessions = req.group_sessions.then(|| {
        let returned = recall
            .results
            .iter()
            .map(|r| (r.chunk.session_id.as_deref(), r.chunk.id.as_str(), r.score));
        let beyond = recall
            .pooled
            .iter()
            .map(|p| (p.session_id.as_deref(), p.chunk_id.as_str(), p.score));
        sessions::rank(
            returned.chain(beyond),
            engine.cfg.search.session_rest_weight,
        )
    });
    let mut results: Vec<SearchResult> = recall
        .results
        .into_iter()
        .map(|r| result(r, req.trace))
        .collect();
    if req.include_relations {
        for r in &mut results {
            r.relations = Some(links.get(&r.chunk_id).cloned().unwrap_or_default());
        }
    }
    Ok(SearchResponse {
        trace_metadata: req.trace.then(|| TraceMetadata {
            total_results_before_topk: recall.total_before_top_k,
            dedup_removed: recall.dedup_removed,
            search_latency_us: started.elapsed().as_micros() as u64,
            query_complexity: complexity(query),
            top_k: recall.top_k,
            streams: recall.streams,
            filter: recall.filter,
            as_of_version: recall.as_of_version,
            timings_us: recall.timings,
        }),
        results,
        sessions,
    })
}

/// The links of these memories, by memory id.
async fn links_of(
    engine: &Services,
    streams: &[String],
    ids: &[&str],
) -> Result<std::collections::HashMap<String, Vec<ResultLink>>> {
    let rows = engine
        .store
        .relations(
            &Filter::new().in_streams(streams),
            Some(&crate::store::relations::touching(ids)),
        )
        .await?;
    let mut out: std::collections::HashMap<String, Vec<ResultLink>> = Default::default();
    for r in rows {
        for (me, other, direction) in [
            (&r.from_id, &r.to_id, "outgoing"),
            (&r.to_id, &r.from_id, "incoming"),
        ] {
            if ids.contains(&me.as_str()) {
                out.entry(me.clone()).or_default().push(ResultLink {
                    relation_id: r.id.clone(),
                    relation: r.relation.clone(),
                    direction,
                    memory_id: other.clone(),
                });
            }
        }
    }
    Ok(out)
}

/// Run a search: the legs, fusion, ranking, collapse, top-k; and (unless
/// `dry_run` or `as_of`) count an access to every returned memory.
/// The longest query taken: a few paragraphs. Every leg's work grows with the
/// query (the graph leg builds a key for each span of up to three words).
pub const MAX_QUERY_CHARS: usize = 4000;

pub async fn recall(engine: &Services, caller: &Caller, req: &SearchRequest) -> Result<Recall> {
    let query = req.query.trim().to_string();
    if query.is_empty() {
        return Err(Error::invalid("query", "must not be empty"));
    }
    let chars = query.chars().count();
    if chars > MAX_QUERY_CHARS {
        return Err(Error::invalid(
            "query",
            format!("{chars} characters; at most {MAX_QUERY_CHARS}"),
        ));
    }
    let mut top_k = req.top_k.unwrap_or(10);
    if top_k == 0 || top_k > MAX_TOP_K {
        return Err(Error::invalid(
            "top_k",
            format!("must be between 1 and {MAX_TOP_K}"),
        ));
    }
    if is_aggregation(&query) {
        top_k = top_k.max(AGGREGATION_TOP_K);
    }
    let streams = resolve_streams(caller, req)?;
    let now = match &req.now {
        Some(v) => parse_instant("now", v)?,
        None => now_micros(),
    };
    let filter = build_filter(&streams, req, now)?;
    let s = &engine.cfg.search;
    let (bm25_weight, vector_weight, graph_weight) = match req.mode.as_deref().map(str::trim) {
        None | Some("hybrid") => (s.bm25_weight, s.vector_weight, s.graph_weight),
        Some("bm25") => (s.bm25_weight.max(f32::MIN_POSITIVE), 0.0, 0.0),
        Some("vector") => (0.0, s.vector_weight.max(f32::MIN_POSITIVE), 0.0),
        Some("graph") => (0.0, 0.0, s.graph_weight.max(f32::MIN_POSITIVE)),
        Some(other) => {
            return Err(Error::invalid(
                "mode",
                format!("`{other}`: must be hybrid, bm25, vector or graph"),
            ))
        }
    };
    let mut timings = Timings::default();
    let begun = Instant::now();
    let phase = begun;
    let snapshot = match &req.as_of {
        Some(v) => {
            let at = parse_as_of(v)?;
            let table = engine.store.chunks_as_of(at).await.map_err(|e| match e {
                AsOfError::NoVersion(m) => Error::invalid("as_of", m),
                AsOfError::Lance(e) => Error::from(crate::store::StoreError::from(e)),
            })?;
            let version = table
                .version()
                .await
                .map_err(crate::store::StoreError::from)?;
            Some((table, version))
        }
        None => None,
    };
    if snapshot.is_some() {
        timings.as_of = micros_since(phase);
    }
    let at = snapshot.as_ref().map(|(t, _)| t);
    // With `group_sessions`, the sessions are ranked over a pool at least
    // `search.session_pool` results deep (see `sessions`).
    let pool = match req.group_sessions {
        true => top_k.max(s.session_pool),
        false => top_k,
    };
    let candidates = s.candidates.max(pool);
    let min_similarity = match req.min_similarity {
        Some(m) if m.is_finite() && (0.0..=1.0).contains(&m) => m,
        Some(_) => return Err(Error::invalid("min_similarity", "must be between 0 and 1")),
        None => s.min_similarity,
    };

    // Each leg gets the words that find what the query is about.
    let question::Question {
        windows,
        words,
        meaning,
    } = question::read(&query, now, s);
    let bm25 = async {
        let started = Instant::now();
        let hits = if bm25_weight > 0.0 {
            engine
                .store
                .search_text(at, &words, &filter, candidates)
                .await?
        } else {
            Vec::new()
        };
        Ok::<_, Error>((hits, micros_since(started)))
    };
    let vector = async {
        let started = Instant::now();
        if vector_weight > 0.0 {
            let v = engine
                .queries
                .embed(engine.embedder.as_ref(), &meaning)
                .await?;
            let embedded = micros_since(started);
            let feedback = req.vector_feedback.unwrap_or(true)
                && s.vector_feedback > 0.0
                && s.vector_feedback_docs > 0;
            let pool = if feedback {
                (candidates * FEEDBACK_POOL).min(MAX_FEEDBACK_POOL.max(candidates))
            } else {
                candidates
            };
            let again = |near: &[(f32, &[f32])]| {
                let n = feedback_docs(s, near.iter().map(|&(d, _)| d), min_similarity);
                let best: Vec<&[f32]> = near[..n].iter().map(|&(_, v)| v).collect();
                rank::feedback_query(&v, &best, s.vector_feedback)
            };
            // From the hot index in one pass when it holds the streams.
            let held = if feedback {
                let store = &engine.store;
                store
                    .nearest_again(at, &v, &filter, pool, candidates, again)
                    .await?
            } else {
                None
            };
            let mut hits = match held {
                Some(hits) => hits,
                None => {
                    let hits = engine.store.search_vector(at, &v, &filter, pool).await?;
                    if feedback {
                        look_again(engine, at, &filter, &v, hits, min_similarity).await?
                    } else {
                        hits
                    }
                }
            };
            hits.truncate(candidates);
            // `_distance` is cosine distance: similarity = 1 - distance.
            hits.retain(|h| 1.0 - h.score >= min_similarity);
            Ok::<_, Error>((hits, embedded, micros_since(started)))
        } else {
            Ok((Vec::new(), 0, 0))
        }
    };
    let graph = async {
        let started = Instant::now();
        let hits = if graph_weight > 0.0 {
            graph_leg::search(&engine.store, at, &streams, &query, &filter, candidates).await?
        } else {
            Vec::new()
        };
        Ok::<_, Error>((hits, micros_since(started)))
    };
    // The vector leg first: its query goes to the embedding thread at once,
    // and the BM25 and graph legs (from memory, without yielding) run while
    // it is embedded.
    let (vector, bm25, graph) = tokio::join!(vector, bm25, graph);
    let ((bm25, bm25_us), (vector, embed_us, vector_us), (graph, graph_us)) =
        (bm25?, vector?, graph?);
    (timings.bm25, timings.embed, timings.vector, timings.graph) =
        (bm25_us, embed_us, vector_us, graph_us);
    let phase = Instant::now();
    // The BM25 and vector legs return ids only; their memories are read once,
    // together (reading every column of each leg's candidates cost more than
    // the searches themselves).
    let graph: Vec<(Arc<Chunk>, f32)> = graph
        .into_iter()
        .map(|h| (Arc::new(h.chunk), h.score))
        .collect();
    let mut rows: HashMap<String, Arc<Chunk>> = graph
        .iter()
        .map(|(c, _)| (c.id.clone(), Arc::clone(c)))
        .collect();
    let missing: Vec<String> = bm25
        .iter()
        .chain(&vector)
        .map(|x| x.id.clone())
        .filter(|id| !rows.contains_key(id))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !missing.is_empty() {
        for chunk in engine.store.read_shared(at, &filter, &missing).await? {
            rows.insert(chunk.id.clone(), chunk);
        }
    }
    timings.fetch = micros_since(phase);
    let phase = Instant::now();
    let as_hits = |leg: Vec<Scored>| -> Vec<(Arc<Chunk>, f32)> {
        leg.into_iter()
            .filter_map(|x| rows.get(&x.id).map(|c| (Arc::clone(c), x.score)))
            .collect()
    };
    let fused = fuse(
        vec![
            Leg {
                name: "bm25",
                weight: bm25_weight,
                scale: Scale::OfBest,
                hits: as_hits(bm25),
            },
            Leg {
                name: "vector",
                weight: vector_weight,
                scale: Scale::Distance,
                hits: as_hits(vector),
            },
            Leg {
                name: "graph",
                weight: graph_weight,
                scale: Scale::OfBest,
                hits: graph,
            },
        ],
        s.fusion,
        s.rrf_k,
    );
    let total_before_top_k = fused.len();

    let about_assistant = rank::asks_about_assistant(&query);
    // Every candidate is scored while it is still shared with the hot
    // index; only the top k are copied out.
    let mut ranked: Vec<(f32, Factors, Fused)> = fused
        .into_iter()
        .map(|f| {
            let mut factors =
                Factors::of(s, &f.chunk, engine.store.feedback.tally(&f.chunk.id), now);
            factors.speaker = rank::speaker_factor(s, &f.chunk, about_assistant);
            factors.time = rank::time_factor(s, &f.chunk, &windows);
            (f.score * factors.product(), factors, f)
        })
        .collect();
    ranked.sort_by(|(a, _, fa), (b, _, fb)| {
        b.total_cmp(a)
            .then_with(|| fb.chunk.created_at.cmp(&fa.chunk.created_at))
            .then_with(|| fa.chunk.id.cmp(&fb.chunk.id))
    });

    // Collapse near-identical results: the best of each group stays. Only
    // until the pool is full: what ranks below is never returned or grouped.
    // Beyond the top k only what a session's score needs is kept.
    let mut seen: Vec<(Arc<Chunk>, rank::WordSet)> = Vec::new();
    let mut results: Vec<Ranked> = Vec::new();
    let mut pooled: Vec<Pooled> = Vec::new();
    let mut dedup_removed = 0;
    for (score, factors, f) in ranked {
        if seen.len() == pool {
            break;
        }
        let words = rank::word_set(&f.chunk.content);
        let duplicate = seen.iter().any(|(c, w)| {
            c.content_hash == f.chunk.content_hash
                || rank::near_duplicate(w, &words, s.near_duplicate)
        });
        if duplicate {
            // Counted until the top k are found, as the trace says.
            dedup_removed += usize::from(results.len() < top_k);
            continue;
        }
        seen.push((Arc::clone(&f.chunk), words));
        if results.len() < top_k {
            results.push(Ranked {
                score,
                rrf: f.score,
                factors,
                legs: f.legs.into_iter().flatten().collect(),
                chunk: Arc::unwrap_or_clone(f.chunk),
            });
        } else {
            pooled.push(Pooled {
                session_id: f.chunk.session_id.clone(),
                chunk_id: f.chunk.id.clone(),
                score,
            });
        }
    }
    timings.rank = micros_since(phase);
    timings.record(micros_since(begun));
    if !req.dry_run && snapshot.is_none() {
        engine
            .access
            .record(results.iter().map(|r| r.chunk.id.clone()), now_micros());
    }
    Ok(Recall {
        results,
        pooled,
        total_before_top_k,
        dedup_removed,
        top_k,
        streams,
        filter: filter.to_string(),
        as_of_version: snapshot.map(|(_, v)| v),
        timings,
    })
}

/// How many times `search.candidates` the vector leg's first search returns
/// when its feedback is on: the pool the moved query re-scores.
const FEEDBACK_POOL: usize = 8;

/// The pool's size at most (unless `candidates` alone is more): a large
/// `top_k` re-scores its own candidates rather than reading thousands of
/// vectors.
const MAX_FEEDBACK_POOL: usize = 1000;

/// How many of the vector leg's first hits (their cosine distances, nearest
/// first) move its query: the first `vector_feedback_docs` that pass
/// `min_similarity`.
fn feedback_docs(
    s: &config::SearchConfig,
    distances: impl Iterator<Item = f32>,
    min_similarity: f32,
) -> usize {
    distances
        .take_while(|d| 1.0 - d >= min_similarity)
        .take(s.vector_feedback_docs)
        .count()
}

/// The vector leg's second look (`search.vector_feedback`) through Lance, for
/// what the hot index does not hold ([`crate::store::Store::nearest_again`]
/// answers the rest in one pass): the query moved
/// toward the first `vector_feedback_docs` hits that pass `min_similarity`
/// re-scores the first search's pool (`candidates × FEEDBACK_POOL` nearest),
/// nearest first. Without such hits the pool stays as it was.
async fn look_again(
    engine: &Services,
    at: Option<&lancedb::Table>,
    filter: &Filter,
    query: &[f32],
    pool: Vec<Scored>,
    min_similarity: f32,
) -> Result<Vec<Scored>> {
    let s = &engine.cfg.search;
    let n = feedback_docs(s, pool.iter().map(|h| h.score), min_similarity);
    if n == 0 {
        return Ok(pool);
    }
    let best: Vec<String> = pool[..n].iter().map(|h| h.id.clone()).collect();
    let mut vectors = engine.store.vectors_of(at, filter, &best).await?;
    let near: Vec<Vec<f32>> = best.iter().filter_map(|id| vectors.remove(id)).collect();
    let Some(moved) = rank::feedback_query(query, &near, s.vector_feedback) else {
        return Ok(pool);
    };
    let ids: Vec<String> = pool.into_iter().map(|h| h.id).collect();
    let mut rescored = engine.store.distances(at, filter, ids, &moved).await?;
    rescored.sort_by(|a, b| a.score.total_cmp(&b.score).then_with(|| a.id.cmp(&b.id)));
    Ok(rescored)
}

fn result(r: Ranked, trace: bool) -> SearchResult {
    let c = r.chunk;
    let content = if c.superseded_by.is_some() {
        format!("[UPDATED] {}", c.content)
    } else {
        c.content.clone()
    };
    SearchResult {
        chunk_id: c.id.clone(),
        content,
        score_final: r.score,
        relations: None,
        trace_info: trace.then(|| TraceInfo {
            level: format!("L{}", c.level),
            source: c.source.clone(),
            is_latest: c.superseded_by.is_none(),
            created_at: to_secs(c.created_at),
            memory_type: c.memory_type.clone(),
            importance: c.importance,
            access_count: c.access_count,
            version: c.version,
            superseded_by: c.superseded_by.clone(),
            stream: c.stream.clone(),
            legs: r.legs,
            rrf: r.rrf,
            factors: r.factors,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(id: &str) -> (Arc<Chunk>, f32) {
        scored(id, 0.5)
    }

    fn scored(id: &str, score: f32) -> (Arc<Chunk>, f32) {
        (
            Arc::new(Chunk::new(id.into(), "s".into(), id.into(), 0)),
            score,
        )
    }

    fn leg(name: &'static str, weight: f32, hits: Vec<(Arc<Chunk>, f32)>) -> Leg {
        Leg {
            name,
            weight,
            scale: if name == "vector" {
                Scale::Distance
            } else {
                Scale::OfBest
            },
            hits,
        }
    }

    #[test]
    fn rrf_rewards_agreement_between_legs() {
        let fused = fuse(
            vec![
                leg("bm25", 1.0, vec![hit("a"), hit("b"), hit("c")]),
                leg("vector", 1.0, vec![hit("b"), hit("d"), hit("a")]),
            ],
            Fusion::Rrf,
            60.0,
        );
        let ids: Vec<&str> = fused.iter().map(|f| f.chunk.id.as_str()).collect();
        // b: ranks 2 and 1; a: 1 and 3; d: 2 in one leg; c: 3 in one leg.
        assert_eq!(ids, vec!["b", "a", "d", "c"]);
        assert!(fused[0].score <= 1.0 && fused[0].score > 0.9);
        assert_eq!(fused[0].leg("bm25").unwrap().rank, 2);
        assert_eq!(fused[0].leg("vector").unwrap().rank, 1);
    }

    #[test]
    fn weights_tilt_the_fusion() {
        for fusion in [Fusion::Rrf, Fusion::Score] {
            let fused = fuse(
                vec![
                    leg("bm25", 0.0, vec![hit("a")]),
                    leg("vector", 1.0, vec![hit("b")]),
                ],
                fusion,
                60.0,
            );
            assert_eq!(fused[0].chunk.id, "b", "{fusion:?}");
            assert_eq!(fused[1].score, 0.0, "{fusion:?}");
        }
    }

    #[test]
    fn score_fusion_weighs_how_relevant_each_leg_found_a_memory() {
        // BM25 scores 12 / 6 / 3 → 1, 0.5, 0.25 of the best; cosine distances
        // 0.2 / 0.5 → similarities 0.8 and 0.5.
        let fused = fuse(
            vec![
                leg(
                    "bm25",
                    0.4,
                    vec![scored("a", 12.0), scored("b", 6.0), scored("c", 3.0)],
                ),
                leg("vector", 0.6, vec![scored("c", 0.2), scored("b", 0.5)]),
            ],
            Fusion::Score,
            60.0,
        );
        let got: Vec<(&str, f32)> = fused
            .iter()
            .map(|f| (f.chunk.id.as_str(), f.score))
            .collect();
        let want = [
            ("c", 0.4 * 0.25 + 0.6 * 0.8),
            ("b", 0.4 * 0.5 + 0.6 * 0.5),
            ("a", 0.4),
        ];
        assert_eq!(got.len(), 3);
        for ((id, score), (want_id, want_score)) in got.iter().zip(want) {
            assert_eq!(*id, want_id, "{got:?}");
            assert!((score - want_score).abs() < 1e-6, "{got:?}");
        }
        // Ranks stay each leg's own; scores the raw ones.
        assert_eq!(fused[0].leg("bm25").unwrap().rank, 3);
        assert_eq!(fused[0].leg("vector").unwrap().score, 0.2);
    }

    #[test]
    fn filter_pushes_every_condition_down() {
        let req = SearchRequest {
            query: "q".into(),
            date_from: Some(serde_json::json!("2026-01-01")),
            date_to: Some(serde_json::json!("2026-01-31")),
            entity: Some("Cursor".into()),
            fact_type: Some("preference".into()),
            min_confidence: Some(0.5),
            valid_at: Some(serde_json::json!(1_700_000_000)),
            ..Default::default()
        };
        let f = build_filter(&["a'b".into()], &req, 0).unwrap().to_string();
        assert!(f.starts_with("stream IN ('a''b')"), "{f}");
        for part in [
            "superseded_by IS NULL",
            "array_has(entities, 'cursor')",
            "memory_type = 'preference'",
            "confidence >= 0.5",
            "valid_from IS NULL OR valid_from <=",
            "created_at < arrow_cast(1769904000000000",
        ] {
            assert!(f.contains(part), "missing {part} in {f}");
        }
    }

    #[test]
    fn aggregation_questions_are_recognised() {
        assert!(is_aggregation("How many books did I buy?"));
        assert!(!is_aggregation("What IDE do I use?"));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::core::time::MAX_ABS_MICROS;
    use proptest::prelude::*;

    proptest! {
        /// Every instant a request may name starts each relative window at
        /// or before itself, without overflow.
        #[test]
        fn time_filters_start_at_or_before_now(now in -MAX_ABS_MICROS..=MAX_ABS_MICROS) {
            for tf in ["today", "this_week", "this_month"] {
                let start = time_filter_start(tf, now).unwrap();
                prop_assert!(start <= now);
                prop_assert!(now - start < 31 * crate::core::time::DAY_MICROS);
            }
        }
    }
}
