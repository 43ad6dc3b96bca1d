//! The `relations` table: typed links between two memories of one stream
//! (`supports`, `contradicts`, `caused_by`, … or a free-form name), made by
//! callers and walked by the graph routes.

use arrow_array::RecordBatch;
use futures::TryStreamExt;
use lancedb::query::{ExecutableQuery, QueryBase};

use super::filter::column_in;
use super::{Filter, Result};

#[derive(schemars::JsonSchema, Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RelationRow {
    pub id: String,
    pub stream: String,
    pub from_id: String,
    pub to_id: String,
    pub relation: String,
    pub weight: f32,
    pub note: Option<String>,
    /// The key that made it.
    pub created_by: String,
    pub created_at: crate::core::model::Micros,
}

pub fn relation_schema() -> arrow_schema::SchemaRef {
    use arrow_schema::{DataType, Field, Schema};
    std::sync::Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("from_id", DataType::Utf8, false),
        Field::new("to_id", DataType::Utf8, false),
        Field::new("relation", DataType::Utf8, false),
        Field::new("weight", DataType::Float32, false),
        Field::new("note", DataType::Utf8, true),
        Field::new("created_by", DataType::Utf8, false),
        Field::new("created_at", super::graph::ts(), false),
    ]))
}

fn rows(batches: &[RecordBatch]) -> Vec<RelationRow> {
    let mut out = Vec::new();
    for b in batches {
        let c = crate::core::model::Columns::new(b);
        for r in 0..b.num_rows() {
            out.push(RelationRow {
                id: c.str("id", r).unwrap_or_default(),
                stream: c.str("stream", r).unwrap_or_default(),
                from_id: c.str("from_id", r).unwrap_or_default(),
                to_id: c.str("to_id", r).unwrap_or_default(),
                relation: c.str("relation", r).unwrap_or_default(),
                weight: c.f32("weight", r).unwrap_or(1.0),
                note: c.str("note", r),
                created_by: c.str("created_by", r).unwrap_or_default(),
                created_at: c.time("created_at", r).unwrap_or(0),
            });
        }
    }
    out
}

/// A relation's name as stored: 1–64 of lower-case letters, digits, `_ : -`.
pub fn is_relation_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_:-".contains(&b))
}

/// The rows of relations touching any of `ids` (from or to).
pub fn touching<S: AsRef<str>>(ids: &[S]) -> String {
    format!(
        "({} OR {})",
        column_in("from_id", ids.iter().map(AsRef::as_ref)),
        column_in("to_id", ids.iter().map(AsRef::as_ref))
    )
}

impl super::Store {
    pub async fn add_relations(&self, rows: Vec<RelationRow>) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let batch = super::graph::rows_to_batch(relation_schema(), &rows)?;
        let _gate = self.table_gate.read().await;
        self.relations.add(batch).execute().await?;
        Ok(())
    }

    /// Relations meeting `filter` and, when given, the extra SQL `cond`.
    pub async fn relations(&self, filter: &Filter, cond: Option<&str>) -> Result<Vec<RelationRow>> {
        let predicate = match (filter.is_all(), cond) {
            (true, None) => None,
            (true, Some(c)) => Some(c.to_string()),
            (false, None) => Some(filter.predicate()),
            (false, Some(c)) => Some(format!("{} AND {c}", filter.predicate())),
        };
        let mut query = self.relations.query();
        if let Some(p) = predicate {
            query = query.only_if(p);
        }
        let batches: Vec<RecordBatch> = query.execute().await?.try_collect().await?;
        Ok(rows(&batches))
    }

    /// Delete the relations meeting `filter` and `cond`; how many went.
    pub async fn delete_relations(&self, filter: &Filter, cond: &str) -> Result<usize> {
        let predicate = format!("{} AND {cond}", filter.predicate());
        let _gate = self.table_gate.read().await;
        let n = self.relations.count_rows(Some(predicate.clone())).await?;
        if n > 0 {
            self.relations.delete(&predicate).await?;
        }
        Ok(n)
    }
}
