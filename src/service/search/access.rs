//! Access tracking: every memory a search returns (unless `dry_run`) gets its
//! `access_count` raised and `last_accessed_at` set. Counts are buffered in
//! memory and written in one commit per flush interval, never one Lance write
//! per search.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::core::model::Micros;
use crate::store::Store;

#[derive(Default)]
struct Pending {
    /// id → (accesses since the last flush, latest access).
    counts: HashMap<String, (i64, Micros)>,
}

/// Buffers accesses; a background task flushes them.
#[derive(Clone)]
pub struct AccessTracker {
    pending: Arc<Mutex<Pending>>,
    store: Arc<Store>,
}

impl AccessTracker {
    /// Start the flusher: it writes the buffer every `interval` until the
    /// tracker's last clone is dropped (then flushes once more).
    pub fn spawn(store: Arc<Store>, interval: Duration) -> AccessTracker {
        let tracker = AccessTracker {
            pending: Default::default(),
            store,
        };
        let weak = Arc::downgrade(&tracker.pending);
        let store = tracker.store.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(pending) = weak.upgrade() else { break };
                let tracker = AccessTracker {
                    pending,
                    store: store.clone(),
                };
                if let Err(e) = tracker.flush().await {
                    tracing::warn!(error = %e, "access counters not written; will retry");
                }
            }
        });
        tracker
    }

    /// Count one access to each of these memories.
    pub fn record(&self, ids: impl IntoIterator<Item = String>, at: Micros) {
        let mut p = self.pending.lock().expect("access lock");
        for id in ids {
            let e = p.counts.entry(id).or_insert((0, at));
            e.0 += 1;
            e.1 = e.1.max(at);
        }
    }

    /// Write the buffered counts in one commit; returns how many memories changed.
    /// Counts for memories deleted meanwhile are dropped; on a failed write
    /// they go back into the buffer.
    pub async fn flush(&self) -> crate::store::Result<usize> {
        let counts = std::mem::take(&mut self.pending.lock().expect("access lock").counts);
        if counts.is_empty() {
            return Ok(0);
        }
        let result = self.store.touch(counts.clone()).await;
        if result.is_err() {
            let mut p = self.pending.lock().expect("access lock");
            for (id, (n, at)) in counts {
                let e = p.counts.entry(id).or_insert((0, at));
                e.0 += n;
                e.1 = e.1.max(at);
            }
        }
        result
    }
}
