//! Listing and counting memories without SQL: `GET /v1/memories` (filters,
//! an order, cursor pages) and `GET /v1/memories/count`, over the streams the
//! caller may see.

use serde::{Deserialize, Serialize};

use base64::Engine as _;

use crate::core::error::{Error, Result};
use crate::core::time::parse_instant;
use crate::core::Caller;
use crate::service::Services;
use crate::store::Filter;

/// The query string of both routes (lists are comma-separated).
#[derive(schemars::JsonSchema, Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// One stream (else `streams`, else every stream the key sees).
    pub stream: Option<String>,
    pub streams: Option<String>,
    /// Memory types, any of them (`preference,decision`).
    pub types: Option<String>,
    pub tags: Option<String>,
    /// `any` (default) or `all` of `tags`.
    pub tags_mode: Option<String>,
    pub subject: Option<String>,
    pub entity: Option<String>,
    pub session_id: Option<String>,
    pub agent_id: Option<String>,
    pub user_id: Option<String>,
    /// Created at or after (a date, RFC 3339 or Unix seconds).
    pub created_after: Option<String>,
    /// Created before.
    pub created_before: Option<String>,
    /// Valid at this instant.
    pub valid_at: Option<String>,
    pub pinned: Option<bool>,
    #[schemars(range(min = 0, max = 1))]
    pub level: Option<i32>,
    /// Superseded versions too (default false).
    #[serde(default)]
    pub include_superseded: bool,
    /// `newest` (default), `oldest` or `importance`.
    pub order: Option<String>,
    /// Page size (50; at most 500).
    #[schemars(range(min = 1, max = 500))]
    pub limit: Option<usize>,
    /// The `next_cursor` of the page before.
    pub cursor: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Page {
    /// The memories, as `GET /v1/memories/{id}` shows them.
    pub memories: Vec<serde_json::Value>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Memories matching the filters in all.
    pub total: usize,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Count {
    pub count: usize,
}

fn list(s: &Option<String>) -> Vec<String> {
    s.as_deref()
        .unwrap_or("")
        .split(',')
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

/// A query-string instant: a date, RFC 3339, or Unix seconds.
fn instant(field: &str, v: &Option<String>) -> Result<Option<i64>> {
    v.as_ref()
        .map(|s| {
            let value = match s.trim().parse::<f64>() {
                Ok(secs) => serde_json::json!(secs),
                Err(_) => serde_json::Value::String(s.clone()),
            };
            parse_instant(field, &value)
        })
        .transpose()
}

/// The filter a query stands for, within the caller's streams.
pub(crate) fn filter(caller: &Caller, q: &ListQuery) -> Result<Filter> {
    let mut f = Filter::new();
    let streams = list(&q.streams);
    f = match (&q.stream, streams.is_empty()) {
        (Some(s), _) => f.stream(&caller.resolve_stream(Some(s))?),
        (None, false) => {
            let resolved = streams
                .iter()
                .map(|s| caller.resolve_stream(Some(s)))
                .collect::<Result<Vec<_>>>()?;
            f.in_streams(&resolved)
        }
        (None, true) => f.visible_to(caller),
    };
    let types: Vec<String> = list(&q.types).iter().map(|t| t.to_lowercase()).collect();
    if !types.is_empty() {
        f = f.memory_types(&types);
    }
    let tags = list(&q.tags);
    match q.tags_mode.as_deref().unwrap_or("any") {
        "any" => f = f.tagged_any(&tags),
        "all" => {
            for t in &tags {
                f = f.tagged(t);
            }
        }
        other => {
            return Err(Error::invalid(
                "tags_mode",
                format!("`{other}`: must be any or all"),
            ))
        }
    }
    if let Some(s) = q.subject.as_deref().filter(|s| !s.trim().is_empty()) {
        f = f.subject(s.trim());
    }
    if let Some(e) = q.entity.as_deref().filter(|s| !s.trim().is_empty()) {
        f = f.mentions(e.trim());
    }
    if let Some(s) = &q.session_id {
        f = f.session(s);
    }
    if let Some(a) = &q.agent_id {
        f = f.agent(a);
    }
    if let Some(u) = &q.user_id {
        f = f.user(u);
    }
    if let Some(t) = instant("created_after", &q.created_after)? {
        f = f.created_since(t);
    }
    if let Some(t) = instant("created_before", &q.created_before)? {
        f = f.created_before(t);
    }
    if let Some(t) = instant("valid_at", &q.valid_at)? {
        f = f.valid_at(t);
    }
    if let Some(p) = q.pinned {
        f = f.pinned(p);
    }
    if let Some(l) = q.level {
        if !(0..=1).contains(&l) {
            return Err(Error::invalid("level", "must be 0 or 1"));
        }
        f = f.level(l);
    }
    if !q.include_superseded {
        f = f.current();
    }
    Ok(f)
}

/// Where a page ends: the order's key of its last memory, and its id.
#[derive(Serialize, Deserialize)]
struct Cursor {
    order: String,
    key: f64,
    id: String,
}

fn encode(c: &Cursor) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(c).expect("a cursor serializes"))
}

fn decode(s: &str, order: &str) -> Result<Cursor> {
    let bad = || Error::invalid("cursor", "not a cursor this listing gave");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| bad())?;
    let c: Cursor = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    if c.order != order {
        return Err(Error::invalid(
            "cursor",
            "it belongs to a listing in another order",
        ));
    }
    Ok(c)
}

/// The query's order and page size, checked (the count checks them too, so
/// one query string is valid for both routes or for neither).
fn paging(q: &ListQuery) -> Result<(&str, usize)> {
    let order = q.order.as_deref().unwrap_or("newest");
    if !["newest", "oldest", "importance"].contains(&order) {
        return Err(Error::invalid(
            "order",
            format!("`{order}`: must be newest, oldest or importance"),
        ));
    }
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(Error::invalid("limit", "must be between 1 and 500"));
    }
    if let Some(c) = q.cursor.as_deref() {
        decode(c, order)?;
    }
    Ok((order, limit))
}

pub async fn count(engine: &Services, caller: &Caller, q: &ListQuery) -> Result<Count> {
    paging(q)?;
    Ok(Count {
        count: engine.store.count(&filter(caller, q)?).await?,
    })
}

pub async fn page(engine: &Services, caller: &Caller, q: &ListQuery) -> Result<Page> {
    let (order, limit) = paging(q)?;
    let f = filter(caller, q)?;
    let after = q.cursor.as_deref().map(|c| decode(c, order)).transpose()?;
    // Sort by the order's key, largest first (oldest: the time negated),
    // then by id, so equal keys page in a stable order.
    let key = |created: i64, importance: f32| match order {
        "newest" => created as f64,
        "oldest" => -(created as f64),
        _ => importance as f64,
    };
    let mut keys: Vec<(f64, String)> = engine
        .store
        .listing_keys(&f)
        .await?
        .into_iter()
        .map(|(id, created, importance)| (key(created, importance), id))
        .collect();
    keys.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let total = keys.len();
    let start = match &after {
        None => 0,
        Some(c) => keys.partition_point(|(k, id)| {
            k.total_cmp(&c.key)
                .reverse()
                .then_with(|| id.cmp(&c.id))
                .is_le()
        }),
    };
    let chosen: Vec<&(f64, String)> = keys.iter().skip(start).take(limit).collect();
    let ids: Vec<&str> = chosen.iter().map(|(_, id)| id.as_str()).collect();
    let mut rows: std::collections::HashMap<String, crate::core::model::Chunk> = engine
        .store
        .find(&Filter::new().ids(&ids), None)
        .await?
        .into_iter()
        .map(|c| (c.id.clone(), c))
        .collect();
    let memories = ids
        .iter()
        .filter_map(|id| rows.remove(*id))
        .map(|c| crate::service::edit::view(&c))
        .collect();
    let next_cursor = (start + chosen.len() < total)
        .then(|| chosen.last())
        .flatten()
        .map(|(k, id)| {
            encode(&Cursor {
                order: order.to_string(),
                key: *k,
                id: id.clone(),
            })
        });
    Ok(Page {
        memories,
        next_cursor,
        total,
    })
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct StreamInfo {
    pub stream: String,
    /// The namespace labels that name it.
    pub labels: Vec<String>,
    /// Current memories (superseded versions not counted).
    pub memories: usize,
    /// RFC 3339; absent for a stream with no memories.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_write: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Streams {
    pub streams: Vec<StreamInfo>,
}

/// `GET /v1/streams`: every stream the key may see that holds memories (and
/// each stream a scoped key is granted, even empty), with counts.
pub async fn streams(engine: &Services, caller: &Caller) -> Result<Streams> {
    let mut tallies = engine
        .store
        .stream_tallies(&Filter::new().visible_to(caller).current())
        .await?;
    for s in caller.streams.iter().flatten() {
        tallies.entry(s.clone()).or_insert((0, 0));
    }
    let streams = tallies
        .into_iter()
        .map(|(stream, (memories, last))| StreamInfo {
            labels: caller
                .namespaces
                .iter()
                .filter(|(_, s)| **s == stream)
                .map(|(label, _)| label.clone())
                .collect(),
            last_write: (memories > 0).then(|| crate::core::time::to_rfc3339(last)),
            stream,
            memories,
        })
        .collect();
    Ok(Streams { streams })
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct TagCount {
    pub tag: String,
    pub count: usize,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Tags {
    /// Most used first.
    pub tags: Vec<TagCount>,
}

/// `GET /v1/tags`: the tags of the memories the listing's filters match,
/// with how many carry each.
pub async fn tags(engine: &Services, caller: &Caller, q: &ListQuery) -> Result<Tags> {
    paging(q)?;
    let counts = engine.store.tag_counts(&filter(caller, q)?).await?;
    let mut tags: Vec<TagCount> = counts
        .into_iter()
        .map(|(tag, count)| TagCount { tag, count })
        .collect();
    tags.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.tag.cmp(&b.tag)));
    Ok(Tags { tags })
}
