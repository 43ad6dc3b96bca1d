//! `write`: commits the kept records of the batch to the `chunks` table: an
//! upsert by id (so a redelivered batch changes nothing), or an append for the
//! records whose ids the server minted and that are delivered for the first
//! time (no stored row can have them, and an append costs no join).

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;

use super::parse_params;
use crate::pipeline::{BuildContext, Disposition, PipelineError, Record, Stage};
use crate::store::Store;

/// `write` takes no parameters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteConfig {}

impl WriteConfig {
    pub fn build(self, store: Arc<Store>) -> Write {
        Write { store }
    }
}

pub fn build(params: toml::Table, ctx: &BuildContext) -> Result<Box<dyn Stage>, PipelineError> {
    let cfg: WriteConfig = parse_params("write", params)?;
    Ok(Box::new(cfg.build(ctx.store.clone())))
}

/// An id names one memory in one stream: a record whose id is stored in
/// another stream fails instead of moving that memory into its own, and one
/// whose id is an immutable memory is dropped instead of overwriting it. The
/// services refuse such writes up front with a clear answer; this is the
/// last line, for every route and for writes that race.
///
/// Returns the ids of the batch that are stored already.
async fn refuse_foreign_ids(
    store: &Store,
    batch: &mut [Record],
) -> crate::store::Result<std::collections::HashSet<String>> {
    // A minted id on its first delivery is in no stream yet.
    let ids: Vec<&str> = batch
        .iter()
        .filter(|r| !r.new_id)
        .map(|r| r.chunk.id.as_str())
        .collect();
    if ids.is_empty() {
        return Ok(Default::default());
    }
    let owners = store.owners(&ids).await?;
    for r in batch.iter_mut().filter(|r| r.is_kept()) {
        match owners.get(&r.chunk.id) {
            Some(o) if o.stream != r.chunk.stream => {
                r.disposition = Disposition::Fail(crate::core::error::id_in_use(&r.chunk.id));
            }
            // The stored memory stays as it is; a redelivery of the write that
            // stored it lands here too, so this is no failure.
            Some(o) if o.immutable => {
                r.disposition = Disposition::Drop {
                    reason: "immutable",
                    existing_id: Some(r.chunk.id.clone()),
                };
            }
            _ => {}
        }
    }
    Ok(owners.into_keys().collect())
}

pub struct Write {
    store: Arc<Store>,
}

impl Stage for Write {
    fn name(&self) -> &'static str {
        "write"
    }

    fn process<'a>(&'a self, batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>> {
        Box::pin(async move {
            let fail = |e: crate::store::StoreError| PipelineError::Batch {
                stage: "write",
                message: e.to_string(),
            };
            let stored = refuse_foreign_ids(&self.store, batch).await.map_err(fail)?;
            // Side effects of kept and deliberately dropped records (a duplicate
            // updates the memory it duplicates, an update the memory it
            // supersedes); none of failed ones.
            let settled = batch
                .iter()
                .filter(|r| !matches!(r.disposition, Disposition::Fail(_)));
            let side: Vec<_> = settled
                .clone()
                .flat_map(|r| r.also_write.iter().cloned())
                .collect();
            // When a record is also another's side effect, its own final form
            // wins (so it is merged, not appended). The rest of the records
            // whose ids nothing can hold yet are appended: no join on `id`.
            let touched: std::collections::HashSet<&str> =
                side.iter().map(|c| c.id.as_str()).collect();
            let (fresh, rows): (Vec<_>, Vec<_>) = batch
                .iter()
                .filter(|r| r.is_kept())
                .partition(|r| r.new_id && !touched.contains(r.chunk.id.as_str()));
            let fresh: Vec<_> = fresh.into_iter().map(|r| r.chunk.clone()).collect();
            let rows: Vec<_> = rows.into_iter().map(|r| r.chunk.clone()).collect();
            let history: Vec<_> = settled.flat_map(|r| r.history.iter().cloned()).collect();
            self.store
                .commit_batch(fresh, rows, side)
                .await
                .map_err(fail)?;
            self.store.add_history(history).await.map_err(fail)?;
            crate::pipeline::settle(batch, "write").await?;
            // A record dropped or failed after its entities were recorded
            // (a near-duplicate, a refused id) leaves no trace in the graph,
            // unless its id names a memory that is stored.
            let kept: std::collections::HashSet<String> = batch
                .iter()
                .filter(|r| r.is_kept())
                .map(|r| r.chunk.id.clone())
                .collect();
            let unstored: Vec<(String, crate::store::graph::ChunkRefs)> = batch
                .iter_mut()
                .filter(|r| {
                    !r.is_kept() && !stored.contains(&r.chunk.id) && !kept.contains(&r.chunk.id)
                })
                .map(|r| (r.chunk.id.clone(), std::mem::take(&mut r.graph_refs)))
                .filter(|(_, refs)| !refs.is_empty())
                .collect();
            self.store.graph.retract(&unstored).await.map_err(fail)
        })
    }
}
