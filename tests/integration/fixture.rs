//! A real daemon on 127.0.0.1:0 over a temp data dir, started through the same
//! `server::serve` the binary uses; stopped (gracefully) on `stop` or drop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use loomem::app::config::Config;

use crate::nats::NatsServer;

pub const ADMIN_TOKEN: &str = "admin-secret-token";
pub const TOKEN_A: &str = "token-for-stream-a";
/// A second scoped key (`agent-b`, stream `b`).
pub const TOKEN_B: &str = "token-for-stream-b";

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// How a test wants its daemon configured.
#[derive(Clone, Default)]
pub struct Options {
    /// Set the admin token and two scoped tokens (`agent-a`: streams `a` and
    /// `a2`; `agent-b`: stream `b`).
    pub auth: bool,
    /// Use the in-process bus instead of a real nats-server.
    pub embedded: bool,
    /// Extra `LOOMEM_*` overrides.
    pub env: Vec<(String, String)>,
}

impl Options {
    pub fn with_auth() -> Options {
        Options {
            auth: true,
            ..Default::default()
        }
    }

    pub fn embedded() -> Options {
        Options {
            embedded: true,
            ..Default::default()
        }
    }

    /// Embed with the real MiniLM model (the tests default to the hash embedder).
    pub fn minilm(self) -> Options {
        self.env("LOOMEM_EMBED__PROVIDER", "minilm")
    }

    pub fn env(mut self, key: &str, value: &str) -> Options {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    pub fn envs(mut self, vars: Vec<(String, String)>) -> Options {
        self.env.extend(vars);
        self
    }
}

pub struct Daemon {
    pub url: String,
    /// The daemon's own nats-server (JetStream bus).
    pub nats: Option<NatsServer>,
    pub http: reqwest::Client,
    pub data_dir: PathBuf,
    token: Option<String>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    // Owns the temp dir when this daemon created it.
    _dir: Option<tempfile::TempDir>,
}

/// Run the `loomem` binary on `config` with its environment (logs at
/// `warn`); its output, once it has exited successfully.
pub async fn cli_ok<I, S>(
    config: &Path,
    env: &HashMap<String, String>,
    args: I,
) -> std::process::Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_loomem"))
        .arg("--config")
        .arg(config)
        .args(args)
        .envs(env)
        .env("LOOMEM_LOG", "warn")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The environment a daemon is started with, and the config file it reads.
/// `nats_url` is the JetStream server to use (None = the embedded bus).
pub fn daemon_env(
    data_dir: &Path,
    nats_url: Option<&str>,
    opts: &Options,
) -> (PathBuf, HashMap<String, String>) {
    let mut env: HashMap<String, String> = HashMap::new();
    env.insert(
        "LOOMEM_STORAGE__DATA_DIR".into(),
        data_dir.display().to_string(),
    );
    env.insert("LOOMEM_SERVER__PORT".into(), "0".into());
    match nats_url {
        Some(url) => {
            env.insert("LOOMEM_BUS__KIND".into(), "jetstream".into());
            env.insert("LOOMEM_BUS__NATS_URL".into(), url.into());
        }
        None => {
            env.insert("LOOMEM_BUS__KIND".into(), "embedded".into());
        }
    }
    env.insert("LOOMEM_EMBED__PROVIDER".into(), "hash".into());
    // Where setup put the model, when not in the default place.
    if let Ok(dir) = std::env::var("LOOMEM_EMBED__MODEL_DIR") {
        env.insert("LOOMEM_EMBED__MODEL_DIR".into(), dir);
    }
    if opts.auth {
        env.insert("LOOMEM_AUTH_TOKEN".into(), ADMIN_TOKEN.into());
        env.insert("TEST_TOKEN_A".into(), TOKEN_A.into());
        env.insert("TEST_TOKEN_B".into(), TOKEN_B.into());
    }
    for (k, v) in &opts.env {
        env.insert(k.clone(), v.clone());
    }
    (repo_root().join("config.toml"), env)
}

impl Daemon {
    pub async fn start(opts: Options) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        let mut d = Daemon::start_at(&data, opts).await;
        d._dir = Some(dir);
        d
    }

    /// Start on an existing data directory (the caller owns it), with a
    /// nats-server of its own whose JetStream data lives beside it.
    pub async fn start_at(data_dir: &Path, opts: Options) -> Daemon {
        let nats = (!opts.embedded).then(|| NatsServer::start(&data_dir.with_extension("nats")));
        Daemon::start_with(data_dir, nats, opts).await
    }

    /// Start against a given nats-server (or the embedded bus when None).
    pub async fn start_with(data_dir: &Path, nats: Option<NatsServer>, opts: Options) -> Daemon {
        let url = nats.as_ref().map(NatsServer::url);
        let (config_path, env) = daemon_env(data_dir, url.as_deref(), &opts);
        let mut cfg = Config::load(&config_path, &env).expect("config loads");
        if opts.auth {
            cfg.server.tokens.push(loomem::service::auth::ScopedToken {
                name: "agent-a".into(),
                token_env: "TEST_TOKEN_A".into(),
                streams: vec!["a".into(), "a2".into()],
            });
            cfg.server.tokens.push(loomem::service::auth::ScopedToken {
                name: "agent-b".into(),
                token_env: "TEST_TOKEN_B".into(),
                streams: vec!["b".into()],
            });
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loomem::api::server::serve(cfg, env, listener, async move {
                let _ = stop_rx.await;
            })
            .await
            .expect("daemon runs");
        });
        let d = Daemon {
            url: format!("http://{addr}"),
            nats,
            http: reqwest::Client::new(),
            data_dir: data_dir.to_path_buf(),
            token: opts.auth.then(|| ADMIN_TOKEN.to_string()),
            stop: Some(stop_tx),
            task: Some(task),
            _dir: None,
        };
        d.wait_healthy().await;
        d
    }

    async fn wait_healthy(&self) {
        for _ in 0..200 {
            if let Ok(r) = self.http.get(format!("{}/health", self.url)).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        panic!("daemon at {} never became healthy", self.url);
    }

    /// Graceful stop: in-flight requests finish, the writer flushes. Returns
    /// the nats-server (still running) and the temp dir, for a restart.
    pub async fn stop(mut self) -> (Option<NatsServer>, Option<tempfile::TempDir>) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.expect("daemon task");
        }
        (self.nats.take(), self._dir.take())
    }

    /// Send a request with this daemon's admin token (if any).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(self.token.as_deref(), method, path, body)
            .await
    }

    /// Send a request with the given bearer token (or none).
    pub async fn call_as(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(
            method.parse().expect("method"),
            format!("{}{}", self.url, path),
        );
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request sent");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, json)
    }

    /// A request as Neuroloom's clients send it: `Authorization: Token <key>`.
    pub async fn call_token(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let auth = format!("Token {token}");
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        self.send(
            None,
            method,
            path,
            (!bytes.is_empty()).then_some("application/json"),
            &[("authorization", auth.as_str())],
            bytes,
        )
        .await
    }

    /// Raw body bytes sent as JSON, for malformed-input tests.
    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        self.send(
            self.token.as_deref(),
            "POST",
            path,
            Some("application/json"),
            &[],
            body,
        )
        .await
    }

    /// The admin token requests carry (None without auth).
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Any request: token, content type, extra headers and raw body as given.
    pub async fn send(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(
                method.parse().expect("method"),
                format!("{}{}", self.url, path),
            )
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.expect("request sent");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, json)
    }

    /// The rows of a `/v1/sql` query (JSON), asserting it succeeded.
    pub async fn sql(&self, query: &str) -> Vec<Value> {
        let (status, body) = self
            .call("POST", "/v1/sql", Some(serde_json::json!({ "sql": query })))
            .await;
        assert_eq!(status, 200, "{body}");
        body["rows"].as_array().cloned().expect("rows")
    }

    pub async fn store(&self, content: &str, stream: &str) -> String {
        let (status, body) = self
            .call(
                "POST",
                "/v1/store",
                Some(serde_json::json!({"content": content, "stream": stream})),
            )
            .await;
        assert_eq!(status, 200, "store failed: {body}");
        assert_eq!(body["status"], "stored");
        body["id"].as_str().expect("id").to_string()
    }

    /// Ids of a search's results, best first.
    pub async fn search_ids(&self, body: Value) -> Vec<String> {
        let (status, resp) = self.call("POST", "/v1/search", Some(body)).await;
        assert_eq!(status, 200, "search failed: {resp}");
        resp["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|r| r["chunk_id"].as_str().expect("chunk_id").to_string())
            .collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}
