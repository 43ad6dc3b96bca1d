//! `embed`: one embedder call for all kept records of the batch; fills
//! `embedding` and `embed_model`.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;

use super::parse_params;
use crate::pipeline::{kept, BuildContext, PipelineError, Record, Stage};
use crate::providers::embed::Embedder;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedStageConfig {
    /// Keep records whose embedding is already set (e.g. an exact import) as they are.
    #[serde(default = "yes")]
    pub skip_embedded: bool,
}

fn yes() -> bool {
    true
}

impl EmbedStageConfig {
    pub fn build(self, embedder: Arc<dyn Embedder>) -> EmbedStage {
        EmbedStage {
            embedder,
            skip_embedded: self.skip_embedded,
        }
    }
}

pub fn build(params: toml::Table, ctx: &BuildContext) -> Result<Box<dyn Stage>, PipelineError> {
    let cfg: EmbedStageConfig = parse_params("embed", params)?;
    Ok(Box::new(cfg.build(ctx.embedder.clone())))
}

pub struct EmbedStage {
    embedder: Arc<dyn Embedder>,
    skip_embedded: bool,
}

impl EmbedStage {
    fn needs(&self, r: &Record) -> bool {
        !(self.skip_embedded
            && r.chunk.embedding.is_some()
            && r.chunk.embed_model.as_deref() == Some(self.embedder.model()))
    }
}

impl Stage for EmbedStage {
    fn runs_ahead(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "embed"
    }

    fn process<'a>(&'a self, batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>> {
        Box::pin(async move {
            let texts: Vec<String> = batch
                .iter()
                .filter(|r| r.is_kept() && self.needs(r))
                .map(|r| r.chunk.content.clone())
                .collect();
            if texts.is_empty() {
                return Ok(());
            }
            let started = std::time::Instant::now();
            let vectors = self.embedder.embed(&texts).await;
            let m = crate::core::metrics::metrics();
            let labels = [self.embedder.model(), "pipeline"];
            m.embed_batch
                .with_label_values(&labels)
                .observe(texts.len() as f64);
            crate::core::metrics::observe(
                &m.embed_seconds.with_label_values(&labels),
                started.elapsed(),
            );
            let vectors = vectors.map_err(|e| PipelineError::Batch {
                stage: "embed",
                message: e.to_string(),
            })?;
            if vectors.len() != texts.len() {
                return Err(PipelineError::Batch {
                    stage: "embed",
                    message: format!("{} vectors for {} texts", vectors.len(), texts.len()),
                });
            }
            let mut vectors = vectors.into_iter();
            for r in kept(batch) {
                if self.needs(r) {
                    r.chunk.embedding = vectors.next();
                    r.chunk.embed_model = Some(self.embedder.model().to_string());
                }
            }
            Ok(())
        })
    }
}
