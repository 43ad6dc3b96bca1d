//! Many memories at once: `POST /v1/memories/batch` (store, answered per
//! item), `PATCH /v1/memories/batch` (edit, answered per item) and
//! `POST /v1/memories/bulk-delete` (by ids or by the listing's filters,
//! with a dry run, a recorded reason, and a snapshot taken first so the
//! delete can be rolled back).

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::bus::{Envelope, Outcome};
use crate::core::error::{Error, Result};
use crate::core::model::now_micros;
use crate::core::Caller;
use crate::service::edit::{self, EditRequest};
use crate::service::listing::{self, ListQuery};
use crate::service::memory::{self, StoreRequest};
use crate::service::Services;
use crate::store::{Filter, HistoryRow};

/// Most items in one batch store or batch edit.
pub const MAX_BATCH: usize = 1000;
/// Most ids in one bulk delete.
pub const MAX_DELETE_IDS: usize = 10_000;

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchStoreRequest {
    /// The memories, each as the body of `POST /v1/store` (without `wait`).
    #[schemars(length(min = 1, max = 1000))]
    pub memories: Vec<StoreRequest>,
    /// Wait until every memory is committed (default) or answer once the bus
    /// has accepted them.
    pub wait: Option<bool>,
}

/// What became of one item of a batch.
#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct ItemResult {
    /// Its place in the request, from 0.
    pub index: usize,
    /// The memory: for a duplicate the stored memory it repeats; absent when
    /// the item was refused before it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Store: `stored`, `duplicate`, `accepted` (`wait: false`), `pending`
    /// (accepted, not committed within the store timeout; it will be),
    /// `forbidden` (a stream the key may not write), `conflict`, `dropped`
    /// or `failed` (kept in dead_letters).
    /// Edit: `updated`, `new_version`, `unchanged`, `not_found`, `conflict`
    /// or `invalid` (a pipeline stage refused the new text).
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ItemResult {
    fn ok(index: usize, id: String, status: &'static str) -> ItemResult {
        ItemResult {
            index,
            id: Some(id),
            status,
            duplicate_of: None,
            error: None,
        }
    }

    fn refused(index: usize, id: Option<String>, e: &Error) -> ItemResult {
        let status = match e {
            Error::NotFound(_) => "not_found",
            Error::Conflict(_) => "conflict",
            Error::Forbidden(_) => "forbidden",
            Error::Invalid { .. } | Error::TooLarge(_) => "invalid",
            _ => "failed",
        };
        ItemResult {
            index,
            id,
            status,
            duplicate_of: None,
            error: Some(e.to_string()),
        }
    }
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct BatchAnswer {
    /// How many items ended in each status.
    pub counts: std::collections::BTreeMap<&'static str, usize>,
    /// One per item, in request order.
    pub results: Vec<ItemResult>,
}

impl BatchAnswer {
    fn new(mut results: Vec<ItemResult>) -> BatchAnswer {
        results.sort_by_key(|r| r.index);
        let mut counts = std::collections::BTreeMap::new();
        for r in &results {
            *counts.entry(r.status).or_default() += 1;
        }
        BatchAnswer { counts, results }
    }
}

/// An item's error as the whole request's: its field named by its place.
pub(crate) fn at_item(list: &str, index: usize, e: Error) -> Error {
    match e {
        Error::Invalid { field, message } => {
            Error::invalid(&format!("{list}[{index}].{field}"), message)
        }
        Error::TooLarge(m) => Error::TooLarge(format!("{list}[{index}].{m}")),
        other => other,
    }
}

fn check_batch_len(field: &str, n: usize) -> Result<()> {
    if n == 0 || n > MAX_BATCH {
        return Err(Error::invalid(
            field,
            format!("must hold 1 to {MAX_BATCH} items"),
        ));
    }
    Ok(())
}

/// `POST /v1/memories/batch`: every item goes on the bus in one publish and
/// through the `store` pipeline. A malformed item (a field out of range, a
/// bad date) refuses the whole request with 422 naming `memories[i].field`;
/// an item that is well-formed but cannot be stored (a stream the key may
/// not write, an id another stream or an immutable memory holds, an id
/// repeated in the batch, dropped or failed in the pipeline) is answered in
/// its result and the others are stored.
pub async fn store(
    engine: &Services,
    caller: &Caller,
    req: BatchStoreRequest,
) -> Result<BatchAnswer> {
    check_batch_len("memories", req.memories.len())?;
    let wait = req.wait.unwrap_or(true);
    let mut results = Vec::new();
    let mut envelopes = Vec::new();
    let mut indexes = Vec::new();
    let mut chosen_ids = HashSet::new();
    for (index, item) in req.memories.into_iter().enumerate() {
        if item.wait.is_some() {
            return Err(Error::invalid(
                &format!("memories[{index}].wait"),
                "set `wait` on the batch, not on an item",
            ));
        }
        let caller_chose_id = item.id.is_some();
        match memory::chunk_from_request(caller, item) {
            Err(e @ Error::Forbidden(_)) => results.push(ItemResult::refused(index, None, &e)),
            Err(e) => return Err(at_item("memories", index, e)),
            Ok(chunk) if caller_chose_id && !chosen_ids.insert(chunk.id.clone()) => {
                let e = Error::Conflict(format!(
                    "`{}` is given to an earlier item of this batch",
                    chunk.id
                ));
                results.push(ItemResult::refused(index, Some(chunk.id), &e));
            }
            Ok(chunk) => {
                indexes.push(index);
                envelopes.push(Envelope {
                    pipeline: "store".into(),
                    chunk,
                    notify: wait,
                    minted: !caller_chose_id,
                    resend: 0,
                });
            }
        }
    }
    // An id names one memory in one stream: never let a write move or
    // overwrite another stream's memory, nor an immutable one.
    if !chosen_ids.is_empty() {
        let owners = engine
            .store
            .owners(&chosen_ids.iter().collect::<Vec<_>>())
            .await?;
        let mut keep = Vec::new();
        for (index, e) in indexes.drain(..).zip(envelopes.drain(..)) {
            match owners.get(&e.chunk.id).and_then(|o| o.refuses(&e.chunk)) {
                Some(why) => results.push(ItemResult::refused(
                    index,
                    Some(e.chunk.id.clone()),
                    &Error::Conflict(why),
                )),
                None => keep.push((index, e)),
            }
        }
        (indexes, envelopes) = keep.into_iter().unzip();
    }
    let ids: Vec<String> = envelopes.iter().map(|e| e.chunk.id.clone()).collect();
    if envelopes.is_empty() {
        return Ok(BatchAnswer::new(results));
    }
    if !wait {
        engine.bus.publish(envelopes).await?;
        for (index, id) in indexes.into_iter().zip(ids) {
            results.push(ItemResult::ok(index, id, "accepted"));
        }
        return Ok(BatchAnswer::new(results));
    }
    let outcomes = memory::publish_and_collect(engine, envelopes).await?;
    for ((index, id), outcome) in indexes.into_iter().zip(ids).zip(outcomes) {
        results.push(match outcome {
            Some(Outcome::Stored { .. }) => ItemResult::ok(index, id, "stored"),
            Some(Outcome::Duplicate { existing_id }) => ItemResult {
                duplicate_of: Some(existing_id.clone()),
                ..ItemResult::ok(index, existing_id, "duplicate")
            },
            Some(Outcome::Dropped { reason }) => ItemResult {
                error: Some(format!("nothing to store ({reason})")),
                ..ItemResult::ok(index, id, "dropped")
            },
            Some(Outcome::Failed { error }) => ItemResult {
                error: Some(format!("kept in dead_letters: {error}")),
                ..ItemResult::ok(index, id, "failed")
            },
            None => ItemResult {
                error: Some(format!(
                    "accepted but not committed within {} ms; it will still be stored",
                    engine.cfg.server.store_timeout_ms
                )),
                ..ItemResult::ok(index, id, "pending")
            },
        });
    }
    Ok(BatchAnswer::new(results))
}

/// One item of `PATCH /v1/memories/batch`: the memory's `id` and the fields
/// of `PATCH /v1/memories/{id}`.
#[derive(schemars::JsonSchema, Debug)]
pub struct BatchEdit {
    #[schemars(length(min = 1))]
    pub id: String,
    #[schemars(flatten)]
    pub edit: EditRequest,
}

// By hand, because serde cannot refuse unknown fields beside a flattened
// struct: `id` is taken out and the rest must be an `EditRequest`.
impl<'de> Deserialize<'de> for BatchEdit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut map = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        let id = match map.remove("id") {
            Some(serde_json::Value::String(id)) => id,
            Some(_) => return Err(D::Error::custom("`id` must be a string")),
            None => return Err(D::Error::missing_field("id")),
        };
        let edit =
            EditRequest::deserialize(serde_json::Value::Object(map)).map_err(D::Error::custom)?;
        Ok(BatchEdit { id, edit })
    }
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchEditRequest {
    #[schemars(length(min = 1, max = 1000))]
    pub updates: Vec<BatchEdit>,
}

/// `PATCH /v1/memories/batch`: each item as `PATCH /v1/memories/{id}` would
/// edit it, one after another. A malformed item refuses the whole request
/// (422 naming `updates[i].field`); a memory not found, immutable,
/// superseded or repeated in the batch is answered in its result.
pub async fn edit(
    engine: &Services,
    caller: &Caller,
    req: BatchEditRequest,
) -> Result<BatchAnswer> {
    check_batch_len("updates", req.updates.len())?;
    for (index, item) in req.updates.iter().enumerate() {
        if item.id.trim().is_empty() {
            return Err(Error::invalid(
                &format!("updates[{index}].id"),
                "must not be empty",
            ));
        }
        edit::check(&item.edit).map_err(|e| at_item("updates", index, e))?;
    }
    let mut seen = HashSet::new();
    let mut results = Vec::with_capacity(req.updates.len());
    for (index, item) in req.updates.into_iter().enumerate() {
        if !seen.insert(item.id.clone()) {
            let e = Error::Conflict(format!(
                "`{}` is edited by an earlier item of this batch",
                item.id
            ));
            results.push(ItemResult::refused(index, Some(item.id), &e));
            continue;
        }
        results.push(
            match edit::edit(engine, caller, &item.id, item.edit).await {
                Ok(done) => ItemResult::ok(index, done.id, done.status),
                Err(
                    e @ (Error::NotFound(_)
                    | Error::Conflict(_)
                    | Error::Invalid { .. }
                    | Error::TooLarge(_)),
                ) => ItemResult::refused(index, Some(item.id), &e),
                Err(e) => return Err(e),
            },
        );
    }
    Ok(BatchAnswer::new(results))
}

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkDeleteRequest {
    /// These memories (any version).
    #[schemars(length(min = 1, max = 10000))]
    pub ids: Option<Vec<String>>,
    /// The memories `GET /v1/memories` lists for these filters (without
    /// `order`, `limit` or `cursor`); with `ids` too, those of the ids that
    /// match.
    pub filter: Option<ListQuery>,
    /// Why: kept in each deleted memory's history.
    pub reason: Option<String>,
    /// Answer what would be deleted; change nothing (default false).
    #[serde(default)]
    pub dry_run: bool,
    /// Must be true to delete by `filter` alone (not a dry run).
    #[serde(default)]
    pub confirmed: bool,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct BulkDeleted {
    pub dry_run: bool,
    /// Deleted (on a dry run: would be).
    pub deleted_count: usize,
    pub deleted_ids: Vec<String>,
    /// Matched but immutable: kept.
    pub kept_immutable: Vec<String>,
    /// Ids asked for that the key cannot see or that do not exist.
    pub not_found: Vec<String>,
    /// The snapshot taken just before the delete (`POST
    /// /v1/snapshots/{name}/rollback` restores it); absent on a dry run or
    /// when nothing matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    pub reason: String,
}

/// `POST /v1/memories/bulk-delete`.
pub async fn delete(
    engine: &Services,
    caller: &Caller,
    req: BulkDeleteRequest,
) -> Result<BulkDeleted> {
    let ids = req.ids.unwrap_or_default();
    if ids.len() > MAX_DELETE_IDS {
        return Err(Error::invalid(
            "ids",
            format!("at most {MAX_DELETE_IDS} ids in one request"),
        ));
    }
    if ids.iter().any(|id| id.trim().is_empty()) {
        return Err(Error::invalid("ids", "an id must not be empty"));
    }
    let filter = match (&req.filter, ids.is_empty()) {
        (None, true) => {
            return Err(Error::invalid(
                "ids",
                "give `ids`, a `filter`, or both (to delete every memory of a stream use /v1/purge-namespace)",
            ))
        }
        (None, false) => Filter::new().visible_to(caller),
        (Some(q), _) => {
            for (field, set) in [
                ("order", q.order.is_some()),
                ("limit", q.limit.is_some()),
                ("cursor", q.cursor.is_some()),
            ] {
                if set {
                    return Err(Error::invalid(
                        &format!("filter.{field}"),
                        "not a filter: a bulk delete takes every memory that matches",
                    ));
                }
            }
            listing::filter(caller, q)?
        }
    };
    if req.filter.is_some() && ids.is_empty() && !req.dry_run && !req.confirmed {
        return Err(Error::invalid(
            "confirmed",
            "must be true to delete by filter (or try it with dry_run: true)",
        ));
    }
    let reason = req
        .reason
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| "bulk delete through the API".into());
    let mut matched = Vec::new();
    if ids.is_empty() {
        matched = engine.store.find_rows(&filter, None).await?;
    } else {
        for part in ids.chunks(1000) {
            let f = filter.clone().ids(part);
            matched.extend(engine.store.find_rows(&f, None).await?);
        }
    }
    let found: HashSet<&str> = matched.iter().map(|c| c.id.as_str()).collect();
    let mut not_found: Vec<String> = ids
        .iter()
        .filter(|id| !found.contains(id.as_str()))
        .cloned()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    not_found.sort();
    let (kept, doomed): (Vec<_>, Vec<_>) = matched.into_iter().partition(|c| c.immutable);
    let mut kept_immutable: Vec<String> = kept.into_iter().map(|c| c.id).collect();
    kept_immutable.sort();
    let mut deleted_ids: Vec<String> = doomed.iter().map(|c| c.id.clone()).collect();
    deleted_ids.sort();
    let mut answer = BulkDeleted {
        dry_run: req.dry_run,
        deleted_count: deleted_ids.len(),
        deleted_ids,
        kept_immutable,
        not_found,
        snapshot: None,
        reason: reason.clone(),
    };
    if req.dry_run || doomed.is_empty() {
        return Ok(answer);
    }
    let (snapshot, _) = crate::service::snapshot::create_rotating(
        &engine.store,
        "pre-delete",
        engine.cfg.pre_delete_snapshots,
    )
    .await?;
    let mut by_stream: HashMap<&str, Vec<String>> = HashMap::new();
    for c in &doomed {
        by_stream.entry(&c.stream).or_default().push(c.id.clone());
    }
    for part in answer.deleted_ids.chunks(1000) {
        engine
            .store
            .delete(&Filter::new().ids(part).mutable())
            .await?;
    }
    let now = now_micros();
    for (stream, ids) in &by_stream {
        // History, feedback and the graph of what went go with it; one
        // history row per memory keeps the reason and the way back.
        engine
            .store
            .erase_traces(stream, Some(ids.as_slice()))
            .await?;
        let rows = ids
            .iter()
            .map(|id| HistoryRow {
                id: uuid::Uuid::new_v4().to_string(),
                stream: stream.to_string(),
                chunk_id: id.clone(),
                event: "deleted".into(),
                reason: format!("{reason} (snapshot {})", snapshot.name),
                related_ids: Vec::new(),
                created_at: now,
            })
            .collect();
        engine.store.add_history(rows).await?;
    }
    memory::reinstate_previous(engine, &doomed).await?;
    tracing::info!(count = doomed.len(), snapshot = %snapshot.name, %reason, "bulk delete");
    answer.snapshot = Some(snapshot.name);
    Ok(answer)
}
