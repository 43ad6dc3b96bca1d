//! The console and the metrics, each against a real daemon (JetStream, Lance
//! in a temp dir, HTTP on port 0). A binary of their own: the metrics are the
//! process's, so no other test's traffic moves the counters these check, and
//! the tests here take turns (`serial`).

// The daemon fixture is shared with the integration suite; not every helper
// is used here.
#![allow(dead_code)]

#[path = "../integration/fixture.rs"]
mod fixture;
mod metrics;
#[path = "../integration/nats.rs"]
mod nats;
mod ui;

/// Held by each test for its whole run.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}
