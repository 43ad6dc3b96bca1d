//! Any OpenAI-compatible `POST {base_url}/embeddings` endpoint: batched, with a
//! per-request timeout and retries with backoff on rate limits, server errors and
//! transport failures. Client errors (4xx other than 429) fail at once.

use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;

use super::{l2_normalize, EmbedError, Embedder};

pub struct OpenAiEmbedder {
    client: reqwest::Client,
    url: String,
    model: String,
    api_key: Option<String>,
    dim: usize,
    batch_size: usize,
    max_retries: u32,
}

#[derive(Deserialize)]
struct Response {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    embedding: Vec<f32>,
    #[serde(default)]
    index: Option<usize>,
}

/// What one attempt came to.
enum Attempt {
    Done(Vec<Vec<f32>>),
    Retry(String),
    Fail(String),
}

impl OpenAiEmbedder {
    pub fn new(
        base_url: &str,
        model: &str,
        api_key: Option<String>,
        dim: usize,
        batch_size: usize,
        timeout: Duration,
        max_retries: u32,
    ) -> Result<OpenAiEmbedder, EmbedError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| EmbedError::Provider(format!("http client: {e}")))?;
        Ok(OpenAiEmbedder {
            client,
            url: format!("{}/embeddings", base_url.trim_end_matches('/')),
            model: model.to_string(),
            api_key,
            dim,
            batch_size: batch_size.max(1),
            max_retries,
        })
    }

    async fn attempt(&self, texts: &[String]) -> Attempt {
        let mut request = self
            .client
            .post(&self.url)
            .json(&serde_json::json!({ "model": self.model, "input": texts }));
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => return Attempt::Retry(format!("{}: {e}", self.url)),
        };
        let status = response.status();
        if status.as_u16() == 429 || status.is_server_error() {
            return Attempt::Retry(format!("{} answered {status}", self.url));
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Attempt::Fail(format!(
                "{} answered {status}: {}",
                self.url,
                truncate(&body)
            ));
        }
        let parsed: Response = match response.json().await {
            Ok(p) => p,
            Err(e) => return Attempt::Fail(format!("{}: unreadable response: {e}", self.url)),
        };
        if parsed.data.len() != texts.len() {
            return Attempt::Fail(format!(
                "{} returned {} embeddings for {} texts",
                self.url,
                parsed.data.len(),
                texts.len()
            ));
        }
        let mut vectors = vec![Vec::new(); texts.len()];
        for (pos, item) in parsed.data.into_iter().enumerate() {
            let slot = item.index.unwrap_or(pos);
            if slot >= vectors.len() || item.embedding.len() != self.dim {
                return Attempt::Fail(format!(
                    "{} returned an embedding of {} dimensions at index {slot}; embed.dim is {}",
                    self.url,
                    item.embedding.len(),
                    self.dim
                ));
            }
            let mut v = item.embedding;
            l2_normalize(&mut v);
            vectors[slot] = v;
        }
        Attempt::Done(vectors)
    }

    async fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut delay = Duration::from_millis(200);
        let mut tries = 0;
        loop {
            match self.attempt(texts).await {
                Attempt::Done(v) => return Ok(v),
                Attempt::Fail(message) => return Err(EmbedError::Provider(message)),
                Attempt::Retry(message) if tries >= self.max_retries => {
                    return Err(EmbedError::Provider(format!(
                        "{message} (gave up after {} attempts)",
                        tries + 1
                    )))
                }
                Attempt::Retry(message) => {
                    tracing::warn!(%message, attempt = tries + 1, "embedding request failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                    tries += 1;
                }
            }
        }
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(300) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

impl Embedder for OpenAiEmbedder {
    fn model(&self) -> &str {
        &self.model
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(texts.len());
            for batch in texts.chunks(self.batch_size) {
                out.extend(self.embed_batch(batch).await?);
            }
            Ok(out)
        })
    }
}
