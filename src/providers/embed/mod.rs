//! Embedding providers behind one trait. Every provider embeds a whole batch in one call.

mod cache;
pub mod config;
pub mod distilled;
mod hash;
pub mod minilm;
mod openai;

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;

pub use cache::CachedEmbedder;
pub use distilled::StaticEmbedder;
pub use hash::HashEmbedder;
pub use minilm::MiniLmEmbedder;
pub use openai::OpenAiEmbedder;

use crate::providers::embed::config::EmbedConfig;
use crate::providers::embed::config::EmbedProvider;

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("embedding provider failed: {0}")]
    Provider(String),
    #[error(transparent)]
    Load(#[from] minilm::LoadError),
}

impl EmbedError {
    /// The tokenizer failed on a text.
    pub(crate) fn tokenizer(e: impl std::fmt::Display) -> EmbedError {
        EmbedError::Provider(format!("tokenizer: {e}"))
    }
}

/// Turns texts into unit-length vectors of a fixed dimension.
pub trait Embedder: Send + Sync {
    /// The name recorded in each chunk's `embed_model`.
    fn model(&self) -> &str;
    fn dim(&self) -> usize;
    /// One vector per text, in order.
    fn embed<'a>(&'a self, texts: &'a [String])
        -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>>;
    /// One search query, which someone is waiting on: a provider that queues
    /// work runs it apart from the bulk passes of the pipeline.
    fn embed_query<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<Vec<f32>, EmbedError>> {
        Box::pin(async move {
            self.embed(&[text.to_string()])
                .await?
                .pop()
                .ok_or_else(|| EmbedError::Provider("no vector for the query".into()))
        })
    }
}

/// The embedder the configuration names.
/// `env` supplies the API key variable of the openai provider.
pub fn from_config(
    cfg: &EmbedConfig,
    env: &HashMap<String, String>,
) -> Result<Arc<dyn Embedder>, EmbedError> {
    match cfg.provider {
        EmbedProvider::Hash => Ok(Arc::new(HashEmbedder::new(cfg.dim))),
        EmbedProvider::Minilm => Ok(Arc::new(MiniLmEmbedder::load(
            &cfg.model_dir,
            cfg.max_tokens,
            cfg.batch_size,
            cfg.precision,
            cfg.batch_niceness,
        )?)),
        EmbedProvider::Static => Ok(Arc::new(StaticEmbedder::load(
            &cfg.model_dir,
            cfg.max_tokens,
        )?)),
        EmbedProvider::Openai => {
            let api_key = match cfg.api_key_env.as_str() {
                "" => None,
                var => env.get(var).cloned().filter(|k| !k.is_empty()),
            };
            Ok(Arc::new(OpenAiEmbedder::new(
                &cfg.base_url,
                &cfg.model,
                api_key,
                cfg.dim,
                cfg.batch_size,
                std::time::Duration::from_millis(cfg.timeout_ms),
                cfg.max_retries,
            )?))
        }
    }
}

pub use crate::core::vector::{dot, l2_normalize};

impl From<EmbedError> for crate::core::Error {
    fn from(e: EmbedError) -> Self {
        crate::core::Error::Unavailable(e.to_string())
    }
}
