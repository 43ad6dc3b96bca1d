//! Reading the entity graph for callers: one entity with its neighbours
//! (`GET /v1/graph/entity/{name}`, MCP `memory_graph`) and the totals (`GET
//! /v1/graph/stats`). Always within streams the caller may see.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::Caller;
use crate::service::Services;
use crate::store::Filter;

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphQuery {
    pub stream: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct EntityInfo {
    pub id: String,
    pub name: String,
    #[serde(rename = "type")]
    pub entity_type: String,
    pub aliases: Vec<String>,
    pub chunk_count: i64,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Neighbor {
    pub entity: String,
    pub entity_type: String,
    pub relation: String,
    /// `outgoing` when the entity is the relation's subject, else `incoming`.
    pub direction: &'static str,
    /// How many memories state this relation.
    pub weight: i64,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct EntityView {
    pub entity: EntityInfo,
    pub neighbors: Vec<Neighbor>,
    pub chunk_ids: Vec<String>,
}

/// An entity of one stream (by name or any alias seen for it) with its
/// relations and the memories that mention it, newest first.
pub async fn entity(
    engine: &Services,
    caller: &Caller,
    name: &str,
    stream: Option<&str>,
) -> Result<EntityView> {
    let Some(stream) = stream else {
        return Err(Error::invalid(
            "stream",
            "is required: the graph is isolated per stream",
        ));
    };
    let stream = caller.resolve_stream(Some(stream))?;
    if name.trim().is_empty() {
        return Err(Error::invalid("name", "must not be empty"));
    }
    let graph = &engine.store.graph;
    let row = graph
        .entity(&stream, name)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no entity `{name}` in stream `{stream}`")))?;
    let mut edges = graph.edges_of(&stream, &row.key).await?;
    edges.sort_by(|a, b| b.weight.cmp(&a.weight).then(a.id.cmp(&b.id)));
    let others: Vec<String> = edges
        .iter()
        .map(|e| {
            if e.source == row.key {
                e.target.clone()
            } else {
                e.source.clone()
            }
        })
        .collect();
    let known: HashMap<String, (String, String)> = graph
        .by_keys(std::slice::from_ref(&stream), &others)
        .await?
        .into_iter()
        .map(|e| (e.key, (e.name, e.entity_type)))
        .collect();
    let neighbors = edges
        .iter()
        .zip(&others)
        .map(|(e, other)| {
            let (name, ty) = known.get(other).cloned().unwrap_or_else(|| {
                let ty = if other == "user" { "PERSON" } else { "UNKNOWN" };
                (other.clone(), ty.to_string())
            });
            Neighbor {
                entity: name,
                entity_type: ty,
                relation: e.relation.clone(),
                direction: if e.source == row.key {
                    "outgoing"
                } else {
                    "incoming"
                },
                weight: e.weight,
            }
        })
        .collect();
    let mut chunk_ids = row.chunk_ids.clone();
    chunk_ids.reverse();
    Ok(EntityView {
        entity: EntityInfo {
            id: row.id,
            name: row.name,
            entity_type: row.entity_type,
            aliases: row.aliases,
            chunk_count: row.chunk_count,
        },
        neighbors,
        chunk_ids,
    })
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct GraphStats {
    pub total_entities: usize,
    pub total_edges: usize,
    pub avg_chunks_per_entity: f64,
}

/// Totals over one stream, or over every stream the caller may see.
pub async fn stats(engine: &Services, caller: &Caller, stream: Option<&str>) -> Result<GraphStats> {
    let scope = match stream {
        Some(s) => Filter::new().stream(&caller.resolve_stream(Some(s))?),
        None => Filter::new().visible_to(caller),
    };
    let (entities, edges, refs) = engine.store.graph.stats(&scope).await?;
    Ok(GraphStats {
        total_entities: entities,
        total_edges: edges,
        avg_chunks_per_entity: if entities == 0 {
            0.0
        } else {
            (refs as f64 / entities as f64 * 100.0).round() / 100.0
        },
    })
}
