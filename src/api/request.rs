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
        parse_json(&json_body(req, state).await?).map(ApiJson)
    }
}

/// A JSON array body (a peer's import takes one), under the same rules as
/// [`ApiJson`]'s objects.
pub struct ApiJsonArray(pub Vec<serde_json::Value>);

impl<S: Send + Sync> FromRequest<S> for ApiJsonArray {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = json_body(req, state).await?;
        match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'[') => serde_json::from_slice(&bytes)
                .map(ApiJsonArray)
                .map_err(|e| Error::BadRequest(format!("malformed JSON: {e}"))),
            _ => Err(Error::invalid("body", "must be a JSON array")),
        }
    }
}

/// A request's body, refused unless it is JSON (or empty).
async fn json_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, Error> {
    let content_type = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or_default().to_string());
    let bytes = Bytes::from_request(req, state).await.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::TooLarge("request body is too large".into())
        } else {
            Error::BadRequest(format!("cannot read request body: {r}"))
        }
    })?;
    // A web page can POST `text/plain` across sites without a preflight;
    // only a JSON body (or none at all) reaches the handlers.
    match content_type {
        Some(t) if !is_json(&t) => {
            return Err(Error::UnsupportedMediaType(format!(
                "Content-Type `{t}` is not accepted here; send application/json"
            )))
        }
        None if !bytes.is_empty() => {
            return Err(Error::UnsupportedMediaType(
                "a request body needs Content-Type: application/json".into(),
            ))
        }
        _ => {}
    }
    Ok(bytes)
}

/// `application/json`, `application/<x>+json`, with or without parameters.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

pub use crate::core::error::parse_json;

/// Authenticate every request that reaches the protected routes, check that
/// its key's role may use the route (`super::need`), and hand the caller to
/// the handler through the request's extensions.
pub async fn require_auth(State(engine): State<Arc<Engine>>, req: Request, next: Next) -> Response {
    use axum::response::IntoResponse;
    // A refusal leaves the request's body unread, and hyper then drops the
    // connection after the answer: say so in the answer, or a client that
    // reuses the connection (httpx after an MCP 401) races the close and
    // sees "server disconnected without sending a response".
    let has_body = req
        .headers()
        .contains_key(axum::http::header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    match authorize(&engine, req).await {
        Ok(req) => next.run(req).await,
        Err(refused) => {
            let mut response = refused.into_response();
            if has_body {
                response.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            response
        }
    }
}

/// The caller of `req`, in its extensions, or the answer that refuses it.
async fn authorize(engine: &Engine, mut req: Request) -> Result<Request, Response> {
    use axum::response::IntoResponse;
    let header = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    // Neuroloom's clients send `Token <key>`; there, as in Neuroloom, a
    // Bearer header is refused.
    let token_scheme;
    let header = if route.starts_with(super::compat::neuroloom::BASE) {
        token_scheme = header
            .and_then(|h| h.strip_prefix("Token "))
            .map(|key| format!("Bearer {key}"))
            .unwrap_or_default();
        Some(token_scheme.as_str())
    } else {
        header
    };
    let caller = match engine.auth.authenticate(header).await {
        Ok(caller) => caller,
        // MCP clients learn from the 401 where to get a token (RFC 9728).
        Err(Error::Unauthorized) if route == "/mcp" || route.starts_with("/mcp/") => {
            let issuer = super::oauth::issuer(engine, req.headers());
            let mut response = Error::Unauthorized.into_response();
            let value = format!(
                r#"Bearer resource_metadata="{issuer}/.well-known/oauth-protected-resource/mcp""#
            );
            if let Ok(v) = value.parse() {
                response
                    .headers_mut()
                    .insert(axum::http::header::WWW_AUTHENTICATE, v);
            }
            return Err(response);
        }
        Err(e) => return Err(e.into_response()),
    };
    if caller.name == crate::service::auth::PASSTHROUGH {
        // With no key, every request is admin: only pages of this machine may
        // reach the API (against DNS rebinding, as `/mcp` always does).
        let host = req
            .headers()
            .get(axum::http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(crate::service::auth::host_name)
            .unwrap_or_default();
        let allowed = &engine.cfg.server.mcp_allowed_hosts;
        if !allowed
            .iter()
            .any(|h| h == "*" || h.eq_ignore_ascii_case(host))
        {
            return Err(Error::Forbidden(format!(
                "Host `{host}` is not allowed in local passthrough mode (server.mcp_allowed_hosts)"
            ))
            .into_response());
        }
    }
    caller
        .require(super::need(req.method().as_str(), &route))
        .map_err(IntoResponse::into_response)?;
    // A method the route does not have is the router's 405, not a request
    // that spends a budget.
    if super::declared(req.method().as_str(), &route) {
        let expensive = super::expensive(req.method().as_str(), &route, engine.llm.is_some());
        engine
            .limits
            .check(&caller, expensive)
            .map_err(IntoResponse::into_response)?;
    }
    req.extensions_mut().insert(caller);
    Ok(req)
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
