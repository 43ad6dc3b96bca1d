//! The ingestion bus between the writers (REST, MCP, import) and the pipeline
//! worker. `embedded` is an in-process queue; a write is *accepted* once the bus
//! holds it and *stored* once the worker has committed it.

mod embedded;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use embedded::{EmbeddedBus, EmbeddedConsumer};

use crate::model::Chunk;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("the ingestion bus is closed")]
    Closed,
    #[error("the ingestion bus is unavailable: {0}")]
    Unavailable(String),
}

/// One write on the bus: the memory as accepted and the pipeline to run it through.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub pipeline: String,
    pub chunk: Chunk,
}

/// A received envelope and how to settle it with the bus.
pub struct Delivery {
    pub envelope: Envelope,
    /// How many times this message has been delivered, starting at 1.
    pub attempt: u32,
    settle: Settle,
}

enum Settle {
    /// The embedded bus keeps nothing once a message is handed over.
    Nothing,
}

impl Delivery {
    pub fn embedded(envelope: Envelope) -> Delivery {
        Delivery {
            envelope,
            attempt: 1,
            settle: Settle::Nothing,
        }
    }

    /// The message is done with (stored, dropped or dead-lettered).
    pub async fn ack(self) {
        match self.settle {
            Settle::Nothing => {}
        }
    }
}

/// The publishing side, shared by every request handler.
#[derive(Clone)]
pub enum Bus {
    Embedded(EmbeddedBus),
}

impl Bus {
    /// Hand envelopes to the bus; Ok means accepted.
    pub async fn publish(&self, envelopes: Vec<Envelope>) -> Result<(), BusError> {
        match self {
            Bus::Embedded(b) => b.publish(envelopes).await,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Bus::Embedded(_) => "embedded",
        }
    }
}

/// The receiving side, owned by the pipeline worker.
pub enum Consumer {
    Embedded(EmbeddedConsumer),
}

impl Consumer {
    /// Up to `max` deliveries, waiting at most `wait` after the first one arrives.
    /// None once the bus is closed and drained.
    pub async fn next_batch(&mut self, max: usize, wait: Duration) -> Option<Vec<Delivery>> {
        match self {
            Consumer::Embedded(c) => c.next_batch(max, wait).await,
        }
    }
}
