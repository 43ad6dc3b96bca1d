//! The pipeline worker: pulls batches off the bus, runs each through its
//! pipeline (whose `write` stage commits once), then acknowledges. A failing
//! message is retried with backoff until `max_deliver`, then kept in
//! `dead_letters` with its last error and acknowledged: never silently dropped.

use std::sync::Arc;
use std::time::Duration;

use crate::bus::{Consumer, Delivery, Envelope, Keepalive, Notifier, Outcome};
use crate::core::model::{now_micros, DeadLetter};
use crate::pipeline::{Disposition, PendingWrite, Pipelines, Record};
use crate::store::Store;

pub struct WorkerConfig {
    pub batch_size: usize,
    pub batch_wait: Duration,
    pub max_deliver: u32,
    /// How often a held batch is reported in progress to the bus: well within
    /// its ack deadline.
    pub keepalive: Duration,
}

pub struct Worker {
    pub pipelines: Arc<Pipelines>,
    pub store: Arc<Store>,
    pub notifier: Notifier,
    pub cfg: WorkerConfig,
}

/// Delay before the `attempt`-th redelivery: 100 ms doubling, at most 10 s.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(100 * 2u64.pow(attempt.saturating_sub(1).min(7)))
        .min(Duration::from_secs(10))
}

/// Batches a worker holds at once: one being written while the next runs
/// the stages that run ahead (for the default pipelines: sanitize, PII,
/// entities and, above all, the embedder).
const IN_FLIGHT: usize = 2;

/// Deliveries whose writers have their answer, to be acknowledged once the
/// side writes their batch started (the entity graph's group commit) are
/// committed too; retried if one fails.
#[derive(Default)]
struct Acks {
    deliveries: Vec<Delivery>,
    pending: Vec<PendingWrite>,
}

/// One pipeline's share of a batch, after the stages that run ahead.
struct Group {
    name: String,
    deliveries: Vec<Delivery>,
    records: Vec<Record>,
    /// `Err` when a stage that runs ahead failed the batch.
    ahead: Result<(), crate::pipeline::PipelineError>,
}

impl Worker {
    /// Run until the bus is closed (embedded: and drained) or the worker is
    /// stopped. While a batch is written the next one is pulled and runs the
    /// stages that run ahead; the rest of the stages (those that read the
    /// store: dedupe, surprise, contradictions, write) and the
    /// answers run one batch at a time, in the order pulled. A batch gives
    /// up its turn and its slot once its writers have their answers; its
    /// acknowledgements follow its side writes.
    pub async fn run(self, mut consumer: Consumer) {
        let this = Arc::new(self);
        let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        let mut tasks = tokio::task::JoinSet::new();
        let mut previous: Option<tokio::sync::oneshot::Receiver<()>> = None;
        loop {
            // A slot first, then the batch: messages that arrive while both
            // slots are taken join the next batch, instead of a batch pulled
            // early (from what came within `batch_wait` of the last pull)
            // waiting for a slot half full.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                break;
            };
            let Some(batch) = consumer
                .next_batch(this.cfg.batch_size, this.cfg.batch_wait)
                .await
            else {
                break;
            };
            let (done, turn) = tokio::sync::oneshot::channel();
            let before = previous.replace(turn);
            let worker = this.clone();
            tasks.spawn(async move {
                let _keepalive = Keepalive::start(&batch, worker.cfg.keepalive);
                let gate = worker.store.write_gate.read().await;
                let groups = worker.run_ahead(batch).await;
                if let Some(before) = before {
                    // Resolves when the batch before is done (or its task ended).
                    let _ = before.await;
                }
                let mut acks = Vec::new();
                for g in groups {
                    acks.push(worker.finish_group(g).await);
                }
                drop(gate);
                drop(done);
                drop(slot);
                for a in acks {
                    worker.acknowledge(a).await;
                }
            });
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
        tracing::debug!("pipeline worker stopped");
    }

    /// Group a batch by pipeline (arrival order kept within each) and run
    /// each group's leading stages.
    async fn run_ahead(&self, batch: Vec<Delivery>) -> Vec<Group> {
        let mut groups: Vec<Group> = Vec::new();
        for d in batch {
            let name = match &d.envelope {
                Ok(e) => e.pipeline.clone(),
                Err(poison) => {
                    let error = poison.error.clone();
                    self.give_up(d, error).await;
                    continue;
                }
            };
            match groups.iter_mut().find(|g| g.name == name) {
                Some(g) => g.deliveries.push(d),
                None => groups.push(Group {
                    name,
                    deliveries: vec![d],
                    records: Vec::new(),
                    ahead: Ok(()),
                }),
            }
        }
        for g in &mut groups {
            g.records = records_of(&g.deliveries);
            if let Some(pipeline) = self.pipelines.get(&g.name) {
                g.ahead = pipeline.run_ahead(&mut g.records).await.map(|_| ());
            }
        }
        groups
    }

    /// The rest of a group's stages, then its answers.
    async fn finish_group(&self, g: Group) -> Acks {
        let Some(pipeline) = self.pipelines.get(&g.name) else {
            for d in g.deliveries {
                self.give_up(d, format!("no pipeline named `{}`", g.name))
                    .await;
            }
            return Acks::default();
        };
        let mut records = g.records;
        let result = match g.ahead {
            Ok(()) => pipeline.run_rest(&mut records).await.map(|_| ()),
            Err(e) => Err(e),
        };
        self.settle_group(&g.name, g.deliveries, records, result)
            .await
    }

    /// A group run through its whole pipeline at once (a record retried
    /// alone), answered and acknowledged.
    async fn process_group(&self, name: &str, deliveries: Vec<Delivery>) {
        let Some(pipeline) = self.pipelines.get(name) else {
            for d in deliveries {
                self.give_up(d, format!("no pipeline named `{name}`")).await;
            }
            return;
        };
        let mut records = records_of(&deliveries);
        let result = pipeline.run(&mut records).await.map(|_| ());
        let acks = self.settle_group(name, deliveries, records, result).await;
        self.acknowledge(acks).await;
    }

    /// Answer (or retry, or dead-letter) each delivery by its record's fate;
    /// what was stored or dropped is acknowledged by [`Worker::acknowledge`].
    async fn settle_group(
        &self,
        name: &str,
        deliveries: Vec<Delivery>,
        mut records: Vec<Record>,
        result: Result<(), crate::pipeline::PipelineError>,
    ) -> Acks {
        let mut acks = Acks {
            deliveries: Vec::new(),
            pending: records
                .iter_mut()
                .flat_map(|r| std::mem::take(&mut r.pending))
                .collect(),
        };
        match result {
            Ok(()) => {
                tracing::debug!(pipeline = %name, "batch committed");
                for (d, r) in deliveries.into_iter().zip(records) {
                    match r.disposition {
                        Disposition::Fail(error) => self.retry_or_give_up(d, error).await,
                        Disposition::Keep => {
                            let superseded = r
                                .history
                                .iter()
                                .filter(|h| h.event == "supersedes" && h.chunk_id == r.chunk.id)
                                .flat_map(|h| h.related_ids.iter().cloned())
                                .collect();
                            self.answer(&d, Outcome::Stored { superseded }).await;
                            acks.deliveries.push(d);
                        }
                        Disposition::Drop {
                            existing_id: Some(existing_id),
                            ..
                        } => {
                            self.answer(&d, Outcome::Duplicate { existing_id }).await;
                            acks.deliveries.push(d);
                        }
                        Disposition::Drop { reason, .. } => {
                            let reason = reason.to_string();
                            self.answer(&d, Outcome::Dropped { reason }).await;
                            acks.deliveries.push(d);
                        }
                    }
                }
            }
            Err(e) if deliveries.len() > 1 => {
                // One bad record must not take its batch-mates down: run each alone.
                tracing::warn!(pipeline = %name, error = %e, size = deliveries.len(), "batch failed; retrying its records one by one");
                for d in deliveries {
                    Box::pin(self.process_group(name, vec![d])).await;
                }
            }
            Err(e) => {
                let error = e.to_string();
                for d in deliveries {
                    self.retry_or_give_up(d, error.clone()).await;
                }
            }
        }
        acks
    }

    /// Tell the delivery's writer, if one waits, what became of its memory.
    async fn answer(&self, d: &Delivery, outcome: Outcome) {
        if let Ok(e) = &d.envelope {
            if e.notify {
                self.notifier.notify(&e.chunk.id, &outcome).await;
            }
        }
    }

    /// Acknowledge answered deliveries once their batch's side writes are
    /// committed; when one failed, they are delivered again (their memories
    /// are committed, so the rerun changes nothing but the side write).
    async fn acknowledge(&self, acks: Acks) {
        let mut failed = None;
        for p in acks.pending {
            if let Err(e) = p.done().await {
                failed = Some(e);
            }
        }
        for d in acks.deliveries {
            match &failed {
                None => d.ack().await,
                Some(error) => self.retry_or_give_up(d, error.clone()).await,
            }
        }
    }

    async fn retry_or_give_up(&self, d: Delivery, error: String) {
        if d.attempt < self.cfg.max_deliver {
            let delay = backoff(d.attempt);
            d.retry(delay).await;
        } else {
            self.give_up(d, error).await;
        }
    }

    /// Keep the message in `dead_letters`, tell its writer, acknowledge it.
    async fn give_up(&self, d: Delivery, error: String) {
        let (memory_id, stream, pipeline, payload, notify) = match &d.envelope {
            Ok(e) => (
                Some(e.chunk.id.clone()),
                Some(e.chunk.stream.clone()),
                Some(e.pipeline.clone()),
                serde_json::to_string(e).unwrap_or_default(),
                e.notify,
            ),
            Err(p) => (None, None, None, p.raw.clone(), false),
        };
        tracing::error!(memory_id = ?memory_id, attempts = d.attempt, %error, "message dead-lettered");
        let row = DeadLetter {
            id: uuid::Uuid::new_v4().to_string(),
            memory_id: memory_id.clone(),
            stream,
            pipeline,
            payload,
            error: error.clone(),
            attempts: d.attempt as i32,
            failed_at: now_micros(),
        };
        if let Err(e) = self.store.dead_letter(vec![row]).await {
            // Without a dead-letter row the message must not be acknowledged.
            tracing::error!(error = %e, "cannot write dead letter; leaving the message for redelivery");
            let delay = backoff(d.attempt);
            d.retry(delay).await;
            return;
        }
        if let (Some(id), true) = (&memory_id, notify) {
            self.notifier.notify(id, &Outcome::Failed { error }).await;
        }
        d.ack().await;
    }
}

/// A fresh record for each well-formed delivery.
fn records_of(deliveries: &[Delivery]) -> Vec<Record> {
    deliveries
        .iter()
        .filter_map(|d| d.envelope.as_ref().ok().map(|e| (e, d.attempt)))
        .map(|(e, attempt)| Record {
            // A minted id on its first delivery cannot be stored yet; a
            // redelivery may follow a commit whose ack was lost.
            new_id: e.minted && attempt == 1,
            ..Record::new(e.chunk.clone())
        })
        .collect()
}

/// Envelopes for chunks that go through `pipeline`.
pub fn envelopes(
    pipeline: &str,
    chunks: Vec<crate::core::model::Chunk>,
    notify: bool,
) -> Vec<Envelope> {
    chunks
        .into_iter()
        .map(|chunk| Envelope {
            pipeline: pipeline.to_string(),
            chunk,
            notify,
            minted: false,
            resend: 0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(4), Duration::from_millis(800));
        assert_eq!(backoff(30), Duration::from_secs(10));
    }
}
