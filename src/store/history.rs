//! The `history` table: every change to a memory and every consolidation
//! step, with its reason.

use arrow_array::RecordBatch;
use futures::TryStreamExt;
use lancedb::query::{ExecutableQuery, QueryBase};

use super::filter::sql_str;
use super::Result;

/// One change to a memory, with its reason (supersession, merge, …).
#[derive(schemars::JsonSchema, Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct HistoryRow {
    pub id: String,
    pub stream: String,
    pub chunk_id: String,
    /// `superseded`, `supersedes`, `merged`, …
    pub event: String,
    pub reason: String,
    pub related_ids: Vec<String>,
    pub created_at: crate::core::model::Micros,
}

pub fn history_schema() -> arrow_schema::SchemaRef {
    use arrow_schema::{DataType, Field, Schema, TimeUnit};
    std::sync::Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("chunk_id", DataType::Utf8, false),
        Field::new("event", DataType::Utf8, false),
        Field::new("reason", DataType::Utf8, false),
        Field::new(
            "related_ids",
            DataType::List(std::sync::Arc::new(Field::new(
                "item",
                DataType::Utf8,
                true,
            ))),
            true,
        ),
        Field::new(
            "created_at",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
    ]))
}

/// Append `rows` to the history table (one commit; none for no rows). The
/// caller holds the table gate.
pub(super) async fn append_history(table: &lancedb::Table, rows: &[HistoryRow]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let batch = crate::store::graph::rows_to_batch(history_schema(), rows)?;
    super::append_batch(table, batch).await
}

impl super::Store {
    /// Record changes to memories (one commit).
    pub async fn add_history(&self, rows: Vec<HistoryRow>) -> Result<()> {
        let _gate = self.table_gate.read().await;
        append_history(&self.history, &rows).await
    }

    /// Remove what other tables keep of deleted memories of `stream`: their
    /// history rows (reasons quote the text), feedback, graph references and
    /// dead letters (failed writes of the same ids quote it too). `ids: None`
    /// means every memory of the stream (a purge).
    pub async fn erase_traces(&self, stream: &str, ids: Option<&[String]>) -> Result<()> {
        let scope = super::Filter::new().stream(stream);
        match ids {
            None => {
                for table in [
                    &self.history,
                    self.feedback.table(),
                    &self.dead_letters,
                    &self.relations,
                    &self.graph_metrics,
                ] {
                    let _gate = self.table_gate.read().await;
                    table.delete(&scope.predicate()).await?;
                }
                self.graph.delete(&scope).await?;
            }
            Some([]) => return Ok(()),
            Some(ids) => {
                let of = format!(
                    "{} AND {}",
                    scope.predicate(),
                    super::filter::column_in("chunk_id", ids.iter().map(String::as_str))
                );
                for table in [&self.history, self.feedback.table()] {
                    let _gate = self.table_gate.read().await;
                    table.delete(&of).await?;
                }
                let letters = format!(
                    "{} AND {}",
                    scope.predicate(),
                    super::filter::column_in("memory_id", ids.iter().map(String::as_str))
                );
                self.dead_letters.delete(&letters).await?;
                self.delete_relations(&scope, &super::relations::touching(ids))
                    .await?;
                self.forget_graph_metrics(stream, ids).await?;
                self.graph.forget_chunks(stream, ids).await?;
            }
        }
        self.feedback.reload().await
    }

    /// History rows of one chunk, oldest first.
    pub async fn history_of(&self, chunk_id: &str) -> Result<Vec<HistoryRow>> {
        let batches: Vec<RecordBatch> = self
            .history
            .query()
            .only_if(format!("chunk_id = {}", sql_str(chunk_id)))
            .execute()
            .await?
            .try_collect()
            .await?;
        let mut rows = Vec::new();
        for b in &batches {
            let c = crate::core::model::Columns::new(b);
            for r in 0..b.num_rows() {
                rows.push(HistoryRow {
                    id: c.str("id", r).unwrap_or_default(),
                    stream: c.str("stream", r).unwrap_or_default(),
                    chunk_id: c.str("chunk_id", r).unwrap_or_default(),
                    event: c.str("event", r).unwrap_or_default(),
                    reason: c.str("reason", r).unwrap_or_default(),
                    related_ids: c.str_list("related_ids", r),
                    created_at: c.time("created_at", r).unwrap_or(0),
                });
            }
        }
        rows.sort_by_key(|r| r.created_at);
        Ok(rows)
    }
}
