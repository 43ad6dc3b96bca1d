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
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn invalid(field: &str, message: impl Into<String>) -> Error {
        Error::Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

impl From<crate::store::StoreError> for Error {
    fn from(e: crate::store::StoreError) -> Self {
        Error::Internal(format!("storage error: {e}"))
    }
}

impl From<crate::bus::BusError> for Error {
    fn from(e: crate::bus::BusError) -> Self {
        match e {
            crate::bus::BusError::TooLarge(_) => Error::TooLarge(e.to_string()),
            _ => Error::Unavailable(e.to_string()),
        }
    }
}

impl From<crate::embed::EmbedError> for Error {
    fn from(e: crate::embed::EmbedError) -> Self {
        Error::Unavailable(e.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
