//! Serendipitous associations (MCP `memory_associate`, `POST /v1/associate`):
//! memories related to a topic in ways a search would not rank first. The
//! topic's direct search hits are the seeds and are never returned; three
//! mechanisms reach past them:
//!
//! - `graph_walk`: entities of the query and the seeds → their neighbours in
//!   the entity graph → memories mentioning a neighbour;
//! - `temporal`: memories of the same session as a seed, or written within 30
//!   minutes of it;
//! - `semantic`: vector neighbours of the seeds that are related but not near
//!   copies (cosine 0.35–0.85).

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::model::{Chunk, Micros};
use crate::core::Caller;
use crate::service::search::{self, graph_leg::query_keys, SearchRequest};
use crate::service::Services;
use crate::store::Filter;

const SEEDS: usize = 5;
/// Direct hits (this many) are the obvious answers and never associations.
const OBVIOUS: usize = 10;
const WINDOW: Micros = 30 * 60 * 1_000_000;
const SEMANTIC_BAND: (f32, f32) = (0.35, 0.85);

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssociateRequest {
    /// The topic; without it the most recent memories are the seeds.
    pub query: Option<String>,
    pub stream: Option<String>,
    /// How many associations (default 5, at most 20).
    pub limit: Option<usize>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Association {
    pub rank: usize,
    pub chunk_id: String,
    pub content: String,
    /// `graph_walk`, `temporal` or `semantic` (the strongest, when several found it).
    pub mechanism: &'static str,
    pub score: f32,
    /// How it was reached.
    pub via: String,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Associations {
    pub stream: String,
    pub seeds: Vec<String>,
    pub associations: Vec<Association>,
}

struct Found {
    score: f32,
    mechanism: &'static str,
    via: String,
}

fn offer(
    found: &mut HashMap<String, Found>,
    id: &str,
    score: f32,
    mechanism: &'static str,
    via: String,
) {
    let e = found.entry(id.to_string()).or_insert(Found {
        score: 0.0,
        mechanism,
        via: String::new(),
    });
    if score > e.score {
        *e = Found {
            score,
            mechanism,
            via,
        };
    }
}

fn snippet(text: &str) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.len() <= 8 {
        words.join(" ")
    } else {
        format!("{}…", words[..8].join(" "))
    }
}

pub async fn associate(
    engine: &Services,
    caller: &Caller,
    req: AssociateRequest,
) -> Result<Associations> {
    let limit = req.limit.unwrap_or(5);
    if limit == 0 || limit > 20 {
        return Err(Error::invalid("limit", "must be between 1 and 20"));
    }
    let stream = caller.resolve_stream(req.stream.as_deref())?;
    let store = &engine.store;
    let query = req
        .query
        .as_deref()
        .map(str::trim)
        .filter(|q| !q.is_empty());
    let (seeds, obvious): (Vec<Chunk>, HashSet<String>) = match query {
        Some(q) => {
            let hits = search::recall(
                engine,
                caller,
                &SearchRequest {
                    query: q.to_string(),
                    top_k: Some(OBVIOUS),
                    stream: Some(stream.clone()),
                    dry_run: true,
                    ..Default::default()
                },
            )
            .await?
            .results;
            let obvious = hits.iter().map(|r| r.chunk.id.clone()).collect();
            (
                hits.into_iter().take(SEEDS).map(|r| r.chunk).collect(),
                obvious,
            )
        }
        None => {
            let recent = crate::service::context::newest(engine, &stream, SEEDS).await?;
            let obvious = recent.iter().map(|c| c.id.clone()).collect();
            (recent, obvious)
        }
    };
    let mut found: HashMap<String, Found> = HashMap::new();
    let streams = std::slice::from_ref(&stream);

    // Graph walk: one hop from the topic's entities.
    let mut keys: Vec<String> = query.map(query_keys).unwrap_or_default();
    for s in &seeds {
        keys.extend(s.entities.iter().cloned());
    }
    keys.sort();
    keys.dedup();
    let start: Vec<_> = store.graph.by_keys(streams, &keys).await?;
    let start_keys: HashSet<&str> = start.iter().map(|e| e.key.as_str()).collect();
    let mut hops: HashMap<String, (f32, String)> = HashMap::new();
    for e in start.iter().filter(|e| e.entity_type != "DATE") {
        for edge in store.graph.edges_of(&stream, &e.key).await? {
            let other = if edge.source == e.key {
                edge.target.clone()
            } else {
                edge.source.clone()
            };
            if start_keys.contains(other.as_str()) {
                continue;
            }
            let strength = edge.weight as f32 / (1.0 + edge.weight as f32);
            let via = format!("{} —{}— {}", e.name, edge.relation, other);
            let h = hops.entry(other).or_insert((0.0, via.clone()));
            if strength > h.0 {
                *h = (strength, via);
            }
        }
    }
    let hop_keys: Vec<String> = hops.keys().cloned().collect();
    for n in store.graph.by_keys(streams, &hop_keys).await? {
        let Some((strength, via)) = hops.get(&n.key) else {
            continue;
        };
        let rarity = 1.0 / (std::f32::consts::E + n.chunk_count as f32).ln();
        for id in n.chunk_ids.iter().rev().take(20) {
            if !obvious.contains(id) {
                offer(&mut found, id, strength * rarity, "graph_walk", via.clone());
            }
        }
    }

    // Temporal co-occurrence: the same session, or the same half hour.
    for s in &seeds {
        let filter = Filter::new().stream(&stream).current();
        let filter = match s.session_id.as_deref().filter(|x| !x.is_empty()) {
            Some(session) => filter.session(session),
            None => filter
                .created_since(s.created_at - WINDOW)
                .created_until(s.created_at + WINDOW),
        };
        for h in store.read_hits(None, &filter, 50).await? {
            if obvious.contains(&h.chunk.id) {
                continue;
            }
            let gap = (h.chunk.created_at - s.created_at).abs() as f32 / WINDOW as f32;
            let score = 0.5 * (1.0 - gap.min(1.0)) + 0.1;
            let via = format!("written alongside “{}”", snippet(&s.content));
            offer(&mut found, &h.chunk.id, score, "temporal", via);
        }
    }

    // Semantic adjacency: related, not the same.
    let seed_ids: Vec<String> = seeds.iter().map(|s| s.id.clone()).collect();
    if !seed_ids.is_empty() {
        let full = store
            .find(&Filter::new().stream(&stream).ids(&seed_ids), None)
            .await?;
        let with_vectors: Vec<&Chunk> = full.iter().filter(|c| c.embedding.is_some()).collect();
        let vectors: Vec<&[f32]> = with_vectors
            .iter()
            .filter_map(|c| c.embedding.as_deref())
            .collect();
        let neighbours = store.nearest_many(&stream, &vectors, 20).await?;
        for (seed, list) in with_vectors.iter().zip(neighbours) {
            for n in list {
                if obvious.contains(&n.id)
                    || n.similarity < SEMANTIC_BAND.0
                    || n.similarity > SEMANTIC_BAND.1
                {
                    continue;
                }
                let via = format!("close in meaning to “{}”", snippet(&seed.content));
                offer(&mut found, &n.id, n.similarity * 0.8, "semantic", via);
            }
        }
    }

    let mut ranked: Vec<(String, Found)> = found.into_iter().collect();
    ranked.sort_by(|a, b| b.1.score.total_cmp(&a.1.score).then(a.0.cmp(&b.0)));
    ranked.truncate(limit);
    let ids: Vec<String> = ranked.iter().map(|(id, _)| id.clone()).collect();
    let contents: HashMap<String, String> = if ids.is_empty() {
        HashMap::new()
    } else {
        store
            .read_hits(None, &Filter::new().stream(&stream).ids(&ids), ids.len())
            .await?
            .into_iter()
            .map(|h| (h.chunk.id, h.chunk.content))
            .collect()
    };
    let associations = ranked
        .into_iter()
        .filter_map(|(id, f)| {
            let content = contents.get(&id)?.clone();
            Some((id, f, content))
        })
        .enumerate()
        .map(|(i, (chunk_id, f, content))| Association {
            rank: i + 1,
            chunk_id,
            content,
            mechanism: f.mechanism,
            score: (f.score * 1000.0).round() / 1000.0,
            via: f.via,
        })
        .collect();
    Ok(Associations {
        stream,
        seeds: seed_ids,
        associations,
    })
}
