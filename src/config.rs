//! Typed daemon configuration: parse `config.toml`, apply `LOOMEM_<SECTION>__<KEY>`
//! environment overrides, then validate. Loading is a pure function of the file text
//! and an environment map, so tests call it directly.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// `~/x` → `$HOME/x` (HOME from the given environment, else the process's).
fn expand_home(path: &Path, env: &HashMap<String, String>) -> PathBuf {
    match path.strip_prefix("~") {
        Ok(rest) => {
            let home = env
                .get("HOME")
                .cloned()
                .or_else(|| std::env::var("HOME").ok())
                .unwrap_or_else(|| "/".into());
            PathBuf::from(home).join(rest)
        }
        Err(_) => path.to_path_buf(),
    }
}

/// The prefix every override variable starts with; sections and keys are joined by `__`.
pub const ENV_PREFIX: &str = "LOOMEM_";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config is not valid TOML: {0}")]
    Syntax(String),
    #[error("environment override {var}: {message}")]
    Env { var: String, message: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
}

/// An OpenAI-compatible endpoint of `section`: an http(s) base URL and a model.
fn check_endpoint(
    section: &str,
    base_url: &str,
    model: &str,
    when: &str,
) -> Result<(), ConfigError> {
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        return Err(invalid(
            &format!("{section}.base_url"),
            format!("must be an http(s) URL {when}"),
        ));
    }
    if model.trim().is_empty() {
        return Err(invalid(
            &format!("{section}.model"),
            format!("must name a model {when}"),
        ));
    }
    Ok(())
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        message: message.into(),
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub bus: BusConfig,
    pub pipeline: PipelineConfig,
    pub embed: EmbedConfig,
    #[serde(default)]
    pub llm: LlmConfig,
    #[serde(default)]
    pub ingest: IngestConfig,
    pub search: SearchConfig,
    pub sql: SqlConfig,
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    /// Human-readable labels mapped to stream ids (`personal = "100"`).
    #[serde(default)]
    pub namespaces: BTreeMap<String, String>,
    /// The directory the config file was read from; relative paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Name of the environment variable holding the admin API key.
    pub auth_token_env: String,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// How long `/v1/store` waits for the pipeline to commit before answering 504.
    pub store_timeout_ms: u64,
    /// Tokens limited to some streams, each read from its own environment variable.
    #[serde(default)]
    pub tokens: Vec<ScopedToken>,
    /// `Host` headers `/mcp` accepts (DNS-rebinding protection); `"*"` = any.
    #[serde(default = "default_mcp_hosts")]
    pub mcp_allowed_hosts: Vec<String>,
}

fn default_mcp_hosts() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopedToken {
    /// A label for logs and `/v1/whoami`.
    pub name: String,
    /// The environment variable that holds the token.
    pub token_env: String,
    /// The streams this token may read and write; the first is its default stream.
    pub streams: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    /// Most rows the writer folds into one Lance commit.
    pub write_batch_max_rows: usize,
    /// Reads see commits made by other loomem processes within this many ms.
    pub read_consistency_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusKind {
    Embedded,
    Jetstream,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusConfig {
    pub kind: BusKind,
    pub nats_url: String,
    /// Most messages the worker pulls into one pipeline batch.
    pub batch_size: usize,
    /// How long the worker waits to fill a batch, in milliseconds.
    pub batch_wait_ms: u64,
    /// Deliveries of one message before it goes to `dead_letters`.
    pub max_deliver: u32,
    /// Capacity of the in-process queue (`embedded` bus).
    pub queue_capacity: usize,
    /// JetStream stream holding every write (subjects `loomem.in.<stream>`).
    pub stream_name: String,
    /// Durable pull consumer shared by every loomem worker (a work queue).
    pub consumer_name: String,
    /// How long a delivered message may stay unacknowledged before redelivery.
    pub ack_wait_ms: u64,
    /// Window in which JetStream drops a repeated `Nats-Msg-Id`.
    pub duplicate_window_secs: u64,
    /// Size cap of the JetStream stream in bytes (-1 = unlimited).
    pub max_bytes: i64,
    /// Most delivered-but-unacknowledged messages per consumer.
    pub max_ack_pending: i64,
    /// How long a publish waits for JetStream's acknowledgement.
    pub publish_timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Directory of pipeline definitions (`store.toml`, …), relative to the config file.
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbedProvider {
    /// sentence-transformers all-MiniLM-L6-v2, in-process (candle).
    Minilm,
    /// An OpenAI-compatible `/v1/embeddings` endpoint.
    Openai,
    /// Feature hashing; no model (tests, benches).
    Hash,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedConfig {
    pub provider: EmbedProvider,
    /// Vector dimension; fixed for the life of a data directory.
    pub dim: usize,
    /// MiniLM: directory holding config.json, model.safetensors, tokenizer.json
    /// (`~/` is the home directory).
    #[serde(default = "default_model_dir")]
    pub model_dir: PathBuf,
    /// MiniLM: longer texts are truncated to this many tokens.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// Texts per forward pass (MiniLM) or per request (OpenAI).
    #[serde(default = "default_embed_batch")]
    pub batch_size: usize,
    /// OpenAI: base URL, e.g. `https://api.openai.com/v1`.
    #[serde(default)]
    pub base_url: String,
    /// OpenAI: model name sent with each request and recorded in `embed_model`.
    #[serde(default)]
    pub model: String,
    /// OpenAI: environment variable holding the API key (empty = no key).
    #[serde(default)]
    pub api_key_env: String,
    /// OpenAI: per-request timeout.
    #[serde(default = "default_embed_timeout")]
    pub timeout_ms: u64,
    /// OpenAI: retries after a 429, a 5xx or a transport error.
    #[serde(default = "default_embed_retries")]
    pub max_retries: u32,
}

fn default_model_dir() -> PathBuf {
    PathBuf::from("~/.cache/loomem/models/all-MiniLM-L6-v2")
}
fn default_max_tokens() -> usize {
    256
}
fn default_embed_batch() -> usize {
    32
}
fn default_embed_timeout() -> u64 {
    30_000
}
fn default_embed_retries() -> u32 {
    3
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// Base URL of an OpenAI-compatible endpoint (`…/v1`); empty = no LLM.
    #[serde(default)]
    pub base_url: String,
    #[serde(default)]
    pub model: String,
    /// Environment variable holding the API key (empty = no key).
    #[serde(default)]
    pub api_key_env: String,
    #[serde(default = "default_llm_timeout")]
    pub timeout_ms: u64,
    /// Retries after a 429, a 5xx or a transport error.
    #[serde(default = "default_llm_retries")]
    pub max_retries: u32,
    /// Longest answer asked for, in tokens.
    #[serde(default = "default_llm_max_tokens")]
    pub max_output_tokens: u32,
    /// Prices in dollars per million tokens, for `cost_usd`.
    #[serde(default)]
    pub input_cost_per_mtok: f64,
    #[serde(default)]
    pub output_cost_per_mtok: f64,
    /// Dollars a stream may spend on LLM calls per UTC day; past it the LLM-free
    /// paths take over (ingestion never stops).
    #[serde(default = "default_llm_cap")]
    pub daily_cost_cap_usd: f64,
    /// Queue new memories for LLM entity extraction.
    #[serde(default = "yes")]
    pub ner: bool,
    /// Ask the LLM whether a new memory updates an earlier one when the rules
    /// find no update cue.
    #[serde(default = "yes")]
    pub judge_contradictions: bool,
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            base_url: String::new(),
            model: String::new(),
            api_key_env: String::new(),
            timeout_ms: default_llm_timeout(),
            max_retries: default_llm_retries(),
            max_output_tokens: default_llm_max_tokens(),
            input_cost_per_mtok: 0.0,
            output_cost_per_mtok: 0.0,
            daily_cost_cap_usd: default_llm_cap(),
            ner: true,
            judge_contradictions: true,
        }
    }
}

impl LlmConfig {
    pub fn enabled(&self) -> bool {
        !self.base_url.trim().is_empty()
    }
}

fn default_llm_timeout() -> u64 {
    60_000
}
fn default_llm_retries() -> u32 {
    2
}
fn default_llm_max_tokens() -> u32 {
    1024
}
fn default_llm_cap() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchConfig {
    /// Reciprocal-rank-fusion constant k.
    pub rrf_k: f32,
    pub bm25_weight: f32,
    pub vector_weight: f32,
    /// Candidates each leg returns before fusion.
    pub candidates: usize,
    /// Vector hits less similar than this (cosine) are not candidates.
    pub min_similarity: f32,
    /// Fusion weight of the entity-graph leg (entities named in the query).
    #[serde(default = "default_graph_weight")]
    pub graph_weight: f32,
    /// How much age counts: a result's score is multiplied by
    /// `(1 - decay_weight) + decay_weight * 0.5^(age / half_life)`; pinned
    /// memories are exempt. 0 turns decay off.
    #[serde(default = "default_decay_weight")]
    pub decay_weight: f32,
    /// Half-life in days per memory type; `default` covers the unlisted ones.
    #[serde(default = "default_half_lives")]
    pub half_life_days: BTreeMap<String, f64>,
    /// Score multiplied by `importance ^ importance_weight`.
    #[serde(default = "default_importance_weight")]
    pub importance_weight: f32,
    /// Each feedback signal moves the score by this fraction (usefulness 4:
    /// `+w`, 0: `-w`, harmful: `-2w`), within [0.1, 3].
    #[serde(default = "default_feedback_weight")]
    pub feedback_weight: f32,
    /// Implicit boost of recalled memories: `1 + access_boost * ln(1 + access_count)`.
    #[serde(default = "default_access_boost")]
    pub access_boost: f32,
    /// Results whose word sets overlap at least this much (Jaccard) collapse into the best one.
    #[serde(default = "default_near_duplicate")]
    pub near_duplicate: f32,
    /// Access counters are buffered and written in one commit this often.
    #[serde(default = "default_access_flush_ms")]
    pub access_flush_ms: u64,
    /// Above this many embedded rows the vector leg uses an ANN index (IVF-HNSW-SQ),
    /// built in the background; below it the search is exact.
    #[serde(default = "default_vector_index_min_rows")]
    pub vector_index_min_rows: usize,
}

fn default_graph_weight() -> f32 {
    0.5
}
fn default_decay_weight() -> f32 {
    0.3
}
fn default_importance_weight() -> f32 {
    0.1
}
fn default_feedback_weight() -> f32 {
    0.1
}
fn default_access_boost() -> f32 {
    0.02
}
fn default_near_duplicate() -> f32 {
    0.9
}
fn default_access_flush_ms() -> u64 {
    2000
}
fn default_vector_index_min_rows() -> usize {
    100_000
}
fn default_half_lives() -> BTreeMap<String, f64> {
    [
        ("correction", 180.0),
        ("preference", 180.0),
        ("decision", 90.0),
        ("general", 60.0),
        ("project", 30.0),
        ("observation", 14.0),
        ("default", 60.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

impl SearchConfig {
    /// The half-life of a memory type, in days.
    pub fn half_life(&self, memory_type: &str) -> f64 {
        self.half_life_days
            .get(memory_type)
            .or_else(|| self.half_life_days.get("default"))
            .copied()
            .unwrap_or(60.0)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlConfig {
    /// A query running longer is cancelled (504).
    pub timeout_ms: u64,
    /// Memory a query may use for sorts, joins and aggregations.
    pub memory_limit_mb: usize,
    /// Rows returned when a request names no `max_rows`.
    pub default_max_rows: usize,
    /// The largest `max_rows` accepted.
    pub max_rows_cap: usize,
}

impl SqlConfig {
    pub fn limits(&self) -> crate::sql::SqlLimits {
        crate::sql::SqlLimits {
            timeout: std::time::Duration::from_millis(self.timeout_ms),
            memory_bytes: self.memory_limit_mb * 1024 * 1024,
            default_max_rows: self.default_max_rows,
            max_rows_cap: self.max_rows_cap,
        }
    }
}

/// `POST /v1/ingest`: conversations in, facts out.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    /// The rule extractor's patterns (relative to the config file's directory).
    #[serde(default = "default_rules_file")]
    pub rules_file: PathBuf,
    /// Longest transcript accepted, in characters.
    #[serde(default = "default_transcript_chars")]
    pub max_transcript_chars: usize,
    /// Extract with the LLM when one is configured (the rules otherwise).
    #[serde(default = "yes")]
    pub use_llm: bool,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            rules_file: default_rules_file(),
            max_transcript_chars: default_transcript_chars(),
            use_llm: true,
        }
    }
}

fn default_rules_file() -> PathBuf {
    PathBuf::from("pipelines/extract/facts.toml")
}
fn default_transcript_chars() -> usize {
    200_000
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    #[serde(default)]
    pub enabled: bool,
    /// A stream quiet this many seconds after a write is dreamed once (its
    /// memories consolidated); 0 = never. Independent of `enabled`.
    #[serde(default = "default_dream_after_idle")]
    pub dream_after_idle_secs: u64,
    /// Per job (`dream`, `decay`, `compact`, …): its cron and params.
    #[serde(default)]
    pub jobs: BTreeMap<String, JobConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// Six fields (seconds first) or seven (with years); day names
    /// (`MON-FRI`) rather than numbers.
    pub cron: String,
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
    /// The job's own parameters.
    #[serde(default)]
    pub params: toml::Table,
}

fn default_dream_after_idle() -> u64 {
    1800
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            enabled: false,
            dream_after_idle_secs: default_dream_after_idle(),
            jobs: BTreeMap::new(),
        }
    }
}

fn enabled_by_default() -> bool {
    true
}

impl Config {
    /// Read `path`, apply overrides from `env`, validate.
    pub fn load(path: &Path, env: &HashMap<String, String>) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Self::parse(&text, env, base)
    }

    /// Parse TOML text with overrides from `env`; relative paths resolve against `base_dir`.
    pub fn parse(
        text: &str,
        env: &HashMap<String, String>,
        base_dir: PathBuf,
    ) -> Result<Config, ConfigError> {
        let mut root: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax(e.to_string()))?;
        apply_env_overrides(&mut root, env)?;
        let mut cfg: Config =
            serde_path_to_error::deserialize(toml::Value::Table(root)).map_err(|e| {
                let key = e.path().to_string();
                invalid(&key, e.into_inner().to_string())
            })?;
        cfg.base_dir = base_dir;
        cfg.embed.model_dir = expand_home(&cfg.embed.model_dir, env);
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.server.host.trim().is_empty() {
            return Err(invalid("server.host", "must not be empty"));
        }
        if self.server.auth_token_env.trim().is_empty() {
            return Err(invalid("server.auth_token_env", "must name a variable"));
        }
        if self.server.max_body_bytes < 1024 {
            return Err(invalid("server.max_body_bytes", "must be at least 1024"));
        }
        for (i, t) in self.server.tokens.iter().enumerate() {
            if t.streams.is_empty() {
                return Err(invalid(
                    &format!("server.tokens[{i}].streams"),
                    "must list at least one stream",
                ));
            }
        }
        if self.storage.data_dir.as_os_str().is_empty() {
            return Err(invalid("storage.data_dir", "must not be empty"));
        }
        if self.storage.write_batch_max_rows == 0 {
            return Err(invalid("storage.write_batch_max_rows", "must be > 0"));
        }
        if self.bus.batch_size == 0 {
            return Err(invalid("bus.batch_size", "must be > 0"));
        }
        if self.bus.max_deliver == 0 {
            return Err(invalid("bus.max_deliver", "must be > 0"));
        }
        if self.bus.queue_capacity == 0 {
            return Err(invalid("bus.queue_capacity", "must be > 0"));
        }
        if self.bus.kind == BusKind::Jetstream && !self.bus.nats_url.starts_with("nats://") {
            return Err(invalid("bus.nats_url", "must start with nats://"));
        }
        for (key, name) in [
            ("bus.stream_name", &self.bus.stream_name),
            ("bus.consumer_name", &self.bus.consumer_name),
        ] {
            let ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                return Err(invalid(key, "must be letters, digits, - or _"));
            }
        }
        if self.bus.ack_wait_ms < 100 {
            return Err(invalid("bus.ack_wait_ms", "must be at least 100"));
        }
        if self.bus.max_ack_pending < 1 {
            return Err(invalid("bus.max_ack_pending", "must be > 0"));
        }
        if !(8..=4096).contains(&self.embed.dim) {
            return Err(invalid("embed.dim", "must be between 8 and 4096"));
        }
        if self.embed.batch_size == 0 {
            return Err(invalid("embed.batch_size", "must be > 0"));
        }
        match self.embed.provider {
            EmbedProvider::Minilm if self.embed.dim != 384 => {
                return Err(invalid("embed.dim", "must be 384 for the minilm provider"));
            }
            EmbedProvider::Minilm if !(8..=512).contains(&self.embed.max_tokens) => {
                return Err(invalid("embed.max_tokens", "must be between 8 and 512"));
            }
            EmbedProvider::Openai => check_endpoint(
                "embed",
                &self.embed.base_url,
                &self.embed.model,
                "for the openai provider",
            )?,
            _ => {}
        }
        if self.llm.enabled() {
            check_endpoint(
                "llm",
                &self.llm.base_url,
                &self.llm.model,
                "when llm.base_url is set (empty = no LLM)",
            )?;
        }
        for (key, v) in [
            ("llm.input_cost_per_mtok", self.llm.input_cost_per_mtok),
            ("llm.output_cost_per_mtok", self.llm.output_cost_per_mtok),
            ("llm.daily_cost_cap_usd", self.llm.daily_cost_cap_usd),
        ] {
            if v < 0.0 || !v.is_finite() {
                return Err(invalid(key, "must be a number >= 0"));
            }
        }
        if self.search.rrf_k <= 0.0 || !self.search.rrf_k.is_finite() {
            return Err(invalid("search.rrf_k", "must be a positive number"));
        }
        for (key, w) in [
            ("search.bm25_weight", self.search.bm25_weight),
            ("search.vector_weight", self.search.vector_weight),
            ("search.graph_weight", self.search.graph_weight),
            ("search.importance_weight", self.search.importance_weight),
            ("search.feedback_weight", self.search.feedback_weight),
            ("search.access_boost", self.search.access_boost),
        ] {
            if w < 0.0 || !w.is_finite() {
                return Err(invalid(key, "must be >= 0"));
            }
        }
        if !(-1.0..=1.0).contains(&self.search.min_similarity) {
            return Err(invalid("search.min_similarity", "must be between -1 and 1"));
        }
        if self.sql.timeout_ms == 0 || self.sql.memory_limit_mb == 0 {
            return Err(invalid("sql", "timeout_ms and memory_limit_mb must be > 0"));
        }
        if self.sql.default_max_rows == 0 || self.sql.default_max_rows > self.sql.max_rows_cap {
            return Err(invalid(
                "sql.default_max_rows",
                "must be between 1 and sql.max_rows_cap",
            ));
        }
        if self.search.candidates == 0 {
            return Err(invalid("search.candidates", "must be > 0"));
        }
        if !(0.0..=1.0).contains(&self.search.decay_weight) {
            return Err(invalid("search.decay_weight", "must be between 0 and 1"));
        }
        if !(self.search.near_duplicate > 0.0 && self.search.near_duplicate <= 1.0) {
            return Err(invalid(
                "search.near_duplicate",
                "must be in (0, 1] (1 = only identical word sets)",
            ));
        }
        for (ty, days) in &self.search.half_life_days {
            if !(*days > 0.0 && days.is_finite()) {
                return Err(invalid(
                    &format!("search.half_life_days.{ty}"),
                    "must be a positive number of days",
                ));
            }
        }
        for (name, job) in &self.scheduler.jobs {
            if !crate::jobs::JOB_NAMES.contains(&name.as_str()) {
                return Err(invalid(
                    &format!("scheduler.jobs.{name}"),
                    format!("no such job (jobs: {})", crate::jobs::JOB_NAMES.join(", ")),
                ));
            }
            crate::jobs::scheduler::Scheduled::new(name, &job.cron)
                .map_err(|m| invalid(&format!("scheduler.jobs.{name}.cron"), m))?;
        }
        if self.search.access_flush_ms == 0 {
            return Err(invalid("search.access_flush_ms", "must be > 0"));
        }
        Ok(())
    }

    /// `path` resolved against the config file's directory when relative.
    /// (`embed.model_dir` has already had `~/` expanded.)
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.resolve(&self.storage.data_dir)
    }

    pub fn pipelines_dir(&self) -> PathBuf {
        self.resolve(&self.pipeline.dir)
    }

    pub fn ingest_rules_file(&self) -> PathBuf {
        self.resolve(&self.ingest.rules_file)
    }
}

/// Apply every `LOOMEM_<SECTION>__<KEY>=value` variable to the parsed table. The
/// value takes the type of the key it replaces; a new key is read as a TOML
/// literal when it is one, else as a string.
fn apply_env_overrides(
    root: &mut toml::Table,
    env: &HashMap<String, String>,
) -> Result<(), ConfigError> {
    let mut vars: Vec<_> = env
        .iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k.contains("__"))
        .collect();
    vars.sort();
    for (var, raw) in vars {
        let path: Vec<String> = var[ENV_PREFIX.len()..]
            .split("__")
            .map(|p| p.to_ascii_lowercase())
            .collect();
        if path.iter().any(|p| p.is_empty()) {
            return Err(ConfigError::Env {
                var: var.clone(),
                message: "empty section or key name".into(),
            });
        }
        let (leaf, sections) = path.split_last().expect("split yields a part");
        let mut table = &mut *root;
        for section in sections {
            let entry = table
                .entry(section.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            table = entry.as_table_mut().ok_or_else(|| ConfigError::Env {
                var: var.clone(),
                message: format!("`{section}` is not a section"),
            })?;
        }
        let value = typed_override(table.get(leaf), raw).map_err(|message| ConfigError::Env {
            var: var.clone(),
            message,
        })?;
        table.insert(leaf.clone(), value);
    }
    Ok(())
}

fn typed_override(existing: Option<&toml::Value>, raw: &str) -> Result<toml::Value, String> {
    use toml::Value;
    match existing {
        Some(Value::String(_)) => Ok(Value::String(raw.to_string())),
        Some(Value::Integer(_)) => raw
            .trim()
            .parse::<i64>()
            .map(Value::Integer)
            .map_err(|_| format!("expected an integer, got {raw:?}")),
        Some(Value::Float(_)) => raw
            .trim()
            .parse::<f64>()
            .map(Value::Float)
            .map_err(|_| format!("expected a number, got {raw:?}")),
        Some(Value::Boolean(_)) => match raw.trim() {
            "true" | "1" => Ok(Value::Boolean(true)),
            "false" | "0" => Ok(Value::Boolean(false)),
            _ => Err(format!("expected true or false, got {raw:?}")),
        },
        Some(Value::Array(_)) | Some(Value::Table(_)) | None => {
            match format!("v = {raw}").parse::<toml::Table>() {
                Ok(mut t) => Ok(t.remove("v").expect("parsed key")),
                Err(_) if existing.is_none() => Ok(Value::String(raw.to_string())),
                Err(e) => Err(format!("expected a TOML value: {e}")),
            }
        }
        Some(Value::Datetime(_)) => Err("datetime keys cannot be overridden".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> String {
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")).unwrap()
    }

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn shipped_config_parses_with_documented_defaults() {
        let cfg = Config::parse(&shipped(), &HashMap::new(), PathBuf::from(".")).unwrap();
        assert_eq!(cfg.server.port, 3030);
        assert_eq!(cfg.server.auth_token_env, "LOOMEM_AUTH_TOKEN");
        assert_eq!(cfg.storage.data_dir, PathBuf::from("./data"));
        assert_eq!(cfg.embed.dim, 384);
        assert_eq!(cfg.bus.kind, BusKind::Jetstream);
        assert_eq!(cfg.bus.nats_url, "nats://127.0.0.1:4222");
    }

    #[test]
    fn env_overrides_take_the_type_of_the_key() {
        let cfg = Config::parse(
            &shipped(),
            &env(&[
                ("LOOMEM_SERVER__PORT", "8080"),
                ("LOOMEM_STORAGE__DATA_DIR", "/var/lib/loomem"),
                ("LOOMEM_BUS__KIND", "embedded"),
                ("LOOMEM_EMBED__PROVIDER", "hash"),
                ("LOOMEM_NAMESPACES__WORK", "110"),
                ("LOOMEM_AUTH_TOKEN", "not-a-key-path"),
            ]),
            PathBuf::from("."),
        )
        .unwrap();
        assert_eq!(cfg.server.port, 8080);
        assert_eq!(cfg.storage.data_dir, PathBuf::from("/var/lib/loomem"));
        assert_eq!(cfg.bus.kind, BusKind::Embedded);
        assert_eq!(cfg.namespaces.get("work").map(String::as_str), Some("110"));
    }

    #[test]
    fn bad_env_value_names_the_variable() {
        let err = Config::parse(
            &shipped(),
            &env(&[("LOOMEM_SERVER__PORT", "eighty")]),
            PathBuf::from("."),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("LOOMEM_SERVER__PORT"), "{err}");
    }

    #[test]
    fn invalid_values_name_the_key() {
        let cases = [
            ("LOOMEM_BUS__KIND", "kafka", "bus.kind"),
            ("LOOMEM_SERVER__PORT", "70000", "server.port"),
            ("LOOMEM_BUS__BATCH_SIZE", "0", "bus.batch_size"),
            ("LOOMEM_SEARCH__RRF_K", "-1.0", "search.rrf_k"),
            ("LOOMEM_SERVER__PROT", "1", "server"),
            ("LOOMEM_LLM__BASE_URL", "ftp://llm", "llm.base_url"),
            ("LOOMEM_LLM__BASE_URL", "http://llm/v1", "llm.model"),
            (
                "LOOMEM_LLM__DAILY_COST_CAP_USD",
                "-1.0",
                "llm.daily_cost_cap_usd",
            ),
            ("LOOMEM_EMBED__PROVIDER", "openai", "embed.base_url"),
        ];
        for (var, value, key) in cases {
            let err = Config::parse(&shipped(), &env(&[(var, value)]), PathBuf::from("."))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{var}={value}: {err}");
        }
    }

    #[test]
    fn relative_paths_resolve_against_the_config_dir() {
        let cfg = Config::parse(&shipped(), &HashMap::new(), PathBuf::from("/etc/loomem")).unwrap();
        assert_eq!(cfg.data_dir(), PathBuf::from("/etc/loomem/./data"));
        assert_eq!(cfg.pipelines_dir(), PathBuf::from("/etc/loomem/pipelines"));
    }
}
