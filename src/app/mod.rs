//! The running engine: storage, embedder, bus, pipelines and the worker, wired
//! together once. REST, MCP and the CLI all call into it.

pub mod config;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::app::config::Config;
use crate::bus::config::BusKind;
use crate::bus::{Bus, Consumer, EmbeddedBus, JetStreamBus, Notifier};
use crate::pipeline::worker::{Worker, WorkerConfig};
use crate::pipeline::{BuildContext, Pipelines};
use crate::providers::embed::{self, Embedder};
use crate::providers::llm::Llm;
use crate::service::auth::Auth;
use crate::service::facts::RuleExtractor;
use crate::service::{ServiceConfig, Services};
use crate::store::Store;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("storage: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("embedder: {0}")]
    Embed(#[from] crate::providers::embed::EmbedError),
    #[error("{0}")]
    Pipeline(#[from] crate::pipeline::PipelineError),
    #[error("{0}")]
    Bus(#[from] crate::bus::BusError),
    #[error("llm: {0}")]
    Llm(#[from] crate::providers::openai_compat::HttpError),
    #[error("ingest rules: {0}")]
    Rules(#[from] crate::service::facts::rules::RulesError),
    #[error("auth: {0}")]
    Auth(#[from] crate::service::auth::AuthError),
    #[error("cannot start the read runtime: {0}")]
    Reads(std::io::Error),
    #[error("the id key in the data directory: {0}")]
    IdKey(crate::store::location::LocationError),
}

/// A running loomem: the shared [`Services`] plus what starts and stops them
/// (the pipeline worker, the scheduler). Derefs to its services.
pub struct Engine {
    pub cfg: Config,
    pub services: Arc<Services>,
    stop_scheduler: watch::Sender<bool>,
    stop_worker: watch::Sender<bool>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::ops::Deref for Engine {
    type Target = Services;
    fn deref(&self) -> &Services {
        &self.services
    }
}

impl Engine {
    /// Open the store, build the pipelines and start the pipeline worker.
    pub async fn start(
        cfg: Config,
        env: &HashMap<String, String>,
    ) -> Result<Arc<Engine>, StartError> {
        let embedder = embed::from_config(&cfg.embed, env)?;
        Engine::start_with(cfg, env, embedder).await
    }

    /// [`Engine::start`] with a given embedder (bench-recall wraps the
    /// configured one in a cache).
    pub async fn start_with(
        cfg: Config,
        env: &HashMap<String, String>,
        embedder: Arc<dyn Embedder>,
    ) -> Result<Arc<Engine>, StartError> {
        // Keys first: a config that asks for protection it cannot have stops
        // here, before anything is opened.
        let auth = Auth::from_config(&cfg.server, Arc::new(cfg.namespaces.clone()), env)?;
        if auth.passthrough() {
            tracing::warn!(
                var = %cfg.server.auth_token_env,
                "no API key configured: local passthrough mode, every request is accepted as admin"
            );
        }
        let location = cfg.data_location();
        let keys = crate::store::api_keys::KeyTable::open(&location).await?;
        let auth = auth.with_runtime_keys(keys.clone());
        let ids = location.id_key().await.map_err(StartError::IdKey)?;
        let store = Arc::new(
            Store::open_with(
                &location,
                embedder.dim(),
                cfg.storage.write_batch_max_rows,
                Some(Duration::from_millis(cfg.storage.read_consistency_ms)),
                cfg.storage.maintenance(),
            )
            .await?
            .for_model(embedder.model())
            .with_hot_budget(cfg.storage.hot_index_bytes()),
        );
        let stale = store
            .count(&crate::store::Filter::new().stale_for(embedder.model()))
            .await?;
        if stale > 0 {
            tracing::warn!(
                stale,
                model = embedder.model(),
                "chunks without a vector of the current embedding model: vector search skips them until POST /v1/embed-missing"
            );
        }
        let llm = Llm::from_config(&cfg.llm, env, store.clone())?;
        let facts = Arc::new(RuleExtractor::load(&cfg.ingest_rules_file())?);
        let ner = llm
            .as_ref()
            .filter(|_| cfg.llm.ner)
            .map(|llm| crate::pipeline::ner::NerQueue::spawn(llm.clone(), store.clone()));
        let ctx = BuildContext {
            store: store.clone(),
            embedder: embedder.clone(),
            llm: llm.clone(),
            ner: ner.clone(),
            dir: cfg.pipelines_dir(),
        };
        let pipelines = Arc::new(Pipelines::load(
            &cfg.pipelines_dir(),
            &["store", "import", "ingest"],
            &ctx,
        )?);
        let (stop_worker, stop_rx) = watch::channel(false);
        let (bus, consumer, notifier) = match cfg.bus.kind {
            BusKind::Embedded => {
                let (bus, consumer) = EmbeddedBus::new(cfg.bus.queue_capacity);
                (
                    Bus::Embedded(bus),
                    Consumer::Embedded(consumer),
                    Notifier::Local(Default::default()),
                )
            }
            BusKind::Jetstream => {
                let (bus, consumer) = JetStreamBus::connect(&cfg.bus, stop_rx).await?;
                let notifier = Notifier::Nats(bus.client().clone());
                (Bus::JetStream(bus), Consumer::JetStream(consumer), notifier)
            }
        };
        let worker = Worker {
            pipelines: pipelines.clone(),
            store: store.clone(),
            notifier: notifier.clone(),
            cfg: WorkerConfig {
                batch_size: cfg.bus.batch_size,
                batch_wait: Duration::from_millis(cfg.bus.batch_wait_ms),
                max_deliver: cfg.bus.max_deliver,
                keepalive: Duration::from_millis(cfg.bus.ack_wait_ms / 3),
            },
        };
        let worker = tokio::spawn(worker.run(consumer));
        let access = crate::service::search::access::AccessTracker::spawn(
            store.clone(),
            Duration::from_millis(cfg.search.access_flush_ms),
        );
        spawn_vector_indexer(store.clone(), cfg.search.vector_index_min_rows);
        let services = Arc::new(Services {
            cfg: ServiceConfig {
                server: cfg.server.clone(),
                embed: cfg.embed.clone(),
                search: cfg.search.clone(),
                sql: cfg.sql.clone(),
                ingest: cfg.ingest.clone(),
                scheduler_enabled: cfg.scheduler.enabled,
                pre_delete_snapshots: cfg.storage.pre_delete_snapshots,
            },
            store,
            embedder,
            bus,
            notifier,
            pipelines,
            auth,
            limits: crate::service::limits::RateLimiter::new(cfg.server.rate_limit.clone()),
            oauth: crate::service::oauth::OAuth::new(
                cfg.oauth.clone(),
                crate::store::oauth::OAuthTables::open(&location).await?,
                keys.clone(),
            ),
            keys,
            llm,
            facts,
            ner,
            jobs: Default::default(),
            access,
            queries: Default::default(),
            reads: crate::service::reads::Reads::start(cfg.search.read_niceness)
                .map_err(StartError::Reads)?,
            profiles: Default::default(),
            ids,
            dreams: Default::default(),
            idle_dreams: Default::default(),
            checkouts: Default::default(),
            workers: Default::default(),
            started: Instant::now(),
        });
        let engine = Arc::new(Engine {
            cfg,
            services,
            stop_scheduler: watch::channel(false).0,
            stop_worker,
            worker: Mutex::new(Some(worker)),
        });
        engine.start_scheduler();
        Ok(engine)
    }

    /// Start the cron loop of the enabled jobs (when `[scheduler] enabled`).
    pub fn start_scheduler(self: &Arc<Engine>) {
        let idle = self.cfg.scheduler.dream_after_idle_secs;
        if idle > 0 {
            let store: Arc<dyn crate::jobs::idle::Activity> = self.store.clone();
            crate::jobs::idle::IdleDream {
                activity: Arc::downgrade(&store),
                dreamer: crate::jobs::idle::dreamer(Arc::downgrade(&self.services)),
                log: Arc::new(crate::jobs::StoreRunLog(self.store.clone())),
                clock: crate::jobs::scheduler::Clock::system(),
                pause: self.workers.clone(),
                lease: self.dream_leases(),
                tally: self.idle_dreams.clone(),
                idle: Duration::from_secs(idle),
            }
            .spawn(self.stop_scheduler.subscribe());
        }
        if !self.cfg.scheduler.enabled {
            return;
        }
        let jobs: Vec<_> = self
            .cfg
            .scheduler
            .jobs
            .iter()
            .filter(|(_, j)| j.enabled)
            .filter_map(|(name, j)| crate::jobs::scheduler::Scheduled::new(name, &j.cron).ok())
            .collect();
        tracing::info!(jobs = ?jobs.iter().map(|j| j.name.clone()).collect::<Vec<_>>(), "scheduler started");
        crate::jobs::scheduler::spawn(
            jobs,
            crate::jobs::scheduler::Clock::system(),
            crate::jobs::runner(self.job_env(), false),
            Arc::new(crate::jobs::StoreRunLog(self.store.clone())),
            self.workers.clone(),
            self.job_claims(),
            self.stop_scheduler.subscribe(),
        );
    }

    /// Every process sharing the bus runs the scheduler; each scheduled run
    /// starts in the one process that claims it on the bus first.
    fn job_claims(&self) -> crate::jobs::scheduler::Claim {
        let services = Arc::downgrade(&self.services);
        Arc::new(move |job, slot| {
            let services = services.clone();
            Box::pin(async move {
                match services.upgrade() {
                    Some(s) => s.bus.claim(&job, slot).await.map_err(|e| e.to_string()),
                    None => Ok(false),
                }
            })
        })
    }

    /// The idle dream's leases, on the bus every process shares.
    fn dream_leases(&self) -> crate::jobs::idle::Leaser {
        let services = Arc::downgrade(&self.services);
        Arc::new(move |key, window| {
            let services = services.clone();
            Box::pin(async move {
                match services.upgrade() {
                    Some(s) => s
                        .bus
                        .claim_window(&key, window)
                        .await
                        .map_err(|e| e.to_string()),
                    None => Err("the engine has stopped".to_string()),
                }
            })
        })
    }

    fn job_env(&self) -> crate::jobs::JobEnv {
        crate::jobs::JobEnv {
            services: Arc::downgrade(&self.services),
            jobs: self.cfg.scheduler.jobs.clone(),
            base_dir: self.cfg.base_dir.clone(),
            object_settings: self.cfg.object_settings.clone(),
            spool_dir: self.cfg.spool_dir(),
        }
    }

    /// Run a maintenance job now and record it (trigger `manual`).
    pub async fn run_job(
        self: &Arc<Engine>,
        name: &str,
        dry_run: bool,
    ) -> crate::core::error::Result<crate::jobs::scheduler::JobRun> {
        if !crate::jobs::JOB_NAMES.contains(&name) {
            return Err(crate::jobs::unknown(name));
        }
        Ok(crate::jobs::scheduler::run_and_record(
            name,
            crate::jobs::scheduler::Trigger::Manual,
            dry_run,
            crate::jobs::scheduler::Clock::system(),
            crate::jobs::runner(self.job_env(), dry_run),
            &crate::jobs::StoreRunLog(self.store.clone()),
        )
        .await)
    }

    /// Stop taking writes, let the worker finish (embedded: drain the queue;
    /// JetStream: finish the batch in hand, the rest stays in the stream), flush
    /// the writer.
    pub async fn shutdown(&self) {
        let _ = self.stop_scheduler.send(true);
        if let Bus::Embedded(b) = &self.bus {
            b.close();
        }
        let _ = self.stop_worker.send(true);
        let worker = self.worker.lock().expect("worker lock").take();
        if let Some(worker) = worker {
            let _ = worker.await;
        }
        if let Err(e) = self.access.flush().await {
            tracing::warn!(error = %e, "access counters lost at shutdown");
        }
        self.store.close().await;
        tracing::info!("engine stopped; all accepted writes are committed");
    }
}

/// Rows committed within one of the vector indexer's minutes past which
/// rows are pouring in (a bulk import), and the build waits...
const POURING_ROWS_A_MINUTE: u64 = 60_000;
/// ...for at most this many minutes in a row.
const MOST_MINUTES_DEFERRED: u32 = 10;

/// Whether the vector index's build waits another minute, `written` rows
/// having been committed in the last one and the build having waited
/// `deferred` minutes already. Its first build trains on every row and
/// takes one of the two cores for a minute or more at a million rows: begun
/// in the middle of a bulk import, it took a tenth of the import's rate.
/// Built once the rows stop pouring, it costs the same, after the import;
/// meanwhile searches the hot index does not serve scan the rows flat, as
/// they do before the table is big enough for an index. A writer that
/// never rests still gets its index within [`MOST_MINUTES_DEFERRED`].
fn defer_vector_build(written: u64, deferred: u32) -> bool {
    written >= POURING_ROWS_A_MINUTE && deferred < MOST_MINUTES_DEFERRED
}

/// Build the vector ANN index once the table is big enough: checked at start
/// and then every minute, off the request path, until the index exists
/// (see [`defer_vector_build`]).
fn spawn_vector_indexer(store: Arc<Store>, min_rows: usize) {
    let weak = Arc::downgrade(&store);
    let mut last = store.rows_written();
    drop(store);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        let mut deferred = 0;
        loop {
            tick.tick().await;
            let Some(store) = weak.upgrade() else { break };
            let written = store.rows_written();
            let pouring = defer_vector_build(written - last, deferred);
            last = written;
            if pouring {
                deferred += 1;
                continue;
            }
            deferred = 0;
            // Training the index is minutes of computation: apart from the
            // workers that serve requests and commit writes.
            let building = store.clone();
            let built = crate::store::maintain::apart(async move {
                building.ensure_vector_index(min_rows).await
            })
            .await;
            match built {
                Ok(_) if store.has_vector_index().await => break,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "vector index not built; will retry"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bulk import holds the build off, for ten minutes at most; a trickle
    /// of stores (an agent's 250 a second) never does.
    #[test]
    fn the_vector_build_waits_for_pouring_rows_but_not_for_ever() {
        assert!(!defer_vector_build(0, 0));
        assert!(!defer_vector_build(250 * 60, 0));
        assert!(defer_vector_build(900_000, 0));
        let mut deferred = 0;
        while defer_vector_build(900_000, deferred) {
            deferred += 1;
        }
        assert_eq!(deferred, MOST_MINUTES_DEFERRED);
    }
}
