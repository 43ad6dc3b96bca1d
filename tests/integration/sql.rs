//! POST /v1/sql: read-only, stream-scoped SQL over the live Lance tables.

use std::time::Duration;

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, TOKEN_A};

/// A query with the given key (None = the admin key).
async fn sql_as(d: &Daemon, token: Option<&str>, body: Value) -> (u16, Value) {
    let token = token.unwrap_or(crate::fixture::ADMIN_TOKEN);
    d.call_as(Some(token), "POST", "/v1/sql", Some(body)).await
}

async fn rows(d: &Daemon, token: Option<&str>, sql: &str) -> Vec<Value> {
    let (s, body) = sql_as(d, token, json!({ "sql": sql })).await;
    assert_eq!(s, 200, "{sql}: {body}");
    body["rows"].as_array().unwrap().clone()
}

async fn seeded() -> Daemon {
    let d = Daemon::start(Options::with_auth()).await;
    for (content, stream) in [
        ("Alice prefers green tea", "a"),
        ("Alice uses Cursor daily", "a"),
        ("Bob's secret launch code is pelican", "b"),
        ("Bob uses Vim at Acme Labs", "b"),
        ("Bob prefers espresso", "b"),
    ] {
        d.store(content, stream).await;
    }
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_key_cannot_reach_another_streams_rows() {
    let d = seeded().await;
    let admin = rows(
        &d,
        None,
        "SELECT stream, count(*) AS n FROM chunks GROUP BY stream ORDER BY stream",
    )
    .await;
    assert_eq!(
        admin,
        vec![
            json!({"stream": "a", "n": 2}),
            json!({"stream": "b", "n": 3})
        ]
    );
    let a = Some(TOKEN_A);
    let queries = [
        "SELECT count(*) AS n FROM chunks",
        "SELECT count(*) AS n FROM chunks c JOIN entities e ON array_has(c.entities, e.key)",
        "SELECT count(*) AS n FROM chunks WHERE id IN (SELECT id FROM chunks WHERE stream = 'b')",
        "SELECT count(*) AS n FROM chunks_as_of(1)",
        "SELECT count(*) AS n FROM chunks_valid_at(2000000000)",
        "SELECT count(*) AS n FROM entities WHERE stream = 'b'",
        "SELECT count(*) AS n FROM edges WHERE stream <> 'a'",
        "SELECT count(*) AS n FROM (SELECT * FROM chunks UNION ALL SELECT * FROM chunks_as_of(2)) WHERE stream = 'b'",
    ];
    for q in queries {
        let r = rows(&d, a, q).await;
        let n = r[0]["n"].as_i64().unwrap();
        let contents = rows(&d, a, &q.replace("count(*) AS n", "*")).await;
        assert!(
            !contents
                .iter()
                .any(|row| row.get("stream") == Some(&json!("b"))),
            "{q} leaked stream b: {contents:?}"
        );
        if q.contains("'b'") || q.contains("<> 'a'") {
            assert_eq!(n, 0, "{q}");
        }
    }
    assert_eq!(
        rows(&d, a, "SELECT count(*) AS n FROM chunks").await[0]["n"],
        2
    );
    let (s, body) = sql_as(
        &d,
        a,
        json!({"sql": "SELECT * FROM information_schema.tables"}),
    )
    .await;
    assert_eq!(s, 400, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_form_is_refused() {
    let d = seeded().await;
    for q in [
        "INSERT INTO chunks (id) VALUES ('x')",
        "UPDATE chunks SET content = 'x'",
        "DELETE FROM chunks",
        "CREATE TABLE t AS SELECT * FROM chunks",
        "CREATE VIEW v AS SELECT * FROM chunks",
        "DROP TABLE chunks",
        "COPY chunks TO '/tmp/x.csv'",
        "SET datafusion.execution.batch_size = 1",
        "SELECT 1; DELETE FROM chunks",
        "TRUNCATE chunks",
    ] {
        let (s, body) = sql_as(&d, None, json!({ "sql": q })).await;
        assert_eq!(s, 400, "{q}: {body}");
        assert!(
            body["detail"].as_str().unwrap().starts_with("SQL:"),
            "{body}"
        );
    }
    assert_eq!(
        rows(&d, None, "SELECT count(*) AS n FROM chunks").await[0]["n"],
        5
    );
    let (s, body) = sql_as(&d, None, json!({"sql": "SELECT nope FROM chunks"})).await;
    assert_eq!(s, 400);
    assert!(
        body["detail"].as_str().unwrap().contains("nope"),
        "DataFusion's message: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn params_bind_and_max_rows_truncates() {
    let d = seeded().await;
    let (s, body) = sql_as(
        &d,
        None,
        json!({"sql": "SELECT content FROM chunks WHERE stream = $1 AND importance >= $2 ORDER BY content", "params": ["b", 0.0]}),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["row_count"], 3);
    assert_eq!(body["rows"][0]["content"], "Bob prefers espresso");
    let (_, body) = sql_as(
        &d,
        None,
        json!({"sql": "SELECT id FROM chunks", "max_rows": 2}),
    )
    .await;
    assert_eq!(body["row_count"], 2);
    assert_eq!(body["truncated"], true);
    let (s, body) = sql_as(&d, None, json!({"sql": "SELECT 1", "params": [{"x": 1}]})).await;
    assert_eq!(s, 422);
    assert!(
        body["detail"].as_str().unwrap().starts_with("params[0]"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_output_format_parses_back() {
    let d = seeded().await;
    let q = "SELECT stream, count(*) AS n FROM chunks GROUP BY stream ORDER BY stream";
    let fetch = |format: &'static str| {
        let d = &d;
        async move {
            let resp = d
                .http
                .post(format!("{}/v1/sql", d.url))
                .bearer_auth(crate::fixture::ADMIN_TOKEN)
                .json(&json!({"sql": q, "format": format}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 200, "{format}");
            let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
            (ct, resp.bytes().await.unwrap())
        }
    };
    let (ct, csv) = fetch("csv").await;
    assert_eq!(ct, "text/csv");
    assert_eq!(std::str::from_utf8(&csv).unwrap(), "stream,n\na,2\nb,3\n");

    let (ct, arrow) = fetch("arrow").await;
    assert_eq!(ct, "application/vnd.apache.arrow.stream");
    let reader = lancedb::datafusion::arrow::ipc::reader::StreamReader::try_new(
        std::io::Cursor::new(arrow.to_vec()),
        None,
    )
    .unwrap();
    let batches: Vec<_> = reader.map(Result::unwrap).collect();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
    assert_eq!(batches[0].schema().field(0).name(), "stream");

    let (_, pq) = fetch("parquet").await;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(pq)
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<_> = reader.map(Result::unwrap).collect();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 2);

    let (ct, js) = fetch("json").await;
    assert_eq!(ct, "application/json");
    let v: Value = serde_json::from_slice(&js).unwrap();
    assert_eq!(v["columns"], json!(["stream", "n"]));
    assert_eq!(v["rows"][1], json!({"stream": "b", "n": 3}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_travel_returns_the_older_state_and_validity() {
    let d = seeded().await;
    let (s, _) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "The office is in Krakow", "stream": "a", "id": "office"})),
        )
        .await;
    assert_eq!(s, 200);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let between = chrono::Utc::now().to_rfc3339();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (s, _) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "The office is in Warsaw", "stream": "a", "id": "office"})),
        )
        .await;
    assert_eq!(s, 200);
    let now = rows(&d, None, "SELECT content FROM chunks WHERE id = 'office'").await;
    assert_eq!(now, vec![json!({"content": "The office is in Warsaw"})]);
    let then = rows(
        &d,
        None,
        &format!("SELECT content FROM chunks_as_of('{between}') WHERE id = 'office'"),
    )
    .await;
    assert_eq!(then, vec![json!({"content": "The office is in Krakow"})]);
    let first = rows(&d, None, "SELECT count(*) AS n FROM chunks_as_of(1)").await;
    assert_eq!(first[0]["n"], 0, "version 1 is the empty table");

    // Bitemporal validity of a superseded fact.
    d.store("I use VS Code for work", "a").await;
    d.store("I switched to Cursor for work", "a").await;
    let cut = rows(
        &d,
        None,
        "SELECT valid_until FROM chunks WHERE content = 'I use VS Code for work'",
    )
    .await;
    assert!(cut[0]["valid_until"].is_string(), "{cut:?}");
    let later = rows(
        &d,
        None,
        "SELECT content FROM chunks_valid_at('2100-01-01') WHERE content LIKE '%for work'",
    )
    .await;
    assert_eq!(
        later,
        vec![json!({"content": "I switched to Cursor for work"})]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedding_column_is_hidden_unless_named() {
    let d = seeded().await;
    let (_, body) = sql_as(&d, None, json!({"sql": "SELECT * FROM chunks LIMIT 1"})).await;
    let cols: Vec<&str> = body["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(
        !cols.contains(&"embedding") && cols.contains(&"valid_from"),
        "{cols:?}"
    );
    let (s, body) = sql_as(
        &d,
        None,
        json!({"sql": "SELECT id, embedding FROM chunks LIMIT 1"}),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["rows"][0]["embedding"].as_array().unwrap().len(), 384);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_queries_a_data_dir_and_a_daemon() {
    let d = seeded().await;
    let url = d.url.clone();
    let data = d.data_dir.clone();
    let cli = |args: Vec<String>, data: std::path::PathBuf| {
        std::process::Command::new(env!("CARGO_BIN_EXE_loomem"))
            .arg("--config")
            .arg(crate::fixture::repo_root().join("config.toml"))
            .args(args)
            .env("LOOMEM_STORAGE__DATA_DIR", data)
            .env("LOOMEM_LOG", "error")
            .output()
            .unwrap()
    };
    let q = "SELECT stream, count(*) AS n FROM chunks GROUP BY stream ORDER BY stream".to_string();
    // Through the daemon, with a scoped key: only its stream.
    let out = cli(
        vec![
            "sql".into(),
            q.clone(),
            "--url".into(),
            url,
            "--token".into(),
            TOKEN_A.into(),
            "--format".into(),
            "csv".into(),
        ],
        data.clone(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "stream,n\na,2\n");
    let (_nats, _dir) = d.stop().await;
    // Directly against the data directory, as a table.
    let out = cli(vec!["sql".into(), q], data.clone());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(table.contains("| b      | 3 |"), "{table}");
    let out = cli(vec!["sql".into(), "DELETE FROM chunks".into()], data);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("read-only"));
}

/// Analysts load loomem's output with polars (the Python package; setup installs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_and_arrow_output_load_in_polars() {
    let d = seeded().await;
    let dir = tempfile::tempdir().unwrap();
    for (format, file, reader) in [
        ("parquet", "out.parquet", "read_parquet"),
        ("arrow", "out.arrows", "read_ipc_stream"),
    ] {
        let resp = d
            .http
            .post(format!("{}/v1/sql", d.url))
            .bearer_auth(crate::fixture::ADMIN_TOKEN)
            .json(&json!({"sql": "SELECT stream, content, importance, created_at FROM chunks ORDER BY content", "format": format}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let path = dir.path().join(file);
        std::fs::write(&path, resp.bytes().await.unwrap()).unwrap();
        let script = format!(
            "import polars as pl; df = pl.{reader}({:?}); print(df.height, ','.join(df.columns), df['stream'].to_list().count('b'), df.schema['created_at'])",
            path.display().to_string()
        );
        let out = std::process::Command::new("python3")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "polars failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            printed.starts_with("5 stream,content,importance,created_at 3 Datetime"),
            "{format}: {printed}"
        );
    }
}
