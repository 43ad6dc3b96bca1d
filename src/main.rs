use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use loomem::app::config::Config;

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
    /// Run a read-only SQL query over the memory tables: directly against the data
    /// directory, or through a running daemon with --url.
    Sql {
        /// The query (SELECT or WITH …).
        query: String,
        /// table (default), csv, json, arrow or parquet (the last two are binary).
        #[arg(long, default_value = "table")]
        format: String,
        /// Values for $1, $2, … (JSON literals; plain text is a string).
        #[arg(long = "param")]
        params: Vec<String>,
        #[arg(long)]
        max_rows: Option<usize>,
        /// Ask a running daemon (POST /v1/sql) instead of opening the data directory.
        #[arg(long)]
        url: Option<String>,
        /// API key for --url (default: $LOOMEM_AUTH_TOKEN).
        #[arg(long, env = "LOOMEM_AUTH_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Bulk-import a file: straight onto JetStream, or through a daemon with --url.
    Import {
        /// The file to import.
        path: PathBuf,
        /// jsonl (one /v1/store object per line), longmemeval, markdown, or
        /// loomem-jsonl (a lossless `loomem export`, restored row for row).
        #[arg(long, default_value = "jsonl")]
        format: loomem::service::import::Format,
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
    /// Export the memory tables to a file, written atomically: directly from the
    /// data directory, or through a running daemon with --url.
    Export {
        /// jsonl (without --sql: the lossless form `import --format loomem-jsonl`
        /// restores), parquet, csv or markdown.
        #[arg(long, default_value = "jsonl")]
        format: loomem::service::export::ExportFormat,
        /// The file to write.
        #[arg(long)]
        output: PathBuf,
        /// Only this stream.
        #[arg(long)]
        stream: Option<String>,
        /// A read-only query over the memory tables (default: every memory).
        #[arg(long)]
        sql: Option<String>,
        /// Export through a running daemon (POST /v1/export).
        #[arg(long)]
        url: Option<String>,
        /// API key for --url (default: $LOOMEM_AUTH_TOKEN).
        #[arg(long, env = "LOOMEM_AUTH_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Serve MCP (the 14 memory_* tools) over stdin/stdout for desktop clients:
    /// the engine runs in this process, or --url proxies to a running daemon's /mcp.
    Mcp {
        /// The active stream (default: the default stream).
        #[arg(long)]
        stream: Option<String>,
        /// Forward to a running daemon instead (e.g. http://127.0.0.1:3030).
        #[arg(long)]
        url: Option<String>,
        /// API key for --url (default: $LOOMEM_AUTH_TOKEN).
        #[arg(long, env = "LOOMEM_AUTH_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Maintenance jobs: `run` one now (dream, decay, compact, reembed).
    Job {
        #[command(subcommand)]
        action: JobAction,
    },
    /// API keys made at runtime, in the data directory's `api_keys` table
    /// (the same ones as `/admin/keys`): create, list, rotate, revoke.
    Keys {
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Retrieval quality on LongMemEval-format data: `run` it, or `gen`erate
    /// a dataset from ingredients.
    BenchRecall {
        #[command(subcommand)]
        action: RecallAction,
    },
}

#[derive(Subcommand)]
enum KeysAction {
    /// Make a key and print it with its secret (shown this once).
    Create {
        #[arg(long)]
        name: String,
        /// admin, writer or reader.
        #[arg(long)]
        role: String,
        /// The streams it may use, comma-separated, the first its default
        /// (required unless admin).
        #[arg(long, value_delimiter = ',')]
        streams: Vec<String>,
        /// Seconds until it stops working.
        #[arg(long)]
        expires_in_secs: Option<u64>,
    },
    /// Every key, never a secret.
    List,
    /// A new secret; the old one works for --grace-secs more (default 3600).
    Rotate {
        id: String,
        #[arg(long)]
        grace_secs: Option<u64>,
    },
    /// Revoke a key now.
    Revoke { id: String },
}

#[derive(Subcommand)]
enum JobAction {
    /// Run a job now against the data directory (or a daemon with --url) and
    /// print the recorded run.
    Run {
        /// dream, decay, compact or reembed.
        name: String,
        /// Report what would change, change nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        url: Option<String>,
        /// API key for --url (default: $LOOMEM_AUTH_TOKEN).
        #[arg(long, env = "LOOMEM_AUTH_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
}

#[derive(Subcommand)]
enum RecallAction {
    /// Each haystack goes through the import pipeline into a fresh stream (a
    /// temporary data directory, the in-process bus), each question is searched
    /// as of its date, and the official retrieval metrics are reported.
    Run {
        /// The LongMemEval-format JSON file.
        data: PathBuf,
        /// Search modes to compare (bm25, vector, graph, hybrid).
        #[arg(
            long,
            alias = "mode",
            default_value = "bm25,vector,hybrid",
            value_delimiter = ','
        )]
        modes: Vec<String>,
        /// Which turns are indexed: user (the official setup) or all.
        #[arg(long, default_value = "user")]
        roles: String,
        /// What else stands for a turn: none (the official setup) or facts
        /// (the rule extractor's facts of each user turn, stored beside it).
        #[arg(long, default_value = "none")]
        keys: String,
        /// Only the first N questions (after --types).
        #[arg(long)]
        limit: Option<usize>,
        /// Only these question types (comma-separated).
        #[arg(long, value_delimiter = ',')]
        types: Vec<String>,
        /// The cut-offs scored.
        #[arg(long, default_value = "1,3,5,10,30,50", value_delimiter = ',')]
        k: Vec<usize>,
        /// Levels reported: session, turn or both.
        #[arg(long, default_value = "both")]
        granularity: String,
        /// How sessions are ranked: grouped (the search's `sessions`, each
        /// its best result plus a share of the others') or turns (in the
        /// order their first turn is found).
        #[arg(long, default_value = "grouped")]
        sessions: String,
        /// Also answer each question with the LLM ([llm] config) from the
        /// retrieved memories and judge it: QA accuracy per type.
        #[arg(long)]
        qa: bool,
        /// Also write each question's first 300 hybrid candidates, with every
        /// leg's rank and score, as candidates-<time>.jsonl (for studying
        /// fusion offline).
        #[arg(long)]
        candidates: bool,
        /// Where the JSON, markdown and PNG results go.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// Write a LongMemEval-format file from ingredients (filler pool +
    /// evidence per question), with haystacks of --sessions sessions.
    Gen {
        #[arg(long)]
        ingredients: PathBuf,
        #[arg(long, default_value_t = 30)]
        sessions: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() {
    // Before any other thread exists: it writes the process environment.
    loomem::providers::embed::minilm::kernel_threads();
    loomem::store::maintain::lance_threads();
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
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
                loomem::api::server::serve(
                    cfg,
                    env,
                    listener,
                    loomem::api::server::shutdown_signal(),
                )
                .await?;
            }
            Command::Mcp { stream, url, token } => match url {
                Some(url) => cli::mcp_proxy(&url, token.as_deref(), stream.as_deref()).await?,
                None => {
                    let engine = loomem::app::Engine::start(cfg, &env).await?;
                    let server = loomem::mcp::MemoryServer::local(
                        engine.clone(),
                        loomem::core::Caller::admin("mcp-stdio"),
                        stream,
                    );
                    let served = loomem::mcp::serve_stdio(server).await;
                    engine.shutdown().await;
                    served?;
                }
            },
            Command::Job {
                action:
                    JobAction::Run {
                        name,
                        dry_run,
                        url,
                        token,
                    },
            } => {
                let run = match url {
                    Some(url) => {
                        cli::job_via_daemon(&url, token.as_deref(), &name, dry_run).await?
                    }
                    None => {
                        let engine = loomem::app::Engine::start(cfg, &env).await?;
                        let run = engine.run_job(&name, dry_run).await;
                        engine.shutdown().await;
                        serde_json::to_value(loomem::jobs::RunView::from(run?))?
                    }
                };
                println!("{}", serde_json::to_string_pretty(&run)?);
                if run["status"] == "failed" {
                    std::process::exit(2);
                }
            }
            Command::Keys { action } => {
                let out = cli::keys(&cfg, action_to_request(action)?).await?;
                println!("{}", serde_json::to_string_pretty(&out)?);
            }
            Command::CheckConfig => {
                println!(
                    "config ok: data_dir={} bus={:?}",
                    cfg.data_location(),
                    cfg.bus.kind
                );
            }
            Command::Sql {
                query,
                format,
                params,
                max_rows,
                url,
                token,
            } => {
                let params = params
                    .iter()
                    .map(|p| {
                        serde_json::from_str(p)
                            .unwrap_or_else(|_| serde_json::Value::String(p.clone()))
                    })
                    .collect();
                let req = loomem::service::sql::SqlRequest {
                    sql: query,
                    params,
                    format: None,
                    max_rows,
                };
                let out = match url {
                    Some(url) => cli::sql_via_daemon(&url, token.as_deref(), req, &format).await?,
                    None => cli::sql_direct(&cfg, req, &format).await?,
                };
                use std::io::Write;
                std::io::stdout().write_all(&out)?;
            }
            Command::BenchRecall {
                action:
                    RecallAction::Run {
                        data,
                        modes,
                        roles,
                        keys,
                        limit,
                        types,
                        k,
                        granularity,
                        sessions,
                        qa,
                        candidates,
                        out,
                    },
            } => {
                let selection = cli::RecallSelection {
                    modes,
                    roles,
                    keys,
                    limit,
                    types,
                    ks: k,
                    granularity,
                    sessions,
                    qa,
                    candidates,
                };
                cli::bench_recall(cfg, &env, &data, selection, &out).await?;
            }
            Command::BenchRecall {
                action:
                    RecallAction::Gen {
                        ingredients,
                        sessions,
                        seed,
                        out,
                    },
            } => {
                let text = std::fs::read_to_string(&ingredients)
                    .with_context(|| format!("reading {}", ingredients.display()))?;
                let ing: loomem::bench_recall::gen::Ingredients = serde_json::from_str(&text)
                    .with_context(|| format!("{}: not valid ingredients", ingredients.display()))?;
                let entries = loomem::bench_recall::gen::generate(&ing, sessions, seed)
                    .map_err(anyhow::Error::msg)?;
                std::fs::write(&out, serde_json::to_vec(&entries)?)
                    .with_context(|| format!("writing {}", out.display()))?;
                eprintln!(
                    "wrote {} questions with {sessions}-session haystacks to {}",
                    entries.len(),
                    out.display()
                );
            }
            Command::Export {
                format,
                output,
                stream,
                sql,
                url,
                token,
            } => {
                let (sql, stream) = (sql.as_deref(), stream.as_deref());
                let bytes = match url {
                    Some(url) => {
                        cli::export_via_daemon(&url, token.as_deref(), format, sql, stream, &output)
                            .await?
                    }
                    None => cli::export_direct(&cfg, format, sql, stream, &output).await?,
                };
                eprintln!("export: wrote {bytes} bytes to {}", output.display());
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

/// The CLI's key command as the service call it stands for.
fn action_to_request(action: KeysAction) -> anyhow::Result<cli::KeysRequest> {
    Ok(match action {
        KeysAction::Create {
            name,
            role,
            streams,
            expires_in_secs,
        } => cli::KeysRequest::Create(loomem::service::keys::CreateKey {
            name,
            role: role
                .parse()
                .map_err(|e: loomem::core::Error| anyhow::anyhow!("--role: {e}"))?,
            streams,
            expires_in_secs,
        }),
        KeysAction::List => cli::KeysRequest::List,
        KeysAction::Rotate { id, grace_secs } => {
            cli::KeysRequest::Rotate(id, loomem::service::keys::RotateKey { grace_secs })
        }
        KeysAction::Revoke { id } => cli::KeysRequest::Revoke(id),
    })
}
