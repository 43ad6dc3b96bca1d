//! `auto_relate`: link each new memory to its closest stored memories of the
//! same stream (cosine similarity at least `min_similarity`, at most
//! `max_links`) with a `relates_to` relation (or the configured name). The
//! links are written after the batch commits, so they never point at a
//! memory that was not stored.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;

use super::parse_params;
use crate::pipeline::{ensure_neighbors, BuildContext, PipelineError, Record, Stage};
use crate::store::relations::RelationRow;
use crate::store::Store;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoRelateConfig {
    /// Link to stored memories at least this similar (cosine, 0–1).
    #[serde(default = "default_min")]
    pub min_similarity: f32,
    /// Most links a new memory gets.
    #[serde(default = "default_max")]
    pub max_links: usize,
    /// The relation's name.
    #[serde(default = "default_relation")]
    pub relation: String,
}

fn default_min() -> f32 {
    0.8
}

fn default_max() -> usize {
    3
}

fn default_relation() -> String {
    "relates_to".into()
}

pub fn build(params: toml::Table, ctx: &BuildContext) -> Result<Box<dyn Stage>, PipelineError> {
    let cfg: AutoRelateConfig = parse_params("auto_relate", params)?;
    let bad = |message: &str| PipelineError::Config {
        stage: "auto_relate".into(),
        message: message.into(),
    };
    if !(0.0..=1.0).contains(&cfg.min_similarity) {
        return Err(bad("min_similarity must be between 0 and 1"));
    }
    if !(1..=20).contains(&cfg.max_links) {
        return Err(bad("max_links must be between 1 and 20"));
    }
    if !crate::store::relations::is_relation_name(&cfg.relation) {
        return Err(bad(
            "relation must be 1-64 of lower-case letters, digits, _ - :",
        ));
    }
    Ok(Box::new(AutoRelate {
        cfg,
        store: ctx.store.clone(),
    }))
}

pub struct AutoRelate {
    cfg: AutoRelateConfig,
    store: Arc<Store>,
}

impl Stage for AutoRelate {
    fn name(&self) -> &'static str {
        "auto_relate"
    }

    fn process<'a>(&'a self, batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>> {
        Box::pin(async move {
            ensure_neighbors(&self.store, batch, self.cfg.max_links).await?;
            let now = crate::core::model::now_micros();
            for r in batch.iter_mut().filter(|r| r.is_kept()) {
                let superseded: Vec<&str> = r.also_write.iter().map(|c| c.id.as_str()).collect();
                let links: Vec<RelationRow> = r
                    .neighbors
                    .iter()
                    .flatten()
                    .filter(|n| n.id != r.chunk.id && !superseded.contains(&n.id.as_str()))
                    .filter(|n| n.similarity >= self.cfg.min_similarity)
                    .take(self.cfg.max_links)
                    .map(|n| RelationRow {
                        id: uuid::Uuid::new_v4().to_string(),
                        stream: r.chunk.stream.clone(),
                        from_id: r.chunk.id.clone(),
                        to_id: n.id.clone(),
                        relation: self.cfg.relation.clone(),
                        weight: n.similarity,
                        note: Some(format!("auto_relate: cosine {:.3}", n.similarity)),
                        created_by: "auto_relate".into(),
                        created_at: now,
                    })
                    .collect();
                for l in &links {
                    r.history.push(crate::store::HistoryRow {
                        id: uuid::Uuid::new_v4().to_string(),
                        stream: l.stream.clone(),
                        chunk_id: l.from_id.clone(),
                        event: "related".into(),
                        reason: format!(
                            "{} → {} (auto_relate: cosine {:.3})",
                            l.relation, l.to_id, l.weight
                        ),
                        related_ids: vec![l.to_id.clone()],
                        created_at: now,
                    });
                }
                r.relations.extend(links);
            }
            Ok(())
        })
    }
}
