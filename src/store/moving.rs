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
//!
//! The entity graph's group commits write their changed rows back the same
//! way ([`Snapshot::rows_where`], [`Snapshot::replace`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
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
    /// row id is the row's address, see [`claims::fragment_of`]). The
    /// addresses come from where the writer put its rows lately
    /// ([`Placed`]), else from the `id` index (one narrow column read over
    /// the index and the rows it does not cover yet); then the rows are
    /// taken from them. A remembered address whose fragment has left this
    /// version, or whose row is deleted in it, takes nothing, and its id
    /// is looked up. Also says how many ids were looked up.
    pub async fn located<S: AsRef<str>>(
        &self,
        ids: &[S],
        placed: &Placed,
    ) -> Result<(Vec<(Chunk, u64)>, usize)> {
        if ids.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let started = std::time::Instant::now();
        let remembered = placed.recall(ids.iter().map(|id| id.as_ref()));
        let recalled = remembered.len();
        let mut found = self.taken(remembered).await?;
        let from_memory = found.len();
        // Not remembered, or remembered but moved or deleted since: looked up.
        let mut seen: HashSet<&str> = found.iter().map(|(c, _)| c.id.as_str()).collect();
        let missing: Vec<&str> = ids
            .iter()
            .map(|id| id.as_ref())
            .filter(|id| seen.insert(id))
            .collect();
        let remembered_took = started.elapsed();
        let looked_up = self.looked_up(&missing).await?;
        let lookup_took = started.elapsed() - remembered_took;
        let looked_up_rows = looked_up.len();
        found.extend(self.taken(looked_up).await?);
        tracing::debug!(
            remembered = from_memory,
            stale = recalled - from_memory,
            looked_up = looked_up_rows,
            ?remembered_took,
            ?lookup_took,
            taken = ?started.elapsed() - remembered_took - lookup_took,
            "moved memories read"
        );
        Ok((found, missing.len()))
    }

    /// The addresses of the rows with these ids, from the `id` index.
    async fn looked_up(&self, ids: &[&str]) -> Result<HashMap<String, u64>> {
        let mut at: HashMap<String, u64> = HashMap::new();
        for part in ids.chunks(1000) {
            let predicate = Filter::new().ids(part).predicate();
            for b in &self.rows_where(&predicate, Some(&["id"])).await? {
                let id = b
                    .column_by_name("id")
                    .and_then(|a| a.as_string_opt::<i32>())
                    .ok_or_else(|| runtime("a read by id returned no ids"))?;
                for (r, &address) in addresses(b)?.iter().enumerate() {
                    at.insert(id.value(r).to_string(), address);
                }
            }
        }
        Ok(at)
    }

    /// The live rows at these addresses, whole, each kept only if it holds
    /// the id its address was given for. Addresses in fragments this
    /// version no longer has are left out (a take fails on them), and a take
    /// skips the rows this version deleted.
    async fn taken(&self, at: HashMap<String, u64>) -> Result<Vec<(Chunk, u64)>> {
        if at.is_empty() {
            return Ok(Vec::new());
        }
        let ds = &self.0;
        let present: HashSet<u64> = ds.manifest.fragments.iter().map(|f| f.id).collect();
        let mut addresses: Vec<u64> = at
            .values()
            .copied()
            .filter(|&a| present.contains(&claims::fragment_of(a)))
            .collect();
        if addresses.is_empty() {
            return Ok(Vec::new());
        }
        addresses.sort_unstable();
        addresses.dedup();
        // Every column and where each row read lies (`_rowaddr` read with
        // the rows: the take's own address column refuses deleted rows).
        let schema = ds.schema();
        let columns = schema
            .fields
            .iter()
            .map(|f| f.name.as_str())
            .chain([lance_core::ROW_ADDR]);
        let projection = lance::dataset::ProjectionRequest::from_columns(columns, schema);
        let rows = ds.take_rows(&addresses, projection).await.map_err(lance)?;
        let lie = rows
            .column_by_name(lance_core::ROW_ADDR)
            .and_then(|c| c.as_primitive_opt::<UInt64Type>())
            .ok_or_else(|| runtime("a take returned no row addresses"))?
            .values()
            .clone();
        Ok(batch_to_chunks(&rows)?
            .into_iter()
            .zip(lie.iter().copied())
            .filter(|(c, address)| at.get(&c.id) == Some(address))
            .collect())
    }

    /// The rows of this version that `predicate` selects, whole or only
    /// `columns`, each batch with the rows' addresses (its `_rowid` column,
    /// read by [`addresses`]).
    pub async fn rows_where(
        &self,
        predicate: &str,
        columns: Option<&[&str]>,
    ) -> Result<Vec<RecordBatch>> {
        let mut scan = self.0.scan();
        scan.filter(predicate).map_err(lance)?;
        if let Some(columns) = columns {
            scan.project(columns).map_err(lance)?;
        }
        scan.with_row_id();
        scan.try_into_stream()
            .await
            .map_err(lance)?
            .try_collect()
            .await
            .map_err(lance)
    }

    /// Write `rows` as a new fragment and delete the rows at `replaced`,
    /// whose new versions it holds, in one commit on this version.
    pub async fn replace(self, table: &Table, rows: RecordBatch, replaced: &[u64]) -> Result<()> {
        let (_, nothing_more) = tokio::sync::oneshot::channel();
        let fragments = self.write(Some(rows), nothing_more).await?;
        self.commit(table, fragments, replaced).await.map(|_| ())
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
    /// Returns the id and the row count Lance gave each new fragment, in
    /// the order given (to [`Placed::remember`] where their rows went).
    pub async fn commit(
        self,
        table: &Table,
        new_fragments: Vec<Fragment>,
        replaced: &[u64],
    ) -> Result<Vec<(u64, usize)>> {
        let ds = self.0;
        // A new fragment is known again, once committed, by its data file.
        let written: Vec<(Option<String>, usize)> = new_fragments
            .iter()
            .map(|f| {
                let rows = f.physical_rows.unwrap_or(0);
                (f.files.first().map(|d| d.path.clone()), rows)
            })
            .collect();
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
        // The new fragments are the table's last: look for them from the end.
        let mut ids: HashMap<&str, u64> = HashMap::new();
        for f in committed.manifest.fragments.iter().rev() {
            if ids.len() == written.len() {
                break;
            }
            if let Some(d) = f.files.first() {
                if written
                    .iter()
                    .any(|(p, _)| p.as_deref() == Some(d.path.as_str()))
                {
                    ids.insert(d.path.as_str(), f.id);
                }
            }
        }
        let placed = written
            .iter()
            .map_while(|(path, rows)| Some((*ids.get(path.as_deref()?)?, *rows)))
            .collect();
        if let Some(handle) = table.dataset() {
            handle.update(committed);
        }
        Ok(placed)
    }
}

/// The addresses of a batch's rows, from its `_rowid` column (see
/// [`Snapshot::rows_where`]).
pub(super) fn addresses(batch: &RecordBatch) -> Result<&[u64]> {
    batch
        .column_by_name(lance_core::ROW_ID)
        .and_then(|c| c.as_primitive_opt::<UInt64Type>())
        .map(|a| a.values().as_ref())
        .ok_or_else(|| runtime("a read returned no row ids"))
}

/// Where the writer put the rows it wrote lately, by id: the address of
/// each row of its last [`PLACED_ROWS`] rows written, so that a batch
/// superseding recent memories (the usual case: the memory a new one
/// updates was most often written a moment ago) takes them without the
/// `id` lookup, a scan that grows with the rows the `id` index does not
/// cover yet (16 to 105 ms a batch over a 1M-record import). An address
/// is only a guess, checked by the take: a merge rewrites its fragment,
/// a delete or a replacement deletes its row, and the id is then looked
/// up. A rollback may bring back fragment ids the table had given out
/// since, so it forgets every address ([`Placed::forget`]). Ids are kept
/// as 64-bit hashes (about 40 bytes a row in all); two ids of one hash
/// share an entry, and the take's id check turns the loser into a lookup.
#[derive(Default)]
pub(super) struct Placed {
    hasher: std::hash::RandomState,
    rows: std::sync::Mutex<PlacedRows>,
}

#[derive(Default)]
struct PlacedRows {
    at: HashMap<u64, u64>,
    /// Hashes and addresses in the order placed, to forget the oldest.
    order: VecDeque<(u64, u64)>,
}

/// How many of the last rows written [`Placed`] keeps the address of.
const PLACED_ROWS: usize = 1 << 18;

impl Placed {
    fn hash(&self, id: &str) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(id)
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, PlacedRows> {
        self.rows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forget every address (the table was rolled back).
    pub fn forget(&self) {
        *self.rows() = PlacedRows::default();
    }

    /// Remember the addresses of rows just committed: `ids` in the order
    /// written, filling `fragments` (id and row count, as
    /// [`Snapshot::commit`] returns them) in turn. Nothing is remembered
    /// when the two do not add up.
    pub fn remember<'a>(&self, ids: impl Iterator<Item = &'a str>, fragments: &[(u64, usize)]) {
        let hashes: Vec<u64> = ids.map(|id| self.hash(id)).collect();
        if hashes.len() != fragments.iter().map(|(_, rows)| rows).sum::<usize>() {
            return;
        }
        let addresses = fragments
            .iter()
            .flat_map(|&(fragment, rows)| (0..rows as u64).map(move |r| (fragment << 32) | r));
        let hashed: Vec<(u64, u64)> = hashes.into_iter().zip(addresses).collect();
        let mut placed = self.rows();
        for &(hash, address) in &hashed {
            placed.at.insert(hash, address);
        }
        placed.order.extend(hashed);
        while placed.order.len() > PLACED_ROWS {
            let Some((hash, address)) = placed.order.pop_front() else {
                break;
            };
            // Unless the id was placed again since.
            if placed.at.get(&hash) == Some(&address) {
                placed.at.remove(&hash);
            }
        }
    }

    /// The remembered addresses of those of these ids that have one.
    fn recall<'a>(&self, ids: impl Iterator<Item = &'a str>) -> HashMap<String, u64> {
        let placed = self.rows();
        ids.filter_map(|id| Some((id.to_string(), *placed.at.get(&self.hash(id))?)))
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::maintain::{merge_small_fragments, Maintenance};
    use crate::store::Store;

    fn memory(id: &str) -> Chunk {
        let mut c = Chunk::new(id.into(), "s".into(), format!("memory {id}"), 1);
        c.embedding = Some(vec![1.0; 4]);
        c
    }

    /// Write these memories as one new fragment, committed as the writer
    /// commits a batch, and remember where they went.
    async fn placed_write(table: &Table, placed: &Placed, ids: &[&str]) -> Vec<(u64, usize)> {
        let rows: Vec<Chunk> = ids.iter().map(|id| memory(id)).collect();
        let batch = crate::core::model::chunks_to_batch(&rows, 4).unwrap();
        let snapshot = Snapshot::of(table).await.unwrap();
        let (_, then) = tokio::sync::oneshot::channel();
        let fragments = snapshot.write(Some(batch), then).await.unwrap();
        let at = snapshot.commit(table, fragments, &[]).await.unwrap();
        placed.remember(ids.iter().copied(), &at);
        at
    }

    /// What the `id` index says, the addresses `located` must give.
    async fn lookup(table: &Table, ids: &[&str]) -> HashMap<String, u64> {
        Snapshot::of(table)
            .await
            .unwrap()
            .looked_up(ids)
            .await
            .unwrap()
    }

    /// Where `located` finds `ids`, and how many of them it looked up.
    async fn located(
        table: &Table,
        placed: &Placed,
        ids: &[&str],
    ) -> (HashMap<String, u64>, usize) {
        let snapshot = Snapshot::of(table).await.unwrap();
        let (found, looked_up) = snapshot.located(ids, placed).await.unwrap();
        let at: HashMap<String, u64> = found.iter().map(|(c, a)| (c.id.clone(), *a)).collect();
        assert_eq!(at.len(), found.len(), "one row an id: {found:?}");
        (at, looked_up)
    }

    /// The rows a batch commits are remembered where Lance put them; a
    /// remembered address is taken only while it still holds its id: after
    /// a delete, a merge that rewrote the fragment, or a wrong guess, the id
    /// is looked up, and `located` always gives the rows the `id` index
    /// gives, at the same addresses.
    #[tokio::test]
    async fn remembered_addresses_are_checked_and_stale_ones_looked_up() {
        let tmp = tempfile::tempdir().unwrap();
        let location = crate::store::Location::local(tmp.path());
        let store = Store::open_with(&location, 4, 100, None, Maintenance::off())
            .await
            .unwrap();
        let table = store.chunks_table();
        let placed = Placed::default();
        let first = placed_write(table, &placed, &["m0", "m1", "m2", "m3"]).await;
        let second = placed_write(table, &placed, &["m4", "m5"]).await;
        let (f1, f2) = (first[0].0, second[0].0);
        assert_eq!((first[0].1, second[0].1), (4, 2));
        let known = placed.recall(["m1", "m5", "nope"].into_iter());
        assert_eq!(known.len(), 2, "{known:?}");
        assert_eq!(known["m1"], (f1 << 32) | 1);
        assert_eq!(known["m5"], (f2 << 32) | 1);

        let ids = ["m1", "m5", "nope"];
        let (at, looked_up) = located(table, &placed, &ids).await;
        assert_eq!(at, lookup(table, &ids).await);
        assert_eq!(at.len(), 2);
        assert_eq!(looked_up, 1, "only the id never placed is looked up");

        // A deleted row is not taken from its remembered address.
        table.delete("id = 'm1'").await.unwrap();
        let (at, looked_up) = located(table, &placed, &["m1", "m2"]).await;
        assert_eq!(at.keys().collect::<Vec<_>>(), vec!["m2"]);
        assert_eq!(looked_up, 1);

        // A merge rewrites both fragments: every remembered address is gone.
        merge_small_fragments(table, 1000).await.unwrap();
        let manifest = table.as_native().unwrap().manifest().await.unwrap();
        assert!(manifest.fragments.iter().all(|f| f.id != f1 && f.id != f2));
        let ids = ["m0", "m2", "m4", "m5"];
        let (at, looked_up) = located(table, &placed, &ids).await;
        assert_eq!(at, lookup(table, &ids).await);
        assert_eq!((at.len(), looked_up), (4, 4));

        // A wrong guess (an address holding another id) is not believed.
        {
            let mut rows = placed.rows();
            let m4 = placed.hash("m4");
            rows.at.insert(m4, at["m5"]);
        }
        let (at, looked_up) = located(table, &placed, &["m4"]).await;
        assert_eq!(at, lookup(table, &["m4"]).await);
        assert_eq!((at.len(), looked_up), (1, 1));
    }

    /// Ids that do not add up to the fragments' rows are not remembered;
    /// the oldest addresses are forgotten past the bound, unless their id
    /// was placed again since; `forget` forgets them all.
    #[test]
    fn placed_rows_are_bounded_and_forgotten() {
        let placed = Placed::default();
        placed.remember(["a", "b", "c"].into_iter(), &[(3, 2)]);
        assert!(placed.recall(["a", "b", "c"].into_iter()).is_empty());

        let ids: Vec<String> = (0..PLACED_ROWS + 1).map(|i| format!("id{i}")).collect();
        placed.remember(ids.iter().map(|s| s.as_str()), &[(1, PLACED_ROWS + 1)]);
        let known = placed.recall(["id0", "id1", "id262144"].into_iter());
        assert_eq!(known.len(), 2, "id0 is forgotten: {known:?}");
        assert!(known.contains_key("id1"));
        assert_eq!(known["id262144"], (1 << 32) | PLACED_ROWS as u64);
        // id1 placed again: the entry of its first place does not evict it.
        placed.remember(["id1"].into_iter(), &[(2, 1)]);
        placed.remember(ids[2..4].iter().map(|s| s.as_str()), &[(3, 2)]);
        assert_eq!(placed.recall(["id1"].into_iter())["id1"], 2 << 32);

        placed.forget();
        assert!(placed.recall(["id1", "id262144"].into_iter()).is_empty());
    }
}
