//! `[embed]`: which embedder turns text into vectors.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum EmbedProvider {
    /// sentence-transformers all-MiniLM-L6-v2, in-process (candle).
    Minilm,
    /// Per-token vectors distilled from the MiniLM model in `model_dir`: a
    /// tokenizer pass and a weighted sum, for bulk back-fills.
    Static,
    /// An OpenAI-compatible `/v1/embeddings` endpoint.
    Openai,
    /// Feature hashing; no model (tests, benches).
    Hash,
}

/// The arithmetic of MiniLM's dense layers on CPUs that run loomem's
/// kernels (elsewhere candle's f32).
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// int8 products (AVX-512 VNNI), each input row scaled on the fly: ~1.4×
    /// the texts a second of bf16, sentence vectors at cosine ≥ 0.99 of
    /// sentence-transformers'. Where the CPU lacks VNNI but has AVX2, the same
    /// products on AVX2; elsewhere candle's f32.
    #[default]
    Int8,
    /// bf16 products (AVX-512 BF16): cosine ≥ 0.999. Where the CPU lacks
    /// AVX-512 BF16, candle's f32.
    Bf16,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedConfig {
    pub provider: EmbedProvider,
    /// Vector dimension; fixed for the life of a data directory.
    pub dim: usize,
    /// MiniLM: directory holding config.json, model.safetensors, tokenizer.json
    /// (`~/` is the home directory).
    #[serde(default = "default_model_dir")]
    pub model_dir: PathBuf,
    /// MiniLM: longer texts are truncated to this many tokens.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// Texts per forward pass (MiniLM) or per request (OpenAI).
    #[serde(default = "default_embed_batch")]
    pub batch_size: usize,
    /// MiniLM: the dense layers' arithmetic.
    #[serde(default)]
    pub precision: Precision,
    /// MiniLM: the Linux nice value (0–19) of the threads that embed the
    /// pipeline's batches. 0 shares the CPU evenly between stores and
    /// searches; a higher value lets searches (the query lane and the async
    /// runtime, at nice 0) take the CPU first, at the cost of store latency
    /// whenever searches keep both cores busy.
    #[serde(default)]
    pub batch_niceness: i32,
    /// OpenAI: base URL, e.g. `https://api.openai.com/v1`.
    #[serde(default)]
    pub base_url: String,
    /// OpenAI: model name sent with each request and recorded in `embed_model`.
    #[serde(default)]
    pub model: String,
    /// OpenAI: environment variable holding the API key (empty = no key).
    #[serde(default)]
    pub api_key_env: String,
    /// OpenAI: per-request timeout.
    #[serde(default = "default_embed_timeout")]
    pub timeout_ms: u64,
    /// OpenAI: retries after a 429, a 5xx or a transport error.
    #[serde(default = "default_embed_retries")]
    pub max_retries: u32,
}

pub(crate) fn default_model_dir() -> PathBuf {
    PathBuf::from("~/.cache/loomem/models/all-MiniLM-L6-v2")
}

fn default_max_tokens() -> usize {
    256
}

fn default_embed_batch() -> usize {
    32
}

fn default_embed_timeout() -> u64 {
    30_000
}

fn default_embed_retries() -> u32 {
    3
}
