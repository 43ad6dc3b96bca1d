//! The MCP server `loomem-memory`: the 14 `memory_*` tools over streamable
//! HTTP (`/mcp` on the daemon, behind the same auth as REST) and stdio
//! (`loomem mcp`). Each tool parses its parameters, calls the service function
//! its REST twin calls, and renders the answer; no logic lives here.
//!
//! Failures of a service (bad values, unknown ids, no access) come back as tool
//! results with `isError` and the message; malformed calls (wrong parameter
//! types) are protocol errors, raised by rmcp.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::app::Engine;
use crate::core::error::Error;
use crate::core::Caller;

/// What MCP clients are told about using the tools (embedded at compile time).
pub const INSTRUCTIONS: &str = include_str!("../mcp_instructions.md");
pub const SERVER_NAME: &str = "loomem-memory";

#[derive(Clone)]
pub struct MemoryServer {
    engine: Arc<Engine>,
    /// The caller of a stdio session (HTTP sessions take the request's).
    local: Option<(Caller, Option<String>)>,
    tool_router: ToolRouter<Self>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct StoreParams {
    /// The fact to store.
    pub content: String,
    /// Provenance, e.g. "user-stated".
    pub source: Option<String>,
    /// Entity the fact is about (person, project).
    pub subject: Option<String>,
    /// Custom JSON metadata.
    pub metadata: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct IngestParams {
    /// Conversation transcript ("User: …" / "Assistant: …" lines).
    pub content: String,
    /// ISO date of the conversation, e.g. "2026-04-02" (default today).
    pub conversation_date: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SearchParams {
    /// Search query.
    pub query: String,
    /// Max results (default 10).
    pub top_k: Option<usize>,
    /// "today", "this_week" or "this_month".
    pub time_filter: Option<String>,
    /// Also group the results by conversation (`sessions`, best first).
    pub group_sessions: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ContextParams {
    /// Topic focus, e.g. "dashboard project".
    pub query: Option<String>,
    /// Max tokens (default 4000).
    pub budget_tokens: Option<usize>,
    /// Which sections: profile, relevant, recent (default all).
    pub sections: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ProfileParams {
    /// "markdown" (default) or "json".
    pub format: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct AssociateParams {
    /// The topic to find non-obvious connections for (default: the latest memories).
    pub query: Option<String>,
    /// How many associations (default 5, at most 20).
    pub limit: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReflectParams {
    /// How many chunks to analyze (default 1000).
    pub max_chunks: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct GraphParams {
    /// Entity name to explore.
    pub entity: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct HistoryParams {
    /// Chunk to trace.
    pub chunk_id: String,
    /// Max versions to return.
    pub limit: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct DeleteParams {
    /// Memory to delete.
    pub chunk_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct FeedbackParams {
    /// Chunk to rate (the id memory_store / memory_ingest / memory_search returned).
    pub chunk_id: String,
    /// 0 (not useful) – 4 (crucial).
    pub usefulness: i64,
    /// Only when the chunk contained incorrect or misleading information.
    pub harmful: Option<bool>,
}

fn json<T: Serialize>(value: &T) -> Result<CallToolResult, ErrorData> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
    Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
}

fn text(s: String) -> Result<CallToolResult, ErrorData> {
    Ok(CallToolResult::success(vec![ContentBlock::text(s)]))
}

/// A service failure as a tool result the model can read.
fn failed(e: Error) -> Result<CallToolResult, ErrorData> {
    Ok(CallToolResult::error(vec![ContentBlock::text(
        e.to_string(),
    )]))
}

/// Run a service call; its error becomes an `isError` tool result.
macro_rules! service {
    ($call:expr, $render:expr) => {
        match $call.await {
            Ok(v) => $render(v),
            Err(e) => failed(e),
        }
    };
}

/// The call's caller and active stream, or the failure as the tool's result.
macro_rules! who {
    ($server:expr, $ctx:expr) => {
        match $server.who(&$ctx) {
            Ok(w) => w,
            Err(e) => return failed(e),
        }
    };
}

impl MemoryServer {
    /// A server for HTTP sessions: each call acts as the request's caller.
    pub fn http(engine: Arc<Engine>) -> MemoryServer {
        MemoryServer {
            engine,
            local: None,
            tool_router: Self::tool_router(),
        }
    }

    /// A server for one stdio session acting as `caller` in `stream`.
    pub fn local(engine: Arc<Engine>, caller: Caller, stream: Option<String>) -> MemoryServer {
        MemoryServer {
            engine,
            local: Some((caller, stream)),
            tool_router: Self::tool_router(),
        }
    }

    /// The caller and active stream of a call: from the HTTP request (set by
    /// the auth middleware; `?stream=` picks the stream), else the stdio session's.
    fn who(&self, ctx: &RequestContext<RoleServer>) -> Result<(Caller, Option<String>), Error> {
        if let Some(parts) = ctx.extensions.get::<axum::http::request::Parts>() {
            let caller = parts
                .extensions
                .get::<Caller>()
                .cloned()
                .ok_or(Error::Unauthorized)?;
            let stream = parts.uri.query().and_then(|q| {
                q.split('&')
                    .filter_map(|kv| kv.split_once('='))
                    .find(|(k, _)| *k == "stream")
                    .map(|(_, v)| v.to_string())
            });
            return Ok((caller, stream));
        }
        self.local.clone().ok_or(Error::Unauthorized)
    }
}

#[tool_router]
impl MemoryServer {
    #[tool(
        description = "Store a single, confirmed fact (explicit user statements, decisions, biographical facts). Not for raw conversation text: use memory_ingest."
    )]
    async fn memory_store(
        &self,
        Parameters(p): Parameters<StoreParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, stream) = who!(self, ctx);
        let req = crate::service::memory::StoreRequest {
            content: p.content,
            stream,
            source: p.source,
            subject: p.subject,
            metadata: p.metadata,
            ..Default::default()
        };
        service!(
            crate::service::memory::store(&self.engine, &caller, req),
            |r| json(&r)
        )
    }

    #[tool(
        description = "Extract structured knowledge from a conversation: dated, typed facts; near duplicates skipped; updates supersede older facts. Preferred for multi-fact content."
    )]
    async fn memory_ingest(
        &self,
        Parameters(p): Parameters<IngestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, stream) = who!(self, ctx);
        let req = crate::service::conversation::IngestRequest {
            content: Some(p.content),
            conversation_date: p.conversation_date.map(serde_json::Value::String),
            stream,
            ..Default::default()
        };
        service!(
            crate::service::conversation::ingest(&self.engine, &caller, req),
            |r| json(&r)
        )
    }

    #[tool(
        description = "Hybrid search (BM25 + vector + entity graph) with time decay; near-identical results collapsed; superseded facts excluded. \"How many …\" questions widen top_k to 30."
    )]
    async fn memory_search(
        &self,
        Parameters(p): Parameters<SearchParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, stream) = who!(self, ctx);
        let req = crate::service::search::SearchRequest {
            query: p.query,
            top_k: p.top_k,
            time_filter: p.time_filter,
            group_sessions: p.group_sessions.unwrap_or(false),
            stream,
            ..Default::default()
        };
        service!(
            crate::service::search::search_on_reads(&self.engine.services, caller, req),
            |r| json(&r)
        )
    }

    #[tool(
        description = "Load relevant background at the start of a task: a token-budgeted pack of profile (20%), relevant (50%) and recent (30%, last 7 days) memories."
    )]
    async fn memory_context(
        &self,
        Parameters(p): Parameters<ContextParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, stream) = who!(self, ctx);
        let req = crate::service::context::ContextPackRequest {
            query: p.query,
            stream,
            budget_tokens: p.budget_tokens,
            sections: p.sections,
            now: None,
        };
        service!(
            crate::service::context::context_pack_on_reads(&self.engine.services, caller, req),
            |r| json(&r)
        )
    }

    #[tool(
        description = "The user's synthesized profile: stable facts (max 30), recent context (last 7 days, max 15) and a 2-3 sentence summary; cached for an hour."
    )]
    async fn memory_profile(
        &self,
        Parameters(p): Parameters<ProfileParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, stream) = who!(self, ctx);
        let markdown = match p.format.as_deref() {
            None | Some("markdown") => true,
            Some("json") => false,
            Some(other) => {
                return failed(Error::invalid(
                    "format",
                    format!("`{other}`: must be markdown or json"),
                ))
            }
        };
        service!(
            crate::service::context::profile(&self.engine, &caller, stream.as_deref()),
            |p: crate::service::context::Profile| if markdown {
                text(p.markdown())
            } else {
                json(&p)
            }
        )
    }

    #[tool(
        description = "Surface serendipitous associations — memories surprisingly relevant but not obvious — through graph walks, temporal co-occurrence and semantic adjacency. For creative links, not fact retrieval."
    )]
    async fn memory_associate(
        &self,
        Parameters(p): Parameters<AssociateParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, stream) = who!(self, ctx);
        let req = crate::service::associate::AssociateRequest {
            query: p.query,
            stream,
            limit: p.limit,
        };
        service!(
            crate::service::associate::associate(&self.engine, &caller, req),
            |a: crate::service::associate::Associations| {
                if a.associations.is_empty() {
                    return text("No associations found. Clustering may not have run yet — call memory_dream first, or store more memories.".into());
                }
                let lines: Vec<String> = a
                    .associations
                    .iter()
                    .map(|x| {
                        format!(
                            "{}. [{} {:.2}] {} (via {}; chunk {})",
                            x.rank, x.mechanism, x.score, x.content, x.via, x.chunk_id
                        )
                    })
                    .collect();
                text(lines.join("\n"))
            }
        )
    }

    #[tool(
        description = "Trigger memory consolidation: groups memories by subject and similarity, merges them into concise L1 summaries, resolves contradictions (newer facts win). Respects a cost cap."
    )]
    async fn memory_dream(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, stream) = who!(self, ctx);
        let req = crate::service::dream::DreamRequest {
            stream,
            ..Default::default()
        };
        service!(
            crate::service::dream::dream(&self.engine, &caller, req),
            |r| json(&r)
        )
    }

    #[tool(
        description = "Analyze memory quality: score = has_meta·0.4 + has_subject·0.3 + structured·0.3 (percent), breakdown by level, concrete suggestions."
    )]
    async fn memory_reflect(
        &self,
        Parameters(p): Parameters<ReflectParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, stream) = who!(self, ctx);
        let req = crate::service::reflect::ReflectRequest {
            stream,
            max_chunks: p.max_chunks,
        };
        service!(
            crate::service::reflect::reflect(&self.engine, &caller, req),
            |r| { json(&r) }
        )
    }

    #[tool(
        description = "Explore an entity's connections in the (per-stream) knowledge graph: type, aliases, related entities, linked chunks."
    )]
    async fn memory_graph(
        &self,
        Parameters(p): Parameters<GraphParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, stream) = who!(self, ctx);
        let stream = stream.unwrap_or_else(|| caller.default_stream().to_string());
        service!(
            crate::service::graph::entity(&self.engine, &caller, &p.entity, Some(&stream)),
            |r| json(&r)
        )
    }

    #[tool(
        description = "Trace how a fact evolved: its version chain, oldest first, marking the current one."
    )]
    async fn memory_history(
        &self,
        Parameters(p): Parameters<HistoryParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, _) = who!(self, ctx);
        service!(
            crate::service::memory::history(&self.engine, &caller, &p.chunk_id, p.limit),
            |h: crate::service::memory::History| {
                let lines: Vec<String> = h
                    .versions
                    .iter()
                    .map(|v| {
                        format!(
                            "v{} ({}): \"{}\"  ← {}  [{}]",
                            v.version,
                            &v.created_at[..10.min(v.created_at.len())],
                            v.content,
                            if v.is_current {
                                "current"
                            } else {
                                "superseded"
                            },
                            v.chunk_id
                        )
                    })
                    .collect();
                text(lines.join("\n"))
            }
        )
    }

    #[tool(description = "Delete a specific memory by id. Never without the user's confirmation.")]
    async fn memory_delete(
        &self,
        Parameters(p): Parameters<DeleteParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, _) = who!(self, ctx);
        service!(
            crate::service::memory::delete(&self.engine, &caller, &p.chunk_id, None),
            |_| json(&crate::service::memory::Deleted::new(&p.chunk_id))
        )
    }

    #[tool(
        description = "Rate the usefulness of a memory after a task (0 not useful – 4 crucial; harmful only for incorrect or misleading content). Feeds ranking."
    )]
    async fn memory_feedback(
        &self,
        Parameters(p): Parameters<FeedbackParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, _) = who!(self, ctx);
        let req = crate::service::feedback::FeedbackRequest {
            chunk_id: p.chunk_id,
            usefulness: p.usefulness,
            harmful: p.harmful.unwrap_or(false),
        };
        service!(
            crate::service::feedback::record(&self.engine, &caller, req),
            |r| { json(&r) }
        )
    }

    #[tool(description = "Engine health and statistics (memories, embeddings, bus, scheduler).")]
    async fn memory_status(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, _) = who!(self, ctx);
        service!(
            crate::service::status::status(&self.engine, &caller),
            |s: crate::service::status::Status| { json(&s.for_mcp()) }
        )
    }

    #[tool(description = "List the memory spaces (namespace label → stream id) this key may use.")]
    async fn memory_namespaces(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (caller, _) = who!(self, ctx);
        json(&crate::service::status::namespaces(&caller))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for MemoryServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

/// The `/mcp` service for the daemon's router (behind the auth middleware).
pub fn http_service(
    engine: Arc<Engine>,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    MemoryServer,
    rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
> {
    let hosts = engine.cfg.server.mcp_allowed_hosts.clone();
    let mut config = rmcp::transport::streamable_http_server::StreamableHttpServerConfig::default()
        .with_sse_keep_alive(None)
        .with_json_response(true);
    config = if hosts.iter().any(|h| h == "*") {
        config.disable_allowed_hosts()
    } else {
        config.with_allowed_hosts(hosts)
    };
    rmcp::transport::streamable_http_server::StreamableHttpService::new(
        move || Ok(MemoryServer::http(engine.clone())),
        Default::default(),
        config,
    )
}

/// Serve one MCP session over stdin/stdout until the client closes it.
pub async fn serve_stdio(server: MemoryServer) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let running = server.serve(rmcp::transport::io::stdio()).await?;
    running.waiting().await?;
    Ok(())
}
