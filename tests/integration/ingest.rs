//! `POST /v1/ingest`: conversations in, dated facts out, through the real
//! pipeline; the LLM path against a local stand-in for an OpenAI-compatible chat
//! endpoint.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options};
use crate::llm_stub::stub_llm;

fn fact<'a>(body: &'a Value, memory_type: &str) -> &'a Value {
    body["facts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["memory_type"] == memory_type)
        .unwrap_or_else(|| panic!("no {memory_type} fact in {body}"))
}

async fn sql(d: &Daemon, query: &str) -> Vec<Value> {
    d.sql(query).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_example_supersedes_the_old_editor_and_dates_the_deadline() {
    let d = Daemon::start(Options::default()).await;
    let (status, old) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "I use VSCode for all my coding", "stream": "s", "created_at": "2026-03-01"})),
        )
        .await;
    assert_eq!(status, 200, "{old}");
    let old_id = old["id"].as_str().unwrap().to_string();

    let (status, body) = d
        .call(
            "POST",
            "/v1/ingest",
            Some(json!({
                "content": "User: I switched from VSCode to Cursor last week. Also, the dashboard deadline is April 15th.",
                "conversation_date": "2026-04-02",
                "stream": "s"
            })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "stored");
    assert_eq!(body["extractor"], "rules");
    assert_eq!(body["facts"].as_array().unwrap().len(), 2, "{body}");
    assert_eq!(body["stored_ids"].as_array().unwrap().len(), 2);

    let pref = fact(&body, "preference");
    assert!(
        pref["content"].as_str().unwrap().contains("Cursor"),
        "{pref}"
    );
    assert_eq!(pref["subject"], "user");
    assert_eq!(pref["dates"][0]["date"], "2026-03-26");
    assert_eq!(pref["supersedes"], json!([old_id]));
    assert_eq!(body["superseded"], json!([old_id]));

    let project = fact(&body, "project");
    assert_eq!(project["subject"], "dashboard");
    assert_eq!(project["dates"][0]["date"], "2026-04-15");
    assert!(
        project["content"].as_str().unwrap().contains("2026-04-15"),
        "{project}"
    );

    // The old memory is closed, not deleted; the new one carries its provenance.
    let rows = sql(
        &d,
        &format!(
            "SELECT id, superseded_by, version, memory_type, extraction_meta, created_at FROM chunks WHERE id IN ('{old_id}', '{}')",
            pref["id"].as_str().unwrap()
        ),
    )
    .await;
    let old_row = rows.iter().find(|r| r["id"] == old_id.as_str()).unwrap();
    assert_eq!(old_row["superseded_by"], pref["id"]);
    let new_row = rows.iter().find(|r| r["id"] == pref["id"]).unwrap();
    assert_eq!(new_row["version"], 2);
    assert_eq!(new_row["memory_type"], "preference");
    let meta: Value = serde_json::from_str(new_row["extraction_meta"].as_str().unwrap()).unwrap();
    assert_eq!(meta["ingest"]["extractor"], "rules");
    assert_eq!(meta["ingest"]["conversation_date"], "2026-04-02");
    assert!(meta["ingest"]["source_span"]["text"]
        .as_str()
        .unwrap()
        .contains("switched from VSCode"));
    assert!(
        new_row["created_at"]
            .as_str()
            .unwrap()
            .starts_with("2026-04-02"),
        "{new_row}"
    );

    // The same fact told again later is a duplicate of the stored one.
    let said = |date: &str| json!({"content": "User: I love hiking in the Alps.", "conversation_date": date, "stream": "s"});
    let (_, first) = d.call("POST", "/v1/ingest", Some(said("2026-04-03"))).await;
    assert_eq!(first["facts"][0]["status"], "stored", "{first}");
    let (status, again) = d.call("POST", "/v1/ingest", Some(said("2026-04-05"))).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["duplicates_skipped"], 1, "{again}");
    assert_eq!(again["facts"][0]["status"], "duplicate");
    assert_eq!(again["facts"][0]["existing_id"], first["facts"][0]["id"]);
    assert!(again["stored_ids"].as_array().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_validates_its_input_and_previews_without_storing() {
    let d = Daemon::start(Options::embedded()).await;
    for (body, field) in [
        (json!({"stream": "s"}), "content"),
        (json!({"content": "User: hi", "messages": []}), "content"),
        (json!({"content": "Assistant: hello there"}), "content"),
        (
            json!({"content": "User: I like tea", "extractor": "magic"}),
            "extractor",
        ),
        (
            json!({"content": "User: I like tea", "extractor": "llm"}),
            "extractor",
        ),
        (
            json!({"content": "User: I like tea", "conversation_date": "someday"}),
            "conversation_date",
        ),
    ] {
        let (status, resp) = d.call("POST", "/v1/ingest", Some(body.clone())).await;
        assert_eq!(status, 422, "{body} → {resp}");
        assert!(
            resp["detail"].as_str().unwrap().contains(field),
            "{body} → {resp}"
        );
    }
    let (status, resp) = d
        .call(
            "POST",
            "/v1/ingest",
            Some(json!({"content": "User: hi", "surprise": 1})),
        )
        .await;
    assert_eq!(status, 422, "{resp}");

    // `messages` work like a transcript; a dry run stores nothing.
    let (status, body) = d
        .call(
            "POST",
            "/v1/ingest",
            Some(json!({
                "messages": [
                    {"role": "user", "content": "What's a good tea?"},
                    {"role": "assistant", "content": "I'd recommend a Darjeeling first flush."},
                    {"role": "user", "content": "Sounds great. I'm allergic to bergamot, by the way."}
                ],
                "conversation_date": "2026-05-01",
                "stream": "s",
                "dry_run": true
            })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "dry_run");
    let facts = body["facts"].as_array().unwrap();
    assert!(
        facts.iter().any(
            |f| f["content"].as_str().unwrap().contains("bergamot") && f["status"] == "preview"
        ),
        "{body}"
    );
    // "Sounds great" took the assistant's suggestion: a decision in the user's name.
    let decision = fact(&body, "decision");
    assert!(
        decision["content"].as_str().unwrap().contains("Darjeeling"),
        "{decision}"
    );
    assert_eq!(decision["source"]["role"], "assistant");
    let rows = sql(&d, "SELECT count(*) AS n FROM chunks").await;
    assert_eq!(rows[0]["n"], 0);

    // A declined suggestion leaves no assistant fact; the user's own choice is stored.
    let (status, body) = d
        .call(
            "POST",
            "/v1/ingest",
            Some(json!({
                "content": "User: Which database should I use for time series?\nAssistant: I'd recommend TimescaleDB on top of Postgres.\nUser: No, I'd rather stay on plain Postgres.",
                "stream": "s"
            })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let facts = body["facts"].as_array().unwrap();
    assert_eq!(facts.len(), 1, "{body}");
    assert_eq!(facts[0]["memory_type"], "preference");
    assert_eq!(facts[0]["source"]["role"], "user");
    assert_eq!(facts[0]["status"], "stored");
    assert!(!facts[0]["content"]
        .as_str()
        .unwrap()
        .contains("TimescaleDB"));
}

fn valid_answer() -> String {
    json!({"facts": [
        {"content": "User prefers Cursor over VSCode", "memory_type": "preference", "subject": "user",
         "date": "2026-03-26", "confidence": 0.95, "quote": "I switched from VSCode to Cursor last week"},
        {"content": "Dashboard deadline is 2026-04-15", "memory_type": "project", "subject": "dashboard",
         "date": "2026-04-15", "confidence": 0.9, "quote": "the dashboard deadline is April 15th"}
    ]})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llm_extracts_when_configured_and_the_rules_take_over_on_bad_answers_and_past_the_cap()
{
    let llm = stub_llm().await;
    // 1000 prompt + 500 completion tokens at $2 / $8 per million = $0.006 a call.
    let d = Daemon::start(
        Options::embedded()
            .env("LOOMEM_LLM__BASE_URL", &llm.url)
            .env("LOOMEM_LLM__MODEL", "stub-chat-1")
            .env("LOOMEM_LLM__INPUT_COST_PER_MTOK", "2.0")
            .env("LOOMEM_LLM__OUTPUT_COST_PER_MTOK", "8.0")
            .env("LOOMEM_LLM__DAILY_COST_CAP_USD", "0.01")
            .env("LOOMEM_LLM__NER", "false")
            .env("LOOMEM_LLM__JUDGE_CONTRADICTIONS", "false"),
    )
    .await;
    let transcript = |stream: &str| {
        json!({
            "content": "User: I switched from VSCode to Cursor last week. Also, the dashboard deadline is April 15th.",
            "conversation_date": "2026-04-02",
            "stream": stream
        })
    };

    // A valid answer is stored as the LLM wrote it, with its cost.
    llm.answer("memory_facts", &valid_answer());
    let (status, body) = d.call("POST", "/v1/ingest", Some(transcript("s"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["extractor"], "llm", "{body}");
    assert_eq!(body["llm"]["model"], "stub-chat-1");
    assert_eq!(body["llm"]["prompt_tokens"], 1000);
    assert!((body["llm"]["cost_usd"].as_f64().unwrap() - 0.006).abs() < 1e-9);
    assert_eq!(
        fact(&body, "preference")["content"],
        "User prefers Cursor over VSCode"
    );
    assert_eq!(fact(&body, "project")["dates"][0]["date"], "2026-04-15");
    let request = llm.seen.lock().unwrap()[0].clone();
    assert_eq!(request["model"], "stub-chat-1");
    assert_eq!(request["response_format"]["type"], "json_schema");
    assert!(request["messages"][1]["content"]
        .as_str()
        .unwrap()
        .contains("Conversation date: 2026-04-02"));
    let rows = sql(
        &d,
        "SELECT content, extraction_meta FROM chunks WHERE memory_type = 'preference'",
    )
    .await;
    let meta: Value = serde_json::from_str(rows[0]["extraction_meta"].as_str().unwrap()).unwrap();
    assert_eq!(meta["ingest"]["extractor"], "llm");
    assert_eq!(meta["ingest"]["model"], "stub-chat-1");

    // Invalid JSON: the rules extract instead, and say why.
    llm.answer(
        "memory_facts",
        "Sure! Here are the facts: none of them are JSON",
    );
    let (status, body) = d.call("POST", "/v1/ingest", Some(transcript("s"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["extractor"], "rules", "{body}");
    assert!(
        body["fallback_reason"].as_str().unwrap().contains("JSON"),
        "{body}"
    );
    assert_eq!(body["facts"].as_array().unwrap().len(), 2);

    // An answer that breaks the schema is rejected the same way.
    llm.answer(
        "memory_facts",
        &json!({"facts": [{"content": "x", "memory_type": "gossip",
            "subject": "user", "date": null, "confidence": 2, "quote": ""}]})
        .to_string(),
    );
    // (Two calls so far cost $0.012: past the $0.01 cap, no third call is made.)
    let calls_before = llm.requests.load(Ordering::SeqCst);
    let (status, body) = d.call("POST", "/v1/ingest", Some(transcript("s"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["extractor"], "rules");
    assert!(
        body["fallback_reason"]
            .as_str()
            .unwrap()
            .contains("daily LLM budget"),
        "{body}"
    );
    assert_eq!(llm.requests.load(Ordering::SeqCst), calls_before);
    assert!(
        !body["facts"].as_array().unwrap().is_empty(),
        "ingestion goes on"
    );

    // The cap is per stream: another stream still gets the LLM, and a
    // schema-breaking answer falls back with the reason.
    let (_, body) = d.call("POST", "/v1/ingest", Some(transcript("t"))).await;
    assert_eq!(body["extractor"], "rules", "{body}");
    assert!(
        body["fallback_reason"]
            .as_str()
            .unwrap()
            .contains("memory_type"),
        "{body}"
    );

    // Every call is in llm_calls with its tokens and cost.
    let rows = sql(
        &d,
        "SELECT stream, purpose, status, prompt_tokens, completion_tokens, cost_usd FROM llm_calls ORDER BY created_at",
    )
    .await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(rows
        .iter()
        .all(|r| r["purpose"] == "ingest" && r["prompt_tokens"] == 1000));
    assert_eq!(rows[0]["status"], "ok");
    assert_eq!(rows[1]["status"], "error");
    assert_eq!(rows[2]["stream"], "t");
    let spent: f64 = rows
        .iter()
        .filter(|r| r["stream"] == "s")
        .map(|r| r["cost_usd"].as_f64().unwrap())
        .sum();
    assert!((spent - 0.012).abs() < 1e-9, "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_llm_new_memories_get_llm_entities_and_a_judge_for_silent_updates() {
    let llm = stub_llm().await;
    let d = Daemon::start(
        Options::default()
            .env("LOOMEM_LLM__BASE_URL", &llm.url)
            .env("LOOMEM_LLM__MODEL", "stub-chat-1")
            .env("LOOMEM_LLM__INPUT_COST_PER_MTOK", "1.0"),
    )
    .await;
    llm.answer(
        "memory_entities",
        &json!({"entities": [
            {"memory": 1, "name": "Beacon Hill", "type": "PLACE"},
            {"memory": 2, "name": "Beacon Hill", "type": "PLACE"},
            {"memory": 9, "name": "Nowhere", "type": "PLACE"}
        ]})
        .to_string(),
    );
    llm.answer(
        "contradiction_judgement",
        &json!({"superseded": [1], "reason": "the user moved"}).to_string(),
    );

    // No rule sees an update here: no cue, no shared entity, no slot.
    let (status, old) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "I live in Boston", "stream": "s", "created_at": "2026-01-01"})),
        )
        .await;
    assert_eq!(status, 200, "{old}");
    let (status, new) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "I live in Chicago", "stream": "s"})),
        )
        .await;
    assert_eq!(status, 200, "{new}");
    let (old_id, new_id) = (old["id"].as_str().unwrap(), new["id"].as_str().unwrap());

    // The judge saw the earlier memory and its verdict superseded it.
    let judged = llm.requests_for("contradiction_judgement");
    assert_eq!(
        judged.len(),
        1,
        "only the second memory has an earlier neighbour"
    );
    let prompt = judged[0]["messages"][1]["content"].as_str().unwrap();
    assert!(
        prompt.contains("I live in Chicago")
            && prompt.contains("[1]")
            && prompt.contains("I live in Boston"),
        "{prompt}"
    );
    let rows = sql(
        &d,
        &format!("SELECT id, superseded_by, version FROM chunks WHERE id = '{old_id}'"),
    )
    .await;
    assert_eq!(rows[0]["superseded_by"], new_id, "{rows:?}");
    let (_, history) = d
        .call("GET", &format!("/v1/memories/{new_id}/history"), None)
        .await;
    assert!(
        history.to_string().contains("LLM judge (the user moved)"),
        "{history}"
    );

    // The NER queue enriches committed memories in the background (one call
    // for both, or one each: memory numbers out of range are dropped).
    let mut rows = Vec::new();
    for _ in 0..100 {
        rows = sql(
            &d,
            "SELECT id, entities, extraction_meta FROM chunks WHERE array_has(entities, 'beaconhill') ORDER BY id",
        )
        .await;
        if rows.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rows.len(), 2, "{rows:?}");
    let meta: Value = serde_json::from_str(rows[0]["extraction_meta"].as_str().unwrap()).unwrap();
    assert_eq!(meta["llm_ner"]["model"], "stub-chat-1");
    assert!(
        !rows[0]["entities"].to_string().contains("nowhere"),
        "out-of-range entity dropped"
    );
    // The graph is written just after the chunks: wait for it too.
    let mut graph = Vec::new();
    for _ in 0..100 {
        graph = sql(
            &d,
            "SELECT name, entity_type FROM entities WHERE key = 'beaconhill'",
        )
        .await;
        if !graph.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(graph.len(), 1, "{graph:?}");
    assert_eq!(graph[0]["entity_type"], "PLACE");

    let (_, status) = d.call("GET", "/v1/status", None).await;
    assert_eq!(status["llm"]["configured"], true);
    assert_eq!(status["llm"]["ner"]["enriched"], 2, "{status}");

    // Every call is accounted for, by purpose.
    let calls = sql(
        &d,
        "SELECT purpose, count(*) AS n, sum(cost_usd) AS cost FROM llm_calls GROUP BY purpose ORDER BY purpose",
    )
    .await;
    assert_eq!(calls[0]["purpose"], "judge");
    assert_eq!(calls[0]["n"], 1);
    assert_eq!(calls[1]["purpose"], "ner");
    assert!(calls[1]["n"].as_i64().unwrap() >= 1);
    assert!(calls[1]["cost"].as_f64().unwrap() > 0.0, "{calls:?}");
}
