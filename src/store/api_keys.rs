//! The `api_keys` table: keys made at runtime (`/admin/keys`, `loomem
//! keys`), each stored as the SHA-256 digest of its secret, never the secret.
//!
//! It stands apart from the memory tables: snapshots, exports and SQL do not
//! cover it (a rollback must never bring a revoked key back, and no query
//! reads a digest), and it has a connection of its own that checks for the
//! latest version on every read, so a key revoked by one process is refused by
//! every other process that shares the data directory on its next request.

use std::time::Duration;

use arrow_array::RecordBatch;
use futures::TryStreamExt;
use lancedb::query::ExecutableQuery;
use lancedb::Table;
use serde::{Deserialize, Serialize};

use super::Result;
use crate::core::model::{Columns, Micros};

pub const API_KEYS: &str = "api_keys";

/// One key as the table keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRow {
    pub id: String,
    pub name: String,
    /// `admin`, `writer` or `reader`.
    pub role: String,
    /// The streams it may use, the first its default; None = every stream.
    pub streams: Option<Vec<String>>,
    /// Hex SHA-256 of the secret.
    pub digest: String,
    /// The secret's first characters, to tell keys apart in a list.
    pub prefix: String,
    /// The secret before the last rotation, valid until `previous_until`.
    pub previous_digest: Option<String>,
    pub previous_until: Option<Micros>,
    pub created_at: Micros,
    pub expires_at: Option<Micros>,
    pub revoked_at: Option<Micros>,
    pub last_used_at: Option<Micros>,
}

fn schema() -> arrow_schema::SchemaRef {
    use arrow_schema::{DataType, Field, Schema, TimeUnit};
    let ts = || DataType::Timestamp(TimeUnit::Microsecond, None);
    let list = DataType::List(std::sync::Arc::new(Field::new(
        "item",
        DataType::Utf8,
        true,
    )));
    std::sync::Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("role", DataType::Utf8, false),
        Field::new("streams", list, true),
        Field::new("digest", DataType::Utf8, false),
        Field::new("prefix", DataType::Utf8, false),
        Field::new("previous_digest", DataType::Utf8, true),
        Field::new("previous_until", ts(), true),
        Field::new("created_at", ts(), false),
        Field::new("expires_at", ts(), true),
        Field::new("revoked_at", ts(), true),
        Field::new("last_used_at", ts(), true),
    ]))
}

/// The table, on a connection of its own (see the module's note).
#[derive(Clone)]
pub struct KeyTable {
    table: Table,
}

impl KeyTable {
    pub async fn open(location: &super::Location) -> Result<KeyTable> {
        let db = location.connect(Some(Duration::ZERO)).await?;
        let names = db.table_names().execute().await?;
        let table = super::open_or_create(&db, &names, API_KEYS, schema()).await?;
        Ok(KeyTable { table })
    }

    /// The table's latest version (a key changed when it moved).
    pub async fn version(&self) -> Result<u64> {
        Ok(self.table.version().await?)
    }

    /// Every key, oldest first.
    pub async fn all(&self) -> Result<Vec<KeyRow>> {
        let batches: Vec<RecordBatch> = self.table.query().execute().await?.try_collect().await?;
        let mut rows = Vec::new();
        for b in &batches {
            let c = Columns::new(b);
            for r in 0..b.num_rows() {
                let streams = c.str_list("streams", r);
                let all_streams = b
                    .column_by_name("streams")
                    .is_some_and(|a| arrow_array::Array::is_null(a, r));
                rows.push(KeyRow {
                    id: c.str("id", r).unwrap_or_default(),
                    name: c.str("name", r).unwrap_or_default(),
                    role: c.str("role", r).unwrap_or_default(),
                    streams: (!all_streams).then_some(streams),
                    digest: c.str("digest", r).unwrap_or_default(),
                    prefix: c.str("prefix", r).unwrap_or_default(),
                    previous_digest: c.str("previous_digest", r),
                    previous_until: c.time("previous_until", r),
                    created_at: c.time("created_at", r).unwrap_or(0),
                    expires_at: c.time("expires_at", r),
                    revoked_at: c.time("revoked_at", r),
                    last_used_at: c.time("last_used_at", r),
                });
            }
        }
        rows.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(rows)
    }

    /// Add a new key.
    pub async fn add(&self, row: &KeyRow) -> Result<()> {
        let batch = super::graph::rows_to_batch(schema(), std::slice::from_ref(row))?;
        self.table.add(batch).execute().await?;
        Ok(())
    }

    /// Set columns of key `id` unless it is revoked (and, given `digest`,
    /// unless its secret changed meanwhile); whether it was. Each change is
    /// one column-wise update with literal values, so two processes changing
    /// a key at once (a use recorded while another revokes it) never undo
    /// each other.
    async fn update_live(
        &self,
        id: &str,
        digest: Option<&str>,
        columns: Vec<(&str, String)>,
    ) -> Result<bool> {
        use super::filter::sql_str;
        let mut only_if = format!("id = {} AND revoked_at IS NULL", sql_str(id));
        if let Some(d) = digest {
            only_if.push_str(&format!(" AND digest = {}", sql_str(d)));
        }
        let mut update = self.table.update().only_if(only_if);
        for (column, value) in columns {
            update = update.column(column, value);
        }
        Ok(update.execute().await?.rows_updated > 0)
    }

    /// Revoke key `id` at `at` (a revoked key stays revoked).
    pub async fn revoke(&self, id: &str, at: Micros) -> Result<bool> {
        self.update_live(id, None, vec![("revoked_at", super::filter::ts_lit(at))])
            .await
    }

    /// Record a use of key `id`.
    pub async fn touch(&self, id: &str, at: Micros) -> Result<bool> {
        self.update_live(id, None, vec![("last_used_at", super::filter::ts_lit(at))])
            .await
    }

    /// Replace key `id`'s secret digest `old` by `digest`; the old one stays
    /// valid until `previous_until` (None: not at all). False when the key
    /// was revoked or rotated meanwhile.
    pub async fn rotate(
        &self,
        id: &str,
        old: &str,
        digest: &str,
        prefix: &str,
        previous_until: Option<Micros>,
    ) -> Result<bool> {
        use super::filter::{sql_str, ts_lit};
        let (previous, until) = match previous_until {
            Some(t) => (sql_str(old), ts_lit(t)),
            None => (
                "arrow_cast(NULL, 'Utf8')".to_string(),
                "arrow_cast(NULL, 'Timestamp(Microsecond, None)')".to_string(),
            ),
        };
        self.update_live(
            id,
            Some(old),
            vec![
                ("previous_digest", previous),
                ("previous_until", until),
                ("digest", sql_str(digest)),
                ("prefix", sql_str(prefix)),
            ],
        )
        .await
    }
}
