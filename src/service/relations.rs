//! Links between memories and walking them: typed relations (CRUD, in the
//! history of both memories), a memory's related memories (by relation and
//! by shared entities), and over a stream's graph of memories and the
//! entities they mention, the N-hop neighbourhood of a node and the shortest
//! path between two nodes (petgraph).

use std::collections::{BTreeMap, HashMap};

use petgraph::graph::{NodeIndex, UnGraph};
use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Chunk};
use crate::core::Caller;
use crate::service::memory::visible;
use crate::service::Services;
use crate::store::relations::{touching, RelationRow};
use crate::store::{Filter, HistoryRow};

/// The relation names loomem gives a meaning to; any other name of the same
/// shape is accepted as free-form.
pub const KNOWN: &[&str] = &[
    "relates_to",
    "supports",
    "contradicts",
    "caused_by",
    "part_of",
    "follows",
];

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelateRequest {
    #[schemars(length(min = 1))]
    pub from_id: String,
    #[schemars(length(min = 1))]
    pub to_id: String,
    /// `relates_to`, `supports`, `contradicts`, `caused_by`, `part_of`,
    /// `follows`, or a name of your own (1–64 of a-z, 0-9, `_`, `-`, `:`).
    #[schemars(regex(pattern = r"^[A-Za-z0-9_:-]{1,64}$"))]
    pub relation: String,
    /// 0–10 (1).
    #[schemars(range(min = 0.0, max = 10.0))]
    pub weight: Option<f32>,
    pub note: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Relation {
    /// `created`, or `exists` when the same link was made before.
    pub status: &'static str,
    #[serde(flatten)]
    pub relation: RelationRow,
}

fn relation_name(raw: &str) -> Result<String> {
    let name = raw.trim().to_lowercase();
    if crate::store::relations::is_relation_name(&name) {
        Ok(name)
    } else {
        Err(Error::invalid(
            "relation",
            "1-64 characters of letters, digits, _ - :",
        ))
    }
}

fn history(chunk_id: &str, stream: &str, event: &str, reason: String, other: &str) -> HistoryRow {
    HistoryRow {
        id: uuid::Uuid::new_v4().to_string(),
        stream: stream.to_string(),
        chunk_id: chunk_id.to_string(),
        event: event.into(),
        reason,
        related_ids: vec![other.to_string()],
        created_at: now_micros(),
    }
}

/// `POST /v1/relations`: link two memories of one stream.
pub async fn create(engine: &Services, caller: &Caller, req: RelateRequest) -> Result<Relation> {
    let relation = relation_name(&req.relation)?;
    let weight = req.weight.unwrap_or(1.0);
    if !weight.is_finite() || !(0.0..=10.0).contains(&weight) {
        return Err(Error::invalid("weight", "must be between 0 and 10"));
    }
    let from = visible(engine, caller, &req.from_id).await?;
    if req.from_id == req.to_id {
        return Err(Error::invalid("to_id", "a memory is not linked to itself"));
    }
    let to = visible(engine, caller, &req.to_id).await?;
    if from.stream != to.stream {
        return Err(Error::invalid("to_id", "links join memories of one stream"));
    }
    let same = format!(
        "from_id = '{}' AND to_id = '{}' AND relation = '{}'",
        from.id.replace('\'', "''"),
        to.id.replace('\'', "''"),
        relation
    );
    let scope = Filter::new().stream(&from.stream);
    if let Some(existing) = engine.store.relations(&scope, Some(&same)).await?.pop() {
        return Ok(Relation {
            status: "exists",
            relation: existing,
        });
    }
    let row = RelationRow {
        id: uuid::Uuid::new_v4().to_string(),
        stream: from.stream.clone(),
        from_id: from.id.clone(),
        to_id: to.id.clone(),
        relation: relation.clone(),
        weight,
        note: req.note.filter(|n| !n.trim().is_empty()),
        created_by: caller.name.clone(),
        created_at: now_micros(),
    };
    engine.store.add_relations(vec![row.clone()]).await?;
    engine
        .store
        .add_history(vec![
            history(
                &from.id,
                &from.stream,
                "related",
                format!("{relation} → {}", to.id),
                &to.id,
            ),
            history(
                &to.id,
                &to.stream,
                "related",
                format!("{relation} ← {}", from.id),
                &from.id,
            ),
        ])
        .await?;
    Ok(Relation {
        status: "created",
        relation: row,
    })
}

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelationsQuery {
    /// Links from or to this memory.
    pub memory_id: Option<String>,
    pub relation: Option<String>,
    /// One stream (default: every stream the key sees).
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Relations {
    pub relations: Vec<RelationRow>,
}

fn scope(caller: &Caller, stream: Option<&str>) -> Result<Filter> {
    Ok(match stream {
        Some(s) => Filter::new().stream(&caller.resolve_stream(Some(s))?),
        None => Filter::new().visible_to(caller),
    })
}

/// `GET /v1/relations`.
pub async fn list(engine: &Services, caller: &Caller, q: &RelationsQuery) -> Result<Relations> {
    let filter = scope(caller, q.stream.as_deref())?;
    let mut conds = Vec::new();
    if let Some(id) = q.memory_id.as_deref() {
        conds.push(touching(&[id]));
    }
    if let Some(r) = q.relation.as_deref() {
        conds.push(format!("relation = '{}'", relation_name(r)?));
    }
    let cond = (!conds.is_empty()).then(|| conds.join(" AND "));
    let mut relations = engine.store.relations(&filter, cond.as_deref()).await?;
    relations.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(Relations { relations })
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Unrelated {
    pub deleted: String,
}

/// `DELETE /v1/relations/{id}`.
pub async fn delete(engine: &Services, caller: &Caller, id: &str) -> Result<Unrelated> {
    let missing = || Error::NotFound(format!("no relation with id `{id}`"));
    let cond = format!("id = '{}'", id.replace('\'', "''"));
    let row = engine
        .store
        .relations(&Filter::new().visible_to(caller), Some(&cond))
        .await?
        .pop()
        .ok_or_else(missing)?;
    engine
        .store
        .delete_relations(&Filter::new().stream(&row.stream), &cond)
        .await?;
    let why = |arrow: &str, other: &str| format!("{} {arrow} {other} removed", row.relation);
    engine
        .store
        .add_history(vec![
            history(
                &row.from_id,
                &row.stream,
                "unrelated",
                why("→", &row.to_id),
                &row.to_id,
            ),
            history(
                &row.to_id,
                &row.stream,
                "unrelated",
                why("←", &row.from_id),
                &row.from_id,
            ),
        ])
        .await?;
    Ok(Unrelated { deleted: row.id })
}

/// A memory as the graph routes show it.
#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct MemoryRef {
    pub id: String,
    pub content: String,
    pub memory_type: String,
}

impl MemoryRef {
    fn of(c: &Chunk) -> MemoryRef {
        MemoryRef {
            id: c.id.clone(),
            content: c.content.clone(),
            memory_type: c.memory_type.clone(),
        }
    }
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Linked {
    pub relation_id: String,
    pub relation: String,
    /// `outgoing` (this memory → the other) or `incoming`.
    pub direction: &'static str,
    pub weight: f32,
    pub memory: MemoryRef,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct SharesEntities {
    pub memory: MemoryRef,
    /// The entities both mention.
    pub entities: Vec<String>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Related {
    pub memory_id: String,
    /// Memories linked to it by a relation.
    pub linked: Vec<Linked>,
    /// Current memories that mention its entities, the most shared first.
    pub shared_entities: Vec<SharesEntities>,
}

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelatedQuery {
    /// Only links of this relation.
    pub relation: Option<String>,
    /// Most memories in `shared_entities` (10; at most 100).
    #[schemars(range(min = 0, max = 100))]
    pub limit: Option<usize>,
}

/// `GET /v1/memories/{id}/related`.
pub async fn related(
    engine: &Services,
    caller: &Caller,
    id: &str,
    q: &RelatedQuery,
) -> Result<Related> {
    let limit = q.limit.unwrap_or(10);
    if limit > 100 {
        return Err(Error::invalid("limit", "must be at most 100"));
    }
    let memory = visible(engine, caller, id).await?;
    let stream = Filter::new().stream(&memory.stream);
    let mut cond = touching(&[id]);
    if let Some(r) = q.relation.as_deref() {
        cond = format!("{cond} AND relation = '{}'", relation_name(r)?);
    }
    let links = engine.store.relations(&stream, Some(&cond)).await?;
    let others: Vec<&str> = links
        .iter()
        .map(|l| {
            if l.from_id == id {
                l.to_id.as_str()
            } else {
                l.from_id.as_str()
            }
        })
        .collect();
    let found: HashMap<String, Chunk> = if others.is_empty() {
        HashMap::new()
    } else {
        engine
            .store
            .find_rows(&stream.clone().ids(&others), None)
            .await?
            .into_iter()
            .map(|c| (c.id.clone(), c))
            .collect()
    };
    let mut linked: Vec<Linked> = links
        .iter()
        .filter_map(|l| {
            let (direction, other) = if l.from_id == id {
                ("outgoing", &l.to_id)
            } else {
                ("incoming", &l.from_id)
            };
            found.get(other).map(|c| Linked {
                relation_id: l.id.clone(),
                relation: l.relation.clone(),
                direction,
                weight: l.weight,
                memory: MemoryRef::of(c),
            })
        })
        .collect();
    linked.sort_by(|a, b| {
        b.weight
            .total_cmp(&a.weight)
            .then(a.memory.id.cmp(&b.memory.id))
    });

    let mut shared: BTreeMap<String, (Chunk, Vec<String>)> = BTreeMap::new();
    for entity in memory.entities.iter().take(32) {
        let mentions = engine
            .store
            .find_rows(
                &stream.clone().current().mentions_key(entity).not_id(id),
                Some(200),
            )
            .await?;
        for c in mentions {
            shared
                .entry(c.id.clone())
                .or_insert_with(|| (c, Vec::new()))
                .1
                .push(entity.clone());
        }
    }
    let mut shared: Vec<(Chunk, Vec<String>)> = shared.into_values().collect();
    shared.sort_by(|a, b| {
        b.1.len()
            .cmp(&a.1.len())
            .then(b.0.created_at.cmp(&a.0.created_at))
    });
    Ok(Related {
        memory_id: memory.id,
        linked,
        shared_entities: shared
            .into_iter()
            .take(limit)
            .map(|(c, entities)| SharesEntities {
                memory: MemoryRef::of(&c),
                entities,
            })
            .collect(),
    })
}

/// A node of a stream's graph: a memory, or an entity (by its key).
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Node {
    /// `memory` or `entity`.
    pub kind: &'static str,
    /// The memory's id, or the entity's key (lower-case letters and digits:
    /// "VS Code" is `vscode`).
    pub id: String,
    /// The memory's text (its first 200 characters) or the entity's key.
    pub label: String,
}

#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct Edge {
    pub from: String,
    pub to: String,
    /// The relation's name, or `mentions` (a memory → an entity it names).
    pub kind: String,
}

/// A stream's current memories, the entities they mention and the
/// relations between them, as one undirected graph.
pub(crate) struct StreamGraph {
    pub(crate) graph: UnGraph<Node, String>,
    index: HashMap<(&'static str, String), NodeIndex>,
}

impl StreamGraph {
    pub(crate) async fn load(engine: &Services, stream: &str) -> Result<StreamGraph> {
        let scope = Filter::new().stream(stream);
        let memories = engine
            .store
            .find_rows(&scope.clone().current(), None)
            .await?;
        let relations = engine.store.relations(&scope, None).await?;
        let mut g = StreamGraph {
            graph: UnGraph::new_undirected(),
            index: HashMap::new(),
        };
        for m in &memories {
            let label: String = m.content.chars().take(200).collect();
            let at = g.node("memory", &m.id, label);
            for e in &m.entities {
                let entity = g.node("entity", e, e.clone());
                g.graph.add_edge(at, entity, "mentions".into());
            }
        }
        for r in relations {
            let (Some(&a), Some(&b)) = (
                g.index.get(&("memory", r.from_id.clone())),
                g.index.get(&("memory", r.to_id.clone())),
            ) else {
                continue; // a superseded end
            };
            g.graph.add_edge(a, b, r.relation);
        }
        Ok(g)
    }

    fn node(&mut self, kind: &'static str, id: &str, label: String) -> NodeIndex {
        if let Some(&ix) = self.index.get(&(kind, id.to_string())) {
            return ix;
        }
        let ix = self.graph.add_node(Node {
            kind,
            id: id.to_string(),
            label,
        });
        self.index.insert((kind, id.to_string()), ix);
        ix
    }

    fn find(&self, field: &str, spec: &NodeSpec) -> Result<NodeIndex> {
        self.index
            .get(&(spec.kind, spec.id.clone()))
            .copied()
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "{field}: no current {} `{}` in this stream",
                    spec.kind, spec.id
                ))
            })
    }

    /// The edges among `nodes`, each once.
    fn edges_among(&self, nodes: &[NodeIndex]) -> Vec<Edge> {
        let set: std::collections::HashSet<NodeIndex> = nodes.iter().copied().collect();
        let mut out = Vec::new();
        for e in self.graph.edge_indices() {
            let (a, b) = self.graph.edge_endpoints(e).expect("an edge has ends");
            if set.contains(&a) && set.contains(&b) {
                out.push(Edge {
                    from: self.graph[a].id.clone(),
                    to: self.graph[b].id.clone(),
                    kind: self.graph[e].clone(),
                });
            }
        }
        out
    }
}

/// `from` / `to` of the graph routes: a memory id, or `entity:<name>` (the
/// name or any alias the stream's graph has seen for it).
struct NodeSpec {
    kind: &'static str,
    id: String,
}

/// The node a parameter names and the stream to look in: a memory's own
/// stream, else `stream` (default: the key's default stream).
async fn node_spec(
    engine: &Services,
    caller: &Caller,
    field: &str,
    raw: &str,
    stream: Option<&str>,
) -> Result<(NodeSpec, Option<String>)> {
    match raw.strip_prefix("entity:") {
        Some(name) => {
            let key = crate::store::graph::entity_key(name);
            if key.is_empty() {
                return Err(Error::invalid(field, "`entity:` needs a name"));
            }
            let stream = caller.resolve_stream(stream)?;
            // The name or any alias seen for it ("Postgres" → postgresql).
            let key = match engine.store.graph.entity(&stream, name).await? {
                Some(row) => row.key,
                None => key,
            };
            Ok((
                NodeSpec {
                    kind: "entity",
                    id: key,
                },
                Some(stream),
            ))
        }
        None => {
            let m = visible(engine, caller, raw).await?;
            Ok((
                NodeSpec {
                    kind: "memory",
                    id: m.id,
                },
                Some(m.stream),
            ))
        }
    }
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExploreQuery {
    /// A memory id, or `entity:<name>`.
    #[schemars(length(min = 1))]
    pub from: String,
    /// For an entity: its stream (default: the key's default stream).
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
    /// How far to walk (2; 1–4). Memory → entity → memory is two hops.
    #[schemars(range(min = 1, max = 4))]
    pub hops: Option<usize>,
    /// Most nodes answered (50; at most 500), the nearest first.
    #[schemars(range(min = 1, max = 500))]
    pub max_nodes: Option<usize>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Subgraph {
    pub stream: String,
    /// The nearest first, each with its distance in hops.
    pub nodes: Vec<Reached>,
    pub edges: Vec<Edge>,
    /// More nodes were within reach than `max_nodes`.
    pub truncated: bool,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Reached {
    #[serde(flatten)]
    pub node: Node,
    pub hops: usize,
}

/// `GET /v1/graph/explore`: the memories and entities within `hops` of a
/// node, and the edges among them.
pub async fn explore(engine: &Services, caller: &Caller, q: &ExploreQuery) -> Result<Subgraph> {
    let hops = q.hops.unwrap_or(2);
    if !(1..=4).contains(&hops) {
        return Err(Error::invalid("hops", "must be between 1 and 4"));
    }
    let max_nodes = q.max_nodes.unwrap_or(50);
    if !(1..=500).contains(&max_nodes) {
        return Err(Error::invalid("max_nodes", "must be between 1 and 500"));
    }
    let (spec, stream) = node_spec(engine, caller, "from", &q.from, q.stream.as_deref()).await?;
    let stream = stream.expect("a stream");
    let g = StreamGraph::load(engine, &stream).await?;
    let start = g.find("from", &spec)?;
    let dist = petgraph::algo::dijkstra(&g.graph, start, None, |_| 1usize);
    let mut within: Vec<(usize, NodeIndex)> = dist
        .into_iter()
        .filter(|(_, d)| *d <= hops)
        .map(|(n, d)| (d, n))
        .collect();
    within.sort_by(|a, b| a.0.cmp(&b.0).then(g.graph[a.1].id.cmp(&g.graph[b.1].id)));
    let truncated = within.len() > max_nodes;
    within.truncate(max_nodes);
    let kept: Vec<NodeIndex> = within.iter().map(|(_, n)| *n).collect();
    Ok(Subgraph {
        edges: g.edges_among(&kept),
        nodes: within
            .into_iter()
            .map(|(d, n)| Reached {
                node: g.graph[n].clone(),
                hops: d,
            })
            .collect(),
        stream,
        truncated,
    })
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    /// A memory id, or `entity:<name>`.
    #[schemars(length(min = 1))]
    pub from: String,
    #[schemars(length(min = 1))]
    pub to: String,
    /// When both ends are entities: their stream (default: the key's default).
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Path {
    pub stream: String,
    pub found: bool,
    /// Edges walked (absent when there is no path).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hops: Option<usize>,
    /// From `from` to `to`.
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
}

/// `GET /v1/graph/path`: the shortest chain of relations and mentions
/// between two memories or entities of one stream.
pub async fn path(engine: &Services, caller: &Caller, q: &PathQuery) -> Result<Path> {
    let (from, s1) = node_spec(engine, caller, "from", &q.from, q.stream.as_deref()).await?;
    let (to, s2) = node_spec(engine, caller, "to", &q.to, q.stream.as_deref()).await?;
    // A memory fixes the stream; two entities take `stream`.
    let memory_stream =
        |spec: &NodeSpec, s: &Option<String>| (spec.kind == "memory").then(|| s.clone()).flatten();
    let stream = match (memory_stream(&from, &s1), memory_stream(&to, &s2)) {
        (Some(a), Some(b)) if a != b => {
            return Err(Error::invalid("to", "both ends must be in one stream"))
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => s1.expect("a stream"),
    };
    let g = StreamGraph::load(engine, &stream).await?;
    let (a, b) = (g.find("from", &from)?, g.find("to", &to)?);
    let Some((cost, route)) = petgraph::algo::astar(&g.graph, a, |n| n == b, |_| 1usize, |_| 0)
    else {
        return Ok(Path {
            stream,
            found: false,
            hops: None,
            nodes: Vec::new(),
            edges: Vec::new(),
        });
    };
    let edges = route
        .windows(2)
        .map(|w| {
            let e = g.graph.find_edge(w[0], w[1]).expect("a path's edge");
            Edge {
                from: g.graph[w[0]].id.clone(),
                to: g.graph[w[1]].id.clone(),
                kind: g.graph[e].clone(),
            }
        })
        .collect();
    Ok(Path {
        stream,
        found: true,
        hops: Some(cost),
        nodes: route.iter().map(|n| g.graph[*n].clone()).collect(),
        edges,
    })
}
