//! Forgetting: after a delete, erase what the table files still keep of the
//! deleted rows. A Lance delete only marks rows; their values stay readable
//! through earlier versions (`as_of`, `chunks_as_of`) until those versions
//! are pruned, and for ever in a snapshot's tagged versions. Forgetting
//! rewrites every table's fragments that hold deleted rows, rebuilds the
//! full-text index, and removes every untagged version but the current one.
//!
//! Admin only: it takes time travel away from every stream (back to the
//! snapshots), and it holds every write while it runs.

use serde::Serialize;

use crate::core::error::{Error, Result};
use crate::core::Caller;
use crate::service::Services;
use crate::store::maintain::erase_deleted;
use crate::store::CHUNKS;

/// What a forget did.
#[derive(schemars::JsonSchema, Debug, Clone, Default, Serialize)]
pub struct Forgotten {
    /// Table versions removed, over every table.
    pub versions_removed: u64,
    pub bytes_removed: u64,
    /// Snapshots whose tagged versions still hold any of the forgotten
    /// memories (delete the snapshot to erase them there too).
    pub still_in_snapshots: Vec<String>,
}

/// Refuse anyone but an admin, before anything is deleted.
pub fn check(caller: &Caller) -> Result<()> {
    if caller.is_admin() {
        return Ok(());
    }
    Err(Error::Forbidden(
        "forget erases earlier table versions of every stream: it needs an admin key (a plain delete does not)".into(),
    ))
}

/// Erase every deleted row from the files of every table, then report which
/// snapshots still hold any of `ids`.
pub async fn erase(engine: &Services, caller: &Caller, ids: &[String]) -> Result<Forgotten> {
    check(caller)?;
    let mut report = Forgotten::default();
    {
        // No write may land between a compaction and its prune.
        let _gate = engine.store.write_gate.write().await;
        let _writes = engine.store.hold_writes().await;
        let mut tables: Vec<_> = engine.store.tables().into_iter().collect();
        tables.sort_by_key(|(name, _)| *name);
        for (name, table) in tables {
            let fts = (name == CHUNKS).then_some("content");
            let erased = erase_deleted(&table, fts).await?;
            report.versions_removed += erased.versions_removed;
            report.bytes_removed += erased.bytes_removed;
        }
    }
    report.still_in_snapshots = crate::service::snapshot::holding(&engine.store, ids).await?;
    tracing::info!(
        memories = ids.len(),
        versions = report.versions_removed,
        bytes = report.bytes_removed,
        snapshots = ?report.still_in_snapshots,
        "forgotten"
    );
    Ok(report)
}
