//! Request extractors: the JSON body (any content type, errors naming the field)
//! and the authenticated caller.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use serde::de::DeserializeOwned;

use crate::app::Engine;
use crate::core::error::Error;
use crate::core::Caller;

/// A JSON body. Malformed JSON is a 400; a body of the wrong shape is a 422
/// whose detail names the offending field.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                Error::TooLarge("request body is too large".into())
            } else {
                Error::BadRequest(format!("cannot read request body: {r}"))
            }
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

pub use crate::core::error::parse_json;

/// Authenticate every request that reaches the protected routes, and hand the
/// caller to the handler through the request's extensions.
pub async fn require_auth(
    State(engine): State<Arc<Engine>>,
    mut req: Request,
    next: Next,
) -> Result<Response, Error> {
    let header = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let caller = engine.auth.authenticate(header)?;
    req.extensions_mut().insert(caller);
    Ok(next.run(req).await)
}

/// The caller `require_auth` resolved.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(Error::Unauthorized)
    }
}

/// Query-string parameters; a malformed one is a 400 with a JSON `detail`.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|q| ApiQuery(q.0))
            .map_err(|e| Error::BadRequest(format!("query string: {}", e.body_text())))
    }
}
