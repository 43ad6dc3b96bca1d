//! Daemon-wide information: status, the caller's identity, namespaces.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::core::error::Result;
use crate::core::{Caller, Role};
use crate::pipeline::StageStatsSnapshot;
use crate::service::Services;
use crate::store::Filter;

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Status {
    pub status: &'static str,
    pub uptime_secs: u64,
    pub config_summary: ConfigSummary,
    pub chunks: usize,
    pub dead_letters: usize,
    pub bus: BusStatus,
    pub embedder: EmbedderStatus,
    pub llm: LlmStatus,
    /// Requests this process refused for a rate limit (admins only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<crate::service::limits::LimitStats>,
    /// Quiet streams this process dreamed, and those another process sharing
    /// the bus dreamed for it (admins only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_dreams: Option<crate::service::dream::IdleStats>,
    /// Cumulative per-stage counts and timings, by pipeline (daemon-wide, so
    /// empty for a caller that is not an admin).
    pub pipelines: BTreeMap<String, Vec<StageStatsSnapshot>>,
}

/// The optional LLM: whether one is configured, its model, and the entity
/// queue's counters (queued, enriched, skipped for the budget, dropped when
/// full, failed calls).
#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct LlmStatus {
    pub configured: bool,
    pub model: Option<String>,
    pub ner: Option<crate::pipeline::ner::NerStats>,
}

/// The reference's summary keys; `rocksdb_keys` and `tantivy_docs` count the
/// chunks and the full-text-searchable chunks (every chunk: unindexed rows are
/// scored flat until the index is refreshed).
#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct ConfigSummary {
    pub vector_enabled: bool,
    pub tantivy_enabled: bool,
    pub scheduler_enabled: bool,
    pub rocksdb_keys: usize,
    pub tantivy_docs: usize,
    pub embeddings_count: usize,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct BusStatus {
    pub kind: &'static str,
    pub connected: bool,
    /// The pipeline's backlog on the bus (daemon-wide: admins only; absent
    /// when the bus cannot be asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<crate::bus::Lag>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct EmbedderStatus {
    pub provider: crate::providers::embed::config::EmbedProvider,
    pub model: String,
    pub dim: usize,
    /// Chunks without a vector of this model (none, or another model's): vector
    /// search skips them until `POST /v1/embed-missing`.
    pub stale: usize,
    /// The caller's embedding job running now, if any.
    pub job: Option<crate::service::tasks::TaskView>,
}

impl Status {
    /// The flat shape of MCP `memory_status`, plus the bus and embedder.
    pub fn for_mcp(&self) -> serde_json::Value {
        let c = &self.config_summary;
        serde_json::json!({
            "status": self.status,
            "uptime_secs": self.uptime_secs,
            "rocksdb_keys": c.rocksdb_keys,
            "tantivy_docs": c.tantivy_docs,
            "embeddings_count": c.embeddings_count,
            "vector": c.vector_enabled,
            "tantivy": c.tantivy_enabled,
            "scheduler": c.scheduler_enabled,
            "dead_letters": self.dead_letters,
            "bus": self.bus,
            "embedder": {"provider": self.embedder.provider, "model": self.embedder.model, "stale": self.embedder.stale},
        })
    }
}

/// The status as `caller` may see it: counts of its own streams; the
/// daemon-wide pipeline and NER counters only for an admin; the caller's own
/// running embedding job.
pub async fn status(engine: &Services, caller: &Caller) -> Result<Status> {
    let scope = Filter::new().visible_to(caller);
    let admin = caller.is_admin();
    let chunks = engine.store.count(&scope).await?;
    let embedded = engine
        .store
        .count(&engine.store.with_vectors(scope.clone()))
        .await?;
    Ok(Status {
        status: "ok",
        uptime_secs: engine.uptime().as_secs(),
        config_summary: ConfigSummary {
            vector_enabled: engine.cfg.search.vector_weight > 0.0,
            tantivy_enabled: engine.cfg.search.bm25_weight > 0.0,
            scheduler_enabled: engine.cfg.scheduler_enabled,
            rocksdb_keys: chunks,
            tantivy_docs: chunks,
            embeddings_count: embedded,
        },
        chunks,
        dead_letters: engine.store.count_dead_letters(&scope).await?,
        bus: BusStatus {
            kind: engine.bus.kind(),
            connected: engine.bus.connected(),
            lag: if admin {
                engine.bus.lag().await.ok()
            } else {
                None
            },
        },
        embedder: EmbedderStatus {
            provider: engine.cfg.embed.provider,
            model: engine.embedder.model().to_string(),
            dim: engine.embedder.dim(),
            stale: engine
                .store
                .count(&scope.clone().stale_for(engine.embedder.model()))
                .await?,
            job: engine
                .jobs
                .running(&crate::service::reembed::group(&caller.name))
                .map(|j| j.view()),
        },
        llm: LlmStatus {
            configured: engine.llm.is_some(),
            model: engine.llm.as_ref().map(|l| l.model().to_string()),
            ner: engine.ner.as_ref().filter(|_| admin).map(|q| q.stats()),
        },
        rate_limits: admin.then(|| engine.limits.stats()),
        idle_dreams: admin.then(|| engine.idle_dreams.stats()),
        pipelines: if admin {
            engine
                .pipelines
                .all()
                .map(|p| (p.name.clone(), p.stats()))
                .collect()
        } else {
            BTreeMap::new()
        },
    })
}

/// The metrics in the Prometheus text format, with the levels that are read
/// rather than counted (table rows and versions, the bus's backlog) brought
/// up to date first. Daemon-wide: admins only.
pub async fn metrics(engine: &Services, caller: &Caller) -> Result<String> {
    caller.require_admin()?;
    let m = crate::core::metrics::metrics();
    for (table, rows, version) in engine.store.table_stats().await? {
        m.table_rows.with_label_values(&[table]).set(rows as i64);
        m.table_version
            .with_label_values(&[table])
            .set(version as i64);
    }
    match engine.bus.lag().await {
        Ok(lag) => m
            .bus_pending
            .with_label_values(&[lag.stream.as_str()])
            .set(lag.pending as i64),
        Err(e) => tracing::warn!(error = %e, "the bus's backlog is unknown"),
    }
    Ok(m.render())
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct WhoAmI {
    pub name: String,
    pub role: Role,
    pub active_stream: String,
    /// `["*"]` for a key that sees every stream.
    pub accessible_streams: Vec<String>,
    pub auth_mode: &'static str,
}

pub fn whoami(caller: &Caller) -> WhoAmI {
    WhoAmI {
        name: caller.name.clone(),
        role: caller.role,
        active_stream: caller.default_stream().to_string(),
        accessible_streams: caller.streams.clone().unwrap_or_else(|| vec!["*".into()]),
        auth_mode: if caller.name == crate::service::auth::PASSTHROUGH {
            "passthrough"
        } else {
            "token"
        },
    }
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Namespaces {
    pub namespaces: BTreeMap<String, String>,
}

/// The configured namespace labels whose streams the caller may see.
pub fn namespaces(caller: &Caller) -> Namespaces {
    Namespaces {
        namespaces: caller
            .namespaces
            .iter()
            .filter(|(_, stream)| caller.can_see(stream))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}
