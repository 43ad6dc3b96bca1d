//! The one writer of the `chunks` table. Upserts that arrive together are folded
//! into a single `merge_insert` (one Lance commit); deletes keep their place in
//! the order of operations.

use std::collections::HashMap;

use lancedb::Table;
use tokio::sync::{mpsc, oneshot};

use std::sync::Arc;

use super::hot::HotIndex;
use super::maintain::{
    merge_in_tiers, refresh_indexes_routinely, Maintenance, Reach, RefreshScope,
};
use super::{batch_reader, Result, StoreError};
use crate::core::model::Chunk;

/// A change applied to a chunk as it is when the writer reaches it; returns
/// whether it changed anything.
pub type Modifier = Box<dyn FnMut(&mut Chunk) -> bool + Send>;

enum WriteOp {
    Upsert(Vec<Chunk>, oneshot::Sender<Result<()>>),
    /// Append `fresh`, then upsert `rows` and, in the same commit, the side
    /// effects (see [`ChunkWriter::commit_batch`]).
    Commit(WriteBatch, oneshot::Sender<Result<()>>),
    /// Read the chunks with these ids, apply the modifier, write back the changed ones.
    Modify(Vec<String>, Modifier, oneshot::Sender<Result<usize>>),
    /// Add to the access counters of the memories with these ids.
    Touch(Accesses, oneshot::Sender<Result<usize>>),
    /// Delete by predicate; the rows are confined to these streams (None: any).
    Delete(String, Option<Vec<String>>, oneshot::Sender<Result<u64>>),
    /// Everything queued before this is done; stop.
    Close(oneshot::Sender<()>),
}

/// Accesses to count, by memory id: how many, and the latest.
pub type Accesses = HashMap<String, (i64, crate::core::model::Micros)>;

/// A pipeline batch's write.
#[derive(Debug, Default)]
pub struct WriteBatch {
    /// Rows no stored row can share an id with.
    pub fresh: Vec<Chunk>,
    /// Rows that may replace stored ones.
    pub rows: Vec<Chunk>,
    /// Changes to other memories (supersessions, merged sources).
    pub side: Vec<Chunk>,
    /// Refuse the whole write when one of `rows` would overwrite another
    /// stream's memory or an immutable one ([`StoreError::Refused`]).
    pub refuse: bool,
    /// The batch's history (supersessions and their reasons), appended to
    /// the history table beside the chunk writes, once the batch is not
    /// refused.
    pub history: Vec<super::HistoryRow>,
}

/// A write refused ([`StoreError::Refused`]): the owners of the memories
/// it would have overwritten, and the write, unwritten, as it was given
/// (its rows were moved into it, not copied).
#[derive(Debug)]
pub struct Refusal {
    pub owners: HashMap<String, super::Owner>,
    pub batch: WriteBatch,
}

pub struct ChunkWriter {
    tx: mpsc::Sender<WriteOp>,
    known: Arc<KnownIds>,
    placed: Arc<super::moving::Placed>,
    /// New and replaced rows committed since the writer started.
    written: std::sync::atomic::AtomicU64,
}

/// The ids the table may hold, as 64-bit hashes, so that a row whose id
/// nobody stored is appended without a lookup. Built from the table when
/// the writer first needs it; every write adds its ids before it commits (a
/// failed commit leaves hashes behind, which costs a lookup, never a wrong
/// answer), and deletes leave theirs. A rollback brings back rows the set
/// may not know, so it drops the set, to be built again. About 16 bytes a
/// memory.
#[derive(Default)]
pub struct KnownIds {
    hasher: std::hash::RandomState,
    hashes: std::sync::Mutex<Option<std::collections::HashSet<u64>>>,
}

impl KnownIds {
    fn hash(&self, id: &str) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(id)
    }

    /// Forget every id (the table was rolled back).
    pub fn forget(&self) {
        *self.hashes.lock().expect("known ids lock") = None;
    }

    /// Record ids about to be written, when the set is built.
    fn add<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        if let Some(set) = self.hashes.lock().expect("known ids lock").as_mut() {
            set.extend(ids.into_iter().map(|id| self.hash(id)));
        }
    }

    /// The ids among `ids` the table may hold (all of them when the set
    /// cannot be built): only these need a lookup.
    async fn maybe_stored<'a>(&self, table: &Table, ids: Vec<&'a str>) -> Vec<&'a str> {
        if self.hashes.lock().expect("known ids lock").is_none() {
            match super::scan_ids(table, &super::Filter::new()).await {
                Ok(all) => {
                    let set = all.iter().map(|id| self.hash(id)).collect();
                    *self.hashes.lock().expect("known ids lock") = Some(set);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the stored ids; looking each write up");
                    return ids;
                }
            }
        }
        match self.hashes.lock().expect("known ids lock").as_ref() {
            Some(set) => ids
                .into_iter()
                .filter(|id| set.contains(&self.hash(id)))
                .collect(),
            None => ids,
        }
    }
}

impl ChunkWriter {
    pub fn spawn(
        table: Table,
        history: Table,
        dim: usize,
        max_rows: usize,
        maintenance: Maintenance,
        hot: Arc<HotIndex>,
        gate: super::TableGate,
        building: super::maintain::VectorBuild,
    ) -> ChunkWriter {
        let (tx, rx) = mpsc::channel(1024);
        let known = Arc::new(KnownIds::default());
        let placed = Arc::new(super::moving::Placed::default());
        let sink = Sink {
            table,
            history,
            dim,
            hot,
            known: known.clone(),
            placed: placed.clone(),
        };
        tokio::spawn(run(sink, max_rows, maintenance, gate, building, rx));
        ChunkWriter {
            tx,
            known,
            placed,
            written: Default::default(),
        }
    }

    /// New and replaced rows committed since the writer started (pipeline
    /// batches and upserts): how fast rows arrive.
    pub fn rows_written(&self) -> u64 {
        self.written.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn count(&self, rows: usize) {
        self.written
            .fetch_add(rows as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// The table was rolled back: the ids it holds, and where its rows lie,
    /// are not known any more.
    pub fn forget_ids(&self) {
        self.known.forget();
        self.placed.forget();
    }

    pub async fn upsert(&self, chunks: Vec<Chunk>) -> Result<()> {
        if chunks.is_empty() {
            return Ok(());
        }
        let rows = chunks.len();
        self.ask(|done| WriteOp::Upsert(chunks, done)).await?;
        self.count(rows);
        Ok(())
    }

    /// Append `fresh` — rows no stored row can share an id with (ids the
    /// server minted, on their first delivery) — and those of `rows` whose
    /// ids no stored row has (looked up here, in the writer, so no other
    /// write can store one meanwhile): an append costs no join against the
    /// table. Then upsert the rest of `rows` and apply `side` — changes a
    /// pipeline stage made to other, already stored memories (a supersession,
    /// a duplicate's merged sources) — in one commit. A side effect is
    /// rebased on the memory as it is when the writer reaches it: only its
    /// lifecycle fields (`superseded_by`, `valid_until`, `updated_at`) and its
    /// `extraction_meta` keys are taken, so a concurrent change to anything
    /// else (LLM entities, a new vector) is kept. A side effect on a memory
    /// no longer stored (deleted since the stage read it) is dropped: the
    /// delete wins, and the copy a stage holds may lack the vector. With
    /// `refuse`, nothing is written
    /// when one of `rows` would overwrite another stream's memory or an
    /// immutable one: the error names their owners.
    pub async fn commit_batch(&self, batch: WriteBatch) -> Result<()> {
        if batch.fresh.is_empty() && batch.rows.is_empty() && batch.side.is_empty() {
            return Ok(());
        }
        let rows = batch.fresh.len() + batch.rows.len();
        self.ask(|done| WriteOp::Commit(batch, done)).await?;
        self.count(rows);
        Ok(())
    }

    pub async fn delete(&self, predicate: String, streams: Option<Vec<String>>) -> Result<u64> {
        self.ask(|done| WriteOp::Delete(predicate, streams, done))
            .await
    }

    /// Apply `modify` to the current version of each chunk in `ids` and write the
    /// changed ones in one commit. Runs inside the writer, so no other write can
    /// land between the read and the write. Returns how many changed.
    pub async fn modify(&self, ids: Vec<String>, modify: Modifier) -> Result<usize> {
        if ids.is_empty() {
            return Ok(0);
        }
        self.ask(|done| WriteOp::Modify(ids, modify, done)).await
    }

    /// Add `accesses` to the access counters of the memories they name
    /// (those since deleted are skipped); returns how many changed. Only
    /// the two counter columns are written (see [`Sink::touch`]).
    pub async fn touch(&self, accesses: Accesses) -> Result<usize> {
        if accesses.is_empty() {
            return Ok(0);
        }
        self.ask(|done| WriteOp::Touch(accesses, done)).await
    }

    /// Queue `op` (made with the sender of its answer) and wait for the answer.
    async fn ask<T>(&self, op: impl FnOnce(oneshot::Sender<Result<T>>) -> WriteOp) -> Result<T> {
        let (done, rx) = oneshot::channel();
        self.tx
            .send(op(done))
            .await
            .map_err(|_| StoreError::WriterGone)?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Finish every queued write, then stop; later writes fail with `WriterGone`.
    pub async fn close(&self) {
        let (done, rx) = oneshot::channel();
        if self.tx.send(WriteOp::Close(done)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

/// How much more a small commit counts towards the next fragment merge than a
/// bulk one.
const BIG_COMMIT_WEIGHT: usize = 8;

/// Rows written since the last index refresh that start the next one (rows
/// the indexes do not cover are searched and joined flat: a merge on `id`
/// reads every column of every row the `id` index does not cover, so a bulk
/// import whose batches supersede stored memories merged in 36 µs a record
/// at 10,000 and 21 at 2,048, the refreshes running beside the writer)...
const INDEX_REFRESH_ROWS: usize = 2_048;
/// ...or fewer, down to this many, once `INDEX_REFRESH_QUIET` has passed since
/// the last refresh began: small stores written a memory at a time get their
/// rows indexed within seconds.
const INDEX_REFRESH_MIN_ROWS: usize = 500;
const INDEX_REFRESH_QUIET: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the writer's commits go: the table, and the hot index that follows it.
#[derive(Clone)]
struct Sink {
    table: Table,
    /// The history table, which a pipeline batch's history goes to.
    history: Table,
    dim: usize,
    hot: Arc<HotIndex>,
    known: Arc<KnownIds>,
    /// Where the writer put its last rows (see [`super::moving::Placed`]).
    placed: Arc<super::moving::Placed>,
}

impl Sink {
    /// One `merge_insert` on `id`; when an id repeats, its last version wins.
    /// The hot index learns the rows once they are committed.
    async fn commit<'a>(&self, chunks: impl Iterator<Item = &'a Chunk>) -> Result<()> {
        let mut latest: HashMap<&str, &Chunk> = HashMap::new();
        let mut order: Vec<&str> = Vec::new();
        for c in chunks {
            if latest.insert(&c.id, c).is_none() {
                order.push(&c.id);
            }
        }
        let rows: Vec<Chunk> = order.iter().map(|id| latest[id].clone()).collect();
        let reader = batch_reader(&rows, self.dim)?;
        self.known.add(order.iter().copied());
        let mut merge = self.table.merge_insert(&["id"]);
        merge
            .when_matched_update_all(None)
            .when_not_matched_insert_all();
        merge.execute(reader).await?;
        self.hot.apply(rows);
        Ok(())
    }

    /// Add to access counters. The counters are read, then written alone:
    /// a `merge_insert` whose rows hold only `id`, `access_count` and
    /// `last_accessed_at` updates those columns in place, where writing the
    /// whole rows back (text and vector included) rewrote every searched
    /// memory at each flush: nearly the whole table every 2 s under
    /// closed-loop searchers, and 3 times the time for the same rows.
    async fn touch(&self, accesses: &Accesses) -> Result<usize> {
        use arrow_array::{Int64Array, StringArray, TimestampMicrosecondArray};
        let ids: Vec<&str> = accesses.keys().map(String::as_str).collect();
        let mut rows: Vec<(String, String, i64, Option<crate::core::model::Micros>)> = Vec::new();
        let columns = ["id", "stream", "access_count", "last_accessed_at"];
        super::for_each_by_id(&self.table, &ids, &columns, |c, r| {
            let (Some(id), Some(stream)) = (c.str("id", r), c.str("stream", r)) else {
                return;
            };
            let Some(&(n, at)) = accesses.get(&id) else {
                return;
            };
            let count = c.i64("access_count", r).unwrap_or(0) + n;
            let last = Some(c.time("last_accessed_at", r).unwrap_or(0).max(at));
            rows.push((stream, id, count, last));
        })
        .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        self.merge_columns(
            &["id", "access_count", "last_accessed_at"],
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.1))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
                Arc::new(TimestampMicrosecondArray::from_iter(
                    rows.iter().map(|r| r.3),
                )),
            ],
        )
        .await?;
        self.hot.touch(&rows);
        Ok(rows.len())
    }

    /// Update these columns (`id` first) of the stored rows with these ids;
    /// ids no row has are left out.
    async fn merge_columns(
        &self,
        names: &[&str],
        columns: Vec<arrow_array::ArrayRef>,
    ) -> Result<()> {
        let full = crate::core::model::chunk_schema(self.dim);
        let fields: Vec<arrow_schema::Field> = names
            .iter()
            .map(|n| full.field_with_name(n).cloned())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| StoreError::Lance(lancedb::Error::Arrow { source: e }))?;
        let schema = Arc::new(arrow_schema::Schema::new(fields));
        let batch = arrow_array::RecordBatch::try_new(schema.clone(), columns)
            .map_err(|e| StoreError::Lance(lancedb::Error::Arrow { source: e }))?;
        let mut merge = self.table.merge_insert(&["id"]);
        merge.when_matched_update_all(None);
        merge
            .execute(Box::new(arrow_array::RecordBatchIterator::new(
                vec![Ok(batch)],
                schema,
            )))
            .await?;
        Ok(())
    }

    /// Delete by predicate; the hot index drops the streams it touched
    /// (which rows went is not known one by one).
    async fn delete(&self, predicate: &str, streams: Option<&[String]>) -> Result<u64> {
        let result = self.table.delete(predicate).await;
        self.hot.invalidate(streams);
        Ok(result?.num_deleted_rows)
    }
}

async fn run(
    sink: Sink,
    max_rows: usize,
    maintenance: Maintenance,
    gate: super::TableGate,
    building: super::maintain::VectorBuild,
    mut rx: mpsc::Receiver<WriteOp>,
) {
    let table = &sink.table;
    let mut next: Option<WriteOp> = None;
    let mut since_refresh = 0usize;
    // Whether a write read through the `id` index since the last refresh
    // began (see `RefreshScope::Pressing`).
    let mut by_id = false;
    let mut refresher = Refresher::default();
    // Commits weigh by the fragment they leave: a small one (an agent's store)
    // counts in full, a bulk one (an import batch of a few hundred rows or
    // more, already a fair fragment: `maintain::fair_rows`, 256 of 8,192
    // rows) an eighth, so bulk loads are not slowed by merges they barely
    // need; what they leave is merged once the writer is idle. A bulk
    // import's batches are taken as they arrive, 100 to 2,500 rows each:
    // when those under a quarter of a target fragment counted in full, a
    // 300,000-row import was merged every few dozen commits, and the merges
    // on `id` that supersede stored memories waited for each (README,
    // Benchmarks: "Fuller batches, and fragments merged when the writer
    // rests"). A bar of 64 rows was slower still: the few merges the
    // smallest batches call for pay for themselves.
    let small = super::maintain::fair_rows(maintenance.target_rows_per_fragment);
    let weight = |rows: usize| if rows < small { BIG_COMMIT_WEIGHT } else { 1 };
    let mut since_compact = 0usize;
    let mut merger = Merger::default();
    let mut toucher = Toucher::default();
    // Commits since the last merge weigh at least `at_least` (merges on).
    let owed = |since_compact: usize, at_least: usize| {
        maintenance.compact_every_commits > 0 && since_compact >= at_least.max(1)
    };
    // ...and may be merged now (no vector index build under way).
    let merge_may = |since_compact: usize, at_least: usize| {
        owed(since_compact, at_least) && !building.running()
    };
    // A fragment merge and an index refresh do not run at once: the
    // refresh's commit would preempt the merge's, which would then be done
    // again. A merge that is due and may start waits for a running refresh,
    // and no refresh starts meanwhile or while a merge runs.
    let merge_due = |since_compact: usize| {
        merge_may(
            since_compact,
            maintenance.compact_every_commits * BIG_COMMIT_WEIGHT,
        )
    };
    // Start a merge unless a refresh or an access flush is running; `rested`:
    // the writer is idle, so the merge may climb every tier.
    let start_merge = |merger: &mut Merger, refresher: &Refresher, toucher: &Toucher, rested| {
        !refresher.busy()
            && !toucher.busy()
            && merger.start(table, &gate, maintenance.target_rows_per_fragment, rested)
    };
    loop {
        if merge_due(since_compact) && start_merge(&mut merger, &refresher, &toucher, false) {
            since_compact = 0;
        }
        let refresh_may_start = !merge_due(since_compact) && !merger.busy();
        let unindexed = refresher.lacking(since_refresh);
        let unmerged = owed(since_compact, 1);
        // A running merge may leave a tier to climb.
        let climb = maintenance.compact_every_commits > 0 && (merger.busy() || merger.climb_owed());
        let received = match next.take() {
            Some(op) => Some(op),
            // Rows left unindexed are indexed, fragments left unmerged
            // merged, and tiers left due climbed, once the writer has been
            // idle a while.
            None if unindexed || unmerged || climb => {
                match tokio::time::timeout(INDEX_REFRESH_QUIET, rx.recv()).await {
                    Ok(op) => op,
                    Err(_idle) => {
                        // Idle, any unindexed row is worth a refresh, and
                        // then any fragment left since the last merge. Asked
                        // again now: a refresh started before the wait is
                        // behind until it ends.
                        if refresher.lacking(since_refresh) {
                            if refresh_may_start
                                && refresher.quiet()
                                && refresher.start(table, RefreshScope::Everything)
                            {
                                since_refresh = 0;
                                by_id = false;
                            }
                        } else if merge_may(since_compact, 1)
                            && start_merge(&mut merger, &refresher, &toucher, true)
                        {
                            since_compact = 0;
                        } else if merger.climb_owed() && !building.running() {
                            start_merge(&mut merger, &refresher, &toucher, true);
                        }
                        continue;
                    }
                }
            }
            None => rx.recv().await,
        };
        let Some(op) = received else {
            return;
        };
        // Only appends run beside a fragment merge or an access flush (see
        // `Merger`, `Toucher`); a batch settles them itself before it merges
        // on `id`, and a flush waits for the merge itself.
        if !matches!(op, WriteOp::Commit(..) | WriteOp::Touch(..)) {
            merger.give_way().await;
            toucher.settle().await;
        }
        // One operation at a time under the table gate (a rollback waits for
        // it, and it for a rollback).
        let held = gate.clone().read_owned().await;
        match op {
            WriteOp::Close(done) => {
                let _ = done.send(());
                return;
            }
            WriteOp::Delete(predicate, streams, done) => {
                by_id = true;
                let result = sink.delete(&predicate, streams.as_deref()).await;
                since_compact += BIG_COMMIT_WEIGHT;
                let _ = done.send(result);
            }
            WriteOp::Commit(batch, done) => {
                let started = std::time::Instant::now();
                let result = commit(&sink, batch, &mut merger, &mut toucher).await;
                // A failed commit may have read by id before it failed.
                by_id |= result.as_ref().map_or(true, |c| c.by_id);
                let n = result.as_ref().map_or(0, |c| c.rows);
                if result.is_ok() {
                    let m = crate::core::metrics::metrics();
                    crate::core::metrics::observe(&m.commit_seconds, started.elapsed());
                    m.commit_rows.observe(n as f64);
                }
                tracing::debug!(took = ?started.elapsed(), rows = n, "batch committed");
                since_refresh += n;
                since_compact += weight(n);
                let _ = done.send(result.map(|_| ()));
            }
            WriteOp::Modify(ids, mut modify, done) => {
                by_id = true;
                let started = std::time::Instant::now();
                let result = async {
                    let filter = super::Filter::new().ids(&ids).predicate();
                    let mut current = super::read_chunks(table, filter, None).await?;
                    current.retain_mut(|c| modify(c));
                    if !current.is_empty() {
                        sink.commit(current.iter()).await?;
                    }
                    Ok(current.len())
                }
                .await;
                tracing::debug!(took = ?started.elapsed(), rows = ?result.as_ref().ok(), "rows modified");
                since_refresh += result.as_ref().map(|n| *n).unwrap_or(0);
                if let Ok(n) = result.as_ref().copied() {
                    if n > 0 {
                        since_compact += weight(n);
                    }
                }
                let _ = done.send(result);
            }
            WriteOp::Touch(accesses, done) => {
                // The access flush merges its counters on `id`.
                by_id = true;
                toucher
                    .start(&sink, accesses, done, &merger.rewrite, held)
                    .await;
            }
            WriteOp::Upsert(chunks, done) => {
                by_id = true;
                let mut rows = chunks.len();
                let mut group = vec![(chunks, done)];
                // Fold the upserts already waiting into this commit.
                while rows < max_rows {
                    match rx.try_recv() {
                        Ok(WriteOp::Upsert(c, d)) => {
                            rows += c.len();
                            group.push((c, d));
                        }
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let result = sink.commit(group.iter().flat_map(|(c, _)| c)).await;
                since_refresh += rows;
                since_compact += weight(rows);
                for (_, done) in group {
                    let _ = done.send(match &result {
                        Ok(()) => Ok(()),
                        Err(e) => Err(StoreError::Lance(lancedb::Error::Runtime {
                            message: e.to_string(),
                        })),
                    });
                }
            }
        }
        // Every kind of write counts (the pipeline's are `Commit`s): rows the
        // indexes do not cover are searched flat, at a cost that grows with them.
        since_refresh += toucher.take_written();
        if let Some(scope) = refresher.due(since_refresh, by_id) {
            if !merge_due(since_compact) && !merger.busy() && refresher.start(table, scope) {
                since_refresh = 0;
                by_id = false;
            }
        }
    }
}

/// Merges the table's small fragments beside the writer, one merge at a
/// time. Every `compact_every_commits` small commits the recent fragments
/// are rewritten as one; run inline, that held every store behind it (40 to
/// over 100 ms each time, under 8 writers every second or so). Lance lets an
/// append commit beside a rewrite (they touch different fragments), so
/// appends go on while it runs; anything that replaces or deletes rows
/// (`merge_insert`, delete) could touch the fragments being rewritten, so
/// it waits for the merge to finish ([`Merger::settle`]) and never meets a
/// commit conflict from it, unless it is a batch's side effects alone on
/// fragments the merge has not taken ([`Merger::beside`]).
///
/// A merge the writer starts while it writes stops at the second tier. One
/// started once it rests climbs every tier, and its merges above the second
/// (half a minute at a million rows) give way to the first write that
/// replaces rows instead of holding the writer that long: dropped before
/// their commit, they are tried again the next time the writer rests.
#[derive(Default)]
struct Merger {
    running: Beside,
    /// Held by the running merge or access flush: the two rewrite the same
    /// fragments, so they take turns (see [`Toucher`]).
    rewrite: Rewrite,
    /// Notified to have the running merge's higher tiers give way.
    give_way: Arc<tokio::sync::Notify>,
    /// Set when the last merge left work for a merge at rest: a tier above
    /// the second due (out of its reach, or given way), or small fragments
    /// it spared or an update held. The writer does it once it rests.
    climb: Arc<std::sync::atomic::AtomicBool>,
    /// The fragments the running merge takes and those the writer's
    /// updates write: an update waits for the merge only where they meet.
    claims: super::claims::Claims,
}

/// See [`Merger::rewrite`].
type Rewrite = Arc<tokio::sync::Mutex<()>>;

impl Merger {
    /// Start a merge unless one is running, an access flush holds the
    /// fragments or a rollback holds the table; whether one was started.
    fn start(
        &mut self,
        table: &Table,
        gate: &super::TableGate,
        target_rows: usize,
        rested: bool,
    ) -> bool {
        if self.busy() {
            return false;
        }
        // Both guards are taken here, before the merge runs, so it never
        // waits for one while holding the other (an access flush takes the
        // table first, then the fragments).
        let Ok(rewrite) = self.rewrite.clone().try_lock_owned() else {
            return false;
        };
        // A rollback waits for the merge, and the merge for a rollback.
        let Ok(gate) = gate.clone().try_read_owned() else {
            return false;
        };
        let table = table.clone();
        // A fresh signal each merge: one left from the last is not for this.
        self.give_way = Arc::default();
        let (give_way, climb) = (self.give_way.clone(), self.climb.clone());
        let claims = self.claims.clone();
        let merge = async move {
            let started = std::time::Instant::now();
            let (_rewrite, _gate, _taken) = (rewrite, gate, claims.merge());
            let reach = if rested {
                Reach::Every(Some(&give_way))
            } else {
                Reach::Second
            };
            let merged = merge_in_tiers(
                &table,
                target_rows,
                super::CHUNK_ORDER,
                reach,
                Some(&claims),
            );
            let due = match merged.await {
                Ok(due) => {
                    tracing::debug!(took = ?started.elapsed(), due, "chunk fragments merged");
                    due
                }
                Err(e) => {
                    tracing::warn!(error = %e, "chunk fragment merge failed; will retry");
                    false
                }
            };
            climb.store(due, std::sync::atomic::Ordering::Relaxed);
        };
        self.running = Beside(Some(match super::maintain::merge_runtime() {
            Some(rt) => rt.spawn(merge),
            None => tokio::spawn(merge),
        }));
        true
    }

    /// Whether a merge is running.
    fn busy(&self) -> bool {
        self.running.busy()
    }

    /// Whether the last merge left work for a merge at rest.
    fn climb_owed(&self) -> bool {
        self.climb.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Wait for the running merge, if any.
    async fn settle(&mut self) {
        self.running.settle("chunk fragment merge").await;
    }

    /// Take `fragments` for an update beside the running merge, if it has
    /// taken none of them (see [`super::claims`]).
    fn beside(
        &self,
        fragments: std::collections::HashSet<u64>,
    ) -> Option<super::claims::WriteClaim> {
        self.claims.for_write(fragments)
    }

    /// Have the running merge's higher tiers give way, then wait for it.
    async fn give_way(&mut self) {
        if self.busy() {
            self.give_way.notify_one();
        }
        self.settle().await;
    }
}

/// A task that runs beside the writer's loop (a fragment merge, an access
/// flush), if one was started.
#[derive(Default)]
struct Beside(Option<tokio::task::JoinHandle<()>>);

impl Beside {
    /// Whether the task is still running.
    fn busy(&self) -> bool {
        self.0.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Wait for the task, if any; `what` names it in a warning if it panicked.
    async fn settle(&mut self, what: &str) {
        if let Some(handle) = self.0.take() {
            if let Err(e) = handle.await {
                tracing::warn!(error = %e, "{what} stopped");
            }
        }
    }
}

/// Writes the access counters beside the writer, one flush at a time. A
/// flush rewrites the counter columns of every memory searched since the
/// last (under closed-loop searchers nearly the whole table every 2 s, 18
/// to 240 ms at 6,000 memories); run inline it held every store queued
/// behind it that long, and behind a running fragment merge before it. Like
/// a merge, it lets appends go on; a write that replaces rows waits for it
/// ([`Toucher::settle`]), and it waits for a running merge (the two rewrite
/// the same fragments: whichever committed second would be done again).
#[derive(Default)]
struct Toucher {
    running: Beside,
    /// Rows the flushes wrote, not yet counted towards an index refresh.
    written: Arc<std::sync::atomic::AtomicUsize>,
}

impl Toucher {
    /// Run a flush of `accesses` (after the running one, and a running
    /// merge); `gate` is the table's, taken by the writer's loop.
    async fn start(
        &mut self,
        sink: &Sink,
        accesses: Accesses,
        done: oneshot::Sender<Result<usize>>,
        rewrite: &Rewrite,
        gate: tokio::sync::OwnedRwLockReadGuard<()>,
    ) {
        self.settle().await;
        let (sink, rewrite, written) = (sink.clone(), rewrite.clone(), self.written.clone());
        self.running = Beside(Some(tokio::spawn(async move {
            let _gate = gate;
            let _rewrite = rewrite.lock_owned().await;
            let started = std::time::Instant::now();
            let result = sink.touch(&accesses).await;
            tracing::debug!(took = ?started.elapsed(), rows = ?result.as_ref().ok(), "access counters written");
            if let Ok(n) = &result {
                written.fetch_add(*n, std::sync::atomic::Ordering::Relaxed);
            }
            let _ = done.send(result);
        })));
    }

    /// Whether a flush is running.
    fn busy(&self) -> bool {
        self.running.busy()
    }

    /// Wait for the running flush, if any.
    async fn settle(&mut self) {
        self.running.settle("access counter flush").await;
    }

    /// Rows written by flushes since the last call.
    fn take_written(&self) -> usize {
        self.written.swap(0, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Refreshes the indexes beside the writer, one refresh at a time. An index
/// refresh reads every row written since the last one (the FTS index the most
/// slowly); run inline it held every commit behind it, for minutes on a busy
/// machine. Lance commits the refresh as its own transaction, which appends and
/// merge-inserts do not conflict with, so commits go on while it runs.
#[derive(Default)]
struct Refresher {
    running: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// A refresh is running, or the last one left a scalar or full-text
    /// index behind (see [`RefreshScope::Pressing`]) or failed.
    behind: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// When the last refresh began.
    last: Option<std::time::Instant>,
}

impl Refresher {
    /// `INDEX_REFRESH_QUIET` has passed since the last refresh began.
    fn quiet(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= INDEX_REFRESH_QUIET)
    }

    /// Whether a refresh is running.
    fn busy(&self) -> bool {
        self.running.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether an index may still lack rows written before the last refresh.
    fn behind(&self) -> bool {
        self.behind.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether an index lacks rows: `unindexed` written since the last
    /// refresh began, or rows it left behind.
    fn lacking(&self, unindexed: usize) -> bool {
        unindexed > 0 || self.behind()
    }

    /// Whether `unindexed` rows call for a refresh now, and of what: rows
    /// that pour in (`INDEX_REFRESH_ROWS` within `INDEX_REFRESH_QUIET`) a
    /// pressing one (of the `id` index too when writes read through it:
    /// `by_id`), rows that trickle in all of them.
    fn due(&self, unindexed: usize, by_id: bool) -> Option<RefreshScope> {
        if unindexed >= INDEX_REFRESH_MIN_ROWS && self.quiet() {
            Some(RefreshScope::Everything)
        } else if unindexed >= INDEX_REFRESH_ROWS {
            Some(RefreshScope::Pressing { by_id })
        } else {
            None
        }
    }

    /// Start a refresh unless one is running; whether one was started.
    fn start(&mut self, table: &Table, scope: RefreshScope) -> bool {
        use std::sync::atomic::Ordering;
        if self.running.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.last = Some(std::time::Instant::now());
        // Behind until the refresh says otherwise: a writer that falls idle
        // while it runs must still wake to fold in what it leaves.
        self.behind.store(true, Ordering::Release);
        let (table, running, behind) = (table.clone(), self.running.clone(), self.behind.clone());
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            // On the engine's runtime, not `apart`: a refresh opens the
            // scalar indexes that every merge on `id` reads, and reads
            // through what Lance keeps of them would then wait on the build
            // runtime's one thread while it builds a vector index. The
            // vector index's appends build only the new rows (see
            // `vector_fold`).
            match refresh_indexes_routinely(&table, scope).await {
                Ok(left) => {
                    behind.store(left, Ordering::Release);
                    tracing::debug!(took = ?started.elapsed(), ?scope, "indexes refreshed");
                }
                Err(e) => {
                    behind.store(true, Ordering::Release);
                    tracing::warn!(error = %e, "index refresh failed; will retry");
                }
            }
            running.store(false, Ordering::Release);
        });
        true
    }
}

/// What a pipeline batch's write did: the rows it wrote, and whether it
/// read through the `id` index (looked up the owners of ids the table may
/// hold, or moved memories whose addresses it did not remember, or merged
/// rows on `id`).
struct Committed {
    rows: usize,
    by_id: bool,
}

/// A pipeline batch's write (see [`ChunkWriter::commit_batch`]).
async fn commit(
    sink: &Sink,
    batch: WriteBatch,
    merger: &mut Merger,
    toucher: &mut Toucher,
) -> Result<Committed> {
    let WriteBatch {
        fresh,
        rows,
        side,
        refuse,
        history,
    } = batch;
    let table = &sink.table;
    // Only ids the table may hold are looked up.
    let mut owners_read = false;
    let owners = if rows.is_empty() {
        HashMap::new()
    } else {
        let ids: Vec<&str> = rows.iter().map(|c| c.id.as_str()).collect();
        let maybe = sink.known.maybe_stored(table, ids).await;
        if maybe.is_empty() {
            HashMap::new()
        } else {
            owners_read = true;
            super::read_owners(table, &maybe, true).await?
        }
    };
    if refuse {
        let refused: HashMap<String, super::Owner> = rows
            .iter()
            .filter_map(|c| {
                let o = owners.get(&c.id)?;
                o.refuses(c).map(|_| (c.id.clone(), o.clone()))
            })
            .collect();
        if !refused.is_empty() {
            return Err(StoreError::Refused(Box::new(Refusal {
                owners: refused,
                batch: WriteBatch {
                    fresh,
                    rows,
                    side,
                    refuse,
                    history,
                },
            })));
        }
    }
    // The history goes to its own table while the chunk writes run: the
    // batch is not refused past this point.
    let (written, logged) = futures::join!(
        write_chunks(sink, fresh, rows, side, &owners, merger, toucher),
        super::history::append_history(&sink.history, &history)
    );
    if written.is_err() && logged.is_ok() && !history.is_empty() {
        // The batch fails and is delivered again: its history is taken back,
        // so the next attempt does not write it twice.
        let ids: Vec<&str> = history.iter().map(|h| h.id.as_str()).collect();
        let taken_back = sink
            .history
            .delete(&super::Filter::new().ids(&ids).predicate())
            .await;
        if let Err(e) = taken_back {
            tracing::warn!(error = %e, "a failed batch's history stays written");
        }
    }
    logged?;
    let written = written?;
    Ok(Committed {
        by_id: written.by_id || owners_read,
        ..written
    })
}

/// A batch's chunk writes, once it is past the refusal check (`owners`:
/// the stored rows among `rows`' ids).
async fn write_chunks(
    sink: &Sink,
    mut fresh: Vec<Chunk>,
    rows: Vec<Chunk>,
    side: Vec<Chunk>,
    owners: &HashMap<String, super::Owner>,
    merger: &mut Merger,
    toucher: &mut Toucher,
) -> Result<Committed> {
    // Rows whose id nothing stores are appended with `fresh`: of an id the
    // batch repeats, the last (a merge on `id` kept the same one), and a side
    // effect on one of them gives way to its own row, the record's final
    // form (see `write::plan`). Rows that replace stored ones are merged.
    let (new, rows): (Vec<Chunk>, Vec<Chunk>) =
        rows.into_iter().partition(|c| !owners.contains_key(&c.id));
    let new = last_of_each(new);
    let side: Vec<Chunk> = {
        let own: std::collections::HashSet<&str> =
            rows.iter().chain(&new).map(|c| c.id.as_str()).collect();
        side.into_iter()
            .filter(|c| !own.contains(c.id.as_str()))
            .collect()
    };
    fresh.extend(new);
    let appended = fresh.len();
    let mut attempt = 0;
    let (moved, timings) = loop {
        attempt += 1;
        match write_fresh_and_moved(sink, &fresh, &side, rows.is_empty(), merger, toucher).await {
            Err(StoreError::Lance(e))
                if attempt < MOVE_ATTEMPTS && super::maintain::is_conflict(&e) =>
            {
                tracing::debug!(attempt, error = %e, "a batch's moves conflicted; reading again");
            }
            done => break done?,
        }
    };
    // The new rows, then the moved memories, go to the hot index as they
    // were committed.
    let Moved {
        chunks: moved,
        gone,
        looked_up,
    } = moved;
    let moved_rows = moved.len();
    sink.hot.apply(fresh.into_iter().chain(moved));
    if !rows.is_empty() {
        // A merge rewrites rows, so it waits for the fragment merge (or has a
        // merge above the second tier give way) and the access flush.
        merger.give_way().await;
        toucher.settle().await;
        sink.commit(rows.iter()).await?;
    }
    tracing::debug!(
        read = ?timings.read,
        settled = ?timings.settled,
        written = ?timings.written,
        merged = ?timings.started.elapsed().saturating_sub(timings.written),
        appended_rows = appended,
        moved_rows,
        merged_rows = rows.len(),
        side_effects_on_deleted = gone,
        attempts = attempt,
        "batch commit phases"
    );
    Ok(Committed {
        rows: appended + rows.len() + moved_rows,
        by_id: !rows.is_empty() || looked_up > 0,
    })
}

/// Attempts at a batch's write of its new rows and its side effects' moved
/// memories, when a concurrent commit rewrote one of their fragments.
const MOVE_ATTEMPTS: u32 = 4;

/// What [`write_fresh_and_moved`] wrote of the side effects: the memories
/// it moved, and the side effects dropped (their memory no longer stored).
struct Moved {
    /// Committed: for the hot index to take once the write is done.
    chunks: Vec<Chunk>,
    gone: usize,
    /// Moved memories whose addresses were looked up by id.
    looked_up: usize,
}

/// When [`write_fresh_and_moved`]'s phases ended.
struct Timings {
    started: std::time::Instant,
    read: std::time::Duration,
    settled: std::time::Duration,
    written: std::time::Duration,
}

/// Append a batch's new rows and, in the same commit, the stored memories
/// its side effects change, moved whole from their fragments
/// ([`super::moving`]); the new rows are written while those memories are
/// read. `alone`: the batch merges no rows after this write, so it may go
/// on beside a merge (see [`Merger::beside`]).
async fn write_fresh_and_moved(
    sink: &Sink,
    fresh: &[Chunk],
    side: &[Chunk],
    alone: bool,
    merger: &mut Merger,
    toucher: &mut Toucher,
) -> Result<(Moved, Timings)> {
    let started = std::time::Instant::now();
    super::check_vectors(fresh)?;
    let first = if fresh.is_empty() {
        None
    } else {
        Some(crate::core::model::chunks_to_batch(fresh, sink.dim)?)
    };
    let snapshot = super::moving::Snapshot::of(&sink.table).await?;
    let (send, then) = tokio::sync::oneshot::channel();
    // The memories the side effects change, whole, with where they lie.
    // None of them is among the new rows (a side effect on one of them gave
    // way to its own row, the record's final form, see `write::plan`).
    let prepare = async {
        let ids: Vec<&str> = side.iter().map(|c| c.id.as_str()).collect();
        let (located, looked_up) = snapshot.located(&ids, &sink.placed).await?;
        let mut stored: HashMap<String, (Chunk, u64)> = located
            .into_iter()
            .map(|(c, at)| (c.id.clone(), (c, at)))
            .collect();
        let read = started.elapsed();
        // Side effects on one stored memory fold onto it one after the
        // other (two updates of a batch superseding it); one on a memory no
        // longer stored is dropped.
        let mut gone = 0;
        let mut changed: Vec<&str> = Vec::new();
        for s in side {
            match stored.get_mut(&s.id) {
                Some((now, _)) => {
                    rebase(now, s);
                    if !changed.contains(&s.id.as_str()) {
                        changed.push(&s.id);
                    }
                }
                None => gone += 1,
            }
        }
        let (moved, replaced): (Vec<Chunk>, Vec<u64>) =
            changed.iter().filter_map(|&id| stored.remove(id)).unzip();
        if !moved.is_empty() {
            // Dropped unsent (an error): the write ends with the new rows.
            let _ = send.send(crate::core::model::chunks_to_batch(&moved, sink.dim)?);
        }
        Ok::<_, StoreError>((moved, replaced, gone, looked_up, read))
    };
    let (written, prepared) = futures::join!(snapshot.write(first, then), prepare);
    let (moved, replaced, gone, looked_up, read) = prepared?;
    let new_fragments = written?;
    // Moving stored rows writes their fragments' deletions, so the commit
    // waits for a merge that has taken one of those fragments (or has a
    // merge above the second tier give way), and for the access flush;
    // beside a merge that has taken none, it goes on.
    let _beside = if replaced.is_empty() {
        None
    } else {
        let fragments = replaced
            .iter()
            .map(|&a| super::claims::fragment_of(a))
            .collect();
        let beside = if alone {
            merger.beside(fragments)
        } else {
            None
        };
        if beside.is_none() {
            merger.give_way().await;
        }
        toucher.settle().await;
        beside
    };
    let settled = started.elapsed();
    if !new_fragments.is_empty() || !replaced.is_empty() {
        sink.known.add(fresh.iter().map(|c| c.id.as_str()));
        let placed = snapshot
            .commit(&sink.table, new_fragments, &replaced)
            .await?;
        // The fragments hold the new rows, then the moved memories.
        let written = fresh.iter().chain(&moved);
        sink.placed
            .remember(written.map(|c| c.id.as_str()), &placed);
    }
    let timings = Timings {
        started,
        read,
        settled,
        written: started.elapsed(),
    };
    Ok((
        Moved {
            chunks: moved,
            gone,
            looked_up,
        },
        timings,
    ))
}

/// The last row of each id, in the order the ids first appear.
fn last_of_each(rows: Vec<Chunk>) -> Vec<Chunk> {
    let mut at: HashMap<String, usize> = HashMap::with_capacity(rows.len());
    let mut out: Vec<Chunk> = Vec::with_capacity(rows.len());
    for c in rows {
        match at.get(&c.id) {
            Some(&i) => out[i] = c,
            None => {
                at.insert(c.id.clone(), out.len());
                out.push(c);
            }
        }
    }
    out
}

/// A side effect's lifecycle fields and `extraction_meta` keys on top of
/// the stored memory `now`: the rest of the row (text, vector, entities)
/// stays as stored (the side effect's copy may be one without its vector,
/// from the hot index).
fn rebase(now: &mut Chunk, side: &Chunk) {
    now.superseded_by = side.superseded_by.clone();
    now.valid_until = side.valid_until;
    now.updated_at = now.updated_at.max(side.updated_at);
    let parse = |m: &Option<String>| {
        m.as_deref()
            .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
            .filter(serde_json::Value::is_object)
    };
    match (parse(&now.extraction_meta), parse(&side.extraction_meta)) {
        (Some(mut merged), Some(serde_json::Value::Object(theirs))) => {
            for (k, v) in theirs {
                merged[k] = v;
            }
            now.extraction_meta = Some(merged.to_string());
        }
        (None, Some(_)) => now.extraction_meta = side.extraction_meta.clone(),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use crate::core::model::Chunk;
    use crate::store::Store;
    use std::sync::Arc;

    /// Rows that trickle in call for a refresh of every index; rows that
    /// pour in soon after the last refresh, for a pressing one, which takes
    /// in the `id` index only when a write read through it.
    #[test]
    fn pouring_rows_refresh_the_id_index_only_when_it_was_read() {
        use super::{RefreshScope, Refresher, INDEX_REFRESH_MIN_ROWS, INDEX_REFRESH_ROWS};
        let idle = Refresher::default();
        assert_eq!(idle.due(INDEX_REFRESH_MIN_ROWS - 1, true), None);
        assert_eq!(
            idle.due(INDEX_REFRESH_MIN_ROWS, false),
            Some(RefreshScope::Everything)
        );
        let pouring = Refresher {
            last: Some(std::time::Instant::now()),
            ..Refresher::default()
        };
        assert_eq!(pouring.due(INDEX_REFRESH_ROWS - 1, true), None);
        for by_id in [false, true] {
            assert_eq!(
                pouring.due(INDEX_REFRESH_ROWS, by_id),
                Some(RefreshScope::Pressing { by_id })
            );
        }
    }

    #[tokio::test]
    async fn memories_stored_through_the_pipeline_get_indexed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), 8, 100).await.unwrap();
        // The pipeline's write: `commit_with_side_effects`, a batch at a time.
        for b in 0..6 {
            let rows = (0..100)
                .map(|i| {
                    Chunk::new(
                        format!("m{b}-{i}"),
                        "s".into(),
                        format!("memory {b} {i}"),
                        0,
                    )
                })
                .collect();
            store.commit_with_side_effects(rows, vec![]).await.unwrap();
        }
        let unindexed = || async {
            store
                .chunks_table()
                .index_stats("content_idx")
                .await
                .unwrap()
                .map(|s| s.num_unindexed_rows)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while unindexed().await != Some(0) {
            assert!(
                std::time::Instant::now() < deadline,
                "600 rows still unindexed: {:?}",
                unindexed().await
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Rows that pour in get the `id` index at once and the other indexes
    /// once the writer is idle: after a second burst of 2,100 rows (the
    /// first refresh folds in everything, the next ones only `id`) every
    /// index covers every row without another write.
    #[tokio::test]
    async fn indexes_left_behind_under_a_burst_catch_up_when_idle() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), 8, 100).await.unwrap();
        for b in 0..2 {
            for part in 0..7 {
                let rows = (0..300)
                    .map(|i| {
                        let text = format!("burst {b} part {part} memory {i}");
                        Chunk::new(format!("m{b}-{part}-{i}"), "s".into(), text, 0)
                    })
                    .collect();
                store.commit_with_side_effects(rows, vec![]).await.unwrap();
            }
        }
        let table = store.chunks_table();
        let unindexed = || async {
            let mut left = Vec::new();
            for index in table.list_indices().await.unwrap() {
                let s = table.index_stats(&index.name).await.unwrap().unwrap();
                left.push((index.name, s.num_unindexed_rows));
            }
            left
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        loop {
            let left = unindexed().await;
            if left.iter().all(|(_, n)| *n == 0) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "rows still unindexed: {left:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        assert_eq!(
            store.count(&crate::store::Filter::new()).await.unwrap(),
            4_200
        );
    }

    /// How many fragments the store's chunk table has.
    async fn fragments_of(store: &Store) -> usize {
        store
            .chunks_table()
            .stats()
            .await
            .unwrap()
            .fragment_stats
            .num_fragments
    }

    /// A bulk load's batches are fair fragments already: none is merged
    /// while they come in, and what they leave is merged, with every row
    /// kept, once the writer is idle.
    #[tokio::test]
    async fn a_bulk_loads_fragments_are_merged_once_the_writer_rests() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), 8, 100).await.unwrap();
        let fragments = || fragments_of(&store);
        // Eighty batches of 300 rows: small commits, as many, would have
        // called for a merge after every thirty-two.
        for b in 0..80 {
            let rows = (0..300)
                .map(|i| {
                    let text = format!("batch {b} memory {i}");
                    Chunk::new(format!("m{b}-{i}"), "s".into(), text, 0)
                })
                .collect();
            store.commit_with_side_effects(rows, vec![]).await.unwrap();
        }
        assert_eq!(fragments().await, 80, "a merge ran during the load");
        // Lance merges only fragments the same indexes cover: the refreshes
        // during the load leave a few such runs.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        while fragments().await > 20 {
            assert!(
                std::time::Instant::now() < deadline,
                "fragments left unmerged: {}",
                fragments().await
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        assert_eq!(
            store.count(&crate::store::Filter::new()).await.unwrap(),
            24_000
        );
    }

    /// While a vector index is built the writer merges no fragments (Lance
    /// would fail the build's commit over the merge) and the compact job's
    /// wait does not end; once it is done the merges resume.
    #[tokio::test]
    async fn fragments_wait_for_a_vector_index_build() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), 8, 100).await.unwrap();
        let fragments = || fragments_of(&store);
        let commit = |n: usize| {
            let row = Chunk::new(format!("m{n}"), "s".into(), format!("memory {n}"), 0);
            store.commit_with_side_effects(vec![row], vec![])
        };
        let build = store.vector_build.begin();
        // Past the point where small commits call for a merge.
        for n in 0..48 {
            commit(n).await.unwrap();
        }
        assert_eq!(fragments().await, 48, "a merge ran during the build");
        // The compact job waits for the build the same way.
        let wait = std::time::Duration::from_millis(300);
        assert!(tokio::time::timeout(wait, store.vector_build_finished())
            .await
            .is_err());
        drop(build);
        let wait = std::time::Duration::from_secs(30);
        tokio::time::timeout(wait, store.vector_build_finished())
            .await
            .expect("the wait ends with the build");
        commit(48).await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while fragments().await >= 49 {
            assert!(
                std::time::Instant::now() < deadline,
                "no merge after the build"
            );
            commit(1000 + fragments().await).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Access flushes run beside the writer: stores, replacing writes and
    /// the fragment merges that many small commits bring all interleave with
    /// them, and every one of them lands (no count lost or doubled, no row
    /// lost, no replaced row brought back by a flush).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn access_flushes_run_beside_stores_and_every_write_lands() {
        use crate::store::{Filter, WriteBatch};
        let tmp = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(tmp.path(), 8, 100).await.unwrap());
        let memory = |id: String, text: &str| Chunk::new(id, "s".into(), text.into(), 0);
        let searched: Vec<String> = (0..40).map(|i| format!("searched-{i}")).collect();
        let edited: Vec<String> = (0..10).map(|i| format!("edited-{i}")).collect();
        store
            .upsert(
                searched
                    .iter()
                    .chain(&edited)
                    .map(|id| memory(id.clone(), "v1"))
                    .collect(),
            )
            .await
            .unwrap();
        let flushes = {
            let (store, searched) = (store.clone(), searched.clone());
            tokio::spawn(async move {
                for round in 1..=30i64 {
                    let accesses = searched.iter().map(|id| (id.clone(), (1, round))).collect();
                    assert_eq!(store.touch(accesses).await.unwrap(), 40);
                }
            })
        };
        let stores = {
            let (store, edited) = (store.clone(), edited.clone());
            tokio::spawn(async move {
                for i in 0..120 {
                    let mut batch = WriteBatch {
                        fresh: vec![memory(format!("new-{i}"), "fresh")],
                        rows: vec![],
                        side: vec![],
                        refuse: true,
                        history: vec![],
                    };
                    if i % 12 == 0 {
                        batch.rows = vec![memory(edited[i / 12].clone(), "v2")];
                    }
                    store.commit_batch(batch).await.unwrap();
                }
            })
        };
        flushes.await.unwrap();
        stores.await.unwrap();
        let rows = store.find(&Filter::new(), None).await.unwrap();
        assert_eq!(rows.len(), 40 + 10 + 120, "every row once");
        for row in &rows {
            let id = row.id.as_str();
            if id.starts_with("searched-") {
                assert_eq!(
                    (row.access_count, row.last_accessed_at),
                    (30, Some(30)),
                    "{id}: every flush counted once"
                );
            } else if id.starts_with("edited-") {
                assert_eq!(row.content, "v2", "{id}: the replacing write stands");
            } else {
                assert_eq!(row.content, "fresh", "{id}");
            }
        }
    }

    #[tokio::test]
    async fn an_append_with_a_nan_vector_fails_and_writes_nothing() {
        use crate::store::{Filter, WriteBatch};
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), 4, 100).await.unwrap();
        let memory = |id: &str, v: Vec<f32>| {
            let mut c = Chunk::new(id.into(), "a".into(), format!("text of {id}"), 0);
            c.embedding = Some(v);
            c
        };
        let batch = |rows| WriteBatch {
            fresh: vec![],
            rows,
            side: vec![],
            refuse: false,
            history: vec![],
        };
        let err = store
            .commit_batch(batch(vec![
                memory("fine", vec![1.0, 0.0, 0.0, 0.0]),
                memory("bad", vec![0.0, f32::NAN, 0.0, 0.0]),
            ]))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("memory bad holds NaN"), "{err}");
        assert_eq!(store.count(&Filter::new().stream("a")).await.unwrap(), 0);
        // The same rows without the bad one are written.
        store
            .commit_batch(batch(vec![memory("fine", vec![1.0, 0.0, 0.0, 0.0])]))
            .await
            .unwrap();
        assert_eq!(store.count(&Filter::new().stream("a")).await.unwrap(), 1);
    }

    /// Rows whose ids nothing stores are appended; one that repeats a stored
    /// id (of this process's writes, of the table as opened, or brought back
    /// by a rollback) replaces it; one of another stream's id, or of an
    /// immutable memory, refuses the batch. No id ever names two rows.
    #[tokio::test]
    async fn a_batch_appends_new_ids_replaces_stored_ones_and_refuses_foreign_ones() {
        use crate::store::{Filter, StoreError, WriteBatch};
        let tmp = tempfile::tempdir().unwrap();
        let memory = |id: &str, stream: &str, text: &str| {
            Chunk::new(id.into(), stream.into(), text.into(), 0)
        };
        let write = |rows: Vec<Chunk>| WriteBatch {
            fresh: vec![],
            rows,
            side: vec![],
            refuse: true,
            history: vec![],
        };
        // A table that held `gone` (deleted before this process opened it).
        let before = {
            let store = Store::open(tmp.path(), 8, 100).await.unwrap();
            store
                .upsert(vec![memory("opened", "a", "v1"), memory("gone", "a", "v1")])
                .await
                .unwrap();
            let version = store.chunks_table().version().await.unwrap();
            store.delete(&Filter::new().id("gone")).await.unwrap();
            version
        };
        let store = Store::open(tmp.path(), 8, 100).await.unwrap();
        let mut locked = memory("locked", "a", "v1");
        locked.immutable = true;
        store
            .commit_batch(write(vec![memory("x", "a", "v1"), locked]))
            .await
            .unwrap();
        // A new id the batch repeats keeps its last row; a side effect on a
        // new row gives way to the row itself.
        store
            .commit_batch(WriteBatch {
                side: ["twice", "y"]
                    .map(|id| Chunk {
                        superseded_by: Some("x".into()),
                        ..memory(id, "a", "side")
                    })
                    .to_vec(),
                ..write(vec![
                    memory("x", "a", "v2"),
                    memory("opened", "a", "v2"),
                    memory("y", "a", "v1"),
                    memory("twice", "a", "v1"),
                    memory("twice", "a", "v2"),
                ])
            })
            .await
            .unwrap();
        for foreign in [memory("x", "b", "mine"), memory("locked", "a", "v2")] {
            let refused = store
                .commit_batch(write(vec![memory("z", "a", "v1"), foreign.clone()]))
                .await;
            match refused {
                Err(StoreError::Refused(refusal)) => {
                    assert_eq!(refusal.owners.keys().collect::<Vec<_>>(), vec![&foreign.id]);
                    let back = &refusal.batch.rows;
                    assert_eq!(back, &[memory("z", "a", "v1"), foreign.clone()]);
                }
                other => panic!("{} was written: {other:?}", foreign.id),
            }
        }
        let text = |id: &'static str| {
            let store = &store;
            async move {
                let rows = store.find(&Filter::new().id(id), None).await.unwrap();
                assert_eq!(rows.len(), 1, "{id} names one row");
                rows[0].content.clone()
            }
        };
        assert_eq!(text("x").await, "v2");
        assert_eq!(text("opened").await, "v2");
        assert_eq!(text("twice").await, "v2");
        assert_eq!(text("y").await, "v1");
        for id in ["twice", "y"] {
            let row = store.get(id).await.unwrap().unwrap();
            assert_eq!(
                row.superseded_by, None,
                "{id}: its own row, not the side effect"
            );
        }
        assert_eq!(text("locked").await, "v1");
        assert_eq!(store.count(&Filter::new().id("z")).await.unwrap(), 0);
        // A rollback to before `gone` was deleted brings it back: writing it
        // again replaces it.
        store.chunks_table().checkout(before).await.unwrap();
        store.chunks_table().restore().await.unwrap();
        store.rolled_back().await.unwrap();
        store
            .commit_batch(write(vec![
                memory("gone", "a", "v2"),
                memory("x", "a", "v3"),
            ]))
            .await
            .unwrap();
        assert_eq!(text("gone").await, "v2");
        assert_eq!(text("x").await, "v3");
        assert_eq!(
            store.count(&Filter::new()).await.unwrap(),
            3,
            "opened, gone, x"
        );
    }

    /// A batch's history lands with its rows; a refused batch writes none
    /// of it, and a failed one takes it back.
    #[tokio::test]
    async fn a_batchs_history_is_written_with_it_unless_it_is_refused() {
        use crate::store::{HistoryRow, StoreError, WriteBatch};
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), 8, 100).await.unwrap();
        let memory =
            |id: &str, stream: &str| Chunk::new(id.into(), stream.into(), format!("{id} text"), 0);
        let event = |chunk: &str, event: &str| HistoryRow {
            id: format!("{chunk}-{event}"),
            stream: "a".into(),
            chunk_id: chunk.into(),
            event: event.into(),
            reason: "an update".into(),
            related_ids: vec![],
            created_at: 1,
        };
        store
            .commit_batch(WriteBatch {
                fresh: vec![memory("old", "a")],
                ..Default::default()
            })
            .await
            .unwrap();
        // `old` is stream a's: a row of stream b naming it refuses the batch.
        let refused = store
            .commit_batch(WriteBatch {
                rows: vec![memory("new", "a"), memory("old", "b")],
                refuse: true,
                history: vec![event("old", "superseded")],
                ..Default::default()
            })
            .await;
        assert!(
            matches!(refused, Err(StoreError::Refused(_))),
            "{refused:?}"
        );
        assert!(store.history_of("old").await.unwrap().is_empty());
        store
            .commit_batch(WriteBatch {
                rows: vec![memory("new", "a")],
                side: vec![Chunk {
                    superseded_by: Some("new".into()),
                    ..memory("old", "a")
                }],
                refuse: true,
                history: vec![event("old", "superseded"), event("new", "supersedes")],
                ..Default::default()
            })
            .await
            .unwrap();
        let events = |id: &'static str| {
            let store = &store;
            async move {
                let rows = store.history_of(id).await.unwrap();
                rows.into_iter().map(|h| h.event).collect::<Vec<_>>()
            }
        };
        assert_eq!(events("old").await, vec!["superseded"]);
        assert_eq!(events("new").await, vec!["supersedes"]);
        let old = store.get("old").await.unwrap().unwrap();
        assert_eq!(old.superseded_by.as_deref(), Some("new"));
        // A batch whose rows fail to be written takes its history back.
        let mut bad = memory("bad", "a");
        bad.embedding = Some(vec![f32::NAN; 8]);
        let failed = store
            .commit_batch(WriteBatch {
                fresh: vec![bad],
                history: vec![event("bad", "supersedes")],
                ..Default::default()
            })
            .await;
        assert!(failed.is_err(), "{failed:?}");
        assert!(events("bad").await.is_empty());
        assert_eq!(store.count(&crate::store::Filter::new()).await.unwrap(), 2);
    }

    /// An access flush writes only the two counters: they add up, the
    /// latest access wins, a deleted memory is skipped, every other column
    /// stays as stored, and the hot index holds what Lance holds.
    #[tokio::test]
    async fn access_counters_are_written_alone_and_followed_in_memory() {
        use crate::store::Filter;
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), 8, 100).await.unwrap();
        let mut a = Chunk::new("a".into(), "s".into(), "I live in Boston".into(), 1);
        a.embedding = Some(vec![0.5; 8]);
        let b = Chunk::new("b".into(), "s".into(), "I like tea".into(), 2);
        let c = Chunk::new("c".into(), "t".into(), "I like coffee".into(), 3);
        store.upsert(vec![a.clone(), b, c]).await.unwrap();
        // Stream s is held in memory, t is not.
        store
            .find_rows(&Filter::new().stream("s"), None)
            .await
            .unwrap();
        assert_eq!(store.hot_usage().1, 1);
        let accesses = |list: &[(&str, i64, i64)]| -> super::Accesses {
            list.iter()
                .map(|(id, n, at)| (id.to_string(), (*n, *at)))
                .collect()
        };
        let first = accesses(&[("a", 2, 100), ("b", 1, 50), ("c", 4, 70), ("gone", 5, 10)]);
        assert_eq!(store.touch(first).await.unwrap(), 3);
        assert_eq!(store.touch(accesses(&[("a", 1, 80)])).await.unwrap(), 1);
        let counts = |rows: &[Chunk]| {
            let mut v: Vec<(String, i64, Option<i64>)> = rows
                .iter()
                .map(|c| (c.id.clone(), c.access_count, c.last_accessed_at))
                .collect();
            v.sort();
            v
        };
        let lance = store.find(&Filter::new(), None).await.unwrap();
        assert_eq!(
            counts(&lance),
            vec![
                ("a".to_string(), 3, Some(100)),
                ("b".to_string(), 1, Some(50)),
                ("c".to_string(), 4, Some(70)),
            ]
        );
        let hot = store
            .find_rows(&Filter::new().stream("s"), None)
            .await
            .unwrap();
        assert_eq!(counts(&hot), counts(&lance)[..2].to_vec());
        let stored = lance.iter().find(|c| c.id == "a").unwrap();
        assert_eq!(
            (stored.content.as_str(), stored.version, stored.created_at),
            ("I live in Boston", a.version, 1)
        );
        assert_eq!(stored.embedding.as_deref(), Some(&[0.5f32; 8][..]));
        assert_eq!(store.count(&Filter::new()).await.unwrap(), 3);
    }

    /// A batch's new rows and the stored memories its side effects change
    /// go out in one commit: the changed memories move, whole, to the
    /// batch's fragment and their old rows are deleted; the fragments they
    /// lay in keep their data files (no column patch covering their rows).
    #[tokio::test]
    async fn side_effects_move_their_memories_in_the_batchs_commit() {
        use crate::store::maintain::Maintenance;
        let tmp = tempfile::tempdir().unwrap();
        let location = crate::store::Location::local(tmp.path());
        let store = Store::open_with(&location, 8, 100, None, Maintenance::off())
            .await
            .unwrap();
        let stored: Vec<Chunk> = (0..500)
            .map(|i| {
                let mut c = Chunk::new(format!("m{i}"), "s".into(), format!("memory {i}"), 1);
                c.embedding = Some(vec![i as f32; 8]);
                c
            })
            .collect();
        store
            .commit_with_side_effects(stored.clone(), vec![])
            .await
            .unwrap();
        let table = store.chunks_table();
        let files = |manifest: &lance::table::format::Manifest| {
            let f = &manifest.fragments[0];
            (f.files.len(), f.deletion_file.is_some())
        };
        let before = table.as_native().unwrap().manifest().await.unwrap();
        assert_eq!((before.fragments.len(), files(&before)), (1, (1, false)));
        let superseded = ["m7", "m300"].map(|id| {
            let c = stored.iter().find(|c| c.id == id).unwrap();
            Chunk {
                embedding: None,
                superseded_by: Some("new".into()),
                valid_until: Some(5),
                ..c.clone()
            }
        });
        let new =
            ["new", "other"].map(|id| Chunk::new(id.into(), "s".into(), format!("{id} fact"), 5));
        store
            .commit_with_side_effects(new.to_vec(), superseded.to_vec())
            .await
            .unwrap();
        let after = table.as_native().unwrap().manifest().await.unwrap();
        // The table's commits since, index builds aside: one update.
        let ds = table.dataset().unwrap().get().await.unwrap();
        let mut writes = Vec::new();
        for v in before.version + 1..=after.version {
            let t = ds.read_transaction_by_version(v).await.unwrap().unwrap();
            if !matches!(
                t.operation,
                lance::dataset::transaction::Operation::CreateIndex { .. }
            ) {
                writes.push(t.operation.to_string());
            }
        }
        assert_eq!(writes, vec!["Update".to_string()], "one commit");
        assert_eq!(
            files(&after),
            (1, true),
            "the old fragment: its file and a deletion"
        );
        let rows: Vec<usize> = after
            .fragments
            .iter()
            .map(|f| f.num_rows().unwrap())
            .collect();
        assert_eq!(rows, vec![498, 4], "two moved, two new");
        assert_eq!(
            store.count(&crate::store::Filter::new()).await.unwrap(),
            502
        );
        for id in ["m7", "m300"] {
            let got = store
                .find(&crate::store::Filter::new().id(id), None)
                .await
                .unwrap();
            assert_eq!(got.len(), 1, "{id} is stored once");
            assert_eq!(got[0].superseded_by.as_deref(), Some("new"));
            assert_eq!(got[0].valid_until, Some(5));
            let n: usize = id[1..].parse().unwrap();
            assert_eq!(
                got[0].embedding.as_deref(),
                Some(&[n as f32; 8][..]),
                "{id} keeps its vector"
            );
            assert_eq!(got[0].content, format!("memory {n}"));
        }
    }

    #[tokio::test]
    async fn side_effects_are_rebased_on_the_stored_memory() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), 8, 100).await.unwrap();
        let mut old = Chunk::new("old".into(), "s".into(), "I live in Boston".into(), 1);
        old.annotate("surprise", serde_json::json!(0.5));
        store.upsert(vec![old.clone()]).await.unwrap();
        // A pipeline stage takes its copy (to supersede it) …
        let mut stale = old.clone();
        // … while the LLM entity queue enriches the stored memory.
        store
            .modify(
                vec!["old".into()],
                Box::new(|c| {
                    c.entities = vec!["beaconhill".into()];
                    c.annotate("llm_ner", serde_json::json!({"model": "m"}));
                    true
                }),
            )
            .await
            .unwrap();
        stale.superseded_by = Some("new".into());
        stale.valid_until = Some(5);
        stale.updated_at = 9;
        stale.annotate("merged_sources", serde_json::json!(["x"]));
        let new = Chunk::new("new".into(), "s".into(), "I live in Chicago".into(), 5);
        store
            .commit_with_side_effects(vec![new], vec![stale])
            .await
            .unwrap();
        let got = store.get("old").await.unwrap().unwrap();
        assert_eq!(got.superseded_by.as_deref(), Some("new"));
        assert_eq!(got.valid_until, Some(5));
        assert_eq!(got.updated_at, 9);
        assert_eq!(
            got.entities,
            vec!["beaconhill".to_string()],
            "the concurrent change is kept"
        );
        let meta: serde_json::Value =
            serde_json::from_str(got.extraction_meta.as_deref().unwrap()).unwrap();
        assert_eq!(meta["llm_ner"]["model"], "m");
        assert_eq!(meta["merged_sources"][0], "x");
        assert_eq!(meta["surprise"], 0.5);
        assert!(store.get("new").await.unwrap().is_some());
        // Two updates of one batch supersede the same memory, each with the
        // copy it read (the hot index's, which holds no vector): both fold
        // onto the stored row, whose vector stays.
        let mut kept = Chunk::new("kept".into(), "s".into(), "I drink coffee".into(), 1);
        kept.embedding = Some(vec![0.25; 8]);
        store.upsert(vec![kept.clone()]).await.unwrap();
        let copies = [("u1", "first_cue"), ("u2", "second_cue")].map(|(by, cue)| {
            let mut c = Chunk {
                embedding: None,
                superseded_by: Some(by.into()),
                ..kept.clone()
            };
            c.annotate(cue, serde_json::json!(true));
            c
        });
        let updates = ["u1", "u2"]
            .map(|id| Chunk::new(id.into(), "s".into(), format!("update {id}"), 6))
            .to_vec();
        store
            .commit_with_side_effects(updates, copies.to_vec())
            .await
            .unwrap();
        let got = store.get("kept").await.unwrap().unwrap();
        assert_eq!(got.embedding.as_deref(), Some(&[0.25f32; 8][..]));
        assert_eq!(got.superseded_by.as_deref(), Some("u2"));
        let meta: serde_json::Value =
            serde_json::from_str(got.extraction_meta.as_deref().unwrap()).unwrap();
        assert_eq!(
            (&meta["first_cue"], &meta["second_cue"]),
            (&serde_json::json!(true), &serde_json::json!(true))
        );
        // A side effect on a memory deleted since the stage read it is
        // dropped: the delete wins.
        let tea = Chunk::new("tea".into(), "s".into(), "I drink tea".into(), 1);
        store.upsert(vec![tea.clone()]).await.unwrap();
        store
            .delete(&crate::store::Filter::new().id("tea"))
            .await
            .unwrap();
        let late = Chunk {
            superseded_by: Some("new".into()),
            ..tea
        };
        store
            .commit_with_side_effects(vec![], vec![late])
            .await
            .unwrap();
        assert!(
            store.get("tea").await.unwrap().is_none(),
            "deleted stays deleted"
        );
    }
}
