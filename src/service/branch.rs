//! Branches of a stream (Memoria's): a branch is the stream
//! `<base>~<name>`, made by copying the base's current memories into it —
//! vectors, entities and links included, nothing re-embedded — so it costs
//! one copy of the stream's rows. It is written and searched like any stream
//! (a key that may use the base may use its branches). Each copy remembers
//! the memory it came from, so a diff against the base needs no second
//! history: what the branch added, changed and removed. A merge stores the
//! additions in the base through the store pipeline, makes each change a new
//! version of the base memory, and (`mirror`) deletes what the branch
//! removed; a drop purges the branch's stream.
//!
//! Why rows and not Lance's own branching: one `chunks` table holds every
//! stream, and Lance's tags, versions and shallow clones are of a whole
//! table, so a branch of one stream would be a branch of every stream.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::core::caller::BRANCH_SEP;
use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Chunk, Micros};
use crate::core::time::to_rfc3339;
use crate::core::Caller;
use crate::service::Services;
use crate::store::relations::RelationRow;
use crate::store::Filter;

/// The `extraction_meta` key a copy keeps its origin under.
const ORIGIN: &str = "branch";

/// Rows copied per commit.
const COPY_BATCH: usize = 1000;

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewBranch {
    /// 1–64 letters, digits, `_`, `-` or `.`.
    #[schemars(regex(pattern = r"^[A-Za-z0-9_.-]{1,64}$"))]
    pub name: String,
    /// The stream to branch (default: the key's default stream).
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BranchQuery {
    /// The base stream (default: the key's default stream).
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Branch {
    pub name: String,
    /// The stream it was made from.
    pub base: String,
    /// Its own stream (`<base>~<name>`): write and search it by this name.
    pub stream: String,
    /// Its current memories.
    pub memories: usize,
    /// When it was made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Branches {
    pub branches: Vec<Branch>,
}

/// One memory of a diff, as `GET /v1/memories/{id}` shows it.
type View = serde_json::Value;

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Changed {
    /// The base's memory.
    pub base: View,
    /// The branch's text for it.
    pub branch: View,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Diff {
    pub branch: Branch,
    /// In the branch, not from the base.
    pub added: Vec<View>,
    /// From the base, with another text in the branch.
    pub changed: Vec<Changed>,
    /// In the base when the branch was made, gone from the branch.
    pub removed: Vec<View>,
    /// Copies whose base memory was changed or deleted in the base since the
    /// branch was made: a merge leaves them alone.
    pub conflicts: Vec<View>,
}

#[derive(schemars::JsonSchema, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeRequest {
    /// The base stream (default: the key's default stream).
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
    /// `append` (default): the branch's additions and changes go to the
    /// base; `mirror`: its removals too.
    #[schemars(regex(pattern = r"^(append|mirror)$"))]
    pub strategy: Option<String>,
    /// Answer what would change; change nothing (default false).
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Merged {
    pub branch: String,
    pub base: String,
    pub strategy: String,
    pub dry_run: bool,
    /// New memories of the base (or, dry, the branch memories that would be).
    pub added: Vec<String>,
    /// New versions in the base (dry: the base memories that would change).
    pub changed: Vec<String>,
    /// Base memories deleted (`mirror`).
    pub removed: Vec<String>,
    /// Left alone: changed in the base since the branch was made.
    pub conflicts: usize,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Dropped {
    pub branch: String,
    pub stream: String,
    pub deleted_count: usize,
}

/// Where a copy came from.
struct Origin {
    of: String,
    at: Micros,
}

fn origin(c: &Chunk, base: &str) -> Option<Origin> {
    let o = c.annotation(ORIGIN)?;
    (o["base"].as_str() == Some(base)).then(|| Origin {
        of: o["of"].as_str().unwrap_or_default().to_string(),
        at: o["at"].as_i64().unwrap_or(0),
    })
}

fn check_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "name",
            "1-64 letters, digits, `_`, `-` or `.`",
        ))
    }
}

/// The base stream and the branch's stream, checked.
fn streams(caller: &Caller, base: Option<&str>, name: &str) -> Result<(String, String)> {
    check_name(name)?;
    let base = caller.resolve_stream(base)?;
    let stream = format!("{base}{BRANCH_SEP}{name}");
    if stream.len() > 256 {
        return Err(Error::invalid(
            "name",
            "the branch's stream name is over 256 characters",
        ));
    }
    Ok((base, stream))
}

async fn current(engine: &Services, stream: &str) -> Result<Vec<Chunk>> {
    Ok(engine
        .store
        .find(&Filter::new().stream(stream).current(), None)
        .await?)
}

/// `POST /v1/branches`: copy the base's current memories (and their links)
/// into the branch's stream.
pub async fn create(engine: &Services, caller: &Caller, req: NewBranch) -> Result<Branch> {
    let (base, stream) = streams(caller, req.stream.as_deref(), &req.name)?;
    if engine.store.count(&Filter::new().stream(&stream)).await? > 0 {
        return Err(Error::Conflict(format!(
            "branch `{}` of `{base}` exists",
            req.name
        )));
    }
    let rows = current(engine, &base).await?;
    if rows.is_empty() {
        return Err(Error::Conflict(format!(
            "stream `{base}` holds no memories to branch"
        )));
    }
    let at = now_micros();
    let mut ids: HashMap<String, String> = HashMap::with_capacity(rows.len());
    let copies: Vec<Chunk> = rows
        .into_iter()
        .map(|mut c| {
            let id = uuid::Uuid::new_v4().to_string();
            ids.insert(c.id.clone(), id.clone());
            c.annotate(ORIGIN, json!({"of": c.id, "base": base, "at": at}));
            c.id = id;
            c.stream = stream.clone();
            c.supersedes = None;
            c.access_count = 0;
            c.last_accessed_at = None;
            c
        })
        .collect();
    let memories = copies.len();
    let mut copies = copies.into_iter().peekable();
    while copies.peek().is_some() {
        let fresh: Vec<Chunk> = copies.by_ref().take(COPY_BATCH).collect();
        engine
            .store
            .commit_with_side_effects(fresh, Vec::new())
            .await?;
    }
    let links: Vec<RelationRow> = engine
        .store
        .relations(&Filter::new().stream(&base), None)
        .await?
        .into_iter()
        .filter_map(|r| {
            Some(RelationRow {
                id: uuid::Uuid::new_v4().to_string(),
                stream: stream.clone(),
                from_id: ids.get(&r.from_id)?.clone(),
                to_id: ids.get(&r.to_id)?.clone(),
                ..r
            })
        })
        .collect();
    engine.store.add_relations(links).await?;
    crate::service::maintenance::build_graph(
        engine,
        caller,
        crate::service::maintenance::ScopeRequest {
            stream: Some(stream.clone()),
        },
    )
    .await?;
    tracing::info!(%base, branch = %req.name, memories, "stream branched");
    Ok(Branch {
        name: req.name,
        base,
        stream,
        memories,
        created_at: Some(to_rfc3339(at)),
    })
}

/// The branches of one base, from the streams that hold memories.
async fn branches_of(engine: &Services, base: &str) -> Result<Vec<Branch>> {
    let prefix = format!("{base}{BRANCH_SEP}");
    let tallies = engine
        .store
        .stream_tallies(&Filter::new().current())
        .await?;
    let mut out = Vec::new();
    for (stream, (memories, _)) in tallies {
        let Some(name) = stream.strip_prefix(&prefix) else {
            continue;
        };
        if name.contains(BRANCH_SEP) {
            continue; // a branch of a branch belongs to that branch
        }
        let first = engine
            .store
            .find(&Filter::new().stream(&stream).current(), Some(1))
            .await?;
        out.push(Branch {
            name: name.to_string(),
            base: base.to_string(),
            created_at: first
                .first()
                .and_then(|c| origin(c, base))
                .map(|o| to_rfc3339(o.at)),
            stream,
            memories,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// `GET /v1/branches`: the base's branches.
pub async fn list(engine: &Services, caller: &Caller, q: &BranchQuery) -> Result<Branches> {
    let base = caller.resolve_stream(q.stream.as_deref())?;
    Ok(Branches {
        branches: branches_of(engine, &base).await?,
    })
}

async fn find(
    engine: &Services,
    caller: &Caller,
    base: Option<&str>,
    name: &str,
) -> Result<Branch> {
    let (base, stream) = streams(caller, base, name)?;
    branches_of(engine, &base)
        .await?
        .into_iter()
        .find(|b| b.stream == stream)
        .ok_or_else(|| Error::NotFound(format!("`{base}` has no branch `{name}`")))
}

/// What a branch did, memory by memory (chunks, for a merge).
struct Delta {
    branch: Branch,
    added: Vec<Chunk>,
    changed: Vec<(Chunk, Chunk)>,
    removed: Vec<Chunk>,
    conflicts: Vec<Chunk>,
}

async fn delta(
    engine: &Services,
    caller: &Caller,
    base: Option<&str>,
    name: &str,
) -> Result<Delta> {
    let branch = find(engine, caller, base, name).await?;
    let theirs = current(engine, &branch.stream).await?;
    let ours: HashMap<String, Chunk> = current(engine, &branch.base)
        .await?
        .into_iter()
        .map(|c| (c.id.clone(), c))
        .collect();
    let mut out = Delta {
        added: Vec::new(),
        changed: Vec::new(),
        removed: Vec::new(),
        conflicts: Vec::new(),
        branch,
    };
    let mut kept: HashSet<String> = HashSet::new();
    let mut made = None;
    for c in theirs {
        match origin(&c, &out.branch.base) {
            None => out.added.push(c),
            Some(o) => {
                made = made.or(Some(o.at));
                kept.insert(o.of.clone());
                match ours.get(&o.of) {
                    Some(b) if b.content == c.content => {}
                    Some(b) => out.changed.push((b.clone(), c)),
                    None => out.conflicts.push(c),
                }
            }
        }
    }
    // In the base when the branch was made and no copy of it left.
    let made = made.unwrap_or(0);
    let mut removed: Vec<Chunk> = ours
        .into_values()
        .filter(|b| !kept.contains(&b.id) && b.created_at <= made)
        .collect();
    removed.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    out.removed = removed;
    Ok(out)
}

/// `GET /v1/branches/{name}/diff`.
pub async fn diff(engine: &Services, caller: &Caller, name: &str, q: &BranchQuery) -> Result<Diff> {
    let d = delta(engine, caller, q.stream.as_deref(), name).await?;
    let view = crate::service::edit::view;
    Ok(Diff {
        added: d.added.iter().map(view).collect(),
        changed: d
            .changed
            .iter()
            .map(|(b, c)| Changed {
                base: view(b),
                branch: view(c),
            })
            .collect(),
        removed: d.removed.iter().map(view).collect(),
        conflicts: d.conflicts.iter().map(view).collect(),
        branch: d.branch,
    })
}

/// A branch memory as a store request into the base.
fn to_base(c: &Chunk, base: &str) -> crate::service::memory::StoreRequest {
    let time = |t: Option<Micros>| t.map(|t| json!(to_rfc3339(t)));
    crate::service::memory::StoreRequest {
        content: c.content.clone(),
        stream: Some(base.to_string()),
        level: Some(c.level),
        metadata: c
            .metadata
            .as_deref()
            .and_then(|m| serde_json::from_str(m).ok()),
        user_id: c.user_id.clone(),
        app_id: c.app_id.clone(),
        agent_id: c.agent_id.clone(),
        session_id: c.session_id.clone(),
        title: c.title.clone(),
        memory_type: Some(c.memory_type.clone()),
        subject: c.subject.clone(),
        source: c.source.clone(),
        tags: c.tags.clone(),
        importance: Some(c.importance.clamp(0.0, 10.0)),
        confidence: Some(c.confidence.clamp(0.0, 1.0)),
        pinned: Some(c.pinned),
        immutable: Some(c.immutable),
        expires_at: time(c.expires_at),
        valid_from: time(c.valid_from),
        valid_until: time(c.valid_until),
        ..Default::default()
    }
}

/// `POST /v1/branches/{name}/merge`. Afterwards each merged branch memory
/// points at its counterpart in the base, so merging again changes nothing.
pub async fn merge(
    engine: &Services,
    caller: &Caller,
    name: &str,
    req: MergeRequest,
) -> Result<Merged> {
    let strategy = req.strategy.as_deref().unwrap_or("append").to_string();
    if !["append", "mirror"].contains(&strategy.as_str()) {
        return Err(Error::invalid(
            "strategy",
            format!("`{strategy}`: must be append or mirror"),
        ));
    }
    let d = delta(engine, caller, req.stream.as_deref(), name).await?;
    let base = d.branch.base.clone();
    let mirror = strategy == "mirror";
    let ids = |cs: &[Chunk]| cs.iter().map(|c| c.id.clone()).collect::<Vec<_>>();
    if req.dry_run {
        return Ok(Merged {
            branch: name.to_string(),
            base,
            strategy,
            dry_run: true,
            added: ids(&d.added),
            changed: d.changed.iter().map(|(b, _)| b.id.clone()).collect(),
            removed: if mirror { ids(&d.removed) } else { Vec::new() },
            conflicts: d.conflicts.len(),
        });
    }
    let reason = format!("merged from branch `{name}`");
    // The branch memory → the base memory it now stands for.
    let mut points: HashMap<String, String> = HashMap::new();
    let mut added = Vec::new();
    if !d.added.is_empty() {
        let answer = crate::service::bulk::store(
            engine,
            caller,
            crate::service::bulk::BatchStoreRequest {
                memories: d.added.iter().map(|c| to_base(c, &base)).collect(),
                wait: None,
            },
        )
        .await?;
        for (c, r) in d.added.iter().zip(answer.results) {
            if let (Some(id), None) = (r.id, r.error) {
                points.insert(c.id.clone(), id.clone());
                if r.status != "duplicate" {
                    added.push(id);
                }
            }
        }
    }
    let mut changed = Vec::new();
    for (b, c) in &d.changed {
        let done = crate::service::edit::edit(
            engine,
            caller,
            &b.id,
            crate::service::edit::EditRequest {
                content: Some(c.content.clone()),
                reason: Some(reason.clone()),
                ..Default::default()
            },
        )
        .await;
        match done {
            Ok(e) => {
                points.insert(c.id.clone(), e.id.clone());
                changed.push(e.id);
            }
            // Immutable in the base: left as it is.
            Err(Error::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
    }
    let mut removed = Vec::new();
    if mirror {
        for b in d.removed.iter().filter(|b| !b.immutable) {
            crate::service::memory::delete(engine, caller, &b.id, Some(&base)).await?;
            removed.push(b.id.clone());
        }
    }
    let at = now_micros();
    let base_name = base.clone();
    engine
        .store
        .modify(
            points.keys().cloned().collect(),
            Box::new(move |c: &mut Chunk| match points.get(&c.id) {
                Some(of) => {
                    c.annotate(ORIGIN, json!({"of": of, "base": base_name, "at": at}));
                    true
                }
                None => false,
            }),
        )
        .await?;
    Ok(Merged {
        branch: name.to_string(),
        base,
        strategy,
        dry_run: false,
        added,
        changed,
        removed,
        conflicts: d.conflicts.len(),
    })
}

/// `DELETE /v1/branches/{name}`: purge the branch's stream.
pub async fn drop(
    engine: &Services,
    caller: &Caller,
    name: &str,
    q: &BranchQuery,
) -> Result<Dropped> {
    let branch = find(engine, caller, q.stream.as_deref(), name).await?;
    let done = crate::service::memory::purge(
        engine,
        caller,
        crate::service::memory::PurgeRequest {
            stream: Some(branch.stream.clone()),
            dry_run: false,
            confirmed: true,
            forget: false,
        },
    )
    .await?;
    engine
        .checkouts
        .lock()
        .retain(|_, stream| *stream != branch.stream);
    Ok(Dropped {
        branch: branch.name,
        stream: branch.stream,
        deleted_count: done.deleted_count,
    })
}

/// The branch each key works in through Memoria's checkout: this process's
/// memory (a restart, or another process, starts on the base stream).
#[derive(Default)]
pub struct Checkouts(std::sync::Mutex<HashMap<String, String>>);

impl Checkouts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The branch stream `caller`'s key has checked out, if any.
pub fn checked_out(engine: &Services, caller: &Caller) -> Option<String> {
    engine.checkouts.lock().get(&caller.key).cloned()
}

/// Check out branch `name` of the key's default stream for the key (`main`
/// goes back to the stream itself); the branch's stream, if one.
pub async fn checkout(engine: &Services, caller: &Caller, name: &str) -> Result<Option<String>> {
    let stream = match name {
        "main" => None,
        _ => Some(find(engine, caller, None, name).await?.stream),
    };
    let mut all = engine.checkouts.lock();
    match &stream {
        Some(s) => all.insert(caller.key.clone(), s.clone()),
        None => all.remove(&caller.key),
    };
    Ok(stream)
}
