//! Integration tests: the real daemon on 127.0.0.1:0 with real Lance tables in a
//! temp dir.

mod api;
mod attack;
mod auth;
mod branches;
mod bulk;
mod compat;
mod context;
mod dream;
mod editing;
mod embed;
mod enrich;
mod errors;
mod export;
mod extract_eval;
mod fixture;
mod ingest;
mod isolation;
mod jetstream;
mod jobs;
mod keys;
mod llm_stub;
mod maintenance;
mod mcp;
mod memoclaw;
mod nats;
mod oauth;
mod openapi;
mod recall;
mod relations;
mod restart;
mod retrieval;
mod router;
mod services;
mod snapshot;
mod sql;
