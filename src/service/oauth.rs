//! OAuth 2.1 for remote MCP clients: authorization-server metadata (RFC
//! 8414), protected-resource metadata (RFC 9728), dynamic client
//! registration (RFC 7591), the authorization-code flow with PKCE S256 only,
//! refresh tokens that work once each, and revocation (RFC 7009).
//!
//! The consent is given with an API key: the operator signs in on the
//! authorization page and picks the role (up to the key's) and the streams
//! (among the key's). The access token is a runtime key (`service::keys`)
//! with that role and those streams and a short life, so every route checks
//! it like any key and `DELETE /admin/keys/{id}` revokes it; the grant keeps
//! the digest of the current refresh token. Codes live in this process for
//! `code_secs`.

use std::collections::HashMap;
use std::sync::Mutex;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::core::error::Error;
use crate::core::model::{now_micros, Micros};
use crate::core::{Caller, Role};
use crate::service::auth::Auth;
use crate::service::keys::digest_hex;
use crate::store::api_keys::{KeyRow, KeyTable};
use crate::store::oauth::{ClientRow, GrantRow, OAuthTables};

/// `[oauth]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OAuthConfig {
    /// The issuer's base URL (`https://memory.example.com`); empty: the
    /// scheme-less `http://` + the request's `Host`.
    pub issuer: String,
    pub access_token_secs: u64,
    pub refresh_token_secs: u64,
    pub code_secs: u64,
    /// Redirect URIs clients may register besides loopback ones (always
    /// allowed: `http://127.0.0.1:…`, `http://localhost:…`, `http://[::1]:…`).
    pub allowed_redirect_uris: Vec<String>,
}

impl Default for OAuthConfig {
    fn default() -> Self {
        OAuthConfig {
            issuer: String::new(),
            access_token_secs: 3600,
            refresh_token_secs: 30 * 86_400,
            code_secs: 120,
            allowed_redirect_uris: Vec::new(),
        }
    }
}

/// An OAuth error as RFC 6749 words it (`error`, `error_description`); the
/// REST edge answers it with the status and both fields (and `detail`).
#[derive(Debug, Clone)]
pub struct OAuthError {
    pub status: u16,
    pub error: &'static str,
    pub description: String,
}

fn oauth_err(status: u16, error: &'static str, description: impl Into<String>) -> OAuthError {
    OAuthError {
        status,
        error,
        description: description.into(),
    }
}

impl From<Error> for OAuthError {
    fn from(e: Error) -> OAuthError {
        match e {
            Error::Unauthorized => oauth_err(401, "access_denied", e.to_string()),
            Error::Invalid { .. } | Error::BadRequest(_) => {
                oauth_err(400, "invalid_request", e.to_string())
            }
            Error::Forbidden(_) => oauth_err(403, "access_denied", e.to_string()),
            _ => oauth_err(500, "server_error", e.to_string()),
        }
    }
}

impl From<crate::store::StoreError> for OAuthError {
    fn from(e: crate::store::StoreError) -> OAuthError {
        Error::from(e).into()
    }
}

type OResult<T> = std::result::Result<T, OAuthError>;

struct PendingCode {
    client_id: String,
    redirect_uri: String,
    challenge: String,
    role: Role,
    streams: Option<Vec<String>>,
    expires: Micros,
}

pub struct OAuth {
    pub cfg: OAuthConfig,
    tables: OAuthTables,
    keys: KeyTable,
    /// Codes by digest, until used or expired.
    codes: Mutex<HashMap<String, PendingCode>>,
}

/// `POST /oauth/register` (RFC 7591; the fields loomem reads).
#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
pub struct RegisterRequest {
    #[serde(default)]
    pub redirect_uris: Vec<String>,
    pub client_name: Option<String>,
    /// Ignored: every client is public and proves itself with PKCE.
    pub token_endpoint_auth_method: Option<String>,
    pub grant_types: Option<Vec<String>>,
    pub response_types: Option<Vec<String>>,
    pub scope: Option<String>,
}

#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct Registered {
    pub client_id: String,
    pub client_id_issued_at: i64,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
    pub grant_types: Vec<&'static str>,
    pub response_types: Vec<&'static str>,
    pub token_endpoint_auth_method: &'static str,
}

/// The query of `GET /oauth/authorize` (and the hidden fields of its form).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct AuthorizeParams {
    #[serde(default)]
    pub response_type: String,
    #[serde(default)]
    pub client_id: String,
    #[serde(default)]
    pub redirect_uri: String,
    pub state: Option<String>,
    #[serde(default)]
    pub code_challenge: String,
    #[serde(default)]
    pub code_challenge_method: String,
    pub scope: Option<String>,
    pub resource: Option<String>,
}

/// What the operator chose on the consent page.
#[derive(Debug, Clone, Deserialize)]
pub struct Consent {
    pub api_key: String,
    /// `reader`, `writer` or `admin`; at most the key's own role.
    pub role: String,
    /// Comma-separated; empty for an admin grant of every stream.
    #[serde(default)]
    pub streams: String,
}

/// `POST /oauth/token` (form fields).
#[derive(Debug, Clone, Deserialize)]
pub struct TokenRequest {
    pub grant_type: String,
    pub code: Option<String>,
    pub redirect_uri: Option<String>,
    pub client_id: Option<String>,
    pub code_verifier: Option<String>,
    pub refresh_token: Option<String>,
    #[serde(flatten)]
    pub other: HashMap<String, String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenResponse {
    pub access_token: String,
    pub token_type: &'static str,
    pub expires_in: u64,
    pub refresh_token: String,
    pub scope: String,
}

/// The scope loomem advertises; what a token may do is its role and streams.
pub const SCOPE: &str = "memory";

fn random_token(prefix: &str) -> String {
    format!(
        "{prefix}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn secs(s: u64) -> Micros {
    (s.min(10 * 365 * 86_400) as i64) * 1_000_000
}

/// Whether `uri` is an `http` address on this machine (any port, any path).
fn loopback_redirect(uri: &str) -> bool {
    let Some(rest) = uri.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    !authority.contains('@')
        && crate::service::auth::is_loopback(crate::service::auth::host_name(authority))
}

/// S256: base64url(SHA-256(verifier)) without padding equals the challenge
/// (compared in constant time).
pub fn pkce_matches(verifier: &str, challenge: &str) -> bool {
    let computed = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(Sha256::digest(verifier.as_bytes()));
    computed.len() == challenge.len()
        && computed
            .bytes()
            .zip(challenge.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

impl OAuth {
    pub fn new(cfg: OAuthConfig, tables: OAuthTables, keys: KeyTable) -> OAuth {
        OAuth {
            cfg,
            tables,
            keys,
            codes: Default::default(),
        }
    }

    /// The issuer: the configured one, else `http://<host>`.
    pub fn issuer(&self, host: &str) -> String {
        if self.cfg.issuer.is_empty() {
            format!("http://{host}")
        } else {
            self.cfg.issuer.trim_end_matches('/').to_string()
        }
    }

    /// RFC 8414 authorization-server metadata.
    pub fn server_metadata(&self, issuer: &str) -> serde_json::Value {
        serde_json::json!({
            "issuer": issuer,
            "authorization_endpoint": format!("{issuer}/oauth/authorize"),
            "token_endpoint": format!("{issuer}/oauth/token"),
            "registration_endpoint": format!("{issuer}/oauth/register"),
            "revocation_endpoint": format!("{issuer}/oauth/revoke"),
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none"],
            "revocation_endpoint_auth_methods_supported": ["none"],
            "scopes_supported": [SCOPE],
        })
    }

    /// RFC 9728 protected-resource metadata of `/mcp`.
    pub fn resource_metadata(&self, issuer: &str) -> serde_json::Value {
        serde_json::json!({
            "resource": format!("{issuer}/mcp"),
            "authorization_servers": [issuer],
            "bearer_methods_supported": ["header"],
            "scopes_supported": [SCOPE],
            "resource_name": "loomem",
        })
    }

    fn redirect_allowed(&self, uri: &str) -> bool {
        loopback_redirect(uri) || self.cfg.allowed_redirect_uris.iter().any(|u| u == uri)
    }

    pub async fn register(&self, req: RegisterRequest) -> OResult<Registered> {
        if req.redirect_uris.is_empty() {
            return Err(oauth_err(
                400,
                "invalid_redirect_uri",
                "redirect_uris: at least one is needed",
            ));
        }
        if let Some(bad) = req.redirect_uris.iter().find(|u| !self.redirect_allowed(u)) {
            return Err(oauth_err(
                400,
                "invalid_redirect_uri",
                format!("redirect_uris: `{bad}` is neither a loopback http address nor in oauth.allowed_redirect_uris"),
            ));
        }
        let now = now_micros();
        let row = ClientRow {
            client_id: uuid::Uuid::new_v4().to_string(),
            client_name: req
                .client_name
                .filter(|n| !n.trim().is_empty())
                .unwrap_or_else(|| "MCP client".into())
                .chars()
                .take(128)
                .collect(),
            redirect_uris: req.redirect_uris,
            created_at: now,
        };
        self.tables.add_client(&row).await?;
        Ok(Registered {
            client_id: row.client_id,
            client_id_issued_at: now / 1_000_000,
            client_name: row.client_name,
            redirect_uris: row.redirect_uris,
            grant_types: vec!["authorization_code", "refresh_token"],
            response_types: vec!["code"],
            token_endpoint_auth_method: "none",
        })
    }

    /// The client of a valid authorization request; an error when the
    /// request may not go on (an unknown client or a redirect URI it did not
    /// register is never redirected to).
    pub async fn check(&self, p: &AuthorizeParams) -> OResult<ClientRow> {
        let client = self
            .tables
            .client(&p.client_id)
            .await?
            .ok_or_else(|| oauth_err(400, "invalid_client", "client_id: no such client"))?;
        if !client.redirect_uris.contains(&p.redirect_uri) {
            return Err(oauth_err(
                400,
                "invalid_request",
                "redirect_uri: not one the client registered",
            ));
        }
        if p.response_type != "code" {
            return Err(oauth_err(
                400,
                "unsupported_response_type",
                "response_type: must be code",
            ));
        }
        if p.code_challenge_method != "S256" {
            return Err(oauth_err(
                400,
                "invalid_request",
                "code_challenge_method: must be S256",
            ));
        }
        if !(43..=128).contains(&p.code_challenge.len()) {
            return Err(oauth_err(
                400,
                "invalid_request",
                "code_challenge: must be 43-128 characters",
            ));
        }
        Ok(client)
    }

    /// The consent: the key signs in, the grant is at most what it may do.
    /// Returns the URL to redirect to, with the code.
    pub async fn approve(&self, auth: &Auth, p: &AuthorizeParams, c: &Consent) -> OResult<String> {
        self.check(p).await?;
        let caller: Caller = auth
            .authenticate(Some(&format!("Bearer {}", c.api_key.trim())))
            .await
            .map_err(|_| oauth_err(401, "access_denied", "api_key: not accepted"))?;
        let role: Role = c.role.parse()?;
        if !caller.role.allows(role) {
            return Err(oauth_err(
                403,
                "access_denied",
                format!(
                    "role: this key is a {} and cannot grant {}",
                    caller.role.as_str(),
                    role.as_str()
                ),
            ));
        }
        let wanted: Vec<String> = c
            .streams
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let streams = if wanted.is_empty() {
            match (role, &caller.streams) {
                (Role::Admin, _) => None,
                (_, Some(own)) => Some(own.clone()),
                (_, None) => {
                    return Err(oauth_err(
                        400,
                        "invalid_request",
                        "streams: name the streams to grant",
                    ))
                }
            }
        } else {
            for s in &wanted {
                caller.resolve_stream(Some(s)).map_err(OAuthError::from)?;
            }
            Some(wanted)
        };
        let code = random_token("lmc_");
        self.codes.lock().expect("codes lock").insert(
            digest_hex(&code),
            PendingCode {
                client_id: p.client_id.clone(),
                redirect_uri: p.redirect_uri.clone(),
                challenge: p.code_challenge.clone(),
                role,
                streams,
                expires: now_micros() + secs(self.cfg.code_secs),
            },
        );
        let mut url = p.redirect_uri.clone();
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!("code={}", urlencode(&code)));
        if let Some(state) = &p.state {
            url.push_str(&format!("&state={}", urlencode(state)));
        }
        Ok(url)
    }

    /// A new access token (a runtime key) for a grant's role and streams.
    async fn access_key(
        &self,
        client: &str,
        role: Role,
        streams: &Option<Vec<String>>,
    ) -> OResult<(String, KeyRow)> {
        let secret = random_token(crate::service::keys::SECRET_PREFIX);
        let now = now_micros();
        let row = KeyRow {
            id: uuid::Uuid::new_v4().to_string(),
            name: format!("oauth:{client}"),
            role: role.as_str().to_string(),
            streams: if role == Role::Admin {
                None
            } else {
                streams.clone()
            },
            digest: digest_hex(&secret),
            prefix: secret.chars().take(10).collect(),
            previous_digest: None,
            previous_until: None,
            created_at: now,
            expires_at: Some(now + secs(self.cfg.access_token_secs)),
            revoked_at: None,
            last_used_at: None,
        };
        self.keys.add(&row).await?;
        Ok((secret, row))
    }

    fn answer(&self, access: String, refresh: String) -> TokenResponse {
        TokenResponse {
            access_token: access,
            token_type: "Bearer",
            expires_in: self.cfg.access_token_secs,
            refresh_token: refresh,
            scope: SCOPE.into(),
        }
    }

    pub async fn token(&self, req: TokenRequest) -> OResult<TokenResponse> {
        match req.grant_type.as_str() {
            "authorization_code" => self.exchange(req).await,
            "refresh_token" => self.refresh(req).await,
            other => Err(oauth_err(
                400,
                "unsupported_grant_type",
                format!("grant_type: `{other}` (authorization_code or refresh_token)"),
            )),
        }
    }

    async fn exchange(&self, req: TokenRequest) -> OResult<TokenResponse> {
        let code = req
            .code
            .ok_or_else(|| oauth_err(400, "invalid_request", "code: missing"))?;
        // A code works once: taken out before anything is checked.
        let pending = self
            .codes
            .lock()
            .expect("codes lock")
            .remove(&digest_hex(&code))
            .ok_or_else(|| oauth_err(400, "invalid_grant", "code: unknown or already used"))?;
        if pending.expires < now_micros() {
            return Err(oauth_err(400, "invalid_grant", "code: expired"));
        }
        if req.client_id.as_deref() != Some(pending.client_id.as_str()) {
            return Err(oauth_err(
                400,
                "invalid_grant",
                "client_id: not the code's client",
            ));
        }
        if req.redirect_uri.as_deref() != Some(pending.redirect_uri.as_str()) {
            return Err(oauth_err(
                400,
                "invalid_grant",
                "redirect_uri: not the one of the authorization",
            ));
        }
        let verifier = req.code_verifier.unwrap_or_default();
        if !pkce_matches(&verifier, &pending.challenge) {
            return Err(oauth_err(
                400,
                "invalid_grant",
                "code_verifier: does not match the code_challenge",
            ));
        }
        let client = self
            .tables
            .client(&pending.client_id)
            .await?
            .ok_or_else(|| oauth_err(400, "invalid_client", "client_id: no such client"))?;
        let (access, key) = self
            .access_key(&client.client_name, pending.role, &pending.streams)
            .await?;
        let refresh = random_token("lmr_");
        let now = now_micros();
        self.tables
            .add_grant(&GrantRow {
                id: uuid::Uuid::new_v4().to_string(),
                client_id: pending.client_id,
                role: pending.role.as_str().to_string(),
                streams: key.streams.clone(),
                refresh_digest: digest_hex(&refresh),
                access_key_id: key.id,
                created_at: now,
                expires_at: now + secs(self.cfg.refresh_token_secs),
                revoked_at: None,
            })
            .await?;
        Ok(self.answer(access, refresh))
    }

    async fn refresh(&self, req: TokenRequest) -> OResult<TokenResponse> {
        let old = req
            .refresh_token
            .ok_or_else(|| oauth_err(400, "invalid_request", "refresh_token: missing"))?;
        let old_digest = digest_hex(&old);
        let grant = self
            .tables
            .grant_by_refresh(&old_digest)
            .await?
            .ok_or_else(|| {
                oauth_err(
                    400,
                    "invalid_grant",
                    "refresh_token: unknown, used or revoked",
                )
            })?;
        if grant.expires_at < now_micros() {
            return Err(oauth_err(400, "invalid_grant", "refresh_token: expired"));
        }
        if req
            .client_id
            .as_deref()
            .is_some_and(|c| c != grant.client_id)
        {
            return Err(oauth_err(
                400,
                "invalid_grant",
                "client_id: not the grant's client",
            ));
        }
        let role: Role = grant.role.parse()?;
        let client = self
            .tables
            .client(&grant.client_id)
            .await?
            .map(|c| c.client_name)
            .unwrap_or_else(|| "MCP client".into());
        let (access, key) = self.access_key(&client, role, &grant.streams).await?;
        let refresh = random_token("lmr_");
        if !self
            .tables
            .rotate_grant(&grant.id, &old_digest, &digest_hex(&refresh), &key.id)
            .await?
        {
            self.keys.revoke(&key.id, now_micros()).await?;
            return Err(oauth_err(
                400,
                "invalid_grant",
                "refresh_token: already used",
            ));
        }
        self.keys.revoke(&grant.access_key_id, now_micros()).await?;
        Ok(self.answer(access, refresh))
    }

    /// RFC 7009: a refresh token ends its grant and its access token; an
    /// access token is revoked like a key. Unknown tokens are not an error.
    pub async fn revoke(&self, token: &str) -> OResult<()> {
        let digest = digest_hex(token.trim());
        let now = now_micros();
        if let Some(grant) = self.tables.grant_by_refresh(&digest).await? {
            self.tables.revoke_grant(&grant.id, now).await?;
            self.keys.revoke(&grant.access_key_id, now).await?;
            return Ok(());
        }
        if let Some(key) = self
            .keys
            .all()
            .await?
            .into_iter()
            .find(|k| k.digest == digest && k.name.starts_with("oauth:"))
        {
            self.keys.revoke(&key.id, now).await?;
        }
        Ok(())
    }
}

/// Percent-encode a query value.
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_s256_matches_the_rfc_example() {
        // RFC 7636, appendix B.
        let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        assert!(pkce_matches(
            verifier,
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        ));
        // One character off, and the plain method's "challenge".
        assert!(!pkce_matches(
            verifier,
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cN"
        ));
        assert!(!pkce_matches(verifier, verifier));
    }

    #[test]
    fn only_loopback_http_redirects_are_allowed_by_default() {
        for ok in [
            "http://127.0.0.1:33418/callback",
            "http://localhost/cb",
            "http://[::1]:8080/",
        ] {
            assert!(loopback_redirect(ok), "{ok}");
        }
        for bad in [
            "https://evil.example/cb",
            "http://127.0.0.1.evil.example/cb",
            "http://evil.example:80@127.0.0.1/",
        ] {
            assert!(!loopback_redirect(bad), "{bad}");
        }
    }
}
