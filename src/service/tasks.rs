//! Background tasks the API starts (re-embedding): progress that can be
//! polled, an end that can be awaited, a cancel its owner (or an admin) may
//! ask for, one running task per group at a time (a group is per caller, so
//! one key's job never holds another's back). Also the switch that pauses
//! background maintenance.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::watch;

use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Micros};
use crate::core::Caller;

#[derive(schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

/// What a client sees of a job.
#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct TaskView {
    pub job_id: String,
    pub kind: &'static str,
    pub state: TaskState,
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
pub struct Task {
    /// The caller that started it; only it (or an admin) may read its progress.
    pub owner: String,
    /// Tasks of one group never run at the same time.
    group: String,
    view: Mutex<TaskView>,
    finished: watch::Sender<bool>,
    cancel: watch::Sender<bool>,
}

impl Task {
    pub fn id(&self) -> String {
        self.lock().job_id.clone()
    }

    pub fn view(&self) -> TaskView {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TaskView> {
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
        self.lock().state == TaskState::Running
    }

    /// Mark the job ended, with the error that stopped it if any (a job
    /// asked to stop ends cancelled).
    pub fn finish(&self, error: Option<String>) {
        {
            let mut v = self.lock();
            v.state = if *self.cancel.borrow() {
                TaskState::Cancelled
            } else if error.is_some() {
                TaskState::Failed
            } else {
                TaskState::Succeeded
            };
            v.error = error;
            v.finished_at = Some(now_micros());
        }
        self.finished.send_replace(true);
    }

    /// Ask the job to stop; it ends `cancelled` once the work in hand is dropped.
    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }

    /// Resolves when the job is asked to stop (the job's loop selects on it).
    pub async fn cancelled(&self) {
        let mut rx = self.cancel.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }

    /// Resolves when the job has ended.
    pub async fn wait(&self) -> TaskView {
        let mut rx = self.finished.subscribe();
        let _ = rx.wait_for(|done| *done).await;
        self.view()
    }
}

/// Most ended jobs kept for polling.
const KEEP_ENDED: usize = 100;

#[derive(Default)]
pub struct Tasks {
    jobs: Mutex<Vec<Arc<Task>>>,
}

impl Tasks {
    /// Register a new running job, or hand back the running job of the same group.
    pub fn start(
        &self,
        kind: &'static str,
        group: String,
        owner: &str,
    ) -> Result<Arc<Task>, Arc<Task>> {
        let mut jobs = self.jobs.lock().expect("jobs lock");
        if let Some(running) = jobs.iter().find(|j| j.group == group && j.is_running()) {
            return Err(running.clone());
        }
        let job = Arc::new(Task {
            owner: owner.to_string(),
            group,
            view: Mutex::new(TaskView {
                job_id: uuid::Uuid::new_v4().to_string(),
                kind,
                state: TaskState::Running,
                total: 0,
                done: 0,
                failed: 0,
                error: None,
                started_at: now_micros(),
                finished_at: None,
            }),
            finished: watch::channel(false).0,
            cancel: watch::channel(false).0,
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

    pub fn get(&self, id: &str) -> Option<Arc<Task>> {
        let jobs = self.jobs.lock().expect("jobs lock");
        jobs.iter().find(|j| j.lock().job_id == id).cloned()
    }

    /// The job if `caller` started it or is an admin; any other job is
    /// answered exactly as an unknown one.
    pub fn visible(&self, caller: &Caller, id: &str) -> Result<Arc<Task>> {
        self.get(id)
            .filter(|j| caller.is_admin() || j.owner == caller.name)
            .ok_or_else(|| Error::NotFound(format!("no job {id}")))
    }

    /// `DELETE /v1/jobs/{id}`: stop a running job and answer once it has
    /// ended (the batch in hand is dropped, so that is prompt); an ended job
    /// is answered as it is.
    pub async fn cancel(&self, caller: &Caller, id: &str) -> Result<TaskView> {
        let job = self.visible(caller, id)?;
        if !job.is_running() {
            return Ok(job.view());
        }
        job.cancel();
        Ok(job.wait().await)
    }

    /// The running job of a group, if any.
    pub fn running(&self, group: &str) -> Option<Arc<Task>> {
        let jobs = self.jobs.lock().expect("jobs lock");
        jobs.iter()
            .find(|j| j.group == group && j.is_running())
            .cloned()
    }
}

/// Pauses background maintenance: the scheduled jobs and the idle dream
/// (`/admin/workers/pause`, and a snapshot rollback while it runs; not persisted).
#[derive(Debug, Clone, Default)]
pub struct Pause(Arc<AtomicBool>);

impl Pause {
    pub fn set(&self, paused: bool) {
        self.0.store(paused, Ordering::SeqCst);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_running_job_per_group_and_wait_sees_the_end() {
        let jobs = Tasks::default();
        let a = jobs.start("re_embed_all", "embed".into(), "admin").unwrap();
        let again = jobs
            .start("embed_missing", "embed".into(), "admin")
            .unwrap_err();
        assert_eq!(again.id(), a.id());
        assert!(jobs.start("export", "export".into(), "admin").is_ok());
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
            (TaskState::Succeeded, 7, 3)
        );
        assert!(view.finished_at.is_some());
        assert!(jobs.start("embed_missing", "embed".into(), "admin").is_ok());
        assert_eq!(jobs.get(&a.id()).unwrap().view().total, 10);
    }

    #[tokio::test]
    async fn a_cancelled_job_ends_cancelled_and_frees_its_group() {
        let jobs = Tasks::default();
        let a = jobs.start("re_embed_all", "embed:x".into(), "x").unwrap();
        let stop = {
            let a = a.clone();
            tokio::spawn(async move { a.cancelled().await })
        };
        a.cancel();
        stop.await.unwrap();
        // A failure seen while stopping does not make it `failed`.
        a.finish(Some("interrupted".into()));
        assert_eq!(a.view().state, TaskState::Cancelled);
        assert!(jobs.running("embed:x").is_none());
        assert!(jobs.start("re_embed_all", "embed:x".into(), "x").is_ok());
    }
}
