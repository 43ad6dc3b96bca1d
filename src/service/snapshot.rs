//! Snapshots: a name for the current version of every memory table (a Lance
//! tag on each), kept by `compact`'s pruning for as long as the tag exists.
//! A rollback puts every table back to its tagged version as a *new* version
//! (later versions stay readable through `as_of` until pruned), with the
//! pipeline worker and the scheduled jobs held off meanwhile: writes accepted
//! during a rollback wait on the bus and land after it, and every other write
//! to these tables (a delete, feedback, an access-counter flush, the LLM entity
//! queue) waits for the rollback to end.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::core::error::{Error, Result};
use crate::service::Services;
use crate::store::{Store, CHUNKS, EDGES, ENTITIES, FEEDBACK, HISTORY, RELATIONS};

/// The tables a snapshot covers: the memories, the links between them and
/// everything derived from them.
pub const TABLES: &[&str] = &[CHUNKS, ENTITIES, EDGES, HISTORY, FEEDBACK, RELATIONS];

/// Tables added after snapshots existed: a snapshot older than the table has
/// no tag on it, and rolling back to it empties the table (it held nothing
/// then).
const LATER_TABLES: &[&str] = &[RELATIONS];

#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct Snapshot {
    pub name: String,
    /// RFC 3339; when the tag was made.
    pub created_at: Option<String>,
    /// The tagged version of each table.
    pub versions: BTreeMap<String, u64>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Rollback {
    pub name: String,
    /// Each table's version before the rollback (still readable with `as_of`).
    pub versions_before: BTreeMap<String, u64>,
    /// The new version each table now has, holding the snapshot's rows.
    pub versions_after: BTreeMap<String, u64>,
}

fn lance(e: lancedb::Error) -> Error {
    Error::Internal(format!("storage error: {e}"))
}

/// Snapshot names: 1–64 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "name",
            "1–64 characters of A-Z, a-z, 0-9, '.', '_' or '-', starting with a letter or digit",
        ))
    }
}

/// A default name from the time: `<prefix>-YYYYMMDD-HHMMSS`.
pub fn timestamped(prefix: &str, at: crate::core::model::Micros) -> String {
    let stamp: String = crate::core::time::to_rfc3339(at)
        .chars()
        .take(19)
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .map(|c| if c == 'T' { '-' } else { c })
        .collect();
    format!("{prefix}-{stamp}")
}

/// Tag the current version of every table `name`.
pub async fn create(store: &Store, name: &str) -> Result<Snapshot> {
    check_name(name)?;
    let tables = store.tables();
    if tables[CHUNKS]
        .tags()
        .await
        .map_err(lance)?
        .list()
        .await
        .map_err(lance)?
        .contains_key(name)
    {
        return Err(Error::Conflict(format!("a snapshot named `{name}` exists")));
    }
    let mut versions = BTreeMap::new();
    for t in TABLES {
        let table = &tables[t];
        let version = table.version().await.map_err(lance)?;
        table
            .tags()
            .await
            .map_err(lance)?
            .create(name, version)
            .await
            .map_err(lance)?;
        versions.insert(t.to_string(), version);
    }
    Ok(Snapshot {
        name: name.to_string(),
        created_at: Some(crate::core::time::to_rfc3339(
            crate::core::model::now_micros(),
        )),
        versions,
    })
}

/// The snapshots named `<prefix>-…`, oldest first, and how many of them
/// go when one more is made and only the newest `keep` stay.
async fn excess(store: &Store, prefix: &str, keep: usize) -> Result<Vec<String>> {
    let mine: Vec<String> = list(store)
        .await?
        .into_iter()
        .filter(|s| s.name.starts_with(&format!("{prefix}-")))
        .map(|s| s.name)
        .collect();
    let n = (mine.len() + 1).saturating_sub(keep.max(1));
    Ok(mine.into_iter().take(n).collect())
}

/// What making a rotating snapshot would do (nothing is changed): its name
/// and the older snapshots of its prefix it would drop.
pub async fn plan_rotating(
    store: &Store,
    prefix: &str,
    keep: usize,
) -> Result<(String, Vec<String>)> {
    let name = timestamped(prefix, crate::core::model::now_micros());
    check_name(&name)?;
    Ok((name, excess(store, prefix, keep).await?))
}

/// Snapshot every table as `<prefix>-YYYYMMDD-HHMMSS` (a suffix `-2`, `-3`…
/// when that second is taken), then drop the oldest snapshots of the prefix
/// beyond `keep`; snapshots of other names are never dropped. The new
/// snapshot and the names dropped.
pub async fn create_rotating(
    store: &Store,
    prefix: &str,
    keep: usize,
) -> Result<(Snapshot, Vec<String>)> {
    let (base, dropped) = plan_rotating(store, prefix, keep).await?;
    let mut created = None;
    for n in 1..=20 {
        let name = match n {
            1 => base.clone(),
            n => format!("{base}-{n}"),
        };
        match create(store, &name).await {
            Ok(s) => {
                created = Some(s);
                break;
            }
            Err(Error::Conflict(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    let created = created
        .ok_or_else(|| Error::Conflict(format!("snapshot names `{base}-*` are all taken")))?;
    for old in &dropped {
        delete(store, old).await?;
    }
    Ok((created, dropped))
}

/// Every snapshot, oldest first.
pub async fn list(store: &Store) -> Result<Vec<Snapshot>> {
    let tables = store.tables();
    let mut by_name: BTreeMap<String, Snapshot> = BTreeMap::new();
    for t in TABLES {
        let tags = tables[t]
            .tags()
            .await
            .map_err(lance)?
            .list()
            .await
            .map_err(lance)?;
        for (name, tag) in tags {
            let s = by_name.entry(name.clone()).or_insert_with(|| Snapshot {
                name,
                created_at: None,
                versions: BTreeMap::new(),
            });
            if *t == CHUNKS {
                s.created_at = tag
                    .created_at
                    .map(|c| c.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
            }
            s.versions.insert(t.to_string(), tag.version);
        }
    }
    // A tag on some tables only is not a snapshot (a create cut short).
    let mut all: Vec<Snapshot> = by_name
        .into_values()
        .filter(|s| {
            TABLES
                .iter()
                .all(|t| s.versions.contains_key(*t) || LATER_TABLES.contains(t))
        })
        .collect();
    all.sort_by(|a, b| (&a.created_at, &a.name).cmp(&(&b.created_at, &b.name)));
    Ok(all)
}

async fn find(store: &Store, name: &str) -> Result<Snapshot> {
    check_name(name)?;
    list(store)
        .await?
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| Error::NotFound(format!("no snapshot named `{name}`")))
}

/// The snapshots whose `chunks` version holds any of `ids`.
pub async fn holding(store: &Store, ids: &[String]) -> Result<Vec<String>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut names = Vec::new();
    for s in list(store).await? {
        let table = store
            .chunks_as_of(crate::store::AsOf::Version(s.versions[CHUNKS]))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        let mut held = 0;
        for part in ids.chunks(1000) {
            held +=
                crate::store::count_where(&table, &crate::store::Filter::new().ids(part)).await?;
        }
        if held > 0 {
            names.push(s.name);
        }
    }
    Ok(names)
}

/// Remove a snapshot's tags (its versions become prunable).
pub async fn delete(store: &Store, name: &str) -> Result<()> {
    let snapshot = find(store, name).await?;
    let tables = store.tables();
    for t in snapshot.versions.keys() {
        tables[t.as_str()]
            .tags()
            .await
            .map_err(lance)?
            .delete(name)
            .await
            .map_err(lance)?;
    }
    Ok(())
}

/// Put every table back to the snapshot's version.
pub async fn rollback(engine: &Services, name: &str) -> Result<Rollback> {
    let snapshot = find(&engine.store, name).await?;
    let was_paused = engine.workers.get();
    engine.workers.set(true);
    let result = async {
        let _gate = engine.store.write_gate.write().await;
        // Deletes, feedback, access-counter flushes, the LLM entity queue and
        // the jobs write outside the pipeline: each of their writes waits here.
        let _writes = engine.store.hold_writes().await;
        let tables = engine.store.tables();
        let mut report = Rollback {
            name: name.to_string(),
            versions_before: BTreeMap::new(),
            versions_after: BTreeMap::new(),
        };
        for t in TABLES {
            let table = &tables[t];
            report
                .versions_before
                .insert(t.to_string(), table.version().await.map_err(lance)?);
            let Some(version) = snapshot.versions.get(*t).copied() else {
                // Made before this table existed.
                table.delete("true").await.map_err(lance)?;
                report
                    .versions_after
                    .insert(t.to_string(), table.version().await.map_err(lance)?);
                continue;
            };
            table.checkout(version).await.map_err(lance)?;
            let restored = table.restore().await;
            if restored.is_err() {
                // Never leave the shared handle checked out (read-only).
                let _ = table.checkout_latest().await;
            }
            restored.map_err(lance)?;
            report
                .versions_after
                .insert(t.to_string(), table.version().await.map_err(lance)?);
        }
        engine.store.rolled_back().await?;
        Ok(report)
    }
    .await;
    engine.workers.set(was_paused);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_stamped() {
        assert!(check_name("before-migration_2.1").is_ok());
        for bad in ["", "-x", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        let at = crate::core::time::parse_instant_str("2026-11-22T09:05:07Z").unwrap();
        assert_eq!(timestamped("auto", at), "auto-20261122-090507");
        assert!(check_name(&timestamped("auto", at)).is_ok());
    }
}
