//! LanceDB storage: opens or creates the tables, funnels every write to a table
//! through one batching writer task, and serves the reads the engine needs.

pub mod api_keys;
mod bm25;
mod claims;
pub mod config;
pub mod dead_letters;
pub mod feedback;
pub mod filter;
pub mod graph;
pub mod graph_metrics;
pub mod history;
pub mod hot;
pub mod job_runs;
pub mod llm_calls;
pub mod location;
pub mod maintain;
mod mapped;
mod moving;
pub mod oauth;
mod ordered_merge;
pub mod relations;
mod stream_read;
mod writer;

pub use location::Location;
pub use writer::{Modifier, Refusal, WriteBatch};

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Float32Array, RecordBatch, RecordBatchIterator};
use futures::TryStreamExt;
use lancedb::index::scalar::{FtsIndexBuilder, FullTextSearchQuery};
use lancedb::index::Index;
use lancedb::query::{ExecutableQuery, QueryBase, Select};
use lancedb::{Connection, DistanceType, Table};

use crate::core::model::{
    batch_to_chunks, chunk_schema, chunks_to_batch, dead_letter_schema, Chunk, ModelError,
};

pub use filter::Filter;
pub use history::{history_schema, HistoryRow};
pub use job_runs::job_run_schema;
pub use writer::ChunkWriter;

use filter::sql_str;

pub const CHUNKS: &str = "chunks";
/// A load puts a stream's rows into the hot index this many at a time, or
/// fewer at its end (Lance's batch size).
const LOAD_GROUP_ROWS: usize = 8192;

/// Where a hot load's time went beside Lance's read (its debug line).
#[derive(Default)]
struct LoadTimes {
    /// The rows read out of Lance's batches.
    read_out: Duration,
    /// The rows filed into the index.
    filed: Duration,
}

/// The column the chunk table's ordered merges sort its rows by: a stream's
/// rows together ([`maintain::merge_fragments_in_tiers`]).
pub const CHUNK_ORDER: &str = "stream";
pub const DEAD_LETTERS: &str = "dead_letters";
pub const ENTITIES: &str = "entities";
pub const EDGES: &str = "edges";
pub const HISTORY: &str = "history";
pub const LLM_CALLS: &str = "llm_calls";
pub const FEEDBACK: &str = "feedback";
pub const JOB_RUNS: &str = "job_runs";
pub const RELATIONS: &str = "relations";
pub const GRAPH_METRICS: &str = "graph_metrics";

async fn open_or_create(
    db: &Connection,
    existing: &[String],
    name: &str,
    schema: arrow_schema::SchemaRef,
) -> Result<Table> {
    if existing.iter().any(|n| n == name) {
        return Ok(db.open_table(name).execute().await?);
    }
    match db
        .create_empty_table(name, location::encoded(&schema))
        .execute()
        .await
    {
        Ok(table) => Ok(table),
        // Another process sharing the location made it first.
        Err(created) => db
            .open_table(name)
            .execute()
            .await
            .map_err(|_| created.into()),
    }
}

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
    /// A write would have overwritten these memories of other streams, or
    /// immutable ones; nothing was written.
    #[error("{} memories may not be overwritten", .0.owners.len())]
    Refused(Box<writer::Refusal>),
    #[error("entity graph: {0}")]
    Graph(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A chunk found by a search leg, with that leg's raw score (BM25 score or cosine distance).
#[derive(Debug, Clone)]
pub struct Hit {
    pub chunk: Chunk,
    pub score: f32,
}

/// A stored memory close to a query vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighbor {
    pub id: String,
    pub similarity: f32,
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
    history: Table,
    llm_calls: Table,
    pub graph: crate::store::graph::Graph,
    pub feedback: feedback::FeedbackBook,
    job_runs: Table,
    relations: Table,
    graph_metrics: Table,
    /// Per stream, how many commits changed its memories (caches key on it).
    generations: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Per stream, when a commit last changed its memories (this process).
    written_at: std::sync::Mutex<std::collections::HashMap<String, tokio::time::Instant>>,
    /// Bumped by deletes, whose streams are not known up front.
    delete_generation: std::sync::atomic::AtomicU64,
    dim: usize,
    writer: ChunkWriter,
    /// Vector reads consider only embeddings this model made (None = any).
    embed_model: Option<String>,
    /// The streams' vectors in memory, kept in step by the writer.
    hot: std::sync::Arc<hot::HotIndex>,
    /// The chunk table's fragments open for the hot index's loads.
    stream_reads: stream_read::StreamReads,
    /// The pipeline worker holds it shared while it processes a batch; a
    /// snapshot rollback holds it exclusively, so no batch lands mid-restore.
    pub write_gate: tokio::sync::RwLock<()>,
    /// Every single write to a table a snapshot covers (the chunk writer's
    /// operations, history, feedback, the graph) holds it shared for that
    /// write alone; a rollback holds it exclusively (see [`Store::hold_writes`]).
    table_gate: TableGate,
    /// Merges the small fragments of every table but `chunks` (its writer does).
    _maintainer: maintain::AbortOnDrop,
    /// Set while the vector index is built; the writer's merges wait.
    vector_build: maintain::VectorBuild,
    /// The routine maintenance the store was opened with.
    maintenance: maintain::Maintenance,
}

/// Shared by every writer of the tables a snapshot covers; a write holds it
/// shared for one operation, never while waiting for another write.
pub type TableGate = std::sync::Arc<tokio::sync::RwLock<()>>;

impl Store {
    /// Open the tables under `data_dir`, creating them (and their indexes) on first start.
    pub async fn open(data_dir: &Path, dim: usize, write_batch_max_rows: usize) -> Result<Store> {
        Store::open_shared(data_dir, dim, write_batch_max_rows, None).await
    }

    /// [`Store::open`] for a data directory other processes write too: reads see
    /// their commits within `read_consistency` (zero = every read checks).
    pub async fn open_shared(
        data_dir: &Path,
        dim: usize,
        write_batch_max_rows: usize,
        read_consistency: Option<std::time::Duration>,
    ) -> Result<Store> {
        Store::open_with(
            &Location::local(data_dir),
            dim,
            write_batch_max_rows,
            read_consistency,
            maintain::Maintenance::default(),
        )
        .await
    }

    /// [`Store::open_shared`] at any [`Location`] (a directory or a bucket),
    /// with the given routine maintenance.
    pub async fn open_with(
        location: &Location,
        dim: usize,
        write_batch_max_rows: usize,
        read_consistency: Option<std::time::Duration>,
        maintenance: maintain::Maintenance,
    ) -> Result<Store> {
        let db = location.connect(read_consistency).await?;
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
            db.create_empty_table(CHUNKS, location::encoded(&chunk_schema(dim)))
                .execute()
                .await?
        };
        ensure_indexes(&chunks).await?;
        let dead_letters = open_or_create(&db, &names, DEAD_LETTERS, dead_letter_schema()).await?;
        let history = open_or_create(&db, &names, HISTORY, history_schema()).await?;
        let llm_calls = open_or_create(&db, &names, LLM_CALLS, llm_calls::call_schema()).await?;
        let table_gate = TableGate::default();
        let graph = crate::store::graph::Graph::open(
            open_or_create(&db, &names, ENTITIES, crate::store::graph::entity_schema()).await?,
            open_or_create(&db, &names, EDGES, crate::store::graph::edge_schema()).await?,
            table_gate.clone(),
        )
        .await?;
        let feedback = feedback::FeedbackBook::open(
            open_or_create(&db, &names, FEEDBACK, feedback::schema()).await?,
            table_gate.clone(),
        )
        .await?;
        let job_runs = open_or_create(&db, &names, JOB_RUNS, job_run_schema()).await?;
        let relations =
            open_or_create(&db, &names, RELATIONS, relations::relation_schema()).await?;
        let graph_metrics =
            open_or_create(&db, &names, GRAPH_METRICS, graph_metrics::metric_schema()).await?;
        let hot = std::sync::Arc::new(hot::HotIndex::new(dim, hot::DEFAULT_BUDGET));
        let vector_build = maintain::VectorBuild::default();
        let writer = ChunkWriter::spawn(
            chunks.clone(),
            history.clone(),
            dim,
            write_batch_max_rows,
            maintenance,
            hot.clone(),
            table_gate.clone(),
            vector_build.clone(),
        );
        let side_tables = vec![
            (DEAD_LETTERS, dead_letters.clone()),
            (HISTORY, history.clone()),
            (LLM_CALLS, llm_calls.clone()),
            (ENTITIES, graph.entities.clone()),
            (EDGES, graph.edges.clone()),
            (FEEDBACK, feedback.table().clone()),
            (JOB_RUNS, job_runs.clone()),
            (RELATIONS, relations.clone()),
            (GRAPH_METRICS, graph_metrics.clone()),
        ];
        let maintainer =
            maintain::AbortOnDrop(tokio::spawn(maintain::watch(side_tables, maintenance)));
        Ok(Store {
            _maintainer: maintainer,
            db,
            chunks,
            dead_letters,
            history,
            llm_calls,
            graph,
            feedback,
            job_runs,
            relations,
            graph_metrics,
            generations: Default::default(),
            written_at: Default::default(),
            delete_generation: Default::default(),
            dim,
            writer,
            embed_model: None,
            hot,
            stream_reads: Default::default(),
            write_gate: Default::default(),
            table_gate,
            vector_build,
            maintenance,
        })
    }

    /// How the `compact` job's full pass merges table `name`: the chunk
    /// table in its writer's ordered tiers, every other into large fragments.
    pub fn pass_merge(&self, name: &str) -> maintain::PassMerge<'static> {
        if name == CHUNKS {
            maintain::PassMerge::Tiers {
                target_rows: self.maintenance.target_rows_per_fragment,
                key: CHUNK_ORDER,
            }
        } else {
            maintain::PassMerge::Large
        }
    }

    /// Restrict vector reads to embeddings `model` made: vectors of another model
    /// live in another space and would rank at random until re-embedded.
    pub fn for_model(mut self, model: &str) -> Store {
        self.embed_model = Some(model.to_string());
        self.hot.set_model(model);
        self
    }

    /// Hold at most `bytes` of vectors in memory (0: every vector read goes
    /// to Lance).
    pub fn with_hot_budget(self, bytes: usize) -> Store {
        self.hot.set_budget(bytes);
        if bytes == 0 {
            self.graph.without_cache();
        }
        self
    }

    /// The hot index: bytes held and streams loaded.
    pub fn hot_usage(&self) -> (usize, usize) {
        (self.hot.used(), self.hot.loaded())
    }

    /// The predicate a row must meet to take part in a vector search. A row
    /// names its `embed_model` only when it has a vector, so the model test
    /// (a bitmap-indexed column) stands for `embedding IS NOT NULL`, which
    /// would read every vector of the table on each search.
    fn vector_clause(&self) -> String {
        match &self.embed_model {
            Some(m) => format!("embed_model = {}", sql_str(m)),
            None => "embedding IS NOT NULL".into(),
        }
    }

    /// Rows that take part in a vector search (see [`Store::vector_clause`]).
    pub fn with_vectors(&self, filter: Filter) -> Filter {
        filter.and(self.vector_clause())
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

    /// Memories committed since the store opened (new and replaced rows).
    pub fn rows_written(&self) -> u64 {
        self.writer.rows_written()
    }

    /// Wait until no vector index build runs on `chunks` (a merge of its
    /// fragments meanwhile would fail the build's commit; see
    /// [`maintain::VectorBuild`]).
    pub async fn vector_build_finished(&self) {
        while self.vector_build.running() {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }

    /// Every table by name (handles share state with the writers).
    pub fn tables(&self) -> std::collections::HashMap<&'static str, Table> {
        std::collections::HashMap::from([
            (CHUNKS, self.chunks.clone()),
            (DEAD_LETTERS, self.dead_letters.clone()),
            (HISTORY, self.history.clone()),
            (LLM_CALLS, self.llm_calls.clone()),
            (FEEDBACK, self.feedback.table().clone()),
            (JOB_RUNS, self.job_runs.clone()),
            (ENTITIES, self.graph.entities.clone()),
            (EDGES, self.graph.edges.clone()),
            (RELATIONS, self.relations.clone()),
            (GRAPH_METRICS, self.graph_metrics.clone()),
        ])
    }

    /// Every table's row count and Lance version, by name.
    pub async fn table_stats(&self) -> Result<Vec<(&'static str, usize, u64)>> {
        let mut out = Vec::new();
        for (name, table) in self.tables() {
            let rows = table.count_rows(None).await?;
            let version = table.version().await?;
            out.push((name, rows, version));
        }
        out.sort_by_key(|(name, _, _)| *name);
        Ok(out)
    }

    /// Insert or replace chunks by id; resolves once they are committed.
    pub async fn upsert(&self, chunks: Vec<Chunk>) -> Result<()> {
        let streams = streams_of(&chunks);
        let result = self.writer.upsert(chunks).await;
        self.bump(streams);
        result
    }

    /// Upsert `rows` and the pipeline's side effects on other memories in one
    /// commit (see [`ChunkWriter::commit_batch`]).
    pub async fn commit_with_side_effects(&self, rows: Vec<Chunk>, side: Vec<Chunk>) -> Result<()> {
        self.commit_batch(writer::WriteBatch {
            fresh: Vec::new(),
            rows,
            side,
            refuse: false,
            history: Vec::new(),
        })
        .await
    }

    /// The pipeline's write (see [`ChunkWriter::commit_batch`]): `fresh` rows,
    /// whose ids no stored row can have, and rows whose ids no stored row
    /// has are appended; the rest of `rows` and `side` are merged on `id`.
    pub async fn commit_batch(&self, batch: writer::WriteBatch) -> Result<()> {
        let mut streams = streams_of(&batch.fresh);
        streams.extend(streams_of(&batch.rows));
        streams.extend(streams_of(&batch.side));
        let result = self.writer.commit_batch(batch).await;
        self.bump(streams);
        result
    }

    /// Delete the chunks matching `filter`; returns how many went.
    pub async fn delete(&self, filter: &Filter) -> Result<u64> {
        let result = self
            .writer
            .delete(filter.predicate(), filter.streams())
            .await;
        self.delete_generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        result
    }

    fn bump(&self, streams: std::collections::BTreeSet<String>) {
        let now = tokio::time::Instant::now();
        let mut w = self.written_at.lock().expect("written_at lock");
        let mut g = self.generations.lock().expect("generations lock");
        for s in streams {
            *g.entry(s.clone()).or_default() += 1;
            w.insert(s, now);
        }
    }

    /// Every stream written since this process started: its write generation
    /// and when it was last written.
    pub fn write_activity(&self) -> Vec<(String, u64, tokio::time::Instant)> {
        let w = self.written_at.lock().expect("written_at lock");
        let g = self.generations.lock().expect("generations lock");
        w.iter()
            .map(|(s, at)| (s.clone(), g.get(s).copied().unwrap_or(0), *at))
            .collect()
    }

    /// Every table was put back to an earlier version: every cache is stale.
    /// Hold off every write to the tables a snapshot covers until the guard
    /// is dropped: writes already under way finish first, later ones wait.
    /// Take it after `write_gate` (a pipeline batch holds that one while it
    /// writes).
    pub async fn hold_writes(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        // The graph's queued rows belong to memories already committed.
        self.graph.settle().await;
        self.table_gate.write().await
    }

    pub async fn rolled_back(&self) -> Result<()> {
        self.delete_generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.hot.invalidate(None);
        self.writer.forget_ids();
        self.graph.forget_known();
        self.feedback.reload().await
    }

    /// Changes whenever a write or delete may have changed `stream`'s memories
    /// (not for usage counters); caches of derived views compare it.
    pub fn generation(&self, stream: &str) -> (u64, u64) {
        let g = self.generations.lock().expect("generations lock");
        (
            g.get(stream).copied().unwrap_or(0),
            self.delete_generation
                .load(std::sync::atomic::Ordering::SeqCst),
        )
    }

    /// A read-only handle on `chunks` as it was at a version (see [`AsOf`]).
    /// A separate handle: checking out the shared one would freeze every writer.
    pub async fn chunks_as_of(&self, at: AsOf) -> Result<Table, AsOfError> {
        let table = self.db.open_table(CHUNKS).execute().await?;
        let versions = table.list_versions().await?;
        let version = match at {
            AsOf::Version(v) => versions
                .iter()
                .find(|x| x.version == v)
                .map(|x| x.version)
                .ok_or_else(|| {
                    AsOfError::NoVersion(format!(
                        "version {v} does not exist (versions {}–{} are kept)",
                        versions.first().map_or(0, |x| x.version),
                        versions.last().map_or(0, |x| x.version)
                    ))
                })?,
            AsOf::Instant(t) => versions
                .iter()
                .filter(|x| x.timestamp.timestamp_micros() <= t)
                .map(|x| x.version)
                .max()
                .ok_or_else(|| AsOfError::NoVersion("the store has no version that old".into()))?,
        };
        table.checkout(version).await?;
        Ok(table)
    }

    /// Wait for pending writes, stop the writer, and let the graph's tidy
    /// pass end.
    pub async fn close(&self) {
        self.writer.close().await;
        self.graph.tidied().await;
    }

    /// The newest `created_at` per stream among the chunks matching a filter.
    pub async fn latest_write_by_stream(
        &self,
        filter: &Filter,
    ) -> Result<std::collections::BTreeMap<String, crate::core::model::Micros>> {
        Ok(self
            .stream_tallies(filter)
            .await?
            .into_iter()
            .map(|(s, (_, t))| (s, t))
            .collect())
    }

    /// By stream: how many memories meet `filter`, and the newest one's
    /// `created_at`.
    pub async fn stream_tallies(
        &self,
        filter: &Filter,
    ) -> Result<std::collections::BTreeMap<String, (usize, crate::core::model::Micros)>> {
        let batches = self.scan_columns(filter, &["stream", "created_at"]).await?;
        let mut out = std::collections::BTreeMap::new();
        for b in &batches {
            let c = crate::core::model::Columns::new(b);
            for r in 0..b.num_rows() {
                if let (Some(s), Some(t)) = (c.str("stream", r), c.time("created_at", r)) {
                    let e = out.entry(s).or_insert((0, t));
                    e.0 += 1;
                    e.1 = e.1.max(t);
                }
            }
        }
        Ok(out)
    }

    /// How many memories meeting `filter` carry each tag.
    pub async fn tag_counts(
        &self,
        filter: &Filter,
    ) -> Result<std::collections::BTreeMap<String, usize>> {
        let batches = self.scan_columns(filter, &["tags"]).await?;
        let mut out = std::collections::BTreeMap::new();
        for b in &batches {
            let c = crate::core::model::Columns::new(b);
            for r in 0..b.num_rows() {
                for tag in c.str_list("tags", r) {
                    *out.entry(tag).or_default() += 1;
                }
            }
        }
        Ok(out)
    }

    async fn scan_columns(&self, filter: &Filter, columns: &[&str]) -> Result<Vec<RecordBatch>> {
        Ok(self
            .chunks
            .query()
            .only_if(filter.predicate())
            .select(Select::columns(columns))
            .execute()
            .await?
            .try_collect()
            .await?)
    }

    /// How many memories meet `filter`: counted in the hot index when it
    /// holds every stream the filter names (loaded already: a count does
    /// not load one), by Lance otherwise.
    pub async fn count(&self, filter: &Filter) -> Result<usize> {
        if let (Some(conds), Some(streams)) = (filter.row_conds(), filter.streams()) {
            let ready: Option<Vec<_>> = streams.iter().map(|s| self.hot.ready(s)).collect();
            if let Some(indexes) = ready {
                return Ok(indexes
                    .iter()
                    .map(|ix| ix.read().expect("stream index lock").count_meeting(conds))
                    .sum());
            }
        }
        Ok(self.chunks.count_rows(filter.sql()).await?)
    }

    pub async fn get(&self, id: &str) -> Result<Option<Chunk>> {
        let mut found = self.find(&Filter::new().id(id), Some(1)).await?;
        Ok(found.pop())
    }

    /// Full chunks matching a filter (embedding included).
    pub async fn find(&self, filter: &Filter, limit: Option<usize>) -> Result<Vec<Chunk>> {
        read_chunks(&self.chunks, filter.predicate(), limit).await
    }

    /// The id, creation time and importance of every memory a filter
    /// matches (what a listing sorts and pages by; two narrow columns).
    pub async fn listing_keys(
        &self,
        filter: &Filter,
    ) -> Result<Vec<(String, crate::core::model::Micros, f32)>> {
        let batches: Vec<RecordBatch> = self
            .chunks
            .query()
            .only_if(filter.predicate())
            .select(Select::columns(&["id", "created_at", "importance"]))
            .execute()
            .await?
            .try_collect()
            .await?;
        let mut out = Vec::new();
        for b in &batches {
            let c = crate::core::model::Columns::new(b);
            for r in 0..b.num_rows() {
                if let Some(id) = c.str("id", r) {
                    out.push((
                        id,
                        c.time("created_at", r).unwrap_or(0),
                        c.f32("importance", r).unwrap_or(0.0),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Memories matching a filter, without their embeddings, at most `limit`.
    /// From the hot index when it holds every stream the filter names
    /// (loading them; past `limit`, the earliest recorded are kept), from
    /// Lance otherwise (its first `limit`).
    pub async fn find_rows(&self, filter: &Filter, limit: Option<usize>) -> Result<Vec<Chunk>> {
        if let Some(conds) = filter.row_conds() {
            if let Some(indexes) = self.hot_streams(filter).await? {
                let mut out: Vec<Chunk> = Vec::new();
                for ix in &indexes {
                    let ix = ix.read().expect("stream index lock");
                    out.extend(ix.rows_meeting(conds).map(|c| Chunk::clone(c)));
                }
                if let Some(limit) = limit.filter(|&l| l < out.len()) {
                    out.sort_by(|a, b| {
                        a.created_at
                            .cmp(&b.created_at)
                            .then_with(|| a.id.cmp(&b.id))
                    });
                    out.truncate(limit);
                }
                return Ok(out);
            }
        }
        read_rows(&self.chunks, filter, limit).await
    }

    /// Change chunks in place (see [`ChunkWriter::modify`]); returns how many changed.
    pub async fn modify(&self, ids: Vec<String>, modify: writer::Modifier) -> Result<usize> {
        self.writer.modify(ids, modify).await
    }

    /// Add to the access counters of the memories `accesses` names (see
    /// [`ChunkWriter::touch`]); returns how many changed.
    pub async fn touch(&self, accesses: writer::Accesses) -> Result<usize> {
        self.writer.touch(accesses).await
    }

    /// The stream and immutability of each stored chunk among `ids`.
    pub async fn owners<S: AsRef<str>>(
        &self,
        ids: &[S],
    ) -> Result<std::collections::HashMap<String, Owner>> {
        read_owners(&self.chunks, ids, true).await
    }

    /// Ids (only) of the chunks matching a filter.
    pub async fn ids(&self, filter: &Filter) -> Result<Vec<String>> {
        scan_ids(&self.chunks, filter).await
    }

    /// BM25 leg: best `limit` matches of `query` in `content`, prefiltered
    /// (`at`: a past version of the table, else the current one).
    pub async fn search_text(
        &self,
        at: Option<&Table>,
        query: &str,
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<Scored>> {
        if at.is_none() {
            if let Some(indexes) = self.hot_indexes(filter).await? {
                let conds = filter.conds().expect("hot_indexes checked them");
                return Ok(hot::bm25_in(&indexes, query, conds, limit)
                    .into_iter()
                    .map(|(score, id)| Scored { id, score })
                    .collect());
            }
        }
        self.search_text_lance(at, query, filter, limit).await
    }

    /// [`Store::search_text`] always through Lance's FTS index.
    pub async fn search_text_lance(
        &self,
        at: Option<&Table>,
        query: &str,
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<Scored>> {
        let batches: Vec<RecordBatch> = at
            .unwrap_or(&self.chunks)
            .query()
            .full_text_search(FullTextSearchQuery::new(query.to_string()))
            .only_if(filter.predicate())
            .select(Select::columns(&["id", "_score"]))
            .limit(limit)
            .execute()
            .await?
            .try_collect()
            .await?;
        scored(&batches, "_score")
    }

    /// Vector leg: the `limit` nearest chunks by cosine distance, prefiltered;
    /// from the hot index when it can answer, else from Lance.
    pub async fn search_vector(
        &self,
        at: Option<&Table>,
        vector: &[f32],
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<Scored>> {
        if at.is_none() {
            if let Some(found) = self.hot_nearest(vector, filter, limit).await? {
                return Ok(found
                    .into_iter()
                    .map(|(score, id)| Scored { id, score })
                    .collect());
            }
        }
        self.search_vector_lance(at, vector, filter, limit).await
    }

    /// The vectors of the memories named by `ids` that have one, by id: from
    /// the hot index when it holds the streams `filter` names, from Lance
    /// otherwise (`at`, or the live table).
    pub async fn vectors_of(
        &self,
        at: Option<&Table>,
        filter: &Filter,
        ids: &[String],
    ) -> Result<std::collections::HashMap<String, Vec<f32>>> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        let held = self
            .with_hot_vectors(at, filter, |held| {
                ids.iter()
                    .filter_map(|id| Some((id.clone(), held.vector(id)?)))
                    .collect()
            })
            .await?;
        match held {
            Some(held) => Ok(held),
            None => self.lance_vectors(at, filter, ids).await,
        }
    }

    /// [`Store::vectors_of`] always through Lance.
    async fn lance_vectors(
        &self,
        at: Option<&Table>,
        filter: &Filter,
        ids: &[String],
    ) -> Result<std::collections::HashMap<String, Vec<f32>>> {
        let found = read_chunks(
            at.unwrap_or(&self.chunks),
            filter.clone().ids(ids).predicate(),
            Some(ids.len()),
        )
        .await?;
        Ok(found
            .into_iter()
            .filter_map(|c| Some((c.id, c.embedding?)))
            .collect())
    }

    /// `with` given the vectors the hot index holds, when `at` is the live
    /// table and the hot index holds the streams `filter` names; None
    /// otherwise (the caller reads Lance).
    async fn with_hot_vectors<T>(
        &self,
        at: Option<&Table>,
        filter: &Filter,
        with: impl FnOnce(&HotVectors<'_>) -> T,
    ) -> Result<Option<T>> {
        if at.is_some() {
            return Ok(None);
        }
        let Some(indexes) = self.hot_indexes(filter).await? else {
            return Ok(None);
        };
        let held = HotVectors(
            indexes
                .iter()
                .map(|ix| ix.read().expect("stream index lock"))
                .collect(),
        );
        Ok(Some(with(&held)))
    }

    /// The cosine distance from `query` to each memory of `ids` that has a
    /// vector (`1 - v·query / |v|`), in the order of `ids`: from the hot
    /// index's vectors in place when it holds the streams `filter` names,
    /// from Lance otherwise (`at`, or the live table). Re-scoring a search's
    /// pool this way copies no vector (copied out by id, the pool's vectors
    /// were a seventh of a search's time).
    pub async fn distances(
        &self,
        at: Option<&Table>,
        filter: &Filter,
        ids: Vec<String>,
        query: &[f32],
    ) -> Result<Vec<Scored>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let distance = |v: &[f32]| {
            let norm = crate::core::vector::dot(v, v).sqrt();
            (norm > 0.0).then(|| 1.0 - crate::core::vector::dot(v, query) / norm)
        };
        let held = self
            .with_hot_vectors(at, filter, |held| {
                ids.iter()
                    .map(|id| distance(&held.vector(id)?))
                    .collect::<Vec<_>>()
            })
            .await?;
        let scores = match held {
            Some(scores) => scores,
            None => {
                let vectors = self.lance_vectors(at, filter, &ids).await?;
                ids.iter().map(|id| distance(vectors.get(id)?)).collect()
            }
        };
        Ok(ids
            .into_iter()
            .zip(scores)
            .filter_map(|(id, score)| Some(Scored { score: score?, id }))
            .collect())
    }

    /// [`Store::search_vector`] always through Lance.
    pub async fn search_vector_lance(
        &self,
        at: Option<&Table>,
        vector: &[f32],
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<Scored>> {
        let query = at.unwrap_or(&self.chunks).query().nearest_to(vector)?;
        let batches: Vec<RecordBatch> = exact_enough(query, limit)
            .only_if(format!(
                "({}) AND {}",
                filter.predicate(),
                self.vector_clause()
            ))
            .select(Select::columns(&["id", "_distance"]))
            .limit(limit)
            .execute()
            .await?
            .try_collect()
            .await?;
        scored(&batches, "_distance")
    }

    /// The memories named by `ids` that meet `filter` (without embeddings),
    /// as hits scored 0 (see [`Store::read_shared`]).
    pub async fn read_candidates(
        &self,
        at: Option<&Table>,
        filter: &Filter,
        ids: &[String],
    ) -> Result<Vec<Hit>> {
        Ok(self
            .read_shared(at, filter, ids)
            .await?
            .into_iter()
            .map(|chunk| Hit {
                chunk: Arc::unwrap_or_clone(chunk),
                score: 0.0,
            })
            .collect())
    }

    /// The memories named by `ids` that meet `filter` (without embeddings):
    /// from the hot index when it can answer the filter, shared with it
    /// rather than copied, from Lance otherwise and for ids it does not hold
    /// (yet). How a search reads its candidates: it copies only the few it
    /// returns (copying each of the hundred or so candidates, its text and
    /// lists, was a sixth of a search's CPU).
    pub async fn read_shared(
        &self,
        at: Option<&Table>,
        filter: &Filter,
        ids: &[String],
    ) -> Result<Vec<Arc<Chunk>>> {
        let mut out = Vec::with_capacity(ids.len());
        let mut missing: Vec<String> = Vec::new();
        let indexes = match at {
            None => self.hot_indexes(filter).await?,
            Some(_) => None,
        };
        match indexes {
            Some(indexes) => {
                let conds = filter.conds().expect("hot_indexes checked them");
                let guards: Vec<_> = indexes
                    .iter()
                    .map(|ix| ix.read().expect("stream index lock"))
                    .collect();
                for id in ids {
                    match guards.iter().find_map(|ix| ix.get(id)) {
                        Some((chunk, meta)) => {
                            if meta.meets(conds) {
                                out.push(Arc::clone(chunk));
                            }
                        }
                        None => missing.push(id.clone()),
                    }
                }
            }
            None => missing = ids.to_vec(),
        }
        if !missing.is_empty() {
            out.extend(
                read_rows(
                    at.unwrap_or(&self.chunks),
                    &filter.clone().ids(&missing),
                    Some(missing.len()),
                )
                .await?
                .into_iter()
                .map(Arc::new),
            );
        }
        Ok(out)
    }

    /// Chunks (without embeddings) matching a filter, as hits scored 0.
    pub async fn read_hits(
        &self,
        at: Option<&Table>,
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<Hit>> {
        Ok(read_rows(at.unwrap_or(&self.chunks), filter, Some(limit))
            .await?
            .into_iter()
            .map(|chunk| Hit { chunk, score: 0.0 })
            .collect())
    }

    /// True when `embedding` has an ANN index.
    pub async fn has_vector_index(&self) -> bool {
        self.chunks
            .list_indices()
            .await
            .is_ok_and(|list| list.iter().any(maintain::is_vector_index))
    }

    /// Build the ANN index on `embedding` once the table holds `min_rows`
    /// embedded rows (IVF-HNSW-SQ, cosine); false when not needed or present.
    /// Slow on large tables: run it off the request path.
    pub async fn ensure_vector_index(&self, min_rows: usize) -> Result<bool> {
        if self.has_vector_index().await
            || self
                .chunks
                .count_rows(Some("embedding IS NOT NULL".into()))
                .await?
                < min_rows.max(256)
        {
            return Ok(false);
        }
        let started = std::time::Instant::now();
        tracing::debug!("vector index build started");
        let _merges_wait = self.vector_build.begin();
        self.chunks
            .create_index(
                &["embedding"],
                Index::IvfHnswSq(
                    lancedb::index::vector::IvfHnswSqIndexBuilder::default()
                        .distance_type(DistanceType::Cosine),
                ),
            )
            .execute()
            .await?;
        tracing::info!(took = ?started.elapsed(), "vector index built");
        Ok(true)
    }
}

/// A cosine search for `k` rows set to find what an exact search finds: the
/// index's best `REFINE`·k candidates re-scored from their full vectors
/// (`refine_factor`), since its 8-bit (SQ) codes alone misorder close
/// neighbours, found by walking the HNSW graph with a candidate list (`ef`)
/// of at least 100 and never fewer than those candidates (Lance refuses a
/// smaller one). On 100k LongMemEval turns with MiniLM vectors
/// (`benches/search.rs`) recall@10 against a flat scan went 0.906 → 0.997
/// for ~1.5 ms a search (recall@50 0.960 → 0.988). A pool of `UNREFINED`
/// or more (the vector feedback's, 8 × the candidates) is left to Lance's
/// defaults: its caller re-scores it exactly, defaults already find 0.984
/// of the exact 400 nearest, and refining 400 costs ~10 ms more. Where
/// there is no index, Lance scans flat.
fn exact_enough(query: lancedb::query::VectorQuery, k: usize) -> lancedb::query::VectorQuery {
    const REFINE: u32 = 3;
    const UNREFINED: usize = 150;
    let query = query.distance_type(DistanceType::Cosine);
    if k >= UNREFINED {
        return query;
    }
    query
        .ef(k.saturating_mul(REFINE as usize).max(100))
        .refine_factor(REFINE)
}

/// A past state of the store: a table version, or the last version committed
/// at or before an instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AsOf {
    Version(u64),
    Instant(crate::core::model::Micros),
}

#[derive(Debug, thiserror::Error)]
pub enum AsOfError {
    #[error("{0}")]
    NoVersion(String),
    #[error("lance: {0}")]
    Lance(#[from] lancedb::Error),
}

fn streams_of(chunks: &[Chunk]) -> std::collections::BTreeSet<String> {
    chunks.iter().map(|c| c.stream.clone()).collect()
}

impl Store {
    /// For each vector, the `k` most similar latest memories of `stream` (one
    /// table scan for all vectors), best first.
    pub async fn nearest_many(
        &self,
        stream: &str,
        vectors: &[&[f32]],
        k: usize,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let mut out = vec![Vec::new(); vectors.len()];
        let Some((first, rest)) = vectors.split_first() else {
            return Ok(out);
        };
        let current = Filter::new().stream(stream).current();
        if let Some(indexes) = self.hot_indexes(&current).await? {
            let conds = current.conds().expect("typed");
            for (v, list) in vectors.iter().zip(&mut out) {
                *list = hot::nearest_in(&indexes, v, conds, k)
                    .into_iter()
                    .map(|(distance, id)| Neighbor {
                        id,
                        similarity: 1.0 - distance,
                    })
                    .collect();
            }
            return Ok(out);
        }
        if self.count(&Filter::new().stream(stream)).await? == 0 {
            return Ok(out);
        }
        let mut q = self.chunks.query().nearest_to(*first)?;
        for v in rest {
            q = q.add_query_vector(*v)?;
        }
        let batches: Vec<RecordBatch> = exact_enough(q, k)
            .only_if(format!(
                "stream = {} AND superseded_by IS NULL AND {}",
                sql_str(stream),
                self.vector_clause()
            ))
            .select(Select::columns(&["id", "_distance"]))
            .limit(k)
            .execute()
            .await?
            .try_collect()
            .await?;
        for b in &batches {
            let c = crate::core::model::Columns::new(b);
            let dist = b
                .column_by_name("_distance")
                .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
                .ok_or_else(|| ModelError::Column("_distance".into()))?;
            let qi = b.column_by_name("query_index");
            for r in 0..b.num_rows() {
                let query = match qi {
                    Some(col) => arrow_array::cast::AsArray::as_primitive::<
                        arrow_array::types::Int32Type,
                    >(col.as_ref())
                    .value(r) as usize,
                    None => 0,
                };
                if let Some(list) = out.get_mut(query) {
                    list.push(Neighbor {
                        id: c.str("id", r).unwrap_or_default(),
                        similarity: 1.0 - dist.value(r),
                    });
                }
            }
        }
        for list in &mut out {
            list.sort_by(|a, b| b.similarity.total_cmp(&a.similarity));
        }
        Ok(out)
    }
}

impl Store {
    /// The hot indexes of the streams a filter names, loading those not in
    /// memory; None when the index cannot answer (an opaque condition, no
    /// stream named, a stream over the budget).
    async fn hot_indexes(
        &self,
        filter: &Filter,
    ) -> Result<Option<Vec<std::sync::Arc<std::sync::RwLock<hot::StreamIndex>>>>> {
        if filter.conds().is_none() {
            return Ok(None);
        }
        self.hot_streams(filter).await
    }

    /// The hot indexes of the streams `filter` names, loading those not
    /// loaded yet (or waiting for another reader's load); None when one
    /// cannot be (too big, a load a delete poisoned, the budget is 0) or
    /// the filter names no stream.
    async fn hot_streams(
        &self,
        filter: &Filter,
    ) -> Result<Option<Vec<std::sync::Arc<std::sync::RwLock<hot::StreamIndex>>>>> {
        let Some(streams) = filter.streams() else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(streams.len());
        for stream in streams {
            let ix = loop {
                match self.hot.lookup(&stream) {
                    hot::Lookup::Ready(ix) => break ix,
                    hot::Lookup::Skip => return Ok(None),
                    hot::Lookup::Load(guard) => match self.load_hot(guard).await? {
                        Some(ix) => break ix,
                        None => return Ok(None),
                    },
                    // Ends with the load, whichever way it ends; then look again.
                    hot::Lookup::Wait(mut load) => {
                        let _ = load.changed().await;
                    }
                }
            };
            out.push(ix);
        }
        Ok(Some(out))
    }

    /// Read one stream's rows from Lance into the index.
    async fn load_hot(
        &self,
        guard: hot::LoadGuard,
    ) -> Result<Option<std::sync::Arc<std::sync::RwLock<hot::StreamIndex>>>> {
        let began = Instant::now();
        let filter = Filter::new().stream(guard.stream());
        let fits = self.hot.budget() / hot::row_bytes(self.dim);
        // Every column: the index answers the candidate reads of a search
        // too. No count first: a stream past the budget stops its read
        // there. Straight from the fragments (`stream_read`), or else
        // Lance's own batches (up to 8,192 rows), not lancedb's 1,024-row
        // slices: the index is sized for each group before it takes its
        // rows.
        let mut batches = match self.stream_reads.read(&self.chunks, guard.stream()).await? {
            Some(rows) => rows,
            None => {
                let mut whole = lancedb::query::QueryExecutionOptions::default();
                whole.max_batch_length = 0;
                let rows = self
                    .chunks
                    .query()
                    .only_if(filter.predicate())
                    .execute_with_options(whole)
                    .await?;
                futures::StreamExt::boxed(rows)
            }
        };
        let mut index = hot::StreamIndex::new(self.dim);
        let mut rows = 0;
        // A fragment's run of the stream comes as a batch of its own, often
        // of a few hundred rows; they go into the index in groups of up to
        // Lance's batch size, so that a large stream's rows are filed on two
        // threads ([`hot::StreamIndex::put_all`]).
        let mut group: Vec<RecordBatch> = Vec::new();
        let mut group_rows = 0;
        let mut times = LoadTimes::default();
        while let Some(batch) = batches.try_next().await? {
            rows += batch.num_rows();
            if rows > fits {
                guard.too_big();
                return Ok(None);
            }
            group_rows += batch.num_rows();
            group.push(batch);
            if group_rows >= LOAD_GROUP_ROWS {
                self.file_group(&mut index, &mut group, group_rows, &mut times)?;
                group_rows = 0;
            }
        }
        self.file_group(&mut index, &mut group, group_rows, &mut times)?;
        tracing::debug!(
            stream = guard.stream(),
            rows,
            lance_us = began
                .elapsed()
                .saturating_sub(times.read_out + times.filed)
                .as_micros() as u64,
            rows_us = times.read_out.as_micros() as u64,
            file_us = times.filed.as_micros() as u64,
            "stream loaded into the hot index"
        );
        Ok(guard.finish(index))
    }

    /// A load's `group` of batches (`rows` rows in all) into `index`, in one
    /// [`hot::StreamIndex::put_all`]; the group is left empty, its times
    /// added to `times`.
    fn file_group(
        &self,
        index: &mut hot::StreamIndex,
        group: &mut Vec<RecordBatch>,
        rows: usize,
        times: &mut LoadTimes,
    ) -> Result<()> {
        if group.is_empty() {
            return Ok(());
        }
        let began = Instant::now();
        index.reserve(rows);
        let loaded = group
            .iter()
            .map(hot::Loaded::new)
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let read_out = began.elapsed();
        let admitted = |model: Option<&str>| match &self.embed_model {
            Some(m) => model == Some(m.as_str()),
            None => true,
        };
        index.put_all(&loaded, &admitted)?;
        drop(loaded);
        group.clear();
        times.read_out += read_out;
        times.filed += began.elapsed() - read_out;
        Ok(())
    }

    /// The current memories of `stream` whose text hashes to any of `hashes`,
    /// without their embeddings (from the hot index when it holds the stream).
    pub async fn current_with_hashes<S: AsRef<str>>(
        &self,
        stream: &str,
        hashes: &[S],
    ) -> Result<Vec<Chunk>> {
        let filter = Filter::new().stream(stream).current();
        let Some(indexes) = self.hot_indexes(&filter).await? else {
            return read_rows(&self.chunks, &filter.content_hash_in(hashes), None).await;
        };
        let mut out = Vec::new();
        for ix in &indexes {
            let ix = ix.read().expect("stream index lock");
            for h in hashes {
                out.extend(
                    ix.current_with_hash(h.as_ref())
                        .iter()
                        .filter_map(|id| ix.get(id))
                        .map(|(c, _)| Chunk::clone(c)),
                );
            }
        }
        Ok(out)
    }

    /// The vector leg with a second look, from the hot index (None when it
    /// cannot answer): the `pool` nearest memories, re-scored against the
    /// query `again` makes of their (distance, vector), nearest first, if it
    /// makes one; the first `keep`. See [`hot::nearest_again_in`].
    pub async fn nearest_again(
        &self,
        at: Option<&Table>,
        vector: &[f32],
        filter: &Filter,
        pool: usize,
        keep: usize,
        again: impl FnOnce(&[(f32, &[f32])]) -> Option<Vec<f32>>,
    ) -> Result<Option<Vec<Scored>>> {
        if at.is_some() {
            return Ok(None);
        }
        let Some(indexes) = self.hot_indexes(filter).await? else {
            return Ok(None);
        };
        let conds = filter.conds().expect("hot_indexes checked them");
        let found = hot::nearest_again_in(&indexes, vector, conds, pool, keep, again);
        Ok(Some(
            found
                .into_iter()
                .map(|(score, id)| Scored { id, score })
                .collect(),
        ))
    }

    /// The nearest `limit` memories from the hot index, as (cosine
    /// distance, id); None when it cannot answer.
    async fn hot_nearest(
        &self,
        vector: &[f32],
        filter: &Filter,
        limit: usize,
    ) -> Result<Option<Vec<(f32, String)>>> {
        let Some(indexes) = self.hot_indexes(filter).await? else {
            return Ok(None);
        };
        let conds = filter.conds().expect("hot_indexes checked them");
        Ok(Some(hot::nearest_in(&indexes, vector, conds, limit)))
    }
}

/// Chunks without their embeddings matching a filter.
async fn read_rows(table: &Table, filter: &Filter, limit: Option<usize>) -> Result<Vec<Chunk>> {
    let q = table
        .query()
        .only_if(filter.predicate())
        .select(Select::columns(HIT_COLUMNS));
    collect_chunks(q, limit).await
}

/// Full chunks (embedding included) matching a Lance predicate.
async fn read_chunks(table: &Table, filter: String, limit: Option<usize>) -> Result<Vec<Chunk>> {
    collect_chunks(table.query().only_if(filter), limit).await
}

async fn collect_chunks(mut q: lancedb::query::Query, limit: Option<usize>) -> Result<Vec<Chunk>> {
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

/// A memory id a search leg found, with the leg's raw score.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub id: String,
    pub score: f32,
}

fn scored(batches: &[RecordBatch], score_column: &str) -> Result<Vec<Scored>> {
    let mut out = Vec::new();
    for b in batches {
        let c = crate::core::model::Columns::new(b);
        let scores = b
            .column_by_name(score_column)
            .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
            .ok_or_else(|| ModelError::Column(score_column.into()))?;
        for r in 0..b.num_rows() {
            if let Some(id) = c.str("id", r) {
                out.push(Scored {
                    id,
                    score: scores.value(r),
                });
            }
        }
    }
    Ok(out)
}

/// The indexes the engine relies on: BM25 over `content`, BTree on `id`
/// (upserts join on it) and `content_hash` (exact dedupe looks it up), bitmaps
/// on `stream` and `embed_model` (every search's prefilter). Rows
/// committed since the last refresh are searched flat until the `compact` job
/// folds them in (the pipeline's commits never wait for an index build: a slow
/// commit would outlast the bus's ack deadline and be redelivered).
async fn ensure_indexes(table: &Table) -> Result<()> {
    let existing: Vec<Vec<String>> = table
        .list_indices()
        .await?
        .into_iter()
        .map(|i| i.columns)
        .collect();
    let has = |c: &str| existing.iter().any(|cols| cols.iter().any(|x| x == c));
    if !has("content") {
        table
            .create_index(&["content"], Index::FTS(FtsIndexBuilder::default()))
            .execute()
            .await?;
    }
    for column in ["id", "content_hash"] {
        if !has(column) {
            table
                .create_index(&[column], Index::BTree(Default::default()))
                .execute()
                .await?;
        }
    }
    // Every search prefilters on the stream and the embedding model: bitmap
    // indexes answer those without scanning.
    for column in ["stream", "embed_model"] {
        if !has(column) {
            table
                .create_index(&[column], Index::Bitmap(Default::default()))
                .execute()
                .await?;
        }
    }
    Ok(())
}

fn embedding_dim(schema: &arrow_schema::Schema) -> Option<usize> {
    match schema.field_with_name("embedding").ok()?.data_type() {
        arrow_schema::DataType::FixedSizeList(_, n) => Some(*n as usize),
        _ => None,
    }
}

/// The stream of every row of `table` whose id is in `ids`; ids not stored are
/// absent. This is how a write learns that an id already names a row of
/// another stream.
pub async fn owners<S: AsRef<str>>(
    table: &Table,
    ids: &[S],
) -> Result<std::collections::HashMap<String, String>> {
    Ok(read_owners(table, ids, false)
        .await?
        .into_iter()
        .map(|(id, o)| (id, o.stream))
        .collect())
}

/// Who holds a stored chunk id, and whether that memory may be overwritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub stream: String,
    pub immutable: bool,
}

impl Owner {
    /// Why `chunk` may not be written over the memory this owner holds, if
    /// it may not: the id is another stream's, or the memory is immutable.
    pub fn refuses(&self, chunk: &Chunk) -> Option<String> {
        if self.stream != chunk.stream {
            Some(crate::core::error::id_in_use(&chunk.id))
        } else if self.immutable {
            Some(format!(
                "memory `{}` is immutable: it cannot be overwritten",
                chunk.id
            ))
        } else {
            None
        }
    }
}

async fn read_owners<S: AsRef<str>>(
    table: &Table,
    ids: &[S],
    immutable: bool,
) -> Result<std::collections::HashMap<String, Owner>> {
    let columns: &[&str] = if immutable {
        &["id", "stream", "immutable"]
    } else {
        &["id", "stream"]
    };
    let mut out = std::collections::HashMap::new();
    for_each_by_id(table, ids, columns, |c, r| {
        if let (Some(id), Some(stream)) = (c.str("id", r), c.str("stream", r)) {
            let immutable = immutable && c.bool("immutable", r).unwrap_or(false);
            out.insert(id, Owner { stream, immutable });
        }
    })
    .await?;
    Ok(out)
}

/// Read `columns` of the rows with these ids (a thousand ids a query) and
/// hand each row to `each`.
pub(crate) async fn for_each_by_id<S: AsRef<str>>(
    table: &Table,
    ids: &[S],
    columns: &[&str],
    mut each: impl FnMut(&crate::core::model::Columns, usize),
) -> Result<()> {
    for part in ids.chunks(1000) {
        let batches: Vec<RecordBatch> = table
            .query()
            .only_if(Filter::new().ids(part).predicate())
            .select(Select::columns(columns))
            .execute()
            .await?
            .try_collect()
            .await?;
        for b in &batches {
            let c = crate::core::model::Columns::new(b);
            for r in 0..b.num_rows() {
                each(&c, r);
            }
        }
    }
    Ok(())
}

/// How many rows of `table` match a filter.
pub async fn count_where(table: &Table, filter: &Filter) -> Result<usize> {
    Ok(table.count_rows(filter.sql()).await?)
}

/// The `id` of every row of `table` matching a filter.
pub async fn scan_ids(table: &Table, filter: &Filter) -> Result<Vec<String>> {
    let batches: Vec<RecordBatch> = table
        .query()
        .only_if(filter.predicate())
        .select(Select::columns(&["id"]))
        .execute()
        .await?
        .try_collect()
        .await?;
    Ok(batches
        .iter()
        .flat_map(|b| {
            let c = crate::core::model::Columns::new(b);
            (0..b.num_rows())
                .filter_map(|r| c.str("id", r))
                .collect::<Vec<_>>()
        })
        .collect())
}

/// Every row of `table` matching a Lance filter.
pub async fn scan(table: &Table, filter: &Filter) -> Result<Vec<RecordBatch>> {
    scan_where(table, &filter.predicate()).await
}

/// [`scan`] with a predicate the store built itself.
pub(in crate::store) async fn scan_where(
    table: &Table,
    predicate: &str,
) -> Result<Vec<RecordBatch>> {
    Ok(table
        .query()
        .only_if(predicate)
        .execute()
        .await?
        .try_collect()
        .await?)
}

/// Insert or replace rows by `id` (one commit).
pub async fn upsert_batch(table: &Table, batch: RecordBatch) -> Result<()> {
    let schema = batch.schema();
    let reader = RecordBatchIterator::new(vec![Ok(batch)], schema);
    let mut merge = table.merge_insert(&["id"]);
    merge
        .when_matched_update_all(None)
        .when_not_matched_insert_all();
    merge.execute(Box::new(reader)).await?;
    Ok(())
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

/// Fails on a vector holding NaN, which lancedb's `add` refuses and a
/// straight append (see [`append_batch`]) would store.
pub(crate) fn check_vectors(rows: &[Chunk]) -> Result<()> {
    match rows.iter().find(|c| {
        c.embedding
            .as_ref()
            .is_some_and(|v| v.iter().any(|x| x.is_nan()))
    }) {
        Some(c) => Err(lancedb::Error::InvalidInput {
            message: format!("the embedding of memory {} holds NaN", c.id),
        }
        .into()),
        None => Ok(()),
    }
}

/// Append one batch straight through Lance: lancedb's `add` plans every call
/// in DataFusion (a cast to the table's schema, a NaN check on vectors, a
/// projection), 38% of the CPU the writer's task spent on an agent's commit
/// of 8 rows. A batch in the table's own schema (names, types, nullability)
/// goes to the table's dataset (`append`), and the table's handle then holds
/// the new version, as after `add`; any other batch goes through `add`,
/// which casts it.
pub(crate) async fn append_batch(table: &Table, batch: RecordBatch) -> Result<()> {
    let schema = batch.schema();
    let reader: Box<dyn arrow_array::RecordBatchReader + Send> =
        Box::new(RecordBatchIterator::new(vec![Ok(batch)], schema.clone()));
    let Some(handle) = table.dataset() else {
        table.add(reader).execute().await?;
        return Ok(());
    };
    handle.ensure_mutable()?;
    let current = handle.get().await?;
    if !in_schema_of(&current, &schema) {
        table.add(reader).execute().await?;
        return Ok(());
    }
    let mut dataset = (*current).clone();
    dataset
        .append(reader, None)
        .await
        .map_err(lancedb::Error::from)?;
    handle.update(dataset);
    Ok(())
}

/// Whether a batch of this schema is in `dataset`'s own (names, types,
/// nullability), so Lance writes it as it is, with no cast.
pub(super) fn in_schema_of(dataset: &lance::Dataset, schema: &arrow_schema::Schema) -> bool {
    let stored = arrow_schema::Schema::from(dataset.schema());
    stored.fields().len() == schema.fields().len()
        && stored.fields().iter().zip(schema.fields()).all(|(a, b)| {
            a.name() == b.name()
                && a.data_type() == b.data_type()
                && a.is_nullable() == b.is_nullable()
        })
}

/// The vectors of the streams the hot index holds, read-locked (see
/// [`Store::with_hot_vectors`]).
struct HotVectors<'a>(Vec<std::sync::RwLockReadGuard<'a, hot::StreamIndex>>);

impl HotVectors<'_> {
    /// A memory's vector, of unit length (to f16's precision), if one of
    /// the streams holds it.
    fn vector(&self, id: &str) -> Option<Vec<f32>> {
        self.0.iter().find_map(|ix| ix.vector(id))
    }
}

impl From<StoreError> for crate::core::Error {
    fn from(e: StoreError) -> Self {
        crate::core::Error::Storage(Box::new(e))
    }
}
