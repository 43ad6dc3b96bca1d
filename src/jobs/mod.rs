//! Background work. Jobs the API starts (re-embedding) have progress that can
//! be polled, an end that can be awaited, one running job per group at a time.
//! Maintenance jobs (`dream`, `decay`, `compact`, `reembed`, `export`,
//! `snapshot`) are one file each,
//! `run_once(ctx) -> JobReport`, run by the cron [`scheduler`] or on demand;
//! every run lands in the `job_runs` table.

pub mod compact;
pub mod decay;
pub mod dream;
pub mod export;
pub mod idle;
pub mod reembed;
pub mod scheduler;
pub mod snapshot;

use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::watch;

use crate::model::{now_micros, Micros};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Running,
    Succeeded,
    Failed,
}

/// What a client sees of a job.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub job_id: String,
    pub kind: &'static str,
    pub state: JobState,
    /// Items the job set out to process.
    pub total: usize,
    /// Items processed successfully so far.
    pub done: usize,
    /// Items that failed (the job goes on with the rest).
    pub failed: usize,
    pub error: Option<String>,
    /// Microseconds since the epoch.
    pub started_at: Micros,
    pub finished_at: Option<Micros>,
}

#[derive(Debug)]
pub struct Job {
    /// The caller that started it; only it (or an admin) may read its progress.
    pub owner: String,
    /// Jobs of one group never run at the same time.
    group: &'static str,
    view: Mutex<JobView>,
    finished: watch::Sender<bool>,
}

impl Job {
    pub fn id(&self) -> String {
        self.lock().job_id.clone()
    }

    pub fn view(&self) -> JobView {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, JobView> {
        self.view.lock().expect("job lock")
    }

    pub fn set_total(&self, total: usize) {
        self.lock().total = total;
    }

    pub fn progress(&self, done: usize, failed: usize) {
        let mut v = self.lock();
        v.done += done;
        v.failed += failed;
    }

    pub fn is_running(&self) -> bool {
        self.lock().state == JobState::Running
    }

    /// Mark the job ended, with the error that stopped it if any.
    pub fn finish(&self, error: Option<String>) {
        {
            let mut v = self.lock();
            v.state = if error.is_some() {
                JobState::Failed
            } else {
                JobState::Succeeded
            };
            v.error = error;
            v.finished_at = Some(now_micros());
        }
        self.finished.send_replace(true);
    }

    /// Resolves when the job has ended.
    pub async fn wait(&self) -> JobView {
        let mut rx = self.finished.subscribe();
        let _ = rx.wait_for(|done| *done).await;
        self.view()
    }
}

/// Most ended jobs kept for polling.
const KEEP_ENDED: usize = 100;

#[derive(Default)]
pub struct Jobs {
    jobs: Mutex<Vec<Arc<Job>>>,
}

impl Jobs {
    /// Register a new running job, or hand back the running job of the same group.
    pub fn start(
        &self,
        kind: &'static str,
        group: &'static str,
        owner: &str,
    ) -> Result<Arc<Job>, Arc<Job>> {
        let mut jobs = self.jobs.lock().expect("jobs lock");
        if let Some(running) = jobs.iter().find(|j| j.group == group && j.is_running()) {
            return Err(running.clone());
        }
        let job = Arc::new(Job {
            owner: owner.to_string(),
            group,
            view: Mutex::new(JobView {
                job_id: uuid::Uuid::new_v4().to_string(),
                kind,
                state: JobState::Running,
                total: 0,
                done: 0,
                failed: 0,
                error: None,
                started_at: now_micros(),
                finished_at: None,
            }),
            finished: watch::channel(false).0,
        });
        jobs.push(job.clone());
        let ended = jobs.iter().filter(|j| !j.is_running()).count();
        if ended > KEEP_ENDED {
            let mut drop = ended - KEEP_ENDED;
            jobs.retain(|j| {
                let keep = j.is_running() || drop == 0;
                if !keep {
                    drop -= 1;
                }
                keep
            });
        }
        Ok(job)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Job>> {
        let jobs = self.jobs.lock().expect("jobs lock");
        jobs.iter().find(|j| j.lock().job_id == id).cloned()
    }

    /// The running job of a group, if any.
    pub fn running(&self, group: &str) -> Option<Arc<Job>> {
        let jobs = self.jobs.lock().expect("jobs lock");
        jobs.iter()
            .find(|j| j.group == group && j.is_running())
            .cloned()
    }
}

/// What a maintenance job reports (JSON, kept as text in `job_runs.report`).
pub type JobReport = serde_json::Value;

/// A job run as the API shows it (times in RFC 3339, the report as JSON).
#[derive(Debug, serde::Serialize)]
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
            started_at: crate::time::to_rfc3339(r.started_at),
            finished_at: crate::time::to_rfc3339(r.finished_at),
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
pub const JOB_NAMES: &[&str] = &["dream", "decay", "compact", "reembed", "export", "snapshot"];

/// What a job run gets: the engine, whether to change anything, its params.
pub struct JobContext {
    pub engine: Arc<crate::engine::Engine>,
    pub dry_run: bool,
    pub params: toml::Table,
}

/// Run one maintenance job by name.
pub async fn run_once(ctx: &JobContext, name: &str) -> crate::error::Result<JobReport> {
    match name {
        "dream" => dream::run_once(ctx).await,
        "decay" => decay::run_once(ctx).await,
        "compact" => compact::run_once(ctx).await,
        "reembed" => reembed::run_once(ctx).await,
        "export" => export::run_once(ctx).await,
        "snapshot" => snapshot::run_once(ctx).await,
        other => Err(crate::error::Error::NotFound(format!(
            "no job `{other}` (jobs: {})",
            JOB_NAMES.join(", ")
        ))),
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
        let filter = format!("job = {}", crate::store::sql_str(job));
        Box::pin(async move {
            self.0
                .job_runs(Some(filter), 1)
                .await
                .ok()
                .and_then(|r| r.first().map(|r| r.started_at))
        })
    }
}

/// The runner the scheduler and manual runs use: the named job with its
/// configured params. Holds the engine weakly (the engine holds the scheduler).
pub fn runner(engine: std::sync::Weak<crate::engine::Engine>, dry_run: bool) -> scheduler::Runner {
    Arc::new(move |name: String, _trigger| {
        let engine = engine.clone();
        Box::pin(async move {
            let engine = engine.upgrade().ok_or("the engine has stopped")?;
            let params = engine
                .cfg
                .scheduler
                .jobs
                .get(&name)
                .map(|j| j.params.clone())
                .unwrap_or_default();
            let ctx = JobContext {
                engine,
                dry_run,
                params,
            };
            run_once(&ctx, &name).await.map_err(|e| e.to_string())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_running_job_per_group_and_wait_sees_the_end() {
        let jobs = Jobs::default();
        let a = jobs.start("re_embed_all", "embed", "admin").unwrap();
        let again = jobs.start("embed_missing", "embed", "admin").unwrap_err();
        assert_eq!(again.id(), a.id());
        assert!(jobs.start("export", "export", "admin").is_ok());
        a.set_total(10);
        a.progress(7, 3);
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.wait().await })
        };
        a.finish(None);
        let view = waiter.await.unwrap();
        assert_eq!(
            (view.state, view.done, view.failed),
            (JobState::Succeeded, 7, 3)
        );
        assert!(view.finished_at.is_some());
        assert!(jobs.start("embed_missing", "embed", "admin").is_ok());
        assert_eq!(jobs.get(&a.id()).unwrap().view().total, 10);
    }
}
