//! API keys and what each may see. The admin key (from `server.auth_token_env`)
//! sees every stream; scoped keys (`[[server.tokens]]`) are writers of their
//! streams; keys made at runtime (`service::keys`, the `api_keys` table) have
//! the role and streams they were made with. With no key configured and no
//! live runtime key, the server runs in local passthrough mode.

use std::collections::HashMap;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::core::caller::{Caller, Namespaces};
use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Micros};
use crate::core::Role;
use crate::store::api_keys::{KeyRow, KeyTable};

/// The configured keys, compared in constant time via their SHA-256 digests,
/// and the runtime keys of the data directory.
pub struct Auth {
    keys: Vec<([u8; 32], Caller)>,
    namespaces: Namespaces,
    runtime: Option<Runtime>,
}

/// The `api_keys` table and the rows last read from it.
struct Runtime {
    table: KeyTable,
    cache: tokio::sync::Mutex<Cached>,
}

#[derive(Default)]
struct Cached {
    /// The table version `rows` were read at (None: not read yet).
    version: Option<u64>,
    rows: std::sync::Arc<Vec<KeyRow>>,
    /// When this process last recorded each key's use.
    touched: HashMap<String, Micros>,
}

/// The name of the caller of passthrough mode.
pub const PASSTHROUGH: &str = "local";

/// Record a key's use at most this often (µs).
const TOUCH_EVERY: Micros = 60_000_000;

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Equal digests, without an early exit that would leak where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why the configured keys cannot be used: the server refuses to start
/// rather than run with less protection than its config asks for.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("[[server.tokens]] `{name}`: the environment variable {var} is not set; set it, or remove the token from the config")]
    MissingToken { name: String, var: String },
    #[error("no API key is set ({var} is empty and no [[server.tokens]] is configured) and the server listens on {host}, which is not loopback: set {var}, or listen on 127.0.0.1")]
    OpenPassthrough { host: String, var: String },
}

/// Whether `host` (a `server.host` or the name part of a `Host` header) is
/// this machine only.
pub fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The name part of a `Host` header value (`example.com:3030` → `example.com`,
/// `[::1]:3030` → `::1`).
pub fn host_name(header: &str) -> &str {
    let header = header.trim();
    if let Some(rest) = header.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    match header.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => header,
    }
}

impl Auth {
    /// Keys read from `env` as the server config names them. A scoped token
    /// whose variable is not set is an error, not a token quietly dropped;
    /// with no key at all (local passthrough: every request is admin) the
    /// server must listen on loopback.
    pub fn from_config(
        cfg: &ServerConfig,
        namespaces: Namespaces,
        env: &HashMap<String, String>,
    ) -> Result<Auth, AuthError> {
        let mut keys = Vec::new();
        let set = |var: &str| {
            env.get(var)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if let Some(token) = set(&cfg.auth_token_env) {
            keys.push((
                digest(&token),
                Caller::admin("admin")
                    .with_key("config:admin")
                    .with_namespaces(namespaces.clone()),
            ));
        }
        for t in &cfg.tokens {
            match set(&t.token_env) {
                Some(token) => keys.push((
                    digest(&token),
                    Caller::scoped(&t.name, t.streams.clone())
                        .with_key(&format!("config:{}", t.name))
                        .with_namespaces(namespaces.clone()),
                )),
                None => {
                    return Err(AuthError::MissingToken {
                        name: t.name.clone(),
                        var: t.token_env.clone(),
                    })
                }
            }
        }
        if keys.is_empty() && !is_loopback(&cfg.host) {
            return Err(AuthError::OpenPassthrough {
                host: cfg.host.clone(),
                var: cfg.auth_token_env.clone(),
            });
        }
        Ok(Auth {
            keys,
            namespaces,
            runtime: None,
        })
    }

    /// Also accept the runtime keys of this table.
    pub fn with_runtime_keys(mut self, table: KeyTable) -> Auth {
        self.runtime = Some(Runtime {
            table,
            cache: Default::default(),
        });
        self
    }

    /// No key is configured (runtime keys aside: see [`Auth::authenticate`]).
    pub fn passthrough(&self) -> bool {
        self.keys.is_empty()
    }

    /// The runtime keys as the table has them now (read again only when its
    /// version moved).
    async fn runtime_rows(&self) -> Result<std::sync::Arc<Vec<KeyRow>>> {
        let Some(rt) = &self.runtime else {
            return Ok(Default::default());
        };
        let version = rt.table.version().await?;
        let mut cache = rt.cache.lock().await;
        if cache.version != Some(version) {
            cache.rows = std::sync::Arc::new(rt.table.all().await?);
            cache.version = Some(version);
        }
        Ok(cache.rows.clone())
    }

    /// Record that `row` was used, at most once a minute a key per process,
    /// without holding up the request.
    async fn touch(&self, row: &KeyRow, now: Micros) {
        let Some(rt) = &self.runtime else { return };
        let mut cache = rt.cache.lock().await;
        let last = cache.touched.get(&row.id).copied().or(row.last_used_at);
        if last.is_some_and(|t| now - t < TOUCH_EVERY) {
            return;
        }
        cache.touched.insert(row.id.clone(), now);
        let (table, id) = (rt.table.clone(), row.id.clone());
        tokio::spawn(async move {
            if let Err(e) = table.touch(&id, now).await {
                tracing::debug!(error = %e, key = %id, "could not record a key's use");
            }
        });
    }

    /// The caller an `Authorization` header value stands for. Every key is
    /// compared (in constant time) whatever matched before, so the time taken
    /// does not tell which key, or how much of one, was right.
    pub async fn authenticate(&self, header: Option<&str>) -> Result<Caller> {
        let rows = self.runtime_rows().await?;
        let now = now_micros();
        let live = |r: &KeyRow| crate::service::keys::state(r, now) == "active";
        if self.keys.is_empty() && !rows.iter().any(live) {
            return Ok(Caller::admin(PASSTHROUGH).with_namespaces(self.namespaces.clone()));
        }
        let token = header
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or(Error::Unauthorized)?;
        let d = digest(token);
        let mut found = None;
        for (key, caller) in &self.keys {
            if same(key, &d) && found.is_none() {
                found = Some(caller.clone());
            }
        }
        let mut found_row = None;
        for row in rows.iter() {
            let current = parse_hex(&row.digest).is_some_and(|k| same(&k, &d));
            let previous = row.previous_until.is_some_and(|t| t > now)
                && row
                    .previous_digest
                    .as_deref()
                    .and_then(parse_hex)
                    .is_some_and(|k| same(&k, &d));
            if (current || previous) && live(row) && found.is_none() && found_row.is_none() {
                found_row = Some(row);
            }
        }
        if let Some(caller) = found {
            return Ok(caller);
        }
        let row = found_row.ok_or(Error::Unauthorized)?;
        self.touch(row, now).await;
        let role: Role = row
            .role
            .parse()
            .map_err(|_| Error::Internal(format!("key `{}` has an unknown role", row.id)))?;
        let caller = match (role, &row.streams) {
            (Role::Admin, _) | (_, None) => Caller::admin(&row.name).with_role(role),
            (_, Some(streams)) => Caller::scoped(&row.name, streams.clone()).with_role(role),
        };
        Ok(caller
            .with_key(&row.id)
            .with_namespaces(self.namespaces.clone()))
    }
}

/// A hex SHA-256 digest as bytes.
fn parse_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::ScopedToken;
    use super::*;
    use crate::core::Role;

    fn server_cfg() -> ServerConfig {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 0,
            auth_token_env: "ADMIN".into(),
            max_body_bytes: 1 << 20,
            store_timeout_ms: 1000,
            tokens: vec![ScopedToken {
                name: "a".into(),
                token_env: "TOKEN_A".into(),
                streams: vec!["100".into()],
            }],
            mcp_allowed_hosts: Vec::new(),
            rate_limit: Default::default(),
        }
    }

    #[tokio::test]
    async fn keys_map_to_callers() {
        let env = HashMap::from([
            ("ADMIN".to_string(), "s3cret".to_string()),
            ("TOKEN_A".to_string(), "aaa".to_string()),
        ]);
        let auth = Auth::from_config(&server_cfg(), Namespaces::default(), &env).unwrap();
        assert!(!auth.passthrough());
        assert!(auth
            .authenticate(Some("Bearer s3cret"))
            .await
            .unwrap()
            .is_admin());
        let a = auth.authenticate(Some("Bearer aaa")).await.unwrap();
        assert_eq!(a.role, Role::Writer);
        assert_eq!(a.default_stream(), "100");
        assert!(matches!(
            auth.authenticate(Some("Bearer nope")).await,
            Err(Error::Unauthorized)
        ));
        assert!(matches!(
            auth.authenticate(Some("s3cret")).await,
            Err(Error::Unauthorized)
        ));
        assert!(matches!(
            auth.authenticate(None).await,
            Err(Error::Unauthorized)
        ));
    }

    #[tokio::test]
    async fn no_keys_on_loopback_means_passthrough() {
        let mut cfg = server_cfg();
        cfg.tokens.clear();
        let auth = Auth::from_config(&cfg, Namespaces::default(), &HashMap::new()).unwrap();
        assert!(auth.passthrough());
        assert!(auth.authenticate(None).await.unwrap().is_admin());
    }

    #[test]
    fn a_configured_key_that_is_not_set_stops_the_start() {
        // The admin key is set but token `a`'s variable is not: before, the
        // token was dropped with a warning.
        let env = HashMap::from([("ADMIN".to_string(), "s3cret".to_string())]);
        let err = Auth::from_config(&server_cfg(), Namespaces::default(), &env)
            .err()
            .expect("a missing token variable must fail");
        assert!(err.to_string().contains("TOKEN_A"), "{err}");
        // Nothing set at all: before, every request was admin.
        let err = Auth::from_config(&server_cfg(), Namespaces::default(), &HashMap::new())
            .err()
            .expect("no key with a configured token must fail");
        assert!(err.to_string().contains("TOKEN_A"), "{err}");
    }

    #[test]
    fn passthrough_only_on_loopback() {
        let mut cfg = server_cfg();
        cfg.tokens.clear();
        for host in ["0.0.0.0", "10.1.2.3", "::", "example.com"] {
            cfg.host = host.into();
            let err = Auth::from_config(&cfg, Namespaces::default(), &HashMap::new())
                .err()
                .unwrap_or_else(|| panic!("passthrough on {host} must fail"));
            assert!(err.to_string().contains("ADMIN"), "{err}");
        }
        for host in ["127.0.0.1", "localhost", "::1", "127.0.0.2"] {
            cfg.host = host.into();
            assert!(Auth::from_config(&cfg, Namespaces::default(), &HashMap::new()).is_ok());
        }
        // With a key, any address will do.
        cfg.host = "0.0.0.0".into();
        let env = HashMap::from([("ADMIN".to_string(), "s3cret".to_string())]);
        assert!(Auth::from_config(&cfg, Namespaces::default(), &env).is_ok());
    }

    #[test]
    fn host_header_names() {
        assert_eq!(host_name("example.com:3030"), "example.com");
        assert_eq!(host_name("[::1]:3030"), "::1");
        assert_eq!(host_name("localhost"), "localhost");
        assert!(is_loopback(host_name("[::1]:80")));
        assert!(!is_loopback(host_name("evil.example:3030")));
    }
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
    /// Requests a second per key (see [`crate::service::limits`]).
    #[serde(default)]
    pub rate_limit: crate::service::limits::RateLimitConfig,
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
