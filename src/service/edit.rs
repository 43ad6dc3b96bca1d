//! Reading one memory and editing it: `GET` and `PATCH /v1/memories/{id}`.
//!
//! A change of text makes a new version: the new memory goes through the
//! `store` pipeline's sanitize, redaction, entity and embedding stages (as
//! configured there) and supersedes the old one in the same commit, so the
//! version chain and the history tell what changed and why. Other fields
//! (title, tags, type, importance, pinned) change in place, with a history
//! row naming them. An immutable memory, or one already superseded, is not
//! edited.

use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Chunk};
use crate::core::time::to_rfc3339;
use crate::core::Caller;
use crate::pipeline::Record;
use crate::service::memory::{visible, MAX_CONTENT_CHARS};
use crate::service::Services;
use crate::store::HistoryRow;

/// The stages of the `store` pipeline a new version's text goes through;
/// dedupe, surprise and contradiction detection judge new writes, not edits.
const EDIT_STAGES: &[&str] = &["sanitize", "redact_pii", "extract_entities", "embed"];

#[derive(schemars::JsonSchema, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EditRequest {
    /// New text: a new version that supersedes this one.
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub content: Option<String>,
    pub title: Option<String>,
    pub tags: Option<Vec<String>>,
    #[schemars(length(min = 1, max = 64), regex(pattern = r"\S"))]
    pub memory_type: Option<String>,
    #[schemars(range(min = 0.0, max = 10.0))]
    pub importance: Option<f32>,
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: Option<f32>,
    pub pinned: Option<bool>,
    /// `true` locks the memory: no later edit or delete. (An immutable memory
    /// cannot be edited, so `false` only ever leaves a mutable one as it is.)
    pub immutable: Option<bool>,
    /// When it expires (RFC 3339 or Unix seconds); null clears it.
    #[serde(default, deserialize_with = "crate::core::time::present")]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub expires_at: Option<serde_json::Value>,
    /// When the fact became true; null clears it.
    #[serde(default, deserialize_with = "crate::core::time::present")]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub valid_from: Option<serde_json::Value>,
    /// When the fact stopped being true; null clears it.
    #[serde(default, deserialize_with = "crate::core::time::present")]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub valid_until: Option<serde_json::Value>,
    /// Replaces the memory's metadata (an object).
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_object_schema")]
    pub metadata: Option<serde_json::Value>,
    /// Why: kept in the history (default "edited through the API").
    pub reason: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Edited {
    /// The current version: the new one when the text changed.
    pub id: String,
    /// `updated` (in place), `new_version` or `unchanged`.
    pub status: &'static str,
    /// The version the new one supersedes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<String>,
    /// The fields that changed.
    pub changed: Vec<&'static str>,
}

/// One memory as the API shows it: every column but the vector, times as
/// RFC 3339, `metadata` and `extraction_meta` as JSON.
pub fn view(chunk: &Chunk) -> serde_json::Value {
    let mut v = serde_json::to_value(chunk).expect("a chunk serializes");
    let obj = v.as_object_mut().expect("a chunk is an object");
    obj.remove("embedding");
    obj.insert("has_embedding".into(), chunk.embedding.is_some().into());
    for key in [
        "created_at",
        "updated_at",
        "valid_from",
        "valid_until",
        "expires_at",
        "last_accessed_at",
    ] {
        if let Some(t) = obj.get(key).and_then(serde_json::Value::as_i64) {
            obj.insert(key.into(), to_rfc3339(t).into());
        }
    }
    for key in ["metadata", "extraction_meta"] {
        if let Some(s) = obj.get(key).and_then(serde_json::Value::as_str) {
            if let Ok(parsed) = serde_json::from_str::<serde_json::Value>(s) {
                obj.insert(key.into(), parsed);
            }
        }
    }
    v
}

/// `GET /v1/memories/{id}`.
pub async fn get(engine: &Services, caller: &Caller, id: &str) -> Result<serde_json::Value> {
    Ok(view(&visible(engine, caller, id).await?))
}

/// Count one access to a memory now (as a search result's is counted, but
/// written at once) and answer the memory as it then is.
pub async fn record_access(
    engine: &Services,
    caller: &Caller,
    id: &str,
) -> Result<serde_json::Value> {
    let found = visible(engine, caller, id).await?;
    engine.access.record([found.id.clone()], now_micros());
    engine.access.flush().await?;
    get(engine, caller, &found.id).await
}

/// The request's field changes applied to `c`; the names of those that changed.
fn apply(req: &EditRequest, c: &mut Chunk) -> Result<Vec<&'static str>> {
    let mut changed = Vec::new();
    if let Some(t) = &req.title {
        let t = Some(t.clone()).filter(|t| !t.trim().is_empty());
        if c.title != t {
            c.title = t;
            changed.push("title");
        }
    }
    if let Some(tags) = &req.tags {
        if &c.tags != tags {
            c.tags = tags.clone();
            changed.push("tags");
        }
    }
    if let Some(t) = &req.memory_type {
        let t = t.trim().to_lowercase();
        if t.is_empty() || t.len() > 64 {
            return Err(Error::invalid("memory_type", "must be 1-64 characters"));
        }
        if c.memory_type != t {
            c.memory_type = t;
            changed.push("memory_type");
        }
    }
    if let Some(i) = req.importance {
        if !i.is_finite() || !(0.0..=10.0).contains(&i) {
            return Err(Error::invalid("importance", "must be between 0 and 10"));
        }
        if c.importance != i {
            c.importance = i;
            changed.push("importance");
        }
    }
    if let Some(x) = req.confidence {
        if !x.is_finite() || !(0.0..=1.0).contains(&x) {
            return Err(Error::invalid("confidence", "must be between 0 and 1"));
        }
        if c.confidence != x {
            c.confidence = x;
            changed.push("confidence");
        }
    }
    if let Some(p) = req.pinned {
        if c.pinned != p {
            c.pinned = p;
            changed.push("pinned");
        }
    }
    if req.immutable == Some(true) && !c.immutable {
        c.immutable = true;
        changed.push("immutable");
    }
    for (field, value, slot) in [
        ("expires_at", &req.expires_at, &mut c.expires_at),
        ("valid_from", &req.valid_from, &mut c.valid_from),
        ("valid_until", &req.valid_until, &mut c.valid_until),
    ] {
        let new = match value {
            None => continue,
            Some(serde_json::Value::Null) => None,
            Some(v) => Some(crate::core::time::parse_instant(field, v)?),
        };
        if *slot != new {
            *slot = new;
            changed.push(field);
        }
    }
    crate::service::memory::check_validity(c)?;
    if let Some(m) = &req.metadata {
        if !m.is_object() {
            return Err(Error::invalid("metadata", "must be an object"));
        }
        let text = Some(m.to_string());
        if c.metadata != text {
            c.metadata = text;
            changed.push("metadata");
        }
    }
    Ok(changed)
}

fn history(chunk: &Chunk, event: &str, reason: String, related: Vec<String>) -> HistoryRow {
    HistoryRow {
        id: uuid::Uuid::new_v4().to_string(),
        stream: chunk.stream.clone(),
        chunk_id: chunk.id.clone(),
        event: event.into(),
        reason,
        related_ids: related,
        created_at: now_micros(),
    }
}

/// What can be told wrong about an edit without reading the memory.
pub fn check(req: &EditRequest) -> Result<()> {
    if let Some(content) = &req.content {
        if content.trim().is_empty() {
            return Err(Error::invalid("content", "must not be empty"));
        }
        if content.chars().count() > MAX_CONTENT_CHARS {
            return Err(Error::TooLarge(format!(
                "content: at most {MAX_CONTENT_CHARS} characters are accepted"
            )));
        }
    }
    let mut probe = Chunk::new(String::new(), String::new(), String::new(), 0);
    apply(req, &mut probe).map(|_| ())
}

/// `PATCH /v1/memories/{id}`.
pub async fn edit(
    engine: &Services,
    caller: &Caller,
    id: &str,
    req: EditRequest,
) -> Result<Edited> {
    check(&req)?;
    let old = visible(engine, caller, id).await?;
    if old.immutable {
        return Err(Error::Conflict(format!(
            "memory `{id}` is immutable: it cannot be edited"
        )));
    }
    if let Some(next) = &old.superseded_by {
        return Err(Error::Conflict(format!(
            "memory `{id}` was superseded by `{next}`: edit the current version"
        )));
    }
    let reason = req
        .reason
        .clone()
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| "edited through the API".into());
    let new_text = req.content.as_ref().filter(|c| **c != old.content);
    let Some(text) = new_text else {
        let mut probe = old.clone();
        let changed = apply(&req, &mut probe)?;
        if changed.is_empty() {
            return Ok(Edited {
                id: old.id,
                status: "unchanged",
                supersedes: None,
                changed,
            });
        }
        let edit = req.clone();
        engine
            .store
            .modify(
                vec![old.id.clone()],
                Box::new(move |c: &mut Chunk| {
                    let changed = apply(&edit, c).map(|f| !f.is_empty()).unwrap_or(false);
                    if changed {
                        c.updated_at = now_micros();
                    }
                    changed
                }),
            )
            .await?;
        engine
            .store
            .add_history(vec![history(
                &old,
                "updated",
                format!("{reason} ({})", changed.join(", ")),
                Vec::new(),
            )])
            .await?;
        return Ok(Edited {
            id: old.id,
            status: "updated",
            supersedes: None,
            changed,
        });
    };

    // A new version.
    let now = now_micros();
    let mut new = old.clone();
    new.id = uuid::Uuid::new_v4().to_string();
    new.set_content(text.clone());
    new.embedding = None;
    new.embed_model = None;
    new.entities = Vec::new();
    new.created_at = now;
    new.updated_at = now;
    new.valid_from = Some(now);
    new.valid_until = old.valid_until.filter(|u| *u > now);
    new.version = old.version + 1;
    new.supersedes = Some(old.id.clone());
    new.superseded_by = None;
    new.access_count = 0;
    new.last_accessed_at = None;
    let mut changed = apply(&req, &mut new)?;
    changed.insert(0, "content");
    let pipeline = engine
        .pipelines
        .get("store")
        .ok_or_else(|| Error::Conflict("no `store` pipeline is loaded".into()))?;
    let mut batch = vec![Record::new(new)];
    for stage in EDIT_STAGES {
        pipeline
            .rerun(stage, &mut batch)
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        if !batch[0].is_kept() {
            return Err(Error::invalid(
                "content",
                format!("the `{stage}` stage refused the new text"),
            ));
        }
    }
    let new = batch.pop().expect("one record").chunk;
    let mut superseded = old.clone();
    superseded.superseded_by = Some(new.id.clone());
    superseded.valid_until = Some(superseded.valid_until.map_or(now, |u| u.min(now)));
    superseded.updated_at = now;
    engine
        .store
        .commit_with_side_effects(vec![new.clone()], vec![superseded])
        .await?;
    engine
        .store
        .add_history(vec![
            history(&old, "superseded", reason.clone(), vec![new.id.clone()]),
            history(&new, "edited", reason, vec![old.id.clone()]),
        ])
        .await?;
    Ok(Edited {
        id: new.id,
        status: "new_version",
        supersedes: Some(old.id),
        changed,
    })
}

/// `PUT /v1/memories/{id}/correct`: replace a memory's text with the right
/// one (a new version that supersedes it, the reason in the history).
#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorrectRequest {
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub new_content: String,
    /// Why (default "corrected through the API").
    pub reason: Option<String>,
    /// Show which memory would be corrected; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /v1/memories/correct`: correct the memory that best matches `query`
/// in one stream.
#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorrectByQueryRequest {
    #[schemars(length(min = 1, max = 4000), regex(pattern = r"\S"))]
    pub query: String,
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub new_content: String,
    /// The stream to look in (default: the key's default stream).
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
    pub reason: Option<String>,
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Corrected {
    /// The memory corrected (on a dry run: that would be).
    pub matched_memory_id: String,
    pub matched_content: String,
    /// For a query: the match's search score.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f32>,
    pub dry_run: bool,
    /// The new version (absent on a dry run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `new_version`, `unchanged` (the text was already right) or `dry_run`.
    pub status: &'static str,
}

fn correction(new_content: &str, reason: Option<String>) -> EditRequest {
    EditRequest {
        content: Some(new_content.to_string()),
        reason: Some(
            reason
                .filter(|r| !r.trim().is_empty())
                .unwrap_or_else(|| "corrected through the API".into()),
        ),
        ..EditRequest::default()
    }
}

async fn correct_found(
    engine: &Services,
    caller: &Caller,
    found: Chunk,
    score: Option<f32>,
    new_content: &str,
    reason: Option<String>,
    dry_run: bool,
) -> Result<Corrected> {
    if new_content.trim().is_empty() {
        return Err(Error::invalid("new_content", "must not be empty"));
    }
    let mut answer = Corrected {
        matched_memory_id: found.id.clone(),
        matched_content: found.content.clone(),
        score,
        dry_run,
        id: None,
        status: "dry_run",
    };
    if dry_run {
        return Ok(answer);
    }
    let done = edit(engine, caller, &found.id, correction(new_content, reason)).await?;
    answer.id = Some(done.id);
    answer.status = done.status;
    Ok(answer)
}

pub async fn correct(
    engine: &Services,
    caller: &Caller,
    id: &str,
    req: CorrectRequest,
) -> Result<Corrected> {
    let found = visible(engine, caller, id).await?;
    correct_found(
        engine,
        caller,
        found,
        None,
        &req.new_content,
        req.reason,
        req.dry_run,
    )
    .await
}

pub async fn correct_by_query(
    engine: &Services,
    caller: &Caller,
    req: CorrectByQueryRequest,
) -> Result<Corrected> {
    let stream = caller.resolve_stream(req.stream.as_deref())?;
    let hits = crate::service::search::search(
        engine,
        caller,
        crate::service::search::SearchRequest {
            query: req.query.clone(),
            top_k: Some(1),
            stream: Some(stream.clone()),
            dry_run: true,
            ..Default::default()
        },
    )
    .await?;
    let best = hits.results.into_iter().next().ok_or_else(|| {
        Error::NotFound(format!("no memory in stream `{stream}` matches the query"))
    })?;
    let found = visible(engine, caller, &best.chunk_id).await?;
    correct_found(
        engine,
        caller,
        found,
        Some(best.score_final),
        &req.new_content,
        req.reason,
        req.dry_run,
    )
    .await
}
