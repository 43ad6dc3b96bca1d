//! Who is asking: the result of authentication, with the streams the caller may
//! see and the namespace labels it may name them by. Every service function
//! takes one and scopes what it reads and writes to it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::core::error::{Error, Result};
use crate::core::model::DEFAULT_STREAM;

/// What a key may do, weakest first: a `reader` searches and reads its
/// streams (search, context, profile, graph, history, SQL, export); a
/// `writer` also stores, imports, edits and deletes in them; an `admin` does
/// everything, in every stream.
#[derive(
    schemars::JsonSchema,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Reader,
    Writer,
    Admin,
}

impl Role {
    /// Whether this role includes `need`.
    pub fn allows(self, need: Role) -> bool {
        self >= need
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Writer => "writer",
            Role::Admin => "admin",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = Error;
    fn from_str(s: &str) -> Result<Role> {
        match s {
            "reader" => Ok(Role::Reader),
            "writer" => Ok(Role::Writer),
            "admin" => Ok(Role::Admin),
            other => Err(Error::invalid(
                "role",
                format!("`{other}`: must be admin, writer or reader"),
            )),
        }
    }
}

/// Human-readable labels mapped to stream ids (`personal = "100"`).
pub type Namespaces = Arc<BTreeMap<String, String>>;

/// Who is calling, resolved from the bearer token.
#[derive(Debug, Clone, Serialize)]
pub struct Caller {
    pub name: String,
    /// The key this caller signed in with: a runtime key's id, a configured
    /// key's name (what rate limits count by).
    pub key: String,
    pub role: Role,
    /// None = every stream.
    pub streams: Option<Vec<String>>,
    /// The deployment's namespace labels, resolved into the caller at
    /// authentication so services never need the config for them.
    #[serde(skip)]
    pub namespaces: Namespaces,
}

/// What joins a stream and the name of one of its branches.
pub const BRANCH_SEP: char = '~';

impl Caller {
    pub fn admin(name: &str) -> Caller {
        Caller {
            name: name.to_string(),
            key: name.to_string(),
            role: Role::Admin,
            streams: None,
            namespaces: Namespaces::default(),
        }
    }

    /// A writer limited to `streams` (the first is its default).
    pub fn scoped(name: &str, streams: Vec<String>) -> Caller {
        Caller {
            name: name.to_string(),
            key: name.to_string(),
            role: Role::Writer,
            streams: Some(streams),
            namespaces: Namespaces::default(),
        }
    }

    /// The same caller, naming streams through `namespaces`.
    pub fn with_namespaces(mut self, namespaces: Namespaces) -> Caller {
        self.namespaces = namespaces;
        self
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

    /// Whether the caller may use `stream`: one of its streams, or a branch
    /// of one (`<stream>~<branch>`, see `service::branch`).
    pub fn can_see(&self, stream: &str) -> bool {
        let Some(streams) = &self.streams else {
            return true;
        };
        streams.iter().any(|x| x == stream)
            || stream
                .rsplit_once(BRANCH_SEP)
                .is_some_and(|(base, _)| self.can_see(base))
    }

    /// The stream a request names (a namespace label or a stream id), or the
    /// caller's default; refused when the caller may not use it.
    pub fn resolve_stream(&self, requested: Option<&str>) -> Result<String> {
        let stream = match requested.map(str::trim) {
            None => self.default_stream().to_string(),
            Some("") => return Err(Error::invalid("stream", "must not be empty")),
            Some(s) => self
                .namespaces
                .get(s)
                .cloned()
                .unwrap_or_else(|| s.to_string()),
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

    /// The same caller, counted as key `key`.
    pub fn with_key(mut self, key: &str) -> Caller {
        self.key = key.to_string();
        self
    }

    /// The same caller with another role (an admin always sees every stream).
    pub fn with_role(mut self, role: Role) -> Caller {
        self.role = role;
        if role == Role::Admin {
            self.streams = None;
        }
        self
    }

    /// Refused (403) unless the caller's role includes `need`.
    pub fn require(&self, need: Role) -> Result<()> {
        if self.role.allows(need) {
            Ok(())
        } else {
            Err(Error::Forbidden(format!(
                "this needs a {} key; this key is a {}",
                need.as_str(),
                self.role.as_str()
            )))
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_may_use_the_branches_of_its_streams_only() {
        let a = Caller::scoped("a", vec!["a".into()]);
        assert!(a.can_see("a") && a.can_see("a~trial") && a.can_see("a~trial~deeper"));
        assert!(!a.can_see("b~trial") && !a.can_see("ab") && !a.can_see("b~a"));
        assert!(!a.can_see("~a") && !a.can_see("a2"));
    }

    #[test]
    fn streams_resolve_through_namespaces_and_scope() {
        let ns = Arc::new(BTreeMap::from([(
            "personal".to_string(),
            "100".to_string(),
        )]));
        let scoped = Caller::scoped("a", vec!["100".into()]).with_namespaces(ns.clone());
        assert_eq!(scoped.resolve_stream(Some("personal")).unwrap(), "100");
        assert_eq!(scoped.resolve_stream(None).unwrap(), "100");
        assert!(matches!(
            scoped.resolve_stream(Some("200")),
            Err(Error::Forbidden(_))
        ));
        assert_eq!(
            Caller::admin("x")
                .with_namespaces(ns)
                .resolve_stream(None)
                .unwrap(),
            DEFAULT_STREAM
        );
    }
}
