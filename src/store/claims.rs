//! Which fragments the chunk writer's running merge rewrites, and which its
//! in-place updates write. Lance lets an `Update` and a `Rewrite` commit
//! side by side when their fragments are disjoint, and fails the second to
//! commit otherwise; so a write that changes stored rows waits for a
//! running merge only when one of its rows lies in a fragment that merge
//! has taken, and a merge leaves out the fragments an update is writing.
//!
//! Before this, every batch that superseded stored memories waited for the
//! whole merge: at a million rows a merge took 4–12 s (the rewrite, and the
//! remap of every index covering the fragments) and the writer stood still
//! behind it. The rows a batch supersedes are mostly recent ones, so a
//! merge made while the writer writes also spares the newest fragments
//! ([`newest`]): they are left to the next merge rather than taken from
//! under the next batch, and merged once the writer rests.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Both sides' fragments, under one lock, so that whichever claims first
/// is seen by the other.
#[derive(Debug, Default)]
struct Sets {
    /// Fragments the running merge has planned to rewrite (old fragments;
    /// kept until the merge ends, so an address read before one of its
    /// commits still counts as taken).
    merging: HashSet<u64>,
    /// Fragments the writer's update under way writes.
    writing: HashSet<u64>,
}

/// See the module's documentation. Cloned, it shares the same sets.
#[derive(Debug, Clone, Default)]
pub(super) struct Claims(Arc<Mutex<Sets>>);

impl Claims {
    fn sets(&self) -> std::sync::MutexGuard<'_, Sets> {
        // The sets stay consistent whatever panicked while they were held
        // (every change is a single insert or removal).
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// For a merge: of `groups` (each rewritten as one, its old fragments'
    /// ids given by `ids`), those that touch no fragment an update is
    /// writing; their fragments are taken until the merge's [`MergeClaim`]
    /// drops.
    pub fn for_merge<G>(&self, groups: Vec<G>, ids: impl Fn(&G) -> Vec<u64>) -> Vec<G> {
        let mut sets = self.sets();
        let mut kept = Vec::with_capacity(groups.len());
        for group in groups {
            let members = ids(&group);
            if members.iter().any(|f| sets.writing.contains(f)) {
                continue;
            }
            sets.merging.extend(members);
            kept.push(group);
        }
        kept
    }

    /// A merge begins: its fragments are free again once the returned
    /// guard drops (it committed, gave way, failed or panicked).
    pub fn merge(&self) -> MergeClaim {
        MergeClaim(self.clone())
    }

    /// For an update of rows in `fragments`: taken unless the running merge
    /// holds one of them (then `None`: the update waits for the merge).
    /// Released when the returned claim drops.
    pub fn for_write(&self, fragments: HashSet<u64>) -> Option<WriteClaim> {
        let mut sets = self.sets();
        if fragments.iter().any(|f| sets.merging.contains(f)) {
            return None;
        }
        sets.writing.extend(fragments.iter().copied());
        Some(WriteClaim {
            claims: self.clone(),
            fragments,
        })
    }
}

/// A running merge's hold on the fragments it takes (see [`Claims::merge`]).
#[derive(Debug)]
pub(super) struct MergeClaim(Claims);

impl Drop for MergeClaim {
    fn drop(&mut self) {
        self.0.sets().merging.clear();
    }
}

/// An update's fragments, taken from [`Claims::for_write`] until dropped.
#[derive(Debug)]
pub(super) struct WriteClaim {
    claims: Claims,
    fragments: HashSet<u64>,
}

impl Drop for WriteClaim {
    fn drop(&mut self) {
        let mut sets = self.claims.sets();
        for f in &self.fragments {
            sets.writing.remove(f);
        }
    }
}

/// The fragment a row lies in, from its `_rowid`: loomem's tables have no
/// stable row ids, so a row id is its address (fragment id in the high 32
/// bits, offset in the low).
pub(super) fn fragment_of(row_id: u64) -> u64 {
    row_id >> 32
}

/// The newest fragments (highest ids) that together hold fewer than
/// `rows` rows, at most `NEWEST_SPARED` of them, with the one that reaches
/// `rows`: those a routine merge spares. `fragments`: (id, rows).
pub(super) fn newest(fragments: impl Iterator<Item = (u64, usize)>, rows: usize) -> HashSet<u64> {
    let mut all: Vec<(u64, usize)> = fragments.collect();
    all.sort_unstable_by(|a, b| b.0.cmp(&a.0));
    let mut spared = HashSet::new();
    let mut held = 0usize;
    for (id, n) in all.into_iter().take(NEWEST_SPARED) {
        if held >= rows {
            break;
        }
        spared.insert(id);
        held += n;
    }
    spared
}

/// At most this many newest fragments are spared (a batch of the bulk
/// import supersedes rows of the one or two before it).
const NEWEST_SPARED: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_waits_only_for_fragments_the_merge_took() {
        let claims = Claims::default();
        let merge = claims.merge();
        let written = claims.for_write(HashSet::from([5])).expect("no merge yet");
        let groups = vec![vec![1u64, 2], vec![3, 4], vec![5]];
        let kept = claims.for_merge(groups, |g| g.clone());
        assert_eq!(kept, vec![vec![1, 2], vec![3, 4]]);
        assert!(claims.for_write(HashSet::from([2, 9])).is_none());
        drop(written);
        let claim = claims.for_write(HashSet::from([5, 9])).expect("untaken");
        // A later phase of the merge leaves the written fragments out.
        let kept = claims.for_merge(vec![vec![9u64, 10], vec![11]], |g| g.clone());
        assert_eq!(kept, vec![vec![11]]);
        drop(claim);
        let kept = claims.for_merge(vec![vec![9u64, 10]], |g| g.clone());
        assert_eq!(kept, vec![vec![9, 10]]);
        drop(merge);
        assert!(claims.for_write(HashSet::from([1, 2, 3, 9, 11])).is_some());
    }

    #[test]
    fn the_newest_fragments_up_to_the_rows_are_spared() {
        let frags = [(1, 8192), (7, 3000), (8, 2500), (9, 100)];
        assert_eq!(newest(frags.into_iter(), 4000), HashSet::from([9, 8, 7]));
        assert_eq!(newest(frags.into_iter(), 50), HashSet::from([9]));
        assert_eq!(newest(frags.into_iter(), 0), HashSet::new());
        let small: Vec<(u64, usize)> = (0..20).map(|i| (i, 1)).collect();
        assert_eq!(
            newest(small.into_iter(), 8192),
            HashSet::from([19, 18, 17, 16])
        );
        assert_eq!(fragment_of((7u64 << 32) | 12), 7);
    }
}
