//! Typed daemon configuration: parse `config.toml`, apply `LOOMEM_<SECTION>__<KEY>`
//! environment overrides, then validate. Loading is a pure function of the file text
//! and an environment map, so tests call it directly.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use crate::bus::config::{BusConfig, BusKind};
pub use crate::jobs::config::{JobConfig, SchedulerConfig};
pub use crate::pipeline::config::PipelineConfig;
pub use crate::providers::embed::config::{EmbedConfig, EmbedProvider};
pub use crate::providers::llm::LlmConfig;
pub use crate::service::auth::{ScopedToken, ServerConfig};
pub use crate::service::conversation::IngestConfig;
pub use crate::service::search::config::SearchConfig;
pub use crate::service::sql::SqlConfig;
pub use crate::store::config::StorageConfig;

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
    #[serde(default)]
    pub oauth: crate::service::oauth::OAuthConfig,
    /// The directory the config file was read from; relative paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// The object store settings buckets are opened with (the data's and
    /// exports'): `[storage.object_store]` over the `AWS_*` environment.
    #[serde(skip)]
    pub object_settings: BTreeMap<String, String>,
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
        cfg.object_settings = crate::store::location::settings(&cfg.storage.object_store, env)
            .map_err(|e| invalid("storage.object_store", e.to_string()))?;
        cfg.parse_data_dir()
            .map_err(|e| invalid("storage.data_dir", e.to_string()))?;
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
        self.server
            .rate_limit
            .validate()
            .map_err(|e| invalid("server.rate_limit", &e))?;
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
        if self.storage.target_rows_per_fragment == 0 {
            return Err(invalid("storage.target_rows_per_fragment", "must be > 0"));
        }
        if self.storage.max_fragments == 0 {
            return Err(invalid("storage.max_fragments", "must be > 0"));
        }
        if self.storage.pre_delete_snapshots == 0 {
            return Err(invalid(
                "storage.pre_delete_snapshots",
                "must be > 0: a bulk delete keeps its snapshot",
            ));
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
        if self.bus.pack_writes == 0 {
            return Err(invalid(
                "bus.pack_writes",
                "must be > 0 (1: a message a write)",
            ));
        }
        if !(8..=4096).contains(&self.embed.dim) {
            return Err(invalid("embed.dim", "must be between 8 and 4096"));
        }
        if self.embed.batch_size == 0 {
            return Err(invalid("embed.batch_size", "must be > 0"));
        }
        if !(0..=19).contains(&self.embed.batch_niceness) {
            return Err(invalid("embed.batch_niceness", "must be between 0 and 19"));
        }
        match self.embed.provider {
            EmbedProvider::Minilm | EmbedProvider::Static if self.embed.dim != 384 => {
                return Err(invalid(
                    "embed.dim",
                    "must be 384 for the minilm and static providers",
                ));
            }
            EmbedProvider::Minilm | EmbedProvider::Static
                if !(8..=512).contains(&self.embed.max_tokens) =>
            {
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
            ("search.time_weight", self.search.time_weight),
            ("search.time_weight_day", self.search.time_weight_day),
        ] {
            if w < 0.0 || !w.is_finite() {
                return Err(invalid(key, "must be >= 0"));
            }
        }
        for (key, w) in [
            ("search.assistant_weight", self.search.assistant_weight),
            ("search.decay_weight", self.search.decay_weight),
            (
                "search.session_rest_weight",
                self.search.session_rest_weight,
            ),
        ] {
            if !(0.0..=1.0).contains(&w) {
                return Err(invalid(key, "must be between 0 and 1"));
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
        if !(0..=19).contains(&self.search.read_niceness) {
            return Err(invalid("search.read_niceness", "must be between 0 and 19"));
        }
        if self.search.candidates == 0 {
            return Err(invalid("search.candidates", "must be > 0"));
        }
        if self.search.session_pool > crate::service::search::MAX_TOP_K {
            return Err(invalid(
                "search.session_pool",
                format!("must be at most {}", crate::service::search::MAX_TOP_K),
            ));
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
                .map_err(|e| invalid(&format!("scheduler.jobs.{name}.cron"), e.to_string()))?;
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

    /// Where the tables live: `storage.data_dir` as it is now (a caller
    /// may point it elsewhere after loading, as `bench-recall` does for its
    /// scratch store), resolved to a directory or a bucket with its settings
    /// from `[storage.object_store]` and `AWS_*`.
    pub fn data_location(&self) -> crate::store::Location {
        self.parse_data_dir()
            .unwrap_or_else(|_| crate::store::Location::Local(self.resolve(&self.storage.data_dir)))
    }

    fn parse_data_dir(
        &self,
    ) -> Result<crate::store::Location, crate::store::location::LocationError> {
        crate::store::Location::parse(
            &self.storage.data_dir.to_string_lossy(),
            &self.base_dir,
            &self.object_settings,
        )
    }

    /// A local directory for files on their way out (exports): inside the
    /// data directory, or the system's temp directory when the data is in a bucket.
    pub fn spool_dir(&self) -> PathBuf {
        const SPOOL: &str = ".export-spool";
        match self.data_location() {
            crate::store::Location::Local(dir) => dir.join(SPOOL),
            crate::store::Location::Bucket(_) => std::env::temp_dir().join("loomem").join(SPOOL),
        }
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
        assert_eq!(cfg.embed.batch_niceness, 0);
        assert_eq!(cfg.search.read_niceness, 15);
        assert_eq!(cfg.bus.kind, BusKind::Jetstream);
        assert_eq!(cfg.bus.nats_url, "nats://127.0.0.1:4222");
        assert_eq!(cfg.bus.batch_wait_ms, 2);
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
            ("LOOMEM_BUS__PACK_WRITES", "0", "bus.pack_writes"),
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
            ("LOOMEM_EMBED__BATCH_NICENESS", "20", "embed.batch_niceness"),
            ("LOOMEM_EMBED__BATCH_NICENESS", "-1", "embed.batch_niceness"),
            ("LOOMEM_SEARCH__READ_NICENESS", "20", "search.read_niceness"),
            ("LOOMEM_SEARCH__READ_NICENESS", "-1", "search.read_niceness"),
            (
                "LOOMEM_SEARCH__ASSISTANT_WEIGHT",
                "1.5",
                "search.assistant_weight",
            ),
            ("LOOMEM_SEARCH__DECAY_WEIGHT", "-0.1", "search.decay_weight"),
            (
                "LOOMEM_SEARCH__SESSION_REST_WEIGHT",
                "2",
                "search.session_rest_weight",
            ),
            ("LOOMEM_SEARCH__SESSION_POOL", "1001", "search.session_pool"),
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
        assert_eq!(
            cfg.data_location(),
            crate::store::Location::Local(PathBuf::from("/etc/loomem/./data"))
        );
        assert_eq!(cfg.pipelines_dir(), PathBuf::from("/etc/loomem/pipelines"));
        // A data directory set after loading (bench-recall's scratch store) is
        // where the tables go, not the one the file named.
        let mut scratch = cfg.clone();
        scratch.storage.data_dir = PathBuf::from("/tmp/scratch");
        assert_eq!(
            scratch.data_location(),
            crate::store::Location::Local(PathBuf::from("/tmp/scratch"))
        );
    }

    #[test]
    fn the_data_may_live_in_a_bucket() {
        let vars = env(&[
            ("LOOMEM_STORAGE__DATA_DIR", "s3://memories/prod"),
            (
                "LOOMEM_STORAGE__OBJECT_STORE__AWS_ENDPOINT",
                "http://127.0.0.1:9000",
            ),
            ("LOOMEM_STORAGE__OBJECT_STORE__AWS_ALLOW_HTTP", "true"),
            ("AWS_REGION", "eu-west-1"),
        ]);
        let cfg = Config::parse(&shipped(), &vars, PathBuf::from("/etc/loomem")).unwrap();
        let crate::store::Location::Bucket(b) = cfg.data_location() else {
            panic!("a bucket: {:?}", cfg.data_location());
        };
        assert_eq!(b.uri(), "s3://memories/prod");
        assert_eq!(cfg.object_settings["aws_allow_http"], "true");
        assert_eq!(cfg.object_settings["aws_region"], "eu-west-1");
        assert_eq!(cfg.object_settings["aws_endpoint"], "http://127.0.0.1:9000");
        assert!(cfg.spool_dir().starts_with(std::env::temp_dir()));

        let typo = env(&[("LOOMEM_STORAGE__OBJECT_STORE__AWS_ENDPIONT", "x")]);
        let err = Config::parse(&shipped(), &typo, PathBuf::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("storage.object_store") && err.contains("aws_endpiont"),
            "{err}"
        );
        let gcs = env(&[("LOOMEM_STORAGE__DATA_DIR", "gs://b/p")]);
        let err = Config::parse(&shipped(), &gcs, PathBuf::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("storage.data_dir"), "{err}");
    }
}
