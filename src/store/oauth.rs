//! The OAuth tables: registered clients (`oauth_clients`) and grants
//! (`oauth_grants`: what a consent allowed, and the digest of its current
//! refresh token). Access tokens are runtime keys (`api_keys`), so they are
//! checked, listed and revoked like any key. Like `api_keys`, these tables
//! are read on a connection that sees every commit and stay outside
//! snapshots, exports and SQL.

use std::time::Duration;

use arrow_array::RecordBatch;
use futures::TryStreamExt;
use lancedb::query::ExecutableQuery;
use lancedb::Table;
use serde::{Deserialize, Serialize};

use super::filter::{sql_str, ts_lit};
use super::Result;
use crate::core::model::{Columns, Micros};

pub const OAUTH_CLIENTS: &str = "oauth_clients";
pub const OAUTH_GRANTS: &str = "oauth_grants";

/// A client registered through `POST /oauth/register`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientRow {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
    pub created_at: Micros,
}

/// What one consent granted a client, and its current refresh token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrantRow {
    pub id: String,
    pub client_id: String,
    /// `writer` or `reader` (or `admin`, granted by an admin key).
    pub role: String,
    /// None: every stream (an admin grant).
    pub streams: Option<Vec<String>>,
    /// Hex SHA-256 of the current refresh token.
    pub refresh_digest: String,
    /// The runtime key that is the current access token.
    pub access_key_id: String,
    pub created_at: Micros,
    /// When the refresh token stops working.
    pub expires_at: Micros,
    pub revoked_at: Option<Micros>,
}

fn client_schema() -> arrow_schema::SchemaRef {
    use arrow_schema::{DataType, Field, Schema};
    let list = DataType::List(std::sync::Arc::new(Field::new(
        "item",
        DataType::Utf8,
        true,
    )));
    std::sync::Arc::new(Schema::new(vec![
        Field::new("client_id", DataType::Utf8, false),
        Field::new("client_name", DataType::Utf8, false),
        Field::new("redirect_uris", list, false),
        Field::new("created_at", super::graph::ts(), false),
    ]))
}

fn grant_schema() -> arrow_schema::SchemaRef {
    use arrow_schema::{DataType, Field, Schema, TimeUnit};
    let ts = || DataType::Timestamp(TimeUnit::Microsecond, None);
    let list = DataType::List(std::sync::Arc::new(Field::new(
        "item",
        DataType::Utf8,
        true,
    )));
    std::sync::Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("client_id", DataType::Utf8, false),
        Field::new("role", DataType::Utf8, false),
        Field::new("streams", list, true),
        Field::new("refresh_digest", DataType::Utf8, false),
        Field::new("access_key_id", DataType::Utf8, false),
        Field::new("created_at", ts(), false),
        Field::new("expires_at", ts(), false),
        Field::new("revoked_at", ts(), true),
    ]))
}

#[derive(Clone)]
pub struct OAuthTables {
    clients: Table,
    grants: Table,
}

async fn read(table: &Table, filter: String) -> Result<Vec<RecordBatch>> {
    use lancedb::query::QueryBase;
    Ok(table
        .query()
        .only_if(filter)
        .execute()
        .await?
        .try_collect()
        .await?)
}

impl OAuthTables {
    pub async fn open(location: &super::Location) -> Result<OAuthTables> {
        let db = location.connect(Some(Duration::ZERO)).await?;
        let names = db.table_names().execute().await?;
        Ok(OAuthTables {
            clients: super::open_or_create(&db, &names, OAUTH_CLIENTS, client_schema()).await?,
            grants: super::open_or_create(&db, &names, OAUTH_GRANTS, grant_schema()).await?,
        })
    }

    pub async fn add_client(&self, row: &ClientRow) -> Result<()> {
        let batch = super::graph::rows_to_batch(client_schema(), std::slice::from_ref(row))?;
        self.clients.add(batch).execute().await?;
        Ok(())
    }

    pub async fn client(&self, client_id: &str) -> Result<Option<ClientRow>> {
        for b in read(&self.clients, format!("client_id = {}", sql_str(client_id))).await? {
            let c = Columns::new(&b);
            if b.num_rows() > 0 {
                return Ok(Some(ClientRow {
                    client_id: c.str("client_id", 0).unwrap_or_default(),
                    client_name: c.str("client_name", 0).unwrap_or_default(),
                    redirect_uris: c.str_list("redirect_uris", 0),
                    created_at: c.time("created_at", 0).unwrap_or(0),
                }));
            }
        }
        Ok(None)
    }

    pub async fn add_grant(&self, row: &GrantRow) -> Result<()> {
        let batch = super::graph::rows_to_batch(grant_schema(), std::slice::from_ref(row))?;
        self.grants.add(batch).execute().await?;
        Ok(())
    }

    /// The live grant whose current refresh token has this digest.
    pub async fn grant_by_refresh(&self, digest: &str) -> Result<Option<GrantRow>> {
        let filter = format!(
            "refresh_digest = {} AND revoked_at IS NULL",
            sql_str(digest)
        );
        for b in read(&self.grants, filter).await? {
            if b.num_rows() == 0 {
                continue;
            }
            let c = Columns::new(&b);
            let all_streams = b
                .column_by_name("streams")
                .is_some_and(|a| arrow_array::Array::is_null(a, 0));
            return Ok(Some(GrantRow {
                id: c.str("id", 0).unwrap_or_default(),
                client_id: c.str("client_id", 0).unwrap_or_default(),
                role: c.str("role", 0).unwrap_or_default(),
                streams: (!all_streams).then(|| c.str_list("streams", 0)),
                refresh_digest: c.str("refresh_digest", 0).unwrap_or_default(),
                access_key_id: c.str("access_key_id", 0).unwrap_or_default(),
                created_at: c.time("created_at", 0).unwrap_or(0),
                expires_at: c.time("expires_at", 0).unwrap_or(0),
                revoked_at: c.time("revoked_at", 0),
            }));
        }
        Ok(None)
    }

    /// Move grant `id` from refresh token `old` to `new` and access key
    /// `key_id`; false when `old` was used meanwhile or the grant revoked
    /// (a refresh token works once).
    pub async fn rotate_grant(&self, id: &str, old: &str, new: &str, key_id: &str) -> Result<bool> {
        let result = self
            .grants
            .update()
            .only_if(format!(
                "id = {} AND refresh_digest = {} AND revoked_at IS NULL",
                sql_str(id),
                sql_str(old)
            ))
            .column("refresh_digest", sql_str(new))
            .column("access_key_id", sql_str(key_id))
            .execute()
            .await?;
        Ok(result.rows_updated > 0)
    }

    /// Revoke grant `id`.
    pub async fn revoke_grant(&self, id: &str, at: Micros) -> Result<()> {
        self.grants
            .update()
            .only_if(format!("id = {} AND revoked_at IS NULL", sql_str(id)))
            .column("revoked_at", ts_lit(at))
            .execute()
            .await?;
        Ok(())
    }
}
