//! `write`: commits the kept records of the batch to the `chunks` table in one
//! Lance commit (upsert by id, so a redelivered batch changes nothing).

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;

use super::parse_params;
use crate::pipeline::{BuildContext, PipelineError, Record, Stage};
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
            let rows: Vec<_> = batch
                .iter()
                .filter(|r| r.is_kept())
                .map(|r| r.chunk.clone())
                .collect();
            self.store
                .upsert(rows)
                .await
                .map_err(|e| PipelineError::Batch {
                    stage: "write",
                    message: e.to_string(),
                })
        })
    }
}
