//! API keys made at runtime: create (the secret is shown once), list (never
//! a secret), rotate (a new secret; the old one keeps working for a grace
//! period), revoke. Kept in the `api_keys` table as SHA-256 digests, so every
//! process sharing the data directory honours a change on its next request.
//! `POST/GET /admin/keys…` and `loomem keys …` call these.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Micros};
use crate::core::time::to_rfc3339;
use crate::core::Role;
use crate::store::api_keys::{KeyRow, KeyTable};

/// Every secret starts so, which makes a leaked one easy to spot.
pub const SECRET_PREFIX: &str = "lmk_";

/// The grace period of a rotated secret when none is given.
pub const DEFAULT_GRACE_SECS: u64 = 3600;

#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    #[schemars(length(min = 1, max = 128), regex(pattern = r"\S"))]
    pub name: String,
    /// `admin`, `writer` or `reader`.
    pub role: Role,
    /// The streams it may use, the first its default (required unless admin).
    #[serde(default)]
    pub streams: Vec<String>,
    /// Seconds until it stops working (none: it does not expire).
    #[schemars(range(min = 1))]
    pub expires_in_secs: Option<u64>,
}

#[derive(schemars::JsonSchema, Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateKey {
    /// How long the old secret keeps working (default 3600; 0 = not at all).
    pub grace_secs: Option<u64>,
}

/// A key as it is listed: never its secret or digest.
#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct KeyView {
    pub id: String,
    pub name: String,
    pub role: String,
    /// None: every stream.
    pub streams: Option<Vec<String>>,
    /// The secret's first characters.
    pub prefix: String,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub last_used_at: Option<String>,
    pub revoked_at: Option<String>,
    /// When the secret before the last rotation stops working.
    pub previous_valid_until: Option<String>,
    /// `active`, `expired` or `revoked`.
    pub state: &'static str,
}

/// A key with its secret: the one answer that shows it.
#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct KeyWithSecret {
    #[serde(flatten)]
    pub key: KeyView,
    pub secret: String,
}

pub fn digest_hex(secret: &str) -> String {
    crate::core::model::hex(&Sha256::digest(secret.as_bytes()))
}

fn new_secret() -> String {
    format!(
        "{SECRET_PREFIX}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn prefix(secret: &str) -> String {
    secret.chars().take(SECRET_PREFIX.len() + 6).collect()
}

/// Whether a key works at `now`.
pub fn state(row: &KeyRow, now: Micros) -> &'static str {
    if row.revoked_at.is_some_and(|t| t <= now) {
        "revoked"
    } else if row.expires_at.is_some_and(|t| t <= now) {
        "expired"
    } else {
        "active"
    }
}

pub fn view(row: &KeyRow) -> KeyView {
    let now = now_micros();
    KeyView {
        id: row.id.clone(),
        name: row.name.clone(),
        role: row.role.clone(),
        streams: row.streams.clone(),
        prefix: row.prefix.clone(),
        created_at: to_rfc3339(row.created_at),
        expires_at: row.expires_at.map(to_rfc3339),
        last_used_at: row.last_used_at.map(to_rfc3339),
        revoked_at: row.revoked_at.map(to_rfc3339),
        previous_valid_until: row
            .previous_until
            .filter(|t| *t > now && row.previous_digest.is_some())
            .map(to_rfc3339),
        state: state(row, now),
    }
}

fn secs(s: u64) -> Micros {
    (s.min(100 * 365 * 86_400) as i64) * 1_000_000
}

pub async fn create(keys: &KeyTable, req: CreateKey) -> Result<KeyWithSecret> {
    let name = req.name.trim();
    if name.is_empty() || name.len() > 128 {
        return Err(Error::invalid("name", "must be 1-128 characters"));
    }
    let streams: Vec<String> = req
        .streams
        .iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if streams.iter().any(|s| s.len() > 256) {
        return Err(Error::invalid(
            "streams",
            "a stream is at most 256 characters",
        ));
    }
    let streams = match req.role {
        Role::Admin if !streams.is_empty() => {
            return Err(Error::invalid(
                "streams",
                "an admin key sees every stream: leave streams out",
            ))
        }
        Role::Admin => None,
        _ if streams.is_empty() => {
            return Err(Error::invalid(
                "streams",
                "a writer or reader key needs at least one stream",
            ))
        }
        _ => Some(streams),
    };
    if req.expires_in_secs == Some(0) {
        return Err(Error::invalid("expires_in_secs", "must be at least 1"));
    }
    let now = now_micros();
    let secret = new_secret();
    let row = KeyRow {
        id: uuid::Uuid::new_v4().to_string(),
        name: name.to_string(),
        role: req.role.as_str().to_string(),
        streams,
        digest: digest_hex(&secret),
        prefix: prefix(&secret),
        previous_digest: None,
        previous_until: None,
        created_at: now,
        expires_at: req.expires_in_secs.map(|s| now + secs(s)),
        revoked_at: None,
        last_used_at: None,
    };
    keys.add(&row).await?;
    Ok(KeyWithSecret {
        key: view(&row),
        secret,
    })
}

pub async fn list(keys: &KeyTable) -> Result<Vec<KeyView>> {
    Ok(keys.all().await?.iter().map(view).collect())
}

async fn find(keys: &KeyTable, id: &str) -> Result<KeyRow> {
    keys.all()
        .await?
        .into_iter()
        .find(|k| k.id == id)
        .ok_or_else(|| Error::NotFound(format!("no key with id `{id}`")))
}

/// A new secret for the key; the old one works for `grace_secs` more.
pub async fn rotate(keys: &KeyTable, id: &str, req: RotateKey) -> Result<KeyWithSecret> {
    let mut row = find(keys, id).await?;
    let now = now_micros();
    if state(&row, now) != "active" {
        return Err(Error::Conflict(format!(
            "key `{id}` is {}: it cannot be rotated",
            state(&row, now)
        )));
    }
    let secret = new_secret();
    let grace = req.grace_secs.unwrap_or(DEFAULT_GRACE_SECS);
    let old = row.digest.clone();
    row.previous_digest = (grace > 0).then(|| row.digest.clone());
    row.previous_until = (grace > 0).then(|| now + secs(grace));
    row.digest = digest_hex(&secret);
    row.prefix = prefix(&secret);
    if !keys
        .rotate(id, &old, &row.digest, &row.prefix, row.previous_until)
        .await?
    {
        return Err(Error::Conflict(format!(
            "key `{id}` was revoked or rotated meanwhile: try again"
        )));
    }
    Ok(KeyWithSecret {
        key: view(&row),
        secret,
    })
}

/// Revoke a key now (its current and any previous secret).
pub async fn revoke(keys: &KeyTable, id: &str) -> Result<KeyView> {
    let mut row = find(keys, id).await?;
    if row.revoked_at.is_none() {
        let now = now_micros();
        keys.revoke(id, now).await?;
        row.revoked_at = Some(now);
    }
    Ok(view(&row))
}
