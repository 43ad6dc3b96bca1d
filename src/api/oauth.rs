//! OAuth 2.1 for remote MCP clients (see `service::oauth`): the metadata
//! documents, registration, the consent page, the token and revocation
//! endpoints. They are public (they are how a client gets a key); the
//! consent itself needs an API key, typed into the page.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::{Form, Json};
use serde::Deserialize;

use crate::app::Engine;
use crate::service::oauth::{AuthorizeParams, Consent, OAuthError, RegisterRequest, TokenRequest};

fn host(headers: &HeaderMap) -> String {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_string()
}

/// The issuer a request is answered as.
pub fn issuer(engine: &Engine, headers: &HeaderMap) -> String {
    engine.oauth.issuer(&host(headers))
}

fn no_store(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CACHE_CONTROL, "no-store".parse().expect("static"));
    r
}

impl IntoResponse for OAuthError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        no_store(
            (
                status,
                Json(serde_json::json!({
                    "error": self.error,
                    "error_description": self.description,
                    "detail": self.description,
                })),
            )
                .into_response(),
        )
    }
}

/// `GET /.well-known/oauth-authorization-server`.
pub async fn server_metadata(
    State(engine): State<Arc<Engine>>,
    headers: HeaderMap,
) -> Json<serde_json::Value> {
    Json(engine.oauth.server_metadata(&issuer(&engine, &headers)))
}

/// `GET /.well-known/oauth-protected-resource[/mcp]`.
pub async fn resource_metadata(
    State(engine): State<Arc<Engine>>,
    headers: HeaderMap,
) -> Json<serde_json::Value> {
    Json(engine.oauth.resource_metadata(&issuer(&engine, &headers)))
}

/// `POST /oauth/register`.
pub async fn register(
    State(engine): State<Arc<Engine>>,
    body: axum::body::Bytes,
) -> Result<Response, OAuthError> {
    let req: RegisterRequest = serde_json::from_slice(&body).map_err(|e| OAuthError {
        status: 400,
        error: "invalid_client_metadata",
        description: format!("the body is not client metadata: {e}"),
    })?;
    let registered = engine.oauth.register(req).await?;
    Ok(no_store(
        (StatusCode::CREATED, Json(registered)).into_response(),
    ))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// The consent page: the request's parameters as hidden fields, the key,
/// the role and the streams.
fn consent_page(client: &str, p: &AuthorizeParams, error: Option<&str>) -> String {
    let hidden: String = [
        ("response_type", p.response_type.as_str()),
        ("client_id", p.client_id.as_str()),
        ("redirect_uri", p.redirect_uri.as_str()),
        ("state", p.state.as_deref().unwrap_or("")),
        ("code_challenge", p.code_challenge.as_str()),
        ("code_challenge_method", p.code_challenge_method.as_str()),
        ("scope", p.scope.as_deref().unwrap_or("")),
        ("resource", p.resource.as_deref().unwrap_or("")),
    ]
    .iter()
    .map(|(k, v)| format!(r#"<input type="hidden" name="{k}" value="{}">"#, escape(v)))
    .collect();
    let error = error
        .map(|e| format!(r#"<p class="error" id="error">{}</p>"#, escape(e)))
        .unwrap_or_default();
    format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Connect {client} to loomem</title>
<style>body{{font:15px system-ui,sans-serif;max-width:34rem;margin:3rem auto;color:#1d232a}}label{{display:block;margin:.8rem 0 .2rem}}input,select{{font:inherit;padding:.35rem;width:100%;box-sizing:border-box}}button{{margin-top:1rem;padding:.45rem 1rem;font:inherit}}.error{{color:#b3261e}}.muted{{color:#66707a}}</style></head>
<body><h1>Connect {client}</h1>
<p><b>{client}</b> asks to use loomem's memory over MCP. Sign in with an API key and choose what it may do: the access it gets is at most your key's, in the streams you name.</p>
<p class="muted">It will be sent back to {redirect}.</p>{error}
<form method="post" action="/oauth/authorize">{hidden}
<label for="api_key">API key</label><input type="password" id="api_key" name="api_key" autocomplete="off" required>
<label for="role">Role</label><select id="role" name="role"><option value="writer">writer: search and store</option><option value="reader">reader: search only</option><option value="admin">admin: everything (admin keys only)</option></select>
<label for="streams">Streams (comma-separated; empty: your key's)</label><input id="streams" name="streams">
<button type="submit" id="approve">Allow</button></form></body></html>"#,
        client = escape(client),
        redirect = escape(&p.redirect_uri),
    )
}

/// `GET /oauth/authorize`: the consent page (a request that cannot go on is
/// answered here, never redirected).
pub async fn authorize_page(
    State(engine): State<Arc<Engine>>,
    Query(p): Query<AuthorizeParams>,
) -> Result<Response, OAuthError> {
    let client = engine.oauth.check(&p).await?;
    Ok(no_store(
        Html(consent_page(&client.client_name, &p, None)).into_response(),
    ))
}

#[derive(Deserialize)]
pub struct ApproveForm {
    #[serde(flatten)]
    params: AuthorizeParams,
    #[serde(flatten)]
    consent: Consent,
}

/// `POST /oauth/authorize`: approve; redirect with the code, or show the
/// page again with what was wrong.
pub async fn authorize(
    State(engine): State<Arc<Engine>>,
    Form(form): Form<ApproveForm>,
) -> Result<Response, OAuthError> {
    let client = engine.oauth.check(&form.params).await?;
    match engine
        .oauth
        .approve(&engine.auth, &form.params, &form.consent)
        .await
    {
        Ok(url) => Ok(no_store(
            (StatusCode::FOUND, [(header::LOCATION, url)]).into_response(),
        )),
        Err(e) => {
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
            let page = consent_page(&client.client_name, &form.params, Some(&e.description));
            Ok(no_store((status, Html(page)).into_response()))
        }
    }
}

/// `POST /oauth/token`.
pub async fn token(
    State(engine): State<Arc<Engine>>,
    Form(req): Form<TokenRequest>,
) -> Result<Response, OAuthError> {
    let answer = engine.oauth.token(req).await?;
    Ok(no_store(Json(answer).into_response()))
}

#[derive(Deserialize)]
pub struct RevokeForm {
    token: String,
}

/// `POST /oauth/revoke` (RFC 7009: 200 whether or not the token was known).
pub async fn revoke(
    State(engine): State<Arc<Engine>>,
    Form(form): Form<RevokeForm>,
) -> Result<Response, OAuthError> {
    engine.oauth.revoke(&form.token).await?;
    Ok(no_store(StatusCode::OK.into_response()))
}
