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
