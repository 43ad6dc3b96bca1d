//! The in-process bus: a bounded queue. Same accept/store semantics as JetStream
//! within one process, no durability across a crash (a write that was accepted but
//! not yet stored is lost if the process dies; `/v1/store` waits for stored).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{BusError, Delivery, Envelope};

#[derive(Clone)]
pub struct EmbeddedBus {
    tx: Arc<RwLock<Option<mpsc::Sender<Envelope>>>>,
}

pub struct EmbeddedConsumer {
    rx: mpsc::Receiver<Envelope>,
}

impl EmbeddedBus {
    pub fn new(capacity: usize) -> (EmbeddedBus, EmbeddedConsumer) {
        let (tx, rx) = mpsc::channel(capacity);
        (
            EmbeddedBus {
                tx: Arc::new(RwLock::new(Some(tx))),
            },
            EmbeddedConsumer { rx },
        )
    }

    pub async fn publish(&self, envelopes: Vec<Envelope>) -> Result<(), BusError> {
        let tx = self
            .tx
            .read()
            .expect("bus lock")
            .clone()
            .ok_or(BusError::Closed)?;
        for e in envelopes {
            tx.send(e).await.map_err(|_| BusError::Closed)?;
        }
        Ok(())
    }

    /// Refuse new messages; the consumer drains what is queued, then ends.
    pub fn close(&self) {
        self.tx.write().expect("bus lock").take();
    }
}

impl EmbeddedConsumer {
    pub async fn next_batch(&mut self, max: usize, wait: Duration) -> Option<Vec<Delivery>> {
        let first = self.rx.recv().await?;
        let mut batch = vec![Delivery::embedded(first)];
        let deadline = tokio::time::Instant::now() + wait;
        while batch.len() < max {
            match self.rx.try_recv() {
                Ok(e) => batch.push(Delivery::embedded(e)),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                        Ok(Some(e)) => batch.push(Delivery::embedded(e)),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
        Some(batch)
    }
}
