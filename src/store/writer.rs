//! The one writer of the `chunks` table. Upserts that arrive together are folded
//! into a single `merge_insert` (one Lance commit); deletes keep their place in
//! the order of operations.

use std::collections::HashMap;

use lancedb::Table;
use tokio::sync::{mpsc, oneshot};

use super::{batch_reader, Result, StoreError};
use crate::model::Chunk;

/// A change applied to a chunk as it is when the writer reaches it; returns
/// whether it changed anything.
pub type Modifier = Box<dyn FnMut(&mut Chunk) -> bool + Send>;

enum WriteOp {
    Upsert(Vec<Chunk>, oneshot::Sender<Result<()>>),
    /// Read the chunks with these ids, apply the modifier, write back the changed ones.
    Modify(Vec<String>, Modifier, oneshot::Sender<Result<usize>>),
    Delete(String, oneshot::Sender<Result<u64>>),
    /// Everything queued before this is done; stop.
    Close(oneshot::Sender<()>),
}

pub struct ChunkWriter {
    tx: mpsc::Sender<WriteOp>,
}

impl ChunkWriter {
    pub fn spawn(table: Table, dim: usize, max_rows: usize) -> ChunkWriter {
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(run(table, dim, max_rows, rx));
        ChunkWriter { tx }
    }

    pub async fn upsert(&self, chunks: Vec<Chunk>) -> Result<()> {
        if chunks.is_empty() {
            return Ok(());
        }
        let (done, rx) = oneshot::channel();
        self.tx
            .send(WriteOp::Upsert(chunks, done))
            .await
            .map_err(|_| StoreError::WriterGone)?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    pub async fn delete(&self, predicate: String) -> Result<u64> {
        let (done, rx) = oneshot::channel();
        self.tx
            .send(WriteOp::Delete(predicate, done))
            .await
            .map_err(|_| StoreError::WriterGone)?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Apply `modify` to the current version of each chunk in `ids` and write the
    /// changed ones in one commit. Runs inside the writer, so no other write can
    /// land between the read and the write. Returns how many changed.
    pub async fn modify(&self, ids: Vec<String>, modify: Modifier) -> Result<usize> {
        if ids.is_empty() {
            return Ok(0);
        }
        let (done, rx) = oneshot::channel();
        self.tx
            .send(WriteOp::Modify(ids, modify, done))
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

/// Rows written between two index refreshes (new rows are otherwise searched
/// and joined without the indexes).
const INDEX_REFRESH_ROWS: usize = 10_000;

async fn run(table: Table, dim: usize, max_rows: usize, mut rx: mpsc::Receiver<WriteOp>) {
    let mut next: Option<WriteOp> = None;
    let mut since_refresh = 0usize;
    loop {
        let op = match next.take() {
            Some(op) => op,
            None => match rx.recv().await {
                Some(op) => op,
                None => return,
            },
        };
        match op {
            WriteOp::Close(done) => {
                let _ = done.send(());
                return;
            }
            WriteOp::Delete(predicate, done) => {
                let result = table
                    .delete(predicate.as_str())
                    .await
                    .map(|r| r.num_deleted_rows)
                    .map_err(StoreError::from);
                let _ = done.send(result);
            }
            WriteOp::Modify(ids, mut modify, done) => {
                let result = async {
                    let filter = super::id_in(&ids);
                    let mut current = super::read_chunks(&table, filter, None).await?;
                    current.retain_mut(|c| modify(c));
                    if !current.is_empty() {
                        commit(&table, dim, current.iter()).await?;
                    }
                    Ok(current.len())
                }
                .await;
                since_refresh += result.as_ref().map(|n| *n).unwrap_or(0);
                let _ = done.send(result);
            }
            WriteOp::Upsert(chunks, done) => {
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
                let result = commit(&table, dim, group.iter().flat_map(|(c, _)| c)).await;
                since_refresh += rows;
                for (_, done) in group {
                    let _ = done.send(match &result {
                        Ok(()) => Ok(()),
                        Err(e) => Err(StoreError::Lance(lancedb::Error::Runtime {
                            message: e.to_string(),
                        })),
                    });
                }
                if since_refresh >= INDEX_REFRESH_ROWS {
                    since_refresh = 0;
                    let started = std::time::Instant::now();
                    match table
                        .optimize(lancedb::table::OptimizeAction::Index(Default::default()))
                        .await
                    {
                        Ok(_) => tracing::debug!(took = ?started.elapsed(), "indexes refreshed"),
                        Err(e) => tracing::warn!(error = %e, "index refresh failed; will retry"),
                    }
                }
            }
        }
    }
}

/// One `merge_insert` on `id`; when an id repeats, its last version wins.
async fn commit<'a>(
    table: &Table,
    dim: usize,
    chunks: impl Iterator<Item = &'a Chunk>,
) -> Result<()> {
    let mut latest: HashMap<&str, &Chunk> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    for c in chunks {
        if latest.insert(&c.id, c).is_none() {
            order.push(&c.id);
        }
    }
    let rows: Vec<Chunk> = order.iter().map(|id| latest[id].clone()).collect();
    let reader = batch_reader(&rows, dim)?;
    let mut merge = table.merge_insert(&["id"]);
    merge
        .when_matched_update_all(None)
        .when_not_matched_insert_all();
    merge.execute(reader).await?;
    Ok(())
}
