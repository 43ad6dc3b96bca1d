//! The maintenance endpoints: boost, retag-all, score-all, reset-importance,
//! reset-backfill, build-graph and extract-entities, each scoped to the
//! caller's streams.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, TOKEN_A};
use crate::llm_stub::stub_llm;

async fn row(d: &Daemon, id: &str, columns: &str) -> Value {
    d.sql(&format!("SELECT {columns} FROM chunks WHERE id = '{id}'"))
        .await
        .swap_remove(0)
}

fn meta(row: &Value) -> Value {
    serde_json::from_str(row["extraction_meta"].as_str().unwrap_or("{}")).unwrap()
}

/// Restore one memory row as given (no pipeline runs on a restore).
async fn restore_raw(
    d: &Daemon,
    id: &str,
    stream: &str,
    content: &str,
    extraction_meta: Option<&str>,
) {
    let chunk = json!({
        "id": id, "stream": stream, "level": 0, "content": content,
        "content_hash": "raw", "memory_type": "general", "tags": [], "entities": [],
        "extraction_meta": extraction_meta,
        "importance": 1.0, "confidence": 1.0, "surprise": 0.0, "pinned": false,
        "immutable": false, "created_at": 1_767_225_600_000_000i64,
        "updated_at": 1_767_225_600_000_000i64, "version": 1, "access_count": 0,
    });
    let file = format!(
        "{}\n{}\n",
        json!({"loomem_export": 1}),
        json!({"table": "chunks", "row": chunk})
    );
    let resp = d
        .http
        .post(format!("{}/v1/import?format=loomem-jsonl", d.url))
        .body(file)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boost_and_reset_importance() {
    let d = Daemon::start(Options::with_auth().env("LOOMEM_SEARCH__ACCESS_FLUSH_MS", "100")).await;
    let id = d.store("The quarterly report is due on Friday", "a").await;
    let scored = row(&d, &id, "importance, extraction_meta").await;
    let scored_importance = meta(&scored)["surprise"]["importance"].as_f64().unwrap();

    let (s, b) = d.call("POST", "/v1/boost", Some(json!({"id": id}))).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["importance"], 1.5);
    assert_eq!(row(&d, &id, "importance").await["importance"], 1.5);
    let (_, history) = d
        .call("GET", &format!("/v1/memories/{id}/history"), None)
        .await;
    assert!(history.to_string().contains("boosted"), "{history}");
    // Another caller's memory, or none at all: not found.
    let other = d.store("Admin-only note", "zz").await;
    let (s, _) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/boost",
            Some(json!({"id": other})),
        )
        .await;
    assert_eq!(s, 404);
    let (s, _) = d.call("POST", "/v1/boost", Some(json!({"id": ""}))).await;
    assert_eq!(s, 422);

    // Accesses build up an implicit boost...
    let (s, _) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "quarterly report", "stream": "a"})),
        )
        .await;
    assert_eq!(s, 200);
    let started = Instant::now();
    while row(&d, &id, "access_count").await["access_count"] == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "access never counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ...and reset-importance clears it, within the caller's streams only.
    let (s, r) = d
        .call_as(Some(TOKEN_A), "POST", "/v1/reset-importance", None)
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["processed"], 1, "{r}");
    let after = row(
        &d,
        &id,
        "importance, access_count, last_accessed_at, extraction_meta",
    )
    .await;
    assert_eq!(after["access_count"], 0, "{after}");
    assert_eq!(after["last_accessed_at"], Value::Null, "{after}");
    assert!(
        (after["importance"].as_f64().unwrap() - scored_importance).abs() < 1e-6,
        "{after}"
    );
    assert!(meta(&after).get("boost").is_none(), "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retag_build_graph_and_score_redo_their_stages() {
    let d = Daemon::start(Options::default()).await;
    restore_raw(
        &d,
        "raw-1",
        "g",
        "Alice joined Project Orion in Berlin",
        None,
    )
    .await;
    assert_eq!(row(&d, "raw-1", "entities").await["entities"], json!([]));
    let (s, missing) = d
        .call("GET", "/v1/graph/entity/Berlin?stream=g", None)
        .await;
    assert_eq!(s, 404, "{missing}");

    let (s, r) = d
        .call("POST", "/v1/retag-all", Some(json!({"stream": "g"})))
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        (r["processed"].as_u64(), r["updated"].as_u64()),
        (Some(1), Some(1)),
        "{r}"
    );
    let entities = row(&d, "raw-1", "entities").await["entities"].clone();
    for key in ["berlin", "orion"] {
        assert!(
            entities.as_array().unwrap().contains(&json!(key)),
            "{entities}"
        );
    }

    // build-graph drops the stream's graph and rebuilds it from the memories.
    let (s, r) = d
        .call("POST", "/v1/build-graph", Some(json!({"stream": "g"})))
        .await;
    assert_eq!(s, 200, "{r}");
    assert!(r["entities"].as_u64().unwrap() >= 2, "{r}");
    let (s, berlin) = d
        .call("GET", "/v1/graph/entity/Berlin?stream=g", None)
        .await;
    assert_eq!(s, 200, "{berlin}");
    assert_eq!(berlin["chunk_ids"], json!(["raw-1"]), "{berlin}");
    let (_, again) = d
        .call("POST", "/v1/build-graph", Some(json!({"stream": "g"})))
        .await;
    assert_eq!(
        again["entities"], r["entities"],
        "a rebuild is not additive: {again}"
    );

    // score-all starts from the pre-surprise importance: rerunning it changes nothing.
    let a = d.store("Tea is my favourite drink", "t").await;
    d.store("Tea is my favourite drink in the morning", "t")
        .await;
    let (s, first) = d
        .call("POST", "/v1/score-all", Some(json!({"stream": "t"})))
        .await;
    assert_eq!(s, 200, "{first}");
    assert_eq!(first["processed"], 2, "{first}");
    let once = row(&d, &a, "importance, surprise").await;
    let (_, second) = d
        .call("POST", "/v1/score-all", Some(json!({"stream": "t"})))
        .await;
    assert_eq!(second["updated"], 0, "{second}");
    assert_eq!(row(&d, &a, "importance, surprise").await, once);
    // Against its near twin the first memory is no longer novel.
    assert!(once["surprise"].as_f64().unwrap() < 0.5, "{once}");

    let (s, bad) = d
        .call("POST", "/v1/retag-all", Some(json!({"streams": "t"})))
        .await;
    assert_eq!(s, 422, "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extract_entities_queues_the_llm_and_reset_backfill_clears_its_marks() {
    let plain = Daemon::start(Options::default()).await;
    let (s, body) = plain.call("POST", "/v1/extract-entities", None).await;
    assert_eq!(s, 409, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("[llm]"), "{body}");

    let llm = stub_llm().await;
    llm.answer(
        "memory_entities",
        &json!({"entities": [{"memory": 1, "name": "Zephyr Labs", "type": "ORGANIZATION"}]})
            .to_string(),
    );
    let d = Daemon::start(
        Options::default()
            .env("LOOMEM_LLM__BASE_URL", &llm.url)
            .env("LOOMEM_LLM__MODEL", "stub-chat-1"),
    )
    .await;
    restore_raw(
        &d,
        "done-1",
        "n",
        "Worked at Zephyr Labs",
        Some(r#"{"llm_ner":{"model":"old"}}"#),
    )
    .await;
    let (s, r) = d
        .call("POST", "/v1/reset-backfill", Some(json!({"stream": "n"})))
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["updated"], 1, "{r}");
    assert!(meta(&row(&d, "done-1", "extraction_meta").await)
        .get("llm_ner")
        .is_none());

    let (s, q) = d
        .call("POST", "/v1/extract-entities", Some(json!({"stream": "n"})))
        .await;
    assert_eq!(s, 202, "{q}");
    assert_eq!(q["queued"], 1, "{q}");
    let started = Instant::now();
    loop {
        let r = row(&d, "done-1", "entities, extraction_meta").await;
        if meta(&r).get("llm_ner").is_some() {
            assert!(
                r["entities"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("zephyrlabs")),
                "{r}"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never enriched: {r}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A made-up name per number ("Zorab", "Zorac", ...): one entity per memory.
fn name_of(mut i: usize) -> String {
    let mut name = String::from("Zor");
    loop {
        name.push((b'a' + (i % 26) as u8) as char);
        i /= 26;
        if i == 0 {
            break name;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_graph_does_not_hold_other_writes_back() {
    const N: usize = 3000;
    let d = Daemon::start(Options::default()).await;
    let lines: Vec<String> = (0..N)
        .map(|i| {
            let (a, b) = (name_of(i), name_of(i * 7919 + 13));
            json!({ "content": format!("{a} and {b} met at {}", name_of(i * 31 + 7)) }).to_string()
        })
        .collect();
    let (s, r) = d
        .post_raw(
            "/v1/import?format=jsonl&stream=big",
            lines.join("\n").into_bytes(),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let entities = || async {
        d.sql("SELECT count(*) AS n FROM entities WHERE stream = 'big'")
            .await[0]["n"]
            .as_u64()
            .unwrap()
    };
    // Every line through the import pipeline: written or dropped.
    let settled = |st: &Value| {
        let Some(stages) = st["pipelines"]["import"].as_array() else {
            return 0;
        };
        let written = stages
            .iter()
            .find(|s| s["stage"] == "write")
            .and_then(|w| w["records_out"].as_u64())
            .unwrap_or(0);
        let dropped: u64 = stages
            .iter()
            .flat_map(|s| s["dropped"].as_object().into_iter().flatten())
            .filter_map(|(_, n)| n.as_u64())
            .sum();
        written + dropped
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (_, st) = d.call("GET", "/v1/status", None).await;
        if settled(&st) >= N as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "the import never settled: {st}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(entities().await >= N as u64);
    // The graph as a rebuild makes it (a dropped near-duplicate's names go).
    let (s, r) = d
        .call("POST", "/v1/build-graph", Some(json!({"stream": "big"})))
        .await;
    assert_eq!(s, 200, "{r}");
    let before = entities().await;

    // While the graph is being rebuilt (rows dropped, not all back yet), a
    // store into another stream is written.
    let rebuild = d.call("POST", "/v1/build-graph", Some(json!({"stream": "big"})));
    tokio::pin!(rebuild);
    let store = async {
        while entities().await >= before {}
        d.store("Bought oat milk and sourdough bread", "other")
            .await
    };
    let stored = tokio::select! {
        (s, r) = &mut rebuild => panic!("the rebuild ended ({s} {r}) before the store was written"),
        id = store => id,
    };
    let (s, r) = rebuild.await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(entities().await, before, "{r}");
    let rows = d
        .sql(&format!("SELECT stream FROM chunks WHERE id = '{stored}'"))
        .await;
    assert_eq!(rows, vec![json!({"stream": "other"})]);
}
