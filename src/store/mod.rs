//! LanceDB storage: opens or creates the tables, funnels every write to a table
//! through one batching writer task, and serves the reads the engine needs.

mod writer;

use std::path::Path;

use arrow_array::{Float32Array, RecordBatch, RecordBatchIterator};
use futures::TryStreamExt;
use lancedb::index::scalar::{FtsIndexBuilder, FullTextSearchQuery};
use lancedb::index::Index;
use lancedb::query::{ExecutableQuery, QueryBase, Select};
use lancedb::{Connection, DistanceType, Table};

use crate::model::{
    batch_to_chunks, chunk_schema, chunks_to_batch, dead_letter_schema, dead_letters_to_batch,
    Chunk, DeadLetter, ModelError,
};

pub use writer::ChunkWriter;

pub const CHUNKS: &str = "chunks";
pub const DEAD_LETTERS: &str = "dead_letters";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("lance: {0}")]
    Lance(#[from] lancedb::Error),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the data directory holds {found}-dimensional embeddings but the embedder makes {configured}; re-embed or use another data_dir")]
    Dimension { found: usize, configured: usize },
    #[error("the chunk writer has stopped")]
    WriterGone,
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Quote a value for a Lance SQL filter.
pub fn sql_str(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// A chunk found by a search leg, with that leg's raw score (BM25 score or cosine distance).
#[derive(Debug, Clone)]
pub struct Hit {
    pub chunk: Chunk,
    pub score: f32,
}

/// The columns a search returns: everything but the embedding.
const HIT_COLUMNS: &[&str] = &[
    "id",
    "stream",
    "level",
    "content",
    "title",
    "content_hash",
    "memory_type",
    "subject",
    "source",
    "tags",
    "entities",
    "metadata",
    "extraction_meta",
    "user_id",
    "app_id",
    "agent_id",
    "session_id",
    "importance",
    "confidence",
    "surprise",
    "pinned",
    "immutable",
    "expires_at",
    "valid_from",
    "valid_until",
    "created_at",
    "updated_at",
    "supersedes",
    "superseded_by",
    "version",
    "embed_model",
    "access_count",
    "last_accessed_at",
];

pub struct Store {
    db: Connection,
    chunks: Table,
    dead_letters: Table,
    dim: usize,
    writer: ChunkWriter,
}

impl Store {
    /// Open the tables under `data_dir`, creating them (and their indexes) on first start.
    pub async fn open(data_dir: &Path, dim: usize, write_batch_max_rows: usize) -> Result<Store> {
        std::fs::create_dir_all(data_dir).map_err(|e| lancedb::Error::Runtime {
            message: format!("cannot create data dir {}: {e}", data_dir.display()),
        })?;
        let db = lancedb::connect(&data_dir.to_string_lossy())
            .execute()
            .await?;
        let names = db.table_names().execute().await?;
        let chunks = if names.iter().any(|n| n == CHUNKS) {
            let table = db.open_table(CHUNKS).execute().await?;
            let found = embedding_dim(&*table.schema().await?);
            if found != Some(dim) {
                return Err(StoreError::Dimension {
                    found: found.unwrap_or(0),
                    configured: dim,
                });
            }
            table
        } else {
            let table = db
                .create_empty_table(CHUNKS, chunk_schema(dim))
                .execute()
                .await?;
            table
                .create_index(&["content"], Index::FTS(FtsIndexBuilder::default()))
                .execute()
                .await?;
            table
        };
        let dead_letters = if names.iter().any(|n| n == DEAD_LETTERS) {
            db.open_table(DEAD_LETTERS).execute().await?
        } else {
            db.create_empty_table(DEAD_LETTERS, dead_letter_schema())
                .execute()
                .await?
        };
        let writer = ChunkWriter::spawn(chunks.clone(), dim, write_batch_max_rows);
        Ok(Store {
            db,
            chunks,
            dead_letters,
            dim,
            writer,
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn connection(&self) -> &Connection {
        &self.db
    }

    pub fn chunks_table(&self) -> &Table {
        &self.chunks
    }

    /// Insert or replace chunks by id; resolves once they are committed.
    pub async fn upsert(&self, chunks: Vec<Chunk>) -> Result<()> {
        self.writer.upsert(chunks).await
    }

    /// Delete the chunks matching a Lance SQL predicate; returns how many went.
    pub async fn delete_where(&self, predicate: String) -> Result<u64> {
        self.writer.delete(predicate).await
    }

    /// Wait for pending writes and stop the writer.
    pub async fn close(&self) {
        self.writer.close().await;
    }

    /// Keep messages the pipeline gave up on (rare: written directly, not batched).
    pub async fn dead_letter(&self, rows: Vec<DeadLetter>) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        self.dead_letters
            .add(dead_letters_to_batch(&rows)?)
            .execute()
            .await?;
        Ok(())
    }

    pub async fn count_dead_letters(&self, filter: Option<String>) -> Result<usize> {
        Ok(self.dead_letters.count_rows(filter).await?)
    }

    pub async fn count(&self, filter: Option<String>) -> Result<usize> {
        Ok(self.chunks.count_rows(filter).await?)
    }

    pub async fn get(&self, id: &str) -> Result<Option<Chunk>> {
        let mut found = self.find(format!("id = {}", sql_str(id)), Some(1)).await?;
        Ok(found.pop())
    }

    /// Full chunks matching a filter (embedding included).
    pub async fn find(&self, filter: String, limit: Option<usize>) -> Result<Vec<Chunk>> {
        let mut q = self.chunks.query().only_if(filter);
        if let Some(limit) = limit {
            q = q.limit(limit);
        }
        let batches: Vec<RecordBatch> = q.execute().await?.try_collect().await?;
        let mut out = Vec::new();
        for b in &batches {
            out.extend(batch_to_chunks(b)?);
        }
        Ok(out)
    }

    /// Ids (only) of the chunks matching a filter.
    pub async fn ids(&self, filter: String) -> Result<Vec<String>> {
        let batches: Vec<RecordBatch> = self
            .chunks
            .query()
            .only_if(filter)
            .select(Select::columns(&["id"]))
            .execute()
            .await?
            .try_collect()
            .await?;
        let mut out = Vec::new();
        for b in &batches {
            let c = crate::model::Columns::new(b);
            out.extend((0..b.num_rows()).filter_map(|r| c.str("id", r)));
        }
        Ok(out)
    }

    /// BM25 leg: best `limit` matches of `query` in `content`, prefiltered.
    pub async fn search_text(&self, query: &str, filter: &str, limit: usize) -> Result<Vec<Hit>> {
        let batches: Vec<RecordBatch> = self
            .chunks
            .query()
            .full_text_search(FullTextSearchQuery::new(query.to_string()))
            .only_if(filter)
            .select(Select::columns(&with_score(HIT_COLUMNS, "_score")))
            .limit(limit)
            .execute()
            .await?
            .try_collect()
            .await?;
        hits(&batches, "_score")
    }

    /// Vector leg: the `limit` nearest chunks by cosine distance, prefiltered.
    pub async fn search_vector(
        &self,
        vector: &[f32],
        filter: &str,
        limit: usize,
    ) -> Result<Vec<Hit>> {
        let batches: Vec<RecordBatch> = self
            .chunks
            .query()
            .nearest_to(vector)?
            .distance_type(DistanceType::Cosine)
            .only_if(format!("({filter}) AND embedding IS NOT NULL"))
            .select(Select::columns(&with_score(HIT_COLUMNS, "_distance")))
            .limit(limit)
            .execute()
            .await?
            .try_collect()
            .await?;
        hits(&batches, "_distance")
    }
}

fn with_score<'a>(columns: &[&'a str], score: &'a str) -> Vec<&'a str> {
    let mut v = columns.to_vec();
    v.push(score);
    v
}

fn hits(batches: &[RecordBatch], score_column: &str) -> Result<Vec<Hit>> {
    let mut out = Vec::new();
    for b in batches {
        let chunks = batch_to_chunks(b)?;
        let scores = b
            .column_by_name(score_column)
            .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
            .ok_or_else(|| ModelError::Column(score_column.into()))?;
        out.extend(chunks.into_iter().enumerate().map(|(i, chunk)| Hit {
            chunk,
            score: scores.value(i),
        }));
    }
    Ok(out)
}

fn embedding_dim(schema: &arrow_schema::Schema) -> Option<usize> {
    match schema.field_with_name("embedding").ok()?.data_type() {
        arrow_schema::DataType::FixedSizeList(_, n) => Some(*n as usize),
        _ => None,
    }
}

/// One record batch as a reader, the form `merge_insert` takes.
pub(crate) fn batch_reader(
    chunks: &[Chunk],
    dim: usize,
) -> Result<Box<dyn arrow_array::RecordBatchReader + Send>> {
    let batch = chunks_to_batch(chunks, dim)?;
    let schema = batch.schema();
    Ok(Box::new(RecordBatchIterator::new(vec![Ok(batch)], schema)))
}
