//! The cron loop: one task per enabled job sleeps until the job's next
//! instant, then starts a run unless the workers are paused or the previous
//! run of the same job is still going (recorded as `skipped`). A run is its own
//! task, so a failing or panicking job is recorded as `failed` and the loop
//! goes on. At start, a job whose schedule passed an instant since its last
//! recorded run catches up once.
//!
//! Time comes from a [`Clock`]: wall time fixed at start plus tokio's elapsed
//! time, so tests drive it with paused tokio time.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde::Serialize;
use tokio::sync::watch;

use crate::core::model::Micros;

/// Wall-clock time that follows tokio's clock (paused in tests).
#[derive(Clone, Copy)]
pub struct Clock {
    wall: DateTime<Utc>,
    at: tokio::time::Instant,
}

impl Clock {
    pub fn starting_at(wall: DateTime<Utc>) -> Clock {
        Clock {
            wall,
            at: tokio::time::Instant::now(),
        }
    }

    pub fn system() -> Clock {
        Clock::starting_at(Utc::now())
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.wall + chrono::Duration::from_std(self.at.elapsed()).unwrap_or_default()
    }
}

/// Why a run started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Schedule,
    CatchUp,
    Manual,
    /// A stream went quiet (the dream after inactivity).
    Idle,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::CatchUp => "catch_up",
            Trigger::Idle => "idle",
            Trigger::Manual => "manual",
        }
    }
}

pub use crate::store::job_runs::JobRun;

/// Runs a job by name; the report or the error.
pub type Runner = Arc<
    dyn Fn(String, Trigger) -> BoxFuture<'static, Result<serde_json::Value, String>> + Send + Sync,
>;

/// Where runs are recorded and the last one is looked up.
pub trait RunLog: Send + Sync {
    fn record(&self, run: JobRun) -> BoxFuture<'_, ()>;
    /// When the job's latest recorded run started.
    fn last_start(&self, job: &str) -> BoxFuture<'_, Option<Micros>>;
}

/// Claims one run of a job (the job, the instant it is due) for this
/// process: true when no other process sharing the bus claimed it first.
pub type Claim =
    Arc<dyn Fn(String, Micros) -> BoxFuture<'static, Result<bool, String>> + Send + Sync>;

/// One process alone: every run is this one's.
pub fn sole() -> Claim {
    Arc::new(|_, _| Box::pin(async { Ok(true) }))
}

/// A job the loop runs.
#[derive(Clone)]
pub struct Scheduled {
    pub name: String,
    pub schedule: cron::Schedule,
}

impl Scheduled {
    /// Parse a 6-field (seconds first) or 7-field cron expression.
    pub fn new(name: &str, cron: &str) -> Result<Scheduled, CronError> {
        let schedule = cron::Schedule::from_str(cron).map_err(|e| CronError {
            cron: cron.to_string(),
            message: e.to_string(),
        })?;
        Ok(Scheduled {
            name: name.to_string(),
            schedule,
        })
    }
}

/// A schedule that is not a cron expression.
#[derive(Debug, thiserror::Error)]
#[error("`{cron}` is not a cron expression: {message}")]
pub struct CronError {
    pub cron: String,
    pub message: String,
}

pub use crate::service::tasks::Pause;

fn micros(t: DateTime<Utc>) -> Micros {
    t.timestamp_micros()
}

/// Start the loop for every job; it stops when `stop` turns true.
pub fn spawn(
    jobs: Vec<Scheduled>,
    clock: Clock,
    runner: Runner,
    log: Arc<dyn RunLog>,
    pause: Pause,
    claim: Claim,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    jobs.into_iter()
        .map(|job| {
            let state = Loop {
                job,
                clock,
                runner: runner.clone(),
                log: log.clone(),
                pause: pause.clone(),
                claim: claim.clone(),
                running: Default::default(),
            };
            tokio::spawn(state.run(stop.clone()))
        })
        .collect()
}

struct Loop {
    job: Scheduled,
    clock: Clock,
    runner: Runner,
    log: Arc<dyn RunLog>,
    pause: Pause,
    claim: Claim,
    running: Arc<AtomicBool>,
}

impl Loop {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let started = self.clock.now();
        if let Some(last) = self.log.last_start(&self.job.name).await {
            let last = DateTime::<Utc>::from_timestamp_micros(last).unwrap_or(started);
            if let Some(missed) = self
                .job
                .schedule
                .after(&last)
                .next()
                .filter(|missed| *missed <= started)
                .filter(|_| !self.pause.get())
            {
                // Claimed by the first instant missed: every process
                // starting after the same last run names the same one.
                self.fire(Trigger::CatchUp, missed).await;
            }
        }
        loop {
            let now = self.clock.now();
            let Some(next) = self.job.schedule.after(&now).next() else {
                return;
            };
            let wait = (next - now).to_std().unwrap_or_default();
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if self.pause.get() {
                continue;
            }
            self.fire(Trigger::Schedule, next).await;
        }
    }

    /// Start the run due at `due`, unless another process sharing the bus
    /// claimed it (then it is that one's, and not recorded here); or record
    /// it skipped while this process's previous run is going.
    async fn fire(&self, trigger: Trigger, due: DateTime<Utc>) {
        let name = self.job.name.clone();
        match (self.claim)(name.clone(), micros(due)).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(job = %name, %due, "another process runs this one");
                return;
            }
            Err(e) => {
                tracing::warn!(job = %name, %due, error = %e, "could not claim the run; not running it");
                return;
            }
        }
        let started = self.clock.now();
        if self.running.swap(true, Ordering::SeqCst) {
            self.log
                .record(JobRun {
                    id: uuid::Uuid::new_v4().to_string(),
                    job: name,
                    trigger: trigger.as_str().into(),
                    started_at: micros(started),
                    finished_at: micros(started),
                    status: "skipped".into(),
                    report: None,
                    error: Some("the previous run is still going".into()),
                    dry_run: false,
                })
                .await;
            return;
        }
        let runner = self.runner.clone();
        let log = self.log.clone();
        let running = self.running.clone();
        let clock = self.clock;
        tokio::spawn(async move {
            let run = run_and_record(&name, trigger, false, clock, runner, &*log).await;
            tracing::info!(job = %name, status = %run.status, "scheduled job ended");
            running.store(false, Ordering::SeqCst);
        });
    }
}

/// Run a job in its own task (a panic is a failure, not the caller's
/// problem) and record the run.
pub async fn run_and_record(
    name: &str,
    trigger: Trigger,
    dry_run: bool,
    clock: Clock,
    runner: Runner,
    log: &dyn RunLog,
) -> JobRun {
    let started = clock.now();
    let outcome = tokio::spawn(runner(name.to_string(), trigger)).await;
    let (status, report, error) = match outcome {
        Ok(Ok(report)) => ("succeeded", Some(report.to_string()), None),
        Ok(Err(e)) => ("failed", None, Some(e)),
        Err(e) => ("failed", None, Some(format!("the job panicked: {e}"))),
    };
    let m = crate::core::metrics::metrics();
    m.job_runs.with_label_values(&[name, status]).inc();
    m.job_seconds.with_label_values(&[name, status]).observe(
        (clock.now() - started)
            .to_std()
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
    );
    let run = JobRun {
        id: uuid::Uuid::new_v4().to_string(),
        job: name.to_string(),
        trigger: trigger.as_str().into(),
        started_at: micros(started),
        finished_at: micros(clock.now()),
        status: status.into(),
        report,
        error,
        dry_run,
    };
    log.record(run.clone()).await;
    run
}

/// The runs, in memory, for the tests of timing (the `job_runs` table is
/// tested through the daemon).
#[cfg(test)]
pub(crate) mod memory {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct Runs(pub Mutex<Vec<JobRun>>);

    impl RunLog for Runs {
        fn record(&self, run: JobRun) -> BoxFuture<'_, ()> {
            self.0.lock().unwrap().push(run);
            Box::pin(async {})
        }
        fn last_start(&self, job: &str) -> BoxFuture<'_, Option<Micros>> {
            let last = self
                .0
                .lock()
                .unwrap()
                .iter()
                .filter(|r| r.job == job)
                .map(|r| r.started_at)
                .max();
            Box::pin(async move { last })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::memory::Runs;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn times(runs: &Runs) -> Vec<(String, String, String)> {
        runs.0
            .lock()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    DateTime::<Utc>::from_timestamp_micros(r.started_at)
                        .unwrap()
                        .format("%H:%M:%S")
                        .to_string(),
                    r.status.clone(),
                    r.trigger.clone(),
                )
            })
            .collect()
    }

    /// Counts calls; fails the calls whose number is in `fail`, panics on `panic`.
    fn runner(
        calls: Arc<Mutex<usize>>,
        fail: &'static [usize],
        panic: &'static [usize],
        takes: Duration,
    ) -> Runner {
        Arc::new(move |_name, _trigger| {
            let n = {
                let mut c = calls.lock().unwrap();
                *c += 1;
                *c
            };
            Box::pin(async move {
                tokio::time::sleep(takes).await;
                if panic.contains(&n) {
                    panic!("boom {n}");
                }
                if fail.contains(&n) {
                    return Err(format!("run {n} failed"));
                }
                Ok(serde_json::json!({ "run": n }))
            })
        })
    }

    fn start(
        cron: &str,
        wall: &str,
        runner: Runner,
        runs: Arc<Runs>,
        pause: Pause,
    ) -> watch::Sender<bool> {
        let (stop, rx) = watch::channel(false);
        spawn(
            vec![Scheduled::new("job", cron).unwrap()],
            Clock::starting_at(at(wall)),
            runner,
            runs,
            pause,
            sole(),
            rx,
        );
        stop
    }

    #[tokio::test(start_paused = true)]
    async fn two_processes_sharing_claims_run_each_instant_once() {
        let runs = Arc::new(Runs::default());
        let calls = Arc::new(Mutex::new(0));
        let claimed = Arc::new(Mutex::new(std::collections::HashSet::new()));
        let claim: Claim = {
            let claimed = claimed.clone();
            Arc::new(move |job, slot| {
                let won = claimed.lock().unwrap().insert((job, slot));
                Box::pin(async move { Ok(won) })
            })
        };
        let (_stop, rx) = watch::channel(false);
        for _ in 0..2 {
            spawn(
                vec![Scheduled::new("job", "0 */10 * * * *").unwrap()],
                Clock::starting_at(at("2026-01-05T00:03:00Z")),
                runner(calls.clone(), &[], &[], Duration::ZERO),
                runs.clone(),
                Pause::default(),
                claim.clone(),
                rx.clone(),
            );
        }
        tokio::time::sleep(Duration::from_secs(25 * 60)).await;
        assert_eq!(*calls.lock().unwrap(), 2, "00:10 and 00:20, once each");
        assert_eq!(claimed.lock().unwrap().len(), 2);
        // A claim that fails runs nothing.
        let (_stop, rx) = watch::channel(false);
        let failing: Claim = Arc::new(|_, _| Box::pin(async { Err("no bus".to_string()) }));
        spawn(
            vec![Scheduled::new("job", "0 */10 * * * *").unwrap()],
            Clock::starting_at(at("2026-01-05T00:03:00Z")),
            runner(calls.clone(), &[], &[], Duration::ZERO),
            runs.clone(),
            Pause::default(),
            failing,
            rx,
        );
        tokio::time::sleep(Duration::from_secs(10 * 60)).await;
        assert_eq!(
            *calls.lock().unwrap(),
            3,
            "only the sharing pair's 00:30 run"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn fires_at_the_scheduled_instants() {
        let runs = Arc::new(Runs::default());
        let calls = Arc::new(Mutex::new(0));
        // Every 10 minutes on weekdays; 2026-01-05 is a Monday.
        let _stop = start(
            "0 */10 * * * MON-FRI",
            "2026-01-05T00:03:00Z",
            runner(calls, &[], &[], Duration::ZERO),
            runs.clone(),
            Pause::default(),
        );
        tokio::time::sleep(Duration::from_secs(25 * 60)).await;
        assert_eq!(
            times(&runs),
            vec![
                ("00:10:00".into(), "succeeded".into(), "schedule".into()),
                ("00:20:00".into(), "succeeded".into(), "schedule".into()),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_recorded_and_the_next_run_still_happens() {
        let runs = Arc::new(Runs::default());
        let calls = Arc::new(Mutex::new(0));
        let _stop = start(
            "0 * * * * *",
            "2026-01-05T00:00:30Z",
            runner(calls, &[1], &[2], Duration::ZERO),
            runs.clone(),
            Pause::default(),
        );
        tokio::time::sleep(Duration::from_secs(200)).await;
        let got = runs.0.lock().unwrap().clone();
        let status: Vec<&str> = got.iter().map(|r| r.status.as_str()).collect();
        assert_eq!(status, vec!["failed", "failed", "succeeded"]);
        assert_eq!(got[0].error.as_deref(), Some("run 1 failed"));
        assert!(
            got[1].error.as_deref().unwrap().contains("panicked"),
            "{:?}",
            got[1]
        );
        assert_eq!(got[2].report.as_deref(), Some(r#"{"run":3}"#));
    }

    #[tokio::test(start_paused = true)]
    async fn pause_stops_runs_until_resumed() {
        let runs = Arc::new(Runs::default());
        let calls = Arc::new(Mutex::new(0));
        let pause = Pause::default();
        let _stop = start(
            "0 * * * * *",
            "2026-01-05T00:00:30Z",
            runner(calls.clone(), &[], &[], Duration::ZERO),
            runs.clone(),
            pause.clone(),
        );
        tokio::time::sleep(Duration::from_secs(60)).await; // 00:01:30, one run
        pause.set(true);
        tokio::time::sleep(Duration::from_secs(180)).await; // 00:04:30, none
        assert_eq!(*calls.lock().unwrap(), 1);
        pause.set(false);
        tokio::time::sleep(Duration::from_secs(60)).await; // 00:05:00 runs
        let t: Vec<String> = times(&runs).into_iter().map(|x| x.0).collect();
        assert_eq!(t, vec!["00:01:00", "00:05:00"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_still_going_skips_the_next_instant() {
        let runs = Arc::new(Runs::default());
        let calls = Arc::new(Mutex::new(0));
        // Runs take 90 s on a one-minute schedule.
        let _stop = start(
            "0 * * * * *",
            "2026-01-05T00:00:30Z",
            runner(calls, &[], &[], Duration::from_secs(90)),
            runs.clone(),
            Pause::default(),
        );
        tokio::time::sleep(Duration::from_secs(260)).await; // to 00:04:50
        let mut got = times(&runs);
        got.sort();
        assert_eq!(
            got,
            vec![
                ("00:01:00".into(), "succeeded".into(), "schedule".into()),
                ("00:02:00".into(), "skipped".into(), "schedule".into()),
                ("00:03:00".into(), "succeeded".into(), "schedule".into()),
                ("00:04:00".into(), "skipped".into(), "schedule".into()),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn downtime_is_caught_up_once() {
        let runs = Arc::new(Runs::default());
        // The last run was three hours before this start: three instants were missed.
        runs.0.lock().unwrap().push(JobRun {
            id: "old".into(),
            job: "job".into(),
            trigger: "schedule".into(),
            started_at: micros(at("2026-01-04T21:00:00Z")),
            finished_at: micros(at("2026-01-04T21:00:01Z")),
            status: "succeeded".into(),
            report: None,
            error: None,
            dry_run: false,
        });
        let calls = Arc::new(Mutex::new(0));
        let _stop = start(
            "0 0 * * * *",
            "2026-01-05T00:30:00Z",
            runner(calls, &[], &[], Duration::ZERO),
            runs.clone(),
            Pause::default(),
        );
        tokio::time::sleep(Duration::from_secs(40 * 60)).await;
        let got: Vec<_> = times(&runs).into_iter().skip(1).collect();
        assert_eq!(
            got,
            vec![
                ("00:30:00".into(), "succeeded".into(), "catch_up".into()),
                ("01:00:00".into(), "succeeded".into(), "schedule".into()),
            ]
        );
    }
}
