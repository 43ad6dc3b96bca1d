//! The second tier of the chunk table's merges: full fragments rewritten as
//! one whose rows are ordered by stream, the indexes remapped to the moved
//! rows.
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
use lance::index::DatasetIndexExt;
use lance::Dataset;
use lance_core::utils::row_addr_remap::RowAddrRemap;
use lance_core::ROW_ADDR;
use lancedb::Table;

/// The fragments whose row counts are `rows` (indexes into it), those of
/// at least `target_rows` rows and under `cap` packed in order into groups
/// of up to `cap` rows: each group that filled (the next fragment would not
/// fit, or it holds exactly `cap`) and holds two or more fragments. The last
/// group, still filling, waits for more.
pub(super) fn plan(rows: &[usize], target_rows: usize, cap: usize) -> Vec<Vec<usize>> {
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
        if n < target_rows || n >= cap {
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
    groups
}

/// [`plan`] within each set of fragments the same index segments cover:
/// Lance refuses a rewrite whose old fragments an index covers only in
/// part (the new fragment would be half indexed). Fragments written since
/// a segment was built wait until the writer's refreshes merge the
/// segments; those no index covers merge among themselves.
fn plan_by_coverage(
    fragments: &[lance::table::format::Fragment],
    indices: &[lance::table::format::IndexMetadata],
    target_rows: usize,
    cap: usize,
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
    for members in classes.values() {
        let rows: Vec<usize> = members.iter().map(|&at| rows_of(&fragments[at])).collect();
        for group in plan(&rows, target_rows, cap) {
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

/// How many full fragments (at least `target_rows`, under `cap`) `table`
/// holds; `None` where the ordered merge cannot run (not a local Lance
/// table, or one with stable row ids, whose indexes need no remap).
pub(super) async fn full_fragments(table: &Table, target_rows: usize, cap: usize) -> Option<usize> {
    let handle = table.dataset()?;
    let ds = handle.get().await.ok()?;
    if ds.manifest.uses_stable_row_ids() {
        return None;
    }
    Some(
        ds.manifest
            .fragments
            .iter()
            .filter(|f| (target_rows..cap).contains(&rows_of(f)))
            .count(),
    )
}

/// One attempt: the groups [`plan`] finds among `table`'s fragments, each
/// rewritten as one fragment ordered by `key`, committed in one `Rewrite`
/// with every index remapped. The number of fragments merged.
pub(super) async fn merge_ordered(
    table: &Table,
    key: &str,
    target_rows: usize,
    cap: usize,
) -> lancedb::Result<usize> {
    let Some(handle) = table.dataset() else {
        return Ok(0);
    };
    handle.ensure_mutable()?;
    let ds = handle.get().await?;
    let fragments = ds.manifest.fragments.as_ref().clone();
    let indices = ds.load_indices().await?;
    let groups = plan_by_coverage(&fragments, &indices, target_rows, cap);
    if groups.is_empty() {
        return Ok(0);
    }
    let read_version = ds.manifest.version;
    let mut rewrite = Vec::with_capacity(groups.len());
    // Each group's old row addresses, in the order of its new rows.
    let mut moved: Vec<Vec<u64>> = Vec::with_capacity(groups.len());
    for group in &groups {
        let old: Vec<_> = group.iter().map(|&i| fragments[i].clone()).collect();
        let (batch, addrs) = read_ordered(&ds, old.clone(), key).await?;
        let params = WriteParams {
            mode: WriteMode::Append,
            max_rows_per_file: batch.num_rows().max(1),
            ..Default::default()
        };
        let written = InsertBuilder::new(ds.clone())
            .with_params(&params)
            .execute_uncommitted(vec![batch])
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
    let committed = CommitBuilder::new(Arc::new(reserved)).execute(swap).await?;
    handle.update(committed);
    Ok(affected.len())
}

/// The live rows of `fragments`, ordered by `key` (stably), without their
/// addresses, and their addresses in that order.
async fn read_ordered(
    ds: &Dataset,
    fragments: Vec<lance::table::format::Fragment>,
    key: &str,
) -> lancedb::Result<(RecordBatch, Vec<u64>)> {
    let batches: Vec<RecordBatch> = ds
        .scan()
        .with_fragments(fragments)
        .with_row_address()
        .try_into_stream()
        .await?
        .try_collect()
        .await?;
    let Some(first) = batches.first() else {
        return Err(lancedb::Error::Runtime {
            message: "a merge read no rows".into(),
        });
    };
    let all = arrow_select::concat::concat_batches(&first.schema(), &batches)?;
    let keys = all
        .column_by_name(key)
        .and_then(|c| c.as_string_opt::<i32>())
        .ok_or_else(|| lancedb::Error::Runtime {
            message: format!("the merge's key column {key} is not text"),
        })?;
    let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
    order.sort_by(|&a, &b| keys.value(a as usize).cmp(keys.value(b as usize)));
    let order = UInt32Array::from(order);
    let sorted = arrow_select::take::take_record_batch(&all, &order)?;
    let schema = sorted.schema();
    let addr_at = schema.index_of(ROW_ADDR)?;
    let addrs = sorted
        .column(addr_at)
        .as_primitive::<UInt64Type>()
        .values()
        .to_vec();
    let data: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| i != addr_at)
        .collect();
    Ok((sorted.project(&data)?, addrs))
}

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn groups_fill_up_to_the_cap_and_the_last_waits() {
        // Eight fragments of 4 fill a group of 32; small and large ones are
        // left out; the ninth waits for more.
        let rows = [4, 4, 1, 4, 4, 4, 40, 4, 4, 4, 4];
        assert_eq!(plan(&rows, 4, 32), vec![vec![0, 1, 3, 4, 5, 7, 8, 9]]);
        // Fragments over the target: six fit under the cap, the seventh
        // starts the next group, which waits.
        let rows = [5; 8];
        assert_eq!(plan(&rows, 4, 32), vec![vec![0, 1, 2, 3, 4, 5]]);
        // A lone fragment is never rewritten by itself.
        assert_eq!(plan(&[20, 20], 4, 32), Vec::<Vec<usize>>::new());
        assert_eq!(plan(&[20, 12, 20, 12], 4, 32), vec![vec![0, 1], vec![2, 3]]);
    }
}
