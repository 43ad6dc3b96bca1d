use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use loomem::config::Config;

mod cli;

#[derive(Parser)]
#[command(
    name = "loomem",
    version,
    about = "Long-term memory engine for AI agents"
)]
struct Cli {
    /// Path to the configuration file.
    #[arg(
        long,
        global = true,
        default_value = "config.toml",
        env = "LOOMEM_CONFIG"
    )]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: REST API, pipeline worker.
    Serve,
    /// Parse and validate the configuration and pipelines, then exit.
    CheckConfig,
    /// Bulk-import a file: straight onto JetStream, or through a daemon with --url.
    Import {
        /// The file to import.
        path: PathBuf,
        /// jsonl (one /v1/store object per line), longmemeval, or markdown.
        #[arg(long, default_value = "jsonl")]
        format: loomem::import::Format,
        /// Stream for records that name none.
        #[arg(long)]
        stream: Option<String>,
        /// Send through a running daemon (POST /v1/import) instead of publishing directly.
        #[arg(long)]
        url: Option<String>,
        /// API key for --url (default: $LOOMEM_AUTH_TOKEN).
        #[arg(long, env = "LOOMEM_AUTH_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("LOOMEM_LOG").unwrap_or_else(|_| {
            EnvFilter::new("info,lance=warn,lancedb=warn,lance_index=warn,lance_core=warn")
        }))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let env: HashMap<String, String> = std::env::vars().collect();
    let cfg = Config::load(&cli.config, &env)
        .with_context(|| format!("loading {}", cli.config.display()))?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Serve => {
                let addr = format!("{}:{}", cfg.server.host, cfg.server.port);
                let listener = tokio::net::TcpListener::bind(&addr)
                    .await
                    .with_context(|| format!("binding {addr}"))?;
                loomem::server::serve(cfg, env, listener, loomem::server::shutdown_signal())
                    .await?;
            }
            Command::CheckConfig => {
                println!(
                    "config ok: data_dir={} bus={:?}",
                    cfg.data_dir().display(),
                    cfg.bus.kind
                );
            }
            Command::Import {
                path,
                format,
                stream,
                url,
                token,
            } => {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let report = match url {
                    Some(url) => {
                        cli::import_via_daemon(
                            &url,
                            token.as_deref(),
                            format,
                            stream.as_deref(),
                            text,
                        )
                        .await?
                    }
                    None => cli::import_direct(&cfg, format, stream.as_deref(), &text).await?,
                };
                for r in &report.rejected {
                    eprintln!("{}:{}: rejected: {}", path.display(), r.line, r.error);
                }
                println!("{}", serde_json::to_string_pretty(&report)?);
                if !report.rejected.is_empty() {
                    std::process::exit(2);
                }
            }
        }
        Ok(())
    })
}
