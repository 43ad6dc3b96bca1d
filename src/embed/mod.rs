//! Embedding providers behind one trait. Every provider embeds a whole batch in one call.

mod hash;

use std::sync::Arc;

use futures::future::BoxFuture;

pub use hash::HashEmbedder;

use crate::config::{EmbedConfig, EmbedProvider};

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("embedding provider failed: {0}")]
    Provider(String),
}

/// Turns texts into unit-length vectors of a fixed dimension.
pub trait Embedder: Send + Sync {
    /// The name recorded in each chunk's `embed_model`.
    fn model(&self) -> &str;
    fn dim(&self) -> usize;
    /// One vector per text, in order.
    fn embed<'a>(&'a self, texts: &'a [String])
        -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>>;
}

/// The embedder the configuration names.
pub fn from_config(cfg: &EmbedConfig) -> Result<Arc<dyn Embedder>, EmbedError> {
    match cfg.provider {
        EmbedProvider::Hash => Ok(Arc::new(HashEmbedder::new(cfg.dim))),
    }
}

/// Scale `v` to unit length (left as is when it is all zeros).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// Cosine similarity of two unit vectors.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
