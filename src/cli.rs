//! The command-line side of `loomem import`, `sql` and `bench-recall`: thin
//! wrappers over the library.

use std::io::Write;

use anyhow::{bail, Context};
use tokio::sync::watch;

use loomem::app::config::Config;
use loomem::bus::config::BusKind;
use loomem::bus::{Bus, JetStreamBus};
use loomem::core::Caller;
use loomem::service::import::{self, Destination, Format, ImportReport};

/// Publish straight onto the JetStream stream the daemon consumes.
pub async fn import_direct(
    cfg: &Config,
    format: Format,
    stream: Option<&str>,
    text: &str,
) -> anyhow::Result<ImportReport> {
    let caller = Caller::admin("cli").with_namespaces(std::sync::Arc::new(cfg.namespaces.clone()));
    if format == Format::LoomemJsonl {
        let store = open_store(cfg).await?;
        let ids = cfg.data_location().id_key().await?;
        let to = Destination {
            bus: None,
            store: Some(&store),
            ids: &ids,
        };
        let report = import::import_text(to, &caller, format, stream, text, |_, _| {}).await;
        store.close().await;
        return Ok(report?);
    }
    if cfg.bus.kind != BusKind::Jetstream {
        bail!("a direct import needs bus.kind = \"jetstream\"; with the embedded bus, import through the daemon with --url");
    }
    let (_stop, rx) = watch::channel(false);
    let (bus, _consumer) = JetStreamBus::connect(&cfg.bus, rx).await?;
    let bus = Bus::JetStream(bus);
    // The daemon's key, from the data directory this config names, so that
    // a rerun through either path derives the same ids.
    let ids = cfg.data_location().id_key().await?;
    let to = Destination {
        bus: Some(&bus),
        store: None,
        ids: &ids,
    };
    let report = import::import_text(to, &caller, format, stream, text, |done, total| {
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        eprint!("\rimport: {done}/{total} accepted ({pct}%)");
        let _ = std::io::stderr().flush();
    })
    .await?;
    eprintln!();
    Ok(report)
}

/// POST the file to a running daemon's /v1/import.
pub async fn import_via_daemon(
    url: &str,
    token: Option<&str>,
    format: Format,
    stream: Option<&str>,
    text: String,
) -> anyhow::Result<ImportReport> {
    let format = serde_json::to_value(format)?
        .as_str()
        .unwrap_or("jsonl")
        .to_string();
    let mut query = vec![("format", format)];
    if let Some(s) = stream {
        query.push(("stream", s.to_string()));
    }
    let mut req = reqwest::Client::new()
        .post(format!("{}/v1/import", url.trim_end_matches('/')))
        .query(&query)
        .body(text);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    eprintln!("import: sending to {url}");
    let resp = req.send().await.context("reaching the daemon")?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.context("reading the daemon's answer")?;
    if !status.is_success() {
        bail!(
            "the daemon answered {status}: {}",
            body["detail"].as_str().unwrap_or("?")
        );
    }
    Ok(serde_json::from_value(body)?)
}

/// Render a result the way the CLI prints it.
fn print_format(result: &loomem::service::sql::SqlResult, format: &str) -> anyhow::Result<Vec<u8>> {
    if format == "table" {
        return Ok(format!("{}\n", loomem::service::sql::pretty(result)?).into_bytes());
    }
    let (_, mut body) = loomem::service::sql::render(result, format.parse()?)?;
    if (format == "json" || format == "csv") && !body.ends_with(b"\n") {
        body.push(b'\n');
    }
    Ok(body)
}

/// The data directory's tables, opened in this process.
async fn open_store(cfg: &Config) -> anyhow::Result<loomem::store::Store> {
    let location = cfg.data_location();
    loomem::store::Store::open_with(
        &location,
        cfg.embed.dim,
        cfg.storage.write_batch_max_rows,
        Some(std::time::Duration::from_millis(
            cfg.storage.read_consistency_ms,
        )),
        cfg.storage.maintenance(),
    )
    .await
    .with_context(|| format!("opening {location}"))
}

/// `loomem export` on the data directory (as admin), narrowed to `--stream`,
/// into `output`; returns its size in bytes.
pub async fn export_direct(
    cfg: &Config,
    format: loomem::service::export::ExportFormat,
    sql: Option<&str>,
    stream: Option<&str>,
    output: &std::path::Path,
) -> anyhow::Result<u64> {
    let caller = loomem::service::export::narrow(&Caller::admin("cli"), stream)?;
    let store = open_store(cfg).await?;
    let limits = cfg.sql.limits();
    let export = loomem::service::export::Export {
        store: &store,
        caller: &caller,
        limits: &limits,
        format,
        sql,
    };
    let out = export.write_file(output).await;
    store.close().await;
    Ok(out?)
}

/// `loomem export --url`: the daemon renders, this process writes the file
/// as its pieces arrive; returns its size in bytes.
pub async fn export_via_daemon(
    url: &str,
    token: Option<&str>,
    format: loomem::service::export::ExportFormat,
    sql: Option<&str>,
    stream: Option<&str>,
    output: &std::path::Path,
) -> anyhow::Result<u64> {
    use std::io::Write;
    let body = serde_json::json!({ "format": format.name(), "sql": sql, "stream": stream });
    let mut resp = send_to_daemon(url, "/v1/export", token, &body).await?;
    let written =
        loomem::service::export::replace_file(output, |tmp| async move {
            let fail = |e: std::io::Error| loomem::core::error::Error::Internal(e.to_string());
            let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(fail)?);
            let mut bytes = 0u64;
            while let Some(piece) = resp.chunk().await.map_err(|e| {
                loomem::core::error::Error::Internal(format!("reading the export: {e}"))
            })? {
                file.write_all(&piece).map_err(fail)?;
                bytes += piece.len() as u64;
            }
            file.flush().map_err(fail)?;
            Ok(bytes)
        })
        .await?;
    Ok(written)
}

/// POST JSON to a daemon; the answer's bytes, or its `detail` as the error.
async fn post_to_daemon(
    url: &str,
    path: &str,
    token: Option<&str>,
    body: &serde_json::Value,
) -> anyhow::Result<Vec<u8>> {
    let resp = send_to_daemon(url, path, token, body).await?;
    Ok(resp.bytes().await?.to_vec())
}

/// POST JSON to a daemon; its successful answer, or its `detail` as the error.
async fn send_to_daemon(
    url: &str,
    path: &str,
    token: Option<&str>,
    body: &serde_json::Value,
) -> anyhow::Result<reqwest::Response> {
    let endpoint = format!("{}{path}", url.trim_end_matches('/'));
    let mut req = reqwest::Client::new().post(&endpoint).json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("cannot reach {endpoint}"))?;
    let status = resp.status();
    if !status.is_success() {
        let bytes = resp.bytes().await?;
        let detail: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        bail!(
            "{endpoint} answered {status}: {}",
            detail["detail"].as_str().unwrap_or("?")
        );
    }
    Ok(resp)
}

/// Query the data directory directly (as admin: whoever can read the files sees everything).
pub async fn sql_direct(
    cfg: &Config,
    req: loomem::service::sql::SqlRequest,
    format: &str,
) -> anyhow::Result<Vec<u8>> {
    let store = open_store(cfg).await?;
    let result =
        loomem::service::sql::query(&store, &Caller::admin("cli"), &cfg.sql.limits(), &req).await;
    store.close().await;
    print_format(&result?, format)
}

/// Ask a running daemon; the table format is rendered here from Arrow IPC.
pub async fn sql_via_daemon(
    url: &str,
    token: Option<&str>,
    mut req: loomem::service::sql::SqlRequest,
    format: &str,
) -> anyhow::Result<Vec<u8>> {
    req.format = Some(if format == "table" { "arrow" } else { format }.to_string());
    let body = serde_json::json!({
        "sql": req.sql, "params": req.params, "format": req.format, "max_rows": req.max_rows,
    });
    let bytes = post_to_daemon(url, "/v1/sql", token, &body).await?;
    if format != "table" {
        return Ok(bytes);
    }
    let reader = lancedb::datafusion::arrow::ipc::reader::StreamReader::try_new(
        std::io::Cursor::new(bytes),
        None,
    )?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    print_format(
        &loomem::service::sql::SqlResult {
            schema,
            batches,
            truncated: false,
            deadline: None,
        },
        "table",
    )
}

/// What `bench-recall run` was asked to measure.
pub struct RecallSelection {
    pub modes: Vec<String>,
    pub roles: String,
    /// `none` or `facts` (see `Keys`).
    pub keys: String,
    pub limit: Option<usize>,
    pub types: Vec<String>,
    pub ks: Vec<usize>,
    pub granularity: String,
    /// `grouped` or `turns` (see `SessionRank`).
    pub sessions: String,
    pub qa: bool,
    pub candidates: bool,
}

/// `loomem bench-recall run`: run the questions of `data` on a fresh engine (a
/// temporary data directory, the in-process bus, the configured embedder) and
/// write `recall-<time>.json`, `.md`, `.png` and `.svg` under `out`.
pub async fn bench_recall(
    mut cfg: Config,
    env: &std::collections::HashMap<String, String>,
    data: &std::path::Path,
    sel: RecallSelection,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    use loomem::bench_recall::run::{
        markdown, run, Granularity, Keys, Roles, RunOptions, SessionRank,
    };
    let roles = match sel.roles.as_str() {
        "user" => Roles::User,
        "all" => Roles::All,
        other => bail!("--roles {other}: must be user or all"),
    };
    let keys = match sel.keys.as_str() {
        "none" => Keys::None,
        "facts" => Keys::Facts,
        other => bail!("--keys {other}: must be none or facts"),
    };
    let session_rank = match sel.sessions.as_str() {
        "grouped" => SessionRank::Grouped,
        "turns" => SessionRank::Turns,
        other => bail!("--sessions {other}: must be grouped or turns"),
    };
    let granularity = match sel.granularity.as_str() {
        "session" => Granularity::Session,
        "turn" => Granularity::Turn,
        "both" => Granularity::Both,
        other => bail!("--granularity {other}: must be session, turn or both"),
    };
    for m in &sel.modes {
        if !["bm25", "vector", "graph", "hybrid"].contains(&m.as_str()) {
            bail!("--modes: `{m}` is not bm25, vector, graph or hybrid");
        }
    }
    for t in &sel.types {
        if !loomem::bench_recall::QUESTION_TYPES.contains(&t.as_str()) {
            bail!(
                "--types: `{t}` is not one of {}",
                loomem::bench_recall::QUESTION_TYPES.join(", ")
            );
        }
    }
    if sel.ks.is_empty() || sel.ks.iter().any(|&k| k == 0 || k > 1000) {
        bail!("--k: cut-offs must be between 1 and 1000");
    }
    let (modes, ks, limit) = (sel.modes, sel.ks, sel.limit);
    let text =
        std::fs::read_to_string(data).with_context(|| format!("reading {}", data.display()))?;
    let (mut questions, skipped) = loomem::bench_recall::load(&text).map_err(anyhow::Error::msg)?;
    for (i, why) in &skipped {
        eprintln!("{}: entry {i} skipped: {why}", data.display());
    }
    if !sel.types.is_empty() {
        questions.retain(|q| sel.types.contains(&q.question_type));
    }
    if let Some(n) = limit {
        questions.truncate(n);
    }
    // A fresh data directory beside the results, removed afterwards.
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let scratch = out.join(format!(".data-{stamp}"));
    cfg.storage.data_dir = scratch.clone();
    cfg.bus.kind = BusKind::Embedded;
    // The measured store must stay as ingested: no consolidation mid-run.
    cfg.scheduler.enabled = false;
    cfg.scheduler.dream_after_idle_secs = 0;
    // A batch run on a machine that may be busy: a haystack's batch waits as
    // long as it takes (the daemon's store timeout is for callers that retry).
    cfg.server.store_timeout_ms = cfg.server.store_timeout_ms.max(3_600_000);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    // Vectors by content hash, kept across runs: haystacks repeat their filler.
    let inner = loomem::providers::embed::from_config(&cfg.embed, env)?;
    let cache_file = out.join(".embed-cache").join(format!(
        "{}-{}.bin",
        inner.model().replace(['/', ' '], "_"),
        inner.dim()
    ));
    let cache = std::sync::Arc::new(loomem::providers::embed::CachedEmbedder::open(
        inner,
        Some(&cache_file),
    )?);
    let engine = loomem::app::Engine::start_with(cfg, env, cache.clone()).await?;
    let opts = RunOptions {
        modes,
        roles,
        keys,
        ks,
        granularity,
        session_rank,
        qa: sel.qa,
        candidates: sel.candidates,
    };
    let saving = cache.clone();
    let report = run(&engine, &questions, &opts, |done, total| {
        // New vectors reach the cache file as the run goes: a run that stops
        // early leaves them for the next.
        if done % 10 == 0 {
            if let Err(e) = saving.save() {
                tracing::warn!(error = %e, "embedding cache not saved");
            }
        }
        let width = 30;
        let filled = (done * width).checked_div(total).unwrap_or(width);
        eprint!(
            "\rbench-recall [{}{}] {done}/{total}",
            "#".repeat(filled),
            "-".repeat(width - filled)
        );
        let _ = std::io::stderr().flush();
    })
    .await?;
    eprintln!();
    engine.shutdown().await;
    cache.save()?;
    let (hits, misses) = cache.stats();
    std::fs::remove_dir_all(&scratch).ok();
    let json_path = out.join(format!("recall-{stamp}.json"));
    let md_path = out.join(format!("recall-{stamp}.md"));
    let png_path = out.join(format!("recall-{stamp}.png"));
    let svg_path = out.join(format!("recall-{stamp}.svg"));
    loomem::bench_recall::chart::png(&report, &png_path).map_err(anyhow::Error::msg)?;
    let (svg, _) = loomem::bench_recall::chart::svg(&report).map_err(anyhow::Error::msg)?;
    std::fs::write(&svg_path, svg)?;
    let md = markdown(&report);
    let doc = serde_json::json!({
        "dataset": data.display().to_string(),
        "questions_skipped": skipped.iter().map(|(i, why)| serde_json::json!({"index": i, "error": why})).collect::<Vec<_>>(),
        "embedder": engine.embedder.model(),
        "embedding_cache": {"file": cache_file.display().to_string(), "hits": hits, "embedded": misses},
        "roles": roles,
        "sessions": session_rank,
        "report": report,
    });
    std::fs::write(&json_path, serde_json::to_vec_pretty(&doc)?)?;
    std::fs::write(&md_path, &md)?;
    if sel.candidates {
        let path = out.join(format!("candidates-{stamp}.jsonl"));
        let mut lines = Vec::new();
        for c in &report.candidates {
            serde_json::to_writer(&mut lines, c)?;
            lines.push(b'\n');
        }
        std::fs::write(&path, lines)?;
        eprintln!("wrote {}", path.display());
    }
    println!("{md}");
    eprintln!(
        "wrote {}, {}, {} and {}",
        json_path.display(),
        md_path.display(),
        png_path.display(),
        svg_path.display()
    );
    Ok(())
}

/// `loomem mcp --url`: relay MCP JSON-RPC between stdio and a daemon's
/// streamable HTTP endpoint, one message at a time, keeping its session id.
pub async fn mcp_proxy(url: &str, token: Option<&str>, stream: Option<&str>) -> anyhow::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut endpoint = format!("{}/mcp", url.trim_end_matches('/'));
    if let Some(s) = stream {
        endpoint.push_str(&format!("?stream={s}"));
    }
    let http = reqwest::Client::new();
    let mut session: Option<String> = None;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        let mut req = http
            .post(&endpoint)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(line);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(s) = &session {
            req = req.header("mcp-session-id", s);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach {endpoint}"))?;
        if let Some(s) = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            session = Some(s.to_string());
        }
        let status = resp.status();
        let is_sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/event-stream"));
        let body = resp.text().await?;
        if !status.is_success() {
            anyhow::bail!("{endpoint} answered {status}: {body}");
        }
        let messages: Vec<&str> = if is_sse {
            body.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .collect()
        } else {
            vec![body.trim()]
        };
        for m in messages.into_iter().filter(|m| !m.is_empty()) {
            out.write_all(m.as_bytes()).await?;
            out.write_all(b"\n").await?;
        }
        out.flush().await?;
    }
    Ok(())
}

/// `loomem job run NAME --url`: ask a daemon to run the job now.
pub async fn job_via_daemon(
    url: &str,
    token: Option<&str>,
    name: &str,
    dry_run: bool,
) -> anyhow::Result<serde_json::Value> {
    let body = serde_json::json!({ "dry_run": dry_run });
    let bytes = post_to_daemon(url, &format!("/admin/jobs/{name}/run"), token, &body).await?;
    Ok(serde_json::from_slice(&bytes)?)
}

/// What `loomem keys …` asks.
pub enum KeysRequest {
    Create(loomem::service::keys::CreateKey),
    List,
    Rotate(String, loomem::service::keys::RotateKey),
    Revoke(String),
}

/// `loomem keys …` on the data directory's `api_keys` table.
pub async fn keys(cfg: &Config, req: KeysRequest) -> anyhow::Result<serde_json::Value> {
    use loomem::service::keys;
    let location = cfg.data_location();
    let table = loomem::store::api_keys::KeyTable::open(&location)
        .await
        .with_context(|| format!("opening the keys of {location}"))?;
    Ok(match req {
        KeysRequest::Create(r) => serde_json::to_value(keys::create(&table, r).await?)?,
        KeysRequest::List => serde_json::json!({ "keys": keys::list(&table).await? }),
        KeysRequest::Rotate(id, r) => serde_json::to_value(keys::rotate(&table, &id, r).await?)?,
        KeysRequest::Revoke(id) => serde_json::to_value(keys::revoke(&table, &id).await?)?,
    })
}
