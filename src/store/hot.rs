//! The hot index: per stream, the unit vectors of its memories in one
//! contiguous matrix, beside the columns a search filters on, every memory's
//! row (without its embedding) and the postings of its text (`bm25`), held
//! in memory and kept in step with the chunk writer. Lance stays the source
//! of truth: a stream is loaded from it on its first read, every commit the
//! writer makes is applied to the loaded streams, and a delete or a rollback
//! (whose rows are not known row by row) drops them all, to be loaded again.
//! A read the index cannot answer (an opaque filter, a stream too large for
//! the budget, a past version) goes to Lance. A read of a stream another
//! reader is loading waits for that load: the legs of one search ask for
//! their stream at once, and the leg that does not load it would otherwise
//! run a prefiltered Lance search beside the load, on the same CPUs, for an
//! answer no sooner than the load's.
//!
//! A flat scan re-scores its best rows from half-precision copies of the
//! vectors (f16 moves the product of two unit vectors by at most 2^-11), so recall
//! is the exact scan's but for near-ties; on this machine it reads a
//! 10k-memory stream in about a millisecond.

use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use arrow_array::{
    FixedSizeListArray, Float32Array, RecordBatch, StringArray, TimestampMicrosecondArray,
    UInt32Array,
};
use arrow_select::take::take;

use super::bm25::{free_each, Id, Map, TextIndex};
use super::filter::Cond;
use crate::core::model::{batch_to_chunks, Chunk, Col, Columns, Micros, ModelError};
use crate::core::vector::{dot, dot_f16, dot_i8_rows, l2_normalize, quantize_i8, widen};
use half::f16;

/// What a search filters on, per memory.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Meta {
    pub current: bool,
    pub expires_at: Option<Micros>,
    pub created_at: Micros,
    pub valid_from: Option<Micros>,
    pub valid_until: Option<Micros>,
    pub memory_type: String,
    /// Lower-cased.
    pub subject: Option<String>,
    pub confidence: f32,
}

impl Meta {
    pub fn of(c: &Chunk) -> Meta {
        Meta {
            current: c.superseded_by.is_none(),
            expires_at: c.expires_at,
            created_at: c.created_at,
            valid_from: c.valid_from,
            valid_until: c.valid_until,
            memory_type: c.memory_type.clone(),
            subject: c.subject.as_deref().map(str::to_lowercase),
            confidence: c.confidence,
        }
    }

    /// Whether the row meets every condition (stream conditions are the
    /// caller's business: an index holds one stream). Conditions that need
    /// the row ([`Cond::needs_row`]) are judged by [`Meta::meets_row`];
    /// here they never hold.
    pub fn meets(&self, conds: &[Cond]) -> bool {
        self.judge(conds, RowFor::None)
    }

    /// [`Meta::meets`], with the memory's row for the conditions that need it.
    pub fn meets_row(&self, chunk: &Chunk, conds: &[Cond]) -> bool {
        self.judge(conds, RowFor::Some(chunk))
    }

    /// Whether the row can meet `conds`: those on the filter columns hold,
    /// those that need the row are left for [`Meta::meets_row`].
    fn may_meet(&self, conds: &[Cond]) -> bool {
        self.judge(conds, RowFor::Later)
    }

    fn judge(&self, conds: &[Cond], row: RowFor<'_>) -> bool {
        let on_row = |f: &dyn Fn(&Chunk) -> bool| match row {
            RowFor::Some(c) => f(c),
            RowFor::None => false,
            RowFor::Later => true,
        };
        conds.iter().all(|c| match c {
            Cond::Streams(_) => true,
            Cond::Current => self.current,
            Cond::Unexpired(now) => self.expires_at.is_none_or(|e| e > *now),
            Cond::CreatedSince(t) => self.created_at >= *t,
            Cond::CreatedBefore(t) => self.created_at < *t,
            Cond::CreatedUntil(t) => self.created_at <= *t,
            Cond::ValidAt(t) => {
                self.valid_from.is_none_or(|f| f <= *t) && self.valid_until.is_none_or(|u| u > *t)
            }
            Cond::MemoryType(m) => self.memory_type == *m,
            Cond::Subject(s) => self.subject.as_deref() == Some(s.as_str()),
            Cond::MinConfidence(min) => f64::from(self.confidence) >= *min,
            Cond::MentionsKey(key) => on_row(&|c| c.entities.iter().any(|e| e == key)),
            Cond::ContentContains(text) => {
                on_row(&|c| c.content.to_lowercase().contains(text.as_str()))
            }
            Cond::Any(branches) => branches.iter().any(|b| self.judge(b, row)),
            Cond::Opaque => false,
        })
    }
}

/// The row a judgement of [`Meta`] has for the conditions that need one.
#[derive(Clone, Copy)]
enum RowFor<'a> {
    Some(&'a Chunk),
    /// None: such conditions fail.
    None,
    /// Not looked up yet: such conditions pass, to be judged with the row.
    Later,
}

/// One memory as the index holds it: the row without its embedding, the
/// vector apart (`None`: it takes no part in vector reads).
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub chunk: Arc<Chunk>,
    pub vector: Option<Vec<f32>>,
    pub meta: Meta,
}

impl Row {
    /// The row of `chunk`; its vector takes part when `admitted`.
    pub fn new(mut chunk: Chunk, admitted: bool) -> Row {
        let vector = chunk.embedding.take().filter(|_| admitted);
        Row {
            meta: Meta::of(&chunk),
            chunk: Arc::new(chunk),
            vector,
        }
    }
}

/// One stream's memories.
#[derive(Debug, Default)]
pub(super) struct StreamIndex {
    dim: usize,
    ids: Vec<Id>,
    pos: Map<Id, usize>,
    /// Row-major, `dim` half-precision floats a memory, each of unit length
    /// before rounding: what the best of a scan are re-scored from.
    vectors: Vec<f16>,
    /// The same vectors quantised to int8 (`dim` bytes a memory) and their
    /// scales: what a search scans, half the bytes again; the best of the
    /// scan are then re-scored from `vectors`.
    codes: Vec<i8>,
    /// A vector being filed, of unit length in f32.
    unit: Vec<f32>,
    scales: Vec<f32>,
    meta: Vec<Meta>,
    id_bytes: usize,
    /// Bytes of the memories' rows.
    row_bytes: usize,
    /// Every memory of the stream, with or without a vector (without its
    /// embedding): what a search returns.
    docs: Map<Id, Doc>,
    /// The current memories by the hash of their text.
    current_by_hash: Map<String, Vec<Id>>,
    /// The postings of the memories' text, for the BM25 leg.
    text: TextIndex,
}

/// Loads of this many rows and more build their postings and file their
/// rows on two threads (a thread costs tens of microseconds to start).
const SPLIT_LOAD_ROWS: usize = 512;

/// A memory as the index holds it: a row of the batch a load read it in,
/// made a [`Chunk`] the first time it is asked for (a load files thousands
/// of rows of which a search returns ten; building every row's `Chunk`, a
/// string a column, was a fifth of a load, and freeing them most of an
/// eviction); or the `Chunk` a write applied.
#[derive(Debug)]
enum Doc {
    Chunk(Arc<Chunk>),
    Loaded {
        rows: Arc<RecordBatch>,
        row: u32,
        chunk: OnceLock<Arc<Chunk>>,
    },
}

impl Doc {
    /// The memory (without its embedding).
    fn chunk(&self) -> &Arc<Chunk> {
        match self {
            Doc::Chunk(c) => c,
            Doc::Loaded { rows, row, chunk } => chunk.get_or_init(|| {
                let one = rows.slice(*row as usize, 1);
                let mut c = batch_to_chunks(&one).expect("a load checks its batch's columns");
                Arc::new(c.pop().expect("a row of the batch"))
            }),
        }
    }
}

/// A load's batch of rows, its columns looked up once: what each row
/// gives the index ([`Loaded::row`]).
pub(super) struct Loaded<'a> {
    batch: &'a RecordBatch,
    id: Col<'a, StringArray>,
    content: Col<'a, StringArray>,
    created_at: Col<'a, TimestampMicrosecondArray>,
    stream: Col<'a, StringArray>,
    content_hash: Col<'a, StringArray>,
    memory_type: Col<'a, StringArray>,
    subject: Col<'a, StringArray>,
    superseded_by: Col<'a, StringArray>,
    embed_model: Col<'a, StringArray>,
    expires_at: Col<'a, TimestampMicrosecondArray>,
    valid_from: Col<'a, TimestampMicrosecondArray>,
    valid_until: Col<'a, TimestampMicrosecondArray>,
    confidence: Col<'a, Float32Array>,
    vectors: Col<'a, FixedSizeListArray>,
}

/// A loaded row, as [`StreamIndex::put_all`] files it.
struct LoadRow<'a> {
    id: Id,
    doc: Doc,
    content: &'a str,
    content_hash: &'a str,
    /// What its row costs ([`chunk_bytes`] of its `Chunk`).
    bytes: usize,
    meta: Meta,
    /// Its vector where Lance's batch holds it; None when it has none or
    /// it takes no part in vector reads.
    vector: Option<&'a [f32]>,
}

impl<'a> Loaded<'a> {
    /// `batch`, a read of every column of the chunk table (those a read
    /// leaves out being empty); an error names a column it lacks.
    pub fn new(batch: &'a RecordBatch) -> Result<Loaded<'a>, ModelError> {
        let c = Columns::new(batch);
        let s = |name: &str| c.col::<StringArray>(name);
        let t = |name: &str| c.col::<TimestampMicrosecondArray>(name);
        Ok(Loaded {
            batch,
            id: c.required_col("id")?,
            content: c.required_col("content")?,
            created_at: c.required_col("created_at")?,
            stream: s("stream"),
            content_hash: s("content_hash"),
            memory_type: s("memory_type"),
            subject: s("subject"),
            superseded_by: s("superseded_by"),
            embed_model: s("embed_model"),
            expires_at: t("expires_at"),
            valid_from: t("valid_from"),
            valid_until: t("valid_until"),
            confidence: c.col("confidence"),
            vectors: c.col("embedding"),
        })
    }

    pub fn len(&self) -> usize {
        self.batch.num_rows()
    }

    /// The batch as the index keeps it: without its embeddings, which the
    /// index holds apart, and copied into buffers of its own (a column
    /// Lance decodes may be a view of the bytes it read, which for a local
    /// table are the data file's mapping, [`super::mapped`]; kept, it would
    /// keep a merged-away file's disk space for as long as the stream
    /// stays loaded).
    fn kept(&self) -> Result<Arc<RecordBatch>, ModelError> {
        let mut rows = self.batch.clone();
        if let Ok(i) = self.batch.schema().index_of("embedding") {
            rows.remove_column(i);
        }
        let all = UInt32Array::from_iter_values(0..self.len() as u32);
        let columns = rows
            .columns()
            .iter()
            .map(|col| take(col.as_ref(), &all, None))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(RecordBatch::try_new(rows.schema(), columns)?))
    }

    /// Row `row`'s id and text, as `batch_to_chunks` reads them (nulls
    /// and all).
    fn id(&self, row: usize) -> &'a str {
        self.id.str(row).unwrap_or_default()
    }

    fn content(&self, row: usize) -> &'a str {
        self.content.str(row).unwrap_or_default()
    }

    /// Row `row`'s filter columns, as [`Meta::of`] its `Chunk`.
    fn meta(&self, row: usize) -> Meta {
        Meta {
            current: self.superseded_by.str(row).is_none(),
            expires_at: self.expires_at.value(row),
            created_at: self.created_at.value(row).unwrap_or(0),
            valid_from: self.valid_from.value(row),
            valid_until: self.valid_until.value(row),
            memory_type: self.memory_type.str(row).unwrap_or_default().to_string(),
            subject: self.subject.str(row).map(str::to_lowercase),
            confidence: self.confidence.value(row).unwrap_or(1.0),
        }
    }

    /// Row `row`, a row of `kept` (this batch as [`Loaded::kept`] keeps
    /// it); its vector takes part in vector reads when `admitted` says so
    /// of its embedding model.
    fn row(&self, kept: &Arc<RecordBatch>, row: usize, admitted: &Admitted<'_>) -> LoadRow<'a> {
        let (id, content) = (self.id(row), self.content(row));
        let stream = self.stream.str(row).unwrap_or_default();
        LoadRow {
            id: Id::from(id),
            doc: Doc::Loaded {
                rows: Arc::clone(kept),
                row: row as u32,
                chunk: OnceLock::new(),
            },
            content,
            content_hash: self.content_hash.str(row).unwrap_or_default(),
            bytes: CHUNK_BYTES + content.len() + id.len() + stream.len(),
            meta: self.meta(row),
            vector: self
                .vectors
                .floats_in_place(row)
                .filter(|_| admitted(self.embed_model.str(row))),
        }
    }
}

/// Whether a vector of an embedding model (None: unnamed) takes part in
/// vector reads.
pub(super) type Admitted<'f> = dyn Fn(Option<&str>) -> bool + Sync + 'f;

/// Bytes a memory's row costs beside its text.
const CHUNK_BYTES: usize = 512;

fn chunk_bytes(c: &Chunk) -> usize {
    CHUNK_BYTES + c.content.len() + c.id.len() + c.stream.len()
}

/// Bytes a memory costs beside its vector and id: its filter columns, its
/// place in the id map, the vectors' slack.
const ROW_OVERHEAD: usize = 160;
/// Bytes of a memory's text hash and its two map entries.
const HASH_BYTES: usize = 64 + 2 * 48;

impl StreamIndex {
    pub fn new(dim: usize) -> StreamIndex {
        StreamIndex {
            dim,
            ..Default::default()
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Room for `n` more memories (a batch of a load, up to Lance's 8,192
    /// rows: a stream is allocated in a few steps, without the copies and
    /// rehashes of growing row by row).
    pub fn reserve(&mut self, n: usize) {
        let d = self.dim;
        self.ids.reserve(n);
        self.pos.reserve(n);
        self.vectors.reserve(n * d);
        self.codes.reserve(n * d);
        self.scales.reserve(n);
        self.meta.reserve(n);
        self.docs.reserve(n);
        self.current_by_hash.reserve(n);
        self.text.reserve(n);
    }

    /// What the index holds in memory, roughly.
    pub fn bytes(&self) -> usize {
        row_bytes(self.dim) * self.docs.len()
            + 3 * self.id_bytes
            + self.row_bytes
            + self.text.bytes()
    }

    /// A memory of the stream (without its embedding) and its filter columns.
    pub fn get(&self, id: &str) -> Option<(&Arc<Chunk>, &Meta)> {
        Some((self.docs.get(id)?.chunk(), self.text.meta(id)?))
    }

    /// The stream's memories (without their embeddings) that meet `conds`,
    /// conditions on the row included ([`Meta::meets_row`]).
    ///
    /// The filter columns are judged first, in one pass over the text
    /// index's slots; only the memories they admit are looked up by id (the
    /// contradiction stage asks this of a stream for each subject it meets).
    pub fn rows_meeting<'a>(&'a self, conds: &'a [Cond]) -> impl Iterator<Item = &'a Arc<Chunk>> {
        self.text
            .metas()
            .filter(move |(_, m)| m.may_meet(conds))
            .filter_map(move |(id, m)| {
                let chunk = self.docs.get(id)?.chunk();
                m.meets_row(chunk, conds).then_some(chunk)
            })
    }

    /// How many of the stream's memories meet `conds`: from the filter
    /// columns alone unless a condition needs the row.
    pub fn count_meeting(&self, conds: &[Cond]) -> usize {
        if conds.iter().any(Cond::needs_row) {
            return self.rows_meeting(conds).count();
        }
        self.text.metas().filter(|(_, m)| m.meets(conds)).count()
    }

    /// The postings of the stream's text.
    pub fn text(&self) -> &TextIndex {
        &self.text
    }

    /// The current memories whose text hashes to `hash`.
    pub fn current_with_hash(&self, hash: &str) -> &[Id] {
        self.current_by_hash.get(hash).map_or(&[], Vec::as_slice)
    }

    /// A memory's access counters changed (nothing a search filters on or
    /// a text index holds); false when the index does not hold it.
    pub fn touch(&mut self, id: &str, count: i64, at: Option<Micros>) -> bool {
        match self.docs.get_mut(id) {
            Some(doc) => {
                if let Doc::Loaded { .. } = doc {
                    *doc = Doc::Chunk(Arc::clone(doc.chunk()));
                }
                let Doc::Chunk(c) = doc else {
                    unreachable!("made a chunk above")
                };
                let c = Arc::make_mut(c);
                c.access_count = count;
                c.last_accessed_at = at;
                true
            }
            None => false,
        }
    }

    /// Insert or replace a memory.
    pub fn apply(&mut self, row: Row) {
        self.put(row.chunk, row.meta, row.vector.as_deref());
    }

    /// Insert or replace a memory: its row, filter columns and vector
    /// (`None`: it takes no part in vector reads), copied into the matrix
    /// from where it lies (a load reads it from Lance's batch in place).
    pub fn put(&mut self, chunk: Arc<Chunk>, meta: Meta, vector: Option<&[f32]>) {
        let id = Id::from(chunk.id.as_str());
        self.put_text(&id, &chunk.content, &meta);
        let hash = chunk.content_hash.clone();
        let bytes = chunk_bytes(&chunk);
        self.put_rest(id, Doc::Chunk(chunk), &hash, bytes, meta, vector);
    }

    /// A load's batches' rows, in order: [`StreamIndex::put`] for each, the
    /// postings built on this thread while a second one reads out and files
    /// the rows and their vectors (the two halves share nothing; on two
    /// cores a load takes about the longer half's time). Small loads stay
    /// on this thread.
    pub fn put_all(
        &mut self,
        batches: &[Loaded<'_>],
        admitted: &Admitted<'_>,
    ) -> Result<(), ModelError> {
        if batches.iter().map(Loaded::len).sum::<usize>() < SPLIT_LOAD_ROWS {
            for b in batches {
                let kept = b.kept()?;
                for r in 0..b.len() {
                    self.put_loaded(b.row(&kept, r, admitted));
                }
            }
            return Ok(());
        }
        let mut text = std::mem::take(&mut self.text);
        let rest = &mut *self;
        let filed = std::thread::scope(|s| {
            // Each row read out on the thread that files it: the two read
            // their own columns (and each makes the ids it holds).
            let filed = s.spawn(move || -> Result<(), ModelError> {
                for b in batches {
                    let kept = b.kept()?;
                    for r in 0..b.len() {
                        let row = b.row(&kept, r, admitted);
                        rest.put_rest(
                            row.id,
                            row.doc,
                            row.content_hash,
                            row.bytes,
                            row.meta,
                            row.vector,
                        );
                    }
                }
                Ok(())
            });
            // Here, not on the new thread: the analyzer's word memo is
            // this thread's.
            text.apply_all(batches.iter().flat_map(|b| {
                (0..b.len()).map(move |r| (Id::from(b.id(r)), b.content(r), b.meta(r)))
            }));
            filed.join().expect("the rows' thread does not panic")
        });
        self.text = text;
        filed
    }

    /// One loaded row: [`StreamIndex::put`] without a `Chunk`.
    fn put_loaded(&mut self, r: LoadRow<'_>) {
        self.put_text(&r.id, r.content, &r.meta);
        self.put_rest(r.id, r.doc, r.content_hash, r.bytes, r.meta, r.vector);
    }

    /// The postings of memory `id`'s text: a row whose text is unchanged
    /// (an access count, a supersession) keeps its postings.
    fn put_text(&mut self, id: &Id, content: &str, meta: &Meta) {
        match self.docs.get(id) {
            Some(old) if old.chunk().content == content => self.text.set_meta(id, meta.clone()),
            _ => self.text.apply(id.clone(), content, meta.clone()),
        }
    }

    /// [`StreamIndex::put`] but the postings: `doc`, whose text hashes to
    /// `hash` and whose row costs `bytes`.
    fn put_rest(
        &mut self,
        id: Id,
        doc: Doc,
        hash: &str,
        bytes: usize,
        meta: Meta,
        vector: Option<&[f32]>,
    ) {
        let old = self.docs.remove(&id);
        if let Some(old) = &old {
            let old = old.chunk();
            self.row_bytes -= chunk_bytes(old);
            if let Some(ids) = self.current_by_hash.get_mut(&old.content_hash) {
                ids.retain(|x| *x != id);
                if ids.is_empty() {
                    self.current_by_hash.remove(&old.content_hash);
                }
            }
        } else {
            self.id_bytes += id.len();
        }
        if meta.current {
            match self.current_by_hash.get_mut(hash) {
                Some(ids) => ids.push(id.clone()),
                None => {
                    self.current_by_hash
                        .insert(hash.to_string(), vec![id.clone()]);
                }
            }
        }
        self.row_bytes += bytes;
        self.docs.insert(id.clone(), doc);
        match vector {
            Some(v) if v.len() == self.dim => {
                let d = self.dim;
                let i = match self.pos.get(&id) {
                    Some(&i) => {
                        self.meta[i] = meta;
                        i
                    }
                    None => {
                        let i = self.ids.len();
                        self.pos.insert(id.clone(), i);
                        self.ids.push(id);
                        self.vectors.resize((i + 1) * d, f16::ZERO);
                        self.codes.resize((i + 1) * d, 0);
                        self.scales.push(0.0);
                        self.meta.push(meta);
                        i
                    }
                };
                let mut unit = std::mem::take(&mut self.unit);
                unit.clear();
                unit.extend_from_slice(v);
                l2_normalize(&mut unit);
                half::slice::HalfFloatSliceExt::convert_from_f32_slice(
                    &mut self.vectors[i * d..(i + 1) * d],
                    &unit,
                );
                self.scales[i] = quantize_i8(&unit, &mut self.codes[i * d..(i + 1) * d]);
                self.unit = unit;
            }
            _ => self.remove(&id),
        }
    }

    /// Free the index entry by entry, calling `step` after each.
    fn free_with(self, step: &mut dyn FnMut()) {
        let StreamIndex {
            ids,
            pos,
            docs,
            current_by_hash,
            meta,
            text,
            ..
        } = self;
        free_each(docs, step);
        free_each(current_by_hash, step);
        free_each(pos, step);
        free_each(ids, step);
        free_each(meta, step);
        text.free_with(step);
    }

    /// A memory's vector, of unit length (to f16's precision), if it has
    /// one here.
    pub fn vector(&self, id: &str) -> Option<Vec<f32>> {
        let &i = self.pos.get(id)?;
        Some(self.row_vector(i))
    }

    /// Take a memory out of the vector matrix: the last row takes its place.
    fn remove(&mut self, id: &str) {
        let Some(i) = self.pos.remove(id) else {
            return;
        };
        let last = self.ids.len() - 1;
        let d = self.dim;
        if i != last {
            self.vectors.copy_within(last * d..(last + 1) * d, i * d);
            self.codes.copy_within(last * d..(last + 1) * d, i * d);
            self.scales.swap(i, last);
            self.ids.swap(i, last);
            self.meta.swap(i, last);
            self.pos.insert(self.ids[i].clone(), i);
        }
        self.vectors.truncate(last * d);
        self.codes.truncate(last * d);
        self.scales.pop();
        self.meta.pop();
        self.ids.pop();
    }

    /// [`StreamIndex::nearest_rows`] as (cosine distance, id), for the tests
    /// of the scan.
    #[cfg(test)]
    fn nearest(&self, q: &[f32], conds: &[Cond], k: usize, out: &mut Vec<(f32, String)>) {
        out.extend(
            self.nearest_rows(q, conds, k)
                .into_iter()
                .map(|c| (c.distance, c.id.to_string())),
        );
    }

    /// The `k` rows meeting `conds` nearest to the unit vector `q`, nearest
    /// first, where they lie; ties go to the smaller id.
    ///
    /// The int8 codes are scanned for the best [`rerank_pool`]`(k)` rows,
    /// which are then re-scored from their f16 vectors: the answer is the
    /// exact scan's unless a row the quantisation error pushed past the pool
    /// would have made the top `k`, or two rows lie within f16's rounding of
    /// each other (a test holds recall@10 against the exact scan).
    fn nearest_rows(&self, q: &[f32], conds: &[Cond], k: usize) -> Vec<Candidate<'_>> {
        if k == 0 || q.len() != self.dim {
            return Vec::new();
        }
        let query = Query::new(q);
        let n = self.ids.len();
        let threads = if n >= PARALLEL_ROWS {
            std::thread::available_parallelism().map_or(1, |p| p.get().min(4))
        } else {
            1
        };
        let mut found = if threads <= 1 {
            self.top_k(&query, conds, k, 0..n)
        } else {
            // A large stream is scanned in parts, one thread each; the
            // parts' best k are merged.
            let per = n.div_ceil(threads);
            std::thread::scope(|s| {
                let parts: Vec<_> = (0..threads)
                    .map(|t| {
                        let rows = (t * per).min(n)..((t + 1) * per).min(n);
                        let query = &query;
                        s.spawn(move || self.top_k(query, conds, k, rows))
                    })
                    .collect();
                parts
                    .into_iter()
                    .flat_map(|h| h.join().expect("scan thread"))
                    .collect::<Vec<_>>()
            })
        };
        found.sort();
        found.truncate(k);
        found
    }

    /// The vector of the memory in row `row`, widened to f32.
    fn row_vector(&self, row: usize) -> Vec<f32> {
        widen(&self.vectors[row * self.dim..(row + 1) * self.dim])
    }

    /// The best of `rows` meeting `conds` by the int8 scan (at most
    /// [`rerank_pool`]`(k)` of them), re-scored from f16, unordered. A row's
    /// filter columns are read only when its score would enter the pool.
    fn top_k(
        &self,
        q: &Query<'_>,
        conds: &[Cond],
        k: usize,
        rows: std::ops::Range<usize>,
    ) -> Vec<Candidate<'_>> {
        let d = self.dim;
        let pool = rerank_pool(k);
        let mut heap: BinaryHeap<Approx> = BinaryHeap::with_capacity(pool + 1);
        // Blocks of rows: the int8 products of a block in one call.
        const BLOCK: usize = 256;
        let mut dots = [0i32; BLOCK];
        for start in rows.clone().step_by(BLOCK) {
            let end = (start + BLOCK).min(rows.end);
            let dots = &mut dots[..end - start];
            dot_i8_rows(&q.code, &self.codes[start * d..end * d], dots);
            for (i, &product) in (start..end).zip(dots.iter()) {
                let candidate = Approx {
                    distance: 1.0 - q.scale * self.scales[i] * product as f32,
                    row: i,
                };
                let full = heap.len() >= pool;
                if full && heap.peek().is_some_and(|worst| candidate >= *worst) {
                    continue;
                }
                if !self.meta[i].meets(conds) {
                    continue;
                }
                if full {
                    heap.pop();
                }
                heap.push(candidate);
            }
        }
        heap.into_iter()
            .map(|a| Candidate {
                distance: 1.0 - dot_f16(q.exact, &self.vectors[a.row * d..(a.row + 1) * d]),
                id: &self.ids[a.row],
                row: a.row,
            })
            .collect()
    }
}

/// A query as the scan reads it: the unit vector and its int8 code.
struct Query<'a> {
    exact: &'a [f32],
    code: Vec<i8>,
    scale: f32,
}

impl Query<'_> {
    fn new(exact: &[f32]) -> Query<'_> {
        let mut code = vec![0; exact.len()];
        let scale = quantize_i8(exact, &mut code);
        Query { exact, code, scale }
    }
}

/// How many rows the int8 scan keeps for exact scoring when `k` are asked
/// for: the quantisation error (about 0.002 in cosine for 384 dimensions) is
/// far below the score gaps a pool this size spans. The margin beyond `k`
/// stops growing past 64: a search asking for hundreds (the vector leg's
/// feedback pool) gets `k + 224`, where the rows near the cut are the least
/// relevant and re-scored anyway, instead of reading four times as many
/// vectors.
fn rerank_pool(k: usize) -> usize {
    k.saturating_add(3 * k.min(64)).saturating_add(32)
}

/// A row in the int8 scan's running pool: ordered by approximate distance,
/// then row (the heap's top is the worst kept).
#[derive(PartialEq)]
struct Approx {
    distance: f32,
    row: usize,
}

impl Eq for Approx {}

impl PartialOrd for Approx {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Approx {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.distance
            .total_cmp(&other.distance)
            .then_with(|| self.row.cmp(&other.row))
    }
}

/// Streams with at least this many vectors are scanned by several threads.
const PARALLEL_ROWS: usize = 32_768;

/// A row in the running top k: ordered by distance, then id (the heap's top
/// is the worst kept).
#[derive(PartialEq)]
struct Candidate<'a> {
    distance: f32,
    id: &'a str,
    row: usize,
}

impl Eq for Candidate<'_> {}

impl PartialOrd for Candidate<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Candidate<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.distance
            .total_cmp(&other.distance)
            .then_with(|| self.id.cmp(other.id))
    }
}

/// What a memory costs in the index, its id aside.
pub(super) fn row_bytes(dim: usize) -> usize {
    // The f16 vector, its int8 code and the code's scale.
    dim * (std::mem::size_of::<f16>() + 1) + std::mem::size_of::<f32>() + ROW_OVERHEAD + HASH_BYTES
}

enum Slot {
    Ready {
        index: Arc<RwLock<StreamIndex>>,
        bytes: usize,
        /// Its standing against eviction (see [`HotIndex::evict`]): the
        /// floor when last used plus its [`worth`].
        keep: u64,
        used_at: u64,
    },
    /// A reader is loading the stream; commits meanwhile wait here, and a
    /// delete poisons the load. Other readers wait on `done`, whose sender
    /// goes with the slot.
    Loading {
        pending: Vec<Row>,
        poisoned: bool,
        done: tokio::sync::watch::Sender<()>,
    },
    /// Larger than the whole budget: served by Lance until the next delete.
    TooBig,
}

#[derive(Default)]
struct State {
    streams: HashMap<String, Slot>,
    used: usize,
    tick: u64,
    /// The standing of the last stream evicted: a stream used now stands
    /// this high plus its [`worth`].
    floor: u64,
}

/// What holding a stream whose index takes `bytes` is worth, per byte of
/// the budget: the searches it answers without a load (any stream may be
/// searched next) times what a load costs, over the bytes it holds; in
/// millionths.
fn worth(bytes: usize, dim: usize) -> u64 {
    let cost = (bytes + LOAD_FIXED_ROWS * row_bytes(dim)) as u128;
    (cost * 1_000_000 / bytes.max(1) as u128) as u64
}

/// What a load costs beside its rows, as that many rows: Lance's query over
/// every fragment (about 3 ms), about 750 rows' decoding and filing.
const LOAD_FIXED_ROWS: usize = 750;

/// Every loaded stream, within a memory budget; the streams worth least per
/// byte held and not used lately are evicted first (see [`HotIndex::evict`]).
pub struct HotIndex {
    dim: usize,
    budget: std::sync::atomic::AtomicUsize,
    /// Only vectors of this model take part (None: any).
    model: RwLock<Option<String>>,
    state: Mutex<State>,
}

/// What a reader should do for a stream.
pub(super) enum Lookup {
    Ready(Arc<RwLock<StreamIndex>>),
    /// Load it from Lance and hand it to [`LoadGuard::finish`].
    Load(LoadGuard),
    /// Another reader is loading it: wait until this ends (`changed` fails
    /// once the load is installed, refused or abandoned), then look again.
    Wait(tokio::sync::watch::Receiver<()>),
    /// Ask Lance.
    Skip,
}

/// A load in progress; dropped unfinished (an error, a cancelled search), it
/// frees the slot for the next reader.
pub(super) struct LoadGuard {
    hot: Arc<HotIndex>,
    stream: String,
    done: bool,
}

impl LoadGuard {
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// Install the loaded index with the commits that arrived meanwhile; None
    /// when a delete poisoned the load (the index may hold deleted rows) or
    /// the stream does not fit the budget.
    pub fn finish(mut self, mut index: StreamIndex) -> Option<Arc<RwLock<StreamIndex>>> {
        self.done = true;
        let hot = self.hot.clone();
        let mut st = hot.state.lock().expect("hot index lock");
        let Some(Slot::Loading {
            pending, poisoned, ..
        }) = st.streams.remove(&self.stream)
        else {
            return None;
        };
        if poisoned {
            return None;
        }
        for row in pending {
            index.apply(row);
        }
        let bytes = index.bytes();
        if bytes > hot.budget() {
            st.streams.insert(self.stream.clone(), Slot::TooBig);
            return None;
        }
        st.tick += 1;
        let index = Arc::new(RwLock::new(index));
        st.used += bytes;
        let (used_at, keep) = (st.tick, st.floor + worth(bytes, hot.dim));
        st.streams.insert(
            self.stream.clone(),
            Slot::Ready {
                index: index.clone(),
                bytes,
                keep,
                used_at,
            },
        );
        hot.evict(&mut st, &self.stream);
        Some(index)
    }

    /// The stream is larger than the budget: do not try again until a delete.
    pub fn too_big(mut self) {
        self.done = true;
        let mut st = self.hot.state.lock().expect("hot index lock");
        st.streams.insert(self.stream.clone(), Slot::TooBig);
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        if !self.done {
            let mut st = self.hot.state.lock().expect("hot index lock");
            if matches!(st.streams.get(&self.stream), Some(Slot::Loading { .. })) {
                st.streams.remove(&self.stream);
            }
        }
    }
}

/// Default memory budget: 1 GiB, about 400k chat-turn-sized memories of 384
/// dimensions (vector, row, postings).
pub const DEFAULT_BUDGET: usize = 1 << 30;

impl HotIndex {
    pub fn new(dim: usize, budget: usize) -> HotIndex {
        HotIndex {
            dim,
            budget: budget.into(),
            model: RwLock::new(None),
            state: Mutex::default(),
        }
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn budget(&self) -> usize {
        self.budget.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Change the budget (0 turns the index off); loaded streams go.
    pub fn set_budget(&self, bytes: usize) {
        self.budget
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
        self.clear();
    }

    /// Only vectors of `model` take part from now on.
    pub fn set_model(&self, model: &str) {
        *self.model.write().expect("hot model lock") = Some(model.to_string());
        self.clear();
    }

    /// Whether the chunk's vector takes part in vector reads.
    pub fn admits(&self, c: &Chunk) -> bool {
        c.embedding.as_ref().is_some_and(|v| v.len() == self.dim)
            && match &*self.model.read().expect("hot model lock") {
                Some(m) => c.embed_model.as_deref() == Some(m.as_str()),
                None => true,
            }
    }

    /// Bytes held by loaded streams.
    pub fn used(&self) -> usize {
        self.state.lock().expect("hot index lock").used
    }

    /// Streams loaded now.
    pub fn loaded(&self) -> usize {
        let st = self.state.lock().expect("hot index lock");
        st.streams
            .values()
            .filter(|s| matches!(s, Slot::Ready { .. }))
            .count()
    }

    /// The stream's index when it is loaded, without loading it or counting
    /// as a use (for reads cheaper than a load, like a count).
    pub(super) fn ready(&self, stream: &str) -> Option<Arc<RwLock<StreamIndex>>> {
        match self
            .state
            .lock()
            .expect("hot index lock")
            .streams
            .get(stream)
        {
            Some(Slot::Ready { index, .. }) => Some(index.clone()),
            _ => None,
        }
    }

    pub(super) fn lookup(self: &Arc<Self>, stream: &str) -> Lookup {
        if self.budget() == 0 {
            return Lookup::Skip;
        }
        let mut st = self.state.lock().expect("hot index lock");
        st.tick += 1;
        let tick = st.tick;
        let floor = st.floor;
        match st.streams.get_mut(stream) {
            Some(Slot::Ready {
                index,
                bytes,
                keep,
                used_at,
            }) => {
                *used_at = tick;
                *keep = floor + worth(*bytes, self.dim);
                Lookup::Ready(index.clone())
            }
            Some(Slot::Loading { done, .. }) => Lookup::Wait(done.subscribe()),
            Some(Slot::TooBig) => Lookup::Skip,
            None => {
                st.streams.insert(
                    stream.to_string(),
                    Slot::Loading {
                        pending: Vec::new(),
                        poisoned: false,
                        done: tokio::sync::watch::channel(()).0,
                    },
                );
                Lookup::Load(LoadGuard {
                    hot: self.clone(),
                    stream: stream.to_string(),
                    done: false,
                })
            }
        }
    }

    /// A commit of these chunks landed: apply it to the loaded streams.
    pub fn apply(&self, chunks: impl IntoIterator<Item = Chunk>) {
        let mut st = self.state.lock().expect("hot index lock");
        if st.streams.is_empty() {
            return;
        }
        let mut grown: Vec<String> = Vec::new();
        for c in chunks {
            let Some(slot) = st.streams.get_mut(&c.stream) else {
                continue;
            };
            match slot {
                Slot::Ready { index, .. } => {
                    if !grown.contains(&c.stream) {
                        grown.push(c.stream.clone());
                    }
                    let admitted = self.admits(&c);
                    let row = Row::new(c, admitted);
                    index.write().expect("stream index lock").apply(row);
                }
                Slot::Loading { pending, .. } => {
                    let admitted = self.admits(&c);
                    pending.push(Row::new(c, admitted));
                }
                Slot::TooBig => {}
            }
        }
        for stream in grown {
            self.account(&mut st, &stream);
        }
    }

    /// Access counters written to the table (stream, id, count, last
    /// access): a held stream takes them in place; a stream being loaded may
    /// have read the rows before, so its load is dropped (read again next
    /// time).
    pub fn touch(&self, rows: &[(String, String, i64, Option<Micros>)]) {
        self.in_place(
            rows.iter().map(|r| (r.0.as_str(), r)),
            |index, (_, id, count, at)| {
                index.touch(id, *count, *at);
            },
        );
    }

    /// `change` each row in its stream where the stream is held; a stream
    /// being loaded may have read the rows before the change, so its load is
    /// dropped (read again next time).
    fn in_place<'a, T>(
        &self,
        rows: impl IntoIterator<Item = (&'a str, T)>,
        mut change: impl FnMut(&mut StreamIndex, T),
    ) {
        let mut loading: Vec<String> = Vec::new();
        {
            let st = self.state.lock().expect("hot index lock");
            for (stream, row) in rows {
                match st.streams.get(stream) {
                    Some(Slot::Ready { index, .. }) => {
                        change(&mut index.write().expect("stream index lock"), row)
                    }
                    Some(Slot::Loading { .. }) if !loading.iter().any(|s| s == stream) => {
                        loading.push(stream.to_string())
                    }
                    _ => {}
                }
            }
        }
        if !loading.is_empty() {
            self.invalidate(Some(&loading));
        }
    }

    /// Rows of `streams` (None: of any stream) went that are not known one
    /// by one (a delete, a rollback): drop those streams and poison their
    /// loads under way.
    pub fn invalidate(&self, streams: Option<&[String]>) {
        let mut st = self.state.lock().expect("hot index lock");
        let gone: Vec<Slot> = st
            .streams
            .extract_if(|stream, slot| {
                if streams.is_some_and(|list| !list.contains(stream)) {
                    return false;
                }
                match slot {
                    Slot::Loading { poisoned, .. } => {
                        *poisoned = true;
                        false
                    }
                    Slot::Ready { .. } | Slot::TooBig => true,
                }
            })
            .map(|(_, slot)| slot)
            .collect();
        for slot in &gone {
            if let Slot::Ready { bytes, .. } = slot {
                st.used -= bytes;
            }
        }
        reap(gone);
    }

    fn clear(&self) {
        self.invalidate(None);
    }

    /// Re-measure a stream after commits; evict others (or itself) to fit.
    fn account(&self, st: &mut State, stream: &str) {
        let Some(Slot::Ready { index, bytes, .. }) = st.streams.get_mut(stream) else {
            return;
        };
        let now = index.read().expect("stream index lock").bytes();
        let before = std::mem::replace(bytes, now);
        st.used = st.used - before + now;
        if now > self.budget() {
            reap(
                st.streams
                    .insert(stream.to_string(), Slot::TooBig)
                    .into_iter()
                    .collect(),
            );
            st.used -= now;
            return;
        }
        self.evict(st, stream);
    }

    /// Evict streams other than `spare` until the loaded streams fit the
    /// budget, by what holding them is worth per byte (GreedyDual-Size): a
    /// stream used stands at the floor plus its [`worth`], the lowest
    /// standing goes (the least recently used among equals) and the floor
    /// rises to it, so streams not used for a while go in the end whatever
    /// their size. Any stream may be searched next, so the bytes of one
    /// large stream spare the loads of many small ones: on the multi-tenant
    /// bench (1M memories, 1,000 streams, 1 GiB) least-recently-used held
    /// about 350 streams and a second search of a stream met a load half the
    /// time; this holds about 500 and the second search rarely loads.
    fn evict(&self, st: &mut State, spare: &str) {
        let mut victims = Vec::new();
        while st.used > self.budget() {
            let victim = st
                .streams
                .iter()
                .filter_map(|(s, slot)| match slot {
                    Slot::Ready {
                        keep,
                        used_at,
                        bytes,
                        ..
                    } if s != spare => Some(((*keep, *used_at), *bytes, s)),
                    _ => None,
                })
                .min_by_key(|(standing, _, _)| *standing)
                .map(|((keep, _), bytes, s)| (keep, bytes, s.clone()));
            let Some((keep, bytes, victim)) = victim else {
                break;
            };
            victims.extend(st.streams.remove(&victim));
            st.used -= bytes;
            st.floor = st.floor.max(keep);
        }
        reap(victims);
    }
}

/// Frees the streams the index let go (evicted, grown past the budget,
/// dropped by a delete) away from the search or commit that let them go, on
/// a thread of its own, a step at a time. A stream's index is some ten
/// allocations a memory: freed at once (on the blocking pool, as before),
/// a large stream's hundreds of thousands of frees ran beside the next
/// searches' loads, contending for the allocator and the second core, and
/// small streams' first searches took two to five times their time.
fn reap(victims: Vec<Slot>) {
    if victims.is_empty() {
        return;
    }
    static REAPER: std::sync::OnceLock<std::sync::mpsc::Sender<Vec<Slot>>> =
        std::sync::OnceLock::new();
    let reaper = REAPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<Slot>>();
        std::thread::Builder::new()
            .name("loomem-reaper".into())
            .spawn(move || {
                for victims in rx {
                    for slot in victims {
                        free_gradually(slot);
                    }
                }
            })
            .expect("a thread to free evicted streams");
        tx
    });
    let bytes: usize = victims
        .iter()
        .map(|slot| match slot {
            Slot::Ready { bytes, .. } => *bytes,
            _ => 0,
        })
        .sum();
    REAPING.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    if let Err(unsent) = reaper.send(victims) {
        REAPING.fetch_sub(bytes, std::sync::atomic::Ordering::Relaxed);
        drop(unsent.0);
    }
}

/// Bytes of let-go streams not freed yet.
static REAPING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The reaper frees this many entries between pauses...
const REAP_STEP: usize = 512;
/// ... of this long (about a fifth of its time freeing)...
const REAP_PAUSE: std::time::Duration = std::time::Duration::from_micros(500);
/// ... while less than this waits to be freed (the default budget: a stream
/// that large let go at once is freed at the same pace, the index's memory
/// at most twice its budget meanwhile); past it, without pauses.
const REAP_PACED_BELOW: usize = DEFAULT_BUDGET;

/// Frees one let-go stream's index, [`REAP_STEP`] entries at a time. An
/// index a search still holds is freed by that search when it ends.
fn free_gradually(slot: Slot) {
    let Slot::Ready { index, bytes, .. } = slot else {
        return;
    };
    if let Ok(lock) = Arc::try_unwrap(index) {
        let index = lock
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut freed = 0usize;
        index.free_with(&mut || {
            freed += 1;
            if freed.is_multiple_of(REAP_STEP)
                && REAPING.load(std::sync::atomic::Ordering::Relaxed) < REAP_PACED_BELOW
            {
                std::thread::sleep(REAP_PAUSE);
            }
        });
    }
    REAPING.fetch_sub(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// The nearest `k` memories to `query` over several streams' indexes, as
/// (cosine distance, id), nearest first: [`nearest_again_in`] without a
/// second look.
pub(super) fn nearest_in(
    indexes: &[Arc<RwLock<StreamIndex>>],
    query: &[f32],
    conds: &[Cond],
    k: usize,
) -> Vec<(f32, String)> {
    nearest_again_in(indexes, query, conds, k, k, |_| None)
}

/// [`nearest_in`] with a second look: `again` is given the pool's rows,
/// nearest first, as (cosine distance, vector), and the query it returns,
/// if any, re-scores the pool (`1 - v·q / |v|`). The first `keep`, nearest
/// first. The rows are read where they lie, under one hold of the streams'
/// locks: looked up again by id, the pool cost a search more than both its
/// scans.
pub(super) fn nearest_again_in(
    indexes: &[Arc<RwLock<StreamIndex>>],
    query: &[f32],
    conds: &[Cond],
    k: usize,
    keep: usize,
    again: impl FnOnce(&[(f32, &[f32])]) -> Option<Vec<f32>>,
) -> Vec<(f32, String)> {
    let mut q = query.to_vec();
    l2_normalize(&mut q);
    let guards: Vec<_> = indexes
        .iter()
        .map(|ix| ix.read().expect("stream index lock"))
        .collect();
    // (distance, id, stream index, row): a pool row's vector is widened
    // only once the row has made the pool.
    let mut pool: Vec<(f32, &str, usize, usize)> = Vec::new();
    for (g, ix) in guards.iter().zip(0..) {
        pool.extend(
            g.nearest_rows(&q, conds, k)
                .into_iter()
                .map(|c| (c.distance, c.id, ix, c.row)),
        );
    }
    // Nearest first; ties go to the smaller id.
    let order = |a: (f32, &str), b: (f32, &str)| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1));
    pool.sort_by(|a, b| order((a.0, a.1), (b.0, b.1)));
    pool.truncate(k);
    let mut pool: Vec<(f32, &str, Vec<f32>)> = pool
        .into_iter()
        .map(|(d, id, ix, row)| (d, id, guards[ix].row_vector(row)))
        .collect();
    let near: Vec<(f32, &[f32])> = pool.iter().map(|(d, _, v)| (*d, v.as_slice())).collect();
    if let Some(moved) = again(&near) {
        pool.retain_mut(|(distance, _, v)| {
            let norm = dot(v, v).sqrt();
            *distance = 1.0 - dot(v, &moved) / norm;
            norm > 0.0
        });
        pool.sort_by(|a, b| order((a.0, a.1), (b.0, b.1)));
    }
    pool.truncate(keep);
    pool.into_iter()
        .map(|(d, id, _)| (d, id.to_string()))
        .collect()
}

/// The `k` memories of `indexes` meeting `conds` that score best for `query`
/// by BM25, as (score, id), best first; ties go to the smaller id. Term
/// weights count over all the streams searched.
pub(super) fn bm25_in(
    indexes: &[Arc<RwLock<StreamIndex>>],
    query: &str,
    conds: &[Cond],
    k: usize,
) -> Vec<(f32, String)> {
    let terms = super::bm25::query_terms(query);
    if terms.is_empty() || k == 0 {
        return Vec::new();
    }
    let guards: Vec<_> = indexes
        .iter()
        .map(|ix| ix.read().expect("stream index lock"))
        .collect();
    let mut stats = super::bm25::Stats::default();
    let mut df = vec![0u32; terms.len()];
    for ix in &guards {
        let s = ix.text().stats();
        stats.docs += s.docs;
        stats.tokens += s.tokens;
        for (d, t) in df.iter_mut().zip(&terms) {
            *d += ix.text().df(t);
        }
    }
    let mut out = Vec::new();
    for ix in &guards {
        ix.text().score(&terms, &df, stats, conds, k, &mut out);
    }
    out.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    out.truncate(k);
    out
}

#[cfg(test)]
mod tests {
    use super::against_lance::vector;
    use super::*;

    fn chunk(id: &str, stream: &str, v: &[f32]) -> Chunk {
        let mut c = Chunk::new(id.into(), stream.into(), id.into(), 10);
        c.embedding = Some(v.to_vec());
        c
    }

    fn row(c: &Chunk) -> Row {
        Row::new(c.clone(), true)
    }

    /// A load split over two threads (postings on one, rows and vectors on
    /// the other) builds the index row-by-row puts build: the same BM25
    /// scores, nearest rows, filter columns and size, stop words, long
    /// words, accents, repeated words and a replaced row included.
    #[test]
    fn a_load_on_two_threads_builds_what_one_thread_builds() {
        let dim = 8;
        let words = [
            "coffee",
            "Garden",
            "running",
            "runs",
            "the",
            "and",
            "Café",
            "cafe",
            "naïve",
            "doctor's",
            "supercalifragilisticexpialidocious",
            "x",
            "42",
            "Paris",
            "paris",
        ];
        let mut chunks: Vec<Chunk> = (0..SPLIT_LOAD_ROWS as u64 + 300)
            .map(|i| {
                let text: Vec<&str> = (0..2 + i % 7)
                    .map(|j| words[((i * 31 + j * j * 7 + i / 3) % words.len() as u64) as usize])
                    .collect();
                let mut c = chunk(&format!("m{i}"), "a", &vector(i, dim));
                c.content = text.join(" ");
                c.memory_type = ["fact", "preference"][i as usize % 2].into();
                if i % 5 == 0 {
                    c.superseded_by = Some("later".into());
                }
                if i % 11 == 0 {
                    c.embedding = None;
                }
                c
            })
            .collect();
        // The same id twice: the later row wins on both threads.
        let mut again = chunks[7].clone();
        again.content = "coffee garden Paris".into();
        chunks.push(again);
        let mut one = StreamIndex::new(dim);
        for c in &chunks {
            let mut c = c.clone();
            let v = c.embedding.take();
            one.put(Arc::new(c.clone()), Meta::of(&c), v.as_deref());
        }
        // The same rows as a load reads them: one batch.
        let batch = crate::core::model::chunks_to_batch(&chunks, dim).unwrap();
        let mut two = StreamIndex::new(dim);
        two.put_all(&[Loaded::new(&batch).unwrap()], &|_| true)
            .unwrap();
        assert_eq!(one.len(), two.len());
        assert_eq!(one.bytes(), two.bytes());
        // Each row as the batch held it, made a `Chunk` when asked for.
        for c in &chunks {
            let (a, b) = (one.get(&c.id).unwrap(), two.get(&c.id).unwrap());
            assert_eq!(a, b, "{}", c.id);
        }
        let metas = |ix: &StreamIndex| -> Vec<(String, Meta)> {
            let mut m: Vec<_> = ix
                .text()
                .metas()
                .map(|(id, m)| (id.to_string(), m.clone()))
                .collect();
            m.sort_by(|a, b| a.0.cmp(&b.0));
            m
        };
        assert_eq!(metas(&one), metas(&two));
        let (one, two) = ([Arc::new(RwLock::new(one))], [Arc::new(RwLock::new(two))]);
        let current = [Cond::Current];
        for conds in [&[][..], &current[..]] {
            for q in [
                "coffee",
                "garden runs",
                "cafe naive paris",
                "supercalifragilisticexpialidocious 42",
                "the",
            ] {
                let found = bm25_in(&one, q, conds, 50);
                assert_eq!(found, bm25_in(&two, q, conds, 50), "{q}");
                assert!(q == "the" || !found.is_empty(), "{q}");
            }
            for seed in 1000..1010 {
                let q = vector(seed, dim);
                assert_eq!(
                    nearest_in(&one, &q, conds, 20),
                    nearest_in(&two, &q, conds, 20)
                );
            }
        }
    }

    /// Over the budget, a large stream goes before small ones used earlier
    /// (any stream may be searched next, and the bytes of one large stream
    /// spare the loads of many small ones); small streams left unused go in
    /// their turn.
    #[test]
    fn the_budget_evicts_what_holds_least_per_byte_first() {
        let dim = 2;
        let index = |s: &str, rows: usize| {
            let mut ix = StreamIndex::new(dim);
            for i in 0..rows {
                ix.apply(row(&chunk(&format!("{s}-{i}"), s, &[1.0, i as f32])));
            }
            ix
        };
        let (big, small) = (index("big", 3000).bytes(), index("a", 10).bytes());
        // Room for the large stream and three small ones.
        let hot = Arc::new(HotIndex::new(dim, big + 3 * small + small / 2));
        let load = |s: &str, rows: usize| {
            let Lookup::Load(g) = hot.lookup(s) else {
                panic!("{s} is loaded already")
            };
            assert!(g.finish(index(s, rows)).is_some());
        };
        for s in ["a", "b", "c"] {
            load(s, 10);
        }
        load("big", 3000);
        assert_eq!(hot.loaded(), 4);
        load("d", 10);
        assert!(hot.ready("big").is_none(), "the large stream went");
        for s in ["a", "b", "c", "d"] {
            assert!(hot.ready(s).is_some(), "{s} stays");
        }
        // New small streams push out the unused ones in the end (here once
        // the budget is full of them: about 300).
        let passed = (0..1000)
            .position(|i| {
                load(&format!("s{i}"), 10);
                hot.ready("a").is_none()
            })
            .expect("an unused small stream goes in the end");
        assert!(passed > 250, "{passed}");
        assert!(hot.used() <= hot.budget());
    }

    #[test]
    fn nearest_is_exact_filtered_and_follows_replacements_and_removals() {
        let mut ix = StreamIndex::new(2);
        for (id, v) in [
            ("a", [1.0, 0.0]),
            ("b", [0.0, 1.0]),
            ("c", [1.0, 1.0]),
            ("d", [-1.0, 0.0]),
        ] {
            ix.apply(row(&chunk(id, "s", &v)));
        }
        let near = |ix: &StreamIndex, conds: &[Cond], k| {
            let mut out = Vec::new();
            ix.nearest(&[1.0, 0.0], conds, k, &mut out);
            out.into_iter().map(|(_, id)| id).collect::<Vec<_>>()
        };
        assert_eq!(near(&ix, &[], 3), ["a", "c", "b"]);
        // Superseded rows fall out of `current` reads.
        let mut old = chunk("a", "s", &[1.0, 0.0]);
        old.superseded_by = Some("c".into());
        ix.apply(row(&old));
        assert_eq!(near(&ix, &[Cond::Current], 2), ["c", "b"]);
        assert_eq!(near(&ix, &[], 1), ["a"]);
        // A new vector replaces the old one in place.
        ix.apply(row(&chunk("d", "s", &[2.0, 0.1])));
        assert_eq!(near(&ix, &[Cond::Current], 1), ["d"]);
        // Hashes of current memories only: `a` is superseded.
        let hash = |id: &str| chunk(id, "s", &[0.0, 0.0]).content_hash;
        assert_eq!(ix.current_with_hash(&hash("c")), [Id::from("c")]);
        assert!(ix.current_with_hash(&hash("a")).is_empty());
        // A memory that loses its vector leaves the matrix (the last row
        // moves into the hole) but is still known by its hash.
        ix.apply(Row::new(old.clone(), false));
        assert_eq!(ix.len(), 3);
        assert_eq!(near(&ix, &[], 4), ["d", "c", "b"]);
        ix.apply(Row::new(chunk("d", "s", &[0.0, 0.0]), false));
        assert_eq!(near(&ix, &[], 4), ["c", "b"]);
        assert_eq!(ix.current_with_hash(&hash("d")), [Id::from("d")]);
        let mut out = Vec::new();
        ix.nearest(&[1.0, 0.0], &[], 1, &mut out);
        // Re-scored from f16: within its rounding (2^-11 of a unit product).
        assert!((out[0].0 - (1.0 - std::f32::consts::FRAC_1_SQRT_2)).abs() < 1e-3);
    }

    #[test]
    fn a_large_stream_scanned_in_parts_finds_what_one_pass_finds() {
        let dim = 4;
        let mut ix = StreamIndex::new(dim);
        let mut x = 7u64;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let n = PARALLEL_ROWS + 5_000;
        for i in 0..n {
            let v: Vec<f32> = (0..dim).map(|_| next()).collect();
            let mut c = chunk(&format!("r{i}"), "s", &v);
            c.superseded_by = (i % 5 == 0).then(|| "x".to_string());
            ix.apply(row(&c));
        }
        let q = [0.3, -0.2, 0.9, 0.1];
        let mut parallel = Vec::new();
        ix.nearest(&q, &[Cond::Current], 25, &mut parallel);
        let mut one = ix.top_k(&Query::new(&q), &[Cond::Current], 25, 0..n);
        one.sort();
        one.truncate(25);
        let one: Vec<(f32, String)> = one
            .into_iter()
            .map(|c| (c.distance, c.id.to_string()))
            .collect();
        assert_eq!(parallel, one);
        assert_eq!(parallel.len(), 25);
    }

    /// The int8 scan with its f16 rerank against a plain f32 scan, on
    /// random 384-d vectors: the hardest case for quantisation, as their
    /// cosines crowd together (MiniLM's spread much further apart).
    #[test]
    fn the_int8_scan_keeps_the_exact_scans_top_10() {
        let dim = 384;
        let mut ix = StreamIndex::new(dim);
        let mut all = Vec::new();
        for i in 0..20_000 {
            let mut v = vector(i, dim);
            l2_normalize(&mut v);
            ix.apply(row(&chunk(&format!("r{i}"), "s", &v)));
            all.push(v);
        }
        let (mut kept, mut asked) = (0, 0);
        for j in 0..50 {
            let mut q = vector(1_000_000 + j, dim);
            l2_normalize(&mut q);
            let mut exact: Vec<(f32, usize)> = all
                .iter()
                .enumerate()
                .map(|(i, v)| (1.0 - dot(&q, v), i))
                .collect();
            exact.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut out = Vec::new();
            ix.nearest(&q, &[], 10, &mut out);
            assert_eq!(out.len(), 10);
            for (_, i) in &exact[..10] {
                asked += 1;
                kept += usize::from(out.iter().any(|(_, id)| *id == format!("r{i}")));
            }
            // Scores are the f16 re-score's, within its rounding of the
            // exact ones (at most 2^-11 for unit vectors), not the int8
            // scan's approximations (tens of times further off).
            let (d, id) = &out[0];
            let i: usize = id[1..].parse().unwrap();
            assert!((*d - (1.0 - dot(&q, &all[i]))).abs() < 5e-4);
        }
        let recall = kept as f64 / asked as f64;
        assert!(recall >= 0.98, "recall@10 against the exact scan: {recall}");
    }

    #[test]
    fn filters_match_the_lance_predicates() {
        let mut c = chunk("x", "s", &[1.0, 0.0]);
        c.expires_at = Some(100);
        c.valid_from = Some(5);
        c.valid_until = Some(50);
        c.memory_type = "preference".into();
        c.subject = Some("Alice".into());
        c.confidence = 0.5;
        let m = Meta::of(&c);
        assert!(m.meets(&[
            Cond::Unexpired(99),
            Cond::ValidAt(5),
            Cond::CreatedSince(10)
        ]));
        assert!(!m.meets(&[Cond::Unexpired(100)]));
        assert!(!m.meets(&[Cond::ValidAt(50)]));
        assert!(!m.meets(&[Cond::ValidAt(4)]));
        assert!(m.meets(&[Cond::CreatedUntil(10)]) && !m.meets(&[Cond::CreatedBefore(10)]));
        assert!(m.meets(&[
            Cond::Subject("alice".into()),
            Cond::MemoryType("preference".into())
        ]));
        assert!(!m.meets(&[Cond::MinConfidence(0.6)]));
        assert!(!m.meets(&[Cond::Opaque]));
    }

    #[test]
    fn loads_see_commits_made_meanwhile_deletes_poison_them_and_the_budget_evicts() {
        let dim = 2;
        let one = {
            let mut ix = StreamIndex::new(dim);
            ix.apply(row(&chunk("late", "s", &[0.0, 1.0])));
            ix.bytes()
        };
        let hot = Arc::new(HotIndex::new(dim, 3 * one));
        let Lookup::Load(guard) = hot.lookup("s") else {
            panic!("first lookup loads")
        };
        let Lookup::Wait(waiting) = hot.lookup("s") else {
            panic!("one loader at a time, the others wait")
        };
        assert!(
            waiting.has_changed().is_ok(),
            "the wait lasts while the load does"
        );
        // A commit while the load runs reaches the index it installs.
        hot.apply([chunk("late", "s", &[0.0, 1.0])]);
        let index = guard.finish(StreamIndex::new(dim)).expect("installed");
        assert_eq!(index.read().unwrap().len(), 1);
        assert!(
            waiting.has_changed().is_err(),
            "an installed load ends the wait"
        );
        // Later commits apply in place.
        hot.apply([chunk("b", "s", &[1.0, 0.0])]);
        assert!(matches!(hot.lookup("s"), Lookup::Ready(ix) if ix.read().unwrap().len() == 2));
        // A delete during a load poisons it.
        let Lookup::Load(guard) = hot.lookup("t") else {
            panic!()
        };
        hot.invalidate(Some(&["t".to_string()]));
        assert!(guard.finish(StreamIndex::new(dim)).is_none());
        assert_eq!(hot.loaded(), 1, "another stream's delete leaves `s` loaded");
        hot.invalidate(None);
        assert_eq!(hot.loaded(), 0);
        // A dropped load frees the slot.
        let Lookup::Load(g) = hot.lookup("u") else {
            panic!()
        };
        let Lookup::Wait(waiting) = hot.lookup("u") else {
            panic!()
        };
        drop(g);
        assert!(
            waiting.has_changed().is_err(),
            "an abandoned load ends the wait"
        );
        assert!(matches!(hot.lookup("u"), Lookup::Load(_)));
        // Two streams of two rows do not fit three rows: the older goes.
        for s in ["v", "w"] {
            let Lookup::Load(g) = hot.lookup(s) else {
                panic!()
            };
            let mut ix = StreamIndex::new(dim);
            ix.apply(row(&chunk("1", s, &[1.0, 0.0])));
            ix.apply(row(&chunk("2", s, &[0.0, 1.0])));
            assert!(g.finish(ix).is_some());
        }
        assert_eq!(hot.loaded(), 1);
        assert!(matches!(hot.lookup("w"), Lookup::Ready(_)));
        assert!(hot.used() <= hot.budget());
        // A stream over the whole budget is left to Lance.
        let Lookup::Load(g) = hot.lookup("big") else {
            panic!()
        };
        let mut ix = StreamIndex::new(dim);
        for i in 0..4 {
            ix.apply(row(&chunk(&i.to_string(), "big", &[1.0, 0.0])));
        }
        assert!(g.finish(ix).is_none());
        assert!(matches!(hot.lookup("big"), Lookup::Skip));
    }
}

#[cfg(test)]
mod against_lance {
    use crate::core::model::Chunk;
    use crate::store::hot::{row_bytes, Lookup};
    use crate::store::{Filter, Store};

    /// A deterministic unit-ish vector per seed.
    pub(super) fn vector(seed: u64, dim: usize) -> Vec<f32> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..dim)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
            })
            .collect()
    }

    fn memory(i: u64, stream: &str, dim: usize) -> Chunk {
        let mut c = Chunk::new(
            format!("m{i}"),
            stream.into(),
            format!("memory {i}"),
            i as i64 * 10,
        );
        c.embedding = Some(vector(i, dim));
        c.embed_model = Some("m".into());
        c.memory_type = if i % 3 == 0 { "preference" } else { "fact" }.into();
        c.entities = vec![format!("e{}", i % 5)];
        c
    }

    /// The hot answer and Lance's agree (same ids in the same order) for
    /// each filter, after every kind of write.
    async fn agree(store: &Store, filters: &[Filter], round: &str) {
        // Exact duplicates: the current memories with these texts, vector or not.
        let hashes: Vec<String> = (0..40)
            .map(|i| memory(i, "a", store.dim()).content_hash)
            .collect();
        let mut hot: Vec<String> = store
            .current_with_hashes("a", &hashes)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        let mut lance: Vec<String> = store
            .find(
                &Filter::new().stream("a").current().content_hash_in(&hashes),
                None,
            )
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        hot.sort();
        lance.sort();
        assert_eq!(hot, lance, "{round}: duplicates by hash");
        if round != "loaded" {
            assert!(
                hot.contains(&"m8".to_string()),
                "{round}: found without a vector of the model"
            );
        }
        // Reads of whole rows, with conditions on their text and entities.
        let row_filters = [
            Filter::new()
                .stream("a")
                .current()
                .content_contains("memory 1"),
            Filter::new().stream("a").mentions_key("e2"),
            Filter::new().stream("b").with(
                Filter::new()
                    .mentions_key("e1")
                    .or(Filter::new().content_contains("memory 3").current()),
            ),
        ];
        for filter in &row_filters {
            assert!(filter.row_conds().is_some(), "{filter} is typed");
            assert!(filter.conds().is_none(), "{filter} needs the row");
        }
        for (f, filter) in row_filters.iter().chain(filters).enumerate() {
            let ids = |rows: Vec<Chunk>| {
                let mut ids: Vec<(i64, String)> =
                    rows.into_iter().map(|c| (c.created_at, c.id)).collect();
                ids.sort();
                ids
            };
            let hot = ids(store.find_rows(filter, None).await.unwrap());
            let lance = ids(super::super::read_rows(&store.chunks, filter, None)
                .await
                .unwrap());
            assert_eq!(hot, lance, "{round}: rows of filter {f}");
            assert!(
                f >= row_filters.len() || lance.len() > 3,
                "{round}: filter {f} finds rows"
            );
            let first = ids(store.find_rows(filter, Some(3)).await.unwrap());
            assert_eq!(
                first,
                lance[..lance.len().min(3)],
                "{round}: first rows of filter {f}"
            );
            let lance_count = super::super::count_where(&store.chunks, filter)
                .await
                .unwrap();
            assert_eq!(
                store.count(filter).await.unwrap(),
                lance_count,
                "{round}: count of filter {f}"
            );
        }
        for (f, filter) in filters.iter().enumerate() {
            for q in 0..5u64 {
                let v = vector(1000 + q, store.dim());
                let hot = store.search_vector(None, &v, filter, 7).await.unwrap();
                let lance = store
                    .search_vector_lance(None, &v, filter, 7)
                    .await
                    .unwrap();
                let ids =
                    |x: &[crate::store::Scored]| x.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
                assert_eq!(ids(&hot), ids(&lance), "{round}: filter {f}, query {q}");
                for (h, l) in hot.iter().zip(&lance) {
                    assert!(
                        (h.score - l.score).abs() < 1e-3,
                        "{round}: distances {} vs {}",
                        h.score,
                        l.score
                    );
                }
                // The vectors of the hits, as a search's feedback reads them.
                let mut named = ids(&hot);
                named.push("no-such-memory".into());
                let from_hot = store.vectors_of(None, filter, &named).await.unwrap();
                let from_lance = store
                    .vectors_of(Some(&store.chunks), filter, &named)
                    .await
                    .unwrap();
                assert_eq!(from_hot.len(), hot.len(), "{round}: one vector a hit");
                assert_eq!(from_hot.len(), from_lance.len());
                for (id, h) in &from_hot {
                    let mut l = from_lance[id].clone();
                    crate::core::vector::l2_normalize(&mut l);
                    // Kept in f16: within its rounding.
                    assert!(h
                        .iter()
                        .zip(&l)
                        .all(|(a, b)| (a - b).abs() <= b.abs() / 1024.0 + 1e-6));
                }
                // The second look in one pass gives what the pool, its first
                // vectors read by id and the pool re-scored by id give.
                let moved = |near: &[&[f32]]| {
                    let mut m = v.clone();
                    for n in near {
                        m.iter_mut().zip(*n).for_each(|(a, b)| *a += b);
                    }
                    crate::core::vector::l2_normalize(&mut m);
                    m
                };
                let pool = store.search_vector(None, &v, filter, 12).await.unwrap();
                let first = ids(&pool[..pool.len().min(3)]);
                let near = store.vectors_of(None, filter, &first).await.unwrap();
                let near: Vec<&[f32]> = first.iter().map(|id| near[id].as_slice()).collect();
                let mut by_id = store
                    .distances(None, filter, ids(&pool), &moved(&near))
                    .await
                    .unwrap();
                by_id.sort_by(|a, b| a.score.total_cmp(&b.score).then_with(|| a.id.cmp(&b.id)));
                by_id.truncate(7);
                let again = |near: &[(f32, &[f32])]| {
                    let first: Vec<&[f32]> = near.iter().take(3).map(|&(_, v)| v).collect();
                    Some(moved(&first))
                };
                let one_pass = store
                    .nearest_again(None, &v, filter, 12, 7, again)
                    .await
                    .unwrap()
                    .expect("the hot index holds the stream");
                assert_eq!(
                    one_pass, by_id,
                    "{round}: filter {f}, query {q}, second look"
                );
                assert!(one_pass.len() == 7 || pool.len() < 7, "{round}: filter {f}");
                // Without a second query the pool stays as the first look left it.
                let kept = store
                    .nearest_again(None, &v, filter, 12, 7, |_| None)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(
                    kept,
                    pool[..pool.len().min(7)],
                    "{round}: filter {f}, query {q}"
                );
            }
        }
    }

    /// In one stream that is the whole table, with its FTS index built, the
    /// hot BM25 leg ranks and scores as Lance's does: the same tokens, the
    /// same formula, the same corpus.
    #[tokio::test]
    async fn hot_bm25_matches_lance_full_text_search() {
        let dim = 4;
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), dim, 1000).await.unwrap();
        let words = [
            "coffee", "garden", "running", "Paris", "meeting", "doctor", "dentist", "piano",
            "hiking", "budget", "the", "and", "sister", "recipes", "cooking", "tomatoes",
        ];
        let chunks: Vec<Chunk> = (0..150u64)
            .map(|i| {
                let n = 3 + (i % 9) as usize;
                let text: Vec<&str> = (0..n)
                    .map(|j| {
                        words[((i * 7 + j as u64 * j as u64 * 3 + i / 5) % words.len() as u64)
                            as usize]
                    })
                    .collect();
                let mut c = Chunk::new(format!("t{i}"), "a".into(), text.join(" "), i as i64);
                c.embedding = Some(vector(i, dim));
                c
            })
            .collect();
        // Written in three parts, the routine refreshes leave the full-text
        // index in segments (Lance scores across them); then merged into one.
        for part in chunks.chunks(50) {
            store.upsert(part.to_vec()).await.unwrap();
            crate::store::maintain::refresh_indexes_routinely(
                store.chunks_table(),
                crate::store::maintain::RefreshScope::Everything,
            )
            .await
            .unwrap();
        }
        let table = store.chunks_table();
        let fts = table.list_indices().await.unwrap();
        let fts = fts.iter().find(|i| i.columns == ["content"]).unwrap();
        let segments = |name: String| async move {
            let s = table.index_stats(&name).await.unwrap().unwrap();
            s.num_indices.unwrap_or(1)
        };
        assert!(
            segments(fts.name.clone()).await >= 2,
            "the index is in segments"
        );
        let filter = Filter::new().stream("a");
        for (merged, query) in [false, true].into_iter().flat_map(|m| {
            [
                "coffee",
                "garden cooking",
                "Paris dentist piano",
                "the runs",
                "sisters' recipes",
            ]
            .map(|q| (m, q))
        }) {
            if merged && query == "coffee" {
                crate::store::maintain::refresh_indexes(table)
                    .await
                    .unwrap();
                assert_eq!(segments(fts.name.clone()).await, 1);
            }
            let hot = store.search_text(None, query, &filter, 20).await.unwrap();
            let lance = store
                .search_text_lance(None, query, &filter, 20)
                .await
                .unwrap();
            assert!(!hot.is_empty(), "{query}");
            assert_eq!(hot.len(), lance.len(), "{query}");
            for (h, l) in hot.iter().zip(&lance) {
                assert!(
                    (h.score - l.score).abs() < 1e-3 * l.score.abs().max(1.0),
                    "{query}: {h:?} vs {l:?}"
                );
            }
            // Ties may fall either way (at the cut-off too); above the
            // lowest score kept, the same memories.
            let ids = |x: &[crate::store::Scored]| {
                let last = x.last().map_or(0, |s| (s.score * 1e3).round() as i64);
                let mut v: Vec<(i64, String)> = x
                    .iter()
                    .map(|s| ((s.score * 1e3).round() as i64, s.id.clone()))
                    .filter(|(score, _)| *score > last)
                    .collect();
                v.sort();
                v
            };
            assert_eq!(ids(&hot), ids(&lance), "{query}");
            assert!(
                ids(&hot).len() >= hot.len() / 2,
                "{query}: too many ties to tell"
            );
        }
        assert_eq!(store.hot_usage().1, 1, "the stream is in memory");
    }

    /// A stream past the budget stops its read at the first batch over it,
    /// is answered from Lance and is not read again; a small one is held.
    #[tokio::test]
    async fn a_stream_past_the_budget_is_answered_from_lance_and_not_read_again() {
        let dim = 16;
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), dim, 5000)
            .await
            .unwrap()
            .for_model("m")
            .with_hot_budget(100 * row_bytes(dim));
        let mut rows: Vec<Chunk> = (0..2500).map(|i| memory(i, "big", dim)).collect();
        rows.extend((2500..2510).map(|i| memory(i, "small", dim)));
        store.upsert(rows).await.unwrap();
        let found = |stream: &'static str, i: u64| {
            let store = &store;
            async move {
                let hashes = [memory(i, stream, dim).content_hash];
                let rows = store.current_with_hashes(stream, &hashes).await.unwrap();
                rows.into_iter().map(|c| c.id).collect::<Vec<_>>()
            }
        };
        assert_eq!(found("big", 7).await, ["m7"]);
        assert_eq!(store.hot_usage().1, 0, "the big stream is not held");
        assert!(
            matches!(store.hot.lookup("big"), Lookup::Skip),
            "nor read again"
        );
        assert_eq!(found("small", 2505).await, ["m2505"]);
        assert_eq!(store.hot_usage().1, 1, "the small stream is held");
    }

    #[tokio::test]
    async fn hot_reads_match_lance_through_writes_supersessions_and_deletes() {
        let dim = 16;
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), dim, 1000)
            .await
            .unwrap()
            .for_model("m");
        store
            .upsert(
                (0..120)
                    .map(|i| memory(i, if i % 2 == 0 { "a" } else { "b" }, dim))
                    .collect(),
            )
            .await
            .unwrap();
        let filters = [
            Filter::new().stream("a").current().unexpired(500),
            Filter::new().in_streams(&["a", "b"]).current(),
            Filter::new()
                .stream("b")
                .memory_type("preference")
                .created_since(300),
            Filter::new().stream("a").current().valid_at(100),
        ];
        agree(&store, &filters, "loaded").await;
        assert_eq!(store.hot_usage().1, 2, "both streams are in memory");
        // The loaded rows hold no data file's bytes: with the files closed,
        // none stays mapped, and the rows read as before.
        assert_eq!(store.stream_reads.mapped_after_closing(), 0);
        agree(&store, &filters, "files closed").await;
        assert_eq!(store.hot_usage().1, 2, "still in memory");
        // New memories, a supersession, a new vector, an expiry, another model.
        let mut writes: Vec<Chunk> = (120..160).map(|i| memory(i, "a", dim)).collect();
        let mut old = memory(2, "a", dim);
        old.superseded_by = Some("m120".into());
        let mut moved = memory(4, "a", dim);
        moved.embedding = Some(vector(1001, dim));
        let mut expiring = memory(6, "a", dim);
        expiring.expires_at = Some(100);
        let mut other_model = memory(8, "a", dim);
        other_model.embed_model = Some("other".into());
        let mut bounded = memory(10, "a", dim);
        bounded.valid_from = Some(200);
        writes.extend([old, moved, expiring, other_model, bounded]);
        store.upsert(writes).await.unwrap();
        agree(&store, &filters, "after upserts").await;
        // Changes through the writer's modify path.
        store
            .modify(
                vec!["m12".into(), "m13".into()],
                Box::new(|c| {
                    c.superseded_by = Some("x".into());
                    true
                }),
            )
            .await
            .unwrap();
        agree(&store, &filters, "after modify").await;
        // A batch's side effects write their lifecycle columns alone: the
        // held rows change those fields and keep their text and vectors.
        let mut gone = memory(20, "a", dim);
        gone.superseded_by = Some("m121".into());
        gone.valid_until = Some(150);
        gone.updated_at = 900;
        gone.annotate("merged_sources", serde_json::json!(["x"]));
        let mut preference = memory(33, "b", dim);
        preference.superseded_by = Some("m121".into());
        store
            .commit_with_side_effects(vec![], vec![gone, preference])
            .await
            .unwrap();
        agree(&store, &filters, "after side effects").await;
        for (id, stream) in [("m20", "a"), ("m33", "b")] {
            let text = format!("memory {}", &id[1..]);
            let held = store
                .find_rows(&Filter::new().stream(stream).content_contains(&text), None)
                .await
                .unwrap()
                .into_iter()
                .find(|c| c.id == id)
                .unwrap();
            let stored = store.get(id).await.unwrap().unwrap();
            assert_eq!(held.superseded_by.as_deref(), Some("m121"), "{id}");
            assert_eq!(
                (&held.valid_until, held.updated_at, &held.extraction_meta),
                (
                    &stored.valid_until,
                    stored.updated_at,
                    &stored.extraction_meta
                ),
                "{id}"
            );
            assert_eq!(
                (&held.content, &held.entities),
                (&stored.content, &stored.entities)
            );
            assert_eq!(
                stored.embedding,
                memory(id[1..].parse().unwrap(), stream, dim).embedding
            );
        }
        let stored = store.get("m20").await.unwrap().unwrap();
        assert_eq!((stored.valid_until, stored.updated_at), (Some(150), 900));
        assert!(stored.extraction_meta.unwrap().contains("merged_sources"));
        // The superseded memory's vector is still searched where asked for.
        let v = vector(33, dim);
        let near = store
            .search_vector(None, &v, &Filter::new().stream("b"), 1)
            .await
            .unwrap();
        assert_eq!(near[0].id, "m33");
        // A delete drops the streams it touched; the next read loads them again.
        store
            .delete(&Filter::new().stream("a").created_since(1000))
            .await
            .unwrap();
        assert_eq!(store.hot_usage().1, 1, "b stays loaded");
        agree(&store, &filters, "after delete").await;
        // Neighbours for the pipeline come from the same index.
        let v = vector(1002, dim);
        let near = store.nearest_many("a", &[&v], 3).await.unwrap();
        let lance = store
            .search_vector_lance(None, &v, &Filter::new().stream("a").current(), 3)
            .await
            .unwrap();
        let ids: Vec<String> = near[0].iter().map(|n| n.id.clone()).collect();
        assert_eq!(ids, lance.iter().map(|s| s.id.clone()).collect::<Vec<_>>());
        // An opaque condition goes to Lance (and still answers).
        let opaque = Filter::new().stream("a").session("none");
        assert!(store
            .search_vector(None, &v, &opaque, 3)
            .await
            .unwrap()
            .is_empty());
    }
}
