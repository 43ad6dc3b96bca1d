//! Telling a waiting writer what became of its memory. In-process for the
//! embedded bus; over core NATS (`loomem.done.<id>`) for JetStream, so a write
//! accepted by one loomem process and stored by another still gets its answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::{subject_token, BusError};

/// What became of one accepted write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Stored {
        /// Earlier memories this one superseded.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        superseded: Vec<String>,
    },
    /// Not stored because an equal memory exists.
    Duplicate { existing_id: String },
    /// Deliberately not stored (e.g. nothing left after sanitizing).
    Dropped { reason: String },
    /// Given up on after `max_deliver` attempts; the message is in `dead_letters`.
    Failed { error: String },
}

const DONE_PREFIX: &str = "loomem.done";

#[derive(Clone)]
pub enum Notifier {
    Local(Arc<LocalWaiters>),
    Nats(async_nats::Client),
}

/// A writer's wait for one memory.
pub enum Watch {
    Local(oneshot::Receiver<Outcome>),
    Nats(async_nats::Subscriber),
}

impl Watch {
    /// The outcome, or None if the notifier went away.
    pub async fn outcome(self) -> Option<Outcome> {
        match self {
            Watch::Local(rx) => rx.await.ok(),
            Watch::Nats(mut sub) => {
                let msg = sub.next().await?;
                serde_json::from_slice(&msg.payload).ok()
            }
        }
    }
}

#[derive(Default)]
pub struct LocalWaiters {
    by_id: Mutex<HashMap<String, Vec<oneshot::Sender<Outcome>>>>,
}

impl Notifier {
    /// Start watching `id`; call before publishing so no outcome is missed.
    pub async fn watch(&self, id: &str) -> Result<Watch, BusError> {
        match self {
            Notifier::Local(w) => {
                let (tx, rx) = oneshot::channel();
                let mut by_id = w.by_id.lock().expect("waiters lock");
                let waiting = by_id.entry(id.to_string()).or_default();
                // Waits abandoned earlier (their writers gone) go now.
                waiting.retain(|tx| !tx.is_closed());
                waiting.push(tx);
                Ok(Watch::Local(rx))
            }
            Notifier::Nats(client) => {
                if client.connection_state() != async_nats::connection::State::Connected {
                    return Err(BusError::Unavailable("NATS is not connected".into()));
                }
                let sub = client
                    .subscribe(format!("{DONE_PREFIX}.{}", subject_token(id)))
                    .await
                    .map_err(|e| BusError::Unavailable(format!("NATS subscribe: {e}")))?;
                // Make sure the server has the subscription before the write is published.
                match tokio::time::timeout(std::time::Duration::from_secs(3), client.flush()).await
                {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(BusError::Unavailable(format!("NATS flush: {e}"))),
                    Err(_) => {
                        return Err(BusError::Unavailable(
                            "NATS did not answer a flush in 3 s".into(),
                        ))
                    }
                }
                Ok(Watch::Nats(sub))
            }
        }
    }

    /// A writer gave up on `id`: drop the waits nobody holds any more (its
    /// own, once its `Watch` is dropped), never another writer's wait on the
    /// same id.
    pub fn forget(&self, id: &str) {
        if let Notifier::Local(w) = self {
            let mut by_id = w.by_id.lock().expect("waiters lock");
            if let Some(waiting) = by_id.get_mut(id) {
                waiting.retain(|tx| !tx.is_closed());
                if waiting.is_empty() {
                    by_id.remove(id);
                }
            }
        }
    }

    pub async fn notify(&self, id: &str, outcome: &Outcome) {
        match self {
            Notifier::Local(w) => {
                let waiting = w.by_id.lock().expect("waiters lock").remove(id);
                for tx in waiting.into_iter().flatten() {
                    let _ = tx.send(outcome.clone());
                }
            }
            Notifier::Nats(client) => {
                let payload = serde_json::to_vec(outcome).expect("outcome serialises");
                if let Err(e) = client
                    .publish(
                        format!("{DONE_PREFIX}.{}", subject_token(id)),
                        payload.into(),
                    )
                    .await
                {
                    tracing::warn!(%id, error = %e, "could not notify the writer");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_writer_giving_up_leaves_another_writers_wait_on_the_same_id() {
        let n = Notifier::Local(Arc::new(LocalWaiters::default()));
        let first = n.watch("x").await.unwrap();
        let second = n.watch("x").await.unwrap();
        drop(first);
        n.forget("x");
        let told = Outcome::Stored {
            superseded: Vec::new(),
        };
        n.notify("x", &told).await;
        assert_eq!(second.outcome().await, Some(told));
    }
}
