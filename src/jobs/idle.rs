//! The dream after inactivity: a stream that has been quiet for
//! `scheduler.dream_after_idle_secs` since a write is dreamed once (until its
//! next write), whether or not the cron scheduler runs. Each dream is recorded
//! in `job_runs` as job `dream`, trigger `idle`. Paused workers pause it too.
//! Streams last written before this process started wait for their next write
//! (or for the scheduled `dream` job).

use std::collections::HashMap;
use std::sync::Weak;
use std::time::Duration;

use tokio::sync::watch;

use super::scheduler::{JobRun, RunLog, Trigger};
use crate::core::model::now_micros;
use crate::core::Caller;
use crate::service::dream::{dream, DreamRequest};
use crate::service::Services;

pub fn spawn(engine: Weak<Services>, idle: Duration, mut stop: watch::Receiver<bool>) {
    let tick = (idle / 4).clamp(Duration::from_millis(200), Duration::from_secs(60));
    tokio::spawn(async move {
        // The write generation each stream had when it was last dreamed.
        let mut dreamed: HashMap<String, u64> = HashMap::new();
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                _ = tokio::time::sleep(tick) => {}
            }
            let Some(engine) = engine.upgrade() else {
                break;
            };
            if engine.workers.get() {
                continue;
            }
            for (stream, generation, at) in engine.store.write_activity() {
                if at.elapsed() < idle || dreamed.get(&stream) == Some(&generation) {
                    continue;
                }
                run(&engine, &stream).await;
                // The dream's own writes do not call for another dream.
                let after = engine.store.generation(&stream).0;
                dreamed.insert(stream, after);
            }
        }
    });
}

async fn run(engine: &Services, stream: &str) {
    let started = now_micros();
    let req = DreamRequest {
        stream: Some(stream.to_string()),
        dry_run: false,
        similarity: None,
        related_similarity: None,
        contradiction_similarity: None,
        max_chunks: None,
        max_cost_usd: None,
    };
    let outcome = dream(engine, &Caller::admin("idle-dream"), req).await;
    let (status, report, error) = match outcome {
        Ok(r) => ("succeeded", serde_json::to_string(&r).ok(), None),
        Err(e) => ("failed", None, Some(e.to_string())),
    };
    let run = JobRun {
        id: uuid::Uuid::new_v4().to_string(),
        job: "dream".into(),
        trigger: Trigger::Idle.as_str().into(),
        started_at: started,
        finished_at: now_micros(),
        status: status.into(),
        report,
        error,
        dry_run: false,
    };
    super::StoreRunLog(engine.store.clone()).record(run).await;
}
