//! The MCP server through a real MCP client: streamable HTTP against the
//! daemon's `/mcp` (auth enforced), and stdio against `loomem mcp`.

use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, ADMIN_TOKEN, TOKEN_A};

pub(crate) type Client = RunningService<RoleClient, ClientConfig>;

pub(crate) async fn connect(
    d: &Daemon,
    token: Option<&str>,
    query: &str,
) -> Result<Client, String> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp{query}", d.url));
    if let Some(t) = token {
        config = config.auth_header(t);
    }
    ClientConfig::default()
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .map_err(|e| e.to_string())
}

pub(crate) async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let args = args.as_object().cloned().unwrap_or_default();
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

pub(crate) fn text_of(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A successful result's JSON.
fn ok_json(tool: &str, r: &CallToolResult) -> Value {
    assert_ne!(r.is_error, Some(true), "{tool}: {}", text_of(r));
    serde_json::from_str(&text_of(r)).unwrap_or_else(|e| panic!("{tool}: {e}: {}", text_of(r)))
}

const TOOLS: [&str; 14] = [
    "memory_store",
    "memory_ingest",
    "memory_search",
    "memory_context",
    "memory_profile",
    "memory_associate",
    "memory_dream",
    "memory_reflect",
    "memory_graph",
    "memory_history",
    "memory_delete",
    "memory_feedback",
    "memory_status",
    "memory_namespaces",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_over_streamable_http() {
    let d = Daemon::start(Options::with_auth()).await;
    // Auth: no key, a wrong key → the handshake fails.
    assert!(connect(&d, None, "").await.is_err());
    assert!(connect(&d, Some("wrong"), "").await.is_err());

    let client = connect(&d, Some(ADMIN_TOKEN), "")
        .await
        .expect("initialize");
    let info = client.peer_info().expect("server info");
    assert_eq!(info.server_info.as_ref().unwrap().name, "loomem-memory");
    assert!(info
        .instructions
        .as_deref()
        .unwrap()
        .contains("memory_ingest"));
    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    let mut want = TOOLS.to_vec();
    want.sort();
    assert_eq!(names, want);
    for t in &tools {
        assert_eq!(
            t.input_schema.get("type"),
            Some(&json!("object")),
            "{}",
            t.name
        );
        assert!(
            t.description.as_deref().is_some_and(|d| d.len() > 20),
            "{}",
            t.name
        );
    }
    let search_schema = &tools
        .iter()
        .find(|t| t.name == "memory_search")
        .unwrap()
        .input_schema;
    assert_eq!(search_schema["required"], json!(["query"]));

    // Store, ingest, search.
    let stored = ok_json("memory_store", &call(&client, "memory_store", json!({"content": "I use VSCode for all my coding", "subject": "user", "source": "user-stated"})).await);
    assert_eq!(stored["status"], "stored");
    let vscode = stored["id"].as_str().unwrap().to_string();
    ok_json(
        "memory_store",
        &call(
            &client,
            "memory_store",
            json!({"content": "The user pairs with Alice on Cursor sessions"}),
        )
        .await,
    );
    ok_json(
        "memory_store",
        &call(
            &client,
            "memory_store",
            json!({"content": "On weekends Alice is learning Rust"}),
        )
        .await,
    );
    let ingested = ok_json(
        "memory_ingest",
        &call(&client, "memory_ingest", json!({"content": "User: I switched from VSCode to Cursor last week. Also, the dashboard deadline is April 15th."})).await,
    );
    let facts = ingested["facts"].as_array().unwrap();
    assert!(
        facts
            .iter()
            .any(|f| f["content"].as_str().unwrap().contains("Cursor")),
        "{ingested}"
    );
    assert!(facts.iter().all(|f| f["status"] == "stored"), "{ingested}");
    let found = ok_json(
        "memory_search",
        &call(
            &client,
            "memory_search",
            json!({"query": "dashboard deadline"}),
        )
        .await,
    );
    assert!(
        found["results"][0]["content"]
            .as_str()
            .unwrap()
            .contains("-04-15"),
        "{found}"
    );
    let cursor_fact = facts
        .iter()
        .find(|f| f["content"].as_str().unwrap().contains("Cursor"))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // History: the VSCode fact was superseded by the ingested switch (the
    // conversation is dated today, after the stored fact).
    let history = call(&client, "memory_history", json!({"chunk_id": vscode})).await;
    let h = text_of(&history);
    assert!(
        h.starts_with("v1 (") && h.contains("VSCode") && h.contains("← superseded"),
        "{h}"
    );
    assert!(h.lines().last().unwrap().contains("← current"), "{h}");

    // Context, profile, associations.
    let ctx = ok_json(
        "memory_context",
        &call(
            &client,
            "memory_context",
            json!({"query": "editor", "budget_tokens": 120}),
        )
        .await,
    );
    assert!(
        ctx["total_tokens"].as_u64().unwrap() <= 120
            && !ctx["context"].as_str().unwrap().is_empty(),
        "{ctx}"
    );
    let profile = text_of(&call(&client, "memory_profile", json!({})).await);
    assert!(profile.starts_with("# Profile\n"), "{profile}");
    let profile_json = ok_json(
        "memory_profile",
        &call(&client, "memory_profile", json!({"format": "json"})).await,
    );
    assert!(profile_json["stable_facts"].as_array().unwrap().len() >= 2);
    let assoc = text_of(
        &call(
            &client,
            "memory_associate",
            json!({"query": "Cursor sessions"}),
        )
        .await,
    );
    assert!(assoc.starts_with("1. ["), "{assoc}");
    // Alice's other memory: not a search hit for the topic, reached through
    // Alice (graph), the same session (temporal) or meaning (semantic).
    let line = assoc
        .lines()
        .find(|l| l.contains("learning Rust"))
        .unwrap_or_else(|| panic!("{assoc}"));
    assert!(
        ["[graph_walk ", "[temporal ", "[semantic "]
            .iter()
            .any(|m| line.contains(m)),
        "{line}"
    );

    // Graph, reflect, dream.
    let graph = ok_json(
        "memory_graph",
        &call(&client, "memory_graph", json!({"entity": "alice"})).await,
    );
    assert_eq!(graph["entity"]["name"], "Alice");
    assert_eq!(graph["chunk_ids"].as_array().unwrap().len(), 2, "{graph}");
    let reflect = ok_json(
        "memory_reflect",
        &call(&client, "memory_reflect", json!({})).await,
    );
    let score = reflect["quality_score"].as_u64().unwrap();
    assert!(score > 0 && score <= 100, "{reflect}");
    assert!(reflect["breakdown"]["by_level"]["L0"].is_u64());
    assert!(!reflect["suggestions"].as_array().unwrap().is_empty());
    let dream = ok_json(
        "memory_dream",
        &call(&client, "memory_dream", json!({})).await,
    );
    assert!(dream["chunks_processed"].as_u64().unwrap() >= 4, "{dream}");
    for key in [
        "groups_found",
        "facts_merged",
        "contradictions_resolved",
        "cost_usd",
        "duration_ms",
    ] {
        assert!(dream.get(key).is_some(), "{key}: {dream}");
    }

    // Feedback, delete.
    let fb = ok_json(
        "memory_feedback",
        &call(
            &client,
            "memory_feedback",
            json!({"chunk_id": cursor_fact, "usefulness": 4}),
        )
        .await,
    );
    assert!(
        (fb["ranking_factor"].as_f64().unwrap() - 1.1).abs() < 1e-6,
        "{fb}"
    );
    let gone = ok_json(
        "memory_delete",
        &call(&client, "memory_delete", json!({"chunk_id": cursor_fact})).await,
    );
    assert_eq!(gone["status"], "deleted");
    let (s, _) = d
        .call("GET", &format!("/v1/memories/{cursor_fact}/history"), None)
        .await;
    assert_eq!(s, 404);

    // Status and namespaces (global).
    let status = ok_json(
        "memory_status",
        &call(&client, "memory_status", json!({})).await,
    );
    assert_eq!(status["status"], "ok");
    assert!(status["rocksdb_keys"].as_u64().unwrap() >= 4);
    let ns = ok_json(
        "memory_namespaces",
        &call(&client, "memory_namespaces", json!({})).await,
    );
    assert_eq!(ns["namespaces"]["personal"], "100");

    // Failures are tool results with the reason; malformed calls are protocol errors.
    let bad = call(
        &client,
        "memory_feedback",
        json!({"chunk_id": vscode, "usefulness": 9}),
    )
    .await;
    assert_eq!(bad.is_error, Some(true));
    assert!(
        text_of(&bad).starts_with("usefulness:"),
        "{}",
        text_of(&bad)
    );
    let missing = call(&client, "memory_history", json!({"chunk_id": "no-such-id"})).await;
    assert_eq!(missing.is_error, Some(true));
    assert!(text_of(&missing).contains("no memory with id"));
    // Parameters of the wrong type: an error result naming the problem (the
    // current MCP spec reports input validation as a tool error, so the model
    // can correct itself); an unknown tool is a protocol error.
    let wrong = call(&client, "memory_search", json!({"query": 5})).await;
    assert_eq!(wrong.is_error, Some(true));
    assert!(
        text_of(&wrong).contains("expected a string"),
        "{}",
        text_of(&wrong)
    );
    let unknown = client
        .call_tool(CallToolRequestParams::new("memory_teleport"))
        .await;
    assert!(unknown.is_err(), "{unknown:?}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_sessions_act_in_the_keys_streams() {
    let d = Daemon::start(Options::with_auth()).await;
    let client = connect(&d, Some(TOKEN_A), "").await.expect("initialize");
    let stored = ok_json(
        "memory_store",
        &call(
            &client,
            "memory_store",
            json!({"content": "Scoped agents keep notes in stream a"}),
        )
        .await,
    );
    let id = stored["id"].as_str().unwrap();
    // The key's default stream is `a`: REST sees it there.
    let ids = d
        .search_ids(json!({"query": "scoped agents notes", "stream": "a"}))
        .await;
    assert_eq!(ids, vec![id.to_string()]);
    // `?stream=` picks another of the key's streams; one it may not use is refused per call.
    let a2 = connect(&d, Some(TOKEN_A), "?stream=a2")
        .await
        .expect("initialize");
    let found = ok_json(
        "memory_search",
        &call(
            &a2,
            "memory_search",
            json!({"query": "scoped agents notes"}),
        )
        .await,
    );
    assert_eq!(found["results"], json!([]));
    let other = connect(&d, Some(TOKEN_A), "?stream=secret")
        .await
        .expect("initialize");
    let refused = call(&other, "memory_search", json!({"query": "anything"})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text_of(&refused).contains("not accessible"),
        "{}",
        text_of(&refused)
    );
    // Another stream's memory cannot be deleted by id.
    let hidden = d.store("Admin-only memory", "z").await;
    let denied = call(&client, "memory_delete", json!({"chunk_id": hidden})).await;
    assert_eq!(denied.is_error, Some(true));
    let (s, _) = d
        .call("GET", &format!("/v1/memories/{hidden}/history"), None)
        .await;
    assert_eq!(s, 200, "still there");
}

/// `memory_search` groups its results by conversation on request, as
/// `POST /v1/search` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_groups_results_into_sessions_on_request() {
    let d = Daemon::start(Options::with_auth()).await;
    for (session, text) in [
        ("trip", "We hiked the canyon trail on the first morning"),
        ("trip", "The canyon trail hike took us four hours"),
        (
            "work",
            "The quarterly canyon trail fundraiser needs a budget",
        ),
    ] {
        let body = json!({"content": text, "stream": "g", "session_id": session});
        let (status, resp) = d.call("POST", "/v1/store", Some(body)).await;
        assert_eq!(status, 200, "{resp}");
    }
    let client = connect(&d, Some(ADMIN_TOKEN), "?stream=g")
        .await
        .expect("initialize");
    let mut args = json!({"query": "canyon trail hike", "top_k": 10});
    let plain = ok_json(
        "memory_search",
        &call(&client, "memory_search", args.clone()).await,
    );
    assert_eq!(plain["results"].as_array().unwrap().len(), 3, "{plain}");
    assert!(plain.get("sessions").is_none(), "{plain}");
    args["group_sessions"] = json!(true);
    let grouped = ok_json("memory_search", &call(&client, "memory_search", args).await);
    let (status, rest) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "canyon trail hike", "top_k": 10, "stream": "g", "group_sessions": true})),
        )
        .await;
    assert_eq!(status, 200, "{rest}");
    let groups = |v: &Value| -> Vec<(String, std::collections::BTreeSet<String>)> {
        v["sessions"]
            .as_array()
            .unwrap_or_else(|| panic!("no sessions: {v}"))
            .iter()
            .map(|s| {
                let ids = s["chunk_ids"].as_array().unwrap();
                let ids = ids.iter().map(|i| i.as_str().unwrap().to_string());
                (s["session_id"].as_str().unwrap().to_string(), ids.collect())
            })
            .collect()
    };
    let mcp = groups(&grouped);
    assert_eq!(mcp, groups(&rest));
    assert_eq!(
        mcp.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>(),
        ["trip", "work"],
        "{grouped}"
    );
    assert_eq!(mcp[0].1.len(), 2, "{grouped}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_server_stores_and_searches() {
    use rmcp::transport::TokioChildProcess;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (config, env) = crate::fixture::daemon_env(&data, None, &Options::embedded());
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_loomem"));
    cmd.arg("--config")
        .arg(&config)
        .arg("mcp")
        .arg("--stream")
        .arg("desk");
    cmd.envs(&env);
    cmd.env("LOOMEM_LOG", "warn");
    let transport = TokioChildProcess::new(cmd).expect("spawn loomem mcp");
    let client = ClientConfig::default()
        .serve(transport)
        .await
        .expect("initialize over stdio");
    assert_eq!(
        client
            .peer_info()
            .unwrap()
            .server_info
            .as_ref()
            .unwrap()
            .name,
        "loomem-memory"
    );
    let stored = ok_json(
        "memory_store",
        &call(
            &client,
            "memory_store",
            json!({"content": "The desktop client stores over stdio"}),
        )
        .await,
    );
    let id = stored["id"].as_str().unwrap().to_string();
    let found = ok_json(
        "memory_search",
        &call(
            &client,
            "memory_search",
            json!({"query": "desktop client stdio"}),
        )
        .await,
    );
    assert_eq!(found["results"][0]["chunk_id"], id.as_str());
    let status = ok_json(
        "memory_status",
        &call(&client, "memory_status", json!({})).await,
    );
    assert_eq!(status["rocksdb_keys"], 1);
    client.cancel().await.unwrap();
}
