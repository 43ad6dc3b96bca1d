//! API keys and what each may see. The admin key (from `server.auth_token_env`)
//! sees every stream; scoped keys (`[[server.tokens]]`) see only their streams.
//! With no key configured the server runs in local passthrough mode.

use std::collections::HashMap;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::core::caller::{Caller, Namespaces};
use crate::core::error::{Error, Result};

/// The configured keys, compared in constant time via their SHA-256 digests.
pub struct Auth {
    keys: Vec<([u8; 32], Caller)>,
    namespaces: Namespaces,
}

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
                Caller::admin("admin").with_namespaces(namespaces.clone()),
            ));
        }
        for t in &cfg.tokens {
            match set(&t.token_env) {
                Some(token) => keys.push((
                    digest(&token),
                    Caller::scoped(&t.name, t.streams.clone()).with_namespaces(namespaces.clone()),
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
        Ok(Auth { keys, namespaces })
    }

    pub fn passthrough(&self) -> bool {
        self.keys.is_empty()
    }

    /// The caller an `Authorization` header value stands for.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Caller> {
        if self.passthrough() {
            return Ok(Caller::admin("local").with_namespaces(self.namespaces.clone()));
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
        found.ok_or(Error::Unauthorized)
    }
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
        }
    }

    #[test]
    fn keys_map_to_callers() {
        let env = HashMap::from([
            ("ADMIN".to_string(), "s3cret".to_string()),
            ("TOKEN_A".to_string(), "aaa".to_string()),
        ]);
        let auth = Auth::from_config(&server_cfg(), Namespaces::default(), &env).unwrap();
        assert!(!auth.passthrough());
        assert!(auth.authenticate(Some("Bearer s3cret")).unwrap().is_admin());
        let a = auth.authenticate(Some("Bearer aaa")).unwrap();
        assert_eq!(a.role, Role::User);
        assert_eq!(a.default_stream(), "100");
        assert!(matches!(
            auth.authenticate(Some("Bearer nope")),
            Err(Error::Unauthorized)
        ));
        assert!(matches!(
            auth.authenticate(Some("s3cret")),
            Err(Error::Unauthorized)
        ));
        assert!(matches!(auth.authenticate(None), Err(Error::Unauthorized)));
    }

    #[test]
    fn no_keys_on_loopback_means_passthrough() {
        let mut cfg = server_cfg();
        cfg.tokens.clear();
        let auth = Auth::from_config(&cfg, Namespaces::default(), &HashMap::new()).unwrap();
        assert!(auth.passthrough());
        assert!(auth.authenticate(None).unwrap().is_admin());
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
