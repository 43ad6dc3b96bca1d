//! `write`: commits the kept records of the batch to the `chunks` table in one
//! Lance commit (upsert by id, so a redelivered batch changes nothing).

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

pub struct Write {
    store: Arc<Store>,
}

impl Stage for Write {
    fn name(&self) -> &'static str {
        "write"
    }

    fn process<'a>(&'a self, batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>> {
        Box::pin(async move {
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
            // When a record is also another's side effect, its own final form wins.
            let rows: Vec<_> = batch
                .iter()
                .filter(|r| r.is_kept())
                .map(|r| r.chunk.clone())
                .collect();
            let history: Vec<_> = settled.flat_map(|r| r.history.iter().cloned()).collect();
            let fail = |e: crate::store::StoreError| PipelineError::Batch {
                stage: "write",
                message: e.to_string(),
            };
            self.store
                .commit_with_side_effects(rows, side)
                .await
                .map_err(fail)?;
            self.store.add_history(history).await.map_err(fail)?;
            crate::pipeline::settle(batch, "write").await
        })
    }
}
