//! Any OpenAI-compatible `POST {base_url}/embeddings` endpoint: batched, with a
//! per-request timeout and retries with backoff on rate limits, server errors and
//! transport failures. Client errors (4xx other than 429) fail at once.

use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;

use super::{l2_normalize, EmbedError, Embedder};
use crate::providers::openai_compat::OpenAiHttp;

pub struct OpenAiEmbedder {
    http: OpenAiHttp,
    model: String,
    dim: usize,
    batch_size: usize,
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
        Ok(OpenAiEmbedder {
            http: OpenAiHttp::new(base_url, api_key, timeout, max_retries)
                .map_err(|e| EmbedError::Provider(e.to_string()))?,
            model: model.to_string(),
            dim,
            batch_size: batch_size.max(1),
        })
    }

    async fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let url = self.http.url("embeddings");
        let body = serde_json::json!({ "model": self.model, "input": texts });
        let answer = self
            .http
            .post("embeddings", &body)
            .await
            .map_err(|e| EmbedError::Provider(e.to_string()))?;
        let parsed: Response = serde_json::from_value(answer)
            .map_err(|e| EmbedError::Provider(format!("{url}: unreadable response: {e}")))?;
        if parsed.data.len() != texts.len() {
            return Err(EmbedError::Provider(format!(
                "{url} returned {} embeddings for {} texts",
                parsed.data.len(),
                texts.len()
            )));
        }
        let mut vectors = vec![Vec::new(); texts.len()];
        for (pos, item) in parsed.data.into_iter().enumerate() {
            let slot = item.index.unwrap_or(pos);
            if slot >= vectors.len() || item.embedding.len() != self.dim {
                return Err(EmbedError::Provider(format!(
                    "{url} returned an embedding of {} dimensions at index {slot}; embed.dim is {}",
                    item.embedding.len(),
                    self.dim
                )));
            }
            let mut v = item.embedding;
            l2_normalize(&mut v);
            vectors[slot] = v;
        }
        Ok(vectors)
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
