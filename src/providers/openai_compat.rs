//! The one HTTP client loomem uses for OpenAI-compatible endpoints (embeddings
//! and chat): JSON in, JSON out, a per-request timeout, retries with backoff on
//! 429, 5xx and transport failures; any other 4xx fails at once.

use std::time::Duration;

pub struct OpenAiHttp {
    client: reqwest::Client,
    base_url: String,
    api_key: Option<String>,
    max_retries: u32,
}

/// Why a request to an OpenAI-compatible endpoint failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HttpError {
    /// The HTTP client could not be built.
    #[error("http client: {0}")]
    Client(String),
    /// The endpoint refused the request (a 4xx other than 429) or answered
    /// something unreadable: retrying would not help.
    #[error("{0}")]
    Failed(String),
    /// 429, 5xx or transport failures on every attempt.
    #[error("{message} (gave up after {attempts} attempts)")]
    GaveUp { message: String, attempts: u32 },
}

/// What one attempt came to.
enum Attempt {
    Done(serde_json::Value),
    Retry(String),
    Fail(String),
}

impl OpenAiHttp {
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        timeout: Duration,
        max_retries: u32,
    ) -> Result<OpenAiHttp, HttpError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| HttpError::Client(e.to_string()))?;
        Ok(OpenAiHttp {
            client,
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key,
            max_retries,
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}/{}", self.base_url, path.trim_start_matches('/'))
    }

    async fn attempt(&self, url: &str, body: &serde_json::Value) -> Attempt {
        let mut request = self.client.post(url).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => return Attempt::Retry(format!("{url}: {e}")),
        };
        let status = response.status();
        if status.as_u16() == 429 || status.is_server_error() {
            return Attempt::Retry(format!("{url} answered {status}"));
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Attempt::Fail(format!("{url} answered {status}: {}", truncate(&body)));
        }
        match response.json().await {
            Ok(v) => Attempt::Done(v),
            Err(e) => Attempt::Fail(format!("{url}: unreadable response: {e}")),
        }
    }

    /// POST `body` to `{base_url}/{path}` and return the JSON answer.
    pub async fn post(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, HttpError> {
        let url = self.url(path);
        let mut delay = Duration::from_millis(200);
        let mut tries = 0;
        loop {
            match self.attempt(&url, body).await {
                Attempt::Done(v) => return Ok(v),
                Attempt::Fail(message) => return Err(HttpError::Failed(message)),
                Attempt::Retry(message) if tries >= self.max_retries => {
                    return Err(HttpError::GaveUp {
                        message,
                        attempts: tries + 1,
                    })
                }
                Attempt::Retry(message) => {
                    tracing::warn!(%message, attempt = tries + 1, "request failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                    tries += 1;
                }
            }
        }
    }
}

/// The first 300 characters of an error body.
pub fn truncate(s: &str) -> &str {
    match s.char_indices().nth(300) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}
