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
        Chunk::hashed(id, stream, content, content_hash, created_at)
    }

    /// [`Chunk::new`] with the content's hash given, not computed.
    fn hashed(
        id: String,
        stream: String,
        content: String,
        content_hash: String,
        created_at: Micros,
    ) -> Chunk {
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

    /// What is left of a memory whose row moved into a write: its id and
    /// stream (and time), no text and no hash.
    pub fn husk(&self) -> Chunk {
        Chunk::hashed(
            self.id.clone(),
            self.stream.clone(),
            String::new(),
            String::new(),
            self.created_at,
        )
    }

    /// Replace the text and keep `content_hash` in step with it.
    pub fn set_content(&mut self, content: String) {
        self.content_hash = content_hash(&content);
        self.content = content;
    }

    /// Merge a JSON object into `extraction_meta` under `key`.
    pub fn annotate(&mut self, key: &str, value: serde_json::Value) {
        if !self.annotate_first(key, &value) {
            self.annotate_tree(key, value);
        }
    }

    /// [`Chunk::annotate`] with any serialisable value.
    pub fn annotate_with(&mut self, key: &str, value: &impl serde::Serialize) {
        if !self.annotate_first(key, value) {
            let value = serde_json::to_value(value).unwrap_or(serde_json::Value::Null);
            self.annotate_tree(key, value);
        }
    }

    /// A memory with no annotation yet (most of them, as a pipeline scores
    /// them) has its one key written straight, with no JSON tree built,
    /// parsed or copied: the same text the tree would print. Whether it
    /// was written so.
    fn annotate_first(&mut self, key: &str, value: &impl serde::Serialize) -> bool {
        if self.extraction_meta.is_some() {
            return false;
        }
        self.extraction_meta = single_entry(key, value);
        self.extraction_meta.is_some()
    }

    /// `value` merged under `key` into the annotations, read as a JSON tree.
    fn annotate_tree(&mut self, key: &str, value: serde_json::Value) {
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

/// `{"key": value}` as JSON text; None when `value` does not serialise.
fn single_entry(key: &str, value: &impl serde::Serialize) -> Option<String> {
    use serde::ser::{SerializeMap, Serializer};
    let mut out = Vec::with_capacity(96);
    let mut ser = serde_json::Serializer::new(&mut out);
    let mut map = ser.serialize_map(Some(1)).ok()?;
    map.serialize_entry(key, value).ok()?;
    map.end().ok()?;
    // serde_json writes UTF-8 only.
    String::from_utf8(out).ok()
}

/// `word` lower-cased onto `out`, as `str::to_lowercase` would (which knows
/// context, such as a final sigma), without its allocation for ASCII words.
pub fn push_lowercase(out: &mut String, word: &str) {
    match word.is_ascii() {
        true => out.extend(word.bytes().map(|b| char::from(b.to_ascii_lowercase()))),
        false => out.push_str(&word.to_lowercase()),
    }
}

/// SHA-256 (hex) of the text lower-cased with whitespace runs folded to one space.
pub fn content_hash(content: &str) -> String {
    // Built in one buffer: it is asked at least once for every write (an
    // import asks twice, for the id it derives and for the memory).
    let mut normalised = String::with_capacity(content.len());
    for word in content.split_whitespace() {
        if !normalised.is_empty() {
            normalised.push(' ');
        }
        push_lowercase(&mut normalised, word);
    }
    hex(&Sha256::digest(normalised.as_bytes()))
}

/// `bytes` in lower-case hex, two digits a byte.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
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

/// A column of strings, one per row (null where `f` gives none): of chunks,
/// and of the rows of the other tables (the graph's).
pub(crate) fn strings<'a, T>(rows: &'a [T], f: impl Fn(&'a T) -> Option<&'a str>) -> ArrayRef {
    let mut b = StringBuilder::new();
    for r in rows {
        b.append_option(f(r));
    }
    Arc::new(b.finish())
}

/// A column of string lists, one list per row, none null.
pub(crate) fn lists<T>(rows: &[T], f: impl Fn(&T) -> &Vec<String>) -> ArrayRef {
    let mut b = ListBuilder::new(StringBuilder::new());
    for r in rows {
        for v in f(r) {
            b.values().append_value(v);
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

/// A column of times (microseconds, no zone), null where `f` gives none.
pub(crate) fn times<T>(rows: &[T], f: impl Fn(&T) -> Option<Micros>) -> ArrayRef {
    let mut b = TimestampMicrosecondBuilder::new();
    for r in rows {
        b.append_option(f(r));
    }
    Arc::new(b.finish())
}

/// A column of 64-bit integers, one per row.
pub(crate) fn int64s<T>(rows: &[T], f: impl Fn(&T) -> i64) -> ArrayRef {
    let mut b = Int64Builder::new();
    for r in rows {
        b.append_value(f(r));
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
        int64s(chunks, |c| c.access_count),
        times(chunks, |c| c.last_accessed_at),
    ];
    Ok(RecordBatch::try_new(chunk_schema(dim), columns)?)
}

/// Typed access to the columns of a batch that may hold any projection of the schema.
pub struct Columns<'a> {
    batch: &'a RecordBatch,
}

/// One column of a batch, looked up by name once (a lookup walks the
/// schema's fields): values by row, None where the row is null or the
/// batch lacks the column.
pub struct Col<'a, A>(Option<&'a A>);

impl<'a, A: Array> Col<'a, A> {
    fn valid(&self, row: usize) -> Option<&'a A> {
        self.0.filter(|a| a.is_valid(row))
    }
}

impl<T: arrow_array::ArrowPrimitiveType> Col<'_, arrow_array::PrimitiveArray<T>> {
    pub fn value(&self, row: usize) -> Option<T::Native> {
        self.valid(row).map(|a| a.value(row))
    }
}

impl Col<'_, BooleanArray> {
    pub fn value(&self, row: usize) -> Option<bool> {
        self.valid(row).map(|a| a.value(row))
    }
}

impl<'a> Col<'a, StringArray> {
    pub fn string(&self, row: usize) -> Option<String> {
        self.str(row).map(str::to_string)
    }

    /// A string where the column holds it, not copied.
    pub fn str(&self, row: usize) -> Option<&'a str> {
        self.valid(row).map(|a| a.value(row))
    }
}

impl Col<'_, ListArray> {
    /// A list of strings; empty when null (or not strings).
    pub fn strings(&self, row: usize) -> Vec<String> {
        let Some(a) = self.valid(row) else {
            return Vec::new();
        };
        let (start, end) = (a.value_offsets()[row], a.value_offsets()[row + 1]);
        if start == end {
            return Vec::new();
        }
        let Some(s) = a.values().as_any().downcast_ref::<StringArray>() else {
            return Vec::new();
        };
        (start as usize..end as usize)
            .filter(|&i| s.is_valid(i))
            .map(|i| s.value(i).to_string())
            .collect()
    }
}

impl<'a> Col<'a, FixedSizeListArray> {
    /// A vector of floats, copied out of the column's values.
    pub fn floats(&self, row: usize) -> Option<Vec<f32>> {
        self.floats_in_place(row).map(<[f32]>::to_vec)
    }

    /// A vector of floats where the column holds it, not copied.
    pub fn floats_in_place(&self, row: usize) -> Option<&'a [f32]> {
        let a = self.valid(row)?;
        let f = a.values().as_any().downcast_ref::<Float32Array>()?;
        let dim = a.value_length() as usize;
        let start = a.value_offset(row) as usize;
        f.values().get(start..start + dim)
    }
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

    /// A column the batch must hold, to read many rows of; the error
    /// names it.
    pub fn required_col<T: 'static>(&self, name: &str) -> Result<Col<'a, T>, ModelError> {
        self.required(name).map(|a| Col(Some(a)))
    }

    /// A column, to read many rows of.
    pub fn col<T: 'static>(&self, name: &str) -> Col<'a, T> {
        Col(self.get(name))
    }

    pub fn str(&self, name: &str, row: usize) -> Option<String> {
        self.col::<StringArray>(name).string(row)
    }

    pub fn f32(&self, name: &str, row: usize) -> Option<f32> {
        self.col::<Float32Array>(name).value(row)
    }

    pub fn f64(&self, name: &str, row: usize) -> Option<f64> {
        self.col::<arrow_array::Float64Array>(name).value(row)
    }

    pub fn i32(&self, name: &str, row: usize) -> Option<i32> {
        self.col::<Int32Array>(name).value(row)
    }

    pub fn i64(&self, name: &str, row: usize) -> Option<i64> {
        self.col::<Int64Array>(name).value(row)
    }

    pub fn bool(&self, name: &str, row: usize) -> Option<bool> {
        self.col::<BooleanArray>(name).value(row)
    }

    pub fn time(&self, name: &str, row: usize) -> Option<Micros> {
        self.col::<TimestampMicrosecondArray>(name).value(row)
    }

    pub fn str_list(&self, name: &str, row: usize) -> Vec<String> {
        self.col::<ListArray>(name).strings(row)
    }

    pub fn vector(&self, name: &str, row: usize) -> Option<Vec<f32>> {
        self.col::<FixedSizeListArray>(name).floats(row)
    }
}

/// Full chunks from a batch holding every column of the schema.
pub fn batch_to_chunks(batch: &RecordBatch) -> Result<Vec<Chunk>, ModelError> {
    let c = Columns::new(batch);
    // Fail early, with the column's name, when the batch is not a full chunk
    // batch. Each column is looked up once, not once a row.
    let id = c.required_col::<StringArray>("id")?;
    let content = c.required_col::<StringArray>("content")?;
    let created_at = c.required_col::<TimestampMicrosecondArray>("created_at")?;
    let s = |name: &str| c.col::<StringArray>(name);
    let f = |name: &str| c.col::<Float32Array>(name);
    let t = |name: &str| c.col::<TimestampMicrosecondArray>(name);
    let b = |name: &str| c.col::<BooleanArray>(name);
    let i = |name: &str| c.col::<Int32Array>(name);
    let l = |name: &str| c.col::<ListArray>(name);
    let (stream, title) = (s("stream"), s("title"));
    let (content_hash, memory_type, subject) = (s("content_hash"), s("memory_type"), s("subject"));
    let (source, tags, entities) = (s("source"), l("tags"), l("entities"));
    let (metadata, extraction_meta) = (s("metadata"), s("extraction_meta"));
    let (user_id, app_id, agent_id, session_id) =
        (s("user_id"), s("app_id"), s("agent_id"), s("session_id"));
    let (level, version) = (i("level"), i("version"));
    let (importance, confidence, surprise) = (f("importance"), f("confidence"), f("surprise"));
    let (pinned, immutable) = (b("pinned"), b("immutable"));
    let (expires_at, valid_from, valid_until) =
        (t("expires_at"), t("valid_from"), t("valid_until"));
    let (updated_at, last_accessed_at) = (t("updated_at"), t("last_accessed_at"));
    let (supersedes, superseded_by) = (s("supersedes"), s("superseded_by"));
    let embedding = c.col::<FixedSizeListArray>("embedding");
    let (embed_model, access_count) = (s("embed_model"), c.col::<Int64Array>("access_count"));
    Ok((0..batch.num_rows())
        .map(|row| Chunk {
            id: id.string(row).unwrap_or_default(),
            stream: stream.string(row).unwrap_or_default(),
            level: level.value(row).unwrap_or(0),
            content: content.string(row).unwrap_or_default(),
            title: title.string(row),
            content_hash: content_hash.string(row).unwrap_or_default(),
            memory_type: memory_type.string(row).unwrap_or_default(),
            subject: subject.string(row),
            source: source.string(row),
            tags: tags.strings(row),
            entities: entities.strings(row),
            metadata: metadata.string(row),
            extraction_meta: extraction_meta.string(row),
            user_id: user_id.string(row),
            app_id: app_id.string(row),
            agent_id: agent_id.string(row),
            session_id: session_id.string(row),
            importance: importance.value(row).unwrap_or(1.0),
            confidence: confidence.value(row).unwrap_or(1.0),
            surprise: surprise.value(row).unwrap_or(0.0),
            pinned: pinned.value(row).unwrap_or(false),
            immutable: immutable.value(row).unwrap_or(false),
            expires_at: expires_at.value(row),
            valid_from: valid_from.value(row),
            valid_until: valid_until.value(row),
            created_at: created_at.value(row).unwrap_or(0),
            updated_at: updated_at.value(row).unwrap_or(0),
            supersedes: supersedes.string(row),
            superseded_by: superseded_by.string(row),
            version: version.value(row).unwrap_or(1),
            embedding: embedding.floats(row),
            embed_model: embed_model.string(row),
            access_count: access_count.value(row).unwrap_or(0),
            last_accessed_at: last_accessed_at.value(row),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stored hashes stay comparable: the hash is the first version's.
    #[test]
    fn content_hashes_match_the_first_versions() {
        fn first_version(content: &str) -> String {
            let normalised = content
                .split_whitespace()
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
                .join(" ");
            let digest = Sha256::digest(normalised.as_bytes());
            digest.iter().map(|b| format!("{b:02x}")).collect()
        }
        for text in [
            "Likes tea",
            "  likes\t\nTEA  ",
            "ΟΔΟΣ Straße İstanbul ÉCOLE 東京",
            "a\u{00a0}b\u{2003}c",
            "",
            "   ",
        ] {
            assert_eq!(content_hash(text), first_version(text), "{text:?}");
        }
        assert_eq!(content_hash("Likes tea"), content_hash("likes   TEA"));
    }

    /// A memory's first annotation, written straight, reads as the one
    /// written into an annotation tree; later ones merge as before.
    #[test]
    fn a_first_annotation_is_written_as_the_tree_writes_it() {
        let values = [
            serde_json::json!({"novelty": 0.3f32, "base_importance": 1.0, "importance": f32::NAN}),
            serde_json::json!(0.5),
            serde_json::json!("say \"hi\"\n"),
            serde_json::json!([1, {"b": null, "a": [true]}]),
        ];
        for value in values {
            for key in ["surprise", "odd \"key\""] {
                let mut straight = Chunk::new("a".into(), "s".into(), "t".into(), 0);
                let mut tree = straight.clone();
                tree.extraction_meta = Some("{}".into());
                straight.annotate(key, value.clone());
                tree.annotate(key, value.clone());
                assert_eq!(
                    straight.extraction_meta, tree.extraction_meta,
                    "{key} {value}"
                );
                assert_eq!(straight.annotation(key), Some(value.clone()));
            }
        }
        let mut c = Chunk::new("a".into(), "s".into(), "t".into(), 0);
        c.annotate_with("one", &1);
        c.annotate_with("two", &[2]);
        c.annotate_with("one", &"again");
        assert_eq!(
            c.extraction_meta.as_deref(),
            Some(r#"{"one":"again","two":[2]}"#)
        );
    }

    #[test]
    fn hex_is_two_lower_case_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }

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
