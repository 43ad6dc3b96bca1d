//! Keeping the tables in shape without an operator. Every commit adds a Lance
//! fragment; left alone, thousands of small writes make thousands of fragments
//! and every read pays for each one. So:
//!
//! - the chunk writer merges small fragments every `compact_every_commits`
//!   commits, inside its own task (no write of its own can race it);
//! - a maintainer task looks at every other table on an interval and merges
//!   the small fragments of any that has gathered too many;
//! - the `compact` job runs the full pass (merge into large fragments, fold new
//!   rows into the indexes, prune old versions).
//!
//! Fragments are merged up to `target_rows_per_fragment` rows, so a routine
//! merge rewrites only the recent small fragments, never the whole table.
//! A commit conflict (another process, a concurrent update) is retried.

use std::time::Duration;

use lancedb::table::{CompactionOptions, OptimizeAction};
use lancedb::Table;

use super::Result;

/// How the store keeps its tables in shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Maintenance {
    /// The chunk writer merges small fragments after this many commits (0 = never).
    pub compact_every_commits: usize,
    /// A routine merge builds fragments of up to this many rows.
    pub target_rows_per_fragment: usize,
    /// How often the other tables are checked (zero = never).
    pub check_every: Duration,
    /// A table with more fragments than this is merged.
    pub max_fragments: usize,
}

impl Default for Maintenance {
    fn default() -> Self {
        Maintenance {
            compact_every_commits: 32,
            target_rows_per_fragment: 8192,
            check_every: Duration::from_secs(10),
            max_fragments: 32,
        }
    }
}

impl Maintenance {
    /// No routine maintenance (the `compact` job still runs on demand).
    pub fn off() -> Maintenance {
        Maintenance {
            compact_every_commits: 0,
            check_every: Duration::ZERO,
            ..Maintenance::default()
        }
    }
}

/// Attempts of one maintenance step before its error is reported.
const ATTEMPTS: u32 = 5;

/// True for the errors Lance asks to retry: a concurrent commit won.
fn is_conflict(e: &lancedb::Error) -> bool {
    let text = e.to_string().to_lowercase();
    text.contains("conflict") || text.contains("retryable")
}

/// Run `step` until it succeeds, retrying commit conflicts with a growing pause.
async fn retrying<F, Fut, T>(what: &str, mut step: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = lancedb::Result<T>>,
{
    let mut pause = Duration::from_millis(20);
    for attempt in 1..=ATTEMPTS {
        match step().await {
            Ok(v) => return Ok(v),
            Err(e) if attempt < ATTEMPTS && is_conflict(&e) => {
                tracing::debug!(%what, attempt, error = %e, "maintenance conflict; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            Err(e) => return Err(e.into()),
        }
    }
    unreachable!("the last attempt returns")
}

/// Merge the small fragments of `table` into fragments of up to
/// `target_rows` rows (a no-op when there is nothing to merge).
pub async fn merge_small_fragments(table: &Table, target_rows: usize) -> Result<()> {
    retrying("compact", || {
        table.optimize(OptimizeAction::Compact {
            options: CompactionOptions {
                target_rows_per_fragment: target_rows,
                ..Default::default()
            },
            remap_options: None,
        })
    })
    .await?;
    Ok(())
}

/// Fold rows written since the last refresh into the table's indexes.
pub async fn refresh_indexes(table: &Table) -> Result<()> {
    retrying("index", || {
        table.optimize(OptimizeAction::Index(Default::default()))
    })
    .await?;
    Ok(())
}

/// Drop every version of `table` but the latest that no tag holds (a
/// throwaway store's housekeeping: no `as_of` reaches back afterwards).
pub async fn prune_all_versions(table: &Table) -> Result<()> {
    retrying("prune", || {
        table.optimize(OptimizeAction::Prune {
            older_than: Some(chrono::Duration::zero()),
            delete_unverified: None,
            error_if_tagged_old_versions: Some(false),
        })
    })
    .await?;
    Ok(())
}

/// What a full pass did to one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PassReport {
    pub rows: usize,
    pub fragments_before: usize,
    pub fragments_after: usize,
    pub small_fragments_after: usize,
}

/// The full pass of the `compact` job: merge into large fragments, refresh
/// the indexes, prune versions older than `prune_older_than` that no tag
/// holds. With `dry_run`, only report.
pub async fn full_pass(
    table: &Table,
    prune_older_than: Option<chrono::Duration>,
    dry_run: bool,
) -> Result<PassReport> {
    let before = table.stats().await?;
    if !dry_run {
        merge_small_fragments(table, CompactionOptions::default().target_rows_per_fragment).await?;
        refresh_indexes(table).await?;
        retrying("prune", || {
            table.optimize(OptimizeAction::Prune {
                older_than: prune_older_than,
                delete_unverified: None,
                error_if_tagged_old_versions: Some(false),
            })
        })
        .await?;
    }
    let after = table.stats().await?;
    Ok(PassReport {
        rows: after.num_rows,
        fragments_before: before.fragment_stats.num_fragments,
        fragments_after: after.fragment_stats.num_fragments,
        small_fragments_after: after.fragment_stats.num_small_fragments,
    })
}

/// What [`erase_deleted`] removed from one table's files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Erased {
    /// Table versions removed (every one but the current and the tagged).
    pub versions_removed: u64,
    pub bytes_removed: u64,
}

/// Erase deleted rows from `table`'s files. A Lance delete only marks rows:
/// their values stay in the data files (and the words of a text in the
/// full-text index) for as long as any version refers to them. So: rewrite
/// every fragment holding a deleted row (compaction with the deletions
/// materialised, whatever their share), rebuild the full-text index when
/// the table has one (`fts_column`), then remove every version but the
/// current one that no tag (snapshot) holds, with the files only they used.
/// Files not referenced by any version are left to the `compact` job's age
/// rule, so a write under way elsewhere never loses its files.
pub async fn erase_deleted(table: &Table, fts_column: Option<&str>) -> Result<Erased> {
    retrying("compact", || {
        table.optimize(OptimizeAction::Compact {
            options: CompactionOptions {
                materialize_deletions: true,
                materialize_deletions_threshold: 0.0,
                ..Default::default()
            },
            remap_options: None,
        })
    })
    .await?;
    if let Some(column) = fts_column {
        retrying("full-text index", || async {
            table
                .create_index(&[column], lancedb::index::Index::FTS(Default::default()))
                .replace(true)
                .execute()
                .await
        })
        .await?;
    }
    refresh_indexes(table).await?;
    let stats = retrying("prune", || {
        table.optimize(OptimizeAction::Prune {
            older_than: Some(chrono::Duration::zero()),
            delete_unverified: Some(false),
            error_if_tagged_old_versions: Some(false),
        })
    })
    .await?;
    let removed = stats.prune.unwrap_or_default();
    Ok(Erased {
        versions_removed: removed.old_versions,
        bytes_removed: removed.bytes_removed,
    })
}

/// Check `tables` every `m.check_every` and merge the small fragments of any
/// with more than `m.max_fragments`; runs until aborted.
pub async fn watch(tables: Vec<(&'static str, Table)>, m: Maintenance) {
    if m.check_every.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(m.check_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for (name, table) in &tables {
            let fragments = match table.stats().await {
                Ok(s) => s.fragment_stats.num_fragments,
                Err(e) => {
                    tracing::debug!(table = name, error = %e, "table stats unavailable");
                    continue;
                }
            };
            if fragments <= m.max_fragments {
                continue;
            }
            let started = std::time::Instant::now();
            match merge_small_fragments(table, m.target_rows_per_fragment).await {
                Ok(()) => {
                    tracing::debug!(table = name, fragments, took = ?started.elapsed(), "small fragments merged")
                }
                Err(e) => {
                    tracing::warn!(table = name, error = %e, "fragment merge failed; will retry")
                }
            }
        }
    }
}

/// Aborts its task when dropped (the store's maintainer dies with the store).
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Chunk;
    use crate::store::Store;

    async fn fragments(table: &Table) -> usize {
        table.stats().await.unwrap().fragment_stats.num_fragments
    }

    /// A store of 8-dimensional vectors in `dir`, kept up by `m`.
    async fn open(dir: &std::path::Path, m: Maintenance) -> Store {
        Store::open_with(&crate::store::Location::local(dir), 8, 100, None, m)
            .await
            .unwrap()
    }

    /// `n` memories, one commit each.
    async fn commit_one_by_one(store: &Store, n: usize) {
        for i in 0..n {
            let c = Chunk::new(format!("id{i}"), "s".into(), format!("memory {i}"), 0);
            store.upsert(vec![c]).await.unwrap();
        }
    }

    #[tokio::test]
    async fn the_writer_merges_small_fragments_as_it_commits() {
        let tmp = tempfile::tempdir().unwrap();
        let m = Maintenance {
            compact_every_commits: 8,
            ..Maintenance::off()
        };
        let store = open(tmp.path(), m).await;
        commit_one_by_one(&store, 40).await;
        // The merged fragment plus at most one interval of fresh ones (the last
        // merge may still be running when the last write returns).
        let n = fragments(store.chunks_table()).await;
        assert!(n <= 8 + 1, "40 commits left {n} fragments");
        assert_eq!(store.count(&crate::store::Filter::new()).await.unwrap(), 40);

        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        commit_one_by_one(&store, 12).await;
        assert!(
            fragments(store.chunks_table()).await >= 12,
            "maintenance off merges nothing"
        );
    }

    #[tokio::test]
    async fn the_full_pass_merges_and_reports() {
        let tmp = tempfile::tempdir().unwrap();
        let store = open(tmp.path(), Maintenance::off()).await;
        commit_one_by_one(&store, 10).await;
        let dry = full_pass(store.chunks_table(), None, true).await.unwrap();
        assert_eq!(
            (dry.rows, dry.fragments_before, dry.fragments_after),
            (10, 10, 10)
        );
        let done = full_pass(store.chunks_table(), None, false).await.unwrap();
        assert_eq!(
            (done.rows, done.fragments_before, done.fragments_after),
            (10, 10, 1)
        );
    }

    #[tokio::test]
    async fn the_watcher_merges_a_table_past_its_limit() {
        let tmp = tempfile::tempdir().unwrap();
        let m = Maintenance {
            check_every: Duration::from_millis(50),
            max_fragments: 4,
            ..Maintenance::off()
        };
        let store = open(tmp.path(), m).await;
        for i in 0..12 {
            store
                .add_history(vec![crate::store::HistoryRow {
                    id: format!("h{i}"),
                    stream: "s".into(),
                    chunk_id: "c".into(),
                    event: "created".into(),
                    reason: String::new(),
                    related_ids: Vec::new(),
                    created_at: i,
                }])
                .await
                .unwrap();
        }
        let history = store.tables()[crate::store::HISTORY].clone();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while fragments(&history).await > 4 {
            assert!(std::time::Instant::now() < deadline, "history never merged");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(history.count_rows(None).await.unwrap(), 12);
    }
}
