//! A batch's new rows and the stored memories its side effects change,
//! written in one commit: the changed memories move, whole, into the
//! batch's new fragment and their old rows are deleted, the `Update` a
//! full-row `merge_insert` commits, without its join and index probe (the
//! writer reads the rows' addresses itself).
//!
//! A batch's side effects (supersessions, a duplicate's merged sources)
//! change a few stored memories, which lie in fragments of many rows.
//! Lance's column patch (a partial-schema `merge_insert`, which the writer
//! used before) rewrites the patched columns for every row of each such
//! fragment, and committed apart from the batch's append: 37% of the
//! writer's time in a 1M-record import, for 0.6% of its rows (README,
//! **Side effects moved with the batch**). Moved, a changed memory costs
//! its own row and a deletion file.
//!
//! The addresses and the rows are read from one version of the table, and
//! the commit is made on that version: a concurrent commit that rewrote or
//! deleted from one of those fragments since fails it as a retryable
//! conflict (Lance's conflict resolver), and the writer reads again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::RecordBatch;
use futures::{StreamExt, TryStreamExt};
use lance::dataset::transaction::{Operation, Transaction, UpdateMode};
use lance::dataset::{CommitBuilder, InsertBuilder, WriteMode, WriteParams};
use lance::deps::datafusion::error::DataFusionError;
use lance::deps::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use lance::deps::datafusion::physical_plan::SendableRecordBatchStream;
use lance::table::format::Fragment;
use lance::Dataset;
use lancedb::Table;

use super::{claims, Filter, Result, StoreError};
use crate::core::model::{batch_to_chunks, Chunk};

fn lance(e: lance::Error) -> StoreError {
    StoreError::Lance(lancedb::Error::from(e))
}

fn runtime(message: impl Into<String>) -> StoreError {
    StoreError::Lance(lancedb::Error::Runtime {
        message: message.into(),
    })
}

/// One version of the chunk table, which a batch's moves are read from,
/// written on and committed to.
pub(super) struct Snapshot(Arc<Dataset>);

impl Snapshot {
    pub async fn of(table: &Table) -> Result<Snapshot> {
        let handle = table
            .dataset()
            .ok_or_else(|| runtime("the chunk table is not a local Lance dataset"))?;
        handle.ensure_mutable()?;
        Ok(Snapshot(handle.get().await?))
    }

    /// The whole rows (embedding included) with these ids, each with its
    /// address (its `_rowid`: loomem's tables have no stable row ids, so a
    /// row id is the row's address, see [`claims::fragment_of`]): the
    /// addresses from the `id` index (one narrow column read), then the rows
    /// taken from them.
    pub async fn located<S: AsRef<str>>(&self, ids: &[S]) -> Result<Vec<(Chunk, u64)>> {
        let ds = &self.0;
        let started = std::time::Instant::now();
        let mut at: HashMap<String, u64> = HashMap::new();
        for part in ids.chunks(1000) {
            let mut scan = ds.scan();
            scan.filter(&Filter::new().ids(part).predicate())
                .and_then(|s| s.project(&["id"]))
                .map_err(lance)?
                .with_row_id();
            let batches: Vec<RecordBatch> = scan
                .try_into_stream()
                .await
                .map_err(lance)?
                .try_collect()
                .await
                .map_err(lance)?;
            for b in &batches {
                let (Some(id), Some(address)) = (
                    b.column_by_name("id")
                        .and_then(|a| a.as_string_opt::<i32>()),
                    b.column_by_name("_rowid")
                        .and_then(|a| a.as_primitive_opt::<UInt64Type>()),
                ) else {
                    return Err(runtime("a read by id returned no ids or row ids"));
                };
                for r in 0..b.num_rows() {
                    at.insert(id.value(r).to_string(), address.value(r));
                }
            }
        }
        if at.is_empty() {
            return Ok(Vec::new());
        }
        let looked_up = started.elapsed();
        let addresses: Vec<u64> = at.values().copied().collect();
        let rows = ds
            .take_rows(&addresses, ds.schema().clone())
            .await
            .map_err(lance)?;
        let fragments: std::collections::HashSet<u64> =
            addresses.iter().map(|&a| claims::fragment_of(a)).collect();
        tracing::debug!(
            ?looked_up,
            taken = ?started.elapsed() - looked_up,
            rows = addresses.len(),
            fragments = fragments.len(),
            "moved memories read"
        );
        Ok(batch_to_chunks(&rows)?
            .into_iter()
            .filter_map(|c| {
                let address = *at.get(&c.id)?;
                Some((c, address))
            })
            .collect())
    }

    /// Write `first` and then what `then` gives (nothing, if its sender is
    /// dropped) as new fragments, uncommitted: the batch's new rows are
    /// written while its moved memories are still being read. Both in the
    /// table's own schema.
    pub async fn write(
        &self,
        first: Option<RecordBatch>,
        then: tokio::sync::oneshot::Receiver<RecordBatch>,
    ) -> Result<Vec<Fragment>> {
        let (first, then) = match first {
            Some(first) => (first, Some(then)),
            None => match then.await {
                Ok(only) => (only, None),
                Err(_) => return Ok(Vec::new()),
            },
        };
        let schema = first.schema();
        if !super::in_schema_of(&self.0, &schema) {
            return Err(runtime("a batch's write is not in the table's schema"));
        }
        let later = futures::stream::iter(then)
            .then(|then| then)
            .filter_map(|got| std::future::ready(got.ok()));
        let batches = futures::stream::once(std::future::ready(first))
            .chain(later)
            .map(Ok::<_, DataFusionError>);
        let stream: SendableRecordBatchStream =
            Box::pin(RecordBatchStreamAdapter::new(schema, batches));
        let params = WriteParams {
            mode: WriteMode::Append,
            ..Default::default()
        };
        let written = InsertBuilder::new(self.0.clone())
            .with_params(&params)
            .execute_uncommitted_stream(stream)
            .await
            .map_err(lance)?;
        match written.operation {
            Operation::Append { fragments } => Ok(fragments),
            _ => Err(runtime("an uncommitted append did not return fragments")),
        }
    }

    /// Commit the new fragments and the deletion of the rows at `replaced`
    /// (row addresses), whose new versions they hold, on this version.
    pub async fn commit(
        self,
        table: &Table,
        new_fragments: Vec<Fragment>,
        replaced: &[u64],
    ) -> Result<()> {
        let ds = self.0;
        let operation = if replaced.is_empty() {
            Operation::Append {
                fragments: new_fragments,
            }
        } else {
            let (updated_fragments, removed_fragment_ids) = deleting(&ds, replaced).await?;
            Operation::Update {
                removed_fragment_ids,
                updated_fragments,
                new_fragments,
                fields_modified: vec![],
                compacted_sstables: vec![],
                // Every field, as Lance's full-row merge_insert gives: no
                // index may take the moved rows' new fragment as covered.
                fields_for_preserving_frag_bitmap: ds
                    .schema()
                    .fields_pre_order()
                    .map(|f| f.id as u32)
                    .collect(),
                update_mode: Some(UpdateMode::RewriteRows),
                inserted_rows_filter: None,
                updated_fragment_offsets: None,
            }
        };
        let transaction = Transaction::new(ds.manifest.version, operation, None);
        let committed = CommitBuilder::new(ds.clone())
            .execute(transaction)
            .await
            .map_err(lance)?;
        if let Some(handle) = table.dataset() {
            handle.update(committed);
        }
        Ok(())
    }
}

/// The fragments of `ds` with the rows at `addresses` deleted (written as
/// new deletion files, uncommitted), and those left with no row.
async fn deleting(ds: &Dataset, addresses: &[u64]) -> Result<(Vec<Fragment>, Vec<u64>)> {
    let mut by_fragment: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for &address in addresses {
        by_fragment
            .entry(claims::fragment_of(address))
            .or_default()
            .push(address as u32);
    }
    let (mut updated, mut removed) = (Vec::new(), Vec::new());
    for (id, offsets) in by_fragment {
        let Some(fragment) = ds.get_fragment(id as usize) else {
            return Err(runtime(format!(
                "retryable conflict: fragment {id} left the version read"
            )));
        };
        match fragment.extend_deletions(offsets).await.map_err(lance)? {
            Some(f) => updated.push(f.metadata().clone()),
            None => removed.push(id),
        }
    }
    Ok((updated, removed))
}
