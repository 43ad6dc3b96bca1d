//! The `graph_metrics` table: what the `graph` job last computed over each
//! stream's graph of memories and entities — a node's PageRank, degree and
//! community. Derived data: the job replaces a stream's rows on every run, so
//! snapshots leave it out; a purged memory's row goes with it.

use arrow_array::RecordBatch;
use futures::TryStreamExt;
use lancedb::query::{ExecutableQuery, QueryBase, Select};

use super::filter::{column_in, sql_str};
use super::{Filter, Result};

#[derive(schemars::JsonSchema, Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct MetricRow {
    pub stream: String,
    /// `memory` or `entity`.
    pub node_kind: String,
    /// A memory's id or an entity's key.
    pub node_id: String,
    /// The first 200 characters of a memory, an entity's name.
    pub label: String,
    /// PageRank (damping 0.85) over the stream's graph; a stream's ranks sum to 1.
    pub pagerank: f64,
    /// Edges at the node (mentions and relations).
    pub degree: i64,
    /// The node's Louvain community: 0 is the largest of the stream, 1 the
    /// next, ….
    pub community: i64,
    pub community_size: i64,
    pub computed_at: crate::core::model::Micros,
}

pub fn metric_schema() -> arrow_schema::SchemaRef {
    use arrow_schema::{DataType, Field, Schema};
    std::sync::Arc::new(Schema::new(vec![
        Field::new("stream", DataType::Utf8, false),
        Field::new("node_kind", DataType::Utf8, false),
        Field::new("node_id", DataType::Utf8, false),
        Field::new("label", DataType::Utf8, false),
        Field::new("pagerank", DataType::Float64, false),
        Field::new("degree", DataType::Int64, false),
        Field::new("community", DataType::Int64, false),
        Field::new("community_size", DataType::Int64, false),
        Field::new("computed_at", super::graph::ts(), false),
    ]))
}

fn rows(batches: &[RecordBatch]) -> Vec<MetricRow> {
    let mut out = Vec::new();
    for b in batches {
        let c = crate::core::model::Columns::new(b);
        for r in 0..b.num_rows() {
            out.push(MetricRow {
                stream: c.str("stream", r).unwrap_or_default(),
                node_kind: c.str("node_kind", r).unwrap_or_default(),
                node_id: c.str("node_id", r).unwrap_or_default(),
                label: c.str("label", r).unwrap_or_default(),
                pagerank: c.f64("pagerank", r).unwrap_or_default(),
                degree: c.i64("degree", r).unwrap_or_default(),
                community: c.i64("community", r).unwrap_or_default(),
                community_size: c.i64("community_size", r).unwrap_or_default(),
                computed_at: c.time("computed_at", r).unwrap_or(0),
            });
        }
    }
    out
}

impl super::Store {
    /// Replace `stream`'s metrics with `rows` (none: the stream has no graph).
    pub async fn replace_graph_metrics(&self, stream: &str, rows: Vec<MetricRow>) -> Result<()> {
        let scope = Filter::new().stream(stream).predicate();
        let _gate = self.table_gate.read().await;
        self.graph_metrics.delete(&scope).await?;
        if !rows.is_empty() {
            let batch = super::graph::rows_to_batch(metric_schema(), &rows)?;
            self.graph_metrics.add(batch).execute().await?;
        }
        Ok(())
    }

    /// Metrics meeting `filter` and, when given, the extra SQL `cond`.
    pub async fn graph_metrics(
        &self,
        filter: &Filter,
        cond: Option<&str>,
    ) -> Result<Vec<MetricRow>> {
        let predicate = [
            (!filter.is_all()).then(|| filter.predicate()),
            cond.map(str::to_string),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" AND ");
        let mut query = self.graph_metrics.query();
        if !predicate.is_empty() {
            query = query.only_if(predicate);
        }
        let batches: Vec<RecordBatch> = query.execute().await?.try_collect().await?;
        Ok(rows(&batches))
    }

    /// The metric rows of these memories meeting `filter`.
    pub async fn graph_metrics_of(
        &self,
        filter: &Filter,
        ids: &[String],
    ) -> Result<Vec<MetricRow>> {
        let cond = format!(
            "node_kind = 'memory' AND {}",
            column_in("node_id", ids.iter().map(String::as_str))
        );
        self.graph_metrics(filter, Some(&cond)).await
    }

    /// When the metrics of each stream meeting `filter` were computed.
    pub async fn graph_metrics_computed(
        &self,
        filter: &Filter,
    ) -> Result<std::collections::BTreeMap<String, crate::core::model::Micros>> {
        let mut query = self
            .graph_metrics
            .query()
            .select(Select::columns(&["stream", "computed_at"]));
        if !filter.is_all() {
            query = query.only_if(filter.predicate());
        }
        let batches: Vec<RecordBatch> = query.execute().await?.try_collect().await?;
        let mut out = std::collections::BTreeMap::new();
        for b in &batches {
            let c = crate::core::model::Columns::new(b);
            for r in 0..b.num_rows() {
                let at = c.time("computed_at", r).unwrap_or(0);
                let e = out
                    .entry(c.str("stream", r).unwrap_or_default())
                    .or_insert(at);
                *e = (*e).max(at);
            }
        }
        Ok(out)
    }

    /// Forget the metric rows of these memories of `stream` (a purge).
    pub(super) async fn forget_graph_metrics(&self, stream: &str, ids: &[String]) -> Result<()> {
        let predicate = format!(
            "stream = {} AND node_kind = 'memory' AND {}",
            sql_str(stream),
            column_in("node_id", ids.iter().map(String::as_str))
        );
        let _gate = self.table_gate.read().await;
        self.graph_metrics.delete(&predicate).await?;
        Ok(())
    }
}
