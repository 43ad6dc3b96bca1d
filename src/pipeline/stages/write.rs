//! `write`: commits the kept records of the batch to the `chunks` table (and
//! their history to the `history` table, beside it, in the same write): an
//! append for the records whose ids no stored row has (the ids the server
//! minted, on their first delivery, and those the writer finds unstored as
//! it commits: an append costs no join), an upsert by id for the rest (so a
//! redelivered batch changes nothing).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;

use super::parse_params;
use crate::pipeline::{BuildContext, Disposition, PipelineError, Record, Stage};
use crate::store::{Owner, Store, StoreError, WriteBatch};

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
/// last line, for every route and for writes that race: the writer looks the
/// owners up as it commits and refuses the batch, which is then written
/// without them.
fn refuse(batch: &mut [Record], owners: &HashMap<String, Owner>) {
    for r in batch.iter_mut().filter(|r| r.is_kept()) {
        match owners.get(&r.chunk.id) {
            Some(o) if o.stream != r.chunk.stream => {
                r.disposition = Disposition::Fail(crate::core::error::id_in_use(&r.chunk.id));
            }
            Some(o) if o.immutable => {
                r.disposition = Disposition::Drop {
                    reason: "immutable",
                    existing_id: Some(r.chunk.id.clone()),
                };
            }
            _ => {}
        }
    }
}

/// What a batch writes as it stands: its kept rows and the side effects of
/// its settled records. The kept records' chunks move into the write (each
/// leaves its id and stream behind, all that is read of it after the
/// commit); the positions they came from come with it, for [`unplan`].
fn plan(batch: &mut [Record]) -> (WriteBatch, Vec<usize>) {
    // Side effects of kept and deliberately dropped records (a duplicate
    // updates the memory it duplicates, an update the memory it supersedes);
    // none of failed ones.
    let side: Vec<_> = settled(batch)
        .flat_map(|r| r.also_write.iter().cloned())
        .collect();
    // When a record is also another's side effect, its own final form wins
    // (it goes with `rows`, where the writer drops the side effect). The
    // rest of the records whose ids nothing can hold yet are appended
    // without a lookup.
    let touched: HashSet<&str> = side.iter().map(|c| c.id.as_str()).collect();
    let (fresh, rows): (Vec<usize>, Vec<usize>) = (0..batch.len())
        .filter(|&i| batch[i].is_kept())
        .partition(|&i| batch[i].new_id && !touched.contains(batch[i].chunk.id.as_str()));
    let history = settled(batch)
        .flat_map(|r| r.history.iter().cloned())
        .collect();
    let mut take = |i: usize| {
        let left = batch[i].chunk.husk();
        std::mem::replace(&mut batch[i].chunk, left)
    };
    let write = WriteBatch {
        fresh: fresh.iter().map(|&i| take(i)).collect(),
        rows: rows.iter().map(|&i| take(i)).collect(),
        side,
        refuse: true,
        history,
    };
    (write, fresh.into_iter().chain(rows).collect())
}

/// Put a refused write's chunks back where [`plan`] took them from.
fn unplan(batch: &mut [Record], write: WriteBatch, from: &[usize]) {
    for (chunk, &i) in write.fresh.into_iter().chain(write.rows).zip(from) {
        batch[i].chunk = chunk;
    }
}

fn settled(batch: &[Record]) -> impl Iterator<Item = &Record> + Clone {
    batch
        .iter()
        .filter(|r| !matches!(r.disposition, Disposition::Fail(_)))
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
            let started = std::time::Instant::now();
            // Each refusal takes a record out, so this ends.
            loop {
                let (write, from) = plan(batch);
                match self.store.commit_batch(write).await {
                    Ok(()) => break,
                    Err(StoreError::Refused(refusal)) => {
                        unplan(batch, refusal.batch, &from);
                        refuse(batch, &refusal.owners);
                    }
                    Err(e) => return Err(fail(e)),
                }
            }
            let committed = started.elapsed();
            let relations: Vec<_> = batch
                .iter()
                .filter(|r| r.is_kept())
                .flat_map(|r| r.relations.iter().cloned())
                .collect();
            self.store.add_relations(relations).await.map_err(fail)?;
            tracing::debug!(
                ?committed,
                relations = ?started.elapsed() - committed,
                "write stage phases"
            );
            // A record dropped or failed after its entities were recorded
            // (a near-duplicate, a refused id) leaves no trace in the graph,
            // unless its id names a memory that is stored. The retraction
            // joins the entity graph's next group commit, like the rows it
            // takes back (see `Record::pending`): the batch's answers do not
            // wait for it, its acknowledgements do.
            let kept: HashSet<String> = batch
                .iter()
                .filter(|r| r.is_kept())
                .map(|r| r.chunk.id.clone())
                .collect();
            let dropped: Vec<&str> = batch
                .iter()
                .filter(|r| !r.is_kept() && !r.graph_refs.is_empty() && !kept.contains(&r.chunk.id))
                .map(|r| r.chunk.id.as_str())
                .collect();
            let stored = if dropped.is_empty() {
                HashMap::new()
            } else {
                self.store.owners(&dropped).await.map_err(fail)?
            };
            let unstored: Vec<(String, crate::store::graph::ChunkRefs)> = batch
                .iter_mut()
                .filter(|r| {
                    !r.is_kept() && !stored.contains_key(&r.chunk.id) && !kept.contains(&r.chunk.id)
                })
                .map(|r| (r.chunk.id.clone(), std::mem::take(&mut r.graph_refs)))
                .filter(|(_, refs)| !refs.is_empty())
                .collect();
            if !unstored.is_empty() {
                let retracted = self.store.graph.retract(&unstored);
                crate::pipeline::wait_for_graph(batch, &self.store, retracted);
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Chunk;

    fn memory(id: &str, stream: &str, text: &str) -> Chunk {
        let mut c = Chunk::new(id.into(), stream.into(), text.into(), 1);
        c.embedding = Some(vec![1.0, 0.0, 0.0, 0.0]);
        c
    }

    /// The kept records' chunks move into the write. A refused write comes
    /// back whole: the record naming another stream's memory fails, and the
    /// others are written again as they were, new ids and stored ones alike.
    #[tokio::test]
    async fn a_refused_write_is_written_again_without_the_foreign_record() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(tmp.path(), 4, 100).await.unwrap());
        store
            .upsert(vec![
                memory("theirs", "b", "kept as it is"),
                memory("mine", "a", "v1"),
            ])
            .await
            .unwrap();
        let mut batch = vec![
            Record {
                new_id: true,
                ..Record::new(memory("new", "a", "a new memory"))
            },
            Record::new(memory("theirs", "a", "an overwrite from another stream")),
            Record::new(memory("mine", "a", "v2")),
        ];
        Write {
            store: store.clone(),
        }
        .process(&mut batch)
        .await
        .unwrap();
        assert!(matches!(&batch[1].disposition, Disposition::Fail(e) if e.contains("theirs")));
        assert!(batch[0].is_kept() && batch[2].is_kept());
        let ids: Vec<&str> = batch.iter().map(|r| r.chunk.id.as_str()).collect();
        assert_eq!(ids, ["new", "theirs", "mine"], "each record keeps its id");
        for (id, stream, text) in [
            ("new", "a", "a new memory"),
            ("theirs", "b", "kept as it is"),
            ("mine", "a", "v2"),
        ] {
            let stored = store.get(id).await.unwrap().unwrap();
            assert_eq!(
                (stored.stream.as_str(), stored.content.as_str()),
                (stream, text)
            );
            assert_eq!(stored.embedding.as_deref(), Some(&[1.0, 0.0, 0.0, 0.0][..]));
        }
    }
}
