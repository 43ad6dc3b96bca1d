//! API keys and what each may see. The admin key (from `server.auth_token_env`)
//! sees every stream; scoped keys (`[[server.tokens]]`) see only their streams.
//! With no key configured the server runs in local passthrough mode.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::ServerConfig;
use crate::error::{Error, Result};
use crate::model::DEFAULT_STREAM;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Admin,
    User,
}

/// Who is calling, resolved from the bearer token.
#[derive(Debug, Clone, Serialize)]
pub struct Caller {
    pub name: String,
    pub role: Role,
    /// None = every stream.
    pub streams: Option<Vec<String>>,
}

impl Caller {
    pub fn admin(name: &str) -> Caller {
        Caller {
            name: name.to_string(),
            role: Role::Admin,
            streams: None,
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    pub fn default_stream(&self) -> &str {
        self.streams
            .as_ref()
            .and_then(|s| s.first())
            .map(String::as_str)
            .unwrap_or(DEFAULT_STREAM)
    }

    /// The Lance/SQL predicate limiting rows to the streams this caller may
    /// see (None: every stream).
    pub fn stream_filter(&self) -> Option<String> {
        self.streams
            .as_ref()
            .map(|s| crate::store::column_in("stream", s))
    }

    pub fn can_see(&self, stream: &str) -> bool {
        self.streams
            .as_ref()
            .is_none_or(|s| s.iter().any(|x| x == stream))
    }

    /// The stream a request names (a namespace label or a stream id), or the
    /// caller's default; refused when the caller may not use it.
    pub fn resolve_stream(
        &self,
        requested: Option<&str>,
        namespaces: &BTreeMap<String, String>,
    ) -> Result<String> {
        let stream = match requested.map(str::trim) {
            None => self.default_stream().to_string(),
            Some("") => return Err(Error::invalid("stream", "must not be empty")),
            Some(s) => namespaces.get(s).cloned().unwrap_or_else(|| s.to_string()),
        };
        if stream.len() > 256 {
            return Err(Error::invalid("stream", "must be at most 256 characters"));
        }
        if !self.can_see(&stream) {
            return Err(Error::Forbidden(format!(
                "stream `{stream}` is not accessible with this API key"
            )));
        }
        Ok(stream)
    }

    pub fn require_admin(&self) -> Result<()> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(Error::Forbidden(
                "this endpoint needs the admin API key".into(),
            ))
        }
    }
}

/// The configured keys, compared in constant time via their SHA-256 digests.
pub struct Auth {
    keys: Vec<([u8; 32], Caller)>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Equal digests, without an early exit that would leak where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Auth {
    /// Keys read from `env` as the server config names them.
    pub fn from_config(cfg: &ServerConfig, env: &HashMap<String, String>) -> Auth {
        let mut keys = Vec::new();
        let set = |var: &str| {
            env.get(var)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if let Some(token) = set(&cfg.auth_token_env) {
            keys.push((digest(&token), Caller::admin("admin")));
        }
        for t in &cfg.tokens {
            match set(&t.token_env) {
                Some(token) => keys.push((
                    digest(&token),
                    Caller {
                        name: t.name.clone(),
                        role: Role::User,
                        streams: Some(t.streams.clone()),
                    },
                )),
                None => {
                    tracing::warn!(token = %t.name, var = %t.token_env, "scoped token variable is not set; token disabled")
                }
            }
        }
        Auth { keys }
    }

    pub fn passthrough(&self) -> bool {
        self.keys.is_empty()
    }

    /// The caller an `Authorization` header value stands for.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Caller> {
        if self.passthrough() {
            return Ok(Caller::admin("local"));
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
    use super::*;
    use crate::config::ScopedToken;

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
        let auth = Auth::from_config(&server_cfg(), &env);
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
    fn no_keys_means_passthrough() {
        let auth = Auth::from_config(&server_cfg(), &HashMap::new());
        assert!(auth.passthrough());
        assert!(auth.authenticate(None).unwrap().is_admin());
    }

    #[test]
    fn streams_resolve_through_namespaces_and_scope() {
        let ns = BTreeMap::from([("personal".to_string(), "100".to_string())]);
        let scoped = Caller {
            name: "a".into(),
            role: Role::User,
            streams: Some(vec!["100".into()]),
        };
        assert_eq!(scoped.resolve_stream(Some("personal"), &ns).unwrap(), "100");
        assert_eq!(scoped.resolve_stream(None, &ns).unwrap(), "100");
        assert!(matches!(
            scoped.resolve_stream(Some("200"), &ns),
            Err(Error::Forbidden(_))
        ));
        assert_eq!(
            Caller::admin("x").resolve_stream(None, &ns).unwrap(),
            DEFAULT_STREAM
        );
    }
}
