//! One module per behaviour. Each service function takes the narrow handles it
//! uses (often the shared [`Services`] handles, or just the store) and the
//! [`Caller`](crate::core::Caller); the edges (REST, MCP, CLI) only parse, call
//! one of these and shape the answer.

pub mod associate;
pub mod auth;
pub mod branch;
pub mod bulk;
pub mod context;
pub mod conversation;
pub mod decay;
pub mod dream;
pub mod edit;
pub mod export;
pub mod facts;
pub mod feedback;
pub mod forget;
pub mod graph;
pub mod graph_rank;
pub mod import;
pub mod keys;
pub mod limits;
pub mod listing;
pub mod maintenance;
pub mod memory;
pub mod oauth;
pub mod reads;
pub mod reembed;
pub mod reflect;
pub mod relations;
pub mod search;
pub mod snapshot;
pub mod sql;
pub mod status;
pub mod tasks;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bus::{Bus, Notifier};
use crate::pipeline::ner::NerQueue;
use crate::pipeline::Pipelines;
use crate::providers::embed::config::EmbedConfig;
use crate::providers::embed::Embedder;
use crate::providers::llm::Llm;
use crate::store::Store;

/// The configuration sections services read, copied out of the daemon config.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub server: auth::ServerConfig,
    pub embed: EmbedConfig,
    pub search: search::config::SearchConfig,
    pub sql: sql::SqlConfig,
    pub ingest: conversation::IngestConfig,
    /// Whether the cron scheduler runs (shown in `/v1/status`).
    pub scheduler_enabled: bool,
    /// `[storage] pre_delete_snapshots`: how many bulk-delete snapshots stay.
    pub pre_delete_snapshots: usize,
}

/// The shared handles and caches of a running loomem: what service functions
/// take. The composition root (`app`) builds one and owns its lifecycle.
pub struct Services {
    pub cfg: ServiceConfig,
    pub store: Arc<Store>,
    pub embedder: Arc<dyn Embedder>,
    pub bus: Bus,
    pub notifier: Notifier,
    pub pipelines: Arc<Pipelines>,
    pub auth: auth::Auth,
    /// OAuth 2.1 for remote MCP clients.
    pub oauth: oauth::OAuth,
    /// Per-key request budgets.
    pub limits: limits::RateLimiter,
    /// The keys made at runtime (`keys`), which `auth` also reads.
    pub keys: crate::store::api_keys::KeyTable,
    /// The deployment's key for derived ids (see [`crate::core::ids`]).
    pub ids: crate::core::IdKey,
    /// The configured LLM, if any.
    pub llm: Option<Arc<Llm>>,
    /// The rule extractor of `POST /v1/ingest`.
    pub facts: Arc<facts::RuleExtractor>,
    /// The LLM entity queue, when the LLM does NER.
    pub ner: Option<NerQueue>,
    /// Background tasks started through the API.
    pub jobs: tasks::Tasks,
    /// Buffered access counters of recalled memories.
    pub access: search::access::AccessTracker,
    /// Recent query vectors.
    pub queries: search::queries::QueryVectors,
    /// The runtime searches and context packs run on (see [`reads`]).
    pub reads: reads::Reads,
    /// Cached profiles per stream (see [`context`]).
    pub profiles: context::ProfileCache,
    /// Streams a dream is running on.
    pub dreams: dream::Running,
    /// What the idle dream settled in this process.
    pub idle_dreams: Arc<dream::IdleTally>,
    /// The branch each key has checked out (Memoria's checkout).
    pub checkouts: branch::Checkouts,
    /// Pauses background maintenance (`/admin/workers/pause`; not persisted).
    pub workers: tasks::Pause,
    pub started: Instant,
}

impl Services {
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}
