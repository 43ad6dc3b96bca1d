//! Maintenance jobs (`dream`, `decay`, `compact`, `reembed`, `export`,
//! `snapshot`, `graph`) are one file each,
//! `run_once(ctx) -> JobReport`, run by the cron [`scheduler`] or on demand;
//! every run lands in the `job_runs` table.

pub mod compact;
pub mod config;
pub mod decay;
pub mod dream;
pub mod export;
pub mod graph;
pub mod idle;
pub mod reembed;
pub mod scheduler;
pub mod snapshot;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use crate::service::Services;

use crate::core::model::Micros;

/// What a maintenance job reports (JSON, kept as text in `job_runs.report`).
pub type JobReport = serde_json::Value;

/// A job run as the API shows it (times in RFC 3339, the report as JSON).
#[derive(schemars::JsonSchema, Debug, serde::Serialize)]
pub struct RunView {
    pub id: String,
    pub job: String,
    pub trigger: String,
    pub status: String,
    pub started_at: String,
    pub finished_at: String,
    pub duration_ms: i64,
    pub dry_run: bool,
    pub report: Option<serde_json::Value>,
    pub error: Option<String>,
}

impl From<crate::jobs::scheduler::JobRun> for RunView {
    fn from(r: crate::jobs::scheduler::JobRun) -> RunView {
        RunView {
            duration_ms: (r.finished_at - r.started_at) / 1000,
            started_at: crate::core::time::to_rfc3339(r.started_at),
            finished_at: crate::core::time::to_rfc3339(r.finished_at),
            report: r
                .report
                .as_deref()
                .and_then(|t| serde_json::from_str(t).ok()),
            id: r.id,
            job: r.job,
            trigger: r.trigger,
            status: r.status,
            dry_run: r.dry_run,
            error: r.error,
        }
    }
}

/// The maintenance jobs, by name.
pub const JOB_NAMES: &[&str] = &[
    "dream", "decay", "compact", "reembed", "export", "snapshot", "graph",
];

/// What a job run gets: the services, whether to change anything, its params.
pub struct JobContext {
    pub services: Arc<Services>,
    pub dry_run: bool,
    pub params: toml::Table,
    /// Relative paths (export targets) resolve against this directory.
    pub base_dir: PathBuf,
    /// How `s3://` export targets are reached (`Config::object_settings`).
    pub object_settings: BTreeMap<String, String>,
    /// Where an export bound for a bucket is written first (`Config::spool_dir`).
    pub spool_dir: PathBuf,
}

impl JobContext {
    /// `path` as the job should open it: relative paths against `base_dir`.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }
}

/// A job's params as its typed struct: unknown or mistyped keys are a 422
/// naming `scheduler.jobs.<job>.params`.
pub fn params<T: serde::de::DeserializeOwned>(
    ctx: &JobContext,
    job: &str,
) -> crate::core::error::Result<T> {
    toml::Value::Table(ctx.params.clone())
        .try_into()
        .map_err(|e: toml::de::Error| {
            crate::core::error::Error::invalid(
                &format!("scheduler.jobs.{job}.params"),
                e.to_string(),
            )
        })
}

/// A job's typed report as the JSON the run log keeps.
pub fn report<T: serde::Serialize>(report: &T) -> crate::core::error::Result<JobReport> {
    serde_json::to_value(report).map_err(|e| crate::core::error::Error::Internal(e.to_string()))
}

/// The answer for a job name not in [`JOB_NAMES`].
pub fn unknown(name: &str) -> crate::core::error::Error {
    crate::core::error::Error::NotFound(format!("no job `{name}` (jobs: {})", JOB_NAMES.join(", ")))
}

/// Run one maintenance job by name.
pub async fn run_once(ctx: &JobContext, name: &str) -> crate::core::error::Result<JobReport> {
    match name {
        "dream" => dream::run_once(ctx).await,
        "decay" => decay::run_once(ctx).await,
        "compact" => compact::run_once(ctx).await,
        "reembed" => reembed::run_once(ctx).await,
        "export" => export::run_once(ctx).await,
        "snapshot" => snapshot::run_once(ctx).await,
        "graph" => graph::run_once(ctx).await,
        other => Err(unknown(other)),
    }
}

/// `job_runs` in Lance as the scheduler's log.
pub struct StoreRunLog(pub Arc<crate::store::Store>);

impl scheduler::RunLog for StoreRunLog {
    fn record(&self, run: scheduler::JobRun) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Err(e) = self.0.add_job_run(&run).await {
                tracing::error!(error = %e, job = %run.job, "job run not recorded");
            }
        })
    }

    fn last_start(&self, job: &str) -> futures::future::BoxFuture<'_, Option<Micros>> {
        let filter = crate::store::Filter::new().job(job);
        Box::pin(async move {
            self.0
                .job_runs(&filter, 1)
                .await
                .ok()
                .and_then(|r| r.first().map(|r| r.started_at))
        })
    }
}

/// What every run of the scheduler and every manual run gets: the services
/// (held weakly: the engine owns the scheduler), the configured jobs and the
/// directory relative paths resolve against.
#[derive(Clone)]
pub struct JobEnv {
    pub services: Weak<Services>,
    pub jobs: BTreeMap<String, config::JobConfig>,
    pub base_dir: PathBuf,
    pub object_settings: BTreeMap<String, String>,
    pub spool_dir: PathBuf,
}

/// The runner the scheduler and manual runs use: the named job with its
/// configured params.
pub fn runner(env: JobEnv, dry_run: bool) -> scheduler::Runner {
    Arc::new(move |name: String, _trigger| {
        let env = env.clone();
        Box::pin(async move {
            let services = env.services.upgrade().ok_or("the engine has stopped")?;
            let params = env
                .jobs
                .get(&name)
                .map(|j| j.params.clone())
                .unwrap_or_default();
            let ctx = JobContext {
                services,
                dry_run,
                params,
                base_dir: env.base_dir,
                object_settings: env.object_settings,
                spool_dir: env.spool_dir,
            };
            run_once(&ctx, &name).await.map_err(|e| e.to_string())
        })
    })
}
