//! The durable bus: NATS JetStream. Every write is published on
//! `loomem.in.<stream>` with its memory id as `Nats-Msg-Id` (writes published
//! together go up to 256 a message, see [`packs`]) and is *accepted* once
//! JetStream acknowledges it; a durable pull consumer, shared by every
//! loomem process, feeds the pipeline worker. A delivered message that is not
//! acknowledged within `ack_wait` is redelivered, so a worker that dies
//! mid-batch loses nothing (and the upsert by id makes the replay harmless).

use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::{self, consumer, stream, AckKind, Message};
use futures::StreamExt;
use tokio::sync::watch;

use super::{subject_token, BusError, Delivery, Envelope, Settle};
use crate::bus::config::BusConfig;

pub const SUBJECT_PREFIX: &str = "loomem.in";

#[derive(Clone)]
pub struct JetStreamBus {
    client: async_nats::Client,
    js: jetstream::Context,
    url: String,
    publish_timeout: Duration,
    /// Most writes a message carries (`bus.pack_writes`).
    pack_writes: usize,
    stream_name: String,
    consumer_name: String,
    replicas: usize,
    /// The stream of job claims, made at the first claim.
    claims: std::sync::Arc<tokio::sync::OnceCell<stream::Stream>>,
}

/// The stream where processes claim a scheduled job's run: one subject a
/// run (`loomem.claims.<job>.<instant>`), kept a week; and leases, one
/// subject each (`loomem.claims.~lease.<key>`), holding its last claim.
const CLAIMS_STREAM: &str = "LOOMEM_CLAIMS";
const CLAIMS_PREFIX: &str = "loomem.claims";

/// What [`JetStreamBus::claim_window`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lease {
    /// This process claimed it now.
    Taken,
    /// A claim made `age` ago stands.
    Held { age: Duration },
}

/// `nats_url` as the servers to connect to (a comma-separated list).
fn servers(url: &str) -> Result<Vec<async_nats::ServerAddr>, BusError> {
    url.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| {
            u.parse::<async_nats::ServerAddr>()
                .map_err(|e| unavailable(u, format!("not a NATS URL: {e}")))
        })
        .collect()
}

pub struct JetStreamConsumer {
    consumer: consumer::Consumer<consumer::pull::Config>,
    messages: Option<consumer::pull::Stream>,
    prefetch: usize,
    /// Most bytes one pull asks for: packs carry up to 256 writes a message,
    /// and `prefetch` of them would be hundreds of thousands of writes.
    prefetch_bytes: usize,
    stop: watch::Receiver<bool>,
}

fn unavailable(url: &str, e: impl std::fmt::Display) -> BusError {
    BusError::Unavailable(format!("NATS JetStream at {url}: {e}"))
}

impl JetStreamBus {
    /// Connect, create (or reuse) the stream and the durable consumer.
    pub async fn connect(
        cfg: &BusConfig,
        stop: watch::Receiver<bool>,
    ) -> Result<(JetStreamBus, JetStreamConsumer), BusError> {
        let url = cfg.nats_url.clone();
        let log_url = url.clone();
        let client = async_nats::ConnectOptions::new()
            .name("loomem")
            .connection_timeout(Duration::from_secs(5))
            .max_reconnects(None)
            .event_callback(move |event| {
                let url = log_url.clone();
                async move {
                    match event {
                        async_nats::Event::Connected => tracing::info!(%url, "NATS connected"),
                        async_nats::Event::Disconnected => {
                            tracing::warn!(%url, "NATS disconnected; reconnecting")
                        }
                        other => tracing::debug!(%url, event = %other, "NATS event"),
                    }
                }
            })
            .connect(servers(&url)?)
            .await
            .map_err(|e| {
                unavailable(
                    &url,
                    format!("{e} (start `nats-server -js`, or set bus.kind = \"embedded\")"),
                )
            })?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(Duration::from_millis(cfg.publish_timeout_ms));
        let stream = js
            .get_or_create_stream(stream::Config {
                name: cfg.stream_name.clone(),
                subjects: vec![format!("{SUBJECT_PREFIX}.>")],
                storage: stream::StorageType::File,
                retention: stream::RetentionPolicy::WorkQueue,
                duplicate_window: Duration::from_secs(cfg.duplicate_window_secs),
                max_bytes: cfg.max_bytes,
                num_replicas: cfg.replicas.max(1),
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable(&url, format!("creating stream {}: {e}", cfg.stream_name)))?;
        // A stream made with another replica count (the config changed, or
        // the cluster grew): JetStream moves it to the new count.
        let mut stream = stream;
        let info = stream
            .info()
            .await
            .map_err(|e| unavailable(&url, format!("stream {}: {e}", cfg.stream_name)))?;
        if info.config.num_replicas != cfg.replicas.max(1) {
            let mut config = info.config.clone();
            config.num_replicas = cfg.replicas.max(1);
            js.update_stream(config).await.map_err(|e| {
                unavailable(&url, format!("setting {} replicas: {e}", cfg.stream_name))
            })?;
        }
        let consumer = stream
            .get_or_create_consumer(
                &cfg.consumer_name,
                consumer::pull::Config {
                    durable_name: Some(cfg.consumer_name.clone()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: Duration::from_millis(cfg.ack_wait_ms),
                    max_deliver: i64::from(cfg.max_deliver),
                    max_ack_pending: cfg.max_ack_pending,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| {
                unavailable(
                    &url,
                    format!("creating consumer {}: {e}", cfg.consumer_name),
                )
            })?;
        let prefetch_bytes = prefetch_bytes(client.server_info().max_payload);
        Ok((
            JetStreamBus {
                client,
                js,
                url,
                replicas: cfg.replicas.max(1),
                claims: Default::default(),
                publish_timeout: Duration::from_millis(cfg.publish_timeout_ms),
                pack_writes: cfg.pack_writes,
                stream_name: cfg.stream_name.clone(),
                consumer_name: cfg.consumer_name.clone(),
            },
            JetStreamConsumer {
                consumer,
                messages: None,
                prefetch: (cfg.batch_size * 2).clamp(64, 8192),
                prefetch_bytes,
                stop,
            },
        ))
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The durable consumer's backlog, as JetStream reports it.
    pub async fn lag(&self) -> Result<super::Lag, BusError> {
        let mut consumer: consumer::Consumer<consumer::pull::Config> = self
            .js
            .get_consumer_from_stream(&self.consumer_name, &self.stream_name)
            .await
            .map_err(|e| unavailable(&self.url, format!("consumer {}: {e}", self.consumer_name)))?;
        let info = consumer
            .info()
            .await
            .map_err(|e| unavailable(&self.url, format!("consumer {}: {e}", self.consumer_name)))?;
        Ok(super::Lag {
            stream: self.stream_name.clone(),
            pending: info.num_pending,
            ack_pending: info.num_ack_pending as u64,
            redelivered: info.num_redelivered as u64,
        })
    }

    /// Publish every envelope (pipelined), then wait for each acknowledgement.
    /// Consecutive envelopes of one memory stream travel together, up to
    /// `bus.pack_writes` in one message (see [`packs`]). Returns those
    /// JetStream recognised as duplicates (same message id within the
    /// duplicate window: already accepted, not delivered again).
    pub async fn publish(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, BusError> {
        if self.client.connection_state() != State::Connected {
            return Err(unavailable(&self.url, "not connected"));
        }
        let max_payload = self.client.server_info().max_payload;
        let packs = packs(envelopes, self.pack_writes, pack_bytes(max_payload))?;
        let mut acks = Vec::with_capacity(packs.len());
        for pack in packs {
            let msg = jetstream::message::PublishMessage::build()
                .payload(pack.payload.into())
                .message_id(pack.id);
            let ack = self.js.send_publish(pack.subject, msg).await.map_err(|e| {
                if e.kind() == jetstream::context::PublishErrorKind::MaxPayloadExceeded {
                    BusError::TooLarge(format!(
                        "{e} (raise the server's max_payload for larger memories)"
                    ))
                } else {
                    unavailable(&self.url, e)
                }
            })?;
            acks.push((ack, pack.envelopes));
        }
        let mut duplicates = Vec::new();
        for (ack, envelopes) in acks {
            match tokio::time::timeout(self.publish_timeout, ack).await {
                Ok(Ok(a)) if a.duplicate => duplicates.extend(envelopes),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(unavailable(&self.url, e)),
                Err(_) => return Err(unavailable(&self.url, "no acknowledgement in time")),
            }
        }
        Ok(duplicates)
    }

    /// Claim one run of a scheduled job (`slot` names it: the instant it is
    /// due), for this process alone: true if no process claimed it before.
    /// Every loomem process sharing the bus runs the scheduler; a claim is a
    /// message on the job's subject of the claims stream published on the
    /// condition that the subject holds none yet, which JetStream checks
    /// atomically, so one process wins each run.
    pub async fn claim(&self, job: &str, slot: i64) -> Result<bool, BusError> {
        self.claims_stream().await?;
        let subject = format!("{CLAIMS_PREFIX}.{}.{slot}", subject_token(job));
        let msg = jetstream::message::PublishMessage::build()
            .payload("claimed".into())
            .expected_last_subject_sequence(0);
        self.publish_claim(&subject, msg).await
    }

    /// Claim the run `key` names unless a process claimed it less than
    /// `window` ago: a lease. The subject's last claim is read, and the new
    /// one is published on the condition that it is still the last, which
    /// JetStream checks atomically; so of the processes that find the lease
    /// expired, one takes it.
    pub async fn claim_window(&self, key: &str, window: Duration) -> Result<Lease, BusError> {
        let stream = self.claims_stream().await?;
        // `~` never starts a job's token, so a lease never meets a job's run.
        let subject = format!("{CLAIMS_PREFIX}.~lease.{}", subject_token(key));
        let last = match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => Some(m),
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => None,
            Err(e) => return Err(unavailable(&self.url, format!("reading {subject}: {e}"))),
        };
        if let Some(m) = &last {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos() as i128;
            let age = Duration::from_nanos((now - m.time.unix_timestamp_nanos()).max(0) as u64);
            if age < window {
                return Ok(Lease::Held { age });
            }
        }
        let msg = jetstream::message::PublishMessage::build()
            .payload("claimed".into())
            .expected_last_subject_sequence(last.map_or(0, |m| m.sequence));
        match self.publish_claim(&subject, msg).await? {
            true => Ok(Lease::Taken),
            false => Ok(Lease::Held {
                age: Duration::ZERO,
            }),
        }
    }

    /// The stream of claims, made at the first claim.
    async fn claims_stream(&self) -> Result<&stream::Stream, BusError> {
        self.claims
            .get_or_try_init(|| async {
                self.js
                    .get_or_create_stream(stream::Config {
                        name: CLAIMS_STREAM.into(),
                        subjects: vec![format!("{CLAIMS_PREFIX}.>")],
                        storage: stream::StorageType::File,
                        max_age: Duration::from_secs(7 * 24 * 3600),
                        max_messages_per_subject: 1,
                        num_replicas: self.replicas,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| unavailable(&self.url, format!("job claims stream: {e}")))
            })
            .await
    }

    /// Publish a conditional claim: false when its condition failed (another
    /// process claimed first).
    async fn publish_claim(
        &self,
        subject: &str,
        msg: jetstream::message::PublishMessage,
    ) -> Result<bool, BusError> {
        let ack = self
            .js
            .send_publish(subject.to_string(), msg)
            .await
            .map_err(|e| unavailable(&self.url, format!("claiming {subject}: {e}")))?;
        match tokio::time::timeout(self.publish_timeout, ack).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(e)) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => {
                Ok(false)
            }
            Ok(Err(e)) => Err(unavailable(&self.url, format!("claiming {subject}: {e}"))),
            Err(_) => Err(unavailable(
                &self.url,
                "no acknowledgement of a claim in time",
            )),
        }
    }

    /// Is the connection up (for status)?
    pub fn connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }
}

/// The `Nats-Msg-Id` of a write: the memory id plus a digest of the whole
/// message, so a publish of the very same message (the client library's
/// retry) is dropped by JetStream, while any other write of the same id goes
/// through: an update of any field, a re-store after a delete (a new request
/// has its own `created_at`), a write sent again on purpose (`resend`).
pub fn message_id(memory_id: &str, payload: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(payload);
    format!("{memory_id}:{}", crate::core::model::hex(&digest[..8]))
}

/// Most writes one message carries, unless `bus.pack_writes` says otherwise.
pub const PACK_WRITES: usize = 256;

/// Most payload bytes a message of several writes carries, for a server
/// whose `max_payload` is `max_payload` (1 MiB unless configured): a quarter
/// of it, at most 256 KiB. A write larger than that travels alone.
fn pack_bytes(max_payload: usize) -> usize {
    match max_payload {
        0 => 256 * 1024,
        n => (n / 4).min(256 * 1024),
    }
}

/// Bytes a pull asks for: 8 MiB (a few hundred packs, thousands of single
/// writes), and never less than two of the largest message the server takes,
/// which a pull smaller than it could never deliver.
fn prefetch_bytes(max_payload: usize) -> usize {
    (8 << 20).max(2 * max_payload)
}

/// One message to publish: one write, or several of one memory stream.
struct Pack {
    subject: String,
    id: String,
    payload: Vec<u8>,
    envelopes: Vec<Envelope>,
}

/// `envelopes` as messages, in order. A run of envelopes with the same
/// subject goes in one message, up to `max_writes` of them and
/// `max_bytes` of payload, as a JSON array of envelopes; a lone envelope is
/// its own JSON object, as every write was before packs. One message a write
/// made JetStream store, deliver and take an acknowledgement for each
/// (a fifth of a bulk import's CPU, README: Benchmarks). A pack's
/// `Nats-Msg-Id` is its first write's id, the number of the others and a
/// digest of the whole, so the very same pack published again is dropped.
fn packs(
    envelopes: Vec<Envelope>,
    max_writes: usize,
    max_bytes: usize,
) -> Result<Vec<Pack>, BusError> {
    let mut out: Vec<Pack> = Vec::new();
    let close = |p: &mut Pack| match p.envelopes.len() {
        1 => p.id = message_id(&p.envelopes[0].chunk.id, &p.payload),
        n => {
            p.payload.insert(0, b'[');
            p.payload.push(b']');
            let first = format!("{}+{}", p.envelopes[0].chunk.id, n - 1);
            p.id = message_id(&first, &p.payload);
        }
    };
    for e in envelopes {
        let payload = serde_json::to_vec(&e).map_err(|e| BusError::Encode(e.to_string()))?;
        let subject = format!("{SUBJECT_PREFIX}.{}", subject_token(&e.chunk.stream));
        match out.last_mut() {
            Some(p)
                if p.subject == subject
                    && p.envelopes.len() < max_writes
                    && p.payload.len() + payload.len() + 3 <= max_bytes =>
            {
                p.payload.push(b',');
                p.payload.extend_from_slice(&payload);
                p.envelopes.push(e);
            }
            last => {
                if let Some(p) = last {
                    close(p);
                }
                out.push(Pack {
                    subject,
                    id: String::new(),
                    payload,
                    envelopes: vec![e],
                });
            }
        }
    }
    if let Some(p) = out.last_mut() {
        close(p);
    }
    Ok(out)
}

/// A delivered message, shared by the deliveries of the writes it carried:
/// it is acknowledged once every one of them is settled, or redelivered
/// (after the longest delay asked) if any asked to be retried. A write
/// stored before a redelivery is stored again unchanged (an upsert by id).
pub struct Held {
    message: Message,
    /// Writes not yet settled, and the longest retry delay asked.
    left: std::sync::Mutex<(usize, Option<Duration>)>,
}

impl Held {
    pub(super) async fn settle(&self, retry: Option<Duration>) {
        let done = {
            let mut left = self.left.lock().expect("held message lock");
            left.0 = left.0.saturating_sub(1);
            if let Some(delay) = retry {
                left.1 = Some(left.1.map_or(delay, |d| d.max(delay)));
            }
            (left.0 == 0).then_some(left.1)
        };
        match done {
            Some(None) => ack(&self.message).await,
            Some(Some(delay)) => nak(&self.message, delay).await,
            None => {}
        }
    }

    pub(super) async fn in_progress(&self) {
        in_progress(&self.message).await
    }
}

impl JetStreamConsumer {
    async fn stream(&mut self) -> Result<&mut consumer::pull::Stream, String> {
        if self.messages.is_none() {
            let s = self
                .consumer
                .stream()
                .max_messages_per_batch(self.prefetch)
                .max_bytes_per_batch(self.prefetch_bytes)
                .heartbeat(Duration::from_secs(5))
                .expires(Duration::from_secs(30))
                .messages()
                .await
                .map_err(|e| e.to_string())?;
            self.messages = Some(s);
        }
        Ok(self.messages.as_mut().expect("just set"))
    }

    /// Up to `max` deliveries, waiting at most `wait` after the first; None once
    /// the worker is told to stop. Connection trouble is retried with backoff.
    pub async fn next_batch(&mut self, max: usize, wait: Duration) -> Option<Vec<Delivery>> {
        let mut backoff = Duration::from_millis(100);
        let first = loop {
            if *self.stop.borrow() {
                return None;
            }
            let mut stop = self.stop.clone();
            let next = match self.stream().await {
                Ok(s) => {
                    tokio::select! {
                        _ = stop.changed() => return None,
                        m = s.next() => m.map(|r| r.map_err(|e| e.to_string())),
                    }
                }
                Err(e) => Some(Err(e)),
            };
            match next {
                Some(Ok(m)) => break m,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, ?backoff, "JetStream pull failed; retrying");
                    self.messages = None;
                    tokio::select! {
                        _ = stop.changed() => return None,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                None => self.messages = None,
            }
        };
        let mut batch = deliveries(first);
        let deadline = tokio::time::Instant::now() + wait;
        while batch.len() < max {
            let Some(s) = self.messages.as_mut() else {
                break;
            };
            match tokio::time::timeout_at(deadline, s.next()).await {
                Ok(Some(Ok(m))) => batch.extend(deliveries(m)),
                Ok(Some(Err(e))) => {
                    tracing::warn!(error = %e, "JetStream pull failed mid-batch");
                    self.messages = None;
                    break;
                }
                Ok(None) => {
                    self.messages = None;
                    break;
                }
                Err(_) => break,
            }
        }
        Some(batch)
    }
}

/// The deliveries of the writes `m` carries: one, or a pack's (a JSON
/// array). A message that does not decode is one poisoned delivery.
fn deliveries(m: Message) -> Vec<Delivery> {
    let attempt = m.info().map(|i| i.delivered.max(1) as u32).unwrap_or(1);
    if attempt > 1 {
        crate::core::metrics::metrics().bus_redeliveries.inc();
    }
    let packed = m.payload.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    let decoded = match packed {
        true => {
            serde_json::from_slice::<Vec<Envelope>>(&m.payload).and_then(|v| match v.is_empty() {
                true => Err(serde::de::Error::custom("an empty pack")),
                false => Ok(v),
            })
        }
        false => serde_json::from_slice::<Envelope>(&m.payload).map(|e| vec![e]),
    };
    let envelopes: Vec<Result<Envelope, super::Poison>> = match decoded {
        Ok(v) => v.into_iter().map(Ok).collect(),
        Err(e) => vec![Err(super::Poison {
            raw: String::from_utf8_lossy(&m.payload[..m.payload.len().min(64 * 1024)]).into_owned(),
            error: format!("undecodable message on {}: {e}", m.subject),
        })],
    };
    let held = std::sync::Arc::new(Held {
        message: m,
        left: std::sync::Mutex::new((envelopes.len(), None)),
    });
    envelopes
        .into_iter()
        .map(|envelope| Delivery {
            envelope,
            attempt,
            settle: Settle::JetStream(held.clone()),
        })
        .collect()
}

async fn ack(m: &Message) {
    if let Err(e) = m.ack().await {
        tracing::warn!(error = %e, "ack failed; the message will be redelivered (harmless: upsert by id)");
    }
}

async fn nak(m: &Message, delay: Duration) {
    if let Err(e) = m.ack_with(AckKind::Nak(Some(delay))).await {
        tracing::warn!(error = %e, "nak failed; the message will be redelivered after ack_wait");
    }
}

/// Reset the message's ack deadline: the worker still holds it.
async fn in_progress(m: &Message) {
    if let Err(e) = m.ack_with(AckKind::Progress).await {
        tracing::debug!(error = %e, "in-progress ack failed; the message may be redelivered (harmless: upsert by id)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(id: &str, stream: &str, text: &str) -> Envelope {
        Envelope {
            pipeline: "import".into(),
            chunk: crate::core::model::Chunk::new(id.into(), stream.into(), text.into(), 1),
            notify: false,
            minted: false,
            resend: 0,
        }
    }

    fn ids(p: &Pack) -> Vec<&str> {
        p.envelopes.iter().map(|e| e.chunk.id.as_str()).collect()
    }

    #[test]
    fn runs_of_one_stream_travel_together_up_to_the_limits() {
        let mut all: Vec<Envelope> = (0..PACK_WRITES + 6)
            .map(|i| env(&format!("a{i}"), "a", "x"))
            .collect();
        all.push(env("b0", "b", "y"));
        all.push(env("a-last", "a", "z"));
        let packs = packs(all, PACK_WRITES, 1 << 20).unwrap();
        let sizes: Vec<usize> = packs.iter().map(|p| p.envelopes.len()).collect();
        assert_eq!(sizes, vec![PACK_WRITES, 6, 1, 1]);
        assert_eq!(packs[1].subject, "loomem.in.a");
        assert_eq!(packs[2].subject, "loomem.in.b");
        // A pack is a JSON array of the envelopes, in order; a lone write
        // is the envelope itself, as before packs.
        let decoded: Vec<Envelope> = serde_json::from_slice(&packs[1].payload).unwrap();
        let decoded: Vec<&str> = decoded.iter().map(|e| e.chunk.id.as_str()).collect();
        assert_eq!(decoded, ids(&packs[1]));
        let lone: Envelope = serde_json::from_slice(&packs[2].payload).unwrap();
        assert_eq!(lone.chunk.id, "b0");
        assert_eq!(packs[2].id, message_id("b0", &packs[2].payload));
        let second = format!("a{PACK_WRITES}+5:");
        assert!(packs[1].id.starts_with(&second), "{}", packs[1].id);
    }

    #[test]
    fn packs_of_one_are_a_message_a_write() {
        let all: Vec<Envelope> = (0..3).map(|i| env(&format!("a{i}"), "a", "x")).collect();
        let packs = packs(all, 1, 1 << 20).unwrap();
        assert_eq!(packs.len(), 3);
        for p in &packs {
            let e: Envelope = serde_json::from_slice(&p.payload).unwrap();
            assert_eq!(p.id, message_id(&e.chunk.id, &p.payload));
        }
    }

    #[test]
    fn a_pack_stays_within_its_bytes_and_a_large_write_goes_alone() {
        let big = "w".repeat(3000);
        let all = vec![
            env("s1", "a", "small"),
            env("s2", "a", "small"),
            env("big", "a", &big),
            env("s3", "a", "small"),
        ];
        let packs = packs(all, PACK_WRITES, 2048).unwrap();
        let groups: Vec<Vec<&str>> = packs.iter().map(ids).collect();
        assert_eq!(groups, vec![vec!["s1", "s2"], vec!["big"], vec!["s3"]]);
        assert!(packs[0].payload.len() <= 2048);
    }

    #[test]
    fn the_same_pack_has_the_same_message_id_and_any_change_another() {
        let make = |text: &str| {
            packs(
                vec![env("a", "s", "one"), env("b", "s", text)],
                PACK_WRITES,
                1 << 20,
            )
            .unwrap()
            .remove(0)
            .id
        };
        assert_eq!(make("two"), make("two"));
        assert_ne!(make("two"), make("three"));
    }

    #[test]
    fn pulls_ask_for_at_least_two_of_the_largest_message() {
        assert_eq!(pack_bytes(1 << 20), 256 * 1024);
        assert_eq!(pack_bytes(64 * 1024), 16 * 1024);
        assert_eq!(prefetch_bytes(1 << 20), 8 << 20);
        assert_eq!(prefetch_bytes(64 << 20), 128 << 20);
    }
}
