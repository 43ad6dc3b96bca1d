//! What a stream's graph says as a whole: each node's PageRank and its
//! Louvain community, computed over the memories, the entities they mention
//! and the relations between memories (graphrs), kept in the
//! `graph_metrics` table by the `graph` job or `POST /v1/graph/analyze`, and
//! read back by `GET /v1/graph/rank` and `GET /v1/graph/communities` (and SQL).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use graphrs::{Edge, Graph, GraphSpecs, Node};
use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::model::now_micros;
use crate::core::time::to_rfc3339;
use crate::core::Caller;
use crate::service::relations::StreamGraph;
use crate::service::Services;
use crate::store::graph_metrics::MetricRow;
use crate::store::Filter;

/// PageRank's damping factor.
const DAMPING: f64 = 0.85;
/// Louvain's seed: the same graph gives the same communities.
const SEED: u64 = 20;

/// Each node's rank, degree and community; the rows of one stream.
fn measure(g: &StreamGraph, stream: &str) -> Result<Vec<MetricRow>> {
    let n = g.graph.node_count();
    if n == 0 {
        return Ok(Vec::new());
    }
    // One weight per pair of nodes (a memory that names an entity and is
    // linked to it twice is one edge of weight 2); no self-loops.
    let mut pairs: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    for e in g.graph.edge_indices() {
        let (a, b) = g.graph.edge_endpoints(e).expect("an edge has ends");
        let (a, b) = (a.index().min(b.index()), a.index().max(b.index()));
        if a != b {
            *pairs.entry((a, b)).or_default() += 1.0;
        }
    }
    let mut degree = vec![0i64; n];
    for (a, b) in pairs.keys() {
        degree[*a] += 1;
        degree[*b] += 1;
    }
    let failed = |e: graphrs::Error| Error::Internal(format!("graph analysis: {e}"));
    let nodes = || (0..n).map(Node::from_name).collect::<Vec<_>>();

    // PageRank walks both ways along an undirected edge.
    let both: Vec<Arc<Edge<usize, ()>>> = pairs
        .iter()
        .flat_map(|(&(a, b), &w)| [Edge::with_weight(a, b, w), Edge::with_weight(b, a, w)])
        .collect();
    let directed =
        Graph::<usize, ()>::new_from_nodes_and_edges(nodes(), both, GraphSpecs::directed())
            .map_err(failed)?;
    let ranks = graphrs::algorithms::centrality::pagerank::pagerank(
        &directed,
        true,
        Some(DAMPING),
        None,
        None,
    )
    .map_err(failed)?;

    // Louvain over the nodes with an edge; a node without one is a community
    // of its own.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    if !pairs.is_empty() {
        let edges: Vec<Arc<Edge<usize, ()>>> = pairs
            .iter()
            .map(|(&(a, b), &w)| Edge::with_weight(a, b, w))
            .collect();
        let connected: Vec<_> = (0..n)
            .filter(|i| degree[*i] > 0)
            .map(Node::from_name)
            .collect();
        let undirected = Graph::<usize, ()>::new_from_nodes_and_edges(
            connected,
            edges,
            GraphSpecs::undirected(),
        )
        .map_err(failed)?;
        let found = graphrs::algorithms::community::louvain::louvain_communities(
            &undirected,
            true,
            None,
            None,
            Some(SEED),
        )
        .map_err(failed)?;
        groups.extend(found.into_iter().map(|c| {
            let mut v: Vec<usize> = c.into_iter().collect();
            v.sort_unstable();
            v
        }));
    }
    let mut placed = vec![false; n];
    for i in groups.iter().flatten() {
        placed[*i] = true;
    }
    groups.extend((0..n).filter(|i| !placed[*i]).map(|i| vec![i]));
    // The largest community is 0; ties by their first node.
    groups.sort_by(|a, b| b.len().cmp(&a.len()).then(a[0].cmp(&b[0])));

    let computed_at = now_micros();
    let mut rows = Vec::with_capacity(n);
    for (community, members) in groups.iter().enumerate() {
        for &i in members {
            let node = &g.graph[petgraph::graph::NodeIndex::new(i)];
            rows.push(MetricRow {
                stream: stream.to_string(),
                node_kind: node.kind.to_string(),
                node_id: node.id.clone(),
                label: node.label.clone(),
                pagerank: ranks.get(&i).copied().unwrap_or_default(),
                degree: degree[i],
                community: community as i64,
                community_size: members.len() as i64,
                computed_at,
            });
        }
    }
    Ok(rows)
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Analysis {
    pub stream: String,
    pub nodes: usize,
    pub memories: usize,
    pub entities: usize,
    pub edges: usize,
    pub communities: usize,
    /// Written to `graph_metrics` (false on a dry run).
    pub written: bool,
    pub duration_ms: u64,
    /// The five highest ranked nodes.
    pub top: Vec<Ranked>,
}

/// Compute `stream`'s metrics and, unless `dry_run`, replace its rows.
pub async fn analyze_stream(engine: &Services, stream: &str, dry_run: bool) -> Result<Analysis> {
    let started = std::time::Instant::now();
    let g = StreamGraph::load(engine, stream).await?;
    let edges = g.graph.edge_count();
    let mut rows = measure(&g, stream)?;
    let count = |kind: &str| rows.iter().filter(|r| r.node_kind == kind).count();
    let mut analysis = Analysis {
        stream: stream.to_string(),
        nodes: rows.len(),
        memories: count("memory"),
        entities: count("entity"),
        edges,
        communities: rows.iter().map(|r| r.community + 1).max().unwrap_or(0) as usize,
        written: !dry_run,
        duration_ms: 0,
        top: Vec::new(),
    };
    sort_by_rank(&mut rows);
    analysis.top = rows.iter().take(5).map(Ranked::from).collect();
    if !dry_run {
        engine.store.replace_graph_metrics(stream, rows).await?;
    }
    analysis.duration_ms = started.elapsed().as_millis() as u64;
    Ok(analysis)
}

fn sort_by_rank(rows: &mut [MetricRow]) {
    rows.sort_by(|a, b| {
        b.pagerank
            .total_cmp(&a.pagerank)
            .then_with(|| a.node_id.cmp(&b.node_id))
    });
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnalyzeRequest {
    /// Default: the key's default stream.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
    /// Compute and answer, write nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /v1/graph/analyze`: compute a stream's PageRank and communities now.
pub async fn analyze(engine: &Services, caller: &Caller, req: &AnalyzeRequest) -> Result<Analysis> {
    let stream = caller.resolve_stream(req.stream.as_deref())?;
    analyze_stream(engine, &stream, req.dry_run).await
}

#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct Ranked {
    /// `memory` or `entity`.
    pub kind: String,
    /// A memory's id or an entity's key.
    pub id: String,
    pub label: String,
    pub pagerank: f64,
    pub degree: i64,
    pub community: i64,
}

impl From<&MetricRow> for Ranked {
    fn from(r: &MetricRow) -> Ranked {
        Ranked {
            kind: r.node_kind.clone(),
            id: r.node_id.clone(),
            label: r.label.clone(),
            pagerank: r.pagerank,
            degree: r.degree,
            community: r.community,
        }
    }
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankQuery {
    /// Default: the key's default stream.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
    /// `memory` or `entity` (default: both).
    #[schemars(regex(pattern = r"^(memory|entity)$"))]
    pub kind: Option<String>,
    /// Only the nodes of this community.
    #[schemars(range(min = 0))]
    pub community: Option<i64>,
    /// 20; 1–500.
    #[schemars(range(min = 1, max = 500))]
    pub limit: Option<usize>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Ranking {
    pub stream: String,
    /// When the metrics were computed (RFC 3339); null: never, and `nodes`
    /// is empty.
    pub computed_at: Option<String>,
    /// The highest PageRank first.
    pub nodes: Vec<Ranked>,
}

/// The stream a read of the metrics is about, when they were computed, and
/// its rows, highest ranked first: one read of the table.
async fn stored(
    engine: &Services,
    caller: &Caller,
    stream: Option<&str>,
) -> Result<(String, Option<String>, Vec<MetricRow>)> {
    let stream = caller.resolve_stream(stream)?;
    let mut rows = engine
        .store
        .graph_metrics(&Filter::new().stream(&stream), None)
        .await?;
    sort_by_rank(&mut rows);
    let computed_at = rows.iter().map(|r| r.computed_at).max().map(to_rfc3339);
    Ok((stream, computed_at, rows))
}

/// `GET /v1/graph/rank`: a stream's nodes by PageRank, as last computed.
pub async fn rank(engine: &Services, caller: &Caller, q: &RankQuery) -> Result<Ranking> {
    let limit = q.limit.unwrap_or(20);
    if !(1..=500).contains(&limit) {
        return Err(Error::invalid("limit", "must be between 1 and 500"));
    }
    if let Some(k) = q.kind.as_deref() {
        if k != "memory" && k != "entity" {
            return Err(Error::invalid("kind", "must be `memory` or `entity`"));
        }
    }
    if q.community.is_some_and(|c| c < 0) {
        return Err(Error::invalid("community", "must be 0 or more"));
    }
    let (stream, computed_at, rows) = stored(engine, caller, q.stream.as_deref()).await?;
    Ok(Ranking {
        stream,
        computed_at,
        nodes: rows
            .iter()
            .filter(|r| q.kind.as_deref().is_none_or(|k| r.node_kind == k))
            .filter(|r| q.community.is_none_or(|c| r.community == c))
            .take(limit)
            .map(Ranked::from)
            .collect(),
    })
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommunitiesQuery {
    /// Default: the key's default stream.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
    /// Most communities answered, the largest first (20; 1–500).
    #[schemars(range(min = 1, max = 500))]
    pub limit: Option<usize>,
    /// Members shown per community, the highest ranked first (5; 1–100).
    #[schemars(range(min = 1, max = 100))]
    pub members: Option<usize>,
    /// Leave out communities smaller than this (2; a node without edges is
    /// a community of one).
    #[schemars(range(min = 1))]
    pub min_size: Option<usize>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Community {
    pub id: i64,
    pub size: usize,
    pub memories: usize,
    pub entities: usize,
    /// Its highest ranked members.
    pub members: Vec<Ranked>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Communities {
    pub stream: String,
    pub computed_at: Option<String>,
    /// All communities of the stream, of any size.
    pub total: usize,
    /// The largest first.
    pub communities: Vec<Community>,
}

/// `GET /v1/graph/communities`: a stream's Louvain communities, as last
/// computed.
pub async fn communities(
    engine: &Services,
    caller: &Caller,
    q: &CommunitiesQuery,
) -> Result<Communities> {
    let limit = q.limit.unwrap_or(20);
    if !(1..=500).contains(&limit) {
        return Err(Error::invalid("limit", "must be between 1 and 500"));
    }
    let members = q.members.unwrap_or(5);
    if !(1..=100).contains(&members) {
        return Err(Error::invalid("members", "must be between 1 and 100"));
    }
    let min_size = q.min_size.unwrap_or(2);
    if min_size == 0 {
        return Err(Error::invalid("min_size", "must be 1 or more"));
    }
    let (stream, computed_at, rows) = stored(engine, caller, q.stream.as_deref()).await?;
    // Rows come highest ranked first, so each community's members do too.
    let mut by: BTreeMap<i64, Vec<&MetricRow>> = BTreeMap::new();
    for r in &rows {
        by.entry(r.community).or_default().push(r);
    }
    let total = by.len();
    let mut out: Vec<Community> = by
        .into_iter()
        .filter(|(_, m)| m.len() >= min_size)
        .map(|(id, m)| Community {
            id,
            size: m.len(),
            memories: m.iter().filter(|r| r.node_kind == "memory").count(),
            entities: m.iter().filter(|r| r.node_kind == "entity").count(),
            members: m.iter().take(members).map(|r| Ranked::from(*r)).collect(),
        })
        .collect();
    out.sort_by(|a, b| b.size.cmp(&a.size).then(a.id.cmp(&b.id)));
    out.truncate(limit);
    Ok(Communities {
        stream,
        computed_at,
        total,
        communities: out,
    })
}

/// The `graph` job's report: one analysis per stream.
#[derive(Debug, Serialize)]
pub struct GraphReport {
    pub streams: usize,
    pub skipped_unchanged: usize,
    pub analyses: Vec<Analysis>,
}

/// Analyze every stream with current memories; with `only_changed`, skip a
/// stream whose metrics are newer than its newest memory.
pub async fn analyze_all(
    engine: &Services,
    only_changed: bool,
    dry_run: bool,
) -> Result<GraphReport> {
    let tallies = engine
        .store
        .stream_tallies(&Filter::new().current())
        .await?;
    let computed: HashMap<String, i64> = engine
        .store
        .graph_metrics_computed(&Filter::new())
        .await?
        .into_iter()
        .collect();
    let mut report = GraphReport {
        streams: tallies.len(),
        skipped_unchanged: 0,
        analyses: Vec::new(),
    };
    for (stream, (_, newest)) in tallies {
        if only_changed && computed.get(&stream).is_some_and(|at| *at >= newest) {
            report.skipped_unchanged += 1;
            continue;
        }
        report
            .analyses
            .push(analyze_stream(engine, &stream, dry_run).await?);
    }
    Ok(report)
}

/// The last computed PageRank and community of these memories of the
/// caller's streams, by id (absent: not computed yet).
pub async fn of_memories(
    engine: &Services,
    caller: &Caller,
    ids: &[String],
) -> Result<HashMap<String, (f64, i64)>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = engine
        .store
        .graph_metrics_of(&Filter::new().visible_to(caller), ids)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.node_id, (r.pagerank, r.community)))
        .collect())
}
