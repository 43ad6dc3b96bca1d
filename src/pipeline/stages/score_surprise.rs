//! `score_surprise`: novelty = 1 − the highest similarity to a stored memory of
//! the stream (or an earlier one in the batch). A novel memory gains
//! importance, a familiar one loses a little; preferences get the reference's
//! importance 2.0.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;

use super::parse_params;
use crate::pipeline::{
    ensure_neighbors, BuildContext, PipelineError, Record, Stage, StreamVectors,
};
use crate::store::Store;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScoreSurpriseConfig {
    /// Importance is scaled by (1 − weight/2 + weight · novelty): 0.8×–1.2× at 0.4.
    #[serde(default = "default_weight")]
    pub weight: f32,
    /// Importance of a memory typed `preference`.
    #[serde(default = "default_preference")]
    pub preference_importance: f32,
    /// Compare with stored memories (one batched vector search); else only within the batch.
    #[serde(default = "yes")]
    pub against_store: bool,
}

fn default_weight() -> f32 {
    0.4
}

fn default_preference() -> f32 {
    2.0
}

fn yes() -> bool {
    true
}

impl ScoreSurpriseConfig {
    pub fn build(self, store: Arc<Store>) -> Result<ScoreSurprise, PipelineError> {
        if !(0.0..=2.0).contains(&self.weight) {
            return Err(PipelineError::Config {
                stage: "score_surprise".into(),
                message: "weight must be between 0 and 2".into(),
            });
        }
        Ok(ScoreSurprise { cfg: self, store })
    }
}

pub fn build(params: toml::Table, ctx: &BuildContext) -> Result<Box<dyn Stage>, PipelineError> {
    let cfg: ScoreSurpriseConfig = parse_params("score_surprise", params)?;
    Ok(Box::new(cfg.build(ctx.store.clone())?))
}

pub struct ScoreSurprise {
    cfg: ScoreSurpriseConfig,
    store: Arc<Store>,
}

impl Stage for ScoreSurprise {
    fn name(&self) -> &'static str {
        "score_surprise"
    }

    fn process<'a>(&'a self, batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>> {
        Box::pin(async move {
            if self.cfg.against_store {
                ensure_neighbors(&self.store, batch, 3).await?;
            }
            // Most similar earlier kept memory of the same stream in this batch.
            let mut in_batch = vec![0.0f32; batch.len()];
            for g in StreamVectors::of(batch) {
                for (p, best) in g.max_earlier().into_iter().enumerate() {
                    in_batch[g.idx[p]] = best;
                }
            }
            for i in 0..batch.len() {
                if !batch[i].is_kept() {
                    continue;
                }
                let stored = batch[i]
                    .neighbors
                    .as_ref()
                    .and_then(|n| {
                        n.iter()
                            .find(|n| n.id != batch[i].chunk.id)
                            .map(|n| n.similarity)
                    })
                    .unwrap_or(0.0);
                let best = stored.max(in_batch[i]);
                let novelty = (1.0 - best).clamp(0.0, 1.0);
                let c = &mut batch[i].chunk;
                let base = c.importance;
                c.surprise = novelty;
                c.importance = if c.memory_type == "preference" {
                    self.cfg.preference_importance
                } else {
                    base * (1.0 - self.cfg.weight / 2.0 + self.cfg.weight * novelty)
                };
                c.annotate(
                    "surprise",
                    serde_json::json!({
                        "novelty": novelty,
                        "base_importance": base,
                        "importance": c.importance,
                    }),
                );
            }
            Ok(())
        })
    }
}
