//! No path across streams, and input that cannot hurt stored data: ids of
//! another stream refused by import and restore, links that lead out of a
//! stream not followed, status scoped, JSON only as JSON, immutable memories
//! kept, deletes that reinstate the version before.

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, ADMIN_TOKEN, TOKEN_A};

/// The row of `id` as the admin sees it through SQL.
async fn row(d: &Daemon, id: &str) -> Value {
    let rows = d
        .sql(&format!(
            "SELECT id, stream, content FROM chunks WHERE id = '{id}'"
        ))
        .await;
    rows.into_iter().next().unwrap_or(Value::Null)
}

async fn lossless_export(d: &Daemon, token: &str) -> Vec<Value> {
    let resp = d
        .http
        .post(format!("{}/v1/export", d.url))
        .bearer_auth(token)
        .json(&json!({"format": "jsonl"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.text()
        .await
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A lossless export file of these lines, with the header's counts made to match.
fn export_file(header: &Value, rows: &[Value]) -> Vec<u8> {
    let mut header = header.clone();
    let mut counts = serde_json::Map::new();
    for r in rows {
        let t = r["table"].as_str().unwrap().to_string();
        let n = counts.get(&t).and_then(Value::as_u64).unwrap_or(0);
        counts.insert(t, json!(n + 1));
    }
    header["rows"] = Value::Object(counts);
    std::iter::once(&header)
        .chain(rows)
        .map(|v| format!("{v}\n"))
        .collect::<String>()
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_and_restore_refuse_ids_of_another_stream() {
    let d = Daemon::start(Options::with_auth()).await;
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"id": "b-secret", "content": "The launch code word is pelican", "stream": "b"})),
        )
        .await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("stored")),
        "{body}"
    );
    let a_own = {
        let (s, body) = d
            .call_as(
                Some(TOKEN_A),
                "POST",
                "/v1/store",
                Some(json!({"content": "Agent A keeps bees"})),
            )
            .await;
        assert_eq!(s, 200, "{body}");
        body["id"].as_str().unwrap().to_string()
    };
    let untouched = row(&d, "b-secret").await;
    assert_eq!(untouched["stream"], "b");

    // /v1/store under the id: refused, in words that do not say where it lives.
    let (s, body) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/store",
            Some(json!({"id": "b-secret", "content": "hijacked"})),
        )
        .await;
    assert_eq!(s, 409, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("already in use") && !detail.contains("stream"),
        "{detail}"
    );

    // A JSONL import line with that id: refused by line, the rest imported.
    let lines =
        "{\"content\":\"Agent A likes honey\"}\n{\"id\":\"b-secret\",\"content\":\"hijacked\"}\n";
    let (s, report) = d
        .send(
            Some(TOKEN_A),
            "POST",
            "/v1/import?format=jsonl",
            None,
            &[],
            lines.as_bytes().to_vec(),
        )
        .await;
    assert_eq!(s, 200, "{report}");
    assert_eq!(report["accepted"], 1, "{report}");
    assert_eq!(report["rejected"][0]["line"], 2, "{report}");
    assert!(
        report["rejected"][0]["error"]
            .as_str()
            .unwrap()
            .contains("already in use"),
        "{report}"
    );

    // A restore: a chunk row that takes b's id is refused by line; the rest is
    // restored.
    let export = lossless_export(&d, TOKEN_A).await;
    let header = export[0].clone();
    let template = export[1..]
        .iter()
        .find(|l| l["table"] == "chunks" && l["row"]["id"] == a_own.as_str())
        .expect("agent A's memory in its export")
        .clone();
    let mut stolen = template.clone();
    stolen["row"]["id"] = json!("b-secret");
    stolen["row"]["content"] = json!("hijacked by restore");
    let mut forged_link = template.clone();
    forged_link["row"]["id"] = json!("a-forged");
    forged_link["row"]["supersedes"] = json!("b-secret");
    forged_link["row"]["version"] = json!(2);
    let (s, report) = d
        .send(
            Some(TOKEN_A),
            "POST",
            "/v1/import?format=loomem-jsonl",
            None,
            &[],
            export_file(&header, &[template.clone(), stolen, forged_link]),
        )
        .await;
    assert_eq!(s, 200, "{report}");
    assert_eq!(report["accepted"], 2, "{report}");
    assert_eq!(report["rejected"][0]["line"], 3, "{report}");

    // An entity row of stream `a` whose id names b's entity: the file is refused.
    let entity = json!({"table": "entities", "row": {
        "id": "b/pelican", "stream": "a", "key": "pelican", "name": "pelican",
        "entity_type": "thing", "aliases": [], "chunk_ids": [], "chunk_count": 0,
        "first_seen": 0, "last_seen": 0}});
    let (s, body) = d
        .send(
            Some(TOKEN_A),
            "POST",
            "/v1/import?format=loomem-jsonl",
            None,
            &[],
            export_file(&header, &[template, entity]),
        )
        .await;
    assert_eq!(s, 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("a/pelican"),
        "{body}"
    );

    assert_eq!(row(&d, "b-secret").await, untouched, "b's memory changed");

    // The forged link does not lead the history into stream b.
    let (s, history) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/memories/a-forged/history", None)
        .await;
    assert_eq!(s, 200, "{history}");
    assert_eq!(
        history["versions"].as_array().unwrap().len(),
        1,
        "{history}"
    );
    assert!(!history.to_string().contains("pelican"), "{history}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_key_sees_no_daemon_wide_status() {
    let d = Daemon::start(Options::with_auth()).await;
    d.store("Admin memory in b", "b").await;
    let (s, admin) = d
        .call_as(Some(ADMIN_TOKEN), "GET", "/v1/status", None)
        .await;
    assert_eq!(s, 200);
    assert!(
        admin["pipelines"]
            .as_object()
            .is_some_and(|p| !p.is_empty()),
        "{admin}"
    );
    let (s, mine) = d.call_as(Some(TOKEN_A), "GET", "/v1/status", None).await;
    assert_eq!(s, 200);
    assert_eq!(mine["pipelines"], json!({}), "{mine}");
    assert_eq!(mine["llm"]["ner"], Value::Null, "{mine}");
    assert_eq!(mine["chunks"], 0, "{mine}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_routes_take_only_json_and_passthrough_only_local_hosts() {
    let d = Daemon::start(Options::with_auth()).await;
    let body = br#"{"query": "anything"}"#.to_vec();
    for ct in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let (s, resp) = d
            .send(
                Some(ADMIN_TOKEN),
                "POST",
                "/v1/search",
                ct,
                &[],
                body.clone(),
            )
            .await;
        assert_eq!(s, 415, "{ct:?}: {resp}");
        assert!(resp["detail"].as_str().is_some(), "{resp}");
    }
    let (s, resp) = d
        .send(
            Some(ADMIN_TOKEN),
            "POST",
            "/v1/search",
            Some("application/json; charset=utf-8"),
            &[],
            body.clone(),
        )
        .await;
    assert_eq!(s, 200, "{resp}");

    // Passthrough (no key): a page served from another name (DNS rebinding)
    // is refused; this machine's names are not.
    let open = Daemon::start(Options::default()).await;
    let (s, resp) = open
        .send(
            None,
            "GET",
            "/v1/whoami",
            None,
            &[("host", "evil.example:3030")],
            Vec::new(),
        )
        .await;
    assert_eq!(s, 403, "{resp}");
    let (s, resp) = open
        .send(
            None,
            "GET",
            "/v1/whoami",
            None,
            &[("host", "localhost:3030")],
            Vec::new(),
        )
        .await;
    assert_eq!(s, 200, "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immutable_memories_are_kept_and_duplicates_say_so() {
    let d = Daemon::start(Options::default()).await;
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"id": "rule-1", "content": "Never deploy on Fridays", "stream": "s", "immutable": true})),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"id": "rule-1", "content": "Deploy whenever", "stream": "s"})),
        )
        .await;
    assert_eq!(s, 409, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("immutable"),
        "{body}"
    );
    let (s, body) = d
        .call("POST", "/v1/delete", Some(json!({"id": "rule-1"})))
        .await;
    assert_eq!(s, 409, "{body}");
    let other = d.store("Tea at four", "s").await;
    let (s, purge) = d
        .call(
            "POST",
            "/v1/purge-namespace",
            Some(json!({"stream": "s", "dry_run": false, "confirmed": true})),
        )
        .await;
    assert_eq!(s, 200, "{purge}");
    assert_eq!(purge["deleted_ids"], json!([other]), "{purge}");
    assert_eq!(purge["kept_immutable"], json!(["rule-1"]), "{purge}");
    assert_eq!(
        row(&d, "rule-1").await["content"],
        "Never deploy on Fridays"
    );

    // The same text again is a duplicate of the stored memory, and says so.
    let first = d.store("The office plant is a fern", "s").await;
    let (s, again) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "The office plant is a fern", "stream": "s"})),
        )
        .await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["status"], "duplicate", "{again}");
    assert_eq!(again["duplicate_of"], first.as_str(), "{again}");
    assert_eq!(again["id"], first.as_str(), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_values_at_the_edges_get_422_not_a_dead_handler() {
    let d = Daemon::start(Options::default()).await;
    let (s, body) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "x", "now": "-262143-01-01", "time_filter": "this_week"})),
        )
        .await;
    assert_eq!(s, 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().starts_with("now:"),
        "{body}"
    );
    let (s, body) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "word ".repeat(2000)})),
        )
        .await;
    assert_eq!(s, 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("at most"),
        "{body}"
    );
    let (s, body) = d
        .call(
            "POST",
            "/v1/sql",
            Some(json!({"sql": "SELECT count(*) FROM chunks_as_of(9223372036854775807)"})),
        )
        .await;
    assert_eq!(s, 422, "{body}");
    // Past versions named even in a comment are opened: a query names a few.
    let many: Vec<String> = (1..=9).map(|v| format!("chunks_as_of({v})")).collect();
    let (s, body) = d
        .call(
            "POST",
            "/v1/sql",
            Some(json!({"sql": format!("SELECT 1 -- {}", many.join(" "))})),
        )
        .await;
    assert_eq!(s, 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("at most 8"),
        "{body}"
    );
    let (s, body) = d
        .call(
            "POST",
            "/v1/ingest",
            Some(json!({"stream": "s", "messages": [{"role": "user", "content": "O\u{212a}, I use Vim every day."}]})),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    // The daemon still answers.
    let (s, _) = d.call("GET", "/health", None).await;
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_newest_version_makes_the_one_before_current_again() {
    let d = Daemon::start(Options::default()).await;
    let old = d.store("I use VSCode for all my coding", "dev").await;
    let new = d.store("I switched to Cursor last week", "dev").await;
    let state = |id: String| {
        let d = &d;
        async move {
            d.sql(&format!(
                "SELECT superseded_by, valid_until FROM chunks WHERE id = '{id}'"
            ))
            .await
            .into_iter()
            .next()
            .unwrap()
        }
    };
    assert_eq!(state(old.clone()).await["superseded_by"], new.as_str());
    let (s, body) = d
        .call(
            "POST",
            "/v1/feedback",
            Some(json!({"chunk_id": new, "usefulness": 4})),
        )
        .await;
    assert_eq!(s, 201, "{body}");
    let traces = |id: String| {
        let d = &d;
        async move {
            let mut n = Vec::new();
            for q in [
                format!("SELECT count(*) AS n FROM history WHERE chunk_id = '{id}'"),
                format!("SELECT count(*) AS n FROM feedback WHERE chunk_id = '{id}'"),
                format!("SELECT count(*) AS n FROM entities WHERE array_has(chunk_ids, '{id}')"),
            ] {
                n.push(d.sql(&q).await[0]["n"].as_i64().unwrap());
            }
            n
        }
    };
    let before = traces(new.clone()).await;
    assert!(
        before[0] > 0 && before[1] == 1 && before[2] > 0,
        "{before:?}"
    );
    let (s, body) = d.call("POST", "/v1/delete", Some(json!({"id": new}))).await;
    assert_eq!(s, 200, "{body}");
    // Delete means gone: no history row, feedback or graph reference is left.
    assert_eq!(traces(new.clone()).await, vec![0, 0, 0]);
    let now = state(old.clone()).await;
    assert_eq!(now["superseded_by"], Value::Null, "{now}");
    assert_eq!(now["valid_until"], Value::Null, "{now}");
    let ids = d
        .search_ids(json!({"query": "coding editor VSCode", "stream": "dev"}))
        .await;
    assert_eq!(ids, vec![old.clone()]);
    let (_, h) = d
        .call("GET", &format!("/v1/memories/{old}/history"), None)
        .await;
    assert!(
        h["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event"] == "reinstated"),
        "{h}"
    );
}

/// Files under `dir` whose bytes contain `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if std::fs::read(&path)
                .unwrap_or_default()
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
            {
                found.push(path);
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_erases_a_memory_from_every_file_but_a_snapshots() {
    let d = Daemon::start(Options::with_auth()).await;
    let chunks = d.data_dir.join("chunks.lance");
    let (kept_word, gone_word) = ("Quaggaleaf", "Zyxomorph");
    let kept = d
        .store(&format!("The garden shed code is {kept_word} 4417"), "f")
        .await;
    let (s, r) = d
        .call("POST", "/v1/snapshots", Some(json!({"name": "snap"})))
        .await;
    assert_eq!(s, 201, "{r}");
    let gone = d
        .store(&format!("The bank vault phrase is {gone_word} 9921"), "f")
        .await;
    // Touched again, so earlier versions of the row exist too.
    let (s, r) = d.call("POST", "/v1/boost", Some(json!({"id": gone}))).await;
    assert_eq!(s, 200, "{r}");
    assert!(!files_holding(&chunks, gone_word).is_empty());

    // A plain delete leaves the text in the table's files.
    let (s, r) = d
        .call("POST", "/v1/delete", Some(json!({"id": gone})))
        .await;
    assert_eq!(s, 200, "{r}");
    assert!(r.get("forgotten").is_none(), "{r}");
    assert!(!files_holding(&chunks, gone_word).is_empty());

    // Only an admin may forget, and a refused forget deletes nothing.
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/store",
            Some(json!({"content": "Agent A's own note", "stream": "a"})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let mine = r["id"].as_str().unwrap().to_string();
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/delete",
            Some(json!({"id": mine, "forget": true})),
        )
        .await;
    assert_eq!(s, 403, "{r}");
    assert_eq!(row(&d, &mine).await["id"], json!(mine));

    // Forgetting the memory a snapshot holds erases everything else: the
    // earlier delete's leftovers too.
    let (s, r) = d
        .call(
            "POST",
            "/v1/delete",
            Some(json!({"id": kept, "forget": true})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["forgotten"]["still_in_snapshots"], json!(["snap"]), "{r}");
    assert!(
        r["forgotten"]["versions_removed"].as_u64().unwrap() > 0,
        "{r}"
    );
    assert_eq!(
        files_holding(&d.data_dir, gone_word),
        Vec::<std::path::PathBuf>::new()
    );
    assert!(
        !files_holding(&chunks, kept_word).is_empty(),
        "the snapshot keeps it"
    );
    // The snapshot is whole: rolling back brings the memory back.
    let (s, r) = d
        .call("POST", "/v1/snapshots/snap/rollback", Some(json!({})))
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(row(&d, &kept).await["id"], json!(kept));
    // Deleting the snapshot and forgetting again leaves nothing.
    let (s, r) = d.call("DELETE", "/v1/snapshots/snap", None).await;
    assert!(s == 200 || s == 204, "{s} {r}");
    let (s, r) = d
        .call(
            "POST",
            "/v1/delete",
            Some(json!({"id": kept, "forget": true})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["forgotten"]["still_in_snapshots"], json!([]), "{r}");
    assert_eq!(
        files_holding(&d.data_dir, kept_word),
        Vec::<std::path::PathBuf>::new()
    );
    assert_eq!(row(&d, &kept).await, Value::Null);
    // The tables work on after it.
    let after = d.store("Written after the forgetting", "f").await;
    assert_eq!(row(&d, &after).await["id"], json!(after));
    let ids = d
        .search_ids(json!({"query": "written after forgetting", "stream": "f"}))
        .await;
    assert_eq!(ids, vec![after]);
}
