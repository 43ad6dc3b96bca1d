//! Reading and editing one memory (`GET`/`PATCH /v1/memories/{id}`), the job
//! schedule, and retrying a dead letter: the API the console is built on.

use serde_json::json;

use loomem::bus::{jetstream::message_id, Envelope};
use loomem::core::model::Chunk;

use crate::fixture::{Daemon, Options, TOKEN_A, TOKEN_B};
use crate::jetstream::{publish_raw, wait_status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_of_the_text_is_a_new_version_and_other_fields_change_in_place() {
    let d = Daemon::start(Options::with_auth()).await;
    let id = d.store("Alice lives in Lisbon", "a").await;

    let (s, m) = d
        .call_as(Some(TOKEN_A), "GET", &format!("/v1/memories/{id}"), None)
        .await;
    assert_eq!(s, 200, "{m}");
    assert_eq!(m["content"], "Alice lives in Lisbon");
    assert_eq!(m["stream"], "a");
    assert!(m.get("embedding").is_none(), "no vector in the view");
    assert_eq!(m["has_embedding"], true);
    assert!(m["created_at"].as_str().unwrap().ends_with('Z'));

    // Fields in place: one version, a history row naming them.
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "PATCH",
            &format!("/v1/memories/{id}"),
            Some(json!({"pinned": true, "tags": ["travel"], "importance": 3.0})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["status"], "updated");
    assert_eq!(r["id"], id);
    assert_eq!(r["changed"], json!(["tags", "importance", "pinned"]));
    let (_, m) = d.call("GET", &format!("/v1/memories/{id}"), None).await;
    assert_eq!(
        (
            m["pinned"].clone(),
            m["tags"].clone(),
            m["importance"].clone()
        ),
        (json!(true), json!(["travel"]), json!(3.0))
    );
    let (_, r) = d
        .call(
            "PATCH",
            &format!("/v1/memories/{id}"),
            Some(json!({"pinned": true})),
        )
        .await;
    assert_eq!(r["status"], "unchanged");

    // New text: a new version, embedded and searchable; the old one superseded.
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "PATCH",
            &format!("/v1/memories/{id}"),
            Some(json!({"content": "Alice lives in Porto", "reason": "she moved"})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["status"], "new_version");
    assert_eq!(r["supersedes"], id);
    let new = r["id"].as_str().unwrap().to_string();
    assert_ne!(new, id);
    let (_, m) = d.call("GET", &format!("/v1/memories/{new}"), None).await;
    assert_eq!(m["content"], "Alice lives in Porto");
    assert_eq!(m["version"], 2);
    assert_eq!(m["supersedes"], id);
    assert_eq!(m["pinned"], true, "the other fields carry over");
    assert_eq!(m["has_embedding"], true);
    assert!(
        m["entities"].as_array().unwrap().contains(&json!("porto")),
        "{m}"
    );
    let (_, old) = d.call("GET", &format!("/v1/memories/{id}"), None).await;
    assert_eq!(old["superseded_by"], new.as_str());
    assert!(old["valid_until"].is_string());
    assert_eq!(
        d.search_ids(json!({"query": "Alice lives", "stream": "a", "mode": "bm25"}))
            .await,
        vec![new.clone()],
        "search finds the current version only"
    );
    let (_, h) = d
        .call("GET", &format!("/v1/memories/{new}/history"), None)
        .await;
    let events: Vec<(String, String)> = h["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap().into(),
                e["reason"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert!(
        events.contains(&("edited".into(), "she moved".into())),
        "{events:?}"
    );
    assert!(
        events.contains(&("superseded".into(), "she moved".into())),
        "{events:?}"
    );
    assert_eq!(h["versions"].as_array().unwrap().len(), 2);

    // An old version is not edited; nor is an immutable memory.
    let (s, r) = d
        .call(
            "PATCH",
            &format!("/v1/memories/{id}"),
            Some(json!({"content": "x"})),
        )
        .await;
    assert_eq!(s, 409, "{r}");
    assert!(r["detail"].as_str().unwrap().contains(&new), "{r}");
    let (s, _) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"id": "rule-1", "content": "Never deploy on Fridays", "stream": "a", "immutable": true})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, r) = d
        .call(
            "PATCH",
            "/v1/memories/rule-1",
            Some(json!({"pinned": true})),
        )
        .await;
    assert_eq!(s, 409, "{r}");
    assert!(r["detail"].as_str().unwrap().contains("immutable"));

    // Bad input is a 422 naming the field; nothing changes.
    for (body, field) in [
        (json!({"importance": 11}), "importance"),
        (json!({"content": "  "}), "content"),
        (json!({"colour": "red"}), "colour"),
    ] {
        let (s, r) = d
            .call("PATCH", &format!("/v1/memories/{new}"), Some(body))
            .await;
        assert_eq!(s, 422, "{r}");
        assert!(r["detail"].as_str().unwrap().contains(field), "{r}");
    }
    let (_, m) = d.call("GET", &format!("/v1/memories/{new}"), None).await;
    assert_eq!(
        (m["content"].clone(), m["importance"].clone()),
        (json!("Alice lives in Porto"), json!(3.0))
    );

    // Another stream's key sees nothing, changes nothing.
    for method in ["GET", "PATCH"] {
        let body = (method == "PATCH").then(|| json!({"content": "hijacked"}));
        let (s, _) = d
            .call_as(Some(TOKEN_B), method, &format!("/v1/memories/{new}"), body)
            .await;
        assert_eq!(s, 404, "{method}");
    }
    let (_, m) = d.call("GET", &format!("/v1/memories/{new}"), None).await;
    assert_eq!(m["content"], "Alice lives in Porto");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_lists_every_job_for_the_admin_only() {
    let d = Daemon::start(Options::with_auth()).await;
    let (s, body) = d.call("GET", "/admin/jobs", None).await;
    assert_eq!(s, 200, "{body}");
    let names: Vec<&str> = body["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, loomem::jobs::JOB_NAMES);
    let decay = &body["jobs"][1];
    assert_eq!(decay["cron"], "0 30 3 * * *");
    assert!(
        decay["next_run"].as_str().unwrap().contains("T03:30:00"),
        "{decay}"
    );
    let (s, _) = d.call_as(Some(TOKEN_A), "GET", "/admin/jobs", None).await;
    assert_eq!(s, 403);
}

async fn retry(d: &Daemon, token: &str, letter: &str) -> (u16, serde_json::Value) {
    d.call_as(
        Some(token),
        "POST",
        &format!("/v1/dead-letters/{letter}/retry"),
        None,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_retried_once_its_cause_is_gone() {
    let d = Daemon::start(Options::with_auth().env("LOOMEM_BUS__MAX_DELIVER", "1")).await;
    // The id is in use in stream q, so a write of it to stream a fails.
    let (s, _) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"id": "taken", "content": "q's memory", "stream": "q"})),
        )
        .await;
    assert_eq!(s, 200);
    let env = Envelope {
        pipeline: "store".into(),
        chunk: Chunk::new(
            "taken".into(),
            "a".into(),
            "a's memory about kites".into(),
            1,
        ),
        notify: false,
        minted: false,
        resend: 0,
    };
    let payload = serde_json::to_vec(&env).unwrap();
    publish_raw(&d, "loomem.in.a", &message_id("taken", &payload), payload).await;
    publish_raw(&d, "loomem.in.a", "junk", b"{not an envelope".to_vec()).await;
    wait_status(&d, 30, "two dead letters", |st| st["dead_letters"] == 2).await;
    let dead = d
        .sql("SELECT id, stream FROM dead_letters ORDER BY stream NULLS LAST")
        .await;
    let (letter, junk) = (
        dead[0]["id"].as_str().unwrap(),
        dead[1]["id"].as_str().unwrap(),
    );
    assert_eq!(dead[0]["stream"], "a");

    // Another stream's key cannot see it; the undecodable one cannot be retried.
    let (s, _) = d
        .call_as(
            Some(TOKEN_B),
            "POST",
            &format!("/v1/dead-letters/{letter}/retry"),
            None,
        )
        .await;
    assert_eq!(s, 404);
    let (s, r) = d
        .call("POST", &format!("/v1/dead-letters/{junk}/retry"), None)
        .await;
    assert_eq!(s, 409, "{r}");

    // Still failing: one dead letter for it, with the new error.
    let (s, r) = retry(&d, TOKEN_A, letter).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["status"], "failed", "{r}");
    let again = wait_status(&d, 30, "the failure dead-lettered again", |st| {
        st["dead_letters"] == 2
    })
    .await;
    assert_eq!(again["dead_letters"], 2);
    let rows = d
        .sql("SELECT id FROM dead_letters WHERE stream = 'a'")
        .await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let letter = rows[0]["id"].as_str().unwrap().to_string();

    // The cause removed, the retry stores it and the dead letter is gone.
    let (s, _) = d.call("DELETE", "/api/memories/taken", None).await;
    assert_eq!(s, 200);
    let (s, r) = retry(&d, TOKEN_A, &letter).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["status"], "stored", "{r}");
    assert_eq!(r["id"], "taken");
    let (_, m) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/memories/taken", None)
        .await;
    assert_eq!(m["content"], "a's memory about kites");
    assert!(d
        .sql("SELECT id FROM dead_letters WHERE stream = 'a'")
        .await
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memories_are_listed_counted_and_paged_within_the_keys_streams() {
    let d = Daemon::start(Options::with_auth()).await;
    for i in 0..7 {
        let (s, body) = d
            .call(
                "POST",
                "/v1/store",
                Some(json!({
                    "content": format!("note {i} about the garden plan number {i}"),
                    "stream": "a",
                    "memory_type": if i % 2 == 0 { "decision" } else { "observation" },
                    "tags": if i < 3 { json!(["garden", "spring"]) } else { json!(["garden"]) },
                    "session_id": if i < 4 { "s1" } else { "s2" },
                    "agent_id": "planner",
                    "importance": i as f64,
                    "created_at": 1_700_000_000 + i * 3600,
                })),
            )
            .await;
        assert_eq!(s, 200, "{body}");
    }
    d.store("a memory of stream b about the garden", "b").await;

    let get = |q: String| {
        let d = &d;
        async move {
            let (s, body) = d
                .call_as(Some(TOKEN_A), "GET", &format!("/v1/memories{q}"), None)
                .await;
            assert_eq!(s, 200, "{q}: {body}");
            body
        }
    };
    let contents = |page: &serde_json::Value| -> Vec<String> {
        page["memories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect()
    };
    // Newest first by default; only the key's streams.
    let all = get(String::new()).await;
    assert_eq!(all["total"], 7, "{all}");
    assert!(contents(&all)[0].starts_with("note 6"), "{all}");
    assert!(all["memories"][0].get("embedding").is_none());
    // Filters.
    assert_eq!(get("?types=decision".into()).await["total"], 4);
    assert_eq!(get("?tags=spring".into()).await["total"], 3);
    assert_eq!(
        get("?tags=garden,spring&tags_mode=all".into()).await["total"],
        3
    );
    assert_eq!(
        get("?session_id=s2&agent_id=planner".into()).await["total"],
        3
    );
    assert_eq!(
        get("?created_after=1700007200&created_before=1700014400".into()).await["total"],
        2
    );
    let by_importance = get("?order=importance&limit=2".into()).await;
    assert_eq!(
        contents(&by_importance),
        vec![
            "note 6 about the garden plan number 6",
            "note 5 about the garden plan number 5"
        ]
    );
    // Cursor pages cover every memory once, in order.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let q = match &cursor {
            Some(c) => format!("?order=oldest&limit=3&cursor={c}"),
            None => "?order=oldest&limit=3".into(),
        };
        let page = get(q).await;
        seen.extend(contents(&page));
        cursor = page["next_cursor"].as_str().map(str::to_string);
        if cursor.is_none() {
            break;
        }
    }
    let expected: Vec<String> = (0..7)
        .map(|i| format!("note {i} about the garden plan number {i}"))
        .collect();
    assert_eq!(seen, expected);
    // Counts; another stream's memories are neither listed nor counted.
    let (_, c) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/memories/count?tags=garden", None)
        .await;
    assert_eq!(c["count"], 7);
    let (_, c) = d.call("GET", "/v1/memories/count?tags=garden", None).await;
    assert_eq!(c["count"], 7, "untagged b memory not counted: {c}");
    let (s, _) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/memories?stream=b", None)
        .await;
    assert_eq!(s, 403);
    // Bad input names the field.
    for (q, field) in [
        ("?order=random", "order"),
        ("?limit=0", "limit"),
        ("?cursor=xyz", "cursor"),
        ("?tags_mode=some", "tags_mode"),
    ] {
        let (s, body) = d
            .call_as(Some(TOKEN_A), "GET", &format!("/v1/memories{q}"), None)
            .await;
        assert_eq!(s, 422, "{q}: {body}");
        assert!(
            body["detail"].as_str().unwrap().starts_with(field),
            "{q}: {body}"
        );
    }
    let newest_cursor = get("?limit=1".into()).await["next_cursor"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, _) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!("/v1/memories?order=oldest&cursor={newest_cursor}"),
            None,
        )
        .await;
    assert_eq!(s, 422, "a cursor of another order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_sets_and_clears_expiry_validity_confidence_and_metadata() {
    let d = Daemon::start(Options::default()).await;
    let id = d.store("The office moves to the fourth floor", "e").await;
    let patch = |body: serde_json::Value| {
        let d = &d;
        let id = id.clone();
        async move {
            d.call("PATCH", &format!("/v1/memories/{id}"), Some(body))
                .await
        }
    };
    let (s, r) = patch(json!({
        "expires_at": "2999-01-01T00:00:00Z",
        "valid_from": "2026-03-01T00:00:00Z",
        "valid_until": "2026-09-01T00:00:00Z",
        "confidence": 0.6,
        "metadata": {"source": "memo"},
    }))
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["status"], "updated");
    let mut changed: Vec<&str> = r["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    changed.sort();
    assert_eq!(
        changed,
        [
            "confidence",
            "expires_at",
            "metadata",
            "valid_from",
            "valid_until"
        ]
    );
    let (_, m) = d.call("GET", &format!("/v1/memories/{id}"), None).await;
    assert_eq!(m["expires_at"], "2999-01-01T00:00:00Z", "{m}");
    assert_eq!(
        (m["valid_from"].as_str(), m["valid_until"].as_str()),
        (Some("2026-03-01T00:00:00Z"), Some("2026-09-01T00:00:00Z"))
    );
    assert_eq!(
        (
            m["confidence"].as_f64().map(|c| (c * 10.0).round()),
            m["metadata"].clone()
        ),
        (Some(6.0), json!({"source": "memo"}))
    );
    // The validity is what `valid_at` searches see.
    let hits = d
        .search_ids(json!({"query": "office fourth floor", "stream": "e", "valid_at": "2026-12-01T00:00:00Z"}))
        .await;
    assert!(!hits.contains(&id), "outside its validity: {hits:?}");

    // Null clears; absent leaves alone; a wrong order or value is a 422.
    let (s, r) = patch(json!({"expires_at": null, "valid_until": null})).await;
    assert_eq!(s, 200, "{r}");
    let (_, m) = d.call("GET", &format!("/v1/memories/{id}"), None).await;
    assert!(
        m["expires_at"].is_null() && m["valid_until"].is_null(),
        "{m}"
    );
    assert_eq!(m["valid_from"], "2026-03-01T00:00:00Z");
    for (body, field) in [
        (
            json!({"valid_until": "2026-01-01T00:00:00Z"}),
            "valid_until",
        ),
        (json!({"expires_at": "soon"}), "expires_at"),
        (json!({"confidence": 1.5}), "confidence"),
        (json!({"metadata": [1, 2]}), "metadata"),
    ] {
        let (s, e) = patch(body.clone()).await;
        assert_eq!(s, 422, "{body}: {e}");
        assert!(e["detail"].as_str().unwrap().contains(field), "{body}: {e}");
    }
    let (_, m2) = d.call("GET", &format!("/v1/memories/{id}"), None).await;
    assert_eq!(
        m2["valid_from"], m["valid_from"],
        "a refused edit changes nothing"
    );
}
