//! The optional LLM: any OpenAI-compatible `POST {base_url}/chat/completions`.
//! Every call asks for JSON that follows a schema, is charged to a stream, and is
//! recorded in the `llm_calls` table (tokens, `cost_usd`, outcome). A stream that
//! has spent `daily_cost_cap_usd` today gets [`LlmError::CapReached`] without a
//! call, and its callers take their LLM-free path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use crate::core::model::{now_micros, Micros};
use crate::core::time::DAY_MICROS;
use crate::providers::openai_compat::OpenAiHttp;
use crate::store::llm_calls::LlmCall;
use crate::store::Store;

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("stream `{stream}` has spent ${spent:.4} of its ${cap:.4} daily LLM budget")]
    CapReached {
        stream: String,
        spent: f64,
        cap: f64,
    },
    #[error("LLM request failed: {0}")]
    Request(String),
    #[error("LLM answer unusable: {0}")]
    Answer(String),
}

/// A JSON answer and what it cost.
#[derive(Debug, Clone)]
pub struct Reply {
    pub json: serde_json::Value,
    pub model: String,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_usd: f64,
}

pub struct Llm {
    http: OpenAiHttp,
    cfg: LlmConfig,
    store: Arc<Store>,
    /// Dollars spent per (stream, UTC day), loaded from `llm_calls` on first use.
    spent: Mutex<HashMap<(String, i64), f64>>,
}

#[derive(Deserialize)]
struct ChatResponse {
    #[serde(default)]
    model: Option<String>,
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<ChatUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: Message,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize, Default)]
struct ChatUsage {
    #[serde(default)]
    prompt_tokens: i64,
    #[serde(default)]
    completion_tokens: i64,
}

/// The JSON inside a model's answer: the whole text, or the first fenced or
/// braced object in it (some servers ignore `response_format`).
fn json_in(text: &str) -> Option<serde_json::Value> {
    let text = text.trim();
    if let Ok(v) = serde_json::from_str(text) {
        return Some(v);
    }
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    (end > start)
        .then(|| serde_json::from_str(&text[start..=end]).ok())
        .flatten()
}

impl Llm {
    /// The configured LLM, or None when `llm.base_url` is empty.
    pub fn from_config(
        cfg: &LlmConfig,
        env: &HashMap<String, String>,
        store: Arc<Store>,
    ) -> Result<Option<Arc<Llm>>, crate::providers::openai_compat::HttpError> {
        if !cfg.enabled() {
            return Ok(None);
        }
        let api_key = (!cfg.api_key_env.is_empty())
            .then(|| env.get(&cfg.api_key_env).cloned())
            .flatten()
            .filter(|k| !k.is_empty());
        let http = OpenAiHttp::new(
            &cfg.base_url,
            api_key,
            Duration::from_millis(cfg.timeout_ms),
            cfg.max_retries,
        )?;
        Ok(Some(Arc::new(Llm {
            http,
            cfg: cfg.clone(),
            store,
            spent: Mutex::new(HashMap::new()),
        })))
    }

    pub fn model(&self) -> &str {
        &self.cfg.model
    }

    pub fn config(&self) -> &LlmConfig {
        &self.cfg
    }

    /// Dollars `stream` has spent on LLM calls today (UTC).
    pub async fn spent_today(&self, stream: &str) -> Result<f64, LlmError> {
        let day = now_micros().div_euclid(DAY_MICROS);
        let key = (stream.to_string(), day);
        if let Some(v) = self.spent.lock().expect("spent lock").get(&key) {
            return Ok(*v);
        }
        let stored = self
            .store
            .llm_spent(stream, day * DAY_MICROS)
            .await
            .map_err(|e| LlmError::Request(format!("reading llm_calls: {e}")))?;
        let mut spent = self.spent.lock().expect("spent lock");
        spent.retain(|(_, d), _| *d == day);
        Ok(*spent.entry(key).or_insert(stored))
    }

    fn charge(&self, stream: &str, at: Micros, cost: f64) {
        let key = (stream.to_string(), at.div_euclid(DAY_MICROS));
        if let Some(v) = self.spent.lock().expect("spent lock").get_mut(&key) {
            *v += cost;
        }
    }

    /// Ask for a JSON object following `schema` (named `schema_name`), charged to
    /// `stream` for `purpose`. The call is recorded whether it succeeds or not.
    pub async fn chat_json(
        &self,
        stream: &str,
        purpose: &str,
        system: &str,
        user: &str,
        schema_name: &str,
        schema: serde_json::Value,
    ) -> Result<Reply, LlmError> {
        let spent = self.spent_today(stream).await?;
        if spent >= self.cfg.daily_cost_cap_usd {
            return Err(LlmError::CapReached {
                stream: stream.to_string(),
                spent,
                cap: self.cfg.daily_cost_cap_usd,
            });
        }
        let body = serde_json::json!({
            "model": self.cfg.model,
            "temperature": 0,
            "max_tokens": self.cfg.max_output_tokens,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": schema_name, "strict": true, "schema": schema},
            },
        });
        let started = std::time::Instant::now();
        let answer = self.http.post("chat/completions", &body).await;
        let mut call = LlmCall {
            id: uuid::Uuid::new_v4().to_string(),
            stream: stream.to_string(),
            purpose: purpose.to_string(),
            model: self.cfg.model.clone(),
            prompt_tokens: 0,
            completion_tokens: 0,
            cost_usd: 0.0,
            status: "ok".into(),
            error: None,
            latency_ms: started.elapsed().as_millis() as i64,
            created_at: now_micros(),
        };
        let result = match answer {
            Err(e) => Err(LlmError::Request(e.to_string())),
            Ok(v) => match serde_json::from_value::<ChatResponse>(v) {
                Err(e) => Err(LlmError::Answer(format!("not a chat completion: {e}"))),
                Ok(r) => {
                    let usage = r.usage.unwrap_or_default();
                    call.prompt_tokens = usage.prompt_tokens.max(0);
                    call.completion_tokens = usage.completion_tokens.max(0);
                    call.cost_usd = (call.prompt_tokens as f64 * self.cfg.input_cost_per_mtok
                        + call.completion_tokens as f64 * self.cfg.output_cost_per_mtok)
                        / 1e6;
                    if let Some(m) = r.model.filter(|m| !m.is_empty()) {
                        call.model = m;
                    }
                    let text = r
                        .choices
                        .into_iter()
                        .next()
                        .and_then(|c| c.message.content)
                        .unwrap_or_default();
                    match json_in(&text) {
                        Some(json) => Ok(Reply {
                            json,
                            model: call.model.clone(),
                            prompt_tokens: call.prompt_tokens,
                            completion_tokens: call.completion_tokens,
                            cost_usd: call.cost_usd,
                        }),
                        None => Err(LlmError::Answer(format!(
                            "no JSON object in the answer: {}",
                            crate::providers::openai_compat::truncate(&text)
                        ))),
                    }
                }
            },
        };
        if let Err(e) = &result {
            call.status = "error".into();
            call.error = Some(e.to_string());
        }
        self.charge(stream, call.created_at, call.cost_usd);
        if let Err(e) = self.store.add_llm_call(&call).await {
            tracing::warn!(error = %e, "cannot record an LLM call in llm_calls");
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_found_inside_chatty_answers() {
        assert_eq!(json_in(r#"{"a":1}"#).unwrap()["a"], 1);
        assert_eq!(
            json_in("Here you go:\n```json\n{\"a\": 2}\n```").unwrap()["a"],
            2
        );
        assert!(json_in("no json here").is_none());
        assert!(json_in("} {").is_none());
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// Base URL of an OpenAI-compatible endpoint (`…/v1`); empty = no LLM.
    #[serde(default)]
    pub base_url: String,
    #[serde(default)]
    pub model: String,
    /// Environment variable holding the API key (empty = no key).
    #[serde(default)]
    pub api_key_env: String,
    #[serde(default = "default_llm_timeout")]
    pub timeout_ms: u64,
    /// Retries after a 429, a 5xx or a transport error.
    #[serde(default = "default_llm_retries")]
    pub max_retries: u32,
    /// Longest answer asked for, in tokens.
    #[serde(default = "default_llm_max_tokens")]
    pub max_output_tokens: u32,
    /// Prices in dollars per million tokens, for `cost_usd`.
    #[serde(default)]
    pub input_cost_per_mtok: f64,
    #[serde(default)]
    pub output_cost_per_mtok: f64,
    /// Dollars a stream may spend on LLM calls per UTC day; past it the LLM-free
    /// paths take over (ingestion never stops).
    #[serde(default = "default_llm_cap")]
    pub daily_cost_cap_usd: f64,
    /// Queue new memories for LLM entity extraction.
    #[serde(default = "yes")]
    pub ner: bool,
    /// Ask the LLM whether a new memory updates an earlier one when the rules
    /// find no update cue.
    #[serde(default = "yes")]
    pub judge_contradictions: bool,
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            base_url: String::new(),
            model: String::new(),
            api_key_env: String::new(),
            timeout_ms: default_llm_timeout(),
            max_retries: default_llm_retries(),
            max_output_tokens: default_llm_max_tokens(),
            input_cost_per_mtok: 0.0,
            output_cost_per_mtok: 0.0,
            daily_cost_cap_usd: default_llm_cap(),
            ner: true,
            judge_contradictions: true,
        }
    }
}

impl LlmConfig {
    pub fn enabled(&self) -> bool {
        !self.base_url.trim().is_empty()
    }
}

fn default_llm_timeout() -> u64 {
    60_000
}

fn default_llm_retries() -> u32 {
    2
}

fn default_llm_max_tokens() -> u32 {
    1024
}

fn default_llm_cap() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}
