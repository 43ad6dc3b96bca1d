//! `[bus]`: which bus carries writes and how the worker pulls them.

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusKind {
    Embedded,
    Jetstream,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusConfig {
    pub kind: BusKind,
    /// The NATS server, or several separated by commas (a cluster's nodes:
    /// loomem connects to any and fails over to the others).
    pub nats_url: String,
    /// Copies of the stream (and of the job claims) JetStream keeps: 1 on a
    /// single server, 3 on a three-node cluster.
    #[serde(default = "one")]
    pub replicas: usize,
    /// Most messages the worker pulls into one pipeline batch.
    pub batch_size: usize,
    /// How long the worker waits to fill a batch, in milliseconds.
    pub batch_wait_ms: u64,
    /// Deliveries of one message before it goes to `dead_letters`.
    pub max_deliver: u32,
    /// Capacity of the in-process queue (`embedded` bus).
    pub queue_capacity: usize,
    /// JetStream stream holding every write (subjects `loomem.in.<stream>`).
    pub stream_name: String,
    /// Durable pull consumer shared by every loomem worker (a work queue).
    pub consumer_name: String,
    /// How long a delivered message may stay unacknowledged before redelivery.
    pub ack_wait_ms: u64,
    /// Window in which JetStream drops a repeated `Nats-Msg-Id`.
    pub duplicate_window_secs: u64,
    /// Size cap of the JetStream stream in bytes (-1 = unlimited).
    pub max_bytes: i64,
    /// Most delivered-but-unacknowledged messages per consumer.
    pub max_ack_pending: i64,
    /// How long a publish waits for JetStream's acknowledgement.
    pub publish_timeout_ms: u64,
    /// Most writes of one stream published together that share a message
    /// (1: a message a write, as before packs).
    #[serde(default = "pack_writes")]
    pub pack_writes: usize,
}

fn one() -> usize {
    1
}

fn pack_writes() -> usize {
    super::jetstream::PACK_WRITES
}
