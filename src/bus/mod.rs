//! The ingestion bus between the writers (REST, MCP, import) and the pipeline
//! worker. A write is *accepted* once the bus holds it and *stored* once the
//! worker has committed it. `jetstream` is durable and shared by every process;
//! `embedded` is an in-process queue with the same semantics within a process.

pub mod config;
mod embedded;
pub mod jetstream;
mod notify;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use embedded::{EmbeddedBus, EmbeddedConsumer};
pub use jetstream::{JetStreamBus, JetStreamConsumer, Lease};
pub use notify::{LocalWaiters, Notifier, Outcome, Watch};

use crate::core::model::Chunk;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("the ingestion bus is closed")]
    Closed,
    #[error("the ingestion bus is unavailable: {0}")]
    Unavailable(String),
    #[error("cannot encode the message: {0}")]
    Encode(String),
    #[error("the memory is too large for the bus: {0}")]
    TooLarge(String),
}

/// One write on the bus: the memory as accepted and the pipeline to run it through.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub pipeline: String,
    pub chunk: Chunk,
    /// A writer waits for this memory's outcome.
    #[serde(default)]
    pub notify: bool,
    /// The server made this memory's id (a random UUID), so no stored row can
    /// hold it before this message is first delivered.
    #[serde(default)]
    pub minted: bool,
    /// Non-zero when the same write is sent again on purpose (see
    /// `service::memory::publish_and_wait`): a fresh message id, so the bus's
    /// duplicate window does not drop it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resend: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A message that cannot be decoded: it goes straight to `dead_letters`.
#[derive(Debug, Clone)]
pub struct Poison {
    pub raw: String,
    pub error: String,
}

/// A received message and how to settle it with the bus.
pub struct Delivery {
    pub envelope: Result<Envelope, Poison>,
    /// How many times this message has been delivered, starting at 1.
    pub attempt: u32,
    settle: Settle,
}

enum Settle {
    Embedded(embedded::Requeue),
    /// The message this delivery came in, shared with the other writes it
    /// carried (see [`jetstream::Held`]).
    JetStream(std::sync::Arc<jetstream::Held>),
}

impl Delivery {
    /// Done with: stored, dropped, or dead-lettered.
    pub async fn ack(self) {
        match &self.settle {
            Settle::Embedded(_) => {}
            Settle::JetStream(m) => m.settle(None).await,
        }
    }

    /// Deliver again after `delay`.
    pub async fn retry(self, delay: Duration) {
        match self.settle {
            Settle::Embedded(requeue) => {
                if let Ok(envelope) = self.envelope {
                    requeue.later(envelope, self.attempt + 1, delay);
                }
            }
            Settle::JetStream(m) => m.settle(Some(delay)).await,
        }
    }
}

/// Tells the bus, while the worker still holds a batch, that it is being worked
/// on, so that a batch slower than `ack_wait` (a loaded machine, a slow model)
/// is not redelivered mid-work. Stops when dropped.
pub struct Keepalive(Option<tokio::task::JoinHandle<()>>);

impl Keepalive {
    /// Send an in-progress acknowledgement for every JetStream message in
    /// `batch` (once for a message that carried several writes) each `every`,
    /// until the returned guard is dropped.
    pub fn start(batch: &[Delivery], every: Duration) -> Keepalive {
        let mut messages: Vec<std::sync::Arc<jetstream::Held>> = Vec::new();
        for d in batch {
            if let Settle::JetStream(m) = &d.settle {
                // A pack's writes arrive side by side.
                if !messages
                    .last()
                    .is_some_and(|l| std::sync::Arc::ptr_eq(l, m))
                {
                    messages.push(m.clone());
                }
            }
        }
        if messages.is_empty() {
            return Keepalive(None);
        }
        Keepalive(Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                for m in &messages {
                    m.in_progress().await;
                }
            }
        })))
    }
}

impl Drop for Keepalive {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// A NATS subject token for any stream name or id: `[A-Za-z0-9_-]` stay, every
/// other byte becomes `~XX`.
pub fn subject_token(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("~{b:02X}"));
        }
    }
    if out.is_empty() {
        out.push('~');
    }
    out
}

/// What the pipeline has yet to take from the bus.
#[derive(schemars::JsonSchema, Debug, Clone, serde::Serialize)]
pub struct Lag {
    /// The bus stream (JetStream's stream name; `embedded` in process).
    pub stream: String,
    /// Messages not yet delivered to the pipeline.
    pub pending: u64,
    /// Delivered, not yet acknowledged (being processed).
    pub ack_pending: u64,
    /// Delivered more than once and not yet acknowledged.
    pub redelivered: u64,
}

/// The publishing side, shared by every request handler.
#[derive(Clone)]
pub enum Bus {
    Embedded(EmbeddedBus),
    JetStream(JetStreamBus),
}

impl Bus {
    /// Hand envelopes to the bus; Ok means accepted (durably, for JetStream),
    /// with those the bus recognised as already accepted and dropped.
    pub async fn publish(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, BusError> {
        match self {
            Bus::Embedded(b) => b.publish(envelopes).await.map(|()| Vec::new()),
            Bus::JetStream(b) => b.publish(envelopes).await,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Bus::Embedded(_) => "embedded",
            Bus::JetStream(_) => "jetstream",
        }
    }

    pub fn connected(&self) -> bool {
        match self {
            Bus::Embedded(_) => true,
            Bus::JetStream(b) => b.connected(),
        }
    }

    /// Claim one run of a scheduled job for this process (see
    /// [`JetStreamBus::claim`]); the embedded bus has one process, which
    /// always wins.
    pub async fn claim(&self, job: &str, slot: i64) -> Result<bool, BusError> {
        match self {
            Bus::Embedded(_) => Ok(true),
            Bus::JetStream(b) => b.claim(job, slot).await,
        }
    }

    /// Take the lease `key` names unless a process took it less than
    /// `window` ago (see [`JetStreamBus::claim_window`]); the embedded bus has
    /// one process, which always takes it.
    pub async fn claim_window(&self, key: &str, window: Duration) -> Result<Lease, BusError> {
        match self {
            Bus::Embedded(_) => Ok(Lease::Taken),
            Bus::JetStream(b) => b.claim_window(key, window).await,
        }
    }

    /// The pipeline's backlog on the bus.
    pub async fn lag(&self) -> Result<Lag, BusError> {
        match self {
            Bus::Embedded(b) => Ok(Lag {
                stream: "embedded".into(),
                pending: b.pending() as u64,
                ack_pending: 0,
                redelivered: 0,
            }),
            Bus::JetStream(b) => b.lag().await,
        }
    }
}

/// The receiving side, owned by the pipeline worker.
pub enum Consumer {
    Embedded(EmbeddedConsumer),
    JetStream(JetStreamConsumer),
}

impl Consumer {
    /// Up to `max` deliveries, waiting at most `wait` after the first one arrives.
    /// None once the bus is closed (and, for the embedded bus, drained).
    pub async fn next_batch(&mut self, max: usize, wait: Duration) -> Option<Vec<Delivery>> {
        match self {
            Consumer::Embedded(c) => c.next_batch(max, wait).await,
            Consumer::JetStream(c) => c.next_batch(max, wait).await,
        }
    }
}

impl From<BusError> for crate::core::Error {
    fn from(e: BusError) -> Self {
        match e {
            BusError::TooLarge(_) => crate::core::Error::TooLarge(e.to_string()),
            _ => crate::core::Error::Unavailable(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_tokens_are_safe_and_distinct() {
        assert_eq!(subject_token("__user_default__"), "__user_default__");
        assert_eq!(subject_token("a.b"), "a~2Eb");
        assert_eq!(subject_token("a b>*"), "a~20b~3E~2A");
        assert_eq!(subject_token(""), "~");
        assert_ne!(subject_token("a.b"), subject_token("a~2Eb"));
    }
}
