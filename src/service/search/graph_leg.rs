//! The entity-graph leg: entities the query names (any 1–3 word span, matched
//! by entity key, so "VS Code" finds `vscode`) lead to the memories that
//! mention them. Rare entities weigh more than ones mentioned everywhere; a
//! memory mentioning several of the query's entities ranks first.

use std::collections::HashMap;

use lancedb::Table;

use crate::store::graph::entity_key;
use crate::store::{Filter, Hit, Store};

/// Words that never name an entity on their own.
const STOP: &[&str] = &[
    "a", "about", "after", "all", "am", "an", "and", "any", "are", "as", "at", "be", "been",
    "before", "but", "by", "can", "could", "did", "do", "does", "for", "from", "had", "has",
    "have", "how", "i", "if", "in", "is", "it", "its", "last", "me", "much", "my", "many", "new",
    "next", "of", "on", "or", "our", "so", "that", "the", "their", "them", "then", "there", "this",
    "to", "use", "used", "user", "uses", "was", "we", "were", "what", "when", "where", "which",
    "who", "why", "will", "with", "would", "you", "your",
];

/// The entity keys a query could name: every span of 1–3 words that neither
/// starts nor ends with a stop word, in order, without repeats.
pub fn query_keys(query: &str) -> Vec<String> {
    let words: Vec<&str> = query
        .split(|c: char| !(c.is_alphanumeric() || matches!(c, '-' | '+' | '#' | '.' | '\'')))
        .map(|w| w.trim_matches(|c: char| matches!(c, '.' | '\'' | '-')))
        .filter(|w| !w.is_empty())
        .collect();
    let mut out: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for n in 1..=3 {
        for span in words.windows(n) {
            let stop = |w: &str| STOP.contains(&w.to_lowercase().as_str());
            if stop(span[0]) || stop(span[n - 1]) {
                continue;
            }
            let key = entity_key(&span.concat());
            if key.len() >= 2 && seen.insert(key.clone()) {
                out.push(key);
            }
        }
    }
    out
}

/// The leg's hits, best first, restricted by `filter` (pushed into Lance).
pub async fn search(
    store: &Store,
    at: Option<&Table>,
    streams: &[String],
    query: &str,
    filter: &Filter,
    limit: usize,
) -> crate::store::Result<Vec<Hit>> {
    let keys = query_keys(query);
    let entities = store.graph.by_keys(streams, &keys).await?;
    // id → (score, how recent: 0 = the entity's latest mention).
    let mut scored: HashMap<&str, (f32, usize)> = HashMap::new();
    for e in entities.iter().filter(|e| e.entity_type != "DATE") {
        let weight = 1.0 / (std::f32::consts::E + e.chunk_count as f32).ln();
        for (recency, id) in e.chunk_ids.iter().rev().take(limit * 4).enumerate() {
            let s = scored.entry(id.as_str()).or_insert((0.0, recency));
            s.0 += weight;
            s.1 = s.1.min(recency);
        }
    }
    if scored.is_empty() {
        return Ok(Vec::new());
    }
    let mut ranked: Vec<(&str, f32, usize)> =
        scored.into_iter().map(|(id, (s, r))| (id, s, r)).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)).then(a.0.cmp(b.0)));
    ranked.truncate(limit * 2);
    let ids: Vec<String> = ranked.iter().map(|(id, ..)| id.to_string()).collect();
    let order: HashMap<&str, (usize, f32)> = ranked
        .iter()
        .enumerate()
        .map(|(i, (id, s, _))| (*id, (i, *s)))
        .collect();
    let mut hits = store.read_candidates(at, filter, &ids).await?;
    for h in &mut hits {
        h.score = order.get(h.chunk.id.as_str()).map_or(0.0, |o| o.1);
    }
    hits.sort_by_key(|h| order.get(h.chunk.id.as_str()).map_or(usize::MAX, |o| o.0));
    hits.truncate(limit);
    Ok(hits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_become_entity_keys() {
        let keys = query_keys("What did I decide about VS Code and the Loomem project?");
        for k in ["vscode", "loomem", "loomemproject", "decide"] {
            assert!(keys.contains(&k.to_string()), "{k} missing from {keys:?}");
        }
        assert!(!keys.contains(&"what".to_string()));
        assert!(!keys.contains(&"the".to_string()));
        assert!(query_keys("is it?").is_empty());
    }
}
