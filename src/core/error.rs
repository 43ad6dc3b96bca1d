//! The error every service function returns; the REST layer maps it to an HTTP
//! status in one place (`api::error`), the MCP layer to a tool result.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is well-formed but a field is wrong (HTTP 422).
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// The request cannot be read at all (HTTP 400).
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    TooLarge(String),
    /// A body in a media type the route does not take (HTTP 415).
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("missing or invalid API key")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Timeout(String),
    /// A feature a compatibility API names but loomem does not have (HTTP 501).
    #[error("{0}")]
    NotImplemented(String),
    /// Over a rate limit (HTTP 429 with `Retry-After`).
    #[error("{detail}")]
    RateLimited {
        detail: String,
        retry_after_secs: u64,
    },
    #[error("{0}")]
    Internal(String),
    /// A storage failure, with the store's own error kept as the source.
    #[error("storage error: {0}")]
    Storage(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    pub fn invalid(field: &str, message: impl Into<String>) -> Error {
        Error::Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a write may not use `id`: it names a memory of another stream. The same
/// words whichever stream holds it and whether the caller may see it, so the
/// answer tells no more than that the id is taken.
pub fn id_in_use(id: &str) -> String {
    format!("id `{id}` is already in use; choose another id")
}

/// A JSON body (or one JSONL line) as `T`: a wrong field is [`Error::Invalid`]
/// naming its path, unreadable JSON is [`Error::BadRequest`]; blank is `{}`.
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    let body = match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None if bytes.is_empty() => &b"{}"[..],
        None => {
            return Err(Error::BadRequest(
                "malformed JSON: the body is only whitespace".into(),
            ))
        }
        Some(b'{') => bytes,
        // serde would read a struct from an array of its fields too.
        Some(_) => return Err(Error::invalid("body", "must be a JSON object")),
    };
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let field = if path == "." {
                    "body".to_string()
                } else {
                    path
                };
                Error::invalid(&field, inner.to_string())
            }
            _ => Error::BadRequest(format!("malformed JSON: {inner}")),
        }
    })
}
