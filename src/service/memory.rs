//! Writing and removing memories: the service functions behind `/v1/store`,
//! `/v1/delete`, `DELETE /api/memories/{id}` and `/v1/purge-namespace`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bus::{Envelope, Outcome};
use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Chunk};
use crate::core::time::parse_instant;
use crate::core::Caller;
use crate::service::Services;
use crate::store::Filter;

/// Longest memory accepted, in characters.
pub const MAX_CONTENT_CHARS: usize = 1_000_000;

/// The body of `POST /v1/store`: the reference fields plus the rest of the record's
/// writable columns.
#[derive(schemars::JsonSchema, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreRequest {
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub content: String,
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
    #[schemars(range(min = 0, max = 1))]
    pub level: Option<i32>,
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_object_schema")]
    pub metadata: Option<serde_json::Value>,
    pub user_id: Option<String>,
    pub app_id: Option<String>,
    pub agent_id: Option<String>,
    pub session_id: Option<String>,
    pub title: Option<String>,
    #[schemars(length(min = 1, max = 64), regex(pattern = r"\S"))]
    pub memory_type: Option<String>,
    pub subject: Option<String>,
    pub source: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[schemars(range(min = 0.0, max = 10.0))]
    pub importance: Option<f32>,
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: Option<f32>,
    pub pinned: Option<bool>,
    pub immutable: Option<bool>,
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub expires_at: Option<serde_json::Value>,
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub valid_from: Option<serde_json::Value>,
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub valid_until: Option<serde_json::Value>,
    /// When the memory was recorded; defaults to now (imports of dated
    /// conversations set it to the conversation's time).
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub created_at: Option<serde_json::Value>,
    /// A caller-chosen id (idempotent re-stores); a fresh UUID otherwise.
    #[schemars(regex(pattern = r"^[A-Za-z0-9_.:-]{1,128}$"))]
    pub id: Option<String>,
    /// Wait until the memory is committed (default) or answer once the bus
    /// has accepted it (`"status": "accepted"`).
    pub wait: Option<bool>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct StoreResponse {
    /// The memory that holds the text: the new one, or for a duplicate the
    /// stored memory it repeats.
    pub id: String,
    /// `stored`, `accepted` (`wait: false`) or `duplicate`.
    pub status: &'static str,
    /// For a duplicate: the stored memory it repeats (the caller's text and
    /// source are kept in that memory's `extraction_meta.merged_sources`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<String>,
}

fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "id",
            "must be 1-128 characters of letters, digits, - _ . :",
        ))
    }
}

fn unit_interval(field: &str, v: Option<f32>, default: f32, max: f32) -> Result<f32> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && (0.0..=max).contains(&x) => Ok(x),
        Some(_) => Err(Error::invalid(
            field,
            format!("must be between 0 and {max}"),
        )),
    }
}

/// Validate a store request into the chunk that goes on the bus.
pub fn chunk_from_request(caller: &Caller, req: StoreRequest) -> Result<Chunk> {
    let chars = req.content.chars().count();
    if chars > MAX_CONTENT_CHARS {
        return Err(Error::TooLarge(format!(
            "content: {chars} characters; at most {MAX_CONTENT_CHARS} are accepted"
        )));
    }
    if req.content.trim().is_empty() {
        return Err(Error::invalid("content", "must not be empty"));
    }
    let stream = caller.resolve_stream(req.stream.as_deref())?;
    let id = match req.id {
        Some(id) => {
            check_id(&id)?;
            id
        }
        None => uuid::Uuid::new_v4().to_string(),
    };
    let level = req.level.unwrap_or(0);
    if !(0..=1).contains(&level) {
        return Err(Error::invalid(
            "level",
            "must be 0 (raw) or 1 (consolidated)",
        ));
    }
    let metadata = match req.metadata {
        None | Some(serde_json::Value::Null) => None,
        Some(m @ serde_json::Value::Object(_)) => Some(m.to_string()),
        Some(_) => return Err(Error::invalid("metadata", "must be a JSON object")),
    };
    let created_at = match &req.created_at {
        Some(v) => parse_instant("created_at", v)?,
        None => now_micros(),
    };
    let mut chunk = Chunk::new(id, stream, req.content, created_at);
    chunk.level = level;
    chunk.metadata = metadata;
    chunk.user_id = req.user_id;
    chunk.app_id = req.app_id;
    chunk.agent_id = req.agent_id;
    chunk.session_id = req.session_id;
    chunk.title = req.title;
    chunk.subject = req.subject.filter(|s| !s.trim().is_empty());
    chunk.source = req.source;
    chunk.tags = req.tags;
    if let Some(t) = req.memory_type {
        let t = t.trim().to_lowercase();
        if t.is_empty() || t.len() > 64 {
            return Err(Error::invalid("memory_type", "must be 1-64 characters"));
        }
        chunk.memory_type = t;
    }
    chunk.importance = unit_interval("importance", req.importance, 1.0, 10.0)?;
    chunk.confidence = unit_interval("confidence", req.confidence, 1.0, 1.0)?;
    chunk.pinned = req.pinned.unwrap_or(false);
    chunk.immutable = req.immutable.unwrap_or(false);
    chunk.expires_at = req
        .expires_at
        .as_ref()
        .map(|v| parse_instant("expires_at", v))
        .transpose()?;
    chunk.valid_from = req
        .valid_from
        .as_ref()
        .map(|v| parse_instant("valid_from", v))
        .transpose()?;
    chunk.valid_until = req
        .valid_until
        .as_ref()
        .map(|v| parse_instant("valid_until", v))
        .transpose()?;
    check_validity(&chunk)?;
    Ok(chunk)
}

/// A memory's validity interval, when both ends are set, is not empty.
pub(crate) fn check_validity(chunk: &Chunk) -> Result<()> {
    match (chunk.valid_from, chunk.valid_until) {
        (Some(from), Some(until)) if until <= from => {
            Err(Error::invalid("valid_until", "must be after valid_from"))
        }
        _ => Ok(()),
    }
}

/// Store one memory and wait until the pipeline has committed it.
pub async fn store(engine: &Services, caller: &Caller, req: StoreRequest) -> Result<StoreResponse> {
    let caller_chose_id = req.id.is_some();
    let wait = req.wait.unwrap_or(true);
    let chunk = chunk_from_request(caller, req)?;
    if caller_chose_id {
        // An id names one memory in one stream: never let a write move or
        // overwrite another stream's memory, nor an immutable one.
        let owners = engine.store.owners(&[&chunk.id]).await?;
        if let Some(why) = owners.get(&chunk.id).and_then(|o| o.refuses(&chunk)) {
            return Err(Error::Conflict(why));
        }
    }
    let id = chunk.id.clone();
    let envelope = Envelope {
        pipeline: "store".into(),
        chunk,
        notify: wait,
        minted: !caller_chose_id,
        resend: 0,
    };
    if !wait {
        engine.bus.publish(vec![envelope]).await?;
        return Ok(StoreResponse {
            id,
            status: "accepted",
            duplicate_of: None,
        });
    }
    let outcome = publish_and_wait(engine, vec![envelope]).await?.remove(0);
    match outcome {
        Outcome::Stored { .. } => Ok(StoreResponse {
            id,
            status: "stored",
            duplicate_of: None,
        }),
        Outcome::Duplicate { existing_id } => Ok(StoreResponse {
            id: existing_id.clone(),
            status: "duplicate",
            duplicate_of: Some(existing_id),
        }),
        Outcome::Dropped { reason } => Err(Error::invalid(
            "content",
            format!("nothing to store ({reason})"),
        )),
        Outcome::Failed { error } => Err(Error::Internal(format!(
            "the memory was not stored and is kept in dead_letters: {error}"
        ))),
    }
}

fn not_committed(id: &str, timeout: Duration) -> Error {
    Error::Timeout(format!(
        "memory {id} was accepted but not committed within {} ms; it will still be stored",
        timeout.as_millis()
    ))
}

/// How waiting for one write ended.
enum Waited {
    Told(Outcome),
    /// The notifier went away (the worker stopped).
    Gone,
    TimedOut,
}

/// Wait for the outcome the pipeline tells for one write.
async fn wait_for(watch: crate::bus::Watch, deadline: tokio::time::Instant) -> Waited {
    tokio::select! {
        o = watch.outcome() => o.map_or(Waited::Gone, Waited::Told),
        _ = tokio::time::sleep_until(deadline) => Waited::TimedOut,
    }
}

/// Publish `envelopes`. The bus drops a message it already holds (the very
/// same bytes within its duplicate window): one whose memory is stored now is
/// done, and its id is returned; any other (still on its way, deleted since,
/// or failed) is sent again under a fresh message id, so it is surely stored.
/// Sent twice, a write is merged by id: harmless. Without a `store` to ask,
/// every dropped message counts as stored.
pub async fn publish_fresh(
    bus: &crate::bus::Bus,
    store: Option<&crate::store::Store>,
    envelopes: Vec<Envelope>,
) -> Result<std::collections::HashSet<String>> {
    let dropped = bus.publish(envelopes).await?;
    // One lookup for every dropped message (a file imported again drops all).
    let owners = match store {
        Some(store) if !dropped.is_empty() => {
            let ids: Vec<&str> = dropped.iter().map(|e| e.chunk.id.as_str()).collect();
            Some(store.owners(&ids).await?)
        }
        _ => None,
    };
    let mut stored = std::collections::HashSet::new();
    let mut missing = Vec::new();
    for mut e in dropped {
        let present = owners.as_ref().is_none_or(|o| o.contains_key(&e.chunk.id));
        if present {
            stored.insert(e.chunk.id.clone());
        } else {
            e.resend = crate::core::model::now_micros().unsigned_abs().max(1);
            missing.push(e);
        }
    }
    if !missing.is_empty() {
        bus.publish(missing).await?;
    }
    Ok(stored)
}

/// Publish `envelopes` (each with `notify`) and wait until every one has an
/// outcome, or the store timeout passes (then the write is reported as not
/// yet committed; it will still be stored).
pub async fn publish_and_wait(engine: &Services, envelopes: Vec<Envelope>) -> Result<Vec<Outcome>> {
    let ids: Vec<String> = envelopes.iter().map(|e| e.chunk.id.clone()).collect();
    let timeout = Duration::from_millis(engine.cfg.server.store_timeout_ms);
    publish_and_collect(engine, envelopes)
        .await?
        .into_iter()
        .zip(&ids)
        .map(|(o, id)| o.ok_or_else(|| not_committed(id, timeout)))
        .collect()
}

/// Publish `envelopes` (each with `notify`) and wait for each one's outcome
/// until the store timeout: `None` for a write not committed by then (it
/// will still be stored). An error when the bus refused the writes or the
/// pipeline worker stopped.
pub async fn publish_and_collect(
    engine: &Services,
    envelopes: Vec<Envelope>,
) -> Result<Vec<Option<Outcome>>> {
    let timeout = Duration::from_millis(engine.cfg.server.store_timeout_ms);
    let ids: Vec<String> = envelopes.iter().map(|e| e.chunk.id.clone()).collect();
    let mut watches = Vec::with_capacity(ids.len());
    for id in &ids {
        watches.push(engine.notifier.watch(id).await?);
    }
    let forget = || ids.iter().for_each(|id| engine.notifier.forget(id));
    let done = match publish_fresh(&engine.bus, Some(&engine.store), envelopes).await {
        Ok(stored) => stored,
        Err(e) => {
            forget();
            return Err(e);
        }
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let mut outcomes = Vec::with_capacity(ids.len());
    for (id, watch) in ids.iter().zip(watches) {
        if done.contains(id) {
            outcomes.push(Some(Outcome::Stored {
                superseded: Vec::new(),
            }));
            continue;
        }
        match wait_for(watch, deadline).await {
            Waited::Told(o) => outcomes.push(Some(o)),
            // Stored by a process whose answer was missed.
            _ if engine.store.get(id).await?.is_some() => outcomes.push(Some(Outcome::Stored {
                superseded: Vec::new(),
            })),
            Waited::Gone => {
                forget();
                return Err(Error::Internal(format!(
                    "the pipeline worker stopped before storing memory {id}"
                )));
            }
            Waited::TimedOut => {
                engine.notifier.forget(id);
                outcomes.push(None);
            }
        }
    }
    Ok(outcomes)
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Retried {
    /// The memory the message carried.
    pub id: String,
    /// `stored`, `duplicate`, `dropped` or `failed` (then it is a dead letter
    /// again, with the new error).
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /v1/dead-letters/{id}/retry`: send a dead letter's message through
/// its pipeline again and wait for the outcome; the dead letter is removed
/// once the message is back on the bus.
pub async fn retry_dead_letter(engine: &Services, caller: &Caller, id: &str) -> Result<Retried> {
    let filter = Filter::new().id(id).visible_to(caller);
    let missing = || Error::NotFound(format!("no dead letter with id `{id}`"));
    let payload = engine
        .store
        .dead_letter_payload(&filter)
        .await?
        .ok_or_else(missing)?;
    let mut envelope: Envelope = serde_json::from_str(&payload).map_err(|e| {
        Error::Conflict(format!(
            "dead letter `{id}` holds no readable write ({e}): it cannot be retried"
        ))
    })?;
    if !caller.can_see(&envelope.chunk.stream) {
        return Err(missing());
    }
    envelope.notify = true;
    let memory = envelope.chunk.id.clone();
    let outcome = publish_and_wait(engine, vec![envelope]).await;
    if outcome.is_ok() {
        engine.store.delete_dead_letters(&filter).await?;
    }
    let (status, error) = match outcome?.pop() {
        Some(Outcome::Stored { .. }) => ("stored", None),
        Some(Outcome::Duplicate { .. }) => ("duplicate", None),
        Some(Outcome::Dropped { reason, .. }) => ("dropped", Some(reason.to_string())),
        Some(Outcome::Failed { error }) => ("failed", Some(error)),
        None => ("failed", Some("no outcome".to_string())),
    };
    Ok(Retried {
        id: memory,
        status,
        error,
    })
}

fn not_found(id: &str) -> Error {
    Error::NotFound(format!("no memory with id `{id}`"))
}

/// The memory with this id when the caller may see it; NotFound otherwise, so
/// another stream's ids are indistinguishable from ids that do not exist.
pub async fn visible(engine: &Services, caller: &Caller, id: &str) -> Result<Chunk> {
    if id.trim().is_empty() {
        return Err(Error::invalid("chunk_id", "must not be empty"));
    }
    match engine.store.get(id).await? {
        Some(chunk) if caller.can_see(&chunk.stream) => Ok(chunk),
        _ => Err(not_found(id)),
    }
}

/// Which of `ids` name a stored memory (any version) the caller may see:
/// [`visible`] for many ids in one read.
pub async fn visible_ids<S: AsRef<str>>(
    engine: &Services,
    caller: &Caller,
    ids: &[S],
) -> Result<std::collections::HashSet<String>> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    Ok(engine
        .store
        .owners(ids)
        .await?
        .into_iter()
        .filter(|(_, owner)| caller.can_see(&owner.stream))
        .map(|(id, _)| id)
        .collect())
}

/// Delete one memory the caller can see; NotFound otherwise (also when it lives
/// in a stream the caller may not see, or outside `only_stream` when given).
pub async fn delete(
    engine: &Services,
    caller: &Caller,
    id: &str,
    only_stream: Option<&str>,
) -> Result<()> {
    if id.trim().is_empty() {
        return Err(Error::invalid("id", "must not be empty"));
    }
    let chunk = visible(engine, caller, id).await?;
    if only_stream.is_some_and(|s| s != chunk.stream) {
        return Err(not_found(id));
    }
    if chunk.immutable {
        return Err(immutable(id, "deleted"));
    }
    let n = engine.store.delete(&Filter::new().id(id)).await?;
    if n == 0 {
        return Err(not_found(id));
    }
    engine
        .store
        .erase_traces(&chunk.stream, Some(&[chunk.id.clone()]))
        .await?;
    reinstate_previous(engine, std::slice::from_ref(&chunk)).await
}

fn immutable(id: &str, what: &str) -> Error {
    Error::Conflict(format!("memory `{id}` is immutable: it cannot be {what}"))
}

/// After the newest version of a fact is deleted, the version it superseded
/// is current again (its validity reopened where the supersession closed
/// it), with a history row saying why. Without this, the older versions
/// pointed at a memory that no longer exists and were hidden for ever.
/// Versions deleted in the same call stay deleted.
pub(crate) async fn reinstate_previous(engine: &Services, deleted: &[Chunk]) -> Result<()> {
    let gone: std::collections::HashMap<&str, &Chunk> =
        deleted.iter().map(|c| (c.id.as_str(), c)).collect();
    let ids: Vec<&str> = gone.keys().copied().collect();
    let mut previous: Vec<(String, String)> = Vec::new();
    for part in ids.chunks(1000) {
        for c in engine
            .store
            .find_rows(&Filter::new().superseded_by_any(part), None)
            .await?
        {
            let by = c.superseded_by.clone().unwrap_or_default();
            // Versions supersede each other within one stream.
            if !gone.contains_key(c.id.as_str())
                && gone.get(by.as_str()).is_some_and(|d| d.stream == c.stream)
            {
                previous.push((c.id, by));
            }
        }
    }
    if previous.is_empty() {
        return Ok(());
    }
    let closed: std::collections::HashMap<String, Option<crate::core::model::Micros>> = previous
        .iter()
        .map(|(id, by)| (id.clone(), gone[by.as_str()].valid_from))
        .collect();
    let now = crate::core::model::now_micros();
    engine
        .store
        .modify(
            previous.iter().map(|(id, _)| id.clone()).collect(),
            Box::new(move |c: &mut Chunk| {
                let Some(closed_at) = closed.get(&c.id).copied() else {
                    return false;
                };
                if c.superseded_by.is_none() {
                    return false;
                }
                c.superseded_by = None;
                if closed_at.is_some() && c.valid_until == closed_at {
                    c.valid_until = None;
                }
                c.updated_at = now;
                true
            }),
        )
        .await?;
    let rows = previous
        .into_iter()
        .map(|(id, by)| crate::store::HistoryRow {
            id: uuid::Uuid::new_v4().to_string(),
            stream: gone[by.as_str()].stream.clone(),
            chunk_id: id,
            event: "reinstated".into(),
            reason: format!("the version that superseded it ({by}) was deleted"),
            related_ids: vec![by],
            created_at: now,
        })
        .collect();
    engine.store.add_history(rows).await?;
    Ok(())
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeRequest {
    pub stream: Option<String>,
    #[serde(default = "yes")]
    pub dry_run: bool,
    #[serde(default)]
    pub confirmed: bool,
    /// Also erase the purged memories from earlier table versions (admin only).
    #[serde(default)]
    pub forget: bool,
}

fn yes() -> bool {
    true
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct PurgeResponse {
    pub status: &'static str,
    pub stream: String,
    pub dry_run: bool,
    pub deleted_count: usize,
    pub deleted_ids: Vec<String>,
    /// Immutable memories of the stream, which a purge keeps.
    pub kept_immutable: Vec<String>,
    /// With `forget`: what was erased from earlier versions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forgotten: Option<crate::service::forget::Forgotten>,
}

/// The reply to a delete by id (`POST /v1/delete`, MCP `memory_delete`).
#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Deleted {
    pub status: &'static str,
    pub id: String,
    /// With `forget`: what was erased from earlier versions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forgotten: Option<crate::service::forget::Forgotten>,
}

impl Deleted {
    pub fn new(id: &str) -> Deleted {
        Deleted {
            status: "deleted",
            id: id.to_string(),
            forgotten: None,
        }
    }
}

/// `POST /v1/delete`: delete a memory; with `forget` (admin keys only,
/// refused before anything is deleted) also erase it from every earlier
/// table version that no snapshot holds.
pub async fn delete_by_id(
    engine: &Services,
    caller: &Caller,
    id: &str,
    forget: bool,
) -> Result<Deleted> {
    if forget {
        crate::service::forget::check(caller)?;
    }
    delete(engine, caller, id, None).await?;
    let mut deleted = Deleted::new(id);
    if forget {
        let ids = [id.to_string()];
        deleted.forgotten = Some(crate::service::forget::erase(engine, caller, &ids).await?);
    }
    Ok(deleted)
}

/// List (dry run) or delete every memory of a stream.
pub async fn purge(engine: &Services, caller: &Caller, req: PurgeRequest) -> Result<PurgeResponse> {
    let stream = caller.resolve_stream(req.stream.as_deref())?;
    if req.forget {
        crate::service::forget::check(caller)?;
    }
    if !req.dry_run && !req.confirmed {
        return Err(Error::invalid(
            "confirmed",
            "must be true to delete (with dry_run: false)",
        ));
    }
    // Immutable memories stay, and the answer says which.
    let filter = Filter::new().stream(&stream).mutable();
    let mut ids = engine.store.ids(&filter).await?;
    ids.sort();
    let mut kept = engine
        .store
        .ids(&Filter::new().stream(&stream).immutable())
        .await?;
    kept.sort();
    if !req.dry_run {
        engine.store.delete(&filter).await?;
        // History, feedback and the graph of what went go with it.
        let whole = kept.is_empty().then_some(None);
        engine
            .store
            .erase_traces(&stream, whole.unwrap_or(Some(&ids)))
            .await?;
        tracing::info!(%stream, count = ids.len(), kept = kept.len(), "stream purged");
    }
    let forgotten = match req.forget && !req.dry_run {
        true => Some(crate::service::forget::erase(engine, caller, &ids).await?),
        false => None,
    };
    Ok(PurgeResponse {
        status: "ok",
        stream,
        dry_run: req.dry_run,
        deleted_count: ids.len(),
        deleted_ids: ids,
        kept_immutable: kept,
        forgotten,
    })
}

/// One version in a fact's chain.
#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Version {
    pub chunk_id: String,
    pub version: i32,
    pub content: String,
    pub created_at: String,
    pub valid_from: Option<String>,
    pub valid_until: Option<String>,
    pub superseded_by: Option<String>,
    pub is_current: bool,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct History {
    pub chunk_id: String,
    /// Oldest first; the current version has `is_current: true`.
    pub versions: Vec<Version>,
    /// Every recorded change to these versions, with its reason, oldest first.
    pub events: Vec<crate::store::HistoryRow>,
}

/// The version chain of a memory (through `supersedes` / `superseded_by`),
/// oldest first, with the recorded reasons. At most `limit` versions, the newest.
pub async fn history(
    engine: &Services,
    caller: &Caller,
    id: &str,
    limit: Option<usize>,
) -> Result<History> {
    let start = visible(engine, caller, id).await?;
    // Versions supersede each other within one stream; a link that leads
    // elsewhere (a forged or restored row) ends the chain instead of showing
    // another stream's memory.
    let stream = start.stream.clone();
    let same_stream = |c: Option<Chunk>| c.filter(|c| c.stream == stream);
    const MAX_CHAIN: usize = 1000;
    let mut chain = vec![start];
    // Back to the first version …
    while let Some(prev) = chain[0].supersedes.clone() {
        if chain.len() >= MAX_CHAIN || chain.iter().any(|c| c.id == prev) {
            break;
        }
        match same_stream(engine.store.get(&prev).await?) {
            Some(c) => chain.insert(0, c),
            None => break,
        }
    }
    // … and forward to the current one.
    while let Some(next) = chain.last().and_then(|c| c.superseded_by.clone()) {
        if chain.len() >= MAX_CHAIN || chain.iter().any(|c| c.id == next) {
            break;
        }
        match same_stream(engine.store.get(&next).await?) {
            Some(c) => chain.push(c),
            None => break,
        }
    }
    if let Some(limit) = limit.filter(|l| *l > 0) {
        let skip = chain.len().saturating_sub(limit);
        chain.drain(..skip);
    }
    let mut events = Vec::new();
    for c in &chain {
        let of_chunk = engine.store.history_of(&c.id).await?;
        events.extend(of_chunk.into_iter().filter(|e| e.stream == stream));
    }
    events.sort_by_key(|e| e.created_at);
    events.dedup_by(|a, b| a.id == b.id);
    use crate::core::time::to_rfc3339;
    Ok(History {
        chunk_id: id.to_string(),
        versions: chain
            .into_iter()
            .map(|c| Version {
                is_current: c.superseded_by.is_none(),
                chunk_id: c.id,
                version: c.version,
                content: c.content,
                created_at: to_rfc3339(c.created_at),
                valid_from: c.valid_from.map(to_rfc3339),
                valid_until: c.valid_until.map(to_rfc3339),
                superseded_by: c.superseded_by,
            })
            .collect(),
        events,
    })
}
