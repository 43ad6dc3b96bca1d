//! A local stand-in for a paid LLM API (the one test double the project
//! allows): an OpenAI-compatible chat endpoint.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

/// A local stand-in for an OpenAI-compatible chat endpoint: answers each
/// request with the text set for its JSON schema's name (facts, entities,
/// judgements) and fixed token usage, recording every request.
pub struct StubLlm {
    pub url: String,
    replies: Arc<Mutex<HashMap<String, String>>>,
    pub requests: Arc<AtomicUsize>,
    pub seen: Arc<Mutex<Vec<Value>>>,
    delay_ms: Arc<AtomicU64>,
}

impl StubLlm {
    pub fn answer(&self, schema: &str, text: &str) {
        self.replies
            .lock()
            .unwrap()
            .insert(schema.to_string(), text.to_string());
    }

    /// Answer every later request only after `ms` milliseconds (a slow model).
    pub fn delay(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    pub fn requests_for(&self, schema: &str) -> Vec<Value> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r["response_format"]["json_schema"]["name"] == schema)
            .cloned()
            .collect()
    }
}

pub async fn stub_llm() -> StubLlm {
    use axum::routing::post;
    let reply: Arc<Mutex<HashMap<String, String>>> = Default::default();
    let requests = Arc::new(AtomicUsize::new(0));
    let seen: Arc<Mutex<Vec<Value>>> = Default::default();
    let delay_ms = Arc::new(AtomicU64::new(0));
    let (r, n, s, d) = (
        reply.clone(),
        requests.clone(),
        seen.clone(),
        delay_ms.clone(),
    );
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(move |axum::Json(body): axum::Json<Value>| {
            let (r, n, s, d) = (r.clone(), n.clone(), s.clone(), d.clone());
            async move {
                let delay = d.load(Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                n.fetch_add(1, Ordering::SeqCst);
                s.lock().unwrap().push(body.clone());
                let schema = body["response_format"]["json_schema"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let content = r.lock().unwrap().get(&schema).cloned().unwrap_or_default();
                axum::Json(json!({
                    "id": "chatcmpl-stub",
                    "model": body["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    StubLlm {
        url,
        replies: reply,
        requests,
        seen,
        delay_ms,
    }
}
