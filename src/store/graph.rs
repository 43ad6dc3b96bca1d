//! The per-stream entity graph: `entities` (one row per stream and entity key:
//! type, aliases, the chunks that mention it) and `edges` (co-occurrence and
//! verb relations such as "alice -uses-> cursor").

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use lancedb::Table;
use serde::{Deserialize, Serialize};

use crate::core::model::{Columns, Micros};
use crate::store::filter::{column_in, sql_str};
use crate::store::{Filter, Result, StoreError};

/// Most chunk ids kept per entity or edge (the most recent win).
const MAX_CHUNK_REFS: usize = 2000;

/// The lookup key of an entity name: lower case, letters and digits only, so
/// "VS Code", "VSCode" and "vscode" are one entity.
pub fn entity_key(name: &str) -> String {
    if name.is_ascii() {
        // The same for ASCII, a byte at a time.
        return name
            .bytes()
            .filter(u8::is_ascii_alphanumeric)
            .map(|b| char::from(b.to_ascii_lowercase()))
            .collect();
    }
    folded_key(name)
}

/// [`entity_key`] of any text, char by char.
fn folded_key(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EntityRow {
    pub id: String,
    pub stream: String,
    pub key: String,
    pub name: String,
    pub entity_type: String,
    pub aliases: Vec<String>,
    pub chunk_ids: Vec<String>,
    pub chunk_count: i64,
    pub first_seen: Micros,
    pub last_seen: Micros,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EdgeRow {
    pub id: String,
    pub stream: String,
    pub source: String,
    pub target: String,
    pub relation: String,
    pub weight: i64,
    pub chunk_ids: Vec<String>,
    pub updated_at: Micros,
}

/// The timestamp column type of every table.
pub(super) fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, None)
}

/// A list-of-strings column type.
pub(super) fn str_list() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)))
}

pub fn entity_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("key", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("entity_type", DataType::Utf8, false),
        Field::new("aliases", str_list(), true),
        Field::new("chunk_ids", str_list(), true),
        Field::new("chunk_count", DataType::Int64, false),
        Field::new("first_seen", ts(), false),
        Field::new("last_seen", ts(), false),
    ]))
}

pub fn edge_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("target", DataType::Utf8, false),
        Field::new("relation", DataType::Utf8, false),
        Field::new("weight", DataType::Int64, false),
        Field::new("chunk_ids", str_list(), true),
        Field::new("updated_at", ts(), false),
    ]))
}

/// Rows of any serialisable struct as a record batch of `schema`.
pub fn rows_to_batch<T: Serialize>(schema: SchemaRef, rows: &[T]) -> Result<RecordBatch> {
    let mut decoder = arrow_json::ReaderBuilder::new(schema)
        .build_decoder()
        .map_err(crate::core::model::ModelError::from)?;
    decoder
        .serialize(rows)
        .map_err(crate::core::model::ModelError::from)?;
    decoder
        .flush()
        .map_err(crate::core::model::ModelError::from)?
        .ok_or_else(|| StoreError::Model(crate::core::model::ModelError::Column("no rows".into())))
}

/// Entity rows as a batch of [`entity_schema`], built column by column: a
/// group commit rewrites up to [`MAX_CHUNK_REFS`] references a row, each
/// serialised to JSON and parsed back by [`rows_to_batch`] (about a
/// twentieth of the upsert at a million-record import, when the rest was
/// Lance's `merge_insert`).
fn entity_batch(rows: &[EntityRow]) -> Result<RecordBatch> {
    use crate::core::model::{int64s, lists, strings, times};
    let columns = vec![
        strings(rows, |r| Some(&r.id)),
        strings(rows, |r| Some(&r.stream)),
        strings(rows, |r| Some(&r.key)),
        strings(rows, |r| Some(&r.name)),
        strings(rows, |r| Some(&r.entity_type)),
        lists(rows, |r| &r.aliases),
        lists(rows, |r| &r.chunk_ids),
        int64s(rows, |r| r.chunk_count),
        times(rows, |r| Some(r.first_seen)),
        times(rows, |r| Some(r.last_seen)),
    ];
    Ok(RecordBatch::try_new(entity_schema(), columns)
        .map_err(crate::core::model::ModelError::from)?)
}

/// Edge rows as a batch of [`edge_schema`] (see [`entity_batch`]).
fn edge_batch(rows: &[EdgeRow]) -> Result<RecordBatch> {
    use crate::core::model::{int64s, lists, strings, times};
    let columns = vec![
        strings(rows, |r| Some(&r.id)),
        strings(rows, |r| Some(&r.stream)),
        strings(rows, |r| Some(&r.source)),
        strings(rows, |r| Some(&r.target)),
        strings(rows, |r| Some(&r.relation)),
        int64s(rows, |r| r.weight),
        lists(rows, |r| &r.chunk_ids),
        times(rows, |r| Some(r.updated_at)),
    ];
    Ok(RecordBatch::try_new(edge_schema(), columns)
        .map_err(crate::core::model::ModelError::from)?)
}

fn entity_rows(batch: &RecordBatch) -> Vec<EntityRow> {
    let c = Columns::new(batch);
    (0..batch.num_rows())
        .map(|r| EntityRow {
            id: c.str("id", r).unwrap_or_default(),
            stream: c.str("stream", r).unwrap_or_default(),
            key: c.str("key", r).unwrap_or_default(),
            name: c.str("name", r).unwrap_or_default(),
            entity_type: c.str("entity_type", r).unwrap_or_default(),
            aliases: c.str_list("aliases", r),
            chunk_ids: c.str_list("chunk_ids", r),
            chunk_count: c.i64("chunk_count", r).unwrap_or(0),
            first_seen: c.time("first_seen", r).unwrap_or(0),
            last_seen: c.time("last_seen", r).unwrap_or(0),
        })
        .collect()
}

fn edge_rows(batch: &RecordBatch) -> Vec<EdgeRow> {
    let c = Columns::new(batch);
    (0..batch.num_rows())
        .map(|r| EdgeRow {
            id: c.str("id", r).unwrap_or_default(),
            stream: c.str("stream", r).unwrap_or_default(),
            source: c.str("source", r).unwrap_or_default(),
            target: c.str("target", r).unwrap_or_default(),
            relation: c.str("relation", r).unwrap_or_default(),
            weight: c.i64("weight", r).unwrap_or(0),
            chunk_ids: c.str_list("chunk_ids", r),
            updated_at: c.time("updated_at", r).unwrap_or(0),
        })
        .collect()
}

/// One entity found in one chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct Mention {
    pub stream: String,
    pub key: String,
    pub name: String,
    pub entity_type: String,
    /// The text as it appeared.
    pub surface: String,
    pub chunk_id: String,
    pub at: Micros,
}

/// The graph rows one chunk was recorded in: entity ids and edge ids.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkRefs {
    pub entities: Vec<String>,
    pub edges: Vec<String>,
}

impl ChunkRefs {
    pub fn is_empty(&self) -> bool {
        self.entities.is_empty() && self.edges.is_empty()
    }
}

impl Mention {
    /// The id of the entity row this mention is recorded in.
    pub fn entity_id(&self) -> String {
        format!("{}/{}", self.stream, self.key)
    }

    /// The parts of [`Mention::entity_id`], to group mentions by row
    /// without putting the id together for each.
    fn row_key(&self) -> (&str, &str) {
        (&self.stream, &self.key)
    }
}

impl Relation {
    /// The id of the edge row this relation is recorded in.
    pub fn edge_id(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.stream, self.source, self.relation, self.target
        )
    }

    /// The parts of [`Relation::edge_id`] (see [`Mention::row_key`]).
    fn row_key(&self) -> (&str, &str, &str, &str) {
        (&self.stream, &self.source, &self.relation, &self.target)
    }
}

/// One relation found in one chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct Relation {
    pub stream: String,
    pub source: String,
    pub target: String,
    pub relation: String,
    pub chunk_id: String,
    pub at: Micros,
}

/// The entity graph's tables and what is kept beside them. The pipeline's
/// graph rows are committed in groups (see [`Graph::defer`]), by one flush
/// task at a time that needs the tables for itself: hence the `Arc`.
pub struct Graph(Arc<GraphTables>);

impl std::ops::Deref for Graph {
    type Target = GraphTables;

    fn deref(&self) -> &GraphTables {
        &self.0
    }
}

pub struct GraphTables {
    pub entities: Table,
    pub edges: Table,
    /// Rows upserted since the `id` indexes were last refreshed.
    unindexed: std::sync::atomic::AtomicUsize,
    /// Commits to either table, and the tidy passes' state.
    commits: std::sync::atomic::AtomicUsize,
    tidy: Arc<Tidy>,
    /// Held by each read-merge-write of rows (the queue's flushes and the
    /// other writes), so no merge loses another's counts.
    merging: tokio::sync::Mutex<()>,
    /// The store's table gate (see `Store::hold_writes`).
    gate: super::TableGate,
    /// Entities of the streams searched lately, for the search's graph leg.
    known: std::sync::Mutex<Known>,
    /// Whether `known` is used (off where other processes write the tables).
    caching: std::sync::atomic::AtomicBool,
    /// Mentions and relations waiting for their commit.
    queue: std::sync::Mutex<Queue>,
    /// Tells the flush task to commit now (a reader or an urgent write waits).
    wake: tokio::sync::Notify,
}

/// How long the pipeline's graph rows wait for more before they are
/// committed. A commit of either table costs about as much CPU for 10 rows
/// as for 100 (a merge on `id`, a fragment, a manifest): at 8 writers, one
/// commit per store batch took a third of the store rate. The store's
/// answer does not wait for these rows (its memories are committed); the
/// bus's acknowledgement does, so a crash redelivers what they held. A
/// second, not less: under 8 writers the graph's commits and the tidy
/// passes they start took 4.9 s of CPU over 6,000 stores at 200 ms, 1.8 s at
/// a second, CPU the embedder needs. Readers of the graph's tables do not
/// wait for it (they hurry the flush), nor does the search's graph leg (it
/// takes queued mentions as they are queued).
const GRAPH_LINGER: std::time::Duration = std::time::Duration::from_millis(1000);

/// Queued mentions and relations past which a commit starts at once. A
/// commit's cost follows the rows it rewrites (an entity's or edge's row
/// holds up to [`MAX_CHUNK_REFS`] references) more than the mentions folded
/// in: a bulk import (~27,000 mentions and relations a second) at 4,096
/// committed six times a second, 190 commits and 9.6 s of the graph's
/// thread over 300,000 records; at 32,768 it commits about once a second
/// ([`GRAPH_LINGER`]): 34 commits, 3.3 s. At 131,072 (session 79), a
/// million-record import was no faster.
const GRAPH_QUEUE_MAX: usize = 32_768;

/// What waits for the next commit, and whether a flush task runs.
#[derive(Default)]
struct Queue {
    mentions: Vec<Mention>,
    relations: Vec<Relation>,
    /// References taken back ([`Graph::retract`]), as (row id, chunk id):
    /// the next commit takes them out of the rows an earlier one wrote.
    strips: Strips,
    waiters: Vec<tokio::sync::oneshot::Sender<Result<(), String>>>,
    /// When the oldest write now queued came.
    since: Option<std::time::Instant>,
    /// Someone waits for the commit: no lingering.
    urgent: bool,
    /// A flush task runs; it ends only with an empty queue.
    flushing: bool,
}

impl Queue {
    /// Enough is queued to commit without lingering.
    fn full(&self) -> bool {
        self.mentions.len()
            + self.relations.len()
            + self.strips.entities.len()
            + self.strips.edges.len()
            >= GRAPH_QUEUE_MAX
    }
}

/// Rows a commit left with no reference, by id: entities, edges.
#[derive(Default)]
struct Emptied {
    entities: Vec<String>,
    edges: Vec<String>,
}

/// Chunk references to take out of the graph's rows: (row id, chunk id).
#[derive(Default)]
struct Strips {
    entities: Vec<(String, String)>,
    edges: Vec<(String, String)>,
}

impl Strips {
    fn is_empty(&self) -> bool {
        self.entities.is_empty() && self.edges.is_empty()
    }
}

/// (row id, chunk id) pairs as a set to look up.
fn pairs(list: &[(String, String)]) -> HashSet<(&str, &str)> {
    list.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect()
}

/// A graph row that counts the memories referring to it: an entity (its
/// `chunk_count`) or an edge (its `weight`).
trait Referenced {
    fn id(&self) -> &str;
    /// The row's id, the chunk ids referring to it and their count.
    fn parts(&mut self) -> (&str, &mut Vec<String>, &mut i64);

    /// Take out the references `gone(row id, chunk id)` names, the count
    /// going down with them; whether any went.
    fn unref(&mut self, gone: impl Fn(&str, &str) -> bool) -> bool {
        let (id, refs, count) = self.parts();
        let before = refs.len();
        refs.retain(|c| !gone(id, c));
        let removed = (before - refs.len()) as i64;
        if removed > 0 {
            *count = (*count - removed).max(0);
        }
        removed > 0
    }

    fn is_unreferenced(&self) -> bool;

    /// Rows as a batch of their table's schema.
    fn batch(rows: &[Self]) -> Result<RecordBatch>
    where
        Self: Sized;
}

impl Referenced for EntityRow {
    fn id(&self) -> &str {
        &self.id
    }
    fn parts(&mut self) -> (&str, &mut Vec<String>, &mut i64) {
        (&self.id, &mut self.chunk_ids, &mut self.chunk_count)
    }
    fn is_unreferenced(&self) -> bool {
        self.chunk_ids.is_empty()
    }
    fn batch(rows: &[Self]) -> Result<RecordBatch> {
        entity_batch(rows)
    }
}

impl Referenced for EdgeRow {
    fn id(&self) -> &str {
        &self.id
    }
    fn parts(&mut self) -> (&str, &mut Vec<String>, &mut i64) {
        (&self.id, &mut self.chunk_ids, &mut self.weight)
    }
    fn is_unreferenced(&self) -> bool {
        self.chunk_ids.is_empty()
    }
    fn batch(rows: &[Self]) -> Result<RecordBatch> {
        edge_batch(rows)
    }
}

/// One table's share of a group commit: the rows `fresh` (the ids the new
/// references go to) and `stripped` name are read, lose the references in
/// `stripped`, and take the new ones from `fold` (which returns the ids it
/// touched); what changed is written back. Returns the rows
/// kept and those left without a reference (for the caller to delete).
///
/// Written back as the chunk writer moves memories ([`super::moving`]):
/// the rows are read with their addresses from one version of the table,
/// and the changed ones written as a new fragment, their old rows deleted,
/// in one commit on that version. Lance's `merge_insert` did the same
/// after joining the rows against the table again (~22 ms a commit for
/// either table, whatever the rows: half the graph's commit time). A tidy
/// pass that rewrote one of the fragments meanwhile fails the commit as a
/// conflict, and the rows are read again.
async fn restate<R: Referenced>(
    table: &Table,
    read: fn(&RecordBatch) -> Vec<R>,
    fresh: impl Iterator<Item = String>,
    stripped: &[(String, String)],
    fold: impl Fn(&mut HashMap<String, R>) -> Vec<String>,
) -> Result<(Vec<R>, Vec<R>)> {
    let ids: BTreeSet<String> = fresh
        .chain(stripped.iter().map(|(r, _)| r.clone()))
        .collect();
    let stripped = pairs(stripped);
    let filter = column_in("id", &ids);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let started = std::time::Instant::now();
        let snapshot = super::moving::Snapshot::of(table).await?;
        let mut at: HashMap<String, u64> = HashMap::new();
        let mut rows: HashMap<String, R> = HashMap::new();
        for batch in snapshot.rows_where(&filter, None).await? {
            let addresses = super::moving::addresses(&batch)?;
            for (row, address) in read(&batch).into_iter().zip(addresses.iter()) {
                at.insert(row.id().to_string(), *address);
                rows.insert(row.id().to_string(), row);
            }
        }
        let mut touched: HashSet<String> = HashSet::new();
        for row in rows.values_mut() {
            if row.unref(|r, c| stripped.contains(&(r, c))) {
                touched.insert(row.id().to_string());
            }
        }
        let read_took = started.elapsed();
        touched.extend(fold(&mut rows));
        let folded = started.elapsed();
        let (kept, emptied): (Vec<R>, Vec<R>) = rows
            .into_values()
            .filter(|r| touched.contains(r.id()))
            .partition(|r| !r.is_unreferenced());
        // The rows kept replace their stored versions; the emptied ones are
        // the caller's to delete.
        let replaced: Vec<u64> = kept
            .iter()
            .filter_map(|r| at.get(r.id()).copied())
            .collect();
        let written = if kept.is_empty() {
            Ok(())
        } else {
            snapshot.replace(table, R::batch(&kept)?, &replaced).await
        };
        match written {
            Err(StoreError::Lance(e))
                if attempt < RESTATE_ATTEMPTS && super::maintain::is_conflict(&e) =>
            {
                tracing::debug!(attempt, error = %e, "graph rows conflicted; reading again");
                continue;
            }
            written => written?,
        }
        tracing::debug!(
            read = ?read_took,
            fold = ?(folded - read_took),
            upsert = ?(started.elapsed() - folded),
            rows = kept.len(),
            attempts = attempt,
            "graph rows restated"
        );
        return Ok((kept, emptied));
    }
}

/// Attempts at a graph table's restatement when a tidy pass rewrote one of
/// its rows' fragments meanwhile.
const RESTATE_ATTEMPTS: u32 = 4;

/// Per stream, its entities by key: loaded on the stream's first graph
/// lookup, kept in step by [`Graph::record`], dropped by every other write
/// (forgetting memories, deletes, restores, rollbacks).
#[derive(Default)]
struct Known {
    streams: HashMap<String, HashMap<String, EntityRow>>,
    /// Memory references held, the measure of its size.
    refs: usize,
}

/// The most memory references `Known` holds (~100 MB); past it, it starts over.
const KNOWN_MAX_REFS: usize = 2_000_000;

impl Known {
    /// Hold a stream's rows, in place of any held before; false when they
    /// would take more than half of what it holds at most.
    fn install(&mut self, stream: &str, rows: Vec<EntityRow>) -> bool {
        self.forget(stream);
        let refs: usize = rows.iter().map(|r| r.chunk_ids.len()).sum();
        if refs > KNOWN_MAX_REFS / 2 {
            return false;
        }
        if self.refs + refs > KNOWN_MAX_REFS {
            *self = Known::default();
        }
        self.refs += refs;
        self.streams.insert(
            stream.to_string(),
            rows.into_iter().map(|r| (r.key.clone(), r)).collect(),
        );
        true
    }

    /// Stop holding a stream's rows.
    fn forget(&mut self, stream: &str) {
        if let Some(rows) = self.streams.remove(stream) {
            self.refs -= rows.values().map(|r| r.chunk_ids.len()).sum::<usize>();
        }
    }

    /// Stop holding one row (deleted from the table).
    fn remove(&mut self, row: &EntityRow) {
        if let Some(old) = self
            .streams
            .get_mut(&row.stream)
            .and_then(|rows| rows.remove(&row.key))
        {
            self.refs -= old.chunk_ids.len();
        }
    }

    /// Fold mentions into the rows held for their streams, in place.
    fn fold<'a>(&mut self, mentions: impl IntoIterator<Item = &'a Mention>) {
        // Only mentions of the streams held are grouped (a bulk import's
        // streams are mostly not).
        let held = mentions
            .into_iter()
            .filter(|m| self.streams.contains_key(&m.stream));
        for (_, ms) in grouped(held, |m| m.row_key()) {
            let Some(rows) = self.streams.get_mut(&ms[0].stream) else {
                continue;
            };
            let row = rows
                .entry(ms[0].key.clone())
                .or_insert_with(|| new_entity(ms[0]));
            let before = row.chunk_ids.len();
            fold_mentions(row, &ms);
            self.refs = self.refs + row.chunk_ids.len() - before;
        }
        if self.refs > KNOWN_MAX_REFS {
            *self = Known::default();
        }
    }

    /// Take back mentions folded in before their commit (their chunks were
    /// not stored after all); a row left with no reference goes.
    fn unfold<'a>(&mut self, mentions: impl IntoIterator<Item = &'a Mention>) {
        for m in mentions {
            let Some(rows) = self.streams.get_mut(&m.stream) else {
                continue;
            };
            let Some(row) = rows.get_mut(&m.key) else {
                continue;
            };
            if let Some(at) = row.chunk_ids.iter().position(|c| *c == m.chunk_id) {
                row.chunk_ids.remove(at);
                row.chunk_count = (row.chunk_count - 1).max(0);
                self.refs -= 1;
            }
            if row.chunk_ids.is_empty() {
                rows.remove(&m.key);
            }
        }
    }

    fn remember(&mut self, row: &EntityRow) {
        let Some(stream) = self.streams.get_mut(&row.stream) else {
            return;
        };
        if let Some(old) = stream.insert(row.key.clone(), row.clone()) {
            self.refs -= old.chunk_ids.len();
        }
        self.refs += row.chunk_ids.len();
        if self.refs > KNOWN_MAX_REFS {
            *self = Known::default();
        }
    }
}

/// Graph rows written between two refreshes of the `id` indexes (rows added
/// since the last refresh are looked up by a scan).
const GRAPH_INDEX_REFRESH_ROWS: usize = 10_000;

/// Whether a tidy pass runs, and whether one was asked for since it began;
/// `idle` wakes whoever waits for the passes to end ([`Graph::tidied`]).
#[derive(Default)]
struct Tidy {
    running: std::sync::atomic::AtomicBool,
    again: std::sync::atomic::AtomicBool,
    idle: tokio::sync::Notify,
}

/// Graph commits between two tidy passes (see [`Graph::written`]). Each
/// pipeline batch commits a fragment to each table, and every read-merge-
/// write of a batch opens every fragment not yet indexed: left to the
/// store's maintainer (every 10 s, above 32 fragments), the graph merge
/// took as long as a store's embedding under 8 writers.
const GRAPH_TIDY_COMMITS: usize = 16;

async fn read_where<T>(
    table: &Table,
    filter: String,
    f: fn(&RecordBatch) -> Vec<T>,
) -> Result<Vec<T>> {
    let batches = super::scan_where(table, &filter).await?;
    Ok(batches.iter().flat_map(f).collect())
}

async fn upsert<R: Referenced>(table: &Table, rows: &[R]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    crate::store::upsert_batch(table, R::batch(rows)?).await
}

/// The row of an entity first seen in `m`, before `m` is folded in.
fn new_entity(m: &Mention) -> EntityRow {
    EntityRow {
        id: m.entity_id(),
        stream: m.stream.clone(),
        key: m.key.clone(),
        name: m.name.clone(),
        entity_type: m.entity_type.clone(),
        aliases: Vec::new(),
        chunk_ids: Vec::new(),
        chunk_count: 0,
        first_seen: m.at,
        last_seen: m.at,
    }
}

/// Mentions of one entity counted in its row, in order.
fn fold_mentions(row: &mut EntityRow, mentions: &[&Mention]) {
    for m in mentions {
        if m.surface != row.name && !row.aliases.contains(&m.surface) && row.aliases.len() < 50 {
            row.aliases.push(m.surface.clone());
        }
        row.first_seen = row.first_seen.min(m.at);
        row.last_seen = row.last_seen.max(m.at);
    }
    row.chunk_count += add_refs(
        &mut row.chunk_ids,
        mentions.iter().map(|m| m.chunk_id.as_str()),
    );
}

/// Add chunk ids to a row's references, in order, each id once (the oldest
/// go past [`MAX_CHUNK_REFS`]); how many were not there. Past a few ids the
/// row's references are looked up in a set built once: a scan of up to
/// 2,000 ids for each mention, and a shift of them all for each one
/// dropped, took most of a bulk import's graph commits.
fn add_refs<'a>(list: &mut Vec<String>, ids: impl IntoIterator<Item = &'a str>) -> i64 {
    let ids: Vec<&str> = ids.into_iter().collect();
    let new: Vec<String> = if ids.len() <= 4 {
        let mut new: Vec<String> = Vec::new();
        for id in ids {
            if !list.iter().chain(&new).any(|x| x == id) {
                new.push(id.to_string());
            }
        }
        new
    } else {
        let mut have: ahash::AHashSet<&str> = list.iter().map(String::as_str).collect();
        ids.into_iter()
            .filter(|id| have.insert(id))
            .map(str::to_string)
            .collect()
    };
    let added = new.len() as i64;
    list.extend(new);
    if list.len() > MAX_CHUNK_REFS {
        list.drain(..list.len() - MAX_CHUNK_REFS);
    }
    added
}

/// Items grouped by `key`, the groups in the order of their first item
/// (keys hashed with aHash: with the standard SipHash, this grouping's
/// hashing was 0.6% of a 1M-record import's CPU).
fn grouped<T, K: std::hash::Hash + Eq + Clone>(
    items: impl IntoIterator<Item = T>,
    key: impl Fn(&T) -> K,
) -> Vec<(K, Vec<T>)> {
    let mut at: ahash::AHashMap<K, usize> = ahash::AHashMap::new();
    let mut groups: Vec<(K, Vec<T>)> = Vec::new();
    for item in items {
        let k = key(&item);
        match at.get(&k) {
            Some(&i) => groups[i].1.push(item),
            None => {
                at.insert(k.clone(), groups.len());
                groups.push((k, vec![item]));
            }
        }
    }
    groups
}

impl Graph {
    /// Open the graph over its two tables, with a BTree index on each `id`
    /// (every batch reads and merges by id) and a bitmap on each `stream`
    /// (a stream's first graph leg reads all its entities).
    pub async fn open(entities: Table, edges: Table, gate: super::TableGate) -> Result<Graph> {
        for table in [&entities, &edges] {
            let indexed: Vec<Vec<String>> = table
                .list_indices()
                .await?
                .into_iter()
                .map(|i| i.columns)
                .collect();
            let has = |c: &str| indexed.iter().any(|cols| cols.iter().any(|x| x == c));
            if !has("id") {
                table
                    .create_index(&["id"], lancedb::index::Index::BTree(Default::default()))
                    .execute()
                    .await?;
            }
            if !has("stream") {
                table
                    .create_index(
                        &["stream"],
                        lancedb::index::Index::Bitmap(Default::default()),
                    )
                    .execute()
                    .await?;
            }
        }
        Ok(Graph(Arc::new(GraphTables {
            entities,
            edges,
            unindexed: Default::default(),
            commits: Default::default(),
            tidy: Default::default(),
            merging: Default::default(),
            gate,
            known: Default::default(),
            caching: true.into(),
            queue: Default::default(),
            wake: Default::default(),
        })))
    }

    /// Fold mentions and relations into the tables, with whatever else is
    /// queued, at once; resolves when they are committed.
    pub async fn record(&self, mentions: &[Mention], relations: &[Relation]) -> Result<()> {
        self.enqueue(mentions.to_vec(), relations.to_vec(), true)
            .await
    }

    /// Queue mentions and relations for the next group commit, which comes
    /// [`GRAPH_LINGER`] after the oldest write queued (sooner when a reader
    /// or an urgent write asks); the future resolves when they are committed.
    /// Reads of the graph see them at once: the rows held in memory take
    /// them now, and every read of the tables waits for the queue first.
    pub fn defer(
        &self,
        mentions: Vec<Mention>,
        relations: Vec<Relation>,
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        self.enqueue(mentions, relations, false)
    }

    fn enqueue(
        &self,
        mentions: Vec<Mention>,
        relations: Vec<Relation>,
        urgent: bool,
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let empty = mentions.is_empty() && relations.is_empty();
        let committed = (!empty).then(|| {
            // The rows held in memory take the mentions as they are queued
            // (both locks held, so `load_known` sees each mention once).
            let mut known = self.known.lock().expect("known entities lock");
            known.fold(&mentions);
            let mut queue = self.queue.lock().expect("graph queue lock");
            queue.mentions.extend(mentions);
            queue.relations.extend(relations);
            let joined = self.join(&mut queue, urgent);
            drop(queue);
            drop(known);
            joined
        });
        committed_by(committed)
    }

    /// A write joins the next commit (the queue's lock held): the flush task
    /// is started, or woken when the commit should not linger; the receiver
    /// hears when that commit is done.
    fn join(
        &self,
        queue: &mut Queue,
        urgent: bool,
    ) -> tokio::sync::oneshot::Receiver<Result<(), String>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        queue.waiters.push(tx);
        queue.since.get_or_insert_with(std::time::Instant::now);
        queue.urgent |= urgent;
        if !queue.flushing {
            queue.flushing = true;
            tokio::spawn(self.0.clone().flush_queue());
        }
        if queue.urgent || queue.full() {
            self.wake.notify_one();
        }
        rx
    }

    /// Take back what [`Graph::defer`] or [`Graph::record`] recorded for
    /// chunks that were not stored after all (a dropped near-duplicate, a
    /// refused id): each chunk's id leaves the rows it was recorded in, and
    /// a row left with none goes. Mentions and relations still queued are
    /// taken out of the queue, so they never reach the tables; what an
    /// earlier commit wrote is taken out by the next one, which reads those
    /// rows with its own. So the caller does not wait for a commit of its
    /// own (the future resolves when the next group commit is done), and
    /// the rows held in memory lose the references at once.
    pub fn retract(
        &self,
        chunks: &[(String, ChunkRefs)],
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let listed = |pick: fn(&ChunkRefs) -> &Vec<String>| -> Vec<(String, String)> {
            chunks
                .iter()
                .flat_map(|(chunk, refs)| pick(refs).iter().map(|row| (row.clone(), chunk.clone())))
                .collect()
        };
        let strips = Strips {
            entities: listed(|r| &r.entities),
            edges: listed(|r| &r.edges),
        };
        let committed = (!strips.is_empty()).then(|| {
            let mut known = self.known.lock().expect("known entities lock");
            let mut queue = self.queue.lock().expect("graph queue lock");
            let (entities, edges) = (pairs(&strips.entities), pairs(&strips.edges));
            let (taken, left): (Vec<Mention>, Vec<Mention>) = std::mem::take(&mut queue.mentions)
                .into_iter()
                .partition(|m| entities.contains(&(m.entity_id().as_str(), m.chunk_id.as_str())));
            queue.mentions = left;
            queue
                .relations
                .retain(|r| !edges.contains(&(r.edge_id().as_str(), r.chunk_id.as_str())));
            known.unfold(&taken);
            queue.strips.entities.extend(strips.entities);
            queue.strips.edges.extend(strips.edges);
            let joined = self.join(&mut queue, false);
            drop(queue);
            drop(known);
            joined
        });
        committed_by(committed)
    }
}

/// The future of a write that joined the queue (`None`: nothing to write).
async fn committed_by(
    committed: Option<tokio::sync::oneshot::Receiver<Result<(), String>>>,
) -> Result<()> {
    match committed {
        None => Ok(()),
        Some(rx) => match rx.await {
            Ok(result) => result.map_err(StoreError::Graph),
            Err(_) => Err(StoreError::Graph("the graph's flush task stopped".into())),
        },
    }
}

impl GraphTables {
    /// The flush task: commits what is queued, lingering for more unless
    /// asked not to, until the queue is empty.
    async fn flush_queue(self: Arc<Self>) {
        loop {
            let deadline = {
                let queue = self.queue.lock().expect("graph queue lock");
                match queue.since {
                    Some(since) if !queue.urgent && !queue.full() => Some(since + GRAPH_LINGER),
                    _ => None,
                }
            };
            if let Some(deadline) = deadline {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline.into()) => {}
                    _ = self.wake.notified() => {}
                }
            }
            let (mentions, relations, strips, waiters) = {
                let mut queue = self.queue.lock().expect("graph queue lock");
                queue.since = None;
                queue.urgent = false;
                (
                    std::mem::take(&mut queue.mentions),
                    std::mem::take(&mut queue.relations),
                    std::mem::take(&mut queue.strips),
                    std::mem::take(&mut queue.waiters),
                )
            };
            let tables = self.clone();
            let result = match super::maintain::apart_for_graph(async move {
                tables.commit(&mentions, &relations, &strips).await
            })
            .await
            {
                Ok(gone) => self.delete_emptied(gone).await,
                Err(e) => Err(e),
            }
            .map_err(|e| e.to_string());
            for waiter in waiters {
                let _ = waiter.send(result.clone());
            }
            let mut queue = self.queue.lock().expect("graph queue lock");
            if queue.waiters.is_empty() {
                queue.flushing = false;
                return;
            }
        }
    }

    /// Commit what is queued without lingering further (a caller waits for
    /// it without being able to wait here).
    pub fn urge(&self) {
        let mut queue = self.queue.lock().expect("graph queue lock");
        if queue.flushing {
            queue.urgent = true;
            drop(queue);
            self.wake.notify_one();
        }
    }

    /// Wait until everything queued so far is committed (or failed: its
    /// writes are redelivered), so a read of the tables sees it.
    pub async fn settle(&self) {
        let rx = {
            let mut queue = self.queue.lock().expect("graph queue lock");
            if !queue.flushing {
                return;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            queue.waiters.push(tx);
            queue.urgent = true;
            rx
        };
        self.wake.notify_one();
        let _ = rx.await;
    }

    /// Once no tidy pass runs: the store waits for it on closing, so that
    /// no pass is cut off, or left writing into a directory being removed.
    pub async fn tidied(&self) {
        use std::sync::atomic::Ordering;
        loop {
            let idle = self.tidy.idle.notified();
            tokio::pin!(idle);
            // Registered before the check: an end between the two still wakes it.
            idle.as_mut().enable();
            if !self.tidy.running.load(Ordering::Acquire) {
                return;
            }
            idle.await;
        }
    }

    /// Count a commit of `rows` rows. Every [`GRAPH_TIDY_COMMITS`] commits,
    /// or past [`GRAPH_INDEX_REFRESH_ROWS`] rows, a tidy pass in the
    /// background merges both tables' small fragments and folds the new rows
    /// into their indexes (one pass at a time; the batches do not wait).
    async fn written(&self, rows: usize) {
        use std::sync::atomic::Ordering;
        let total = self.unindexed.fetch_add(rows, Ordering::Relaxed) + rows;
        let commits = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        if total < GRAPH_INDEX_REFRESH_ROWS && !commits.is_multiple_of(GRAPH_TIDY_COMMITS) {
            return;
        }
        self.unindexed.store(0, Ordering::Relaxed);
        // A pass asked for while one runs makes that one go round again.
        self.tidy.again.store(true, Ordering::Release);
        if self.tidy.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let tables = [self.entities.clone(), self.edges.clone()];
        let tidy = self.tidy.clone();
        let target = super::maintain::Maintenance::default().target_rows_per_fragment;
        tokio::spawn(async move {
            loop {
                tidy.again.store(false, Ordering::Release);
                let started = std::time::Instant::now();
                for table in &tables {
                    let rows = super::maintain::fragment_rows(table, target).await;
                    if let Err(e) = super::maintain::merge_small_fragments(table, rows).await {
                        tracing::warn!(error = %e, "graph fragment merge failed; will retry");
                    }
                    if let Err(e) = super::maintain::refresh_indexes(table).await {
                        tracing::warn!(error = %e, "graph index refresh failed; will retry");
                    }
                }
                tracing::debug!(took = ?started.elapsed(), "graph tables tidied");
                tidy.running.store(false, Ordering::Release);
                tidy.idle.notify_waiters();
                // Asked again meanwhile, and no other pass took it up.
                if !tidy.again.load(Ordering::Acquire) || tidy.running.swap(true, Ordering::AcqRel)
                {
                    return;
                }
            }
        });
    }

    /// Fold mentions and relations into the tables (one commit each), after
    /// taking out the references `strips` lists from the rows as stored.
    /// A row left with no reference is deleted (a commit of its own, rare:
    /// only a reference an earlier commit wrote can leave a row empty).
    async fn commit(
        &self,
        mentions: &[Mention],
        relations: &[Relation],
        strips: &Strips,
    ) -> Result<Emptied> {
        let started = std::time::Instant::now();
        let mut gone = Emptied::default();
        let _merging = self.merging.lock().await;
        let _gate = self.gate.read().await;
        if !mentions.is_empty() || !strips.entities.is_empty() {
            // Grouped by their row's parts: an id is put together once a row.
            let groups = grouped(mentions, |m| m.row_key());
            let fold = |rows: &mut HashMap<String, EntityRow>| {
                let mut touched = Vec::new();
                for (_, ms) in &groups {
                    let id = ms[0].entity_id();
                    let row = rows.entry(id.clone()).or_insert_with(|| new_entity(ms[0]));
                    fold_mentions(row, ms);
                    touched.push(id);
                }
                touched
            };
            let (kept, emptied) = restate(
                &self.entities,
                entity_rows,
                groups.iter().map(|(_, ms)| ms[0].entity_id()),
                &strips.entities,
                fold,
            )
            .await?;
            gone.entities = emptied.iter().map(|r| r.id.clone()).collect();
            {
                let mut known = self.known.lock().expect("known entities lock");
                for row in &kept {
                    known.remember(row);
                }
                for row in &emptied {
                    known.remove(row);
                }
            }
            self.written(kept.len()).await;
        }
        if !relations.is_empty() || !strips.edges.is_empty() {
            let groups = grouped(relations, |r| r.row_key());
            let fold = |rows: &mut HashMap<String, EdgeRow>| {
                let mut touched = Vec::new();
                for (_, rs) in &groups {
                    let r = rs[0];
                    let id = r.edge_id();
                    let row = rows.entry(id.clone()).or_insert_with(|| EdgeRow {
                        id: id.clone(),
                        stream: r.stream.clone(),
                        source: r.source.clone(),
                        target: r.target.clone(),
                        relation: r.relation.clone(),
                        weight: 0,
                        chunk_ids: Vec::new(),
                        updated_at: r.at,
                    });
                    row.weight +=
                        add_refs(&mut row.chunk_ids, rs.iter().map(|r| r.chunk_id.as_str()));
                    row.updated_at = rs.iter().fold(row.updated_at, |at, r| at.max(r.at));
                    touched.push(id);
                }
                touched
            };
            let (kept, emptied) = restate(
                &self.edges,
                edge_rows,
                groups.iter().map(|(_, rs)| rs[0].edge_id()),
                &strips.edges,
                fold,
            )
            .await?;
            gone.edges = emptied.into_iter().map(|r| r.id).collect();
            self.written(kept.len()).await;
        }
        tracing::debug!(took = ?started.elapsed(), mentions = mentions.len(), relations = relations.len(), "graph committed");
        Ok(gone)
    }

    /// Delete the rows a commit left with no reference. On the caller's
    /// runtime: Lance's delete cannot run on the graph's one-thread runtime
    /// (it drops a runtime of its own inside its futures).
    async fn delete_emptied(&self, gone: Emptied) -> Result<()> {
        if gone.entities.is_empty() && gone.edges.is_empty() {
            return Ok(());
        }
        let _merging = self.merging.lock().await;
        let _gate = self.gate.read().await;
        for (table, ids) in [(&self.entities, &gone.entities), (&self.edges, &gone.edges)] {
            if !ids.is_empty() {
                table.delete(&column_in("id", ids)).await?;
            }
        }
        Ok(())
    }

    /// The entity a name or any alias seen for it stands for in a stream.
    pub async fn entity(&self, stream: &str, name: &str) -> Result<Option<EntityRow>> {
        self.settle().await;
        let key = entity_key(name);
        let mut rows = read_where(
            &self.entities,
            format!("id = {}", sql_str(&format!("{stream}/{key}"))),
            entity_rows,
        )
        .await?;
        if let Some(row) = rows.pop() {
            return Ok(Some(row));
        }
        let all = self.stream_entities(stream).await?;
        Ok(all
            .into_iter()
            .find(|e| e.aliases.iter().any(|a| entity_key(a) == key)))
    }

    /// The entities of these streams whose key is one of `keys`: from memory
    /// for the streams known, else one indexed read.
    pub async fn by_keys(&self, streams: &[String], keys: &[String]) -> Result<Vec<EntityRow>> {
        if streams.is_empty() || keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut unknown = Vec::new();
        for stream in streams {
            match self.known_rows(stream, keys) {
                Some(rows) => out.extend(rows),
                None => unknown.push(stream),
            }
        }
        let caching = self.caching.load(std::sync::atomic::Ordering::Relaxed);
        let mut unread = Vec::new();
        for stream in unknown {
            if caching && self.load_known(stream).await? {
                out.extend(self.known_rows(stream, keys).unwrap_or_default());
            } else {
                unread.push(stream);
            }
        }
        let ids: Vec<String> = unread
            .iter()
            .flat_map(|s| keys.iter().map(move |k| format!("{s}/{k}")))
            .collect();
        if !ids.is_empty() {
            self.settle().await;
            out.extend(read_where(&self.entities, column_in("id", &ids), entity_rows).await?);
        }
        Ok(out)
    }

    /// Every entity row of a stream.
    async fn stream_entities(&self, stream: &str) -> Result<Vec<EntityRow>> {
        read_where(
            &self.entities,
            format!("stream = {}", sql_str(stream)),
            entity_rows,
        )
        .await
    }

    /// The rows of `keys` in a known stream (None: not known).
    fn known_rows(&self, stream: &str, keys: &[String]) -> Option<Vec<EntityRow>> {
        let known = self.known.lock().expect("known entities lock");
        let rows = known.streams.get(stream)?;
        Some(keys.iter().filter_map(|k| rows.get(k).cloned()).collect())
    }

    /// Read a stream's entities into memory; false when they do not fit.
    async fn load_known(&self, stream: &str) -> Result<bool> {
        // No commit lands between the read and the install. Mentions still
        // queued are folded in here; those a commit has taken from the queue
        // but not written yet arrive when it writes them.
        let _merging = self.merging.lock().await;
        let rows = self.stream_entities(stream).await?;
        let mut known = self.known.lock().expect("known entities lock");
        if !known.install(stream, rows) {
            return Ok(false);
        }
        let queue = self.queue.lock().expect("graph queue lock");
        known.fold(queue.mentions.iter().filter(|m| m.stream == stream));
        Ok(true)
    }

    /// Rows were written by some other way than [`Graph::record`] (a restore,
    /// a rollback): what is held in memory goes, to be read again.
    pub fn forget_known(&self) {
        *self.known.lock().expect("known entities lock") = Known::default();
    }

    /// Hold no entities in memory (other processes write the tables too).
    pub fn without_cache(&self) {
        self.caching
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.forget_known();
    }

    /// Edges touching an entity key in a stream.
    pub async fn edges_of(&self, stream: &str, key: &str) -> Result<Vec<EdgeRow>> {
        self.settle().await;
        read_where(
            &self.edges,
            format!(
                "stream = {} AND (source = {k} OR target = {k})",
                sql_str(stream),
                k = sql_str(key)
            ),
            edge_rows,
        )
        .await
    }

    /// Drop the entity and edge rows matching a filter (a stream scope);
    /// returns how many went.
    pub async fn delete(&self, filter: &Filter) -> Result<usize> {
        self.settle().await;
        let _gate = self.gate.read().await;
        let mut n = 0;
        for table in [&self.entities, &self.edges] {
            n += table.count_rows(filter.sql()).await?;
            table.delete(&filter.predicate()).await?;
        }
        self.forget_known();
        Ok(n)
    }

    /// Take chunk references out of the rows `predicate` selects: `gone(row
    /// id, chunk id)` says which go; a row's count goes down with them, and a
    /// row left with none is deleted (its name came only from those chunks).
    /// Returns the entity rows kept and deleted. The caller holds `merging`.
    async fn strip_refs(
        &self,
        entities: Option<String>,
        edges: Option<String>,
        gone: impl Fn(&str, &str) -> bool,
    ) -> Result<(Vec<EntityRow>, Vec<EntityRow>)> {
        let (mut kept, mut dropped) = (Vec::new(), Vec::new());
        if let Some(predicate) = entities {
            for mut row in read_where(&self.entities, predicate, entity_rows).await? {
                if !row.unref(&gone) {
                    continue;
                }
                match row.is_unreferenced() {
                    true => dropped.push(row),
                    false => kept.push(row),
                }
            }
            upsert(&self.entities, &kept).await?;
            if !dropped.is_empty() {
                let ids: Vec<&str> = dropped.iter().map(|r| r.id.as_str()).collect();
                self.entities.delete(&column_in("id", &ids)).await?;
            }
        }
        if let Some(predicate) = edges {
            let (mut keep, mut drop) = (Vec::new(), Vec::new());
            for mut row in read_where(&self.edges, predicate, edge_rows).await? {
                if !row.unref(&gone) {
                    continue;
                }
                match row.is_unreferenced() {
                    true => drop.push(row.id),
                    false => keep.push(row),
                }
            }
            upsert(&self.edges, &keep).await?;
            if !drop.is_empty() {
                self.edges.delete(&column_in("id", &drop)).await?;
            }
        }
        Ok((kept, dropped))
    }

    /// Forget deleted memories of `stream`: their ids leave every entity's and
    /// edge's `chunk_ids`, and a row left with none is dropped (its name came
    /// only from deleted text).
    pub async fn forget_chunks(&self, stream: &str, ids: &[String]) -> Result<()> {
        self.settle().await;
        let _merging = self.merging.lock().await;
        let _gate = self.gate.read().await;
        let gone: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
        let scope = Filter::new().stream(stream).predicate();
        self.strip_refs(Some(scope.clone()), Some(scope), |_, chunk| {
            gone.contains(chunk)
        })
        .await?;
        self.known
            .lock()
            .expect("known entities lock")
            .forget(stream);
        Ok(())
    }

    /// Entities and edges counted over the given streams (None = all).
    pub async fn stats(&self, scope: &Filter) -> Result<(usize, usize, i64)> {
        self.settle().await;
        let entities = read_where(&self.entities, scope.predicate(), entity_rows).await?;
        let edges = self.edges.count_rows(scope.sql()).await?;
        let refs: i64 = entities.iter().map(|e| e.chunk_count).sum();
        Ok((entities.len(), edges, refs))
    }
}

/// A dictionary entry: canonical name, type, optional category and aliases.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DictionaryEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub entity_type: String,
    /// A group of interchangeable things ("editor", "language"), used to spot updates.
    #[serde(default)]
    pub category: Option<String>,
    #[serde(default)]
    pub aliases: Vec<String>,
}

/// Why a dictionary file was refused: the file, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct DictionaryError {
    pub path: std::path::PathBuf,
    pub message: String,
}

/// The entity dictionary keyed by normalised surface form.
#[derive(Debug, Clone, Default)]
pub struct Dictionary {
    pub by_key: BTreeMap<String, Arc<DictionaryEntry>>,
    /// The longest surface form, in words (for n-gram lookup).
    pub max_words: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DictionaryFile {
    entity: Vec<DictionaryEntry>,
}

impl Dictionary {
    /// The entries of `file` (relative to `dir`, `[[entity]]` tables) plus `inline`.
    pub fn load(
        dir: &std::path::Path,
        file: Option<&str>,
        inline: Vec<DictionaryEntry>,
    ) -> Result<Dictionary, DictionaryError> {
        let mut entries = inline;
        if let Some(file) = file {
            let path = dir.join(file);
            let fail = |message: String| DictionaryError {
                path: path.clone(),
                message,
            };
            let text = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
            let parsed: DictionaryFile = toml::from_str(&text).map_err(|e| fail(e.to_string()))?;
            entries.extend(parsed.entity);
        }
        Ok(Dictionary::new(entries))
    }

    pub fn new(entries: Vec<DictionaryEntry>) -> Dictionary {
        let mut d = Dictionary::default();
        for e in entries {
            let e = Arc::new(e);
            for surface in std::iter::once(&e.name).chain(&e.aliases) {
                d.max_words = d.max_words.max(surface.split_whitespace().count());
                d.by_key.insert(entity_key(surface), e.clone());
            }
        }
        d
    }

    pub fn get(&self, key: &str) -> Option<&Arc<DictionaryEntry>> {
        self.by_key.get(key)
    }

    /// Whether some key starts with `prefix`: one ordered lookup, where an
    /// n-gram search would try each length.
    pub fn has_key_starting(&self, prefix: &str) -> bool {
        use std::ops::Bound;
        self.by_key
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .next()
            .is_some_and(|(key, _)| key.starts_with(prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_found_only_where_some_key_starts_with_it() {
        let entry = |name: &str, aliases: &[&str]| DictionaryEntry {
            name: name.into(),
            entity_type: "TOOL".into(),
            category: None,
            aliases: aliases.iter().map(|a| a.to_string()).collect(),
        };
        let d = Dictionary::new(vec![
            entry("VS Code", &["Visual Studio Code"]),
            entry("Vim", &[]),
        ]);
        for (prefix, expected) in [
            ("vs", true),
            ("vscode", true),
            ("visualstudio", true),
            ("vim", true),
            ("v", true),
            ("", true),
            ("vscodex", false),
            ("vi m", false),
            ("a", false),
            ("zed", false),
        ] {
            assert_eq!(d.has_key_starting(prefix), expected, "{prefix:?}");
        }
        assert!(!Dictionary::new(Vec::new()).has_key_starting(""));
    }

    #[test]
    fn references_are_added_once_in_order_and_the_oldest_go_past_the_cap() {
        let ids = |r: std::ops::Range<usize>| r.map(|i| format!("c{i}")).collect::<Vec<_>>();
        // A few ids (a scan) and many (a set) give the same answer.
        for batch in [2, 40] {
            let mut list = ids(0..10);
            let mut adding: Vec<String> = ids(8..8 + batch);
            adding.push("c9".into());
            adding.push(format!("c{}", 7 + batch));
            let added = add_refs(&mut list, adding.iter().map(String::as_str));
            assert_eq!(added, batch as i64 - 2, "batch {batch}");
            assert_eq!(list, ids(0..8 + batch), "batch {batch}");
        }
        let mut list = ids(0..MAX_CHUNK_REFS);
        let added = add_refs(&mut list, ["c5", "n1", "n2", "c0"]);
        assert_eq!(added, 2);
        assert_eq!(list.len(), MAX_CHUNK_REFS);
        assert_eq!(list[0], "c2");
        assert_eq!(
            list[MAX_CHUNK_REFS - 2..],
            ["n1".to_string(), "n2".to_string()]
        );
    }

    #[test]
    fn mentions_of_one_entity_fold_into_its_row_together() {
        let m = |chunk: &str, surface: &str, at: Micros| Mention {
            stream: "s".into(),
            key: "alice".into(),
            name: "Alice".into(),
            entity_type: "person".into(),
            surface: surface.into(),
            chunk_id: chunk.into(),
            at,
        };
        let mentions = [m("a", "Alice", 5), m("b", "alice", 3), m("a", "Al", 9)];
        let groups = grouped(&mentions, |m| m.entity_id());
        assert_eq!(groups.len(), 1);
        let mut row = new_entity(&mentions[0]);
        fold_mentions(&mut row, &groups[0].1);
        assert_eq!(row.chunk_ids, ["a", "b"]);
        assert_eq!(row.chunk_count, 2);
        assert_eq!(row.aliases, ["alice", "Al"]);
        assert_eq!((row.first_seen, row.last_seen), (3, 9));
    }

    /// The column-by-column batches are the batches the JSON path builds,
    /// and read back as the rows they were built from.
    #[test]
    fn graph_rows_build_the_batches_the_json_path_builds() {
        let entities = vec![
            EntityRow {
                id: "s/alice".into(),
                stream: "s".into(),
                key: "alice".into(),
                name: "Alice".into(),
                entity_type: "PERSON".into(),
                aliases: vec!["Ali".into(), "Алиса".into()],
                chunk_ids: (0..3).map(|i| format!("c{i}")).collect(),
                chunk_count: 3,
                first_seen: 1,
                last_seen: 1_700_000_000_000_000,
            },
            EntityRow {
                id: "s/bob".into(),
                stream: "s".into(),
                key: "bob".into(),
                name: "Bob".into(),
                entity_type: "PERSON".into(),
                aliases: vec![],
                chunk_ids: vec!["c9".into()],
                chunk_count: 1,
                first_seen: 5,
                last_seen: 6,
            },
        ];
        let built = entity_batch(&entities).unwrap();
        assert_eq!(built, rows_to_batch(entity_schema(), &entities).unwrap());
        assert_eq!(entity_rows(&built), entities);
        let edges = vec![EdgeRow {
            id: "s/alice/uses/vim".into(),
            stream: "s".into(),
            source: "alice".into(),
            target: "vim".into(),
            relation: "uses".into(),
            weight: 2,
            chunk_ids: vec!["c1".into(), "c2".into()],
            updated_at: 7,
        }];
        let built = edge_batch(&edges).unwrap();
        assert_eq!(built, rows_to_batch(edge_schema(), &edges).unwrap());
        assert_eq!(edge_rows(&built), edges);
    }

    #[test]
    fn keys_fold_case_spacing_and_punctuation() {
        assert_eq!(entity_key("VS Code"), "vscode");
        assert_eq!(entity_key("VSCode"), "vscode");
        assert_eq!(entity_key("vscode"), "vscode");
        assert_eq!(entity_key("Node.js"), "nodejs");
        assert_ne!(entity_key("Alice"), entity_key("Alicia"));
        assert_eq!(entity_key("Zoë's Café"), "zoëscafé");
        assert_eq!(entity_key("İstanbul"), "i\u{307}stanbul");
    }

    proptest::proptest! {
        /// The ASCII path keys a text as the char-by-char fold does.
        #[test]
        fn ascii_keys_are_the_unicode_fold(name in "[ -~]{0,40}") {
            proptest::prop_assert_eq!(entity_key(&name), folded_key(&name));
        }
    }

    #[test]
    fn dictionary_maps_aliases_to_their_entry() {
        let d = Dictionary::new(vec![DictionaryEntry {
            name: "VS Code".into(),
            entity_type: "TECHNOLOGY".into(),
            category: Some("editor".into()),
            aliases: vec!["Visual Studio Code".into()],
        }]);
        assert_eq!(d.get("visualstudiocode").unwrap().name, "VS Code");
        assert_eq!(d.get("vscode").unwrap().name, "VS Code");
        assert_eq!(d.max_words, 3);
    }

    fn mention(stream: &str, key: &str, chunk: &str) -> Mention {
        Mention {
            stream: stream.into(),
            key: key.into(),
            name: key.into(),
            entity_type: "PERSON".into(),
            surface: key.into(),
            chunk_id: chunk.into(),
            at: 10,
        }
    }

    /// Alice co-occurring with `target` in `chunk`, in stream `a`.
    fn co_occurs(target: &str, chunk: &str) -> Relation {
        Relation {
            stream: "a".into(),
            source: "alice".into(),
            target: target.into(),
            relation: "co_occurs".into(),
            chunk_id: chunk.into(),
            at: 10,
        }
    }

    /// A store whose graph holds Alice in stream `a` (chunk `c0`), committed.
    async fn with_alice() -> (tempfile::TempDir, crate::store::Store) {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(tmp.path(), 4, 100).await.unwrap();
        store
            .graph
            .record(&[mention("a", "alice", "c0")], &[])
            .await
            .unwrap();
        (tmp, store)
    }

    /// The versions of the entities and edges tables.
    async fn versions(graph: &Graph) -> (u64, u64) {
        (
            graph.entities.version().await.unwrap(),
            graph.edges.version().await.unwrap(),
        )
    }

    /// With the store's maintainer off, a long run of one-mention batches
    /// (a fragment each) still ends in a few fragments, merged by the tidy
    /// passes the graph starts itself.
    #[tokio::test]
    async fn many_small_graph_commits_are_merged_as_they_come() {
        let tmp = tempfile::tempdir().unwrap();
        let location = crate::store::Location::local(tmp.path());
        let off = crate::store::maintain::Maintenance::off();
        let store = crate::store::Store::open_with(&location, 4, 100, None, off)
            .await
            .unwrap();
        let graph = &store.graph;
        let commits = 4 * GRAPH_TIDY_COMMITS;
        for i in 0..commits {
            let name = format!("person{i}");
            graph
                .record(&[mention("a", &name, &format!("c{i}"))], &[])
                .await
                .unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let fragments = graph
                .entities
                .stats()
                .await
                .unwrap()
                .fragment_stats
                .num_fragments;
            if fragments <= 2 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{fragments} fragments after {commits} commits"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let rows = read_where(&graph.entities, "stream = 'a'".to_string(), entity_rows)
            .await
            .unwrap();
        assert_eq!(rows.len(), commits, "every entity kept through the merges");
    }

    /// One entity mentioned in commit after commit, while the tidy passes
    /// those commits start merge the table's fragments: each commit replaces
    /// the row, so the table holds it once, with every reference (a commit
    /// that met a pass's merge read the row again).
    #[tokio::test]
    async fn a_row_restated_beside_tidy_passes_stays_one_row_with_every_reference() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(tmp.path(), 4, 100).await.unwrap();
        let graph = &store.graph;
        let commits = 3 * GRAPH_TIDY_COMMITS;
        for i in 0..commits {
            graph
                .record(&[mention("a", "alice", &format!("c{i}"))], &[])
                .await
                .unwrap();
        }
        graph.tidied().await;
        let rows = read_where(&graph.entities, "stream = 'a'".to_string(), entity_rows)
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].chunk_count, commits as i64);
        let want: Vec<String> = (0..commits).map(|i| format!("c{i}")).collect();
        assert_eq!(rows[0].chunk_ids, want);
    }

    /// Closing the store waits for the tidy pass its commits started.
    #[tokio::test]
    async fn closing_waits_for_the_tidy_pass() {
        use std::sync::atomic::Ordering;
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(tmp.path(), 4, 100).await.unwrap();
        for i in 0..GRAPH_TIDY_COMMITS {
            let name = format!("person{i}");
            store
                .graph
                .record(&[mention("a", &name, &format!("c{i}"))], &[])
                .await
                .unwrap();
        }
        store.close().await;
        assert!(!store.graph.tidy.running.load(Ordering::Acquire));
        // Nothing runs: it answers at once.
        store.graph.tidied().await;
    }

    /// The pipeline's graph rows queued by several batches land in one
    /// commit of each table; until then the rows held in memory and every
    /// read of the tables already see them.
    #[tokio::test]
    async fn queued_batches_are_committed_together_and_read_before() {
        let (_tmp, store) = with_alice().await;
        let graph = &store.graph;
        let streams = vec!["a".to_string()];
        let keys: Vec<String> = ["alice", "bob"].map(String::from).to_vec();
        assert_eq!(graph.by_keys(&streams, &keys).await.unwrap().len(), 1);
        let before = versions(graph).await;
        let edge = |chunk: &str| co_occurs("bob", chunk);
        // Queued with no await between them: the flush task cannot run yet.
        let first = graph.defer(vec![mention("a", "alice", "c1")], vec![edge("c1")]);
        let second = graph.defer(vec![mention("a", "bob", "c2")], vec![edge("c2")]);
        let third = graph.defer(vec![mention("b", "carol", "c3")], vec![]);
        let mut held = graph.by_keys(&streams, &keys).await.unwrap();
        held.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(
            held.iter()
                .map(|r| (r.key.as_str(), r.chunk_ids.clone()))
                .collect::<Vec<_>>(),
            [
                ("alice", vec!["c0".to_string(), "c1".to_string()]),
                ("bob", vec!["c2".to_string()])
            ],
            "the rows held take queued mentions at once"
        );
        let carol = graph
            .entity("b", "Carol")
            .await
            .unwrap()
            .expect("a read waits for the queue");
        assert_eq!(carol.chunk_ids, ["c3"]);
        let edges = graph.edges_of("a", "bob").await.unwrap();
        assert_eq!((edges.len(), edges[0].weight), (1, 2), "{edges:?}");
        for committed in [first, second, third] {
            committed.await.unwrap();
        }
        let after = versions(graph).await;
        assert_eq!(
            after,
            (before.0 + 1, before.1 + 1),
            "one commit of each table"
        );
        let mut table = read_where(&graph.entities, "stream = 'a'".to_string(), entity_rows)
            .await
            .unwrap();
        table.sort_by(|x, y| x.id.cmp(&y.id));
        let mut held = graph.by_keys(&streams, &keys).await.unwrap();
        held.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(held, table, "the rows held are the table's");
    }

    /// A retraction of rows still queued takes them out of the queue: they
    /// never reach the tables, the rows held in memory lose them at once,
    /// and it costs no commit of its own; a chunk recorded again after its
    /// retraction keeps its reference.
    #[tokio::test]
    async fn a_retraction_of_queued_rows_joins_the_group_commit() {
        let (_tmp, store) = with_alice().await;
        let graph = &store.graph;
        let streams = vec!["a".to_string()];
        let keys: Vec<String> = ["alice", "bob", "dave"].map(String::from).to_vec();
        graph.by_keys(&streams, &keys).await.unwrap();
        let before = versions(graph).await;
        let edge = |chunk: &str| co_occurs("dave", chunk);
        // Queued with no await between them: the flush task cannot run yet.
        let kept = graph.defer(vec![mention("a", "bob", "c1")], vec![]);
        let dropped = graph.defer(
            vec![mention("a", "alice", "c2"), mention("a", "dave", "c2")],
            vec![edge("c2")],
        );
        let refs = ChunkRefs {
            entities: vec!["a/alice".into(), "a/dave".into()],
            edges: vec![edge("c2").edge_id()],
        };
        let retracted = graph.retract(&[("c2".into(), refs)]);
        let held = graph.by_keys(&streams, &keys).await.unwrap();
        let mut ids: Vec<(String, Vec<String>)> = held
            .iter()
            .map(|r| (r.key.clone(), r.chunk_ids.clone()))
            .collect();
        ids.sort();
        assert_eq!(
            ids,
            [
                ("alice".to_string(), vec!["c0".to_string()]),
                ("bob".to_string(), vec!["c1".to_string()])
            ],
            "the rows held lose the retracted references at once"
        );
        // The same chunk recorded again after its retraction.
        let again = graph.defer(vec![mention("a", "alice", "c2")], vec![]);
        for committed in [kept, dropped, again] {
            committed.await.unwrap();
        }
        retracted.await.unwrap();
        let after = versions(graph).await;
        assert_eq!(
            after,
            (before.0 + 1, before.1),
            "one commit of the entities, none of the edges"
        );
        let mut table = read_where(&graph.entities, "stream = 'a'".to_string(), entity_rows)
            .await
            .unwrap();
        table.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(
            table
                .iter()
                .map(|r| (r.key.as_str(), r.chunk_ids.clone(), r.chunk_count))
                .collect::<Vec<_>>(),
            [
                ("alice", vec!["c0".to_string(), "c2".to_string()], 2),
                ("bob", vec!["c1".to_string()], 1)
            ]
        );
        assert!(graph.edges_of("a", "dave").await.unwrap().is_empty());
        let mut held = graph.by_keys(&streams, &keys).await.unwrap();
        held.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(held, table, "the rows held are the table's");
    }

    /// The entities held in memory answer as a fresh read of the table does,
    /// after every kind of write.
    #[tokio::test]
    async fn known_entities_follow_every_write() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(tmp.path(), 4, 100).await.unwrap();
        let graph = &store.graph;
        // A stream's entities are read through a bitmap on `stream`.
        for table in [&graph.entities, &graph.edges] {
            let indexed: Vec<Vec<String>> = table
                .list_indices()
                .await
                .unwrap()
                .into_iter()
                .map(|i| i.columns)
                .collect();
            assert!(indexed.contains(&vec!["stream".to_string()]), "{indexed:?}");
        }
        let streams = vec!["a".to_string(), "b".to_string()];
        let keys: Vec<String> = ["alice", "bob", "carol", "dave"].map(String::from).to_vec();
        let agree = |round: &'static str| {
            let (streams, keys) = (streams.clone(), keys.clone());
            async move {
                let mut held = graph.by_keys(&streams, &keys).await.unwrap();
                let ids: Vec<String> = streams
                    .iter()
                    .flat_map(|s| keys.iter().map(move |k| format!("{s}/{k}")))
                    .collect();
                let mut table = read_where(&graph.entities, column_in("id", &ids), entity_rows)
                    .await
                    .unwrap();
                held.sort_by(|x, y| x.id.cmp(&y.id));
                table.sort_by(|x, y| x.id.cmp(&y.id));
                assert_eq!(held, table, "{round}");
                held
            }
        };
        graph
            .record(
                &[mention("a", "alice", "c1"), mention("b", "bob", "c2")],
                &[],
            )
            .await
            .unwrap();
        assert_eq!(agree("first read").await.len(), 2);
        assert!(graph.known.lock().unwrap().streams.contains_key("a"));
        // New mentions reach the rows held in memory.
        graph
            .record(
                &[mention("a", "alice", "c3"), mention("a", "carol", "c3")],
                &[],
            )
            .await
            .unwrap();
        let rows = agree("after a merge").await;
        let alice = rows.iter().find(|r| r.id == "a/alice").unwrap();
        assert_eq!(alice.chunk_ids, ["c1", "c3"]);
        assert_eq!(alice.chunk_count, 2);
        // Forgetting memories, deleting a stream's rows, a rollback.
        let held_refs = |g: &Graph| {
            let k = g.known.lock().unwrap();
            let counted: usize = k
                .streams
                .values()
                .flat_map(|rows| rows.values())
                .map(|r| r.chunk_ids.len())
                .sum();
            (k.refs, counted)
        };
        let (refs, counted) = held_refs(graph);
        assert_eq!(refs, counted, "the size measure follows merges");
        graph.forget_chunks("a", &["c1".to_string()]).await.unwrap();
        let (refs, counted) = held_refs(graph);
        assert_eq!(
            refs, counted,
            "a forgotten stream's references leave the measure"
        );
        assert_eq!(
            agree("after forgetting")
                .await
                .iter()
                .find(|r| r.id == "a/alice")
                .unwrap()
                .chunk_ids,
            ["c3"]
        );
        // A write taken back: its references go, a row left empty goes, and
        // the stream stays held.
        graph
            .record(
                &[mention("a", "alice", "c9"), mention("a", "dave", "c9")],
                &[],
            )
            .await
            .unwrap();
        assert_eq!(agree("before a retraction").await.len(), 4);
        let refs = ChunkRefs {
            entities: vec!["a/alice".into(), "a/dave".into()],
            edges: Vec::new(),
        };
        graph.retract(&[("c9".into(), refs)]).await.unwrap();
        let rows = agree("after a retraction").await;
        assert_eq!(rows.len(), 3, "{rows:?}");
        let alice = rows.iter().find(|r| r.id == "a/alice").unwrap();
        assert_eq!(
            (alice.chunk_ids.clone(), alice.chunk_count),
            (vec!["c3".to_string()], 1)
        );
        assert!(graph.known.lock().unwrap().streams.contains_key("a"));
        let (refs, counted) = held_refs(graph);
        assert_eq!(refs, counted, "a retraction keeps the measure true");
        graph.delete(&Filter::new().stream("b")).await.unwrap();
        assert_eq!(agree("after a delete").await.len(), 2);
        graph
            .entities
            .delete(&column_in("id", ["a/carol"]))
            .await
            .unwrap();
        graph.forget_known();
        assert_eq!(agree("after a write past the graph").await.len(), 1);
    }

    #[test]
    fn rows_serialise_into_the_schema() {
        let row = EdgeRow {
            id: "s/a/uses/b".into(),
            stream: "s".into(),
            source: "a".into(),
            target: "b".into(),
            relation: "uses".into(),
            weight: 2,
            chunk_ids: vec!["c1".into()],
            updated_at: 1_700_000_000_000_000,
        };
        let batch = rows_to_batch(edge_schema(), std::slice::from_ref(&row)).unwrap();
        assert_eq!(edge_rows(&batch), vec![row]);
    }
}
