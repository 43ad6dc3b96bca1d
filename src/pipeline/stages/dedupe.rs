//! `dedupe`: drops a memory that repeats one already stored in its stream or
//! earlier in the batch: exactly (same normalised text, `content_hash`) or
//! nearly (cosine similarity above `near_threshold`). A dropped memory names
//! the one it duplicates, so an exact re-store answers with the existing id,
//! and that memory records the duplicate's provenance in
//! `extraction_meta.merged_sources`, so no source is lost to dedupe.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;

use super::parse_params;
use crate::core::model::Chunk;
use crate::pipeline::{
    ensure_neighbors, BuildContext, Disposition, EarlierBest, PipelineError, Record, Scanned,
    ScannedRow, Stage, StreamVectors,
};
use crate::store::Store;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupeConfig {
    /// Cosine similarity above which two memories are the same.
    #[serde(default = "default_threshold")]
    pub near_threshold: f32,
    /// Compare with the stream's stored memories by vector (one batched search).
    #[serde(default = "yes")]
    pub near_against_store: bool,
    /// Compare the memories of a batch with each other by vector.
    #[serde(default = "yes")]
    pub near_within_batch: bool,
}

fn default_threshold() -> f32 {
    0.92
}

fn yes() -> bool {
    true
}

impl DedupeConfig {
    pub fn build(self, store: Arc<Store>) -> Result<Dedupe, PipelineError> {
        if !(0.0..=1.0).contains(&self.near_threshold) {
            return Err(PipelineError::Config {
                stage: "dedupe".into(),
                message: "near_threshold must be between 0 and 1".into(),
            });
        }
        Ok(Dedupe { cfg: self, store })
    }
}

pub fn build(params: toml::Table, ctx: &BuildContext) -> Result<Box<dyn Stage>, PipelineError> {
    let cfg: DedupeConfig = parse_params("dedupe", params)?;
    Ok(Box::new(cfg.build(ctx.store.clone())?))
}

pub struct Dedupe {
    cfg: DedupeConfig,
    store: Arc<Store>,
}

fn drop_as(r: &mut Record, reason: &'static str, existing: &str) {
    r.disposition = Disposition::Drop {
        reason,
        existing_id: Some(existing.to_string()),
    };
}

/// What the kept memory remembers of a duplicate it absorbed: where it came
/// from, and its text when that differs from the kept one's (a near
/// duplicate), so no wording the caller gave is lost.
fn source_of(kept: &Chunk, c: &Chunk) -> serde_json::Value {
    let mut source = serde_json::json!({
        "id": c.id,
        "session_id": c.session_id,
        "source": c.source,
        "created_at": c.created_at,
        "metadata": c.metadata.as_deref().and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok()),
    });
    if c.content != kept.content {
        source["content"] = serde_json::Value::String(c.content.clone());
    }
    source
}

fn remember(kept: &mut Chunk, duplicate: &Chunk) {
    let mut sources = kept
        .extraction_meta
        .as_deref()
        .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
        .and_then(|m| m.get("merged_sources").cloned())
        .and_then(|s| s.as_array().cloned())
        .unwrap_or_default();
    if sources.len() < 100 {
        sources.push(source_of(kept, duplicate));
    }
    kept.annotate("merged_sources", serde_json::Value::Array(sources));
}

/// The numbers in a text, in order. Texts that differ only in a number ("at 3
/// pm" / "at 4 pm", "lake 1" / "lake 11") embed almost alike but are different
/// facts, so a near duplicate must also have the same numbers.
fn numbers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
}

fn same_numbers(a: &str, b: &str) -> bool {
    numbers(a).eq(numbers(b))
}

/// A key of a text's numbers: texts with the same numbers have the same
/// key, so a batch of texts that differ only in a number ("note 17", "note
/// 18") tells them apart by key, before any similarity is computed or texts
/// are compared.
fn numbers_key(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    for n in numbers(text) {
        n.hash(&mut h);
    }
    h.finish()
}

impl Dedupe {
    async fn exact_in_store(
        &self,
        batch: &[Record],
    ) -> Result<HashMap<(String, String), Chunk>, PipelineError> {
        let mut by_stream: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for r in batch.iter().filter(|r| r.is_kept()) {
            by_stream
                .entry(&r.chunk.stream)
                .or_default()
                .push(&r.chunk.content_hash);
        }
        let mut found = HashMap::new();
        for (stream, hashes) in by_stream {
            let rows = self
                .store
                .current_with_hashes(stream, &hashes)
                .await
                .map_err(|e| PipelineError::Batch {
                    stage: "dedupe",
                    message: e.to_string(),
                })?;
            for c in rows {
                found
                    .entry((c.stream.clone(), c.content_hash.clone()))
                    .or_insert(c);
            }
        }
        Ok(found)
    }
}

/// The within-batch scan of each stream's group at `threshold`.
fn scan(groups: Vec<StreamVectors>, threshold: f32) -> Vec<(Arc<StreamVectors>, Vec<ScannedRow>)> {
    groups
        .into_iter()
        .map(|g| {
            let rows = g.scan_earlier(threshold);
            (Arc::new(g), rows)
        })
        .collect()
}

/// Leave on each scanned record its row of the scan ([`Scanned`]) and its
/// highest similarity to an earlier record, for `score_surprise`, which
/// would scan the batch again.
fn mark_scanned(
    batch: &mut [Record],
    scanned: Vec<(Arc<StreamVectors>, Vec<ScannedRow>)>,
    threshold: f32,
) {
    for (group, rows) in scanned {
        for (p, (maybe, (similarity, at))) in rows.into_iter().enumerate() {
            let r = &mut batch[group.idx[p]];
            r.earlier_best = Some(EarlierBest {
                similarity,
                at: at.map(|q| group.idx[q]),
            });
            r.scanned = Some(Scanned {
                group: group.clone(),
                position: p,
                maybe,
                threshold,
            });
        }
    }
}

impl Stage for Dedupe {
    fn name(&self) -> &'static str {
        "dedupe"
    }

    /// The within-batch scan, which reads the batch alone: each record's
    /// highest similarity to an earlier one (for `score_surprise`) and the
    /// earlier ones that may be its near duplicates, among the records kept
    /// now. Those the store's duplicates drop later stay in the scan, and
    /// its readers skip them: the earlier kept ones are a subset of those
    /// scanned, in the same order.
    fn prepare<'a>(&'a self, batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>> {
        Box::pin(async move {
            if !self.cfg.near_within_batch {
                return Ok(());
            }
            let groups = StreamVectors::of(batch);
            let near = self.cfg.near_threshold;
            // The scan spreads over the CPUs on threads of its own.
            let scanned = tokio::task::spawn_blocking(move || scan(groups, near))
                .await
                .map_err(|e| PipelineError::Batch {
                    stage: "dedupe",
                    message: format!("the within-batch scan failed: {e}"),
                })?;
            mark_scanned(batch, scanned, near);
            Ok(())
        })
    }

    fn process<'a>(&'a self, batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>> {
        Box::pin(async move {
            let mut stored = self.exact_in_store(batch).await?;
            // Exact: against the store, then within the batch.
            let mut first_of: HashMap<(String, String), usize> = HashMap::new();
            for i in 0..batch.len() {
                if !batch[i].is_kept() {
                    continue;
                }
                let key = (
                    batch[i].chunk.stream.clone(),
                    batch[i].chunk.content_hash.clone(),
                );
                if let Some(existing) = stored.get_mut(&key) {
                    // The same id again is a re-store (an update or a replay), not a duplicate.
                    if existing.id != batch[i].chunk.id {
                        let id = existing.id.clone();
                        remember(existing, &batch[i].chunk);
                        let mut updated = existing.clone();
                        updated.updated_at = crate::core::model::now_micros();
                        batch[i].also_write.push(updated);
                        drop_as(&mut batch[i], "duplicate", &id);
                        continue;
                    }
                }
                match first_of.get(&key) {
                    Some(&j) if batch[j].chunk.id != batch[i].chunk.id => {
                        let (dup, id) = (batch[i].chunk.clone(), batch[j].chunk.id.clone());
                        remember(&mut batch[j].chunk, &dup);
                        drop_as(&mut batch[i], "duplicate", &id);
                    }
                    _ => {
                        first_of.insert(key, i);
                    }
                }
            }
            // Near: against the store.
            if self.cfg.near_against_store {
                ensure_neighbors(&self.store, batch, 3).await?;
                for r in batch.iter_mut().filter(|r| r.is_kept()) {
                    let close: Vec<String> = r
                        .neighbors
                        .iter()
                        .flatten()
                        .filter(|n| n.id != r.chunk.id && n.similarity > self.cfg.near_threshold)
                        .map(|n| n.id.clone())
                        .collect();
                    for id in close {
                        let existing =
                            self.store
                                .get(&id)
                                .await
                                .map_err(|e| PipelineError::Batch {
                                    stage: "dedupe",
                                    message: e.to_string(),
                                })?;
                        let Some(mut existing) = existing else {
                            continue;
                        };
                        if !same_numbers(&existing.content, &r.chunk.content) {
                            continue;
                        }
                        remember(&mut existing, &r.chunk);
                        existing.updated_at = crate::core::model::now_micros();
                        r.also_write.push(existing);
                        drop_as(r, "near_duplicate", &id);
                        break;
                    }
                }
            }
            // Near: within the batch (the earlier memory is kept), from the
            // scan done ahead, or now when there was none.
            if self.cfg.near_within_batch {
                let near = self.cfg.near_threshold;
                let prepared = batch
                    .iter()
                    .filter(|r| r.is_kept() && r.chunk.embedding.is_some())
                    .all(|r| r.scanned.as_ref().is_some_and(|s| s.threshold == near));
                if !prepared {
                    for r in batch.iter_mut() {
                        r.scanned = None;
                    }
                    let groups = StreamVectors::of(batch);
                    mark_scanned(batch, scan(groups, near), near);
                }
                let keys: Vec<u64> = batch
                    .iter()
                    .map(|r| match &r.scanned {
                        Some(_) => numbers_key(&r.chunk.content),
                        None => 0,
                    })
                    .collect();
                // In batch order: each group's rows in order.
                for i in 0..batch.len() {
                    let Some(s) = batch[i].scanned.take() else {
                        continue;
                    };
                    if !batch[i].is_kept() {
                        continue;
                    }
                    let g = &s.group;
                    let earlier =
                        g.first_earlier_above(s.position, near, s.maybe.as_deref(), |q| {
                            let j = g.idx[q];
                            keys[j] == keys[i]
                                && batch[j].is_kept()
                                && batch[j].chunk.id != batch[i].chunk.id
                                && same_numbers(&batch[j].chunk.content, &batch[i].chunk.content)
                        });
                    if let Some(j) = earlier.map(|q| g.idx[q]) {
                        let (dup, id) = (batch[i].chunk.clone(), batch[j].chunk.id.clone());
                        remember(&mut batch[j].chunk, &dup);
                        drop_as(&mut batch[i], "near_duplicate", &id);
                    }
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::embed::{Embedder, HashEmbedder};

    async fn run(texts: &[&str], store_first: &[&str]) -> (Vec<Record>, tempfile::TempDir) {
        run_with(texts, store_first, false).await
    }

    /// `ahead`: the within-batch scan is done first, as the worker does it.
    async fn run_with(
        texts: &[&str],
        store_first: &[&str],
        ahead: bool,
    ) -> (Vec<Record>, tempfile::TempDir) {
        let tmp = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(tmp.path(), 64, 100).await.unwrap());
        let e = HashEmbedder::new(64);
        let chunk = |i: usize, t: &str| {
            let mut c = Chunk::new(format!("{t}-{i}"), "s".into(), t.to_string(), i as i64);
            c.embedding = Some(e.embed_one(t));
            c.embed_model = Some(e.model().into());
            c
        };
        store
            .upsert(
                store_first
                    .iter()
                    .enumerate()
                    .map(|(i, t)| chunk(100 + i, t))
                    .collect(),
            )
            .await
            .unwrap();
        let stage = DedupeConfig {
            near_threshold: 0.92,
            near_against_store: true,
            near_within_batch: true,
        }
        .build(store)
        .unwrap();
        let mut batch: Vec<Record> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| Record::new(chunk(i, t)))
            .collect();
        if ahead {
            stage.prepare(&mut batch).await.unwrap();
            assert!(batch.iter().all(|r| r.scanned.is_some()));
        }
        stage.process(&mut batch).await.unwrap();
        (batch, tmp)
    }

    fn reasons(batch: &[Record]) -> Vec<Option<&'static str>> {
        batch
            .iter()
            .map(|r| match r.disposition {
                Disposition::Drop { reason, .. } => Some(reason),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn exact_duplicates_of_the_store_and_the_batch_are_dropped() {
        let (batch, _t) = run(
            &["Likes tea", "likes   TEA", "Owns a boat"],
            &["Owns a boat"],
        )
        .await;
        assert_eq!(
            reasons(&batch),
            vec![None, Some("duplicate"), Some("duplicate")]
        );
        assert!(
            matches!(&batch[2].disposition, Disposition::Drop { existing_id: Some(id), .. } if id == "Owns a boat-100")
        );
        // The stored memory remembers the duplicate's provenance.
        let updated = &batch[2].also_write[0];
        assert!(updated
            .extraction_meta
            .as_deref()
            .unwrap()
            .contains("merged_sources"));
        let meta: serde_json::Value =
            serde_json::from_str(batch[0].chunk.extraction_meta.as_deref().unwrap()).unwrap();
        assert_eq!(meta["merged_sources"][0]["id"], "likes   TEA-1");
    }

    /// The within-batch scan done ahead drops what the scan in place drops,
    /// though the records the store's duplicates drop were still in it.
    #[tokio::test]
    async fn a_scan_done_ahead_drops_what_the_scan_in_place_drops() {
        let texts = [
            "Owns a boat",
            "owns a boat!",
            "the heron nests by the lake 1",
            "the heron nests by the lake 11",
            "The heron nests by the lake 1!",
            "Likes green tea",
            "likes green tea.",
            "Likes green tea!!",
        ];
        let store_first = ["Owns a boat", "Likes green tea"];
        let (in_place, _a) = run_with(&texts, &store_first, false).await;
        let (ahead, _b) = run_with(&texts, &store_first, true).await;
        assert_eq!(reasons(&ahead), reasons(&in_place));
        assert!(reasons(&in_place).contains(&Some("near_duplicate")));
        assert!(reasons(&in_place).contains(&Some("duplicate")));
        let kept = |batch: &[Record]| batch.iter().filter(|r| r.is_kept()).count();
        assert!(kept(&in_place) >= 2, "{:?}", reasons(&in_place));
        assert!(ahead.iter().all(|r| r.scanned.is_none()));
    }

    #[tokio::test]
    async fn near_duplicates_need_the_same_numbers() {
        let (batch, _t) = run(
            &[
                "the heron nests by the lake 1",
                "the heron nests by the lake 11",
                "The heron nests by the lake 1!",
            ],
            &[],
        )
        .await;
        assert_eq!(reasons(&batch), vec![None, None, Some("near_duplicate")]);
    }

    #[tokio::test]
    async fn restoring_the_same_id_is_not_a_duplicate() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(tmp.path(), 8, 100).await.unwrap());
        store
            .upsert(vec![Chunk::new(
                "x".into(),
                "s".into(),
                "same text".into(),
                1,
            )])
            .await
            .unwrap();
        let stage = DedupeConfig {
            near_threshold: 0.92,
            near_against_store: false,
            near_within_batch: false,
        }
        .build(store)
        .unwrap();
        let mut batch = vec![Record::new(Chunk::new(
            "x".into(),
            "s".into(),
            "same text".into(),
            2,
        ))];
        stage.process(&mut batch).await.unwrap();
        assert!(batch[0].is_kept());
    }
}
