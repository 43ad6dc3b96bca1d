//! Memory quality (MCP `memory_reflect`, `POST /v1/reflect`): how much of a
//! stream is structured enough to recall well, and what to do about the rest.
//!
//! Quality score (a percentage) = has_meta·0.4 + has_subject·0.3 + structured·0.3,
//! where each term is the share of the analysed memories that has extraction
//! metadata, a subject, and a memory type other than `general`.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Chunk};
use crate::core::time::DAY_MICROS;
use crate::core::Caller;
use crate::service::Services;

/// Types whose memories state one current truth per subject.
const SINGLE_VALUED: &[&str] = &["preference", "decision", "correction"];

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReflectRequest {
    pub stream: Option<String>,
    /// How many of the latest memories to analyse (default 1000, at most 20,000).
    pub max_chunks: Option<usize>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Breakdown {
    /// Quality score per level (`L0`, `L1`, …).
    pub by_level: BTreeMap<String, u32>,
    /// Memories per level.
    pub count_by_level: BTreeMap<String, usize>,
    pub with_extraction_meta: String,
    pub with_subject: String,
    pub structured: String,
    pub by_type: BTreeMap<String, usize>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Reflection {
    pub stream: String,
    pub chunks_analyzed: usize,
    pub quality_score: u32,
    pub breakdown: Breakdown,
    pub suggestions: Vec<String>,
}

fn has_meta(c: &Chunk) -> bool {
    c.extraction_meta
        .as_deref()
        .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
        .and_then(|v| v.as_object().map(|o| !o.is_empty()))
        .unwrap_or(false)
}

fn has_subject(c: &Chunk) -> bool {
    c.subject.as_deref().is_some_and(|s| !s.trim().is_empty())
}

fn structured(c: &Chunk) -> bool {
    c.memory_type != "general"
}

/// The score of a set of memories, as a percentage.
pub fn quality(chunks: &[&Chunk]) -> u32 {
    if chunks.is_empty() {
        return 0;
    }
    let share =
        |f: fn(&Chunk) -> bool| chunks.iter().filter(|c| f(c)).count() as f64 / chunks.len() as f64;
    (100.0 * (0.4 * share(has_meta) + 0.3 * share(has_subject) + 0.3 * share(structured))).round()
        as u32
}

fn percent(n: usize, of: usize) -> String {
    if of == 0 {
        return "0%".into();
    }
    format!("{}%", (100.0 * n as f64 / of as f64).round() as u32)
}

pub async fn reflect(
    engine: &Services,
    caller: &Caller,
    req: ReflectRequest,
) -> Result<Reflection> {
    let max = req.max_chunks.unwrap_or(1000);
    if max == 0 || max > 20_000 {
        return Err(Error::invalid("max_chunks", "must be between 1 and 20000"));
    }
    let stream = caller.resolve_stream(req.stream.as_deref())?;
    let now = now_micros();
    let chunks = crate::service::context::newest(engine, &stream, max).await?;
    let all: Vec<&Chunk> = chunks.iter().collect();
    let n = all.len();

    let mut levels: BTreeMap<String, Vec<&Chunk>> = BTreeMap::new();
    let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
    for c in &all {
        levels.entry(format!("L{}", c.level)).or_default().push(c);
        *by_type.entry(c.memory_type.clone()).or_default() += 1;
    }
    let count = |f: fn(&Chunk) -> bool| all.iter().filter(|c| f(c)).count();
    let (meta, subject, typed) = (count(has_meta), count(has_subject), count(structured));

    let mut suggestions = Vec::new();
    if n == 0 {
        suggestions.push("The stream is empty: store facts with memory_store or conversations with memory_ingest.".into());
    }
    if n > subject {
        suggestions.push(format!(
            "{} chunks lack subject metadata — run memory_dream, or store them through memory_ingest, which sets subjects",
            n - subject
        ));
    }
    if n > typed {
        suggestions.push(format!(
            "{} chunks have no memory type beyond `general` — memory_ingest types facts (preference, decision, project …)",
            n - typed
        ));
    }
    // Several current memories of one subject for a single-valued type may contradict each other.
    let mut by_subject: HashMap<(String, &str), usize> = HashMap::new();
    for c in all
        .iter()
        .filter(|c| SINGLE_VALUED.contains(&c.memory_type.as_str()))
    {
        if let Some(s) = c.subject.as_deref().filter(|s| !s.trim().is_empty()) {
            *by_subject
                .entry((s.to_lowercase(), c.memory_type.as_str()))
                .or_default() += 1;
        }
    }
    let contradictions: usize = by_subject.values().filter(|&&k| k > 1).map(|k| k - 1).sum();
    if contradictions > 0 {
        suggestions.push(format!(
            "{contradictions} potential contradictions detected (several current preferences or decisions about one subject) — run memory_dream"
        ));
    }
    let model = engine.embedder.model();
    let unembedded = all
        .iter()
        .filter(|c| c.embed_model.as_deref() != Some(model))
        .count();
    if unembedded > 0 {
        suggestions.push(format!(
            "{unembedded} chunks have no vector of the current model ({model}) — POST /v1/embed-missing"
        ));
    }
    let l0 = levels.get("L0").map_or(0, Vec::len);
    if l0 >= 20 && !levels.keys().any(|l| l != "L0") {
        suggestions.push(format!(
            "{l0} raw (L0) memories and no consolidated ones — run memory_dream"
        ));
    }
    let expiring = all
        .iter()
        .filter(|c| c.expires_at.is_some_and(|e| e <= now + 7 * DAY_MICROS))
        .count();
    if expiring > 0 {
        suggestions.push(format!("{expiring} memories expire within 7 days"));
    }
    Ok(Reflection {
        stream,
        chunks_analyzed: n,
        quality_score: quality(&all),
        breakdown: Breakdown {
            by_level: levels
                .iter()
                .map(|(l, c)| (l.clone(), quality(c)))
                .collect(),
            count_by_level: levels.iter().map(|(l, c)| (l.clone(), c.len())).collect(),
            with_extraction_meta: percent(meta, n),
            with_subject: percent(subject, n),
            structured: percent(typed, n),
            by_type,
        },
        suggestions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quality_weighs_meta_subject_and_type() {
        let mut a = Chunk::new("a".into(), "s".into(), "x".into(), 0);
        let plain = Chunk::new("b".into(), "s".into(), "y".into(), 0);
        assert_eq!(quality(&[&plain]), 0);
        a.extraction_meta = Some(r#"{"ingest": {}}"#.into());
        assert_eq!(quality(&[&a]), 40);
        a.subject = Some("user".into());
        assert_eq!(quality(&[&a]), 70);
        a.memory_type = "preference".into();
        assert_eq!(quality(&[&a]), 100);
        assert_eq!(quality(&[&a, &plain]), 50);
        assert_eq!(quality(&[]), 0);
    }
}
