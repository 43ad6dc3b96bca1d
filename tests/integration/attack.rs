//! The attack suite: agent A's key tries every route of the router (and every
//! MCP tool) against stream `b`, which belongs to agent B. Each attempt must
//! be refused or answer without B's data, and afterwards stream `b` is exactly
//! as it was. A route added to the router without an entry here fails the
//! suite.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, ADMIN_TOKEN, TOKEN_A, TOKEN_B};
use crate::mcp::{call, connect, text_of};

/// B's secret: no answer to A may contain it.
const SECRET: &str = "pelican";

/// How an attempt must end.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Exactly this status.
    Status(u16),
    /// Answered (2xx) within A's own streams: only the leak check applies.
    Scoped,
}
use Expect::*;

struct Attempt {
    /// The router path it exercises (as declared in the route table).
    route: &'static str,
    method: &'static str,
    uri: String,
    body: Option<Value>,
    expect: Expect,
}

fn attempt(
    route: &'static str,
    method: &'static str,
    uri: &str,
    body: Option<Value>,
    expect: Expect,
) -> Attempt {
    Attempt {
        route,
        method,
        uri: uri.to_string(),
        body,
        expect,
    }
}

fn attempts() -> Vec<Attempt> {
    let b = |extra: Value| {
        let mut v = json!({"stream": "b"});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        Some(v)
    };
    vec![
        attempt(
            "/v1/store",
            "POST",
            "/v1/store",
            b(json!({"content": "A writes into b"})),
            Status(403),
        ),
        attempt(
            "/v1/store",
            "POST",
            "/v1/store",
            Some(json!({"id": "b-secret", "content": "overwrite"})),
            Status(409),
        ),
        attempt(
            "/v1/ingest",
            "POST",
            "/v1/ingest",
            b(json!({"content": "User: I like herons."})),
            Status(403),
        ),
        attempt(
            "/v1/delete",
            "POST",
            "/v1/delete",
            Some(json!({"id": "b-secret"})),
            Status(404),
        ),
        attempt(
            "/api/memories/{id}",
            "DELETE",
            "/api/memories/b-secret",
            None,
            Status(404),
        ),
        attempt(
            "/v1/purge-namespace",
            "POST",
            "/v1/purge-namespace",
            b(json!({"dry_run": false, "confirmed": true})),
            Status(403),
        ),
        attempt(
            "/v1/import",
            "POST",
            "/v1/import?format=jsonl&stream=b",
            None,
            Scoped,
        ),
        attempt(
            "/v1/memories/{id}/history",
            "GET",
            "/v1/memories/b-secret/history",
            None,
            Status(404),
        ),
        attempt(
            "/v1/search",
            "POST",
            "/v1/search",
            b(json!({"query": "launch code word"})),
            Status(403),
        ),
        attempt(
            "/v1/search",
            "POST",
            "/v1/search",
            Some(json!({"query": "launch code word"})),
            Scoped,
        ),
        attempt(
            "/v1/feedback",
            "POST",
            "/v1/feedback",
            Some(json!({"chunk_id": "b-secret", "usefulness": 0, "harmful": true})),
            Status(404),
        ),
        attempt(
            "/v1/context-pack",
            "POST",
            "/v1/context-pack",
            b(json!({"query": "launch code word"})),
            Status(403),
        ),
        attempt(
            "/v1/context-pack",
            "POST",
            "/v1/context-pack",
            Some(json!({"query": "launch code word"})),
            Scoped,
        ),
        attempt(
            "/v1/ambient",
            "POST",
            "/v1/ambient",
            b(json!({"query": "launch code word"})),
            Status(403),
        ),
        attempt(
            "/v1/profile",
            "GET",
            "/v1/profile?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/generate-memory-md",
            "GET",
            "/v1/generate-memory-md?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/graph/entity/{name}",
            "GET",
            "/v1/graph/entity/bob?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/graph/entity/{name}",
            "GET",
            "/v1/graph/entity/bob?stream=a",
            None,
            Status(404),
        ),
        attempt(
            "/v1/graph/stats",
            "GET",
            "/v1/graph/stats?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/associate",
            "POST",
            "/v1/associate",
            b(json!({"query": "launch code word"})),
            Status(403),
        ),
        attempt(
            "/v1/associate",
            "POST",
            "/v1/associate",
            Some(json!({"query": "launch code word"})),
            Scoped,
        ),
        attempt(
            "/v1/reflect",
            "POST",
            "/v1/reflect",
            b(json!({})),
            Status(403),
        ),
        attempt(
            "/v1/dream",
            "POST",
            "/v1/dream",
            b(json!({"dry_run": false})),
            Status(403),
        ),
        attempt(
            "/v1/sql",
            "POST",
            "/v1/sql",
            Some(json!({"sql": "SELECT id, content FROM chunks"})),
            Scoped,
        ),
        attempt(
            "/v1/sql",
            "POST",
            "/v1/sql",
            Some(json!({"sql": "SELECT id, content FROM chunks_as_of(1)"})),
            Scoped,
        ),
        attempt(
            "/v1/sql",
            "POST",
            "/v1/sql",
            Some(json!({"sql": "SELECT * FROM entities"})),
            Scoped,
        ),
        attempt(
            "/v1/sql",
            "POST",
            "/v1/sql",
            Some(json!({"sql": "SELECT * FROM history"})),
            Scoped,
        ),
        attempt(
            "/v1/export",
            "POST",
            "/v1/export",
            b(json!({"format": "jsonl"})),
            Status(403),
        ),
        attempt(
            "/v1/export",
            "POST",
            "/v1/export",
            Some(json!({"format": "jsonl"})),
            Scoped,
        ),
        attempt(
            "/v1/embed-missing",
            "POST",
            "/v1/embed-missing",
            Some(json!({})),
            Scoped,
        ),
        attempt(
            "/v1/re-embed-all",
            "POST",
            "/v1/re-embed-all",
            Some(json!({})),
            Scoped,
        ),
        attempt(
            "/v1/jobs/{id}",
            "GET",
            "/v1/jobs/no-such-job",
            None,
            Status(404),
        ),
        attempt(
            "/v1/jobs/{id}",
            "DELETE",
            "/v1/jobs/no-such-job",
            None,
            Status(404),
        ),
        attempt("/v1/jobs", "GET", "/v1/jobs", None, Status(403)),
        attempt(
            "/v1/memories/{id}",
            "GET",
            "/v1/memories/b-secret",
            None,
            Status(404),
        ),
        attempt(
            "/v1/memories/{id}",
            "PATCH",
            "/v1/memories/b-secret",
            Some(json!({"content": "rewritten by A", "pinned": true})),
            Status(404),
        ),
        attempt("/v1/memories", "GET", "/v1/memories", None, Scoped),
        attempt(
            "/v1/memories",
            "GET",
            "/v1/memories?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/memories/count",
            "GET",
            "/v1/memories/count?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/memories/batch",
            "POST",
            "/v1/memories/batch",
            Some(json!({"memories": [
                {"content": "A writes into b", "stream": "b"},
                {"id": "b-secret", "content": "overwrite"}
            ]})),
            Scoped,
        ),
        attempt(
            "/v1/memories/batch",
            "PATCH",
            "/v1/memories/batch",
            Some(json!({"updates": [{"id": "b-secret", "content": "rewritten"}]})),
            Scoped,
        ),
        attempt(
            "/v1/memories/bulk-delete",
            "POST",
            "/v1/memories/bulk-delete",
            Some(json!({"ids": ["b-secret"]})),
            Scoped,
        ),
        attempt(
            "/v1/memories/bulk-delete",
            "POST",
            "/v1/memories/bulk-delete",
            Some(json!({"filter": {"stream": "b"}, "confirmed": true})),
            Status(403),
        ),
        attempt(
            "/v1/memories/{id}/correct",
            "PUT",
            "/v1/memories/b-secret/correct",
            Some(json!({"new_content": "rewritten"})),
            Status(404),
        ),
        attempt(
            "/v1/memories/correct",
            "POST",
            "/v1/memories/correct",
            b(json!({"query": "launch code word", "new_content": "rewritten"})),
            Status(403),
        ),
        attempt("/v1/streams", "GET", "/v1/streams", None, Scoped),
        attempt("/v1/tags", "GET", "/v1/tags?stream=b", None, Status(403)),
        attempt("/v1/tags", "GET", "/v1/tags", None, Scoped),
        attempt(
            "/v1/feedback/stats",
            "GET",
            "/v1/feedback/stats?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/feedback/stats",
            "GET",
            "/v1/feedback/stats",
            None,
            Scoped,
        ),
        attempt(
            "/v1/relations",
            "POST",
            "/v1/relations",
            Some(json!({"from_id": "b-secret", "to_id": "b-secret", "relation": "supports"})),
            Status(404),
        ),
        attempt("/v1/relations", "GET", "/v1/relations", None, Scoped),
        attempt(
            "/v1/relations",
            "GET",
            "/v1/relations?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/relations/{id}",
            "DELETE",
            "/v1/relations/no-such-relation",
            None,
            Status(404),
        ),
        attempt(
            "/v1/memories/{id}/related",
            "GET",
            "/v1/memories/b-secret/related",
            None,
            Status(404),
        ),
        attempt(
            "/v1/graph/explore",
            "GET",
            "/v1/graph/explore?from=b-secret",
            None,
            Status(404),
        ),
        attempt(
            "/v1/graph/explore",
            "GET",
            "/v1/graph/explore?from=entity:bob&stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/graph/path",
            "GET",
            "/v1/graph/path?from=b-secret&to=entity:bob",
            None,
            Status(404),
        ),
        attempt(
            "/v1/graph/analyze",
            "POST",
            "/v1/graph/analyze",
            Some(json!({"stream": "b"})),
            Status(403),
        ),
        attempt(
            "/v1/graph/rank",
            "GET",
            "/v1/graph/rank?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/graph/communities",
            "GET",
            "/v1/graph/communities?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoria/v1/memories",
            "GET",
            "/compat/memoria/v1/memories",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/memories",
            "POST",
            "/compat/memoria/v1/memories",
            Some(json!({"content": "A writes through Memoria"})),
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/memories/batch",
            "POST",
            "/compat/memoria/v1/memories/batch",
            Some(json!({"memories": [{"content": "A batch through Memoria"}]})),
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/memories/retrieve",
            "POST",
            "/compat/memoria/v1/memories/retrieve",
            Some(json!({"query": SECRET, "top_k": 50})),
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/memories/search",
            "POST",
            "/compat/memoria/v1/memories/search",
            Some(json!({"query": "launch code word", "top_k": 50})),
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/memories/correct",
            "POST",
            "/compat/memoria/v1/memories/correct",
            Some(
                json!({"query": "launch code word", "new_content": "The launch code word is in the other safe"}),
            ),
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/memories/purge",
            "POST",
            "/compat/memoria/v1/memories/purge",
            Some(json!({"memory_ids": ["b-secret"]})),
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/memories/{id}",
            "DELETE",
            "/compat/memoria/v1/memories/b-secret",
            None,
            Status(404),
        ),
        attempt(
            "/compat/memoria/v1/memories/{id}/correct",
            "PUT",
            "/compat/memoria/v1/memories/b-secret/correct",
            Some(json!({"new_content": "overwritten by A"})),
            Status(404),
        ),
        attempt(
            "/compat/memoria/v1/memories/{id}/feedback",
            "POST",
            "/compat/memoria/v1/memories/b-secret/feedback",
            Some(json!({"signal": "wrong"})),
            Status(404),
        ),
        attempt(
            "/compat/memoria/v1/feedback/stats",
            "GET",
            "/compat/memoria/v1/feedback/stats",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/observe",
            "POST",
            "/compat/memoria/v1/observe",
            Some(
                json!({"messages": [{"role": "user", "content": "I keep notes in a blue notebook"}]}),
            ),
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/profiles/me",
            "GET",
            "/compat/memoria/v1/profiles/me",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/consolidate",
            "POST",
            "/compat/memoria/v1/consolidate",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/snapshots",
            "POST",
            "/compat/memoria/v1/snapshots",
            Some(json!({"name": "a-took-it"})),
            Status(403),
        ),
        attempt(
            "/compat/memoria/v1/snapshots",
            "GET",
            "/compat/memoria/v1/snapshots",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoria/v1/snapshots/{name}",
            "GET",
            "/compat/memoria/v1/snapshots/before",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoria/v1/snapshots/{name}",
            "DELETE",
            "/compat/memoria/v1/snapshots/before",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoria/v1/snapshots/{name}/rollback",
            "POST",
            "/compat/memoria/v1/snapshots/before/rollback",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoria/{*rest}",
            "GET",
            "/compat/memoria/v1/governance",
            None,
            Status(501),
        ),
        // Branches: another key's stream refused; Memoria's within A's own.
        attempt(
            "/v1/branches",
            "POST",
            "/v1/branches",
            Some(json!({"name": "x", "stream": "b"})),
            Status(403),
        ),
        attempt(
            "/v1/branches",
            "GET",
            "/v1/branches?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/branches/{name}/diff",
            "GET",
            "/v1/branches/x/diff?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/v1/branches/{name}/merge",
            "POST",
            "/v1/branches/x/merge",
            Some(json!({"stream": "b"})),
            Status(403),
        ),
        attempt(
            "/v1/branches/{name}",
            "DELETE",
            "/v1/branches/x?stream=b",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoria/v1/branches",
            "POST",
            "/compat/memoria/v1/branches",
            Some(json!({"name": "trial"})),
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/branches",
            "GET",
            "/compat/memoria/v1/branches",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/branches/{name}/checkout",
            "POST",
            "/compat/memoria/v1/branches/trial/checkout",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/branches/{name}/diff",
            "GET",
            "/compat/memoria/v1/branches/trial/diff",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/branches/{name}/merge",
            "POST",
            "/compat/memoria/v1/branches/trial/merge",
            Some(json!({"strategy": "append"})),
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/branches/{name}/checkout",
            "POST",
            "/compat/memoria/v1/branches/main/checkout",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoria/v1/branches/{name}",
            "DELETE",
            "/compat/memoria/v1/branches/trial",
            None,
            Scoped,
        ),
        // MemoClaw's API.
        attempt(
            "/compat/memoclaw/v1/store",
            "POST",
            "/compat/memoclaw/v1/store",
            Some(json!({"content": "A through MemoClaw", "namespace": "b"})),
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/store",
            "POST",
            "/compat/memoclaw/v1/store",
            Some(json!({"content": "A stores through MemoClaw"})),
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/store/batch",
            "POST",
            "/compat/memoclaw/v1/store/batch",
            Some(json!({"memories": [{"content": "x", "namespace": "b"}]})),
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/recall",
            "POST",
            "/compat/memoclaw/v1/recall",
            Some(json!({"query": "pelican", "namespace": "b"})),
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/recall",
            "POST",
            "/compat/memoclaw/v1/recall",
            Some(json!({"query": "pelican", "min_similarity": 0.0})),
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/search",
            "POST",
            "/compat/memoclaw/v1/search",
            Some(json!({"query": "pelican", "namespace": "b"})),
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/search",
            "POST",
            "/compat/memoclaw/v1/search",
            Some(json!({"query": "pelican"})),
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/context",
            "POST",
            "/compat/memoclaw/v1/context",
            Some(json!({"query": "pelican", "namespace": "b"})),
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/memories",
            "GET",
            "/compat/memoclaw/v1/memories?namespace=b",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/memories",
            "GET",
            "/compat/memoclaw/v1/memories?limit=500",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/memories/count",
            "GET",
            "/compat/memoclaw/v1/memories/count?namespace=b",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/memories/bulk-delete",
            "POST",
            "/compat/memoclaw/v1/memories/bulk-delete",
            Some(json!({"ids": ["b-secret"]})),
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/memories/batch",
            "PATCH",
            "/compat/memoclaw/v1/memories/batch",
            Some(
                json!({"updates": [{"id": "b-secret", "content": "overwritten", "importance": 0.1}]}),
            ),
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/memories/extract",
            "POST",
            "/compat/memoclaw/v1/memories/extract",
            Some(
                json!({"messages": [{"role": "user", "content": "I like tea"}], "namespace": "b"}),
            ),
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/memories/consolidate",
            "POST",
            "/compat/memoclaw/v1/memories/consolidate",
            Some(json!({"namespace": "b"})),
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/memories/{id}",
            "GET",
            "/compat/memoclaw/v1/memories/b-secret",
            None,
            Status(404),
        ),
        attempt(
            "/compat/memoclaw/v1/memories/{id}",
            "PATCH",
            "/compat/memoclaw/v1/memories/b-secret",
            Some(json!({"content": "overwritten"})),
            Status(404),
        ),
        attempt(
            "/compat/memoclaw/v1/memories/{id}",
            "DELETE",
            "/compat/memoclaw/v1/memories/b-secret",
            None,
            Status(404),
        ),
        attempt(
            "/compat/memoclaw/v1/memories/{id}/history",
            "GET",
            "/compat/memoclaw/v1/memories/b-secret/history",
            None,
            Status(404),
        ),
        attempt(
            "/compat/memoclaw/v1/memories/{id}/graph",
            "GET",
            "/compat/memoclaw/v1/memories/b-secret/graph",
            None,
            Status(404),
        ),
        attempt(
            "/compat/memoclaw/v1/memories/{id}/relations",
            "GET",
            "/compat/memoclaw/v1/memories/b-secret/relations",
            None,
            Status(404),
        ),
        attempt(
            "/compat/memoclaw/v1/memories/{id}/relations",
            "POST",
            "/compat/memoclaw/v1/memories/b-secret/relations",
            Some(json!({"target_id": "b-secret"})),
            Status(404),
        ),
        attempt(
            "/compat/memoclaw/v1/memories/{id}/relations/{relation_id}",
            "DELETE",
            "/compat/memoclaw/v1/memories/b-secret/relations/any",
            None,
            Status(404),
        ),
        attempt(
            "/compat/memoclaw/v1/ingest",
            "POST",
            "/compat/memoclaw/v1/ingest",
            Some(json!({"text": "I like tea", "namespace": "b"})),
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/suggested",
            "GET",
            "/compat/memoclaw/v1/suggested?namespace=b",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/suggested",
            "GET",
            "/compat/memoclaw/v1/suggested?limit=100",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/export",
            "GET",
            "/compat/memoclaw/v1/export?namespace=b",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/export",
            "GET",
            "/compat/memoclaw/v1/export?format=csv",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/import",
            "POST",
            "/compat/memoclaw/v1/import",
            Some(json!([{"id": "b-secret", "content": "overwritten by A"}])),
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/migrate",
            "POST",
            "/compat/memoclaw/v1/migrate",
            Some(
                json!({"files": [{"filename": "x.md", "content": "## A note\n\nwritten by A"}], "namespace": "b"}),
            ),
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/namespaces",
            "GET",
            "/compat/memoclaw/v1/namespaces",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/core-memories",
            "GET",
            "/compat/memoclaw/v1/core-memories?namespace=b",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/core-memories",
            "GET",
            "/compat/memoclaw/v1/core-memories?limit=100",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/tags",
            "GET",
            "/compat/memoclaw/v1/tags?namespace=b",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/tags",
            "GET",
            "/compat/memoclaw/v1/tags",
            None,
            Scoped,
        ),
        attempt(
            "/compat/memoclaw/v1/stats",
            "GET",
            "/compat/memoclaw/v1/stats?namespace=b",
            None,
            Status(403),
        ),
        attempt(
            "/compat/memoclaw/v1/stats",
            "GET",
            "/compat/memoclaw/v1/stats",
            None,
            Scoped,
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories/store",
            "POST",
            "/compat/neuroloom/api/v1/memories/store",
            Some(json!({"title": "A through Neuroloom", "narrative": "A stores a pattern"})),
            Scoped,
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories/",
            "GET",
            "/compat/neuroloom/api/v1/memories/?limit=500",
            None,
            Scoped,
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories",
            "GET",
            "/compat/neuroloom/api/v1/memories?limit=500",
            None,
            Scoped,
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories/batch-delete",
            "POST",
            "/compat/neuroloom/api/v1/memories/batch-delete",
            Some(json!({"memory_ids": ["b-secret"]})),
            Scoped,
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories/explore",
            "POST",
            "/compat/neuroloom/api/v1/memories/explore",
            Some(json!({"query": SECRET, "max_nodes": 200})),
            Scoped,
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories/path",
            "POST",
            "/compat/neuroloom/api/v1/memories/path",
            Some(json!({"source_memory_id": "b-secret", "target_memory_id": "b-secret"})),
            Status(404),
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories/{memory_id}",
            "GET",
            "/compat/neuroloom/api/v1/memories/b-secret",
            None,
            Status(404),
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories/{memory_id}",
            "PATCH",
            "/compat/neuroloom/api/v1/memories/b-secret",
            Some(json!({"narrative": "A rewrites it"})),
            Status(404),
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories/{memory_id}",
            "DELETE",
            "/compat/neuroloom/api/v1/memories/b-secret",
            None,
            Status(404),
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories/{memory_id}/related",
            "GET",
            "/compat/neuroloom/api/v1/memories/b-secret/related",
            None,
            Status(404),
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories/{memory_id}/access",
            "POST",
            "/compat/neuroloom/api/v1/memories/b-secret/access",
            None,
            Status(404),
        ),
        attempt(
            "/compat/neuroloom/api/v1/memories/{memory_id}/retrieval",
            "POST",
            "/compat/neuroloom/api/v1/memories/b-secret/retrieval",
            None,
            Status(404),
        ),
        // Stream b's real dead letters are tried in `editing`; here an id.
        attempt(
            "/v1/dead-letters/{id}/retry",
            "POST",
            "/v1/dead-letters/no-such-letter/retry",
            None,
            Status(404),
        ),
        attempt("/admin/jobs", "GET", "/admin/jobs", None, Status(403)),
        attempt("/metrics", "GET", "/metrics", None, Status(403)),
        attempt(
            "/admin/keys",
            "POST",
            "/admin/keys",
            Some(json!({"name": "mine", "role": "admin"})),
            Status(403),
        ),
        attempt("/admin/keys", "GET", "/admin/keys", None, Status(403)),
        attempt(
            "/admin/keys/{id}/rotate",
            "POST",
            "/admin/keys/any/rotate",
            Some(json!({})),
            Status(403),
        ),
        attempt(
            "/admin/keys/{id}",
            "DELETE",
            "/admin/keys/any",
            None,
            Status(403),
        ),
        attempt("/openapi.json", "GET", "/openapi.json", None, Scoped),
        attempt(
            "/admin/jobs/{name}/run",
            "POST",
            "/admin/jobs/decay/run",
            Some(json!({})),
            Status(403),
        ),
        attempt(
            "/v1/snapshots",
            "POST",
            "/v1/snapshots",
            Some(json!({"name": "mine"})),
            Status(403),
        ),
        attempt("/v1/snapshots", "GET", "/v1/snapshots", None, Status(403)),
        attempt(
            "/v1/snapshots/{name}",
            "DELETE",
            "/v1/snapshots/before",
            None,
            Status(403),
        ),
        attempt(
            "/v1/snapshots/{name}/rollback",
            "POST",
            "/v1/snapshots/before/rollback",
            None,
            Status(403),
        ),
        attempt(
            "/v1/boost",
            "POST",
            "/v1/boost",
            Some(json!({"id": "b-secret"})),
            Status(404),
        ),
        attempt(
            "/v1/retag-all",
            "POST",
            "/v1/retag-all",
            b(json!({})),
            Status(403),
        ),
        attempt(
            "/v1/score-all",
            "POST",
            "/v1/score-all",
            b(json!({})),
            Status(403),
        ),
        attempt(
            "/v1/reset-importance",
            "POST",
            "/v1/reset-importance",
            b(json!({})),
            Status(403),
        ),
        attempt(
            "/v1/reset-backfill",
            "POST",
            "/v1/reset-backfill",
            b(json!({})),
            Status(403),
        ),
        attempt(
            "/v1/build-graph",
            "POST",
            "/v1/build-graph",
            b(json!({})),
            Status(403),
        ),
        attempt(
            "/v1/extract-entities",
            "POST",
            "/v1/extract-entities",
            b(json!({})),
            Status(409),
        ),
        attempt(
            "/admin/workers/pause",
            "POST",
            "/admin/workers/pause",
            None,
            Status(403),
        ),
        attempt(
            "/admin/workers/resume",
            "POST",
            "/admin/workers/resume",
            None,
            Status(403),
        ),
        attempt(
            "/admin/workers/status",
            "GET",
            "/admin/workers/status",
            None,
            Status(403),
        ),
        attempt("/v1/status", "GET", "/v1/status", None, Scoped),
        attempt("/v1/namespaces", "GET", "/v1/namespaces", None, Scoped),
        attempt("/v1/whoami", "GET", "/v1/whoami", None, Scoped),
    ]
}

/// Everything stream `b` holds, in every table, as the admin reads it.
async fn stream_b(d: &Daemon) -> Vec<Value> {
    let mut all = Vec::new();
    for table in ["chunks", "entities", "edges", "history", "feedback"] {
        all.push(json!(table));
        all.extend(
            d.sql(&format!(
                "SELECT * FROM {table} WHERE stream = 'b' ORDER BY id"
            ))
            .await,
        );
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_lets_one_key_reach_another_streams_data() {
    // Every route in a second spends more than the expensive budget's burst:
    // this suite is about isolation (the limits have tests of their own).
    let d = Daemon::start(
        Options::with_auth().env("LOOMEM_SERVER__RATE_LIMIT__EXPENSIVE_BURST", "1000"),
    )
    .await;
    // B's memories: a fact with a chosen id, and a conversation (entities,
    // edges, history), and a snapshot the admin took.
    let (s, body) = d
        .call_as(
            Some(TOKEN_B),
            "POST",
            "/v1/store",
            Some(json!({"id": "b-secret", "content": format!("The launch code word is {SECRET}")})),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = d
        .call_as(
            Some(TOKEN_B),
            "POST",
            "/v1/ingest",
            Some(json!({"content": format!("User: Bob keeps a {SECRET} named Percy. Bob uses Cursor every day.")})),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = d
        .call_as(
            Some(ADMIN_TOKEN),
            "POST",
            "/v1/snapshots",
            Some(json!({"name": "before"})),
        )
        .await;
    assert_eq!(s, 201, "{body}");
    // A has memories of its own, so scoped answers are not trivially empty.
    let (s, body) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/store",
            Some(json!({"content": "The launch code word is in the safe"})),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let before = stream_b(&d).await;
    assert!(
        before.iter().any(|r| r.to_string().contains(SECRET)),
        "{before:?}"
    );

    // Every route of the router has an entry.
    let covered: BTreeSet<&str> = attempts().iter().map(|a| a.route).chain(["/mcp"]).collect();
    let missing: Vec<&str> = loomem::api::route_paths()
        .into_iter()
        .filter(|p| !covered.contains(p))
        .collect();
    assert!(
        missing.is_empty(),
        "routes without an attack entry: {missing:?}"
    );

    let mut wrong = Vec::new();
    for a in attempts() {
        let (status, body) = if a.route == "/v1/import" {
            let line = format!("{{\"content\":\"A imports into b\"}}\n");
            d.send(
                Some(TOKEN_A),
                a.method,
                &a.uri,
                None,
                &[],
                line.into_bytes(),
            )
            .await
        } else if a.route.starts_with("/compat/neuroloom/") {
            d.call_token(TOKEN_A, a.method, &a.uri, a.body.clone())
                .await
        } else {
            d.call_as(Some(TOKEN_A), a.method, &a.uri, a.body.clone())
                .await
        };
        let what = format!("{} {} {:?}", a.method, a.uri, a.body);
        let ok = match a.expect {
            Status(want) => status == want,
            Scoped => (200..300).contains(&status),
        };
        if !ok {
            wrong.push(format!(
                "{what}: expected {:?}, got {status} {body}",
                a.expect
            ));
        }
        if a.route == "/v1/import" && body["accepted"] != 0 {
            wrong.push(format!("{what} imported into b: {body}"));
        }
        if body.to_string().to_lowercase().contains(SECRET) {
            wrong.push(format!("{what} leaked stream b: {body}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // A JSONL import line that takes b's id.
    let (s, report) = d
        .send(
            Some(TOKEN_A),
            "POST",
            "/v1/import?format=jsonl",
            None,
            &[],
            b"{\"id\":\"b-secret\",\"content\":\"overwrite\"}\n".to_vec(),
        )
        .await;
    assert_eq!((s, report["accepted"].as_u64()), (200, Some(0)), "{report}");

    // The MCP tools: on a session for stream b every tool is refused; on A's
    // own session none reaches b's ids or text.
    let on_b = connect(&d, Some(TOKEN_A), "?stream=b")
        .await
        .expect("initialize");
    for (tool, args) in [
        ("memory_search", json!({"query": "launch code word"})),
        (
            "memory_store",
            json!({"content": "A writes into b over MCP"}),
        ),
        ("memory_ingest", json!({"content": "User: I like herons."})),
        ("memory_profile", json!({})),
        ("memory_dream", json!({})),
    ] {
        let r = call(&on_b, tool, args).await;
        assert_eq!(r.is_error, Some(true), "{tool} on b: {}", text_of(&r));
        assert!(
            !text_of(&r).to_lowercase().contains(SECRET),
            "{tool} leaked"
        );
    }
    let _ = on_b.cancel().await;
    let mcp = connect(&d, Some(TOKEN_A), "")
        .await
        .expect("A's own session");
    for (tool, args) in [
        ("memory_search", json!({"query": "launch code word"})),
        ("memory_context", json!({"query": "launch code word"})),
        ("memory_associate", json!({"query": "launch code word"})),
        ("memory_profile", json!({})),
        ("memory_graph", json!({"entity": "bob"})),
        ("memory_history", json!({"chunk_id": "b-secret"})),
        ("memory_delete", json!({"chunk_id": "b-secret"})),
        (
            "memory_feedback",
            json!({"chunk_id": "b-secret", "usefulness": -5, "harmful": true}),
        ),
        ("memory_reflect", json!({})),
        ("memory_status", json!({})),
    ] {
        let r = call(&mcp, tool, args).await;
        let text = text_of(&r).to_lowercase();
        assert!(!text.contains(SECRET), "{tool} leaked stream b: {text}");
        if matches!(tool, "memory_history" | "memory_delete" | "memory_feedback") {
            assert_eq!(r.is_error, Some(true), "{tool}: {text}");
        }
    }
    let _ = mcp.cancel().await;

    assert_eq!(stream_b(&d).await, before, "stream b changed");
}
