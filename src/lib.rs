//! loomem: a long-term memory engine for AI agents. Writes flow over a bus through
//! staged pipelines into LanceDB tables; agents recall through hybrid search.
//!
//! The crate is a house with floors (see `ARCHITECTURE.md`); a module uses only
//! the floors below its own, and [`floors`] holds the table a test enforces.

pub mod api;
pub mod app;
pub mod bench_recall;
pub mod bus;
pub mod core;
pub mod floors;
pub mod jobs;
pub mod mcp;
pub mod pipeline;
pub mod providers;
pub mod service;
pub mod store;

/// Every binary built on the crate (the daemon, the CLI, the benches and
/// tests) allocates through jemalloc. The engine makes and frees many
/// short-lived buffers of every size on several threads at once (Arrow
/// batches, JSON, the pipeline's records). glibc's allocator took a fifth of
/// a bulk import's busy CPU, much of it merging freed chunks; on jemalloc
/// the same import ran about a quarter faster on a fifth less CPU (README,
/// Benchmarks, session 88). Its background threads (the crate's
/// `background_threads` feature) return freed pages to the system.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
