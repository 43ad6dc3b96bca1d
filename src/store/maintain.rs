//! Keeping the tables in shape without an operator. Every commit adds a Lance
//! fragment; left alone, thousands of small writes make thousands of fragments
//! and every read pays for each one. So:
//!
//! - the chunk writer merges small fragments every `compact_every_commits`
//!   commits, beside its appends and the side effects on fragments the
//!   merge has not taken (`claims`); its other writes that replace or
//!   delete rows wait for the merge (no write of its own meets it in a
//!   conflict);
//! - a maintainer task looks at every other table on an interval and merges
//!   the small fragments of any that has gathered too many;
//! - the `compact` job runs the full pass (merge into large fragments, fold new
//!   rows into the indexes, prune old versions).
//!
//! Fragments are merged up to `target_rows_per_fragment` rows (fewer where
//! rows are wide: [`fragment_rows`]), so a routine merge rewrites only the
//! recent small fragments, never the whole table.
//! A commit conflict (another process, a concurrent update) is retried.

use std::collections::HashMap;
use std::time::Duration;

use lancedb::table::{CompactionOptions, OptimizeAction, OptimizeOptions};
use lancedb::Table;

use super::claims::Claims;
use super::Result;

/// How the store keeps its tables in shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Maintenance {
    /// The chunk writer merges small fragments after this many commits (0 = never).
    pub compact_every_commits: usize,
    /// A routine merge builds fragments of up to this many rows.
    pub target_rows_per_fragment: usize,
    /// How often the other tables are checked (zero = never).
    pub check_every: Duration,
    /// A table with more fragments than this is merged.
    pub max_fragments: usize,
}

impl Default for Maintenance {
    fn default() -> Self {
        Maintenance {
            compact_every_commits: 32,
            target_rows_per_fragment: 8192,
            check_every: Duration::from_secs(10),
            max_fragments: 32,
        }
    }
}

impl Maintenance {
    /// No routine maintenance (the `compact` job still runs on demand).
    pub fn off() -> Maintenance {
        Maintenance {
            compact_every_commits: 0,
            check_every: Duration::ZERO,
            ..Maintenance::default()
        }
    }
}

/// Attempts of one maintenance step before its error is reported.
const ATTEMPTS: u32 = 5;

/// True for the errors Lance asks to retry: a concurrent commit won.
pub(super) fn is_conflict(e: &lancedb::Error) -> bool {
    let text = e.to_string().to_lowercase();
    text.contains("conflict") || text.contains("retryable")
}

/// Run `step` until it succeeds, retrying commit conflicts with a growing pause.
async fn retrying<F, Fut, T>(what: &str, mut step: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = lancedb::Result<T>>,
{
    let mut pause = Duration::from_millis(20);
    for attempt in 1..=ATTEMPTS {
        match step().await {
            Ok(v) => return Ok(v),
            Err(e) if attempt < ATTEMPTS && is_conflict(&e) => {
                tracing::debug!(%what, attempt, error = %e, "maintenance conflict; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            Err(e) => return Err(e.into()),
        }
    }
    unreachable!("the last attempt returns")
}

/// A routine merge's fragment holds at most about this many bytes...
const FRAGMENT_MAX_BYTES: usize = 8 << 20;
/// ...but never fewer rows than this (or `target_rows`, if fewer).
const FRAGMENT_MIN_ROWS: usize = 256;

/// The rows a routine merge of `table` builds its fragments up to:
/// `target_rows`, or fewer where the rows are wide (see [`rows_within`]).
pub async fn fragment_rows(table: &Table, target_rows: usize) -> usize {
    match table.stats().await {
        Ok(s) => fragment_rows_of(&s, target_rows),
        Err(_) => target_rows,
    }
}

/// [`fragment_rows`] from statistics already read.
fn fragment_rows_of(stats: &lancedb::table::TableStatistics, target_rows: usize) -> usize {
    let rows = stats.num_rows + stats.num_deleted_rows.unwrap_or(0);
    rows_within(target_rows, stats.total_bytes, rows)
}

/// `target_rows`, or as many rows of `bytes / rows` bytes each as fill
/// [`FRAGMENT_MAX_BYTES`], if fewer. Lance merges every fragment of fewer
/// rows than the target, so a table whose rows are wide never fills one
/// (the graph's: an entity's or edge's row holds up to 2,000 memory ids,
/// tens of kilobytes, and a million memories make a few thousand of them)
/// and each merge rewrote all of it: the graph's tidy passes grew from
/// 0.1 s to 12 s over a bulk import to a million memories. A fragment that
/// holds its share of bytes is left alone, like any full one.
pub(super) fn rows_within(target_rows: usize, bytes: usize, rows: usize) -> usize {
    let per_row = (bytes / rows.max(1)).max(1);
    target_rows
        .min(FRAGMENT_MAX_BYTES / per_row)
        .max(FRAGMENT_MIN_ROWS.min(target_rows))
}

/// Merge the small fragments of `table` into fragments of up to
/// `target_rows` rows (a no-op when there is nothing to merge).
pub async fn merge_small_fragments(table: &Table, target_rows: usize) -> Result<()> {
    let stats = retrying("compact", || {
        table.optimize(OptimizeAction::Compact {
            options: compaction(target_rows),
            remap_options: None,
        })
    })
    .await?;
    merged(table, stats.compaction);
    Ok(())
}

fn compaction(target_rows: usize) -> CompactionOptions {
    CompactionOptions {
        target_rows_per_fragment: target_rows,
        ..Default::default()
    }
}

fn merged(table: &Table, metrics: Option<lance::dataset::optimize::CompactionMetrics>) {
    if let Some(m) = metrics {
        tracing::debug!(
            table = %table.name(),
            fragments_removed = m.fragments_removed,
            fragments_added = m.fragments_added,
            "fragments merged"
        );
    }
}

/// A fragment of at least this share of the routine merges' target (256 of
/// 8,192 rows) is a fair one: a bulk commit's, not an agent's store.
const FAIR_FRAGMENT_SHARE: usize = 32;

/// The fewest rows of a fair fragment (see [`FAIR_FRAGMENT_SHARE`]).
pub(super) fn fair_rows(target_rows: usize) -> usize {
    (target_rows / FAIR_FRAGMENT_SHARE).max(1)
}

/// [`merge_small_fragments`] beside the chunk writer's updates (see
/// [`Claims`]): Lance's plan, less the groups that hold a fragment an
/// update is writing and, with `spare`, the newest fragments (up to
/// `target_rows` rows of them) and every fair one ([`fair_rows`]), which
/// the second tier takes as they are; the rest are taken before they are
/// rewritten. Whether it left out any fragment the plan would have merged
/// (a merge once the writer rests should take them).
///
/// A bulk import's commits leave fair fragments (1,660 rows on average
/// over a 1M-record import). Merged here first, each of their rows was
/// rewritten twice before it reached an ordered fragment of the second
/// tier: the small merge, then the ordered one, each with its remap of the
/// indexes.
async fn merge_small_fragments_claimed(
    table: &Table,
    target_rows: usize,
    claims: &Claims,
    spare: bool,
) -> Result<bool> {
    let Some(handle) = table.dataset() else {
        merge_small_fragments(table, target_rows).await?;
        return Ok(false);
    };
    let (metrics, left) = retrying("compact", || async {
        handle.ensure_mutable()?;
        let mut ds = (*handle.get().await?).clone();
        let mut options = compaction(target_rows);
        let fragments = &ds.manifest.fragments;
        if spare {
            let fair = fair_rows(target_rows);
            options.excluded_fragment_ids = fragments
                .iter()
                .filter(|f| super::ordered_merge::rows_of(f) >= fair)
                .map(|f| f.id as u32)
                .collect();
        }
        let mut plan = lance::dataset::optimize::plan_compaction(&ds, &options).await?;
        let spared = if spare {
            super::ordered_merge::newest(fragments, target_rows)
        } else {
            Default::default()
        };
        // A group is a run of neighbouring fragments, so the newest are at
        // the end of the last: they are cut off it (a run left with one
        // fragment of several would merge nothing).
        let planned = plan.tasks.len();
        let mut trimmed = false;
        let tasks: Vec<_> = plan
            .tasks
            .into_iter()
            .filter_map(|mut t| {
                let before = t.fragments.len();
                t.fragments.retain(|f| !spared.contains(&f.id));
                let kept = t.fragments.len();
                trimmed |= kept < before;
                (kept == before || kept >= 2).then_some(t)
            })
            .collect();
        plan.tasks = claims.for_merge(tasks, |t| t.fragments.iter().map(|f| f.id).collect());
        let left = trimmed || plan.tasks.len() < planned;
        if plan.tasks.is_empty() {
            return Ok((None, left));
        }
        // One group at a time: the merge runs beside the writer, and a
        // burst over every core would only hold up its commits.
        let mut rewritten = Vec::with_capacity(plan.tasks.len());
        for task in plan.compaction_tasks() {
            rewritten.push(task.execute(&ds).await?);
        }
        let remap =
            std::sync::Arc::new(lance::dataset::index::DatasetIndexRemapperOptions::default());
        let metrics =
            lance::dataset::optimize::commit_compaction(&mut ds, rewritten, remap, &options)
                .await?;
        handle.update(ds);
        Ok((Some(metrics), left))
    })
    .await?;
    merged(table, metrics);
    Ok(left)
}

/// Full fragments of one tier that make one of the next.
pub const TIER_FAN: usize = 8;

/// The ordered tiers above the routine merges' fragments: with the default
/// 8,192 rows, fragments of 65,536, 524,288 and 4,194,304 rows. Larger ones
/// are not merged again.
pub const ORDERED_TIERS: usize = 3;

/// [`merge_small_fragments`], then the ordered tiers, lowest first: once
/// `TIER_FAN` fragments of a tier are full (the second tier's hold
/// `target_rows` rows or more, or are fair ones a bulk commit left; a
/// higher tier's 7/8 of the tier below's size), they are rewritten in
/// groups of up to `TIER_FAN` times their size, each group as one
/// fragment whose rows are ordered by `key` (a stream's rows together),
/// the indexes remapped to the moved rows ([`super::ordered_merge`]). The
/// small fragments at the tail are left to the routine merges.
///
/// Every read pays for each fragment a stream's rows lie in, and for rows
/// scattered through a fragment: rows stored by writers into many streams
/// lie in all of them. A small stream's first read from a 1M-row table took
/// 63 ms in 8,192-row fragments, 29 ms in 65,536-row ones and 7.5 ms with
/// those ordered by stream (README, **Where a stream's rows lie**); the
/// third tier makes one fragment of eight of those. Each row is rewritten
/// once more per tier it climbs (at most four times in all).
pub async fn merge_fragments_in_tiers(table: &Table, target_rows: usize, key: &str) -> Result<()> {
    merge_in_tiers(table, target_rows, key, Reach::Every(None), None).await?;
    Ok(())
}

/// How far up the ordered tiers one pass of [`merge_in_tiers`] goes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Reach<'a> {
    /// The second tier only: the writer's merges while it writes. A higher
    /// tier's merge takes half a minute at a million rows, and every
    /// write that replaces rows would wait for it.
    Second,
    /// Every tier; with `Some`, each merge above the second gives way as
    /// soon as that is notified, at any point before its commit (the
    /// writer's merges once it rests: a write that replaces rows notifies
    /// rather than waits).
    Every(Option<&'a tokio::sync::Notify>),
}

/// [`merge_fragments_in_tiers`], as far up as `reach` says, beside the
/// updates `claims` shares fragments with, if any; whether it left work for
/// a merge once the writer rests: a tier above the second with enough full
/// fragments to merge (out of reach, or given way), or small fragments it
/// spared or an update held.
pub(super) async fn merge_in_tiers(
    table: &Table,
    target_rows: usize,
    key: &str,
    reach: Reach<'_>,
    claims: Option<&Claims>,
) -> Result<bool> {
    // While the writer writes, the newest fragments are spared (see
    // `claims::newest`) and the fair ones go to the second tier as they
    // are; what is left then is owed to a merge once it rests, which
    // spares nothing: an idle store keeps no fragment unmerged.
    let writing = claims.is_some() && matches!(reach, Reach::Second);
    let spare = writing.then_some(target_rows);
    let left = match claims {
        // The second tier spares the newest fragments too, and takes a bulk
        // commit's only once they fill a group: a merge once the writer
        // rests is owed whenever one ran while it wrote.
        Some(claims) => {
            merge_small_fragments_claimed(table, target_rows, claims, writing).await? || writing
        }
        None => {
            merge_small_fragments(table, target_rows).await?;
            false
        }
    };
    let tiers = super::ordered_merge::tiers(target_rows, TIER_FAN, ORDERED_TIERS);
    let climb = match reach {
        Reach::Second => 1,
        Reach::Every(_) => tiers.len(),
    };
    for (k, tier) in tiers.iter().enumerate() {
        // Each tier is counted after the merges below it, which may fill it.
        // `None`: a table the merge cannot rewrite (one with stable row
        // ids, which loomem never creates).
        let Some(full) = super::ordered_merge::fragments_in_tier(table, *tier).await else {
            return Ok(left);
        };
        if full < TIER_FAN {
            continue;
        }
        if k >= climb {
            return Ok(true);
        }
        let give_way = match reach {
            Reach::Every(Some(notify)) if k > 0 => Some(notify),
            _ => None,
        };
        let merged = retrying("ordered merge", || {
            super::ordered_merge::merge_ordered(table, key, *tier, give_way, claims, spare)
        })
        .await?;
        let Some(merged) = merged else {
            tracing::debug!(table = %table.name(), tier = k + 2, "ordered merge gave way to a write");
            return Ok(true);
        };
        tracing::debug!(table = %table.name(), merged, tier = k + 2, "full fragments merged by {key}");
    }
    Ok(left)
}

/// Fold rows written since the last refresh into the table's indexes (the
/// `compact` job's pass): the scalar and full-text indexes each merged into
/// one segment, whatever [`refresh_indexes_routinely`] appended; the vector
/// index as Lance's default optimisation does.
pub async fn refresh_indexes(table: &Table) -> Result<()> {
    let (vector, other): (Vec<_>, Vec<_>) = table
        .list_indices()
        .await?
        .into_iter()
        .partition(is_vector_index);
    if !other.is_empty() {
        let mut options = OptimizeOptions::merge(usize::MAX);
        options.index_names = Some(other.into_iter().map(|i| i.name).collect());
        optimize_indexes(table, "index", options).await?;
    }
    if !vector.is_empty() {
        let mut options = OptimizeOptions::default();
        options.index_names = Some(vector.into_iter().map(|i| i.name).collect());
        optimize_indexes(table, "vector index", options).await?;
    }
    Ok(())
}

/// Whether an index is the vector index (on `embedding`).
pub(super) fn is_vector_index(index: &lancedb::index::IndexConfig) -> bool {
    index.columns.iter().any(|c| c == "embedding")
}

/// One index optimisation, its commit conflicts retried.
async fn optimize_indexes(table: &Table, what: &str, options: OptimizeOptions) -> Result<()> {
    retrying(what, || {
        table.optimize(OptimizeAction::Index(options.clone()))
    })
    .await?;
    Ok(())
}

/// A routine refresh's vector index takes the rows written since it was
/// built as a new piece (a delta) once they are this many...
const VECTOR_DELTA_MIN_ROWS: usize = 10_000;
/// ...and at least this share of the rows it covers;
const VECTOR_DELTA_SHARE: usize = 4;
/// a refresh that finds this many pieces merges them into one.
const VECTOR_MAX_PIECES: u32 = 8;

/// What a routine refresh does to an index, given its statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IndexFold {
    /// Too few new rows: they are searched flat meanwhile.
    Wait,
    /// Index the new rows as a piece of their own; the old pieces stay.
    Append,
    /// Rebuild every piece and the new rows as one.
    Merge(usize),
}

/// The vector index's refresh policy. Merging new rows into an IVF-HNSW
/// index rebuilds the graphs of every row it holds, so folding 10k rows into
/// a 300k-row index that way costs as much as building it anew; done every
/// 10k rows, the index work of a bulk import grows with the square of the
/// table (~150 builds a row over a load to 3M rows). New rows are indexed as
/// a delta once they are a quarter of the indexed ones, and the pieces
/// merged once there are eight: each row is rebuilt a bounded number of
/// times as the table grows geometrically.
pub(super) fn vector_fold(indexed: usize, unindexed: usize, pieces: u32) -> IndexFold {
    if unindexed < VECTOR_DELTA_MIN_ROWS.max(indexed / VECTOR_DELTA_SHARE) {
        IndexFold::Wait
    } else if pieces + 1 >= VECTOR_MAX_PIECES {
        IndexFold::Merge(pieces as usize)
    } else {
        IndexFold::Append
    }
}

/// A routine refresh that finds this many segments of a scalar or
/// full-text index merges them into one.
const SCALAR_MAX_PIECES: u32 = 8;

/// The scalar and full-text indexes' refresh policy. Every refresh must
/// index the new rows (a merge on `id` probes the `id` index; rows it does
/// not cover are scanned), but folding them into the one segment rewrote the
/// whole index each time: the store's routine refreshes grew from 60 ms to
/// 600 ms over the first 6,000 small stores, and would keep growing with the
/// table. New rows become a segment of their own. Once a refresh would make
/// the eighth, the newest segments are merged with the new rows, tiered:
/// from the newest back, each older segment joins while it holds no more
/// rows than the merge has gathered so far (the newest always joins). A
/// large old segment is rewritten only once the newer ones add up to it, so
/// each row is rewritten about once each time the index doubles. Merging
/// every segment at eight rewrote the whole `id` index every 16,384 rows
/// of a bulk import, each id about 36 times over a load to a million rows
/// (README, Benchmarks: "Index segments merged in tiers").
/// `segments` holds each segment's rows, oldest first (Lance merges the
/// newest `n` when asked to merge `n`).
pub(super) fn scalar_fold(unindexed: usize, segments: &[usize]) -> IndexFold {
    if unindexed == 0 {
        return IndexFold::Wait;
    }
    if segments.len() + 1 < SCALAR_MAX_PIECES as usize {
        return IndexFold::Append;
    }
    let (mut gathered, mut n) = (unindexed, 0);
    for &rows in segments.iter().rev() {
        if n > 0 && rows > gathered {
            break;
        }
        gathered += rows;
        n += 1;
    }
    IndexFold::Merge(n)
}

/// The rows each index's segments cover, by index name, oldest segment
/// first: the rows of the fragments each segment's bitmap names.
async fn segment_rows(table: &Table) -> HashMap<String, Vec<usize>> {
    use lance::index::DatasetIndexExt;
    let mut by_name: HashMap<String, Vec<usize>> = HashMap::new();
    let Some(handle) = table.dataset() else {
        return by_name;
    };
    let Ok(ds) = handle.get().await else {
        return by_name;
    };
    let Ok(indices) = ds.load_indices().await else {
        return by_name;
    };
    let fragment_rows: HashMap<u64, usize> = ds
        .manifest
        .fragments
        .iter()
        .map(|f| (f.id, super::ordered_merge::rows_of(f)))
        .collect();
    for ix in indices.iter() {
        let rows = ix.fragment_bitmap.as_ref().map_or(0, |b| {
            b.iter()
                .map(|id| fragment_rows.get(&u64::from(id)).copied().unwrap_or(0))
                .sum()
        });
        by_name.entry(ix.name.clone()).or_default().push(rows);
    }
    by_name
}

/// How much of the new rows a routine refresh folds in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshScope {
    /// Every index's new rows (by [`scalar_fold`] and [`vector_fold`]): the
    /// writer is idle or writes slowly, and a refresh costs little.
    Everything,
    /// While rows pour in: the scalar and full-text indexes take their new
    /// rows only once [`secondary_due`] says so, but for the `id` index
    /// when `by_id`: the writer has read through it since its last refresh
    /// (a merge on `id` probes it, and a lookup by id scans the rows it does
    /// not cover). The others serve only reads that bypass the hot index
    /// (as-of searches, streams it does not hold), which search the rows
    /// they lack flat; the writer folds them in once it has been idle a
    /// while. A bulk import only appends (its ids are new and its moved
    /// memories' addresses remembered): refreshed at every 2,048 rows all
    /// the same, the `id` index took 159 refreshes and 7.3 s of wall time
    /// over a 1M-record import that read nothing through it.
    Pressing { by_id: bool },
}

/// Under [`RefreshScope::Pressing`], an index takes its new rows once they
/// are this many...
const SECONDARY_MIN_ROWS: usize = 16_384;
/// ...and at least this share of the rows it covers. Refreshed at every
/// 2,048 rows, the five scalar and full-text indexes took as much wall
/// time as the whole of a bulk import's batch commits (17 s over 300,000
/// records), the full-text index's segment merges the most.
const SECONDARY_SHARE: usize = 8;

/// Whether a pressing refresh folds an index's new rows in (see
/// [`RefreshScope::Pressing`]).
pub(super) fn secondary_due(indexed: usize, unindexed: usize) -> bool {
    unindexed >= SECONDARY_MIN_ROWS.max(indexed / SECONDARY_SHARE)
}

/// Whether an index is the one on `id` that merges join on.
fn is_id_index(index: &lancedb::index::IndexConfig) -> bool {
    index.columns == ["id"]
}

/// The writer's routine refresh: the scalar and full-text indexes take the
/// new rows by [`scalar_fold`] (within `scope`), the vector index by
/// [`vector_fold`]. Returns whether a scalar or full-text index was left
/// with rows it does not cover.
pub async fn refresh_indexes_routinely(table: &Table, scope: RefreshScope) -> Result<bool> {
    let mut behind = false;
    let segments = segment_rows(table).await;
    for index in table.list_indices().await? {
        let Some(stats) = table.index_stats(&index.name).await? else {
            continue;
        };
        let (indexed, unindexed) = (stats.num_indexed_rows, stats.num_unindexed_rows);
        let pieces = stats.num_indices.unwrap_or(1);
        let fold = if is_vector_index(&index) {
            vector_fold(indexed, unindexed, pieces)
        } else if matches!(scope, RefreshScope::Pressing { by_id } if !(by_id && is_id_index(&index)))
            && !secondary_due(indexed, unindexed)
        {
            behind |= unindexed > 0;
            IndexFold::Wait
        } else {
            // Sizes unknown (no Lance dataset to read them from): taken as
            // empty, so the segments all merge at eight.
            let unknown = || vec![0; pieces as usize];
            scalar_fold(
                unindexed,
                &segments.get(&index.name).cloned().unwrap_or_else(unknown),
            )
        };
        let started = std::time::Instant::now();
        fold_index(table, &index.name, fold).await?;
        tracing::debug!(index = %index.name, ?fold, indexed, unindexed, took = ?started.elapsed(), "index refresh");
    }
    Ok(behind)
}

/// Fold an index's new rows in as `fold` says.
pub(super) async fn fold_index(table: &Table, name: &str, fold: IndexFold) -> Result<()> {
    let mut options = match fold {
        IndexFold::Wait => return Ok(()),
        IndexFold::Append => OptimizeOptions::append(),
        IndexFold::Merge(n) => OptimizeOptions::merge(n),
    };
    options.index_names = Some(vec![name.to_string()]);
    optimize_indexes(table, "index", options).await
}

/// A runtime of one worker thread called `name`, its threads at the nice
/// value `niceness` (0: the process's own), started on first use and kept
/// for the life of the process.
fn one_thread(
    slot: &'static std::sync::OnceLock<tokio::runtime::Runtime>,
    name: &str,
    niceness: i32,
) -> std::io::Result<&'static tokio::runtime::Runtime> {
    if let Some(rt) = slot.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .on_thread_start(move || crate::core::thread::lower_priority(niceness))
        .enable_all()
        .build()?;
    // A racing first call builds a second runtime; the loser has run
    // nothing and is shut down without waiting (dropping a runtime inside
    // an async context panics, and every caller is one).
    let mut built = Some(rt);
    let rt = slot.get_or_init(|| built.take().expect("built once"));
    if let Some(loser) = built {
        loser.shutdown_background();
    }
    Ok(rt)
}

/// Run `work` on `runtime`, waiting here for its result.
async fn run_on<T, F>(
    runtime: std::io::Result<&'static tokio::runtime::Runtime>,
    work: F,
) -> Result<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T>> + Send + 'static,
{
    let failed = |message: String| super::StoreError::from(lancedb::Error::Runtime { message });
    runtime
        .map_err(|e| failed(e.to_string()))?
        .spawn(work)
        .await
        .map_err(|e| failed(e.to_string()))?
}

/// Size Lance's pool for compute work (`LANCE_CPU_THREADS`) so that an
/// index build cannot hold all of it. Lance sizes the pool at the CPUs less
/// two it keeps for I/O, at least one: one thread on this 2-core machine. A
/// vector index build fills the pool with its own tasks for minutes, and
/// every commit, fragment merge and graph pass that encodes or decodes
/// through Lance queued behind it: on a bulk import into ~500,000 rows a
/// batch commit, a history merge and a graph pass each waited 105–109 s
/// for a 117 s build. With more threads than CPUs they share the CPUs
/// instead. Sets the variable, unless it is set, to twice the CPUs and at
/// least 4. Call it before any other thread exists (it writes the process
/// environment) and before the store opens (Lance reads it once).
pub fn lance_threads() {
    if std::env::var_os("LANCE_CPU_THREADS").is_none() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::env::set_var("LANCE_CPU_THREADS", (2 * cpus).max(4).to_string());
    }
}

/// Whether a vector index is being built on a table. Lance cannot rebase
/// an index build over a merge of the fragments it covers ("CreateIndex
/// transaction was preempted by concurrent transaction Rewrite"): under a
/// bulk import a 5-minute build failed at its commit that way and started
/// again from nothing. So the merges beside the writer wait while a build
/// runs; appends go on (their rows are left for the next refresh).
#[derive(Clone, Default)]
pub struct VectorBuild(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl VectorBuild {
    pub fn running(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Mark a build as running until the returned guard drops.
    pub fn begin(&self) -> VectorBuildGuard {
        self.0.store(true, std::sync::atomic::Ordering::Release);
        VectorBuildGuard(self.clone())
    }
}

/// See [`VectorBuild::begin`].
pub struct VectorBuildGuard(VectorBuild);

impl Drop for VectorBuildGuard {
    fn drop(&mut self) {
        self.0 .0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// Run an index build on a runtime of its own. A build computes inside its
/// futures for seconds to minutes; on the engine's runtime it holds up the
/// workers that serve requests and commit writes (a first vector index
/// build stalled ingestion ~25x that way). That runtime lives as long as
/// the process. Lance keeps what a build opened, most likely with I/O tasks
/// on the runtime that opened it: while index refreshes ran on a runtime
/// made for each and dropped after it, the ingest bench hung, idle, in 3 of
/// 5 runs (none in 3 with the refreshes on the engine's runtime).
pub async fn apart<T, F>(work: F) -> Result<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T>> + Send + 'static,
{
    static BUILDS: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    run_on(one_thread(&BUILDS, "loomem-index-build", 0), work).await
}

/// Run a group commit of the entity graph on a runtime of its own (not the
/// index builds', which may hold it for minutes while a reader waits for
/// the commit). A commit of a few hundred rows computes for tens of
/// milliseconds inside its futures; on the engine's runtime that held up
/// the searches sharing its worker (search p95 under writes 15–21 ms,
/// against 11–14 ms with one small commit per batch).
pub async fn apart_for_graph<T, F>(work: F) -> Result<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T>> + Send + 'static,
{
    static GRAPH: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    run_on(one_thread(&GRAPH, "loomem-graph", 0), work).await
}

/// The runtime the chunk writer's fragment merges run on, its thread at
/// [`MERGE_NICENESS`]; `None` if it cannot be started (a merge then runs on
/// the caller's). Not the index refreshes: a refresh opens the scalar
/// indexes the writer's merges on `id` read through afterwards, and those
/// reads would wait on a thread that yields to everything else.
pub(super) fn merge_runtime() -> Option<&'static tokio::runtime::Runtime> {
    static MERGES: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    one_thread(&MERGES, "loomem-merge", MERGE_NICENESS).ok()
}

/// The nice value of the merges' thread. A merge is work the writer can
/// leave for later, and on a busy machine it took CPU from the pipeline's
/// stages and commits, which every record waits for: with the merges at
/// nice 10 a 1M-record hash import ran 19,094 and 19,597 records/s against
/// 18,470 and 19,147 with them at the process's own, alternated (README,
/// Benchmarks: "Merges at a lower priority"). Lance's encoding of the
/// merged rows still runs on its own pool, at the process's priority.
const MERGE_NICENESS: i32 = 10;

/// Drop every version of `table` but the latest that no tag holds (a
/// throwaway store's housekeeping: no `as_of` reaches back afterwards).
pub async fn prune_all_versions(table: &Table) -> Result<()> {
    retrying("prune", || {
        table.optimize(OptimizeAction::Prune {
            older_than: Some(chrono::Duration::zero()),
            delete_unverified: None,
            error_if_tagged_old_versions: Some(false),
        })
    })
    .await?;
    Ok(())
}

/// What a full pass did to one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PassReport {
    pub rows: usize,
    pub fragments_before: usize,
    pub fragments_after: usize,
    pub small_fragments_after: usize,
}

/// How a full pass merges a table's fragments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassMerge<'a> {
    /// Into Lance's large fragments (about a million rows), in stored order.
    Large,
    /// As the chunk writer does ([`merge_fragments_in_tiers`]): a merge into
    /// large fragments would undo its ordered tiers, leaving each stream's
    /// rows in a run of every merged fragment.
    Tiers { target_rows: usize, key: &'a str },
}

/// The full pass of the `compact` job: merge the fragments (`merge`),
/// refresh the indexes, prune versions older than `prune_older_than` that
/// no tag holds. With `dry_run`, only report.
pub async fn full_pass(
    table: &Table,
    merge: PassMerge<'_>,
    prune_older_than: Option<chrono::Duration>,
    dry_run: bool,
) -> Result<PassReport> {
    let before = table.stats().await?;
    if !dry_run {
        match merge {
            PassMerge::Large => {
                let large = CompactionOptions::default().target_rows_per_fragment;
                merge_small_fragments(table, large).await?
            }
            PassMerge::Tiers { target_rows, key } => {
                merge_fragments_in_tiers(table, target_rows, key).await?
            }
        }
        refresh_indexes(table).await?;
        retrying("prune", || {
            table.optimize(OptimizeAction::Prune {
                older_than: prune_older_than,
                delete_unverified: None,
                error_if_tagged_old_versions: Some(false),
            })
        })
        .await?;
    }
    let after = table.stats().await?;
    Ok(PassReport {
        rows: after.num_rows,
        fragments_before: before.fragment_stats.num_fragments,
        fragments_after: after.fragment_stats.num_fragments,
        small_fragments_after: after.fragment_stats.num_small_fragments,
    })
}

/// What [`erase_deleted`] removed from one table's files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Erased {
    /// Table versions removed (every one but the current and the tagged).
    pub versions_removed: u64,
    pub bytes_removed: u64,
}

/// Erase deleted rows from `table`'s files. A Lance delete only marks rows:
/// their values stay in the data files (and the words of a text in the
/// full-text index) for as long as any version refers to them. So: rewrite
/// every fragment holding a deleted row (compaction with the deletions
/// materialised, whatever their share), rebuild the full-text index when
/// the table has one (`fts_column`), then remove every version but the
/// current one that no tag (snapshot) holds, with the files only they used.
/// Files not referenced by any version are left to the `compact` job's age
/// rule, so a write under way elsewhere never loses its files.
pub async fn erase_deleted(table: &Table, fts_column: Option<&str>) -> Result<Erased> {
    retrying("compact", || {
        table.optimize(OptimizeAction::Compact {
            options: CompactionOptions {
                materialize_deletions: true,
                materialize_deletions_threshold: 0.0,
                ..Default::default()
            },
            remap_options: None,
        })
    })
    .await?;
    if let Some(column) = fts_column {
        retrying("full-text index", || async {
            table
                .create_index(&[column], lancedb::index::Index::FTS(Default::default()))
                .replace(true)
                .execute()
                .await
        })
        .await?;
    }
    refresh_indexes(table).await?;
    let stats = retrying("prune", || {
        table.optimize(OptimizeAction::Prune {
            older_than: Some(chrono::Duration::zero()),
            delete_unverified: Some(false),
            error_if_tagged_old_versions: Some(false),
        })
    })
    .await?;
    let removed = stats.prune.unwrap_or_default();
    Ok(Erased {
        versions_removed: removed.old_versions,
        bytes_removed: removed.bytes_removed,
    })
}

/// Check `tables` every `m.check_every` and merge the small fragments of any
/// with more than `m.max_fragments` (up to [`fragment_rows`]); runs until
/// aborted.
pub async fn watch(tables: Vec<(&'static str, Table)>, m: Maintenance) {
    if m.check_every.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(m.check_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for (name, table) in &tables {
            let stats = match table.stats().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(table = name, error = %e, "table stats unavailable");
                    continue;
                }
            };
            let fragments = stats.fragment_stats.num_fragments;
            if fragments <= m.max_fragments {
                continue;
            }
            let started = std::time::Instant::now();
            let target = fragment_rows_of(&stats, m.target_rows_per_fragment);
            match merge_small_fragments(table, target).await {
                Ok(()) => {
                    tracing::debug!(table = name, fragments, took = ?started.elapsed(), "small fragments merged")
                }
                Err(e) => {
                    tracing::warn!(table = name, error = %e, "fragment merge failed; will retry")
                }
            }
        }
    }
}

/// Aborts its task when dropped (the store's maintainer dies with the store).
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Chunk;
    use crate::store::Store;

    /// Narrow rows (a history entry's) keep the target; wide ones (an
    /// entity's row with hundreds of memory ids) fill a fragment by bytes,
    /// so a merge leaves full ones alone; no table goes below the floor,
    /// and an empty one keeps the target.
    #[test]
    fn wide_rows_fill_a_fragment_by_bytes() {
        assert_eq!(rows_within(8192, 1_000 * 100_000, 100_000), 8192);
        let wide = rows_within(8192, 10_000 * 5_000, 5_000);
        assert_eq!(wide, FRAGMENT_MAX_BYTES / 10_000);
        assert!((256..1_000).contains(&wide), "{wide}");
        assert_eq!(rows_within(8192, 10 << 20, 2), FRAGMENT_MIN_ROWS);
        assert_eq!(rows_within(100, 10 << 20, 2), 100);
        assert_eq!(rows_within(8192, 0, 0), 8192);
    }

    /// A bulk load from 100k to 3M rows, refreshed every 10k rows: the
    /// vector index never holds more than eight pieces, never leaves more
    /// than a quarter of its rows (plus one refresh's worth) unindexed, and
    /// builds each row a bounded number of times (merging every refresh
    /// builds them ~150 times over).
    #[test]
    fn the_vector_index_refresh_rebuilds_each_row_a_bounded_number_of_times() {
        let (mut indexed, mut unindexed, mut pieces) = (100_000usize, 0usize, 1u32);
        let mut built = indexed;
        while indexed + unindexed < 3_000_000 {
            unindexed += 10_000;
            assert!(
                unindexed <= 10_000 + indexed / 4,
                "{unindexed} of {indexed} unindexed"
            );
            match vector_fold(indexed, unindexed, pieces) {
                IndexFold::Wait => continue,
                IndexFold::Append => {
                    built += unindexed;
                    pieces += 1;
                }
                IndexFold::Merge(n) => {
                    assert_eq!(n, pieces as usize, "every piece is merged");
                    built += indexed + unindexed;
                    pieces = 1;
                }
            }
            indexed += std::mem::take(&mut unindexed);
            assert!(pieces < VECTOR_MAX_PIECES, "{pieces} pieces");
        }
        let rows = indexed + unindexed;
        assert!(built <= 6 * rows, "{built} rows built for {rows}");
    }

    /// A bulk load to 3M rows, the `id` index refreshed every 2,048 rows:
    /// the segments stay under eight, the newest are merged first, and each
    /// row is rewritten a few times (merging every segment at eight rewrote
    /// each about 106 times over).
    #[test]
    fn scalar_segments_merge_in_tiers_and_rewrite_each_row_a_few_times() {
        let (mut segments, mut rows, mut written) = (Vec::<usize>::new(), 0usize, 0usize);
        let mut merged_all = 0;
        while rows < 3_000_000 {
            let new = 2_048;
            match scalar_fold(new, &segments) {
                IndexFold::Wait => unreachable!("new rows are never left waiting"),
                IndexFold::Append => segments.push(new),
                IndexFold::Merge(n) => {
                    assert!(n >= 1 && n <= segments.len(), "{n} of {segments:?}");
                    merged_all += usize::from(n == segments.len());
                    let kept = segments.len() - n;
                    let merged = new + segments[kept..].iter().sum::<usize>();
                    segments.truncate(kept);
                    segments.push(merged);
                }
            }
            written += segments.last().copied().unwrap();
            rows += new;
            assert!(segments.len() < SCALAR_MAX_PIECES as usize, "{segments:?}");
        }
        assert!(written <= 8 * rows, "{written} rows written for {rows}");
        // The oldest segment is rewritten only as the index grows: a few
        // times in 1,465 refreshes.
        assert!((1..=12).contains(&merged_all), "{merged_all} full merges");
        // Older segments hold more rows than newer ones.
        assert!(segments.windows(2).all(|w| w[0] >= w[1]), "{segments:?}");
        assert_eq!(scalar_fold(0, &segments), IndexFold::Wait);
    }

    /// Lance does what [`vector_fold`] asks: a few new rows wait, an append
    /// makes them a piece of the vector index of their own, a merge folds
    /// every piece and the new rows into one.
    #[tokio::test]
    async fn routine_refreshes_append_vector_pieces_then_merge_them() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        let write = |from: usize, n: usize| {
            let store = &store;
            async move { store.upsert(memories_with_vectors(from, n)).await.unwrap() }
        };
        write(0, 1_000).await;
        assert!(store.ensure_vector_index(256).await.unwrap());
        let table = store.chunks_table();
        let name = table
            .list_indices()
            .await
            .unwrap()
            .into_iter()
            .find(|i| i.columns == ["embedding"])
            .unwrap()
            .name;
        let stats = || async { table.index_stats(&name).await.unwrap().unwrap() };
        // Fewer new rows than a refresh waits for stay unindexed.
        write(1_000, 300).await;
        refresh_indexes_routinely(table, RefreshScope::Everything)
            .await
            .unwrap();
        assert_eq!(stats().await.num_unindexed_rows, 300);
        fold_index(table, &name, IndexFold::Append).await.unwrap();
        let s = stats().await;
        assert_eq!((s.num_indexed_rows, s.num_unindexed_rows), (1_300, 0));
        assert_eq!(s.num_indices, Some(2), "appended as a piece");
        write(1_300, 300).await;
        fold_index(table, &name, IndexFold::Append).await.unwrap();
        assert_eq!(stats().await.num_indices, Some(3));
        write(1_600, 300).await;
        fold_index(table, &name, IndexFold::Merge(3)).await.unwrap();
        let s = stats().await;
        assert_eq!((s.num_indexed_rows, s.num_unindexed_rows), (1_900, 0));
        assert_eq!(s.num_indices, Some(1), "merged into one");
        // The merged index answers: a row's own vector finds a row at no
        // distance (the vectors repeat every 97 rows).
        let hits = store
            .search_vector_lance(None, &vector_of(1_750), &crate::store::Filter::new(), 5)
            .await
            .unwrap();
        assert!(hits.first().is_some_and(|h| h.score < 1e-3), "{hits:?}");
        // Searches for more rows than the graph's least candidate list, with
        // their candidates re-scored and without, answer in full, nearest first.
        for k in [60, 200] {
            let hits = store
                .search_vector_lance(None, &vector_of(1_750), &crate::store::Filter::new(), k)
                .await
                .unwrap();
            assert_eq!(hits.len(), k);
            let ordered = hits.windows(2).all(|w| w[0].score <= w[1].score);
            assert!(ordered, "{hits:?}");
        }
    }

    /// Routine refreshes add the new rows to the scalar and full-text
    /// indexes as segments of their own and merge the segments at eight:
    /// every row stays indexed, and the indexes still answer for all of them.
    #[tokio::test]
    async fn routine_refreshes_append_scalar_segments_then_merge_them() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        let table = store.chunks_table();
        let (mut most, mut merged) = (0u32, false);
        for round in 0..12 {
            store
                .upsert(memories_with_vectors(round * 20, 20))
                .await
                .unwrap();
            refresh_indexes_routinely(table, RefreshScope::Everything)
                .await
                .unwrap();
            let mut pieces = Vec::new();
            for index in table.list_indices().await.unwrap() {
                if index.columns == ["embedding"] {
                    continue;
                }
                let s = table.index_stats(&index.name).await.unwrap().unwrap();
                assert_eq!(
                    s.num_unindexed_rows, 0,
                    "{} after round {round}",
                    index.name
                );
                pieces.push(s.num_indices.unwrap_or(1));
            }
            assert_eq!(
                pieces.len(),
                5,
                "content, id, content_hash, stream, embed_model"
            );
            let n = *pieces.iter().max().unwrap();
            assert!(n < SCALAR_MAX_PIECES, "{n} segments after round {round}");
            merged |= n < most;
            most = most.max(n);
        }
        assert!(
            most > 2 && merged,
            "segments appended ({most}) and merged ({merged})"
        );
        // Every round's rows are found through the indexes: by id (the merge
        // on `id` a write makes) and by a word of their text.
        let ids: Vec<String> = (0..12).map(|r| format!("id{}", r * 20 + 7)).collect();
        assert_eq!(store.owners(&ids).await.unwrap().len(), 12);
        for id in &ids {
            let hits = store
                .search_text_lance(None, &id[2..], &crate::store::Filter::new(), 3)
                .await
                .unwrap();
            assert_eq!(hits.first().map(|h| h.id.as_str()), Some(id.as_str()));
        }
    }

    /// Lance does what a tiered [`scalar_fold`] asks: merging the newest
    /// two segments with the new rows leaves the older segments as they
    /// were, the merged one comes last (so sizes read oldest first, as the
    /// policy takes them), and every row is still found through the `id`
    /// index and the full-text index.
    #[tokio::test]
    async fn a_tiered_merge_folds_the_newest_segments_and_keeps_the_older() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        let table = store.chunks_table();
        let named = |column: &'static str| async move {
            table
                .list_indices()
                .await
                .unwrap()
                .into_iter()
                .find(|i| i.columns == [column])
                .unwrap()
                .name
        };
        let (id, content) = (named("id").await, named("content").await);
        let mut from = 0;
        for n in [100, 30, 20] {
            store.upsert(memories_with_vectors(from, n)).await.unwrap();
            for name in [&id, &content] {
                fold_index(table, name, IndexFold::Append).await.unwrap();
            }
            from += n;
        }
        let before = segment_rows(table).await;
        for name in [&id, &content] {
            let rows = &before[name.as_str()];
            assert_eq!(rows[rows.len() - 3..], [100, 30, 20], "{name}: {rows:?}");
        }
        store.upsert(memories_with_vectors(from, 10)).await.unwrap();
        from += 10;
        for name in [&id, &content] {
            fold_index(table, name, IndexFold::Merge(2)).await.unwrap();
        }
        let after = segment_rows(table).await;
        for name in [&id, &content] {
            let (old, new) = (&before[name.as_str()], &after[name.as_str()]);
            assert_eq!(new.len(), old.len() - 1, "{name}: {old:?} → {new:?}");
            assert_eq!(new[..new.len() - 1], old[..old.len() - 2], "{name}");
            assert_eq!(new.last(), Some(&60), "{name}: 30 + 20 + 10 new rows");
            let s = table.index_stats(name).await.unwrap().unwrap();
            assert_eq!(
                (s.num_indexed_rows, s.num_unindexed_rows),
                (from, 0),
                "{name}"
            );
        }
        let ids: Vec<String> = (0..from).map(|i| format!("id{i}")).collect();
        assert_eq!(store.owners(&ids).await.unwrap().len(), from);
        for i in [5, 110, 135, 155] {
            let hits = store
                .search_text_lance(None, &i.to_string(), &crate::store::Filter::new(), 3)
                .await
                .unwrap();
            let want = format!("id{i}");
            assert_eq!(hits.first().map(|h| h.id.as_str()), Some(want.as_str()));
        }
    }

    /// A pressing refresh leaves the scalar and full-text indexes to a later
    /// one (saying so), until their new rows are a share of the table, and
    /// so the `id` index unless the writer read through it; a refresh of
    /// everything then covers every row, and the text and the ids are
    /// found before and after.
    #[tokio::test]
    async fn pressing_refreshes_index_ids_when_read_and_leave_the_rest_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        let table = store.chunks_table();
        let unindexed = || async {
            let mut by_index = std::collections::BTreeMap::new();
            for index in table.list_indices().await.unwrap() {
                let s = table.index_stats(&index.name).await.unwrap().unwrap();
                by_index.insert(index.columns.join(","), s.num_unindexed_rows);
            }
            by_index
        };
        store.upsert(memories_with_vectors(0, 40)).await.unwrap();
        let behind = refresh_indexes_routinely(table, RefreshScope::Pressing { by_id: false })
            .await
            .unwrap();
        let left = unindexed().await;
        assert!(behind, "{left:?}");
        assert!(left.values().all(|n| *n == 40), "{left:?}");
        let by_id = crate::store::Filter::new().ids(&["id7"]);
        let found = store.find(&by_id, None).await.unwrap();
        assert_eq!(found[0].id, "id7", "found by id, flat");
        let behind = refresh_indexes_routinely(table, RefreshScope::Pressing { by_id: true })
            .await
            .unwrap();
        let left = unindexed().await;
        assert!(behind, "{left:?}");
        assert_eq!(left["id"], 0, "{left:?}");
        for column in ["content", "content_hash", "stream", "embed_model"] {
            assert_eq!(left[column], 40, "{column}: {left:?}");
        }
        // Rows an index lacks are still found (Lance searches them flat).
        let hits = store
            .search_text_lance(None, "17", &crate::store::Filter::new(), 3)
            .await
            .unwrap();
        assert_eq!(hits.first().map(|h| h.id.as_str()), Some("id17"));
        let behind = refresh_indexes_routinely(table, RefreshScope::Everything)
            .await
            .unwrap();
        assert!(!behind);
        assert!(unindexed().await.values().all(|n| *n == 0));
        let hits = store
            .search_text_lance(None, "17", &crate::store::Filter::new(), 3)
            .await
            .unwrap();
        assert_eq!(hits.first().map(|h| h.id.as_str()), Some("id17"));
    }

    #[test]
    fn secondary_indexes_wait_for_a_share_of_the_table() {
        assert!(!secondary_due(0, SECONDARY_MIN_ROWS - 1));
        assert!(secondary_due(0, SECONDARY_MIN_ROWS));
        assert!(!secondary_due(800_000, 99_999));
        assert!(secondary_due(800_000, 100_000));
    }

    /// The writer counts the rows it commits, new and replaced (what the
    /// vector indexer reads as how fast rows arrive); a write of nothing
    /// counts nothing.
    #[tokio::test]
    async fn the_writer_counts_the_rows_it_commits() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        assert_eq!(store.rows_written(), 0);
        store.upsert(memories_with_vectors(0, 300)).await.unwrap();
        assert_eq!(store.rows_written(), 300);
        store.upsert(memories_with_vectors(200, 150)).await.unwrap();
        assert_eq!(store.rows_written(), 450);
        store.upsert(Vec::new()).await.unwrap();
        assert_eq!(store.rows_written(), 450);
    }

    /// Work run `apart` leaves nothing behind that later reads on the
    /// caller's runtime wait on: after an index build and a refresh there,
    /// merges on `id` and a vector search through Lance answer.
    #[tokio::test]
    async fn reads_after_builds_apart_answer() {
        let tmp = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(open(tmp.path(), Maintenance::off()).await);
        let rows = memories_with_vectors;
        store.upsert(rows(0, 600)).await.unwrap();
        let s = store.clone();
        assert!(apart(async move { s.ensure_vector_index(256).await })
            .await
            .unwrap());
        store.upsert(rows(600, 300)).await.unwrap();
        let table = store.chunks_table().clone();
        apart(async move { refresh_indexes(&table).await })
            .await
            .unwrap();
        let minute = std::time::Duration::from_secs(60);
        // A merge on `id` (the ids are stored), then a vector search.
        tokio::time::timeout(minute, store.upsert(rows(100, 50)))
            .await
            .expect("the merge still waiting after 60 s")
            .unwrap();
        let own = vector_of(700);
        let filter = crate::store::Filter::new();
        let hits = tokio::time::timeout(minute, store.search_vector_lance(None, &own, &filter, 3))
            .await
            .expect("the vector search still waiting after 60 s")
            .unwrap();
        assert!(hits.first().is_some_and(|h| h.score < 1e-3), "{hits:?}");
        assert_eq!(
            store.count(&crate::store::Filter::new()).await.unwrap(),
            900
        );
    }

    /// Memory `i`'s 8-dimensional vector; the vectors repeat every 97 rows.
    fn vector_of(i: usize) -> Vec<f32> {
        (0..8)
            .map(|d| (((i * 31 + d * 17) % 97) as f32 - 48.0) / 48.0)
            .collect()
    }

    /// Memories `from..from + n` of stream `s`, each with [`vector_of`].
    fn memories_with_vectors(from: usize, n: usize) -> Vec<Chunk> {
        (from..from + n)
            .map(|i| {
                let mut c = Chunk::new(format!("id{i}"), "s".into(), format!("memory {i}"), 0);
                c.embedding = Some(vector_of(i));
                c
            })
            .collect()
    }

    async fn fragments(table: &Table) -> usize {
        table.stats().await.unwrap().fragment_stats.num_fragments
    }

    /// A store of 8-dimensional vectors in `dir`, kept up by `m`.
    async fn open(dir: &std::path::Path, m: Maintenance) -> Store {
        Store::open_with(&crate::store::Location::local(dir), 8, 100, None, m)
            .await
            .unwrap()
    }

    /// Memory `i` of stream `s`.
    fn memory(i: usize) -> Chunk {
        Chunk::new(format!("id{i}"), "s".into(), format!("memory {i}"), 0)
    }

    /// `n` memories, one commit each.
    async fn commit_one_by_one(store: &Store, n: usize) {
        for i in 0..n {
            store.upsert(vec![memory(i)]).await.unwrap();
        }
    }

    /// A store whose writer merges every eight commits, after 40 commits of
    /// one memory each (merges fall due with the 8th, …, the 40th).
    async fn forty_commits_merged_every_eight(dir: &std::path::Path) -> Store {
        let m = Maintenance {
            compact_every_commits: 8,
            ..Maintenance::off()
        };
        let store = open(dir, m).await;
        commit_one_by_one(&store, 40).await;
        store
    }

    #[tokio::test]
    async fn the_writer_merges_small_fragments_as_it_commits() {
        let tmp = tempfile::tempdir().unwrap();
        let store = forty_commits_merged_every_eight(tmp.path()).await;
        // The merged fragment, the newest ones a merge spares (a write is
        // likeliest to replace their rows next, see `claims::newest`) and at
        // most one interval of fresh ones (the last merge may still be
        // running when the last write returns).
        let n = fragments(store.chunks_table()).await;
        assert!(n <= 1 + 4 + 8, "40 commits left {n} fragments");
        assert_eq!(store.count(&crate::store::Filter::new()).await.unwrap(), 40);

        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        commit_one_by_one(&store, 12).await;
        assert!(
            fragments(store.chunks_table()).await >= 12,
            "maintenance off merges nothing"
        );
    }

    /// The newest fragments a merge spares while the writer writes are
    /// merged once it rests: an idle store is left in one fragment.
    #[tokio::test]
    async fn a_resting_writer_merges_the_fragments_it_spared() {
        let tmp = tempfile::tempdir().unwrap();
        let store = forty_commits_merged_every_eight(tmp.path()).await;
        let handle = store.chunks_table().dataset().unwrap();
        // A refresh of the indexes, then a merge, each after the writer's
        // quiet interval.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            // The writer's merges commit through a handle of their own.
            handle.reload().await.unwrap();
            let counts = fragment_rows(store.chunks_table()).await;
            if counts == [40] {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "still unmerged at rest: {counts:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(store.count(&crate::store::Filter::new()).await.unwrap(), 40);
    }

    /// A store whose writer merges after every two commits, into fragments
    /// of 4 rows (and the tiers above: 32, 256, …).
    async fn merging_every_two_commits(dir: &std::path::Path) -> Store {
        let m = Maintenance {
            compact_every_commits: 2,
            target_rows_per_fragment: 4,
            ..Maintenance::off()
        };
        open(dir, m).await
    }

    /// `fresh` committed by the writer as one batch of new memories.
    async fn commit_fresh(store: &Store, fresh: Vec<Chunk>) {
        let batch = crate::store::WriteBatch {
            fresh,
            rows: vec![],
            side: vec![],
            refuse: true,
            history: vec![],
        };
        store.commit_batch(batch).await.unwrap();
    }

    /// The writer's own merges reach the second tier: single-row commits
    /// into three streams, merged into fragments of about 4 rows and then
    /// into ones of up to 32 whose rows are ordered by stream.
    #[tokio::test]
    async fn the_writer_orders_its_second_tier_by_stream() {
        let tmp = tempfile::tempdir().unwrap();
        let store = merging_every_two_commits(tmp.path()).await;
        for i in 0..80 {
            let mut c = memory(i);
            c.stream = format!("s{}", i % 3);
            commit_fresh(&store, vec![c]).await;
        }
        // The last merges may still be running when the last write returns.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let handle = store.chunks_table().dataset().unwrap();
        let tier = loop {
            // The writer's merges commit through a handle of their own.
            handle.reload().await.unwrap();
            let ds = handle.get().await.unwrap();
            let big = ds
                .get_fragments()
                .into_iter()
                .map(|f| f.metadata().clone())
                // A group closes when the next fragment would not fit, and
                // the routine merges' fragments hold under twice the target.
                .find(|f| f.physical_rows > Some(4 * (TIER_FAN - 2)));
            if let Some(f) = big {
                break (ds, f);
            }
            let rows: Vec<_> = ds
                .get_fragments()
                .iter()
                .map(|f| f.metadata().physical_rows)
                .collect();
            assert!(
                std::time::Instant::now() < deadline,
                "no second-tier fragment: {rows:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let (ds, fragment) = tier;
        let streams = streams_in(&ds, fragment).await;
        let mut sorted = streams.clone();
        sorted.sort();
        assert_eq!(streams, sorted);
        assert!(streams.len() > 4 * (TIER_FAN - 2), "{streams:?}");
        assert_eq!(store.count(&crate::store::Filter::new()).await.unwrap(), 80);
    }

    /// The streams of `fragment`'s rows, in their stored order.
    async fn streams_in(
        ds: &lance::Dataset,
        fragment: lance::table::format::Fragment,
    ) -> Vec<String> {
        use futures::TryStreamExt;
        let batches: Vec<arrow_array::RecordBatch> = ds
            .scan()
            .with_fragments(vec![fragment])
            .project(&["stream"])
            .unwrap()
            .try_into_stream()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        batches
            .iter()
            .flat_map(|b| {
                let c = crate::core::model::Columns::new(b);
                (0..b.num_rows())
                    .map(|r| c.str("stream", r).unwrap_or_default())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The writer climbs the third tier once it rests: commits of a full
    /// routine fragment each make eight second-tier fragments while it
    /// writes, and the merge it starts after the writes go quiet (its
    /// merges while writing left the third tier due) makes them one,
    /// ordered by stream.
    #[tokio::test]
    async fn the_writer_climbs_the_third_tier_once_it_rests() {
        let tmp = tempfile::tempdir().unwrap();
        let store = merging_every_two_commits(tmp.path()).await;
        let rows = 4 * TIER_FAN * TIER_FAN;
        for k in 0..rows / 4 {
            let fresh = in_three_streams((4 * k..4 * k + 4).map(memory).collect());
            commit_fresh(&store, fresh).await;
        }
        let handle = store.chunks_table().dataset().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            // The writer's merges commit through a handle of their own.
            handle.reload().await.unwrap();
            let counts: Vec<usize> = fragment_rows(store.chunks_table()).await;
            if counts == [rows] {
                break;
            }
            assert!(
                counts.iter().all(|&n| n <= rows),
                "fragments past the third tier: {counts:?}"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "no third-tier fragment: {counts:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(stream_changes(&store).await, (rows, 2));
    }

    /// Fragment merges run beside the pipeline's appends and its side
    /// effects on fragments the merge has not taken; a batch that replaces
    /// stored rows, a delete and an edit wait for the merge. Every write
    /// lands once, none fails on a commit conflict.
    #[tokio::test]
    async fn appends_run_beside_merges_and_replacements_wait_for_them() {
        use crate::store::{Filter, WriteBatch};
        let tmp = tempfile::tempdir().unwrap();
        let m = Maintenance {
            compact_every_commits: 2,
            ..Maintenance::off()
        };
        let store = open(tmp.path(), m).await;
        let memory =
            |i: usize, text: &str| Chunk::new(format!("id{i}"), "s".into(), text.into(), 0);
        // The memory batch `i` supersedes (when `i % 3 == 2`): alternately
        // the one just before and one from far back.
        let superseded = |i: usize| if i % 2 == 0 { i - 1 } else { i / 4 };
        for i in 0..60 {
            let batch = if i % 5 == 4 {
                // The pipeline's write of a redelivered record: it replaces.
                WriteBatch {
                    fresh: vec![memory(i, "v1")],
                    rows: vec![memory(i - 3, "v2")],
                    side: vec![],
                    refuse: true,
                    history: vec![],
                }
            } else {
                // Every third batch supersedes a memory stored earlier: the
                // newest fragments' or one a merge may have taken.
                let side = match i % 3 {
                    2 => {
                        let mut old = memory(superseded(i), "v1");
                        old.superseded_by = Some(format!("id{i}"));
                        old.valid_until = Some(i as i64);
                        vec![old]
                    }
                    _ => vec![],
                };
                WriteBatch {
                    fresh: vec![memory(i, "v1")],
                    rows: vec![],
                    side,
                    refuse: true,
                    history: vec![],
                }
            };
            store.commit_batch(batch).await.unwrap();
            if i % 20 == 19 {
                store
                    .delete(&Filter::new().id(&format!("id{}", i - 1)))
                    .await
                    .unwrap();
            }
            if i % 20 == 10 {
                let edited = store
                    .modify(
                        vec![format!("id{}", i - 2)],
                        Box::new(|c: &mut Chunk| {
                            c.content = "edited".into();
                            true
                        }),
                    )
                    .await
                    .unwrap();
                assert_eq!(edited, 1);
            }
        }
        let rows = store.find(&Filter::new(), None).await.unwrap();
        let mut ids: Vec<&str> = rows.iter().map(|c| c.id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(
            (rows.len(), ids.len()),
            (57, 57),
            "60 written, 3 deleted, each once"
        );
        for c in &rows {
            let i: usize = c.id[2..].parse().unwrap();
            let want = if [8, 28, 48].contains(&i) {
                "edited"
            } else if i % 5 == 1 && i + 3 < 60 {
                "v2"
            } else {
                "v1"
            };
            assert_eq!(c.content, want, "{}", c.id);
        }
        // Every supersession landed (the last one of a memory wins), beside
        // the merges or after them.
        let mut last: HashMap<usize, usize> = HashMap::new();
        for i in (0..60).filter(|i| i % 5 != 4 && i % 3 == 2) {
            last.insert(superseded(i), i);
        }
        for c in &rows {
            let i: usize = c.id[2..].parse().unwrap();
            let want = last.get(&i).map(|by| format!("id{by}"));
            // A whole-row replacement (`v2`) since writes the lifecycle anew.
            let replaced = i % 5 == 1 && i + 3 < 60;
            if !replaced {
                assert_eq!(c.superseded_by, want, "{}", c.id);
            }
        }
        assert!(
            fragments(store.chunks_table()).await < 40,
            "the appends' fragments were merged"
        );
    }

    /// Rows per fragment, smallest first.
    async fn fragment_rows(table: &Table) -> Vec<usize> {
        let manifest = table.as_native().unwrap().manifest().await.unwrap();
        let mut rows: Vec<usize> = manifest
            .fragments
            .iter()
            .map(|f| f.num_rows().unwrap())
            .collect();
        rows.sort_unstable();
        rows
    }

    /// `TIER_FAN` full fragments of the routine size become one of the next
    /// tier; fewer stay; the small ones at the tail are left to the routine
    /// merges; every row stays, once.
    #[tokio::test]
    async fn full_fragments_merge_into_the_next_tier_and_the_tail_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        let table = store.chunks_table();
        let commit = |from: usize, n: usize| store.upsert((from..from + n).map(memory).collect());
        // Seven full fragments of 4 rows, then two of one row.
        for k in 0..TIER_FAN - 1 {
            commit(4 * k, 4).await.unwrap();
        }
        commit(100, 1).await.unwrap();
        commit(101, 1).await.unwrap();
        merge_fragments_in_tiers(table, 4, "stream").await.unwrap();
        assert_eq!(
            fragment_rows(table).await,
            [&[2][..], &[4; TIER_FAN - 1]].concat(),
            "the tail merged, too few full fragments for the next tier"
        );
        // Two more rows fill the tail: the eight full fragments become one.
        commit(102, 1).await.unwrap();
        commit(103, 1).await.unwrap();
        merge_fragments_in_tiers(table, 4, "stream").await.unwrap();
        assert_eq!(fragment_rows(table).await, [4 * TIER_FAN]);
        // A new tail is the routine merges' business.
        commit(104, 1).await.unwrap();
        merge_fragments_in_tiers(table, 4, "stream").await.unwrap();
        assert_eq!(fragment_rows(table).await, [1, 4 * TIER_FAN]);
        let mut ids: Vec<String> = store
            .find(&crate::store::Filter::new(), None)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        ids.sort();
        let mut want: Vec<String> = (0..4 * (TIER_FAN - 1))
            .chain(100..105)
            .map(|i| format!("id{i}"))
            .collect();
        want.sort();
        assert_eq!(ids, want);
        assert_eq!(store.get("id9").await.unwrap().unwrap().content, "memory 9");
    }

    /// While the writer writes, fragments of a bulk commit's size (fair,
    /// below the routine merges' target) skip the routine merge and reach
    /// the second tier as they are, each row rewritten once: the ones no
    /// index covers once they fill a group, the newest spared; those a
    /// segment covers as far as they go (no new fragment joins them).
    #[tokio::test]
    async fn fair_fragments_reach_the_second_tier_in_one_rewrite_while_writing() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        let table = store.chunks_table();
        // With a target of 64 rows, 32-row commits are fair (2 rows or
        // more), as a bulk import's batches are.
        let write =
            |k: usize| commit_fresh(&store, in_three_streams(memories_with_vectors(32 * k, 32)));
        for k in 0..2 {
            write(k).await;
        }
        refresh_indexes(table).await.unwrap();
        for k in 2..20 {
            write(k).await;
        }
        let handle = table.dataset().unwrap();
        let before = handle.get().await.unwrap().manifest.version;
        let claims = Claims::default();
        merge_in_tiers(table, 64, "stream", Reach::Second, Some(&claims))
            .await
            .unwrap();
        handle.reload().await.unwrap();
        let ds = handle.get().await.unwrap();
        let mut rewrites = Vec::new();
        for v in before + 1..=ds.manifest.version {
            let tx = ds.read_transaction_by_version(v).await.unwrap().unwrap();
            if let lance::dataset::transaction::Operation::Rewrite { groups, .. } = tx.operation {
                rewrites.push(groups);
            }
        }
        // One rewrite, no routine merge before it: every fragment it took
        // was a commit's. Each set the indexes cover (the writer refreshes
        // them too) went as far as it goes, and the set none covers filled
        // a group; the two newest fragments were spared.
        assert_eq!(rewrites.len(), 1, "one rewrite, no routine merge first");
        let old: Vec<u64> = rewrites[0]
            .iter()
            .flat_map(|g| g.old_fragments.iter())
            .inspect(|f| assert_eq!(f.physical_rows, Some(32)))
            .map(|f| f.id)
            .collect();
        assert!(old.len() >= 14, "{old:?}");
        assert!(!old.contains(&18) && !old.contains(&19), "{old:?}");
        // The merged fragments hold their rows by stream, and the indexes
        // over the moved rows were remapped to where they lie now.
        for g in rewrites[0].iter() {
            for f in &g.new_fragments {
                let f = ds.get_fragment(f.id as usize).unwrap().metadata().clone();
                let streams = streams_in(&ds, f).await;
                assert!(streams.len() > 32);
                assert_eq!(streams.windows(2).filter(|w| w[0] != w[1]).count(), 2);
            }
        }
        assert_eq!(
            store.count(&crate::store::Filter::new()).await.unwrap(),
            640
        );
        for i in [9, 100, 500, 639] {
            let c = store.get(&format!("id{i}")).await.unwrap().unwrap();
            assert_eq!(c.content, format!("memory {i}"));
        }
    }

    /// The fragment merges' thread runs at [`MERGE_NICENESS`] (or lower
    /// still, where the whole process does).
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn merges_run_at_a_lower_priority() {
        let rt = merge_runtime().expect("the merge runtime starts");
        let nice = rt
            .spawn(async {
                // SAFETY: gettid has no preconditions; getpriority only
                // reads its arguments.
                unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
            })
            .await
            .unwrap();
        assert!(nice >= MERGE_NICENESS, "merge thread at nice {nice}");
    }

    /// The second tier orders a stream's rows together and keeps every
    /// index whole: each index still covers every row, and answers with the
    /// right one (a row's address moved; an index pointing at the old place
    /// would name another memory). Fragments an index covers are never
    /// merged with fragments it does not cover (Lance refuses the commit).
    #[tokio::test]
    async fn the_second_tier_orders_rows_by_stream_and_remaps_the_indexes() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        let table = store.chunks_table();
        // Full fragments of 32 rows, each holding three streams' rows
        // interleaved, as writers into many streams leave them.
        let write = |k: usize| store.upsert(in_three_streams(memories_with_vectors(32 * k, 32)));
        // Two fragments the scalar indexes cover, then eight they do not:
        // the eight become one, the two wait.
        for k in 0..2 {
            write(k).await.unwrap();
        }
        refresh_indexes(table).await.unwrap();
        for k in 2..2 + TIER_FAN {
            write(k).await.unwrap();
        }
        merge_fragments_in_tiers(table, 32, "stream").await.unwrap();
        assert_eq!(fragment_rows(table).await, [32, 32, 32 * TIER_FAN]);
        // Six more, and every index over all of them (one segment each):
        // the two and the six become one.
        for k in 2 + TIER_FAN..2 * TIER_FAN {
            write(k).await.unwrap();
        }
        let rows = 32 * 2 * TIER_FAN;
        assert!(store.ensure_vector_index(256).await.unwrap());
        refresh_indexes(table).await.unwrap();
        // A deleted row, in a fragment the merge rewrites, leaves with it.
        let gone = crate::store::Filter::new().id("id40");
        assert_eq!(store.delete(&gone).await.unwrap(), 1);
        let unindexed = || async {
            let mut counts = Vec::new();
            for index in table.list_indices().await.unwrap() {
                let s = table.index_stats(&index.name).await.unwrap().unwrap();
                counts.push((index.name, s.num_indexed_rows, s.num_unindexed_rows));
            }
            counts.sort();
            counts
        };
        let before = unindexed().await;
        assert_eq!(before.len(), 6, "{before:?}");
        assert!(
            before.iter().all(|(_, n, u)| (*n, *u) == (rows - 1, 0)),
            "{before:?}"
        );
        merge_fragments_in_tiers(table, 32, "stream").await.unwrap();
        assert_eq!(
            fragment_rows(table).await,
            [32 * TIER_FAN - 1, 32 * TIER_FAN]
        );
        assert_eq!(
            unindexed().await,
            before,
            "every index remapped, none rebuilt"
        );
        // Each fragment's rows by stream: three runs of three streams.
        check_ordered_and_indexed(&store, rows, 40, 5).await;
    }

    /// After an ordered merge of memories `0..rows` (with [`vector_of`], in
    /// [`stream_of`]'s three streams) but `gone`, deleted: the stored order
    /// changes stream `turns` times, and within a stream keeps the arrival
    /// order; every index answers with the right memory.
    async fn check_ordered_and_indexed(store: &Store, rows: usize, gone: usize, turns: usize) {
        let stored: Vec<(String, usize)> = store
            .find(&crate::store::Filter::new(), None)
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.stream, c.id[2..].parse().unwrap()))
            .collect();
        assert_eq!(stored.len(), rows - 1);
        assert!(store.get(&format!("id{gone}")).await.unwrap().is_none());
        let text = store
            .search_text_lance(None, &gone.to_string(), &crate::store::Filter::new(), 3)
            .await
            .unwrap();
        assert!(text.is_empty(), "{text:?}");
        let changes = stored.windows(2).filter(|w| w[0].0 != w[1].0).count();
        assert_eq!(changes, turns, "{stored:?}");
        let in_order = stored
            .windows(2)
            .all(|w| w[0].0 != w[1].0 || w[0].1 < w[1].1);
        assert!(in_order, "{stored:?}");
        // Each index answers with the right memory.
        for i in [0, 37, 100, 255, 300, 511] {
            let id = format!("id{i}");
            let got = store.get(&id).await.unwrap().unwrap();
            assert_eq!(
                (got.content, got.stream),
                (format!("memory {i}"), stream_of(&id))
            );
            let text = store
                .search_text_lance(None, &i.to_string(), &crate::store::Filter::new(), 3)
                .await
                .unwrap();
            assert_eq!(
                text.first().map(|h| h.id.as_str()),
                Some(id.as_str()),
                "{text:?}"
            );
            let near = store
                .search_vector_lance(None, &vector_of(i), &crate::store::Filter::new(), 3)
                .await
                .unwrap();
            // The vectors repeat every 97 rows.
            let first = near.first().unwrap();
            let at: usize = first.id[2..].parse().unwrap();
            assert!(at % 97 == i % 97 && first.score < 1e-3, "{i}: {near:?}");
        }
        let s1 = crate::store::Filter::new().stream("s1");
        assert_eq!(
            store.count(&s1).await.unwrap(),
            (0..rows).filter(|i| i % 3 == 1 && *i != gone).count()
        );
    }

    /// The third tier: eight ordered fragments of the second merged as they
    /// are read (a k-way merge, never the group whole in memory), one of
    /// them holding a deleted row, into one fragment ordered by stream, every
    /// index remapped (twice: the second tier's merge ran in an earlier
    /// pass). A pass that stops at the second tier, or gives way, leaves it.
    #[tokio::test]
    async fn the_third_tier_merges_ordered_fragments_as_it_reads_them() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        let table = store.chunks_table();
        let write = |k: usize| store.upsert(in_three_streams(memories_with_vectors(8 * k, 8)));
        // Seven second-tier fragments of 64 (too few for the third).
        let second = 8 * TIER_FAN;
        for k in 0..TIER_FAN * (TIER_FAN - 1) {
            write(k).await.unwrap();
        }
        merge_fragments_in_tiers(table, 8, "stream").await.unwrap();
        assert_eq!(fragment_rows(table).await, [second; TIER_FAN - 1]);
        let gone = crate::store::Filter::new().id("id40");
        assert_eq!(store.delete(&gone).await.unwrap(), 1);
        // Eight more of the routine size, every index over all of them:
        // they make the eighth second-tier fragment, and the eight the third.
        for k in TIER_FAN * (TIER_FAN - 1)..TIER_FAN * TIER_FAN {
            write(k).await.unwrap();
        }
        let rows = second * TIER_FAN;
        assert!(store.ensure_vector_index(256).await.unwrap());
        refresh_indexes(table).await.unwrap();
        // The writer's merges while it writes stop at the second tier; one
        // told to give way (a write that replaces rows came) merges the
        // second tier and leaves the third.
        let eight = [&[second - 1][..], &[second; TIER_FAN - 1]].concat();
        let give_way = tokio::sync::Notify::new();
        give_way.notify_one();
        let due = merge_in_tiers(table, 8, "stream", Reach::Every(Some(&give_way)), None);
        assert!(due.await.unwrap(), "the third tier is left due");
        assert_eq!(fragment_rows(table).await, eight);
        let due = merge_in_tiers(table, 8, "stream", Reach::Second, None);
        assert!(due.await.unwrap());
        assert_eq!(fragment_rows(table).await, eight);
        merge_fragments_in_tiers(table, 8, "stream").await.unwrap();
        assert_eq!(fragment_rows(table).await, [rows - 1]);
        for index in table.list_indices().await.unwrap() {
            let s = table.index_stats(&index.name).await.unwrap().unwrap();
            assert_eq!(
                (s.num_indexed_rows, s.num_unindexed_rows),
                (rows - 1, 0),
                "{}",
                index.name
            );
        }
        check_ordered_and_indexed(&store, rows, 40, 2).await;
    }

    /// How many memories the store holds, and how many times the stream
    /// changes from one to the next in stored order.
    async fn stream_changes(store: &Store) -> (usize, usize) {
        let stored: Vec<String> = store
            .find(&crate::store::Filter::new(), None)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.stream)
            .collect();
        let changes = stored.windows(2).filter(|w| w[0] != w[1]).count();
        (stored.len(), changes)
    }

    /// `rows`, each moved to its [`stream_of`], as writers into many streams
    /// leave them interleaved.
    fn in_three_streams(rows: Vec<Chunk>) -> Vec<Chunk> {
        rows.into_iter()
            .map(|mut c| {
                c.stream = stream_of(&c.id);
                c
            })
            .collect()
    }

    /// The stream of memory `id` in the ordered-merge test: one of three.
    fn stream_of(id: &str) -> String {
        let i: usize = id[2..].parse().unwrap();
        format!("s{}", i % 3)
    }

    #[tokio::test]
    async fn the_full_pass_merges_and_reports() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        commit_one_by_one(&store, 10).await;
        let dry = full_pass(store.chunks_table(), PassMerge::Large, None, true)
            .await
            .unwrap();
        assert_eq!(
            (dry.rows, dry.fragments_before, dry.fragments_after),
            (10, 10, 10)
        );
        let done = full_pass(store.chunks_table(), PassMerge::Large, None, false)
            .await
            .unwrap();
        assert_eq!(
            (done.rows, done.fragments_before, done.fragments_after),
            (10, 10, 1)
        );
    }

    /// On the chunk table the full pass merges as the writer does: two
    /// ordered second-tier fragments stay two, where a merge into large
    /// fragments would make one holding each stream's rows twice apart.
    #[tokio::test]
    async fn the_full_pass_keeps_the_chunk_tiers() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        let table = store.chunks_table();
        for k in 0..2 * TIER_FAN {
            let rows = (4 * k..4 * k + 4).map(memory).collect();
            store.upsert(in_three_streams(rows)).await.unwrap();
        }
        let tiers = PassMerge::Tiers {
            target_rows: 4,
            key: "stream",
        };
        for _ in 0..2 {
            let done = full_pass(table, tiers, None, false).await.unwrap();
            assert_eq!((done.rows, done.fragments_after), (64, 2));
            assert_eq!(fragment_rows(table).await, [32, 32]);
        }
        assert_eq!(stream_changes(&store).await, (64, 5));
    }

    #[tokio::test]
    async fn the_watcher_merges_a_table_past_its_limit() {
        let tmp = tempfile::tempdir().unwrap();
        let m = Maintenance {
            check_every: Duration::from_millis(50),
            max_fragments: 4,
            ..Maintenance::off()
        };
        let store = open(tmp.path(), m).await;
        for i in 0..12 {
            store
                .add_history(vec![crate::store::HistoryRow {
                    id: format!("h{i}"),
                    stream: "s".into(),
                    chunk_id: "c".into(),
                    event: "created".into(),
                    reason: String::new(),
                    related_ids: Vec::new(),
                    created_at: i,
                }])
                .await
                .unwrap();
        }
        let history = store.tables()[crate::store::HISTORY].clone();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while fragments(&history).await > 4 {
            assert!(std::time::Instant::now() < deadline, "history never merged");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(history.count_rows(None).await.unwrap(), 12);
    }
}
