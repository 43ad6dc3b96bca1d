//! The ordered tiers of the chunk table's merges: full fragments rewritten
//! as one whose rows are ordered by stream, the indexes remapped to the
//! moved rows.
//!
//! Writers store into many streams at once, so each commit, and each
//! fragment the routine merges make of the commits, holds rows of many
//! streams, and a stream's rows lie scattered through every fragment. Lance
//! decodes scattered rows a few at a time from every column's blocks: a
//! small stream's first read from 1M rows in 65,536-row fragments took 29 ms
//! with the rows in arrival order and 7.5 ms with each fragment ordered by
//! stream (README, **Where a stream's rows lie**).
//!
//! Lance's own compaction keeps the rows' order, and its index remap maps
//! old rows to new by position, so this merge is a rewrite of loomem's own:
//! read the fragments' live rows with their addresses, order them by stream
//! (stably: a stream's rows keep their order), write them as new fragments,
//! remap every index from each old address to its new one (Lance's remapper
//! takes any old-to-new map), and commit the swap as one `Rewrite`. A write
//! that touched the old fragments meanwhile makes the commit a retryable
//! conflict.
//!
//! The second tier's fragments are small enough to order in memory (a
//! group of 65,536 rows). Above it, the group's fragments are each ordered
//! already, so they are merged a batch at a time as they are read (a k-way
//! merge), and a group of 524,288 rows (about 1 GB with its vectors) never
//! lies in memory whole; a trial that held it peaked at 4.2 GB.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{RecordBatch, UInt32Array};
use futures::TryStreamExt;
use lance::dataset::index::DatasetIndexRemapperOptions;
use lance::dataset::optimize::IndexRemapperOptions;
use lance::dataset::transaction::{Operation, RewriteGroup, RewrittenIndex, Transaction};
use lance::dataset::{CommitBuilder, InsertBuilder, WriteMode, WriteParams};
use lance::deps::datafusion::error::DataFusionError;
use lance::deps::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use lance::deps::datafusion::physical_plan::SendableRecordBatchStream;
use lance::index::DatasetIndexExt;
use lance::Dataset;
use lance_core::utils::row_addr_remap::RowAddrRemap;
use lance_core::ROW_ADDR;
use lancedb::Table;

/// The fragments whose row counts are `rows` (indexes into it), those of
/// `lo..hi` rows packed in order into groups of up to `cap` rows: each group
/// that filled (the next fragment would not fit, or it holds exactly `cap`)
/// and holds two or more fragments. The last group, still filling, waits for
/// more, unless `last` (then it too is kept if it holds two or more).
pub(super) fn plan(
    rows: &[usize],
    lo: usize,
    hi: usize,
    cap: usize,
    last: bool,
) -> Vec<Vec<usize>> {
    let mut groups = Vec::new();
    let (mut group, mut sum) = (Vec::new(), 0);
    // A filled group is kept if it merges anything, and a new one started.
    let close = |groups: &mut Vec<Vec<usize>>, group: &mut Vec<usize>, sum: &mut usize| {
        if group.len() > 1 {
            groups.push(std::mem::take(group));
        }
        group.clear();
        *sum = 0;
    };
    for (i, &n) in rows.iter().enumerate() {
        if !(lo..hi).contains(&n) {
            continue;
        }
        if sum + n > cap {
            close(&mut groups, &mut group, &mut sum);
        }
        group.push(i);
        sum += n;
        if sum == cap {
            close(&mut groups, &mut group, &mut sum);
        }
    }
    if last {
        close(&mut groups, &mut group, &mut sum);
    }
    groups
}

/// [`plan`] within each set of fragments the same index segments cover:
/// Lance refuses a rewrite whose old fragments an index covers only in
/// part (the new fragment would be half indexed). Fragments written since
/// a segment was built wait until the writer's refreshes merge the
/// segments; those no index covers merge among themselves. With `settle`,
/// the last group of a set some index covers is merged too, full or not:
/// no new fragment joins that set (the newest lie in the set none covers)
/// until the segments covering it merge.
fn plan_by_coverage(
    fragments: &[lance::table::format::Fragment],
    indices: &[lance::table::format::IndexMetadata],
    tier: Tier,
    settle: bool,
) -> Vec<Vec<usize>> {
    let mut classes: std::collections::BTreeMap<Vec<usize>, Vec<usize>> = Default::default();
    for (at, f) in fragments.iter().enumerate() {
        let covering: Vec<usize> = indices
            .iter()
            .enumerate()
            .filter(|(_, ix)| {
                ix.fragment_bitmap
                    .as_ref()
                    .is_some_and(|b| b.contains(f.id as u32))
            })
            .map(|(k, _)| k)
            .collect();
        classes.entry(covering).or_default().push(at);
    }
    let mut groups = Vec::new();
    for (covering, members) in &classes {
        let rows: Vec<usize> = members.iter().map(|&at| rows_of(&fragments[at])).collect();
        let last = settle && !covering.is_empty();
        for group in plan(&rows, tier.lo, tier.hi, tier.cap, last) {
            groups.push(group.into_iter().map(|k| members[k]).collect());
        }
    }
    groups
}

/// The rows a fragment was written with, its deleted ones included: a full
/// fragment stays full when a few of its rows are deleted (the merge drops
/// them).
pub(super) fn rows_of(f: &lance::table::format::Fragment) -> usize {
    f.physical_rows.unwrap_or_else(|| f.num_rows().unwrap_or(0))
}

/// The newest of `fragments` that a merge made while the writer writes
/// leaves alone (see [`super::claims::newest`]).
pub(super) fn newest(
    fragments: &[lance::table::format::Fragment],
    target_rows: usize,
) -> std::collections::HashSet<u64> {
    super::claims::newest(fragments.iter().map(|f| (f.id, rows_of(f))), target_rows)
}

/// How many fragments of `tier` `table` holds; `None` where the ordered
/// merge cannot run (not a local Lance table, or one with stable row ids,
/// whose indexes need no remap).
pub(super) async fn fragments_in_tier(table: &Table, tier: Tier) -> Option<usize> {
    let handle = table.dataset()?;
    let ds = handle.get().await.ok()?;
    if ds.manifest.uses_stable_row_ids() {
        return None;
    }
    Some(
        ds.manifest
            .fragments
            .iter()
            .filter(|f| (tier.lo..tier.hi).contains(&rows_of(f)))
            .count(),
    )
}

/// One tier of the ordered merges: fragments of `lo..hi` rows, packed in
/// order into groups of up to `cap` rows, each group rewritten as one
/// fragment. `ordered`: its fragments are already ordered by the key (the
/// output of an ordered merge), so they are merged as they are read (were
/// one not, every row would still land once, only less well ordered);
/// otherwise each is read whole and ordered in memory (the first tier's
/// fragments, a group of up to `cap` rows in all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tier {
    pub lo: usize,
    pub hi: usize,
    pub cap: usize,
    pub ordered: bool,
}

/// The ordered tiers above fragments of `target_rows`: the second merges
/// `fan` of those into one of `fan × target_rows` (and, while the writer
/// writes, the fair fragments of bulk commits, which skip the routine
/// merge: its fragments start at [`super::maintain::fair_rows`]), the third
/// `fan` of the second's into one of `fan² × target_rows`, and so on,
/// `tiers` of them.
/// A merged fragment counts for the next tier once it holds 7/8 of its cap
/// (a group closes early when its next fragment would not fit, and the rows
/// deleted since leave with the merge); one below that merges again in its
/// own tier.
pub(super) fn tiers(target_rows: usize, fan: usize, tiers: usize) -> Vec<Tier> {
    let cap = |k: u32| target_rows.saturating_mul(fan.saturating_pow(k));
    let full = |k: u32| cap(k) / 8 * 7;
    (1..=tiers as u32)
        .map(|k| Tier {
            lo: if k == 1 {
                super::maintain::fair_rows(target_rows)
            } else {
                full(k - 1)
            },
            hi: full(k),
            cap: cap(k),
            ordered: k > 1,
        })
        .collect()
}

/// One attempt: the groups [`plan`] finds among `table`'s fragments of
/// `tier`, each rewritten as one fragment ordered by `key`, committed in one
/// `Rewrite` with every index remapped. The number of fragments merged;
/// `None` when `give_way` was notified first (the merge is dropped before
/// its commit, so nothing changes but unreferenced files and reserved ids).
pub(super) async fn merge_ordered(
    table: &Table,
    key: &str,
    tier: Tier,
    give_way: Option<&tokio::sync::Notify>,
    claims: Option<&super::claims::Claims>,
    spare: Option<usize>,
) -> lancedb::Result<Option<usize>> {
    let Some(handle) = table.dataset() else {
        return Ok(Some(0));
    };
    handle.ensure_mutable()?;
    let ds = handle.get().await?;
    let prepared = match give_way {
        None => prepare(ds, key, tier, claims, spare).await?,
        Some(notify) => tokio::select! {
            biased;
            _ = notify.notified() => return Ok(None),
            prepared = prepare(ds, key, tier, claims, spare) => prepared?,
        },
    };
    let Some((reserved, swap, merged)) = prepared else {
        return Ok(Some(0));
    };
    let committed = CommitBuilder::new(Arc::new(reserved)).execute(swap).await?;
    handle.update(committed);
    Ok(Some(merged))
}

/// Everything of [`merge_ordered`] but its commit: the dataset with the new
/// fragments' ids reserved, the `Rewrite` to commit on it, and the number
/// of fragments it merges (`None`: nothing to merge). With `spare`, the
/// newest fragments holding that many rows are left out ([`newest`]): the
/// writer writes, and its next batch may supersede their rows.
async fn prepare(
    ds: Arc<Dataset>,
    key: &str,
    tier: Tier,
    claims: Option<&super::claims::Claims>,
    spare: Option<usize>,
) -> lancedb::Result<Option<(Dataset, Transaction, usize)>> {
    let mut fragments = ds.manifest.fragments.as_ref().clone();
    if let Some(rows) = spare {
        let spared = newest(&fragments, rows);
        fragments.retain(|f| !spared.contains(&f.id));
    }
    let indices = ds.load_indices().await?;
    // While the writer writes, the first tier takes the bulk commits'
    // fragments as they are (see `maintain::merge_small_fragments_claimed`):
    // each set the indexes cover is merged as far as it goes.
    let settle = spare.is_some() && !tier.ordered;
    let mut groups = plan_by_coverage(&fragments, &indices, tier, settle);
    if let Some(claims) = claims {
        groups = claims.for_merge(groups, |g| g.iter().map(|&i| fragments[i].id).collect());
    }
    if groups.is_empty() {
        return Ok(None);
    }
    let read_version = ds.manifest.version;
    let mut rewrite = Vec::with_capacity(groups.len());
    // Each group's old row addresses, in the order of its new rows.
    let mut moved: Vec<Vec<u64>> = Vec::with_capacity(groups.len());
    for group in &groups {
        let old: Vec<_> = group.iter().map(|&i| fragments[i].clone()).collect();
        let rows: usize = old.iter().map(rows_of).sum();
        let (merged, addrs) = merged_stream(&ds, &old, key, tier.ordered).await?;
        let params = WriteParams {
            mode: WriteMode::Append,
            max_rows_per_file: rows.max(1),
            ..Default::default()
        };
        let written = InsertBuilder::new(ds.clone())
            .with_params(&params)
            .execute_uncommitted_stream(merged)
            .await?;
        let Operation::Append { fragments: new } = written.operation else {
            return Err(lancedb::Error::Runtime {
                message: "an uncommitted append did not return fragments".into(),
            });
        };
        rewrite.push(RewriteGroup {
            old_fragments: old,
            new_fragments: new,
        });
        let addrs = std::mem::take(&mut *addrs.lock().expect("merge addresses"));
        moved.push(addrs);
    }
    // The new fragments' ids, reserved first: a row's new address is its
    // fragment's id and its offset in it.
    let new_count: usize = rewrite.iter().map(|g| g.new_fragments.len()).sum();
    let reserve = Transaction::new(
        read_version,
        Operation::ReserveFragments {
            num_fragments: new_count as u32,
        },
        None,
    );
    let reserved = CommitBuilder::new(ds.clone()).execute(reserve).await?;
    let end = reserved.manifest.max_fragment_id.unwrap_or(0) as u64 + 1;
    let mut next_id = end - new_count as u64;
    let mut map: HashMap<u64, Option<u64>> = HashMap::new();
    for (group, addrs) in rewrite.iter_mut().zip(&moved) {
        // Rows deleted in the old fragments leave every index.
        for f in &group.old_fragments {
            let physical = f.physical_rows.unwrap_or(0) as u64;
            map.extend((0..physical).map(|offset| ((f.id << 32) | offset, None)));
        }
        let mut addrs = addrs.iter();
        for f in group.new_fragments.iter_mut() {
            f.id = next_id;
            next_id += 1;
            let physical = f.physical_rows.unwrap_or(0) as u64;
            for offset in 0..physical {
                let Some(&old) = addrs.next() else { break };
                map.insert(old, Some((f.id << 32) | offset));
            }
        }
    }
    let affected: Vec<u64> = rewrite
        .iter()
        .flat_map(|g| g.old_fragments.iter().map(|f| f.id))
        .collect();
    let rewritten_indices = match DatasetIndexRemapperOptions::default()
        .create_remapper(&reserved)
        .await?
    {
        Some(remapper) => remapper
            .remap_indices(RowAddrRemap::direct(map), &affected)
            .await?
            .into_iter()
            .map(|r| RewrittenIndex {
                old_id: r.old_id,
                new_id: r.new_id,
                new_index_details: r.index_details,
                new_index_version: r.index_version,
                new_index_files: r.files,
            })
            .collect(),
        None => Vec::new(),
    };
    let swap = Transaction::new(
        read_version,
        Operation::Rewrite {
            groups: rewrite,
            rewritten_indices,
            frag_reuse_index: None,
        },
        None,
    );
    Ok(Some((reserved, swap, affected.len())))
}

/// Rows of a merged fragment built at a time.
const MERGE_BATCH_ROWS: usize = 8192;

/// The addresses of the rows a merged stream has given, in its order.
type Addresses = Arc<std::sync::Mutex<Vec<u64>>>;

/// The live rows of `fragments` as one stream ordered by `key` (stably: a
/// key's rows come in the fragments' order, and in their stored order within
/// one), without their addresses, which fill the returned list as the
/// stream is read. A k-way merge of the fragments, each read in order a
/// batch at a time, so a group of ordered fragments never lies in memory
/// whole; an unordered one is read whole and ordered first.
async fn merged_stream(
    ds: &Dataset,
    fragments: &[lance::table::format::Fragment],
    key: &str,
    ordered: bool,
) -> lancedb::Result<(SendableRecordBatchStream, Addresses)> {
    let mut runs = Vec::with_capacity(fragments.len());
    for f in fragments {
        let mut scan = ds.scan();
        scan.with_fragments(vec![f.clone()])
            .with_row_address()
            .scan_in_order(true)
            .batch_size(MERGE_BATCH_ROWS)
            .batch_readahead(1)
            .fragment_readahead(1)
            .io_buffer_size(32 << 20);
        let batches = scan.try_into_stream().await?.map_err(lancedb::Error::from);
        let run = if ordered {
            Run::open(Box::pin(batches), key).await?
        } else {
            let sorted = read_sorted(batches, key).await?;
            Run::open(Box::pin(futures::stream::iter(sorted.map(Ok))), key).await?
        };
        runs.extend(run);
    }
    let Some(schema) = runs.first().map(|r| r.batch.schema()) else {
        return Err(lancedb::Error::Runtime {
            message: "a merge read no rows".into(),
        });
    };
    let addrs: Addresses = Default::default();
    let out = addrs.clone();
    let batches = futures::stream::try_unfold(runs, move |mut runs| {
        let addrs = out.clone();
        async move {
            let batch = next_merged(&mut runs, &addrs).await?;
            Ok::<_, lancedb::Error>(batch.map(|b| (b, runs)))
        }
    })
    .map_err(|e| DataFusionError::External(Box::new(e)));
    let stream: SendableRecordBatchStream =
        Box::pin(RecordBatchStreamAdapter::new(schema, batches));
    Ok((stream, addrs))
}

type Batches = futures::stream::BoxStream<'static, lancedb::Result<RecordBatch>>;

/// One fragment's rows in a merge: the batch being taken from and the
/// rest of the fragment.
struct Run {
    rest: Batches,
    /// The current batch, without the address column.
    batch: RecordBatch,
    keys: arrow_array::StringArray,
    addrs: arrow_array::UInt64Array,
    /// The next row of `batch` to take.
    row: usize,
    /// Where `batch` lies among the sources of the merged batch being built.
    slot: usize,
    key: String,
}

impl Run {
    /// The run of `batches`, at its first row; `None` for a fragment
    /// with no live rows.
    async fn open(rest: Batches, key: &str) -> lancedb::Result<Option<Run>> {
        let mut run = Run {
            rest,
            batch: RecordBatch::new_empty(Arc::new(arrow_schema::Schema::empty())),
            keys: arrow_array::StringArray::from(Vec::<String>::new()),
            addrs: arrow_array::UInt64Array::from(Vec::<u64>::new()),
            row: 0,
            slot: 0,
            key: key.to_string(),
        };
        Ok(run.advance().await?.then_some(run))
    }

    /// Move to the next non-empty batch; false when the fragment is done.
    async fn advance(&mut self) -> lancedb::Result<bool> {
        while let Some(batch) = self.rest.try_next().await? {
            if batch.num_rows() == 0 {
                continue;
            }
            let (data, addrs) = split_addresses(batch)?;
            self.keys = key_column(&data, &self.key)?.clone();
            self.addrs = addrs;
            self.batch = data;
            self.row = 0;
            return Ok(true);
        }
        Ok(false)
    }

    fn current_key(&self) -> &str {
        self.keys.value(self.row)
    }
}

/// The next batch of up to [`MERGE_BATCH_ROWS`] rows of the merge of
/// `runs` (`None` once every run is done), each row's old address appended
/// to `addrs`. A run is taken from while its key is the least; among runs at
/// the same key, the first (the earlier fragment).
async fn next_merged(
    runs: &mut Vec<Run>,
    addrs: &Addresses,
) -> lancedb::Result<Option<RecordBatch>> {
    let mut sources: Vec<RecordBatch> = Vec::with_capacity(runs.len() * 2);
    for run in runs.iter_mut() {
        run.slot = sources.len();
        sources.push(run.batch.clone());
    }
    let mut picks: Vec<(usize, usize)> = Vec::with_capacity(MERGE_BATCH_ROWS);
    let mut taken: Vec<u64> = Vec::with_capacity(MERGE_BATCH_ROWS);
    while picks.len() < MERGE_BATCH_ROWS {
        // `min_by` keeps the first of equal keys: the merge is stable.
        let Some(at) =
            (0..runs.len()).min_by(|&a, &b| runs[a].current_key().cmp(runs[b].current_key()))
        else {
            break;
        };
        let run = &mut runs[at];
        picks.push((run.slot, run.row));
        taken.push(run.addrs.value(run.row));
        run.row += 1;
        if run.row == run.batch.num_rows() {
            if run.advance().await? {
                run.slot = sources.len();
                sources.push(run.batch.clone());
            } else {
                runs.remove(at);
            }
        }
    }
    if picks.is_empty() {
        return Ok(None);
    }
    let refs: Vec<&RecordBatch> = sources.iter().collect();
    let batch = arrow_select::interleave::interleave_record_batch(&refs, &picks)?;
    addrs.lock().expect("merge addresses").extend(taken);
    Ok(Some(batch))
}

/// A batch read with `_rowaddr`: the batch without it, and the addresses.
fn split_addresses(batch: RecordBatch) -> lancedb::Result<(RecordBatch, arrow_array::UInt64Array)> {
    let schema = batch.schema();
    let at = schema.index_of(ROW_ADDR)?;
    let addrs = batch.column(at).as_primitive::<UInt64Type>().clone();
    let data: Vec<usize> = (0..schema.fields().len()).filter(|&i| i != at).collect();
    Ok((batch.project(&data)?, addrs))
}

/// The merge's key column of `batch`, which must be text.
fn key_column<'a>(
    batch: &'a RecordBatch,
    key: &str,
) -> lancedb::Result<&'a arrow_array::StringArray> {
    batch
        .column_by_name(key)
        .and_then(|c| c.as_string_opt::<i32>())
        .ok_or_else(|| lancedb::Error::Runtime {
            message: format!("the merge's key column {key} is not text"),
        })
}

/// Every batch of `batches` (one unordered fragment) as one batch ordered
/// by `key`, stably, its addresses kept beside (none when it has no rows).
async fn read_sorted(
    batches: impl futures::Stream<Item = lancedb::Result<RecordBatch>>,
    key: &str,
) -> lancedb::Result<Option<RecordBatch>> {
    let batches: Vec<RecordBatch> = batches.try_collect().await?;
    let Some(first) = batches.first() else {
        return Ok(None);
    };
    let all = arrow_select::concat::concat_batches(&first.schema(), &batches)?;
    let keys = key_column(&all, key)?;
    let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
    order.sort_by(|&a, &b| keys.value(a as usize).cmp(keys.value(b as usize)));
    let order = UInt32Array::from(order);
    Ok(Some(arrow_select::take::take_record_batch(&all, &order)?))
}

#[cfg(test)]
mod tests {
    use super::{plan, tiers, Tier};

    #[test]
    fn groups_fill_up_to_the_cap_and_the_last_waits() {
        // Eight fragments of 4 fill a group of 32; small and large ones are
        // left out; the ninth waits for more.
        let rows = [4, 4, 1, 4, 4, 4, 40, 4, 4, 4, 4];
        assert_eq!(
            plan(&rows, 4, 32, 32, false),
            vec![vec![0, 1, 3, 4, 5, 7, 8, 9]]
        );
        // Fragments over the target: six fit under the cap, the seventh
        // starts the next group, which waits.
        let rows = [5; 8];
        assert_eq!(plan(&rows, 4, 32, 32, false), vec![vec![0, 1, 2, 3, 4, 5]]);
        // A lone fragment is never rewritten by itself.
        assert_eq!(plan(&[20, 20], 4, 32, 32, false), Vec::<Vec<usize>>::new());
        assert_eq!(
            plan(&[20, 12, 20, 12], 4, 32, 32, false),
            vec![vec![0, 1], vec![2, 3]]
        );
        // With `last`, the group still filling is kept too, if it merges
        // anything.
        assert_eq!(
            plan(&[20, 12, 5, 6, 40], 4, 32, 32, true),
            vec![vec![0, 1], vec![2, 3]]
        );
        assert_eq!(plan(&[20, 12, 5], 4, 32, 32, true), vec![vec![0, 1]]);
        assert!(plan(&[5, 6], 4, 32, 32, false).is_empty());
    }

    #[test]
    fn each_tier_takes_the_last_ones_nearly_full_fragments() {
        let t = tiers(8192, 8, 3);
        let tier = |lo, hi, cap, ordered| Tier {
            lo,
            hi,
            cap,
            ordered,
        };
        assert_eq!(
            t,
            [
                tier(256, 57_344, 65_536, false),
                tier(57_344, 458_752, 524_288, true),
                tier(458_752, 3_670_016, 4_194_304, true),
            ]
        );
        // A merge of eight full fragments, or of seven with a few rows
        // deleted, goes up a tier; one of six merges again in its own.
        let second = t[0];
        let merged = |n: usize| plan(&[n, n], second.lo, second.hi, second.cap, false);
        assert!(merged(65_536 - 100).is_empty());
        assert!(
            merged(6 * 8192).is_empty(),
            "two of 49,152 rows exceed the cap"
        );
        assert_eq!(
            plan(&[6 * 8192, 8192, 8192], 8192, 57_344, 65_536, false),
            vec![vec![0, 1, 2]]
        );
        let third = t[1];
        let rows = [65_536; 9];
        assert_eq!(
            plan(&rows, third.lo, third.hi, third.cap, false),
            vec![(0..8).collect::<Vec<_>>()]
        );
    }
}
