//! Exports and the lossless round trip: export → import into an empty data
//! directory gives identical rows, through a daemon and directly on data
//! directories; query exports in every format; the scheduled export job;
//! bad restores write nothing; a scoped key exports only its streams.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::fixture::{daemon_env, Daemon, Options, TOKEN_A};

/// Run the `loomem` binary; (success, stdout, stderr).
async fn loomem(args: &[&str], config: Option<(&Path, &Path)>) -> (bool, String, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_loomem"));
    if let Some((data_dir, _)) = config {
        let (config, env) = daemon_env(data_dir, None, &Options::embedded());
        cmd.arg("--config").arg(config).envs(env);
    }
    let out = cmd
        .args(args)
        .env("LOOMEM_LOG", "warn")
        .env_remove("LOOMEM_AUTH_TOKEN")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The rows of a lossless export, without its header (which carries the time).
fn rows_of(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(header["loomem_export"], 1, "{header}");
    lines.map(str::to_string).collect()
}

/// Every table of the lossless form, every column (embeddings included).
async fn snapshot(d: &Daemon) -> Vec<Vec<Value>> {
    let mut all = Vec::new();
    for q in [
        // Naming `embedding` makes `*` include it.
        "SELECT * FROM chunks WHERE embedding IS NULL OR embedding IS NOT NULL ORDER BY id",
        "SELECT * FROM entities ORDER BY id",
        "SELECT * FROM edges ORDER BY id",
        "SELECT * FROM history ORDER BY id",
        "SELECT * FROM feedback ORDER BY id",
    ] {
        all.push(d.sql(q).await);
    }
    all
}

async fn seed(d: &Daemon) -> String {
    let (s, old) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "I use Vim for all my coding", "stream": "s1", "created_at": "2026-03-01", "tags": ["tools"], "metadata": {"from": "chat"}})),
        )
        .await;
    assert_eq!(s, 200, "{old}");
    let (s, new) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "I switched from Vim to VS Code", "stream": "s1", "valid_from": "2026-04-01"})),
        )
        .await;
    assert_eq!(s, 200, "{new}");
    d.store("Alice from Berlin joined the Orion project", "s1")
        .await;
    d.store("The staging database lives in Frankfurt", "s2")
        .await;
    let id = new["id"].as_str().unwrap().to_string();
    let (s, fb) = d
        .call(
            "POST",
            "/v1/feedback",
            Some(json!({"chunk_id": id, "usefulness": 3})),
        )
        .await;
    assert_eq!(s, 201, "{fb}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_then_import_into_an_empty_data_dir_gives_identical_rows() {
    let work = tempfile::tempdir().unwrap();
    let a = Daemon::start(Options::default()).await;
    let boosted = seed(&a).await;
    let original = snapshot(&a).await;
    assert!(original.iter().all(|t| !t.is_empty()), "{original:?}");

    // Through the daemons: export from A, restore into a fresh B.
    let f1 = work.path().join("out/a.jsonl");
    let (ok, _, err) = loomem(
        &[
            "export",
            "--url",
            &a.url,
            "--format",
            "jsonl",
            "--output",
            f1.to_str().unwrap(),
        ],
        None,
    )
    .await;
    assert!(ok, "{err}");
    let b = Daemon::start(Options::default()).await;
    let restore = |file: PathBuf, url: String| async move {
        let args = [
            "import",
            file.to_str().unwrap(),
            "--format",
            "loomem-jsonl",
            "--url",
            &url,
        ];
        loomem(&args, None).await
    };
    let (ok, out, err) = restore(f1.clone(), b.url.clone()).await;
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["accepted"], rows_of(&f1).len(), "{report}");
    assert_eq!(snapshot(&b).await, original);

    // The restored store answers like the original, feedback factor included.
    let q = json!({"query": "switched from Vim to VS Code", "stream": "s1", "trace": true, "dry_run": true});
    let (_, ra) = a.call("POST", "/v1/search", Some(q.clone())).await;
    let (_, rb) = b.call("POST", "/v1/search", Some(q)).await;
    let top = |r: &Value| {
        (
            r["results"][0]["chunk_id"].clone(),
            r["results"][0]["trace_info"]["factors"]["feedback"].clone(),
        )
    };
    assert_eq!(top(&ra), top(&rb));
    assert_eq!(top(&rb).0, boosted, "{rb}");
    assert!(top(&rb).1.as_f64().unwrap() > 1.0, "{rb}");

    // Restoring again changes nothing (upsert by id).
    let (ok, _, err) = restore(f1.clone(), b.url.clone()).await;
    assert!(ok, "{err}");
    assert_eq!(snapshot(&b).await, original);

    // Directly on data directories: export B's, restore into an empty C.
    let b_dir = b.data_dir.clone();
    let _b_rest = b.stop().await;
    let f2 = work.path().join("b.jsonl");
    let (ok, _, err) = loomem(
        &["export", "--output", f2.to_str().unwrap()],
        Some((&b_dir, work.path())),
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(rows_of(&f2), rows_of(&f1));
    let c_dir = work.path().join("c");
    let (ok, _, err) = loomem(
        &["import", f2.to_str().unwrap(), "--format", "loomem-jsonl"],
        Some((&c_dir, work.path())),
    )
    .await;
    assert!(ok, "{err}");
    let f3 = work.path().join("c.jsonl");
    let (ok, _, err) = loomem(
        &["export", "--output", f3.to_str().unwrap()],
        Some((&c_dir, work.path())),
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(rows_of(&f3), rows_of(&f1));
    let c = Daemon::start_at(&c_dir, Options::default()).await;
    assert_eq!(snapshot(&c).await, original);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_exports_in_every_format_and_a_bad_restore_writes_nothing() {
    let work = tempfile::tempdir().unwrap();
    let d = Daemon::start(Options::default()).await;
    seed(&d).await;
    let out = |name: &str| work.path().join(name);
    let export = |format: &str, path: PathBuf, extra: Vec<&str>| {
        let url = d.url.clone();
        let format = format.to_string();
        let extra: Vec<String> = extra.into_iter().map(str::to_string).collect();
        async move {
            let mut args = vec!["export", "--url", &url, "--format", &format, "--output"];
            let p = path.to_str().unwrap().to_string();
            args.push(&p);
            args.extend(extra.iter().map(String::as_str));
            let (ok, _, err) = loomem(&args, None).await;
            assert!(ok, "{err}");
            std::fs::read(&path).unwrap()
        }
    };

    // CSV of one stream: only its rows.
    let csv = export("csv", out("s2.csv"), vec!["--stream", "s2"]).await;
    let csv = String::from_utf8(csv).unwrap();
    assert!(csv.starts_with("id,stream,level,content"), "{csv}");
    assert_eq!(csv.lines().count(), 2, "{csv}");
    assert!(csv.contains("Frankfurt") && !csv.contains("Vim"), "{csv}");

    // Parquet of a query: readable, the selected rows and columns.
    let query = "SELECT id, content FROM chunks WHERE stream = 's1' AND superseded_by IS NULL ORDER BY content";
    export("parquet", out("s1.parquet"), vec!["--sql", query]).await;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(out("s1.parquet")).unwrap(),
    )
    .unwrap()
    .build()
    .unwrap();
    let batches: Vec<_> = reader.map(Result::unwrap).collect();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 2);
    assert_eq!(batches[0].schema().fields().len(), 2);

    // Markdown: a table, pipes escaped.
    d.store("Use a | b when piping", "s3").await;
    let md = export(
        "markdown",
        out("s3.md"),
        vec![
            "--sql",
            "SELECT content, memory_type FROM chunks WHERE stream = 's3'",
        ],
    )
    .await;
    let md = String::from_utf8(md).unwrap();
    assert_eq!(
        md,
        "| content | memory_type |\n|---|---|\n| Use a \\| b when piping | general |\n"
    );

    // JSONL of a query: one object per row.
    let jl = export(
        "jsonl",
        out("q.jsonl"),
        vec!["--sql", "SELECT stream FROM chunks ORDER BY stream"],
    )
    .await;
    let streams: Vec<Value> = String::from_utf8(jl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["stream"].clone())
        .collect();
    assert_eq!(streams, vec!["s1", "s1", "s1", "s2", "s3"]);

    // A bad query is a clear error and writes no file.
    let (ok, _, err) = loomem(
        &[
            "export",
            "--url",
            &d.url,
            "--format",
            "csv",
            "--sql",
            "DROP TABLE chunks",
            "--output",
            out("x.csv").to_str().unwrap(),
        ],
        None,
    )
    .await;
    assert!(!ok && err.contains("read-only"), "{err}");
    assert!(!out("x.csv").exists());

    // A cut-off export restores nothing: the header's counts catch it.
    let full = export("jsonl", out("full.jsonl"), vec![]).await;
    let text = String::from_utf8(full).unwrap();
    let cut: String = text.lines().take(3).map(|l| format!("{l}\n")).collect();
    std::fs::write(out("cut.jsonl"), cut).unwrap();
    let e = Daemon::start(Options::default()).await;
    let (ok, _, err) = loomem(
        &[
            "import",
            out("cut.jsonl").to_str().unwrap(),
            "--format",
            "loomem-jsonl",
            "--url",
            &e.url,
        ],
        None,
    )
    .await;
    assert!(!ok && err.contains("truncated"), "{err}");
    assert_eq!(e.sql("SELECT count(*) AS n FROM chunks").await[0]["n"], 0);
    let (status, body) = e
        .call("POST", "/v1/export", Some(json!({"format": "xml"})))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("xml"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_key_exports_and_restores_only_its_own_streams() {
    let d = Daemon::start(Options::with_auth()).await;
    for (content, stream) in [("Agent A prefers tea", "a"), ("Admin secret plan", "zz")] {
        let (s, body) = d
            .call(
                "POST",
                "/v1/store",
                Some(json!({"content": content, "stream": stream})),
            )
            .await;
        assert_eq!(s, 200, "{body}");
    }
    let export_as = |token: &str| {
        let req = d
            .http
            .post(format!("{}/v1/export", d.url))
            .bearer_auth(token)
            .json(&json!({"format": "jsonl"}));
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.text().await.unwrap()
        }
    };
    let mine = export_as(TOKEN_A).await;
    assert!(mine.contains("Agent A prefers tea"), "{mine}");
    assert!(!mine.contains("Admin secret plan"), "{mine}");
    let (s, body) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/export",
            Some(json!({"format": "jsonl", "stream": "zz"})),
        )
        .await;
    assert_eq!(s, 403, "{body}");

    // The admin's full export holds a stream agent A may not write: refused whole.
    let all = export_as(crate::fixture::ADMIN_TOKEN).await;
    let resp = d
        .http
        .post(format!("{}/v1/import?format=loomem-jsonl", d.url))
        .bearer_auth(TOKEN_A)
        .body(all)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let body: Value = resp.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("zz"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_job_writes_one_file_per_stream_atomically() {
    let work = tempfile::tempdir().unwrap();
    let template = format!("{}/{{stream}}/{{date}}.{{ext}}", work.path().display());
    let exports = format!(
        "[{{format = \"jsonl\", path = \"{template}\"}}, {{format = \"csv\", path = \"{}/all.csv\", sql = \"SELECT id, stream FROM chunks\"}}]",
        work.path().display()
    );
    let d = Daemon::start(
        Options::default().env("LOOMEM_SCHEDULER__JOBS__EXPORT__PARAMS__EXPORTS", &exports),
    )
    .await;
    seed(&d).await;

    let (s, dry) = d
        .call(
            "POST",
            "/admin/jobs/export/run",
            Some(json!({"dry_run": true})),
        )
        .await;
    assert_eq!(s, 200, "{dry}");
    assert_eq!(dry["report"]["files"].as_array().unwrap().len(), 3, "{dry}");
    assert!(std::fs::read_dir(work.path()).unwrap().next().is_none());

    let (s, run) = d
        .call("POST", "/admin/jobs/export/run", Some(json!({})))
        .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["status"], "succeeded", "{run}");
    let files = run["report"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 3, "{run}");
    let s2 = files.iter().find(|f| f["stream"] == "s2").unwrap()["path"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(s2.ends_with(".jsonl") && s2.contains("/s2/"), "{s2}");
    let rows = rows_of(Path::new(&s2));
    assert!(
        rows.iter().all(|r| r.contains("\"stream\":\"s2\"")),
        "{rows:?}"
    );
    assert!(rows.iter().any(|r| r.contains("Frankfurt")), "{rows:?}");
    let csv = std::fs::read_to_string(work.path().join("all.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
    // No temp files left behind.
    let s2_dir = Path::new(&s2).parent().unwrap();
    assert_eq!(std::fs::read_dir(s2_dir).unwrap().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_past_the_row_cap_is_refused_not_cut_short() {
    let d = Daemon::start(
        Options::embedded()
            .env("LOOMEM_SQL__MAX_ROWS_CAP", "2")
            .env("LOOMEM_SQL__DEFAULT_MAX_ROWS", "2"),
    )
    .await;
    for text in [
        "Walks the dog at seven",
        "Reads before bed",
        "Cycles to work",
    ] {
        d.store(text, "cap").await;
    }
    let (status, body) = d
        .call("POST", "/v1/export", Some(json!({"format": "csv"})))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("more than 2 rows"),
        "{body}"
    );
    // Within the cap, the export is whole.
    let (status, body) = d
        .call(
            "POST",
            "/v1/export",
            Some(json!({"format": "csv", "sql": "SELECT content FROM chunks ORDER BY content LIMIT 2"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let csv = body.as_str().unwrap();
    assert!(
        csv.contains("Cycles to work") && csv.contains("Reads before bed"),
        "{csv}"
    );
    // Exports are spooled to disk and sent from there: nothing is left behind,
    // neither by the refused export nor by the one sent.
    let spool: Vec<_> = std::fs::read_dir(d.data_dir.join(".export-spool"))
        .unwrap()
        .collect();
    assert!(spool.is_empty(), "{spool:?}");
}
