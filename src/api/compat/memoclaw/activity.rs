//! MemoClaw's ingest, extraction and consolidation, and its review
//! routes: suggestions, core memories, namespaces, tags, stats.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::*;

// ---------------------------------------------------------------- ingest

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Ingest {
    messages: Option<Vec<service::conversation::MessageIn>>,
    text: Option<String>,
    namespace: Option<String>,
    session_id: Option<String>,
    agent_id: Option<String>,
    #[serde(default)]
    auto_relate: bool,
}

/// loomem's conversation ingest (the LLM extractor when configured, else the
/// rules), answered in MemoClaw's counts.
async fn extract_facts(
    engine: &Engine,
    caller: &Caller,
    req: Ingest,
) -> Result<(Value, Vec<String>)> {
    if req.messages.is_none() && req.text.is_none() {
        return Err(Error::invalid("messages", "give messages or text"));
    }
    let tokens_used = req.text.as_deref().map(tokens::count).unwrap_or(0)
        + req
            .messages
            .iter()
            .flatten()
            .map(|m| tokens::count(&m.content))
            .sum::<usize>();
    let done = service::conversation::ingest(
        engine,
        caller,
        service::conversation::IngestRequest {
            content: req.text,
            messages: req.messages,
            stream: Some(stream_of(caller, req.namespace.as_deref())?),
            session_id: req.session_id,
            agent_id: req.agent_id,
            source: Some("memoclaw".into()),
            ..Default::default()
        },
    )
    .await?;
    let answer = json!({
        "memory_ids": done.stored_ids,
        "facts_extracted": done.facts.len(),
        "facts_stored": done.stored_ids.len(),
        "facts_deduplicated": done.facts.iter().filter(|f| f.status == "duplicate").count(),
        "tokens_used": tokens_used,
    });
    Ok((answer, done.stored_ids))
}

/// `POST /v1/ingest`; with `auto_relate`, each stored fact is linked
/// `related_to` the next one from the same conversation.
pub(super) async fn ingest(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Ingest>,
) -> Result<Json<Value>> {
    let relate = req.auto_relate;
    let (mut answer, ids) = extract_facts(&engine, &caller, req).await?;
    let mut created = 0;
    if relate {
        for pair in ids.windows(2) {
            service::relations::create(
                &engine,
                &caller,
                service::relations::RelateRequest {
                    from_id: pair[0].clone(),
                    to_id: pair[1].clone(),
                    relation: "related_to".into(),
                    weight: None,
                    note: Some("extracted from the same conversation".into()),
                },
            )
            .await?;
            created += 1;
        }
    }
    answer["relations_created"] = json!(created);
    Ok(Json(answer))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Extract {
    messages: Vec<service::conversation::MessageIn>,
    namespace: Option<String>,
    session_id: Option<String>,
    agent_id: Option<String>,
}

/// `POST /v1/memories/extract`.
pub(super) async fn extract(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Extract>,
) -> Result<Json<Value>> {
    let (answer, _) = extract_facts(
        &engine,
        &caller,
        Ingest {
            messages: Some(req.messages),
            text: None,
            namespace: req.namespace,
            session_id: req.session_id,
            agent_id: req.agent_id,
            auto_relate: false,
        },
    )
    .await?;
    Ok(Json(answer))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Consolidate {
    namespace: Option<String>,
    min_similarity: Option<f32>,
    mode: Option<String>,
    #[serde(default)]
    dry_run: bool,
}

/// `POST /v1/memories/consolidate`: loomem's dream over the namespace (near
/// copies merged into a consolidated memory; the sources stay, superseded).
/// `rule` merges extractively; `llm` lets the configured LLM write the merge.
pub(super) async fn consolidate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Consolidate>,
) -> Result<Json<Value>> {
    let min_similarity = req.min_similarity.unwrap_or(0.85);
    if !(0.0..=1.0).contains(&min_similarity) {
        return Err(Error::invalid("min_similarity", "must be between 0 and 1"));
    }
    let max_cost_usd = match req.mode.as_deref().unwrap_or("rule") {
        "rule" => Some(0.0),
        "llm" if engine.llm.is_none() => {
            return Err(Error::Conflict(
                "mode `llm` needs an LLM configured ([llm]); use mode `rule`".into(),
            ))
        }
        "llm" => None,
        other => {
            return Err(Error::invalid(
                "mode",
                format!("`{other}`: must be rule or llm"),
            ))
        }
    };
    let report = service::dream::dream(
        &engine,
        &caller,
        service::dream::DreamRequest {
            stream: Some(stream_of(&caller, req.namespace.as_deref())?),
            dry_run: req.dry_run,
            similarity: Some(min_similarity),
            max_cost_usd,
            ..Default::default()
        },
    )
    .await?;
    let clusters: Vec<Value> = report
        .groups
        .iter()
        .map(|g| {
            json!({
                "memory_ids": g.sources,
                "merged_into": (!report.dry_run).then_some(&g.l1_id),
                "content": g.content,
            })
        })
        .collect();
    Ok(Json(json!({
        "clusters_found": report.groups_found,
        "memories_merged": report.facts_merged,
        "memories_created": if report.dry_run { 0 } else { report.groups.len() },
        "dry_run": report.dry_run,
        "clusters": clusters,
    })))
}

// ---------------------------------------------------------------- review

/// Which review category a memory falls in, if any (the first that fits):
/// `stale` — important (≥ 0.7) and untouched for 30 days; `decaying` — not
/// pinned and unused for longer than its type's half-life; `hot` — used at
/// least 3 times, the last within a week; `fresh` — under a week old and
/// never used.
fn category(m: &Value, half_life_days: f64, now: i64) -> Option<&'static str> {
    let at = |k: &str| m[k].as_str().and_then(crate::core::time::parse_instant_str);
    let created = at("created_at").unwrap_or(now);
    let touched = at("last_accessed_at").unwrap_or(created);
    let idle_days = (now - touched) as f64 / DAY_MICROS as f64;
    let uses = m["access_count"].as_i64().unwrap_or(0);
    let importance = m["importance"].as_f64().unwrap_or(0.0);
    if importance >= 0.7 && idle_days >= 30.0 {
        Some("stale")
    } else if m["pinned"] != json!(true) && idle_days >= half_life_days {
        Some("decaying")
    } else if uses >= 3 && idle_days <= 7.0 {
        Some("hot")
    } else if uses == 0 && (now - created) as f64 <= 7.0 * DAY_MICROS as f64 {
        Some("fresh")
    } else {
        None
    }
}

/// `GET /v1/suggested`: memories to review, the most important first, with
/// how many fall in each category.
pub(super) async fn suggested(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let limit = super::super::limit_of("limit", q.limit, 10, 100)?;
    if let Some(c) = q.category.as_deref() {
        if !["stale", "fresh", "hot", "decaying"].contains(&c) {
            return Err(Error::invalid(
                "category",
                format!("`{c}`: must be stale, fresh, hot or decaying"),
            ));
        }
    }
    let now = now_micros();
    let views = super::super::all(&engine, &caller, &q.query(&caller)?).await?;
    let mut counts: BTreeMap<&str, usize> =
        ["stale", "fresh", "hot", "decaying"].map(|c| (c, 0)).into();
    let mut chosen = Vec::new();
    for v in &views {
        let mut m = memory(&caller, v);
        let half_life = engine
            .cfg
            .search
            .half_life(m["memory_type"].as_str().unwrap_or_default());
        let Some(c) = category(&m, half_life, now) else {
            continue;
        };
        *counts.entry(c).or_default() += 1;
        if q.category.as_deref().is_none_or(|want| want == c) {
            m["category"] = json!(c);
            chosen.push(m);
        }
    }
    chosen.sort_by(|a, b| {
        b["importance"]
            .as_f64()
            .unwrap_or(0.0)
            .total_cmp(&a["importance"].as_f64().unwrap_or(0.0))
    });
    let total = chosen.len();
    chosen.truncate(limit);
    Ok(Json(json!({
        "suggested": chosen,
        "categories": counts,
        "total": total,
    })))
}

/// `GET /v1/core-memories`: pinned memories and the most important, then
/// the most used, each once.
pub(super) async fn core_memories(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let limit = super::super::limit_of("limit", q.limit, 10, 100)?;
    let base = ListParams {
        sort_by: Some("importance".into()),
        ..q
    }
    .query(&caller)?;
    let mut seen = HashSet::new();
    let mut views = Vec::new();
    for pinned in [Some(true), None] {
        let query = ListQuery {
            pinned: pinned.or(base.pinned),
            ..base.clone()
        };
        for v in super::super::offset_page(&engine, &caller, &query, 0, limit)
            .await?
            .0
        {
            if seen.insert(v["id"].to_string()) {
                views.push(memory(&caller, &v));
            }
        }
    }
    let key = |m: &Value| {
        (
            m["pinned"] == json!(true),
            m["importance"].as_f64().unwrap_or(0.0),
            m["access_count"].as_i64().unwrap_or(0),
        )
    };
    views.sort_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        kb.0.cmp(&ka.0)
            .then(kb.1.total_cmp(&ka.1))
            .then(kb.2.cmp(&ka.2))
    });
    views.truncate(limit);
    Ok(Json(json!({"total": views.len(), "memories": views})))
}

/// `GET /v1/namespaces`: each namespace with its memories and the last one's
/// time.
pub(super) async fn namespaces(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
) -> Result<Json<Value>> {
    let held = service::listing::streams(&engine, &caller).await?;
    let list: Vec<Value> = held
        .streams
        .iter()
        .map(|s| {
            json!({
                "name": namespace_of(&caller, &s.stream),
                "count": s.memories,
                "last_memory_at": s.last_write,
            })
        })
        .collect();
    Ok(Json(json!({"total": list.len(), "namespaces": list})))
}

/// `GET /v1/tags`.
pub(super) async fn tags(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let found = service::listing::tags(&engine, &caller, &q.query(&caller)?).await?;
    let names: Vec<&str> = found.tags.iter().map(|t| t.tag.as_str()).collect();
    Ok(Json(json!({"total": names.len(), "tags": names})))
}

/// `GET /v1/stats`: totals, pinned, never accessed, average importance, and
/// counts by type and by namespace.
pub(super) async fn stats(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Json<Value>> {
    let views = super::super::all(&engine, &caller, &q.query(&caller)?).await?;
    let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_namespace: BTreeMap<String, usize> = BTreeMap::new();
    let (mut pinned, mut never, mut importance) = (0, 0, 0.0);
    for v in &views {
        let m = memory(&caller, v);
        pinned += usize::from(m["pinned"] == json!(true));
        never += usize::from(m["access_count"].as_i64().unwrap_or(0) == 0);
        importance += m["importance"].as_f64().unwrap_or(0.0);
        *by_type
            .entry(m["memory_type"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
        *by_namespace
            .entry(m["namespace"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    let n = views.len();
    Ok(Json(json!({
        "total_memories": n,
        "pinned_count": pinned,
        "never_accessed": never,
        "avg_importance": if n == 0 { 0.0 } else { round3(importance / n as f64) },
        "by_type": by_type,
        "by_namespace": by_namespace,
    })))
}
