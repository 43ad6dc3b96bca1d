//! The dream after inactivity: a stream that has been quiet for
//! `scheduler.dream_after_idle_secs` since a write is dreamed once (until its
//! next write), whether or not the cron scheduler runs. Each dream is recorded
//! through the scheduler's run log as job `dream`, trigger `idle`, timed by the
//! scheduler's clock. Paused workers pause it too. Streams last written before
//! this process started wait for their next write (or the scheduled `dream`).
//!
//! Processes sharing the bus each see the writes they committed, so each may
//! find a stream quiet. A dream first takes the stream's lease on the bus for
//! the idle period: one process dreams. Another finds the lease held; since
//! that process's own last write is older than the idle period, the lease was
//! taken after it, and the dream covers its writes too.
//!
//! The loop takes its parts (where writes are seen, what a dream does, where
//! runs go, the clock) as handles, so its test runs on paused time.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;

use super::scheduler::{run_and_record, Clock, Pause, RunLog, Runner, Trigger};
use crate::bus::Lease;
use crate::core::Caller;
use crate::service::dream::{dream, DreamRequest, IdleTally};
use crate::service::Services;
use crate::store::Store;

/// Where the loop sees writes: per stream, its write generation and when it
/// was last written.
pub trait Activity: Send + Sync {
    fn writes(&self) -> Vec<(String, u64, tokio::time::Instant)>;
    /// The stream's write generation now.
    fn generation(&self, stream: &str) -> u64;
}

impl Activity for Store {
    fn writes(&self) -> Vec<(String, u64, tokio::time::Instant)> {
        self.write_activity()
    }

    fn generation(&self, stream: &str) -> u64 {
        Store::generation(self, stream).0
    }
}

/// Dreams one stream: its report, or why it failed.
pub type Dreamer =
    Arc<dyn Fn(String) -> BoxFuture<'static, Result<serde_json::Value, String>> + Send + Sync>;

/// The dreamer of a running engine (held weakly: the engine owns the loop).
pub fn dreamer(services: Weak<Services>) -> Dreamer {
    Arc::new(move |stream: String| {
        let services = services.clone();
        Box::pin(async move {
            let services = services.upgrade().ok_or("the engine has stopped")?;
            let req = DreamRequest {
                stream: Some(stream),
                ..Default::default()
            };
            let report = dream(&services, &Caller::admin("idle-dream"), req)
                .await
                .map_err(|e| e.to_string())?;
            serde_json::to_value(report).map_err(|e| e.to_string())
        })
    })
}

/// Takes a stream's dream lease for a period: whether this process took
/// it, or a claim made some time ago stands (see [`crate::bus::Bus::claim_window`]).
pub type Leaser =
    Arc<dyn Fn(String, Duration) -> BoxFuture<'static, Result<Lease, String>> + Send + Sync>;

/// The leaser of one process alone: every lease is its own.
pub fn sole() -> Leaser {
    Arc::new(|_, _| Box::pin(async { Ok(Lease::Taken) }))
}

/// The loop's parts.
pub struct IdleDream {
    pub activity: Weak<dyn Activity>,
    pub dreamer: Dreamer,
    pub log: Arc<dyn RunLog>,
    pub clock: Clock,
    pub pause: Pause,
    pub lease: Leaser,
    /// Counts what the loop settled.
    pub tally: Arc<IdleTally>,
    /// How long a stream stays quiet before it is dreamed.
    pub idle: Duration,
}

impl IdleDream {
    /// Run until `stop` turns true or the activity source is gone.
    pub fn spawn(self, mut stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        let tick = (self.idle / 4).clamp(Duration::from_millis(200), Duration::from_secs(60));
        tokio::spawn(async move {
            // The write generation each stream had when it was last dreamed.
            let mut dreamed: HashMap<String, u64> = HashMap::new();
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    _ = tokio::time::sleep(tick) => {}
                }
                let Some(activity) = self.activity.upgrade() else {
                    break;
                };
                if self.pause.get() {
                    continue;
                }
                for (stream, generation, at) in activity.writes() {
                    if at.elapsed() < self.idle || dreamed.get(&stream) == Some(&generation) {
                        continue;
                    }
                    match (self.lease)(format!("idle-dream/{stream}"), self.idle).await {
                        Ok(Lease::Taken) => {
                            self.run(&stream).await;
                            self.tally.dreamed();
                        }
                        // Held for less than the idle period, so taken after
                        // this process's last write: that dream covers it.
                        Ok(Lease::Held { .. }) => self.tally.covered(),
                        Err(e) => {
                            tracing::warn!(%stream, error = %e, "could not take the dream lease; not dreaming it now");
                            continue;
                        }
                    }
                    // The dream's own writes do not call for another dream.
                    dreamed.insert(stream.clone(), activity.generation(&stream));
                }
            }
        })
    }

    async fn run(&self, stream: &str) {
        let dreamer = self.dreamer.clone();
        let stream = stream.to_string();
        let runner: Runner = Arc::new(move |_, _| dreamer(stream.clone()));
        run_and_record(
            "dream",
            Trigger::Idle,
            false,
            self.clock.clone(),
            runner,
            self.log.as_ref(),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::scheduler::memory::Runs;
    use std::sync::Mutex;

    /// Writes as the test makes them.
    #[derive(Default)]
    struct Writes(Mutex<HashMap<String, (u64, tokio::time::Instant)>>);

    impl Writes {
        fn write(&self, stream: &str) {
            let mut w = self.0.lock().unwrap();
            let e = w
                .entry(stream.to_string())
                .or_insert((0, tokio::time::Instant::now()));
            *e = (e.0 + 1, tokio::time::Instant::now());
        }
    }

    impl Activity for Writes {
        fn writes(&self) -> Vec<(String, u64, tokio::time::Instant)> {
            let w = self.0.lock().unwrap();
            w.iter().map(|(s, (g, at))| (s.clone(), *g, *at)).collect()
        }
        fn generation(&self, stream: &str) -> u64 {
            self.0.lock().unwrap().get(stream).map_or(0, |e| e.0)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_is_dreamed_once_per_write_and_never_while_paused() {
        let writes = Arc::new(Writes::default());
        let dreamt = Arc::new(Mutex::new(Vec::<String>::new()));
        let runs = Arc::new(Runs::default());
        let pause = Pause::default();
        let dreamer: Dreamer = {
            let dreamt = dreamt.clone();
            Arc::new(move |stream: String| {
                dreamt.lock().unwrap().push(stream);
                Box::pin(async { Ok(serde_json::json!({"groups_found": 0})) })
            })
        };
        let activity: Arc<dyn Activity> = writes.clone();
        let (stop_tx, stop) = watch::channel(false);
        let idle = Duration::from_secs(60);
        let task = IdleDream {
            activity: Arc::downgrade(&activity),
            dreamer,
            log: runs.clone(),
            clock: Clock::system(),
            pause: pause.clone(),
            lease: sole(),
            tally: Default::default(),
            idle,
        }
        .spawn(stop);

        writes.write("a");
        tokio::time::sleep(Duration::from_secs(50)).await;
        assert!(
            dreamt.lock().unwrap().is_empty(),
            "dreamed before the stream was quiet"
        );
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(*dreamt.lock().unwrap(), vec!["a".to_string()]);
        // Still quiet: no second dream.
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(dreamt.lock().unwrap().len(), 1);

        // A new write, but the workers are paused: nothing until resumed.
        pause.set(true);
        writes.write("a");
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(dreamt.lock().unwrap().len(), 1);
        pause.set(false);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(dreamt.lock().unwrap().len(), 2);

        let runs = runs.0.lock().unwrap().clone();
        assert_eq!(runs.len(), 2);
        assert!(runs
            .iter()
            .all(|r| r.job == "dream" && r.trigger == "idle" && r.status == "succeeded"));
        // The clock is the scheduler's (tokio's, paused here): the first dream
        // ran a tick after 60 quiet seconds, the second a tick after the resume
        // at 1280 s, so they are ~1215 s apart on it.
        let gap = runs[1].started_at - runs[0].started_at;
        assert!((1_190_000_000..=1_240_000_000).contains(&gap), "{gap}");

        stop_tx.send(true).unwrap();
        task.await.unwrap();
    }

    /// Leases as the bus keeps them, shared by the test's "processes".
    fn shared_leases() -> Leaser {
        let taken = Arc::new(Mutex::new(HashMap::<String, tokio::time::Instant>::new()));
        Arc::new(move |key: String, window: Duration| {
            let mut t = taken.lock().unwrap();
            let now = tokio::time::Instant::now();
            let out = match t.get(&key) {
                Some(at) if now - *at < window => Lease::Held { age: now - *at },
                _ => {
                    t.insert(key, now);
                    Lease::Taken
                }
            };
            Box::pin(async move { Ok(out) })
        })
    }

    #[tokio::test(start_paused = true)]
    async fn processes_sharing_the_bus_dream_a_stream_once_per_quiet_spell() {
        let dreamt = Arc::new(Mutex::new(Vec::<String>::new()));
        let lease = shared_leases();
        let (stop_tx, stop) = watch::channel(false);
        let idle = Duration::from_secs(60);
        let mut writes = Vec::new();
        let mut tasks = Vec::new();
        let tally = Arc::new(IdleTally::default());
        for _ in 0..2 {
            let w = Arc::new(Writes::default());
            let activity: Arc<dyn Activity> = w.clone();
            let dreamt = dreamt.clone();
            let dreamer: Dreamer = Arc::new(move |stream: String| {
                dreamt.lock().unwrap().push(stream);
                Box::pin(async { Ok(serde_json::json!({})) })
            });
            tasks.push(
                IdleDream {
                    activity: Arc::downgrade(&activity),
                    dreamer,
                    log: Arc::new(Runs::default()),
                    clock: Clock::system(),
                    pause: Pause::default(),
                    lease: lease.clone(),
                    tally: tally.clone(),
                    idle,
                }
                .spawn(stop.clone()),
            );
            writes.push((w, activity));
        }
        // One burst split between the two processes: one dream.
        writes[0].0.write("s");
        tokio::time::sleep(Duration::from_secs(10)).await;
        writes[1].0.write("s");
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert_eq!(*dreamt.lock().unwrap(), vec!["s".to_string()]);
        // A later burst, written by the one that did not dream: one more.
        writes[1].0.write("s");
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert_eq!(dreamt.lock().unwrap().len(), 2);
        // Both write again: still one each spell.
        writes[1].0.write("s");
        writes[0].0.write("s");
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert_eq!(dreamt.lock().unwrap().len(), 3);
        // Each process settled each spell it wrote in: the first and the
        // third by both, the second by one.
        let stats = tally.stats();
        assert_eq!((stats.dreamed, stats.dreamed_elsewhere), (3, 2));

        stop_tx.send(true).unwrap();
        for t in tasks {
            t.await.unwrap();
        }
    }
}
