//! The maintenance endpoints of the Loomem API, over the caller's streams (or
//! the one a request names):
//!
//! - `boost`: one memory's importance to at least 1.5;
//! - `retag-all`: the `store` pipeline's `extract_entities` stage again over
//!   every memory (entities, subject, preference type, graph);
//! - `score-all`: its `score_surprise` stage again (novelty against the
//!   stream's other memories), from each memory's pre-surprise importance;
//! - `reset-importance`: implicit boosts (access counts) cleared, importance
//!   back to what the pipeline scored, decay restarting now;
//! - `reset-backfill`: the LLM entity markers cleared;
//! - `build-graph`: the stream's entity graph dropped and rebuilt from the
//!   memories;
//! - `extract-entities`: memories without LLM entities queued for the LLM.
//!
//! Immutable memories keep their importance; every change is one commit per
//! batch through the chunk writer.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Chunk};
use crate::core::Caller;
use crate::pipeline::Record;
use crate::service::Services;
use crate::store::{Filter, HistoryRow};

/// Memories read and rewritten at a time.
const BATCH: usize = 256;

/// The importance `boost` sets.
pub const BOOST_IMPORTANCE: f32 = 1.5;

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeRequest {
    /// Only this stream (else every stream the caller sees).
    #[serde(default)]
    pub stream: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoostRequest {
    #[serde(alias = "chunk_id")]
    pub id: String,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Report {
    pub status: &'static str,
    /// Memories looked at.
    pub processed: usize,
    /// Memories (or, for `build-graph`, graph rows) changed.
    pub updated: usize,
    #[serde(skip_serializing_if = "serde_json::Map::is_empty", flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// The rows in the request's scope: its stream, else every stream the caller sees.
fn scope(caller: &Caller, req: &ScopeRequest) -> Result<Filter> {
    match &req.stream {
        Some(s) => Ok(Filter::new().stream(&caller.resolve_stream(Some(s))?)),
        None => Ok(Filter::new().visible_to(caller)),
    }
}

/// `POST /v1/boost`.
pub async fn boost(
    engine: &Services,
    caller: &Caller,
    req: BoostRequest,
) -> Result<serde_json::Value> {
    let chunk = crate::service::memory::visible(engine, caller, &req.id).await?;
    let importance = chunk.importance.max(BOOST_IMPORTANCE);
    engine
        .store
        .modify(
            vec![chunk.id.clone()],
            Box::new(move |c: &mut Chunk| {
                if c.importance >= BOOST_IMPORTANCE {
                    return false;
                }
                c.importance = BOOST_IMPORTANCE;
                c.annotate("boost", json!({ "at": now_micros() }));
                c.updated_at = now_micros();
                true
            }),
        )
        .await?;
    engine
        .store
        .add_history(vec![HistoryRow {
            id: uuid::Uuid::new_v4().to_string(),
            stream: chunk.stream.clone(),
            chunk_id: chunk.id.clone(),
            event: "boosted".into(),
            reason: format!(
                "importance {:.2} → {importance:.2} (POST /v1/boost)",
                chunk.importance
            ),
            related_ids: Vec::new(),
            created_at: now_micros(),
        }])
        .await?;
    Ok(json!({ "status": "boosted", "id": chunk.id, "importance": importance }))
}

/// Rerun one stage of the `store` pipeline over every memory in scope and
/// keep what `apply` takes from the result.
async fn rerun_stage(
    engine: &Services,
    filter: Filter,
    stage: &str,
    prepare: fn(&mut Chunk),
    apply: fn(&Chunk, &mut Chunk) -> bool,
) -> Result<Report> {
    let pipeline = engine
        .pipelines
        .get("store")
        .ok_or_else(|| Error::Conflict("no `store` pipeline is loaded".into()))?;
    if !pipeline.stage_names().contains(&stage) {
        return Err(Error::Conflict(format!(
            "the `store` pipeline has no `{stage}` stage to rerun"
        )));
    }
    let ids = engine.store.ids(&filter).await?;
    let mut report = Report {
        status: "ok",
        processed: 0,
        updated: 0,
        extra: Default::default(),
    };
    for part in ids.chunks(BATCH) {
        let chunks = engine.store.find(&Filter::new().ids(part), None).await?;
        let mut batch: Vec<Record> = chunks
            .into_iter()
            .map(|mut c| {
                prepare(&mut c);
                Record::new(c)
            })
            .collect();
        pipeline
            .rerun(stage, &mut batch)
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        report.processed += batch.len();
        let fresh: HashMap<String, Chunk> = batch
            .into_iter()
            .filter(|r| r.is_kept())
            .map(|r| (r.chunk.id.clone(), r.chunk))
            .collect();
        report.updated += engine
            .store
            .modify(
                fresh.keys().cloned().collect(),
                Box::new(move |c: &mut Chunk| match fresh.get(&c.id) {
                    // Skip a memory whose text changed since it was read.
                    Some(f) if f.content_hash == c.content_hash => {
                        let changed = apply(f, c);
                        if changed {
                            c.updated_at = now_micros();
                        }
                        changed
                    }
                    _ => false,
                }),
            )
            .await?;
    }
    Ok(report)
}

/// `POST /v1/retag-all`.
pub async fn retag_all(engine: &Services, caller: &Caller, req: ScopeRequest) -> Result<Report> {
    let filter = scope(caller, &req)?;
    rerun_stage(
        engine,
        filter,
        "extract_entities",
        |_| {},
        |fresh, c| {
            let changed = (&fresh.entities, &fresh.subject, &fresh.memory_type)
                != (&c.entities, &c.subject, &c.memory_type);
            c.entities = fresh.entities.clone();
            c.subject = fresh.subject.clone();
            c.memory_type = fresh.memory_type.clone();
            changed
        },
    )
    .await
}

/// The importance a memory had before `score_surprise` scaled it.
fn pre_surprise(c: &Chunk) -> Option<f32> {
    c.annotation("surprise")
        .and_then(|s| s["base_importance"].as_f64())
        .map(|v| v as f32)
}

/// `POST /v1/score-all`.
pub async fn score_all(engine: &Services, caller: &Caller, req: ScopeRequest) -> Result<Report> {
    let filter = engine.store.with_vectors(scope(caller, &req)?.mutable());
    rerun_stage(
        engine,
        filter,
        "score_surprise",
        |c| {
            if let Some(base) = pre_surprise(c) {
                c.importance = base;
            }
        },
        |fresh, c| {
            let changed = (fresh.importance - c.importance).abs() > 1e-6
                || (fresh.surprise - c.surprise).abs() > 1e-6;
            c.importance = fresh.importance;
            c.surprise = fresh.surprise;
            if let Some(s) = fresh.annotation("surprise") {
                c.annotate("surprise", s);
            }
            changed
        },
    )
    .await
}

/// Rewrite every memory in scope with `f` (true = changed), a batch a commit.
async fn rewrite(engine: &Services, filter: Filter, f: fn(&mut Chunk) -> bool) -> Result<Report> {
    let ids = engine.store.ids(&filter).await?;
    let mut updated = 0;
    for part in ids.chunks(BATCH) {
        updated += engine.store.modify(part.to_vec(), Box::new(f)).await?;
    }
    Ok(Report {
        status: "ok",
        processed: ids.len(),
        updated,
        extra: Default::default(),
    })
}

/// `POST /v1/reset-importance`.
pub async fn reset_importance(
    engine: &Services,
    caller: &Caller,
    req: ScopeRequest,
) -> Result<Report> {
    let filter = scope(caller, &req)?.mutable();
    rewrite(engine, filter, |c| {
        let scored = c
            .annotation("surprise")
            .and_then(|s| s["importance"].as_f64().or(s["base_importance"].as_f64()))
            .map(|v| v as f32)
            .unwrap_or(1.0);
        let changed = c.access_count != 0
            || c.last_accessed_at.is_some()
            || (c.importance - scored).abs() > 1e-6;
        c.access_count = 0;
        c.last_accessed_at = None;
        c.importance = scored;
        c.remove_annotation("boost");
        // Decay starts over from now rather than from the memory's creation.
        c.annotate("decay", json!({ "at": now_micros() }));
        changed
    })
    .await
}

/// `POST /v1/reset-backfill`.
pub async fn reset_backfill(
    engine: &Services,
    caller: &Caller,
    req: ScopeRequest,
) -> Result<Report> {
    let filter = scope(caller, &req)?.annotated("llm_ner");
    rewrite(engine, filter, |c| c.remove_annotation("llm_ner")).await
}

/// `POST /v1/build-graph`.
pub async fn build_graph(engine: &Services, caller: &Caller, req: ScopeRequest) -> Result<Report> {
    let filter = scope(caller, &req)?;
    let graph = &engine.store.graph;
    // The pipeline is held only while the rows are dropped: a batch records
    // its graph rows before it commits its memories, so one in flight across
    // the drop would lose its rows (recorded before, committed after the
    // memories below are read). Once dropped, every memory committed is
    // either read below or records its own rows; a recording is idempotent
    // per memory, so both at once count it once.
    let dropped = {
        let _gate = engine.store.write_gate.write().await;
        graph.delete(&filter).await?
    };
    let mut report = rerun_stage(engine, filter, "extract_entities", |_| {}, |_, _| false).await?;
    let (entities, edges, _) = graph.stats(&scope(caller, &req)?).await?;
    report.updated = entities + edges;
    report.extra.insert("entities".into(), json!(entities));
    report.extra.insert("edges".into(), json!(edges));
    report.extra.insert("rows_dropped".into(), json!(dropped));
    Ok(report)
}

/// `POST /v1/extract-entities`: queue memories without LLM entities (async).
pub async fn extract_entities(
    engine: &Services,
    caller: &Caller,
    req: ScopeRequest,
) -> Result<serde_json::Value> {
    let ner = engine.ner.as_ref().ok_or_else(|| {
        Error::Conflict(
            "LLM entity extraction needs [llm] with ner = true; rule-based entities are refreshed by POST /v1/retag-all".into(),
        )
    })?;
    let filter = scope(caller, &req)?.not_annotated("llm_ner");
    let ids = engine.store.ids(&filter).await?;
    let before = ner.stats().dropped_full;
    for part in ids.chunks(BATCH) {
        let chunks = engine.store.find(&Filter::new().ids(part), None).await?;
        ner.push(&chunks.iter().collect::<Vec<_>>());
    }
    let dropped = ner.stats().dropped_full - before;
    Ok(json!({
        "status": "queued",
        "queued": ids.len() as u64 - dropped,
        "dropped_queue_full": dropped,
    }))
}
