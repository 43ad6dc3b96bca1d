//! The command-line side of `loomem import`: thin wrappers over the importer.

use std::io::Write;

use anyhow::{bail, Context};
use tokio::sync::watch;

use loomem::auth::Caller;
use loomem::bus::{Bus, JetStreamBus};
use loomem::config::{BusKind, Config};
use loomem::import::{self, Format, ImportReport};

/// Publish straight onto the JetStream stream the daemon consumes.
pub async fn import_direct(
    cfg: &Config,
    format: Format,
    stream: Option<&str>,
    text: &str,
) -> anyhow::Result<ImportReport> {
    if cfg.bus.kind != BusKind::Jetstream {
        bail!("a direct import needs bus.kind = \"jetstream\"; with the embedded bus, import through the daemon with --url");
    }
    let parsed = import::parse(format, text, stream, &Caller::admin("cli"), &cfg.namespaces)?;
    let (_stop, rx) = watch::channel(false);
    let (bus, _consumer) = JetStreamBus::connect(&cfg.bus, rx).await?;
    let report = import::publish(&Bus::JetStream(bus), parsed, |done, total| {
        let pct = if total == 0 { 100 } else { done * 100 / total };
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
fn print_format(result: &loomem::sql::SqlResult, format: &str) -> anyhow::Result<Vec<u8>> {
    if format == "table" {
        return Ok(format!("{}\n", loomem::sql::pretty(result)?).into_bytes());
    }
    let (_, mut body) = loomem::sql::render(result, format)?;
    if format == "json" || format == "csv" {
        if !body.ends_with(b"\n") {
            body.push(b'\n');
        }
    }
    Ok(body)
}

/// Query the data directory directly (as admin: whoever can read the files sees everything).
pub async fn sql_direct(
    cfg: &Config,
    req: loomem::sql::SqlRequest,
    format: &str,
) -> anyhow::Result<Vec<u8>> {
    let store = loomem::store::Store::open(
        &cfg.data_dir(),
        cfg.embed.dim,
        cfg.storage.write_batch_max_rows,
    )
    .await
    .with_context(|| format!("opening {}", cfg.data_dir().display()))?;
    let result = loomem::sql::query(&store, &Caller::admin("cli"), &cfg.sql.limits(), &req).await;
    store.close().await;
    print_format(&result?, format)
}

/// Ask a running daemon; the table format is rendered here from Arrow IPC.
pub async fn sql_via_daemon(
    url: &str,
    token: Option<&str>,
    mut req: loomem::sql::SqlRequest,
    format: &str,
) -> anyhow::Result<Vec<u8>> {
    req.format = Some(if format == "table" { "arrow" } else { format }.to_string());
    let body = serde_json::json!({
        "sql": req.sql, "params": req.params, "format": req.format, "max_rows": req.max_rows,
    });
    let mut http = reqwest::Client::new()
        .post(format!("{}/v1/sql", url.trim_end_matches('/')))
        .json(&body);
    if let Some(t) = token {
        http = http.bearer_auth(t);
    }
    let resp = http.send().await.context("reaching the daemon")?;
    let status = resp.status();
    let bytes = resp.bytes().await?;
    if !status.is_success() {
        let detail: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        bail!(
            "the daemon answered {status}: {}",
            detail["detail"].as_str().unwrap_or("?")
        );
    }
    if format != "table" {
        return Ok(bytes.to_vec());
    }
    let reader = lancedb::datafusion::arrow::ipc::reader::StreamReader::try_new(
        std::io::Cursor::new(bytes.to_vec()),
        None,
    )?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    print_format(
        &loomem::sql::SqlResult {
            schema,
            batches,
            truncated: false,
        },
        "table",
    )
}
