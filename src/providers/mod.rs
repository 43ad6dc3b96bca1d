//! Model providers: text embedders (`minilm` with candle, `openai`, `hash`) and
//! the optional OpenAI-compatible LLM client with its cost accounting.

pub mod embed;
pub mod llm;
pub mod openai_compat;
