//! Embedding providers behind one trait. Every provider embeds a whole batch in one call.

mod cache;
pub mod config;
mod hash;
pub mod minilm;
mod openai;

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;

pub use cache::CachedEmbedder;
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

/// Scale `v` to unit length (left as is when it is all zeros).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// Cosine similarity of two unit vectors. The pipeline's within-batch checks
/// call this O(batch²) times, so it uses AVX2 when the CPU has it (the build
/// targets baseline x86-64, i.e. SSE2 only).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { dot_avx2(a, b) };
    }
    dot_lanes(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

/// Sixteen independent partial sums let the compiler vectorise the loop (a
/// single running sum cannot be reordered) and keep two vector registers busy.
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let (lanes_a, rest_a) = a.as_chunks::<16>();
    let (lanes_b, rest_b) = b.as_chunks::<16>();
    let mut acc = [0.0f32; 16];
    for (x, y) in lanes_a.iter().zip(lanes_b) {
        for k in 0..16 {
            acc[k] += x[k] * y[k];
        }
    }
    let tail: f32 = rest_a.iter().zip(rest_b).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

impl From<EmbedError> for crate::core::Error {
    fn from(e: EmbedError) -> Self {
        crate::core::Error::Unavailable(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_the_plain_sum_for_any_length() {
        for n in [0usize, 1, 7, 8, 9, 384, 1000] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - plain).abs() < 1e-3, "n = {n}");
        }
    }
}
