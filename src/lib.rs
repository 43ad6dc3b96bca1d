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
