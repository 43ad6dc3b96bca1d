//! Many memories at once (batch store, batch edit, bulk delete with its
//! snapshot), corrections by id and by query, and the stream, tag and
//! feedback summaries.

use std::time::Duration;

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, TOKEN_A, TOKEN_B};

fn statuses(answer: &Value) -> Vec<String> {
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_store_answers_each_item_and_stores_the_valid_ones() {
    let d = Daemon::start(Options::with_auth()).await;
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/memories/batch",
            Some(json!({"memories": [
                {"content": "Alice prefers tea over coffee", "tags": ["food"]},
                {"content": "The staging database runs Postgres 16", "stream": "a2"},
                {"content": "Into another agent's stream", "stream": "b"},
                {"content": "Alice prefers tea over coffee"},
                {"id": "batch-1", "content": "Chosen id"},
                {"id": "batch-1", "content": "The same id again"}
            ]})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        statuses(&r),
        [
            "stored",
            "stored",
            "forbidden",
            "duplicate",
            "stored",
            "conflict"
        ],
        "{r}"
    );
    let results = r["results"].as_array().unwrap();
    assert!(results[5]["error"].as_str().unwrap().contains("batch-1"));
    let first = results[0]["id"].as_str().unwrap();
    assert_eq!(results[3]["duplicate_of"], first);
    assert_eq!(
        r["counts"],
        json!({"stored": 3, "forbidden": 1, "duplicate": 1, "conflict": 1})
    );
    for (i, stream) in [(0, "a"), (1, "a2"), (4, "a")] {
        let id = results[i]["id"].as_str().unwrap();
        let (s, m) = d
            .call_as(Some(TOKEN_A), "GET", &format!("/v1/memories/{id}"), None)
            .await;
        assert_eq!((s, m["stream"].as_str().unwrap()), (200, stream), "{m}");
    }
    let (_, n) = d
        .call_as(Some(TOKEN_B), "GET", "/v1/memories/count", None)
        .await;
    assert_eq!(n["count"], 0, "nothing reached stream b");

    // Without waiting: accepted, then stored.
    let (s, r) = d
        .call_as(
            Some(TOKEN_B),
            "POST",
            "/v1/memories/batch",
            Some(json!({"wait": false, "memories": [
                {"content": "Bob plays the cello"},
                {"content": "Bob lives in Ghent"}
            ]})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(statuses(&r), ["accepted", "accepted"]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, n) = d
            .call_as(Some(TOKEN_B), "GET", "/v1/memories/count", None)
            .await;
        if n["count"] == 2 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never stored: {n}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A malformed item refuses the whole request, naming it; nothing is stored.
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({"content": format!("m{i}")}))
        .collect();
    for (body, names) in [
        (json!({"memories": many}), "memories"),
        (json!({"memories": []}), "memories"),
        (
            json!({"memories": [{"content": "x", "colour": "red"}]}),
            "colour",
        ),
        (
            json!({"memories": [{"content": "fine"}, {"content": "x", "importance": 20.0}]}),
            "memories[1].importance",
        ),
        (
            json!({"memories": [{"content": "fine"}, {"content": "x", "wait": true}]}),
            "memories[1].wait",
        ),
        (
            json!({"memories": [{"content": "fine"}, {"content": "x", "valid_from": "someday"}]}),
            "memories[1].valid_from",
        ),
    ] {
        let (s, r) = d.call("POST", "/v1/memories/batch", Some(body)).await;
        assert_eq!(s, 422, "{r}");
        assert!(r["detail"].as_str().unwrap().contains(names), "{r}");
    }
    let (_, all) = d.call("GET", "/v1/memories/count", None).await;
    assert_eq!(all["count"], 5, "only the first batches' memories: {all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_edit_answers_each_item() {
    let d = Daemon::start(Options::with_auth()).await;
    let one = d.store("Carol works at Initech", "a").await;
    let two = d.store("Carol drives a blue car", "a").await;
    let theirs = d.store("Bob keeps bees", "b").await;
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "PATCH",
            "/v1/memories/batch",
            Some(json!({"updates": [
                {"id": one, "pinned": true, "tags": ["work"]},
                {"id": two, "content": "Carol drives a red car", "reason": "repainted"},
                {"id": theirs, "pinned": true},
                {"id": "no-such-memory", "pinned": true},
                {"id": one, "importance": 4.0}
            ]})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        statuses(&r),
        [
            "updated",
            "new_version",
            "not_found",
            "not_found",
            "conflict"
        ],
        "{r}"
    );
    let (_, m) = d.call("GET", &format!("/v1/memories/{one}"), None).await;
    assert_eq!(
        (m["pinned"].clone(), m["tags"].clone()),
        (json!(true), json!(["work"]))
    );
    let new = r["results"][1]["id"].as_str().unwrap();
    let (_, m) = d.call("GET", &format!("/v1/memories/{new}"), None).await;
    assert_eq!(m["content"], "Carol drives a red car");
    assert_eq!(m["supersedes"], two.as_str());
    let (_, m) = d.call("GET", &format!("/v1/memories/{theirs}"), None).await;
    assert_eq!(m["pinned"], false, "another stream's memory is untouched");

    for (updates, names) in [
        (json!([{"id": one, "colour": "red"}]), "colour"),
        (
            json!([{"id": one, "pinned": false}, {"id": two, "importance": 50.0}]),
            "updates[1].importance",
        ),
        (json!([{"id": "", "pinned": false}]), "updates[0].id"),
    ] {
        let (s, r) = d
            .call(
                "PATCH",
                "/v1/memories/batch",
                Some(json!({"updates": updates})),
            )
            .await;
        assert_eq!(s, 422, "{r}");
        assert!(r["detail"].as_str().unwrap().contains(names), "{r}");
    }
    let (_, m) = d.call("GET", &format!("/v1/memories/{one}"), None).await;
    assert_eq!(m["pinned"], true, "a refused batch changes nothing");
    let (s, _) = d
        .call(
            "PATCH",
            "/v1/memories/batch",
            Some(json!({"updates": [{"pinned": true}]})),
        )
        .await;
    assert_eq!(s, 422, "an item without its id");
}

async fn snapshots(d: &Daemon) -> Vec<String> {
    let (s, r) = d.call("GET", "/v1/snapshots", None).await;
    assert_eq!(s, 200, "{r}");
    r["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_delete_snapshots_first_records_why_and_rolls_back() {
    let d =
        Daemon::start(Options::with_auth().env("LOOMEM_STORAGE__PRE_DELETE_SNAPSHOTS", "2")).await;
    let mut old = Vec::new();
    for i in 0..4 {
        let (s, r) = d
            .call_as(
                Some(TOKEN_A),
                "POST",
                "/v1/store",
                Some(json!({"content": format!("Scratch note number {i} about the sprint"), "tags": ["scratch"]})),
            )
            .await;
        assert_eq!(s, 200, "{r}");
        old.push(r["id"].as_str().unwrap().to_string());
    }
    let keep = d.store("Dana's birthday is on May 3", "a").await;
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/store",
            Some(json!({"content": "Scratch rule that must stay", "tags": ["scratch"], "immutable": true})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let fixed = r["id"].as_str().unwrap().to_string();
    let theirs = d.store("Bob's scratch pad", "b").await;

    // A dry run names what would go and changes nothing.
    let by_tag = json!({"filter": {"tags": "scratch"}, "dry_run": true});
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/memories/bulk-delete",
            Some(by_tag),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let mut expected = old.clone();
    expected.sort();
    assert_eq!(r["deleted_ids"], json!(expected));
    assert_eq!(r["kept_immutable"], json!([fixed]));
    assert!(r.get("snapshot").is_none());
    let before = snapshots(&d).await;
    assert!(before.is_empty(), "{before:?}");

    // Deleting by filter alone needs `confirmed`; page fields are no filter.
    for (body, field) in [
        (json!({"filter": {"tags": "scratch"}}), "confirmed"),
        (
            json!({"filter": {"tags": "scratch", "limit": 2}, "confirmed": true}),
            "filter.limit",
        ),
        (json!({}), "ids"),
        (json!({"ids": [""]}), "ids"),
    ] {
        let (s, r) = d
            .call_as(
                Some(TOKEN_A),
                "POST",
                "/v1/memories/bulk-delete",
                Some(body),
            )
            .await;
        assert_eq!(s, 422, "{r}");
        assert!(r["detail"].as_str().unwrap().contains(field), "{r}");
    }

    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/memories/bulk-delete",
            Some(
                json!({"filter": {"tags": "scratch"}, "confirmed": true, "reason": "sprint over"}),
            ),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["deleted_count"], 4);
    let snapshot = r["snapshot"].as_str().unwrap().to_string();
    assert!(snapshot.starts_with("pre-delete-"), "{snapshot}");
    for id in &old {
        let (s, _) = d.call("GET", &format!("/v1/memories/{id}"), None).await;
        assert_eq!(s, 404, "{id} is gone");
    }
    for id in [&keep, &fixed, &theirs] {
        let (s, _) = d.call("GET", &format!("/v1/memories/{id}"), None).await;
        assert_eq!(s, 200, "{id} stays");
    }
    let rows = d
        .sql(&format!(
            "SELECT event, reason FROM history WHERE chunk_id = '{}'",
            old[0]
        ))
        .await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["event"], "deleted");
    assert_eq!(
        rows[0]["reason"],
        format!("sprint over (snapshot {snapshot})")
    );

    // By ids: what the key cannot see is not found, and b keeps its memory.
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/memories/bulk-delete",
            Some(json!({"ids": [keep, theirs, "no-such-id"]})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["deleted_ids"], json!([keep]));
    let mut missing = vec![theirs.clone(), "no-such-id".to_string()];
    missing.sort();
    assert_eq!(r["not_found"], json!(missing));
    let (s, _) = d.call("GET", &format!("/v1/memories/{theirs}"), None).await;
    assert_eq!(s, 200);

    // Deleting the newest version makes the one before it current again.
    let v1 = d.store("Erin lives in Oslo", "a").await;
    let (_, e) = d
        .call(
            "PATCH",
            &format!("/v1/memories/{v1}"),
            Some(json!({"content": "Erin lives in Bergen"})),
        )
        .await;
    let v2 = e["id"].as_str().unwrap().to_string();
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/memories/bulk-delete",
            Some(json!({"ids": [v2]})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let (_, m) = d.call("GET", &format!("/v1/memories/{v1}"), None).await;
    assert!(m["superseded_by"].is_null(), "{m}");

    // Three bulk deletes, two pre-delete snapshots kept: the newest.
    let names = snapshots(&d).await;
    let pre: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("pre-delete-"))
        .collect();
    assert_eq!(pre.len(), 2, "{names:?}");
    assert!(!names.contains(&snapshot), "the oldest went: {names:?}");

    // Rolling the newest back brings the last deleted version back.
    let last = pre[1].clone();
    let (s, r) = d
        .call("POST", &format!("/v1/snapshots/{last}/rollback"), None)
        .await;
    assert_eq!(s, 200, "{r}");
    let (s, m) = d.call("GET", &format!("/v1/memories/{v2}"), None).await;
    assert_eq!(
        (s, m["content"].as_str()),
        (200, Some("Erin lives in Bergen"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrections_by_id_and_by_query_make_new_versions() {
    let d = Daemon::start(Options::with_auth()).await;
    let wrong = d.store("Frank's flight to Rome leaves at 9 am", "a").await;
    d.store("Frank likes window seats", "a").await;
    d.store("Frank's flight to Rome leaves at 7 am", "b").await;

    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/memories/correct",
            Some(json!({"query": "when does the flight to Rome leave", "new_content": "Frank's flight to Rome leaves at 11 am", "dry_run": true})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["matched_memory_id"], wrong.as_str());
    assert_eq!(r["status"], "dry_run");
    assert!(r["score"].as_f64().unwrap() > 0.0);
    let (_, m) = d.call("GET", &format!("/v1/memories/{wrong}"), None).await;
    assert!(m["superseded_by"].is_null(), "a dry run changes nothing");

    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/memories/correct",
            Some(json!({"query": "when does the flight to Rome leave", "new_content": "Frank's flight to Rome leaves at 11 am", "reason": "rebooked"})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["status"], "new_version");
    let fixed = r["id"].as_str().unwrap().to_string();
    let (_, h) = d
        .call("GET", &format!("/v1/memories/{fixed}/history"), None)
        .await;
    assert_eq!(h["versions"].as_array().unwrap().len(), 2, "{h}");
    assert!(h.to_string().contains("rebooked"), "{h}");

    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "PUT",
            &format!("/v1/memories/{fixed}/correct"),
            Some(json!({"new_content": "Frank's flight to Rome leaves at noon"})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["matched_memory_id"], fixed.as_str());
    let (_, m) = d
        .call(
            "GET",
            &format!("/v1/memories/{}", r["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(m["content"], "Frank's flight to Rome leaves at noon");
    assert_eq!(m["version"], 3);

    // A stream with nothing like it: 404; an empty correction: 422.
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/memories/correct",
            Some(json!({"query": "anything", "new_content": "x", "stream": "a2"})),
        )
        .await;
    assert_eq!(s, 404, "{r}");
    let (s, _) = d
        .call_as(
            Some(TOKEN_A),
            "PUT",
            &format!("/v1/memories/{fixed}/correct"),
            Some(json!({"new_content": "  "})),
        )
        .await;
    assert_eq!(s, 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_tags_and_feedback_add_up_within_the_keys_streams() {
    let d = Daemon::start(Options::with_auth()).await;
    for (text, tags, stream) in [
        ("Gina codes in Rust", json!(["tech", "lang"]), "a"),
        ("Gina reviews on Fridays", json!(["tech"]), "a"),
        ("Gina's cat is called Miso", json!(["pets"]), "a2"),
        ("Bob's secret tag", json!(["bobonly"]), "b"),
    ] {
        let (s, r) = d
            .call(
                "POST",
                "/v1/store",
                Some(json!({"content": text, "tags": tags, "stream": stream})),
            )
            .await;
        assert_eq!(s, 200, "{r}");
    }
    let (s, r) = d.call_as(Some(TOKEN_A), "GET", "/v1/streams", None).await;
    assert_eq!(s, 200, "{r}");
    let got: Vec<(String, u64)> = r["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["stream"].as_str().unwrap().to_string(),
                s["memories"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, [("a".to_string(), 2), ("a2".to_string(), 1)]);
    assert!(r["streams"][0]["last_write"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    let (_, all) = d.call("GET", "/v1/streams", None).await;
    assert_eq!(all["streams"].as_array().unwrap().len(), 3, "{all}");

    let (s, r) = d.call_as(Some(TOKEN_A), "GET", "/v1/tags", None).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        r["tags"],
        json!([{"tag": "tech", "count": 2}, {"tag": "lang", "count": 1}, {"tag": "pets", "count": 1}])
    );
    let (_, r) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/tags?stream=a2", None)
        .await;
    assert_eq!(r["tags"], json!([{"tag": "pets", "count": 1}]));

    let ids = d
        .search_ids(json!({"query": "Gina codes in Rust", "stream": "a"}))
        .await;
    let rust = &ids[0];
    for (usefulness, harmful) in [(4, false), (3, false), (0, true)] {
        let (s, r) = d
            .call_as(
                Some(TOKEN_A),
                "POST",
                "/v1/feedback",
                Some(json!({"chunk_id": rust, "usefulness": usefulness, "harmful": harmful})),
            )
            .await;
        assert_eq!(s, 201, "{r}");
    }
    let (s, r) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/feedback/stats", None)
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["signals"], 3);
    assert_eq!(r["harmful"], 1);
    assert_eq!(r["by_usefulness"], json!([1, 0, 0, 1, 1]));
    assert_eq!(r["memories_rated"], 1);
    assert_eq!(r["most_harmful"][0]["chunk_id"], rust.as_str());
    let (_, r) = d
        .call_as(Some(TOKEN_B), "GET", "/v1/feedback/stats", None)
        .await;
    assert_eq!(r["signals"], 0, "B sees none of A's feedback: {r}");
    let (s, _) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/feedback/stats?top=500", None)
        .await;
    assert_eq!(s, 422);
}
