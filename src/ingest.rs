//! The pipeline worker: pulls batches off the bus, runs each through its
//! pipeline (whose `write` stage commits once), then tells waiting writers what
//! became of their memory and acknowledges the messages.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::bus::{Consumer, Delivery};
use crate::pipeline::{Disposition, Pipelines, Record};

/// What became of one accepted write.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Stored,
    /// Not stored because an equal memory exists.
    Duplicate {
        existing_id: String,
    },
    /// Deliberately not stored (e.g. nothing left after sanitizing).
    Dropped {
        reason: &'static str,
    },
    Failed {
        error: String,
    },
}

/// Writers waiting for their memory to be stored, by memory id.
#[derive(Default)]
pub struct Waiters {
    by_id: Mutex<HashMap<String, Vec<oneshot::Sender<Outcome>>>>,
}

impl Waiters {
    pub fn register(&self, id: &str) -> oneshot::Receiver<Outcome> {
        let (tx, rx) = oneshot::channel();
        self.by_id
            .lock()
            .expect("waiters lock")
            .entry(id.to_string())
            .or_default()
            .push(tx);
        rx
    }

    /// Drop the waiters of `id` (a writer that gave up).
    pub fn forget(&self, id: &str) {
        self.by_id.lock().expect("waiters lock").remove(id);
    }

    fn notify(&self, id: &str, outcome: &Outcome) {
        let waiting = self.by_id.lock().expect("waiters lock").remove(id);
        for tx in waiting.into_iter().flatten() {
            let _ = tx.send(outcome.clone());
        }
    }
}

pub struct WorkerConfig {
    pub batch_size: usize,
    pub batch_wait: Duration,
    pub max_deliver: u32,
}

/// Run until the bus is closed and drained.
pub async fn run_worker(
    mut consumer: Consumer,
    pipelines: Arc<Pipelines>,
    waiters: Arc<Waiters>,
    cfg: WorkerConfig,
) {
    while let Some(batch) = consumer.next_batch(cfg.batch_size, cfg.batch_wait).await {
        process(batch, &pipelines, &waiters, &cfg).await;
    }
    tracing::debug!("pipeline worker stopped");
}

async fn process(
    batch: Vec<Delivery>,
    pipelines: &Pipelines,
    waiters: &Waiters,
    cfg: &WorkerConfig,
) {
    // Group by pipeline, keeping arrival order within each group.
    let mut groups: Vec<(String, Vec<Delivery>)> = Vec::new();
    for d in batch {
        match groups.iter_mut().find(|(p, _)| *p == d.envelope.pipeline) {
            Some((_, g)) => g.push(d),
            None => groups.push((d.envelope.pipeline.clone(), vec![d])),
        }
    }
    for (name, deliveries) in groups {
        let Some(pipeline) = pipelines.get(&name) else {
            let error = format!("no pipeline named `{name}`");
            tracing::error!(%error);
            for d in deliveries {
                waiters.notify(
                    &d.envelope.chunk.id,
                    &Outcome::Failed {
                        error: error.clone(),
                    },
                );
                d.ack().await;
            }
            continue;
        };
        let mut attempt = 0;
        let outcome = loop {
            attempt += 1;
            let mut records: Vec<Record> = deliveries
                .iter()
                .map(|d| Record::new(d.envelope.chunk.clone()))
                .collect();
            match pipeline.run(&mut records).await {
                Ok(reports) => {
                    tracing::debug!(pipeline = %name, ?reports, "batch committed");
                    break Ok(records);
                }
                Err(e) if attempt < cfg.max_deliver => {
                    let backoff = Duration::from_millis(50 * 2u64.pow(attempt.min(6)));
                    tracing::warn!(pipeline = %name, attempt, error = %e, "batch failed; retrying");
                    tokio::time::sleep(backoff).await;
                }
                Err(e) => break Err(e.to_string()),
            }
        };
        match outcome {
            Ok(records) => {
                for r in &records {
                    waiters.notify(&r.chunk.id, &record_outcome(r));
                }
            }
            Err(error) => {
                tracing::error!(pipeline = %name, %error, "batch failed for good");
                for d in &deliveries {
                    waiters.notify(
                        &d.envelope.chunk.id,
                        &Outcome::Failed {
                            error: error.clone(),
                        },
                    );
                }
            }
        }
        for d in deliveries {
            d.ack().await;
        }
    }
}

fn record_outcome(r: &Record) -> Outcome {
    match &r.disposition {
        Disposition::Keep => Outcome::Stored,
        Disposition::Drop {
            existing_id: Some(existing_id),
            ..
        } => Outcome::Duplicate {
            existing_id: existing_id.clone(),
        },
        Disposition::Drop { reason, .. } => Outcome::Dropped { reason },
        Disposition::Fail(error) => Outcome::Failed {
            error: error.clone(),
        },
    }
}
