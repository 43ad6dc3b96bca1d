//! loomem: a long-term memory engine for AI agents. Writes flow over a bus through
//! staged pipelines into LanceDB tables; agents recall through hybrid search.

pub mod admin;
pub mod api;
pub mod associate;
pub mod auth;
pub mod bus;
pub mod config;
pub mod context;
pub mod conversation;
pub mod dream;
pub mod embed;
pub mod engine;
pub mod error;
pub mod extract;
pub mod feedback;
pub mod graph;
pub mod graph_query;
pub mod import;
pub mod ingest;
pub mod jobs;
pub mod llm;
pub mod mcp;
pub mod memory;
pub mod model;
pub mod ner;
pub mod openai_compat;
pub mod pipeline;
pub mod recall;
pub mod reembed;
pub mod reflect;
pub mod search;
pub mod server;
pub mod sql;
pub mod store;
pub mod time;
pub mod tokens;
