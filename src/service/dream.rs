//! Dream: consolidation of a stream (`POST /v1/dream`, MCP `memory_dream`).
//!
//! 1. **Contradictions** (newer wins): two current L0 memories with the same
//!    subject and a single-valued type (preference, decision, correction), close
//!    in meaning (cosine ≥ `contradiction_similarity`) but not near copies, and
//!    naming different entities: the older is superseded by the newer, its
//!    validity closed at the newer's time.
//! 2. **Groups**: the remaining L0 memories are linked when nearly the same
//!    (cosine ≥ `similarity`) or when they share a subject or an entity and are
//!    related (cosine ≥ `related_similarity`); each connected group of two or
//!    more becomes one L1 memory. Its text is the group's sentences in time
//!    order without repeats (extractive), or the LLM's summary when `[llm]` is
//!    configured and the run's `max_cost_usd` allows. The sources stay, marked
//!    `superseded_by` the L1 memory (they come back with `include_superseded`).
//! 3. Every step is a `history` row with its reason. `dry_run` reports the
//!    plan and writes nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::model::{content_hash, now_micros, Chunk};
use crate::core::tokens;
use crate::core::Caller;
use crate::providers::embed::dot;
use crate::service::Services;
use crate::store::graph::Mention;
use crate::store::{Filter, HistoryRow};

const SINGLE_VALUED: &[&str] = &["preference", "decision", "correction"];
/// Most members folded into one L1 memory (the most recent).
const MAX_GROUP: usize = 20;
/// Longest L1 text, in tokens.
const MAX_L1_TOKENS: usize = 300;

#[derive(schemars::JsonSchema, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DreamRequest {
    pub stream: Option<String>,
    #[serde(default)]
    pub dry_run: bool,
    /// Near copies are grouped at this cosine (default 0.85).
    pub similarity: Option<f32>,
    /// Memories sharing a subject or entity are grouped at this cosine (default 0.6).
    pub related_similarity: Option<f32>,
    /// Same-subject preferences/decisions this close may contradict (default 0.6).
    pub contradiction_similarity: Option<f32>,
    /// Most L0 memories considered, the most recent (default 2000).
    pub max_chunks: Option<usize>,
    /// Spend cap of the run's LLM merges in dollars (default 0.10).
    pub max_cost_usd: Option<f64>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct MergedGroup {
    pub l1_id: String,
    pub sources: Vec<String>,
    pub content: String,
    /// `extractive` or `llm`.
    pub method: &'static str,
    pub reason: String,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Resolved {
    pub superseded: String,
    pub by: String,
    pub reason: String,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct DreamReport {
    pub stream: String,
    pub dry_run: bool,
    pub chunks_processed: usize,
    pub groups_found: usize,
    /// Source memories folded into L1 memories.
    pub facts_merged: usize,
    pub contradictions_resolved: usize,
    pub cost_usd: f64,
    pub duration_ms: u64,
    pub groups: Vec<MergedGroup>,
    pub contradictions: Vec<Resolved>,
}

/// Quiet spells the idle dream settled in this process: streams it dreamed,
/// and streams whose dream another process sharing the bus ran (it held the
/// stream's lease).
#[derive(Default)]
pub struct IdleTally {
    dreamed: std::sync::atomic::AtomicU64,
    covered: std::sync::atomic::AtomicU64,
}

/// [`IdleTally`]'s counts.
#[derive(schemars::JsonSchema, Debug, Serialize, Clone, Copy, PartialEq, Eq)]
pub struct IdleStats {
    pub dreamed: u64,
    pub dreamed_elsewhere: u64,
}

impl IdleTally {
    pub fn dreamed(&self) {
        self.dreamed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn covered(&self) {
        self.covered
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn stats(&self) -> IdleStats {
        IdleStats {
            dreamed: self.dreamed.load(std::sync::atomic::Ordering::Relaxed),
            dreamed_elsewhere: self.covered.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// Streams with a dream running (one at a time per stream).
#[derive(Default)]
pub struct Running(Mutex<HashSet<String>>);

struct RunGuard<'a>(&'a Running, String);

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        self.0 .0.lock().expect("dream lock").remove(&self.1);
    }
}

fn check_unit(field: &str, v: Option<f32>, default: f32) -> Result<f32> {
    match v {
        None => Ok(default),
        Some(x) if (0.0..=1.0).contains(&x) => Ok(x),
        Some(_) => Err(Error::invalid(field, "must be between 0 and 1")),
    }
}

fn cos(a: &Chunk, b: &Chunk) -> f32 {
    match (&a.embedding, &b.embedding) {
        (Some(x), Some(y)) if x.len() == y.len() => dot(x, y),
        _ => 0.0,
    }
}

fn subject_of(c: &Chunk) -> Option<String> {
    c.subject
        .as_deref()
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty())
}

fn find(parent: &mut [usize], i: usize) -> usize {
    let mut r = i;
    while parent[r] != r {
        parent[r] = parent[parent[r]];
        r = parent[r];
    }
    r
}

/// The sentences of the members (oldest first), each kept once: a sentence
/// mostly repeating a later one gives way to it.
fn extractive(members: &[&Chunk]) -> String {
    let mut sentences: Vec<(usize, String)> = Vec::new();
    for (i, m) in members.iter().enumerate() {
        for s in m.content.split_inclusive(['.', '!', '?', '\n']) {
            let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
            if s.len() > 1 {
                sentences.push((i, s));
            }
        }
    }
    let words: Vec<crate::service::search::rank::WordSet> = sentences
        .iter()
        .map(|(_, s)| crate::service::search::rank::word_set(s))
        .collect();
    let mut kept = Vec::new();
    for (i, (_, s)) in sentences.iter().enumerate() {
        let superseded = (i + 1..sentences.len())
            .any(|j| crate::service::search::rank::near_duplicate(&words[i], &words[j], 0.7));
        if !superseded {
            let mut s = s.clone();
            if !s.ends_with(['.', '!', '?']) {
                s.push('.');
            }
            kept.push(s);
        }
    }
    let text = kept.join(" ");
    tokens::truncate(&text, MAX_L1_TOKENS).unwrap_or(text)
}

fn majority<'a>(values: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for v in values {
        *counts.entry(v).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
        .map(|(v, _)| v.to_string())
}

fn merge_meta(meta: &Option<String>, key: &str, value: serde_json::Value) -> Option<String> {
    let mut m: serde_json::Value = meta
        .as_deref()
        .and_then(|m| serde_json::from_str(m).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}));
    m[key] = value;
    Some(m.to_string())
}

const MERGE_PROMPT: &str = "You consolidate notes an assistant keeps about a user. Merge the numbered notes into one concise statement (at most 3 sentences) that keeps every distinct fact, date and name; when notes disagree, the later note wins. Answer as JSON {\"summary\": \"...\"}.";

/// Which memories a newer one supersedes (index → index) and the groups of
/// related current ones, oldest first: O(n²) comparisons, so it runs off the
/// async runtime.
fn cluster(
    pool: &[Chunk],
    similarity: f32,
    related: f32,
    contra: f32,
) -> (HashMap<usize, usize>, Vec<Vec<usize>>) {
    // 1. Contradictions: newer wins.
    let mut superseded_by: HashMap<usize, usize> = HashMap::new();
    for j in 0..pool.len() {
        let new = &pool[j];
        let (Some(subject), true) = (
            subject_of(new),
            SINGLE_VALUED.contains(&new.memory_type.as_str()),
        ) else {
            continue;
        };
        for (i, old) in pool.iter().enumerate().take(j) {
            if superseded_by.contains_key(&i)
                || old.memory_type != new.memory_type
                || subject_of(old).as_deref() != Some(subject.as_str())
                || old.created_at >= new.created_at
            {
                continue;
            }
            let c = cos(old, new);
            let differ = old.entities.iter().any(|e| !new.entities.contains(e))
                && new.entities.iter().any(|e| !old.entities.contains(e));
            if c >= contra && c < similarity && differ {
                superseded_by.insert(i, j);
            }
        }
    }
    // 2. Groups over what is still current.
    let live: Vec<usize> = (0..pool.len())
        .filter(|i| !superseded_by.contains_key(i))
        .collect();
    let mut parent: Vec<usize> = (0..pool.len()).collect();
    for (x, &i) in live.iter().enumerate() {
        for &j in &live[x + 1..] {
            let (a, b) = (&pool[i], &pool[j]);
            let c = cos(a, b);
            let shared = (subject_of(a).is_some() && subject_of(a) == subject_of(b))
                || a.entities.iter().any(|e| b.entities.contains(e));
            if c >= similarity || (shared && c >= related) {
                let (ri, rj) = (find(&mut parent, i), find(&mut parent, j));
                parent[ri.max(rj)] = ri.min(rj);
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &i in &live {
        let r = find(&mut parent, i);
        groups.entry(r).or_default().push(i);
    }
    let groups: Vec<Vec<usize>> = groups
        .into_values()
        .filter(|g| g.len() >= 2)
        .map(|mut g| {
            if g.len() > MAX_GROUP {
                g.drain(..g.len() - MAX_GROUP);
            }
            g
        })
        .collect();

    (superseded_by, groups)
}

pub async fn dream(engine: &Services, caller: &Caller, req: DreamRequest) -> Result<DreamReport> {
    let started = Instant::now();
    let stream = caller.resolve_stream(req.stream.as_deref())?;
    let similarity = check_unit("similarity", req.similarity, 0.85)?;
    let related = check_unit("related_similarity", req.related_similarity, 0.6)?;
    let contra = check_unit(
        "contradiction_similarity",
        req.contradiction_similarity,
        0.6,
    )?;
    let max_chunks = req.max_chunks.unwrap_or(2000);
    if max_chunks == 0 || max_chunks > 20_000 {
        return Err(Error::invalid("max_chunks", "must be between 1 and 20000"));
    }
    let max_cost = req.max_cost_usd.unwrap_or(0.10);
    if !(max_cost >= 0.0 && max_cost.is_finite()) {
        return Err(Error::invalid("max_cost_usd", "must be a number >= 0"));
    }
    if !engine
        .dreams
        .0
        .lock()
        .expect("dream lock")
        .insert(stream.clone())
    {
        return Err(Error::Conflict(format!(
            "a dream is already running on stream `{stream}`"
        )));
    }
    let _guard = RunGuard(&engine.dreams, stream.clone());

    let now = now_micros();
    let mut pool: Vec<Chunk> = engine
        .store
        .find(
            &Filter::new()
                .stream(&stream)
                .level(0)
                .current()
                .mutable()
                .unexpired(now),
            None,
        )
        .await?;
    pool.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    pool.truncate(max_chunks);
    pool.reverse(); // oldest first
    let processed = pool.len();

    let (pool, (superseded_by, groups)) = tokio::task::spawn_blocking(move || {
        let planned = cluster(&pool, similarity, related, contra);
        (pool, planned)
    })
    .await
    .map_err(|e| Error::Internal(format!("dream: {e}")))?;
    let contradictions: Vec<Resolved> = superseded_by
        .iter()
        .map(|(&i, &j)| Resolved {
            superseded: pool[i].id.clone(),
            by: pool[j].id.clone(),
            reason: format!(
                "dream: a newer {} about {} wins: “{}”",
                pool[j].memory_type,
                subject_of(&pool[j]).unwrap_or_default(),
                pool[j].content
            ),
        })
        .collect();

    let mut cost = 0.0;
    let mut merged = Vec::new();
    let mut l1s: Vec<Chunk> = Vec::new();
    for g in &groups {
        let members: Vec<&Chunk> = g.iter().map(|&i| &pool[i]).collect();
        let mut ids: Vec<String> = members.iter().map(|m| m.id.clone()).collect();
        ids.sort();
        let mut method = "extractive";
        let mut text = extractive(&members);
        if let Some(llm) = engine
            .llm
            .as_ref()
            .filter(|_| cost < max_cost && !req.dry_run)
        {
            let notes: Vec<String> = members
                .iter()
                .enumerate()
                .map(|(n, m)| format!("{}. {}", n + 1, m.content))
                .collect();
            let schema = serde_json::json!({
                "type": "object", "additionalProperties": false, "required": ["summary"],
                "properties": {"summary": {"type": "string"}},
            });
            match llm
                .chat_json(
                    &stream,
                    "dream",
                    MERGE_PROMPT,
                    &notes.join("\n"),
                    "dream_merge",
                    schema,
                )
                .await
            {
                Ok(reply) => {
                    cost += reply.cost_usd;
                    if let Some(s) = reply.json["summary"]
                        .as_str()
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                    {
                        text = tokens::truncate(s, MAX_L1_TOKENS).unwrap_or_else(|| s.to_string());
                        method = "llm";
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "dream merge by LLM failed; extractive instead")
                }
            }
        }
        let subject = majority(members.iter().filter_map(|m| m.subject.as_deref()));
        let reason = format!(
            "dream: {} related memories{}",
            members.len(),
            subject
                .as_deref()
                .map(|s| format!(" about {s}"))
                .unwrap_or_default()
        );
        let mut l1 = Chunk::new(
            engine.ids.derive(&["dream", &stream, &ids.join(",")]),
            stream.clone(),
            text.clone(),
            now,
        );
        l1.level = 1;
        l1.source = Some("consolidation".into());
        l1.subject = subject;
        l1.memory_type = majority(members.iter().map(|m| m.memory_type.as_str()))
            .unwrap_or_else(|| "general".into());
        let mut entities: Vec<String> = members.iter().flat_map(|m| m.entities.clone()).collect();
        entities.sort();
        entities.dedup();
        l1.entities = entities;
        l1.importance = members.iter().map(|m| m.importance).fold(1.0, f32::max);
        l1.confidence = members.iter().map(|m| m.confidence).sum::<f32>() / members.len() as f32;
        l1.pinned = members.iter().any(|m| m.pinned);
        l1.content_hash = content_hash(&l1.content);
        l1.extraction_meta = merge_meta(
            &None,
            "dream",
            serde_json::json!({"sources": ids, "method": method, "reason": reason}),
        );
        merged.push(MergedGroup {
            l1_id: l1.id.clone(),
            sources: ids,
            content: text,
            method,
            reason,
        });
        l1s.push(l1);
    }

    let report = |cost_usd: f64| DreamReport {
        stream: stream.clone(),
        dry_run: req.dry_run,
        chunks_processed: processed,
        groups_found: groups.len(),
        facts_merged: groups.iter().map(Vec::len).sum(),
        contradictions_resolved: contradictions.len(),
        cost_usd,
        duration_ms: started.elapsed().as_millis() as u64,
        groups: Vec::new(),
        contradictions: Vec::new(),
    };
    if req.dry_run || (l1s.is_empty() && contradictions.is_empty()) {
        let mut r = report(cost);
        r.groups = merged;
        r.contradictions = contradictions;
        return Ok(r);
    }

    // 3. Write: the L1 memories (embedded) and the sources' new state in one commit.
    let texts: Vec<String> = l1s.iter().map(|c| c.content.clone()).collect();
    let vectors = engine.embedder.embed(&texts).await?;
    for (c, v) in l1s.iter_mut().zip(vectors) {
        c.embedding = Some(v);
        c.embed_model = Some(engine.embedder.model().to_string());
    }
    let mut side: Vec<Chunk> = Vec::new();
    let mut history: Vec<HistoryRow> = Vec::new();
    let event = |chunk: &str, event: &str, reason: &str, related: Vec<String>| HistoryRow {
        id: uuid::Uuid::new_v4().to_string(),
        stream: stream.clone(),
        chunk_id: chunk.to_string(),
        event: event.into(),
        reason: reason.to_string(),
        related_ids: related,
        created_at: now,
    };
    for r in &contradictions {
        let old = pool.iter().find(|c| c.id == r.superseded).expect("in pool");
        let new = pool.iter().find(|c| c.id == r.by).expect("in pool");
        let mut o = old.clone();
        o.superseded_by = Some(new.id.clone());
        o.valid_until = Some(new.created_at);
        o.updated_at = now;
        o.extraction_meta = merge_meta(
            &o.extraction_meta,
            "dream_superseded",
            serde_json::json!({"by": new.id, "reason": r.reason}),
        );
        side.push(o);
        history.push(event(
            &old.id,
            "superseded",
            &r.reason,
            vec![new.id.clone()],
        ));
        history.push(event(
            &new.id,
            "supersedes",
            &r.reason,
            vec![old.id.clone()],
        ));
    }
    for g in &merged {
        for id in &g.sources {
            let mut s = pool.iter().find(|c| &c.id == id).expect("in pool").clone();
            s.superseded_by = Some(g.l1_id.clone());
            s.updated_at = now;
            s.extraction_meta = merge_meta(
                &s.extraction_meta,
                "consolidated_into",
                serde_json::json!(g.l1_id),
            );
            side.push(s);
            history.push(event(
                id,
                "merged",
                &format!("{} → L1 {}", g.reason, g.l1_id),
                vec![g.l1_id.clone()],
            ));
        }
        history.push(event(
            &g.l1_id,
            "consolidated",
            &g.reason,
            g.sources.clone(),
        ));
    }
    let mentions = l1_mentions(engine, &stream, &l1s, now).await?;
    engine.store.commit_with_side_effects(l1s, side).await?;
    engine.store.graph.record(&mentions, &[]).await?;
    engine.store.add_history(history).await?;
    tracing::info!(%stream, groups = merged.len(), contradictions = contradictions.len(), "dream done");
    let mut r = report(cost);
    r.groups = merged;
    r.contradictions = contradictions;
    Ok(r)
}

/// Graph mentions of the L1 memories, for the entities their sources had.
async fn l1_mentions(
    engine: &Services,
    stream: &str,
    l1s: &[Chunk],
    at: i64,
) -> Result<Vec<Mention>> {
    let keys: Vec<String> = l1s.iter().flat_map(|c| c.entities.clone()).collect();
    let rows = engine
        .store
        .graph
        .by_keys(&[stream.to_string()], &keys)
        .await?;
    let by_key: HashMap<&str, &crate::store::graph::EntityRow> =
        rows.iter().map(|r| (r.key.as_str(), r)).collect();
    Ok(l1s
        .iter()
        .flat_map(|c| {
            c.entities.iter().filter_map(|k| {
                let e = by_key.get(k.as_str())?;
                Some(Mention {
                    stream: stream.to_string(),
                    key: e.key.clone(),
                    name: e.name.clone(),
                    entity_type: e.entity_type.clone(),
                    surface: e.name.clone(),
                    chunk_id: c.id.clone(),
                    at,
                })
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(id: &str, text: &str) -> Chunk {
        Chunk::new(id.into(), "s".into(), text.into(), 0)
    }

    #[test]
    fn extractive_merge_keeps_each_fact_once_in_time_order() {
        let a = chunk(
            "a",
            "Dana owns the payments dashboard. The deadline is April 15.",
        );
        let b = chunk(
            "b",
            "The deadline is April 22 after the review. Dana owns the payments dashboard",
        );
        let text = extractive(&[&a, &b]);
        assert_eq!(
            text,
            "The deadline is April 15. The deadline is April 22 after the review. Dana owns the payments dashboard."
        );
    }

    #[test]
    fn majority_prefers_the_most_common_then_the_first_name() {
        assert_eq!(majority(["a", "b", "b"].into_iter()).as_deref(), Some("b"));
        assert_eq!(majority(["b", "a"].into_iter()).as_deref(), Some("a"));
        assert_eq!(majority(std::iter::empty()), None);
    }
}
