//! The read runtime: searches and context packs run on threads of their own,
//! at the Linux nice value `search.read_niceness`, beside the async runtime
//! that serves HTTP, runs the pipeline worker and commits the writes.
//!
//! Why: a store waits on its batch's embedding and commit; a search costs a
//! millisecond or two of CPU. When searches arrive as fast as they are
//! answered, at the same priority they took half of the two CPUs from the
//! stores (README, Benchmarks: the workload's closed-loop run). At a higher
//! nice value a search still runs at once on an idle CPU, and gives way to
//! the embedding and the commit when the CPUs are full.

use std::future::Future;
use std::sync::Arc;

use crate::core::error::{Error, Result};

use super::Services;

/// A runtime of one worker thread per CPU, named `loomem-read`, whose
/// threads run at the given nice value. Shut down without waiting when
/// dropped (a runtime dropped inside an async context panics otherwise).
pub struct Reads {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Reads {
    pub fn start(niceness: i32) -> std::io::Result<Reads> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
            .thread_name("loomem-read")
            .on_thread_start(move || crate::core::thread::lower_priority(niceness))
            .enable_all()
            .build()?;
        Ok(Reads {
            runtime: Some(runtime),
        })
    }

    /// Run `work` on a read thread and wait here for its answer; a panic in
    /// it goes on in the caller.
    pub async fn run<T, Fut>(&self, work: Fut) -> Result<T>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let runtime = self.runtime.as_ref().expect("kept until dropped");
        runtime
            .spawn(work)
            .await
            .map_err(|e| match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(e) => Error::Internal(format!("the read was cancelled: {e}")),
            })?
    }
}

impl Drop for Reads {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Run a read on the read runtime and wait here for its answer. `work` is
/// given its own handle on the services, so that what it runs owns what it
/// uses.
pub async fn read<T, F, Fut>(services: &Arc<Services>, work: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(Arc<Services>) -> Fut,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    services.reads.run(work(services.clone())).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nice value of the calling thread (Linux: field 19 of its stat).
    fn own_niceness() -> i64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .collect();
        fields[16].parse().unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_runs_on_a_read_thread_at_its_niceness() {
        let reads = Reads::start(6).unwrap();
        let before = own_niceness();
        let (name, nice) = reads
            .run(async {
                // Past an await too: the task stays on the read runtime.
                tokio::task::yield_now().await;
                Ok((
                    std::thread::current().name().map(str::to_string),
                    own_niceness(),
                ))
            })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("loomem-read"));
        assert_eq!(nice, 6);
        // The caller's own thread is untouched.
        assert_eq!(own_niceness(), before);
        // An error comes back as it was.
        let err = reads
            .run(async { Err::<(), _>(Error::invalid("query", "must not be empty")) })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("query"), "{err}");
        // Dropped inside an async context without a panic.
        drop(reads);
    }

    #[tokio::test]
    async fn the_last_handle_may_be_dropped_by_a_read() {
        // A read whose caller went away holds the services, and so the
        // runtime, until it ends; the runtime is then let go on its own thread.
        let reads = std::sync::Arc::new(Reads::start(0).unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (done, dropped) = tokio::sync::oneshot::channel();
        let held = reads.clone();
        let runtime = reads.runtime.as_ref().unwrap();
        runtime.spawn(async move {
            let _ = rx.await;
            drop(held);
            // Not reached if the drop panicked.
            let _ = done.send(std::thread::current().name().map(str::to_string));
        });
        drop(reads);
        tx.send(()).unwrap();
        let on = dropped
            .await
            .expect("the runtime is let go without a panic");
        assert_eq!(on.as_deref(), Some("loomem-read"));
        // And a new one starts and answers.
        let again = Reads::start(0).unwrap();
        assert_eq!(again.run(async { Ok(7) }).await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_panicking_read_panics_in_its_caller() {
        let reads = Reads::start(0).unwrap();
        let caught =
            tokio::spawn(async move { reads.run(async { panic!("boom") as Result<()> }).await })
                .await
                .unwrap_err();
        assert!(caught.is_panic());
    }
}
