//! The in-process bus: a bounded queue. Same accept/store/retry semantics as
//! JetStream within one process, but nothing survives a crash (a write accepted
//! and not yet stored is lost if the process dies; `/v1/store` waits for stored).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{BusError, Delivery, Envelope, Settle};

type Item = (Envelope, u32);

#[derive(Clone)]
pub struct EmbeddedBus {
    tx: Arc<RwLock<Option<mpsc::Sender<Item>>>>,
}

pub struct EmbeddedConsumer {
    rx: mpsc::Receiver<Item>,
    requeue: mpsc::WeakSender<Item>,
}

/// Puts a message back on the queue, unless the bus has closed meanwhile.
pub struct Requeue(mpsc::WeakSender<Item>);

impl Requeue {
    pub fn later(self, envelope: Envelope, attempt: u32, delay: Duration) {
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            match self.0.upgrade() {
                Some(tx) => {
                    let _ = tx.send((envelope, attempt)).await;
                }
                None => {
                    tracing::error!(id = %envelope.chunk.id, "bus closed before a retry; the write is lost")
                }
            }
        });
    }
}

impl EmbeddedBus {
    pub fn new(capacity: usize) -> (EmbeddedBus, EmbeddedConsumer) {
        let (tx, rx) = mpsc::channel(capacity);
        let requeue = tx.downgrade();
        (
            EmbeddedBus {
                tx: Arc::new(RwLock::new(Some(tx))),
            },
            EmbeddedConsumer { rx, requeue },
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
            tx.send((e, 1)).await.map_err(|_| BusError::Closed)?;
        }
        Ok(())
    }

    /// Messages queued and not yet taken by the consumer.
    pub fn pending(&self) -> usize {
        self.tx
            .read()
            .expect("bus lock")
            .as_ref()
            .map(|tx| tx.max_capacity() - tx.capacity())
            .unwrap_or(0)
    }

    /// Refuse new messages; the consumer drains what is queued, then ends.
    pub fn close(&self) {
        self.tx.write().expect("bus lock").take();
    }
}

impl EmbeddedConsumer {
    fn delivery(&self, (envelope, attempt): Item) -> Delivery {
        Delivery {
            envelope: Ok(envelope),
            attempt,
            settle: Settle::Embedded(Requeue(self.requeue.clone())),
        }
    }

    pub async fn next_batch(&mut self, max: usize, wait: Duration) -> Option<Vec<Delivery>> {
        let first = self.rx.recv().await?;
        let mut batch = vec![self.delivery(first)];
        let deadline = tokio::time::Instant::now() + wait;
        while batch.len() < max {
            let item = match self.rx.try_recv() {
                Ok(item) => item,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                        Ok(Some(item)) => item,
                        Ok(None) | Err(_) => break,
                    }
                }
            };
            batch.push(self.delivery(item));
        }
        Some(batch)
    }
}
