//! The memory record (`Chunk`) and its Arrow schema: the one union schema every
//! API surface reads and writes.

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, FixedSizeListBuilder, Float32Builder, Int32Builder, Int64Builder, ListBuilder,
    StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{
    Array, ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Int32Array, Int64Array,
    ListArray, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use sha2::{Digest, Sha256};

/// The stream a request lands in when it names none.
pub const DEFAULT_STREAM: &str = "__user_default__";

/// Microseconds since the Unix epoch, UTC: the unit of every timestamp column.
pub type Micros = i64;

pub fn now_micros() -> Micros {
    chrono::Utc::now().timestamp_micros()
}

/// One memory. Field order follows the Arrow schema in [`chunk_schema`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Chunk {
    pub id: String,
    pub stream: String,
    /// 0 = raw, 1 = consolidated.
    pub level: i32,
    pub content: String,
    pub title: Option<String>,
    /// SHA-256 of the normalised content (lower case, whitespace folded).
    pub content_hash: String,
    pub memory_type: String,
    pub subject: Option<String>,
    pub source: Option<String>,
    pub tags: Vec<String>,
    pub entities: Vec<String>,
    /// Caller metadata, JSON text.
    pub metadata: Option<String>,
    /// What the pipeline learned or flagged, JSON text.
    pub extraction_meta: Option<String>,
    pub user_id: Option<String>,
    pub app_id: Option<String>,
    pub agent_id: Option<String>,
    pub session_id: Option<String>,
    pub importance: f32,
    pub confidence: f32,
    pub surprise: f32,
    pub pinned: bool,
    pub immutable: bool,
    pub expires_at: Option<Micros>,
    /// Valid time: when the fact holds in the world (None = unbounded).
    pub valid_from: Option<Micros>,
    pub valid_until: Option<Micros>,
    /// Transaction time: when loomem recorded it.
    pub created_at: Micros,
    pub updated_at: Micros,
    pub supersedes: Option<String>,
    pub superseded_by: Option<String>,
    pub version: i32,
    pub embedding: Option<Vec<f32>>,
    pub embed_model: Option<String>,
    pub access_count: i64,
    pub last_accessed_at: Option<Micros>,
}

impl Chunk {
    /// A fresh level-0 memory with defaults for everything but identity and text.
    pub fn new(id: String, stream: String, content: String, created_at: Micros) -> Chunk {
        let content_hash = content_hash(&content);
        Chunk {
            id,
            stream,
            level: 0,
            content,
            title: None,
            content_hash,
            memory_type: "general".into(),
            subject: None,
            source: None,
            tags: Vec::new(),
            entities: Vec::new(),
            metadata: None,
            extraction_meta: None,
            user_id: None,
            app_id: None,
            agent_id: None,
            session_id: None,
            importance: 1.0,
            confidence: 1.0,
            surprise: 0.0,
            pinned: false,
            immutable: false,
            expires_at: None,
            valid_from: None,
            valid_until: None,
            created_at,
            updated_at: created_at,
            supersedes: None,
            superseded_by: None,
            version: 1,
            embedding: None,
            embed_model: None,
            access_count: 0,
            last_accessed_at: None,
        }
    }

    /// Replace the text and keep `content_hash` in step with it.
    pub fn set_content(&mut self, content: String) {
        self.content_hash = content_hash(&content);
        self.content = content;
    }

    /// Merge a JSON object into `extraction_meta` under `key`.
    pub fn annotate(&mut self, key: &str, value: serde_json::Value) {
        let mut meta = self
            .extraction_meta
            .as_deref()
            .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
            .filter(serde_json::Value::is_object)
            .unwrap_or_else(|| serde_json::json!({}));
        meta[key] = value;
        self.extraction_meta = Some(meta.to_string());
    }

    /// One key of `extraction_meta`.
    pub fn annotation(&self, key: &str) -> Option<serde_json::Value> {
        self.extraction_meta
            .as_deref()
            .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
            .and_then(|mut m| m.get_mut(key).map(serde_json::Value::take))
    }

    /// Drop one key of `extraction_meta`; whether it was there.
    pub fn remove_annotation(&mut self, key: &str) -> bool {
        let Some(mut meta) = self
            .extraction_meta
            .as_deref()
            .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
        else {
            return false;
        };
        let removed = meta
            .as_object_mut()
            .is_some_and(|m| m.remove(key).is_some());
        if removed {
            self.extraction_meta = Some(meta.to_string());
        }
        removed
    }
}

/// SHA-256 (hex) of the text lower-cased with whitespace runs folded to one space.
pub fn content_hash(content: &str) -> String {
    let normalised = content
        .split_whitespace()
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ");
    let digest = Sha256::digest(normalised.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, None)
}

fn str_list() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)))
}

/// The `chunks` table schema for vectors of `dim` dimensions.
pub fn chunk_schema(dim: usize) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("level", DataType::Int32, false),
        Field::new("content", DataType::Utf8, false),
        Field::new("title", DataType::Utf8, true),
        Field::new("content_hash", DataType::Utf8, false),
        Field::new("memory_type", DataType::Utf8, false),
        Field::new("subject", DataType::Utf8, true),
        Field::new("source", DataType::Utf8, true),
        Field::new("tags", str_list(), true),
        Field::new("entities", str_list(), true),
        Field::new("metadata", DataType::Utf8, true),
        Field::new("extraction_meta", DataType::Utf8, true),
        Field::new("user_id", DataType::Utf8, true),
        Field::new("app_id", DataType::Utf8, true),
        Field::new("agent_id", DataType::Utf8, true),
        Field::new("session_id", DataType::Utf8, true),
        Field::new("importance", DataType::Float32, false),
        Field::new("confidence", DataType::Float32, false),
        Field::new("surprise", DataType::Float32, false),
        Field::new("pinned", DataType::Boolean, false),
        Field::new("immutable", DataType::Boolean, false),
        Field::new("expires_at", ts(), true),
        Field::new("valid_from", ts(), true),
        Field::new("valid_until", ts(), true),
        Field::new("created_at", ts(), false),
        Field::new("updated_at", ts(), false),
        Field::new("supersedes", DataType::Utf8, true),
        Field::new("superseded_by", DataType::Utf8, true),
        Field::new("version", DataType::Int32, false),
        Field::new(
            "embedding",
            DataType::FixedSizeList(
                Arc::new(Field::new("item", DataType::Float32, true)),
                dim as i32,
            ),
            true,
        ),
        Field::new("embed_model", DataType::Utf8, true),
        Field::new("access_count", DataType::Int64, false),
        Field::new("last_accessed_at", ts(), true),
    ]))
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("column `{0}` is missing or has an unexpected type")]
    Column(String),
    #[error("embedding of chunk {id} has {got} dimensions, the table has {want}")]
    Dimension { id: String, got: usize, want: usize },
    #[error(transparent)]
    Arrow(#[from] arrow_schema::ArrowError),
}

fn strings<'a>(chunks: &'a [Chunk], f: impl Fn(&'a Chunk) -> Option<&'a str>) -> ArrayRef {
    let mut b = StringBuilder::new();
    for c in chunks {
        b.append_option(f(c));
    }
    Arc::new(b.finish())
}

fn lists(chunks: &[Chunk], f: impl Fn(&Chunk) -> &Vec<String>) -> ArrayRef {
    let mut b = ListBuilder::new(StringBuilder::new());
    for c in chunks {
        for v in f(c) {
            b.values().append_value(v);
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

fn times(chunks: &[Chunk], f: impl Fn(&Chunk) -> Option<Micros>) -> ArrayRef {
    let mut b = TimestampMicrosecondBuilder::new();
    for c in chunks {
        b.append_option(f(c));
    }
    Arc::new(b.finish())
}

fn floats(chunks: &[Chunk], f: impl Fn(&Chunk) -> f32) -> ArrayRef {
    let mut b = Float32Builder::new();
    for c in chunks {
        b.append_value(f(c));
    }
    Arc::new(b.finish())
}

fn ints(chunks: &[Chunk], f: impl Fn(&Chunk) -> i32) -> ArrayRef {
    let mut b = Int32Builder::new();
    for c in chunks {
        b.append_value(f(c));
    }
    Arc::new(b.finish())
}

fn bools(chunks: &[Chunk], f: impl Fn(&Chunk) -> bool) -> ArrayRef {
    let mut b = BooleanBuilder::new();
    for c in chunks {
        b.append_value(f(c));
    }
    Arc::new(b.finish())
}

/// Chunks to one record batch of [`chunk_schema`]`(dim)`.
pub fn chunks_to_batch(chunks: &[Chunk], dim: usize) -> Result<RecordBatch, ModelError> {
    let mut emb = FixedSizeListBuilder::new(Float32Builder::new(), dim as i32);
    for c in chunks {
        match &c.embedding {
            Some(v) if v.len() == dim => {
                emb.values().append_slice(v);
                emb.append(true);
            }
            Some(v) => {
                return Err(ModelError::Dimension {
                    id: c.id.clone(),
                    got: v.len(),
                    want: dim,
                })
            }
            None => {
                emb.values().append_nulls(dim);
                emb.append(false);
            }
        }
    }
    let mut access = Int64Builder::new();
    for c in chunks {
        access.append_value(c.access_count);
    }
    let columns: Vec<ArrayRef> = vec![
        strings(chunks, |c| Some(&c.id)),
        strings(chunks, |c| Some(&c.stream)),
        ints(chunks, |c| c.level),
        strings(chunks, |c| Some(&c.content)),
        strings(chunks, |c| c.title.as_deref()),
        strings(chunks, |c| Some(&c.content_hash)),
        strings(chunks, |c| Some(&c.memory_type)),
        strings(chunks, |c| c.subject.as_deref()),
        strings(chunks, |c| c.source.as_deref()),
        lists(chunks, |c| &c.tags),
        lists(chunks, |c| &c.entities),
        strings(chunks, |c| c.metadata.as_deref()),
        strings(chunks, |c| c.extraction_meta.as_deref()),
        strings(chunks, |c| c.user_id.as_deref()),
        strings(chunks, |c| c.app_id.as_deref()),
        strings(chunks, |c| c.agent_id.as_deref()),
        strings(chunks, |c| c.session_id.as_deref()),
        floats(chunks, |c| c.importance),
        floats(chunks, |c| c.confidence),
        floats(chunks, |c| c.surprise),
        bools(chunks, |c| c.pinned),
        bools(chunks, |c| c.immutable),
        times(chunks, |c| c.expires_at),
        times(chunks, |c| c.valid_from),
        times(chunks, |c| c.valid_until),
        times(chunks, |c| Some(c.created_at)),
        times(chunks, |c| Some(c.updated_at)),
        strings(chunks, |c| c.supersedes.as_deref()),
        strings(chunks, |c| c.superseded_by.as_deref()),
        ints(chunks, |c| c.version),
        Arc::new(emb.finish()),
        strings(chunks, |c| c.embed_model.as_deref()),
        Arc::new(access.finish()),
        times(chunks, |c| c.last_accessed_at),
    ];
    Ok(RecordBatch::try_new(chunk_schema(dim), columns)?)
}

/// Typed access to the columns of a batch that may hold any projection of the schema.
pub struct Columns<'a> {
    batch: &'a RecordBatch,
}

impl<'a> Columns<'a> {
    pub fn new(batch: &'a RecordBatch) -> Self {
        Columns { batch }
    }

    fn get<T: 'static>(&self, name: &str) -> Option<&'a T> {
        self.batch
            .column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<T>())
    }

    fn required<T: 'static>(&self, name: &str) -> Result<&'a T, ModelError> {
        self.get(name)
            .ok_or_else(|| ModelError::Column(name.into()))
    }

    pub fn str(&self, name: &str, row: usize) -> Option<String> {
        let a = self.get::<StringArray>(name)?;
        (!a.is_null(row)).then(|| a.value(row).to_string())
    }

    pub fn f32(&self, name: &str, row: usize) -> Option<f32> {
        let a = self.get::<Float32Array>(name)?;
        (!a.is_null(row)).then(|| a.value(row))
    }

    pub fn f64(&self, name: &str, row: usize) -> Option<f64> {
        let a = self.get::<arrow_array::Float64Array>(name)?;
        (!a.is_null(row)).then(|| a.value(row))
    }

    pub fn i32(&self, name: &str, row: usize) -> Option<i32> {
        let a = self.get::<Int32Array>(name)?;
        (!a.is_null(row)).then(|| a.value(row))
    }

    pub fn i64(&self, name: &str, row: usize) -> Option<i64> {
        let a = self.get::<Int64Array>(name)?;
        (!a.is_null(row)).then(|| a.value(row))
    }

    pub fn bool(&self, name: &str, row: usize) -> Option<bool> {
        let a = self.get::<BooleanArray>(name)?;
        (!a.is_null(row)).then(|| a.value(row))
    }

    pub fn time(&self, name: &str, row: usize) -> Option<Micros> {
        let a = self.get::<TimestampMicrosecondArray>(name)?;
        (!a.is_null(row)).then(|| a.value(row))
    }

    pub fn str_list(&self, name: &str, row: usize) -> Vec<String> {
        let Some(a) = self.get::<ListArray>(name) else {
            return Vec::new();
        };
        if a.is_null(row) {
            return Vec::new();
        }
        let values = a.value(row);
        let Some(s) = values.as_any().downcast_ref::<StringArray>() else {
            return Vec::new();
        };
        (0..s.len())
            .filter(|i| !s.is_null(*i))
            .map(|i| s.value(i).to_string())
            .collect()
    }

    pub fn vector(&self, name: &str, row: usize) -> Option<Vec<f32>> {
        let a = self.get::<FixedSizeListArray>(name)?;
        if a.is_null(row) {
            return None;
        }
        let values = a.value(row);
        let f = values.as_any().downcast_ref::<Float32Array>()?;
        Some(f.values().to_vec())
    }
}

/// Full chunks from a batch holding every column of the schema.
pub fn batch_to_chunks(batch: &RecordBatch) -> Result<Vec<Chunk>, ModelError> {
    let c = Columns::new(batch);
    // Fail early, with the column's name, when the batch is not a full chunk batch.
    c.required::<StringArray>("id")?;
    c.required::<StringArray>("content")?;
    c.required::<TimestampMicrosecondArray>("created_at")?;
    let req_str = |name: &str, row| c.str(name, row).unwrap_or_default();
    Ok((0..batch.num_rows())
        .map(|row| Chunk {
            id: req_str("id", row),
            stream: req_str("stream", row),
            level: c.i32("level", row).unwrap_or(0),
            content: req_str("content", row),
            title: c.str("title", row),
            content_hash: req_str("content_hash", row),
            memory_type: req_str("memory_type", row),
            subject: c.str("subject", row),
            source: c.str("source", row),
            tags: c.str_list("tags", row),
            entities: c.str_list("entities", row),
            metadata: c.str("metadata", row),
            extraction_meta: c.str("extraction_meta", row),
            user_id: c.str("user_id", row),
            app_id: c.str("app_id", row),
            agent_id: c.str("agent_id", row),
            session_id: c.str("session_id", row),
            importance: c.f32("importance", row).unwrap_or(1.0),
            confidence: c.f32("confidence", row).unwrap_or(1.0),
            surprise: c.f32("surprise", row).unwrap_or(0.0),
            pinned: c.bool("pinned", row).unwrap_or(false),
            immutable: c.bool("immutable", row).unwrap_or(false),
            expires_at: c.time("expires_at", row),
            valid_from: c.time("valid_from", row),
            valid_until: c.time("valid_until", row),
            created_at: c.time("created_at", row).unwrap_or(0),
            updated_at: c.time("updated_at", row).unwrap_or(0),
            supersedes: c.str("supersedes", row),
            superseded_by: c.str("superseded_by", row),
            version: c.i32("version", row).unwrap_or(1),
            embedding: c.vector("embedding", row),
            embed_model: c.str("embed_model", row),
            access_count: c.i64("access_count", row).unwrap_or(0),
            last_accessed_at: c.time("last_accessed_at", row),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip_through_arrow() {
        let mut a = Chunk::new("a".into(), "s".into(), "Hello  World".into(), 42);
        a.tags = vec!["x".into(), "y".into()];
        a.embedding = Some(vec![0.5; 8]);
        a.valid_from = Some(7);
        a.metadata = Some(r#"{"k":1}"#.into());
        let b = Chunk::new("b".into(), "s".into(), "other".into(), 43);
        let batch = chunks_to_batch(&[a.clone(), b.clone()], 8).unwrap();
        assert_eq!(batch.schema(), chunk_schema(8));
        assert_eq!(batch_to_chunks(&batch).unwrap(), vec![a, b]);
    }

    #[test]
    fn wrong_dimension_is_an_error_naming_the_chunk() {
        let mut a = Chunk::new("a".into(), "s".into(), "x".into(), 1);
        a.embedding = Some(vec![1.0; 3]);
        let err = chunks_to_batch(&[a], 8).unwrap_err().to_string();
        assert!(err.contains("chunk a"), "{err}");
    }

    #[test]
    fn content_hash_ignores_case_and_whitespace() {
        assert_eq!(content_hash("Dark  mode\n"), content_hash("dark mode"));
        assert_ne!(content_hash("dark mode"), content_hash("light mode"));
    }
}

/// A message the pipeline gave up on, kept with its last error.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    pub id: String,
    /// The memory id the message carried, when it could be read.
    pub memory_id: Option<String>,
    pub stream: Option<String>,
    pub pipeline: Option<String>,
    /// The message as received (JSON text, or the raw bytes read lossily).
    pub payload: String,
    pub error: String,
    pub attempts: i32,
    pub failed_at: Micros,
}

pub fn dead_letter_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("memory_id", DataType::Utf8, true),
        Field::new("stream", DataType::Utf8, true),
        Field::new("pipeline", DataType::Utf8, true),
        Field::new("payload", DataType::Utf8, false),
        Field::new("error", DataType::Utf8, false),
        Field::new("attempts", DataType::Int32, false),
        Field::new("failed_at", ts(), false),
    ]))
}

pub fn dead_letters_to_batch(rows: &[DeadLetter]) -> Result<RecordBatch, ModelError> {
    let s = |f: &dyn Fn(&DeadLetter) -> Option<&str>| -> ArrayRef {
        let mut b = StringBuilder::new();
        for r in rows {
            b.append_option(f(r));
        }
        Arc::new(b.finish())
    };
    let mut attempts = Int32Builder::new();
    let mut failed_at = TimestampMicrosecondBuilder::new();
    for r in rows {
        attempts.append_value(r.attempts);
        failed_at.append_value(r.failed_at);
    }
    Ok(RecordBatch::try_new(
        dead_letter_schema(),
        vec![
            s(&|r| Some(&r.id)),
            s(&|r| r.memory_id.as_deref()),
            s(&|r| r.stream.as_deref()),
            s(&|r| r.pipeline.as_deref()),
            s(&|r| Some(&r.payload)),
            s(&|r| Some(&r.error)),
            Arc::new(attempts.finish()),
            Arc::new(failed_at.finish()),
        ],
    )?)
}
