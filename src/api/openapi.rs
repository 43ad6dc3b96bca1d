//! The OpenAPI 3.1 description of the REST API, served at `/openapi.json`.
//!
//! Every operation of the router is one entry of [`operations`]; its request
//! and response schemas are generated (schemars) from the very types the
//! handlers parse and answer with, so the description follows the code. The
//! integration suite checks that every route the router answers has an entry
//! and runs schemathesis against the live daemon with it.

use schemars::generate::SchemaSettings;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};

use super::{jobs, memories};
use crate::service;

type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

fn of<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// The parameters of a query string type, one schema per field.
fn query_of<T: JsonSchema>() -> Schema {
    SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator()
        .into_root_schema_for::<T>()
}

/// What an operation takes as its body.
pub enum Body {
    None,
    /// JSON; `required: false` when an empty body means the defaults.
    Json {
        schema: SchemaFn,
        required: bool,
    },
    /// The body is a file in one of these formats (`/v1/import`).
    File(&'static [&'static str]),
}

/// What an operation answers with on success.
pub enum Answer {
    Json(SchemaFn),
    /// A file in one of these content types (exports, SQL in other formats).
    Files(&'static [&'static str]),
}

pub struct Op {
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    pub body: Body,
    pub query: Option<fn() -> Schema>,
    pub ok: u16,
    /// Also answers 202 with the same body (`"wait": false`: started, not done).
    pub accepted: bool,
    pub answer: Answer,
}

fn op(method: &'static str, path: &'static str, summary: &'static str) -> Op {
    Op {
        method,
        path,
        summary,
        body: Body::None,
        query: None,
        ok: 200,
        accepted: false,
        answer: Answer::Json(any_object),
    }
}

impl Op {
    fn json<T: JsonSchema>(mut self) -> Op {
        self.body = Body::Json {
            schema: of::<T>,
            required: true,
        };
        self
    }

    /// A JSON body that may be left out (the defaults apply).
    fn optional_json<T: JsonSchema>(mut self) -> Op {
        self.body = Body::Json {
            schema: of::<T>,
            required: false,
        };
        self
    }

    fn query<T: JsonSchema>(mut self) -> Op {
        self.query = Some(query_of::<T>);
        self
    }

    fn answers<T: JsonSchema>(mut self) -> Op {
        self.answer = Answer::Json(of::<T>);
        self
    }

    fn answers_with(mut self, schema: SchemaFn) -> Op {
        self.answer = Answer::Json(schema);
        self
    }

    fn status(mut self, ok: u16) -> Op {
        self.ok = ok;
        self
    }

    fn or_accepted(mut self) -> Op {
        self.accepted = true;
        self
    }
}

fn any_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "object" })
}

fn sql_json(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "required": ["columns", "rows", "row_count", "truncated"],
        "properties": {
            "columns": { "type": "array", "items": { "type": "string" } },
            "rows": { "type": "array", "items": { "type": "object" } },
            "row_count": { "type": "integer", "minimum": 0 },
            "truncated": { "type": "boolean" }
        }
    })
}

const SQL_FORMATS: &[&str] = &[
    "application/json",
    "application/x-ndjson",
    "text/csv",
    "text/markdown",
    "application/vnd.apache.arrow.stream",
    "application/vnd.apache.parquet",
];

const EXPORT_FORMATS: &[&str] = &[
    "application/x-ndjson",
    "text/csv",
    "text/markdown",
    "application/vnd.apache.parquet",
];

/// Every operation of the REST API (all but `/mcp`, which speaks MCP).
pub fn operations() -> Vec<Op> {
    use service::*;
    vec![
        op("get", "/health", "Liveness; needs no key"),
        op(
            "post",
            "/v1/store",
            "Store one memory (returns once it is written)",
        )
        .json::<memory::StoreRequest>()
        .answers::<memory::StoreResponse>(),
        op(
            "post",
            "/v1/ingest",
            "A conversation transcript in, its facts stored",
        )
        .json::<conversation::IngestRequest>()
        .answers::<conversation::IngestResponse>(),
        op(
            "post",
            "/v1/delete",
            "Delete a memory (with forget: erase it from earlier versions too)",
        )
        .json::<memories::DeleteRequest>()
        .answers::<memory::Deleted>(),
        op("delete", "/api/memories/{id}", "Delete a memory by id").query::<memories::NsQuery>(),
        op(
            "post",
            "/v1/purge-namespace",
            "List (dry run) or delete every memory of a stream",
        )
        .json::<memory::PurgeRequest>()
        .answers::<memory::PurgeResponse>(),
        Op {
            body: Body::File(&["application/x-ndjson", "text/plain"]),
            ..op(
                "post",
                "/v1/import",
                "Import a file: jsonl, chatgpt, claude, markdown, loomem-jsonl (restore)",
            )
            .query::<memories::ImportQuery>()
            .answers::<import::ImportReport>()
        },
        op("get", "/v1/memories/{id}", "One memory the key can see"),
        op(
            "get",
            "/v1/memories",
            "A page of memories: filters, an order, a cursor",
        )
        .query::<service::listing::ListQuery>()
        .answers::<service::listing::Page>(),
        op(
            "get",
            "/v1/memories/count",
            "How many memories the filters match",
        )
        .query::<service::listing::ListQuery>()
        .answers::<service::listing::Count>(),
        op(
            "post",
            "/v1/memories/batch",
            "Store many memories; answered per item",
        )
        .json::<service::bulk::BatchStoreRequest>()
        .answers::<service::bulk::BatchAnswer>(),
        op(
            "patch",
            "/v1/memories/batch",
            "Edit many memories; answered per item",
        )
        .json::<service::bulk::BatchEditRequest>()
        .answers::<service::bulk::BatchAnswer>(),
        op(
            "post",
            "/v1/memories/bulk-delete",
            "Delete by ids or filters, after a snapshot (dry_run shows what would go)",
        )
        .json::<service::bulk::BulkDeleteRequest>()
        .answers::<service::bulk::BulkDeleted>(),
        op(
            "put",
            "/v1/memories/{id}/correct",
            "Correct a memory: its new text as a new version, with the reason",
        )
        .json::<service::edit::CorrectRequest>()
        .answers::<service::edit::Corrected>(),
        op(
            "post",
            "/v1/memories/correct",
            "Correct the memory that best matches a query in one stream",
        )
        .json::<service::edit::CorrectByQueryRequest>()
        .answers::<service::edit::Corrected>(),
        op("get", "/v1/streams", "The key's streams with counts")
            .answers::<service::listing::Streams>(),
        op(
            "get",
            "/v1/tags",
            "Tags with counts, for the listing's filters",
        )
        .query::<service::listing::ListQuery>()
        .answers::<service::listing::Tags>(),
        op(
            "patch",
            "/v1/memories/{id}",
            "Edit a memory (new text makes a new version that supersedes it)",
        )
        .json::<edit::EditRequest>()
        .answers::<edit::Edited>(),
        op(
            "get",
            "/v1/memories/{id}/history",
            "The version chain of a memory and its reasons",
        )
        .query::<memories::HistoryQuery>()
        .answers::<memory::History>(),
        op(
            "post",
            "/v1/search",
            "Hybrid search (BM25, vector, entity graph)",
        )
        .json::<search::SearchRequest>()
        .answers::<search::SearchResponse>(),
        op(
            "get",
            "/v1/feedback/stats",
            "What the feedback on the key's streams adds up to",
        )
        .query::<service::feedback::StatsQuery>()
        .answers::<service::feedback::FeedbackStats>(),
        op("post", "/v1/feedback", "Rate how useful a memory was")
            .json::<feedback::FeedbackRequest>()
            .answers::<feedback::FeedbackResponse>()
            .status(201),
        op(
            "post",
            "/v1/context-pack",
            "Memories for a task within a token budget",
        )
        .json::<context::ContextPackRequest>()
        .answers::<context::ContextPack>(),
        op(
            "post",
            "/v1/ambient",
            "Memories relevant to the current message",
        )
        .json::<context::AmbientRequest>()
        .answers::<context::Ambient>(),
        op("get", "/v1/profile", "What the memory knows about the user")
            .query::<super::context::ProfileQuery>(),
        op("get", "/v1/generate-memory-md", "A MEMORY.md of the stream")
            .query::<context::MemoryMdQuery>()
            .answers::<context::MemoryMd>(),
        op(
            "get",
            "/v1/graph/entity/{name}",
            "An entity, its aliases, memories and neighbours",
        )
        .query::<graph::GraphQuery>()
        .answers::<graph::EntityView>(),
        op("get", "/v1/graph/stats", "Entity and edge counts")
            .query::<graph::GraphQuery>()
            .answers::<graph::GraphStats>(),
        op(
            "get",
            "/v1/graph/explore",
            "The memories and entities within N hops of a memory or an entity",
        )
        .query::<service::relations::ExploreQuery>()
        .answers::<service::relations::Subgraph>(),
        op(
            "get",
            "/v1/graph/path",
            "The shortest chain of relations and mentions between two nodes",
        )
        .query::<service::relations::PathQuery>()
        .answers::<service::relations::Path>(),
        op(
            "post",
            "/v1/graph/analyze",
            "Compute a stream's PageRank and communities now",
        )
        .json::<service::graph_rank::AnalyzeRequest>()
        .answers::<service::graph_rank::Analysis>(),
        op("get", "/v1/graph/rank", "A stream's nodes by PageRank")
            .query::<service::graph_rank::RankQuery>()
            .answers::<service::graph_rank::Ranking>(),
        op(
            "get",
            "/v1/graph/communities",
            "A stream's communities of memories and entities",
        )
        .query::<service::graph_rank::CommunitiesQuery>()
        .answers::<service::graph_rank::Communities>(),
        op("post", "/v1/relations", "Link two memories of one stream")
            .json::<service::relations::RelateRequest>()
            .answers::<service::relations::Relation>(),
        op(
            "get",
            "/v1/relations",
            "Links, by memory, relation or stream",
        )
        .query::<service::relations::RelationsQuery>()
        .answers::<service::relations::Relations>(),
        op("delete", "/v1/relations/{id}", "Remove a link")
            .answers::<service::relations::Unrelated>(),
        op(
            "get",
            "/v1/memories/{id}/related",
            "Memories linked to one, and those sharing its entities",
        )
        .query::<service::relations::RelatedQuery>()
        .answers::<service::relations::Related>(),
        op(
            "post",
            "/v1/associate",
            "Memories linked to one through shared entities",
        )
        .json::<associate::AssociateRequest>()
        .answers::<associate::Associations>(),
        op(
            "post",
            "/v1/reflect",
            "A reflection over the stream's memories",
        )
        .json::<reflect::ReflectRequest>()
        .answers::<reflect::Reflection>(),
        op("post", "/v1/dream", "Consolidate near-duplicate memories")
            .optional_json::<dream::DreamRequest>()
            .answers::<dream::DreamReport>(),
        Op {
            answer: Answer::Files(SQL_FORMATS),
            ..op("post", "/v1/sql", "Read-only SQL over the caller's streams")
                .json::<sql::SqlRequest>()
        },
        Op {
            answer: Answer::Files(EXPORT_FORMATS),
            ..op(
                "post",
                "/v1/export",
                "Export the tables: lossless JSONL or a query's rows",
            )
            .json::<export::ExportRequest>()
        },
        op(
            "post",
            "/v1/embed-missing",
            "Embed memories without a vector of the current model",
        )
        .optional_json::<reembed::EmbedJobRequest>()
        .answers::<reembed::EmbedJobResponse>()
        .or_accepted(),
        op(
            "post",
            "/v1/re-embed-all",
            "Re-embed every memory of the caller's streams",
        )
        .optional_json::<reembed::EmbedJobRequest>()
        .answers::<reembed::EmbedJobResponse>()
        .or_accepted(),
        op("get", "/v1/jobs/{id}", "An embedding job's progress").answers::<tasks::TaskView>(),
        op("delete", "/v1/jobs/{id}", "Cancel an embedding job").answers::<tasks::TaskView>(),
        op("get", "/v1/jobs", "Scheduled job runs (admin)").query::<jobs::RunsQuery>(),
        op(
            "get",
            "/admin/jobs",
            "Every job with its schedule and next run (admin)",
        )
        .answers::<jobs::Schedule>(),
        op(
            "post",
            "/v1/dead-letters/{id}/retry",
            "Send a dead letter's message through its pipeline again",
        )
        .answers::<memory::Retried>(),
        op(
            "post",
            "/admin/jobs/{name}/run",
            "Run a scheduled job now (admin)",
        )
        .optional_json::<jobs::RunRequest>()
        .answers::<crate::jobs::RunView>(),
        op(
            "post",
            "/v1/snapshots",
            "Tag every table's current version (admin)",
        )
        .optional_json::<jobs::SnapshotRequest>()
        .answers::<snapshot::Snapshot>()
        .status(201),
        op("get", "/v1/snapshots", "Every snapshot (admin)"),
        op(
            "delete",
            "/v1/snapshots/{name}",
            "Remove a snapshot's tags (admin)",
        ),
        op(
            "post",
            "/v1/snapshots/{name}/rollback",
            "Put every table back to a snapshot (admin)",
        )
        .answers::<snapshot::Rollback>(),
        op(
            "post",
            "/v1/branches",
            "Branch a stream: copy its memories into `<stream>~<name>`",
        )
        .json::<crate::service::branch::NewBranch>()
        .answers::<crate::service::branch::Branch>()
        .status(201),
        op("get", "/v1/branches", "A stream's branches")
            .query::<crate::service::branch::BranchQuery>()
            .answers::<crate::service::branch::Branches>(),
        op(
            "delete",
            "/v1/branches/{name}",
            "Drop a branch (purge its stream)",
        )
        .query::<crate::service::branch::BranchQuery>()
        .answers::<crate::service::branch::Dropped>(),
        op(
            "get",
            "/v1/branches/{name}/diff",
            "What a branch added, changed and removed",
        )
        .query::<crate::service::branch::BranchQuery>()
        .answers::<crate::service::branch::Diff>(),
        op(
            "post",
            "/v1/branches/{name}/merge",
            "Merge a branch into its base",
        )
        .json::<crate::service::branch::MergeRequest>()
        .answers::<crate::service::branch::Merged>(),
        op("post", "/v1/boost", "Raise a memory's importance").json::<maintenance::BoostRequest>(),
        op(
            "post",
            "/v1/retag-all",
            "Rerun entity extraction over the memories",
        )
        .optional_json::<maintenance::ScopeRequest>()
        .answers::<maintenance::Report>(),
        op(
            "post",
            "/v1/score-all",
            "Rerun surprise scoring over the memories",
        )
        .optional_json::<maintenance::ScopeRequest>()
        .answers::<maintenance::Report>(),
        op("post", "/v1/reset-importance", "Clear implicit boosts")
            .optional_json::<maintenance::ScopeRequest>()
            .answers::<maintenance::Report>(),
        op("post", "/v1/reset-backfill", "Clear the LLM entity marks")
            .optional_json::<maintenance::ScopeRequest>()
            .answers::<maintenance::Report>(),
        op(
            "post",
            "/v1/build-graph",
            "Rebuild the entity graph from the memories",
        )
        .optional_json::<maintenance::ScopeRequest>()
        .answers::<maintenance::Report>(),
        op(
            "post",
            "/v1/extract-entities",
            "Queue memories for LLM entity extraction",
        )
        .optional_json::<maintenance::ScopeRequest>()
        .status(202),
        op(
            "post",
            "/admin/keys",
            "Make an API key; its secret is shown once (admin)",
        )
        .json::<service::keys::CreateKey>()
        .answers::<service::keys::KeyWithSecret>()
        .status(201),
        op(
            "get",
            "/admin/keys",
            "Every runtime key, never a secret (admin)",
        )
        .answers::<super::keys::KeyList>(),
        op(
            "post",
            "/admin/keys/{id}/rotate",
            "A new secret; the old one works for a grace period (admin)",
        )
        .optional_json::<service::keys::RotateKey>()
        .answers::<service::keys::KeyWithSecret>(),
        op("delete", "/admin/keys/{id}", "Revoke a key (admin)")
            .answers::<service::keys::KeyView>(),
        op(
            "post",
            "/admin/workers/pause",
            "Pause background maintenance (admin)",
        )
        .answers::<jobs::Workers>(),
        op(
            "post",
            "/admin/workers/resume",
            "Resume background maintenance (admin)",
        )
        .answers::<jobs::Workers>(),
        op(
            "get",
            "/admin/workers/status",
            "Whether maintenance is paused (admin)",
        )
        .answers::<jobs::Workers>(),
        op(
            "get",
            "/v1/status",
            "Counts, bus, embedder and pipelines as the key may see them",
        )
        .answers::<status::Status>(),
        op(
            "get",
            "/v1/namespaces",
            "The namespace labels the key may use",
        )
        .answers::<status::Namespaces>(),
        op("get", "/v1/whoami", "The key's name, role and streams").answers::<status::WhoAmI>(),
        op("get", "/openapi.json", "This description").answers_with(any_object),
        Op {
            answer: Answer::Files(&["text/plain"]),
            ..op(
                "get",
                "/metrics",
                "Prometheus metrics in the text exposition format (admin)",
            )
        },
    ]
}

/// The parameters `{name}` in a path template.
fn path_params(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
        .collect()
}

/// The query parameters of a query-string type's schema.
fn query_params(schema: &Schema) -> Vec<Value> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(name, s)| {
            json!({
                "name": name,
                "in": "query",
                "required": required.contains(&name.as_str()),
                "schema": s,
            })
        })
        .collect()
}

fn content(types: &[&str], schema: Option<&Schema>) -> Value {
    let mut out = Map::new();
    for t in types {
        let media = match (schema, *t) {
            (Some(s), "application/json") => json!({ "schema": s }),
            (_, t) if t.starts_with("text/") || t.ends_with("ndjson") => {
                json!({ "schema": { "type": "string" } })
            }
            _ => json!({ "schema": { "type": "string", "contentMediaType": t } }),
        };
        out.insert(t.to_string(), media);
    }
    Value::Object(out)
}

/// The whole description.
pub fn document() -> Value {
    let mut g = SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .into_generator();
    let mut paths: Map<String, Value> = Map::new();
    for op in operations() {
        let mut parameters: Vec<Value> = path_params(op.path)
            .into_iter()
            .map(|p| json!({ "name": p, "in": "path", "required": true, "schema": { "type": "string" } }))
            .collect();
        if let Some(q) = op.query {
            parameters.extend(query_params(&q()));
        }
        let ok = match &op.answer {
            Answer::Json(f) => {
                let s = f(&mut g);
                json!({ "description": "success", "content": content(&["application/json"], Some(&s)) })
            }
            Answer::Files(types) => {
                let s = sql_json(&mut g);
                json!({ "description": "success", "content": content(types, Some(&s)) })
            }
        };
        let mut operation = json!({
            "summary": op.summary,
            "operationId": format!("{}{}", op.method, op.path.replace(['/', '{', '}', '-', '.'], "_")),
            "responses": {
                op.ok.to_string(): ok,
                "default": {
                    "description": "an error; `detail` says what went wrong",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ApiError" } } }
                }
            }
        });
        if op.accepted {
            operation["responses"]["202"] = operation["responses"][op.ok.to_string()].clone();
        }
        if !parameters.is_empty() {
            operation["parameters"] = Value::Array(parameters);
        }
        match &op.body {
            Body::None => {}
            Body::Json { schema, required } => {
                let s = schema(&mut g);
                // An empty body reads as `{}`: it is needed only when the
                // type has fields without a default.
                let needs_fields = s
                    .get("$ref")
                    .and_then(Value::as_str)
                    .and_then(|r| r.rsplit('/').next())
                    .and_then(|name| g.definitions().get(name))
                    .and_then(|d| d.get("required"))
                    .and_then(Value::as_array)
                    .is_some_and(|r| !r.is_empty());
                operation["requestBody"] = json!({
                    "required": *required && needs_fields,
                    "content": content(&["application/json"], Some(&s)),
                });
            }
            Body::File(types) => {
                operation["requestBody"] =
                    json!({ "required": true, "content": content(types, None) });
            }
        }
        if op.path == "/health" {
            operation["security"] = json!([]);
        }
        let entry = paths
            .entry(op.path.to_string())
            .or_insert_with(|| json!({}));
        entry[op.method] = operation;
    }
    let mut schemas = g.take_definitions(true);
    schemas.insert(
        "ApiError".into(),
        json!({
            "type": "object",
            "required": ["detail"],
            "properties": { "detail": { "type": "string" } }
        }),
    );
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "loomem",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Long-term memory for AI agents. Every operation but /health takes `Authorization: Bearer <key>`; a key sees only its own streams.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
        },
        "security": [{ "bearer": [] }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_is_whole() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().unwrap();
        assert_eq!(
            paths
                .values()
                .map(|p| p.as_object().unwrap().len())
                .sum::<usize>(),
            operations().len()
        );
        // Bodies are described field by field, with their defaults and limits.
        let store = &doc["components"]["schemas"]["StoreRequest"];
        assert!(store["properties"]["content"].is_object(), "{store}");
        // Every $ref points at a schema the document holds.
        let text = doc.to_string();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &r[..r.find('"').unwrap()];
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "dangling $ref {name}"
            );
        }
        // Query strings become parameters.
        let search = &doc["paths"]["/v1/graph/stats"]["get"]["parameters"];
        assert!(
            search
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "stream"),
            "{search}"
        );
        assert_eq!(path_params("/v1/snapshots/{name}/rollback"), vec!["name"]);
    }
}
