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

/// For each record, its highest similarity to an earlier kept memory of the
/// same stream in the batch (0 when none is positive). `dedupe`'s scan left
/// it on each record (`earlier_best`); it still holds while the memory it
/// names is kept, and the others are rescanned alone. A group with a record
/// dedupe did not scan (a pipeline without it) is scanned whole.
fn most_similar_earlier(batch: &[Record]) -> Vec<f32> {
    let mut in_batch = vec![0.0f32; batch.len()];
    let holds = |r: &Record| {
        r.earlier_best
            .filter(|b| b.at.is_none_or(|j| batch[j].is_kept()))
            .map(|b| b.similarity)
    };
    let scanned = |r: &Record| r.is_kept() && r.chunk.embedding.is_some();
    if batch
        .iter()
        .filter(|r| scanned(r))
        .all(|r| holds(r).is_some())
    {
        for (best, r) in in_batch.iter_mut().zip(batch) {
            *best = holds(r).unwrap_or(0.0);
        }
        return in_batch;
    }
    for g in StreamVectors::of(batch) {
        if g.idx.iter().all(|&i| batch[i].earlier_best.is_some()) {
            for (p, &i) in g.idx.iter().enumerate() {
                in_batch[i] = holds(&batch[i]).unwrap_or_else(|| g.max_earlier_of(p));
            }
        } else {
            for (p, best) in g.max_earlier().into_iter().enumerate() {
                in_batch[g.idx[p]] = best;
            }
        }
    }
    in_batch
}

/// What a scored memory keeps in `extraction_meta.surprise` (as
/// `serde_json::json!` would write it: each score widened to f64, a score
/// that is not finite as null), written without a JSON tree on the way.
#[derive(serde::Serialize)]
struct Scored {
    novelty: Option<serde_json::Number>,
    base_importance: Option<serde_json::Number>,
    importance: Option<serde_json::Number>,
}

fn number(x: f32) -> Option<serde_json::Number> {
    serde_json::Number::from_f64(f64::from(x))
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
            let in_batch = most_similar_earlier(batch);
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
                let scored = Scored {
                    novelty: number(novelty),
                    base_importance: number(base),
                    importance: number(c.importance),
                };
                c.annotate_with("surprise", &scored);
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Chunk;
    use crate::pipeline::stages::dedupe::DedupeConfig;
    use crate::providers::embed::HashEmbedder;

    /// The scores are kept as the JSON tree of the first versions wrote them.
    #[test]
    fn scores_are_written_as_the_json_tree_wrote_them() {
        for (novelty, base, importance) in [(0.3f32, 1.0f32, 0.96f32), (0.0, f32::NAN, 2.0)] {
            let scored = Scored {
                novelty: number(novelty),
                base_importance: number(base),
                importance: number(importance),
            };
            let tree = serde_json::json!({
                "novelty": novelty,
                "base_importance": base,
                "importance": importance,
            });
            assert_eq!(serde_json::to_string(&scored).unwrap(), tree.to_string());
        }
    }

    /// `texts` (each with its stream's number) through dedupe and score_surprise,
    /// and through score_surprise again without what dedupe's scan left:
    /// the first run's records, how many kept records' closest earlier one
    /// was dropped, and whether both runs scored alike.
    async fn scored_both_ways(texts: &[(String, usize)]) -> (Vec<Record>, usize, bool) {
        let tmp = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(tmp.path(), 64, 100).await.unwrap());
        let e = HashEmbedder::new(64);
        let mut batch: Vec<Record> = texts
            .iter()
            .enumerate()
            .map(|(i, (text, stream))| {
                let mut c = Chunk::new(format!("r{i}"), format!("s{stream}"), text.clone(), 0);
                c.embedding = Some(e.embed_one(text));
                Record::new(c)
            })
            .collect();
        let dedupe = DedupeConfig {
            near_threshold: 0.92,
            near_against_store: false,
            near_within_batch: true,
        }
        .build(store.clone())
        .unwrap();
        dedupe.process(&mut batch).await.unwrap();
        let lost_best = batch
            .iter()
            .filter(|r| r.is_kept())
            .filter(|r| {
                r.earlier_best
                    .unwrap()
                    .at
                    .is_some_and(|j| !batch[j].is_kept())
            })
            .count();
        let mut alone = batch.clone();
        for r in &mut alone {
            r.earlier_best = None;
        }
        let surprise = ScoreSurpriseConfig {
            weight: 0.4,
            preference_importance: 2.0,
            against_store: false,
        }
        .build(store)
        .unwrap();
        surprise.process(&mut batch).await.unwrap();
        surprise.process(&mut alone).await.unwrap();
        let scores = |b: &[Record]| -> Vec<(f32, f32)> {
            b.iter()
                .map(|r| (r.chunk.surprise, r.chunk.importance))
                .collect()
        };
        let same = scores(&batch) == scores(&alone);
        (batch, lost_best, same)
    }

    /// What dedupe's scan leaves on the records gives the scores a scan of
    /// its own would, also where the memory a record was closest to was
    /// dropped as a duplicate after the scan.
    #[tokio::test]
    async fn scores_from_dedupes_scan_are_the_scores_of_a_scan_of_its_own() {
        let words = ["heron", "lake", "tea", "boat", "Lisbon", "cello"];
        // Triples "… 1", "… 1!" (a near duplicate of the first, dropped),
        // "… 2!" (kept: other numbers; closest to the dropped one).
        let triples: Vec<(String, usize)> = (0..600usize)
            .map(|i| {
                let t = i / 3;
                let text = format!(
                    "the {} nests by the {} near {} {}",
                    words[t % 6],
                    words[(t / 6) % 6],
                    words[(t / 36) % 6],
                    ["1", "1!", "2!"][i % 3]
                );
                (text, t % 2)
            })
            .collect();
        let (batch, lost_best, same) = scored_both_ways(&triples).await;
        let dropped = batch.iter().filter(|r| !r.is_kept()).count();
        assert!(
            dropped > 100 && lost_best > 10,
            "{dropped} dropped, {lost_best} lost their best"
        );
        assert!(same);
        assert!(batch.iter().any(|r| r.is_kept() && r.chunk.surprise > 0.5));
        assert!(batch.iter().any(|r| r.is_kept() && r.chunk.surprise < 0.1));
        // Nothing dropped: every record's scan result holds.
        let distinct: Vec<(String, usize)> = (0..300usize)
            .map(|i| {
                (
                    format!(
                        "the {} nests by the {} {i}",
                        words[i % 6],
                        words[(i / 6) % 6]
                    ),
                    i % 2,
                )
            })
            .collect();
        let (batch, lost_best, same) = scored_both_ways(&distinct).await;
        assert!(batch.iter().all(Record::is_kept) && lost_best == 0);
        assert!(same);
        assert!(batch.iter().any(|r| r.chunk.surprise < 0.2));
    }
}
