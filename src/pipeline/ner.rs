//! LLM entity extraction, queued behind the pipeline. `extract_entities` finds
//! entities by dictionary and rules while the batch is in hand; with an LLM
//! configured (`llm.ner`) it also queues each kept memory here. The queue's
//! task waits until the memory is committed, asks the LLM for the entities of
//! up to `BATCH` memories of one stream at a time, adds what it finds to the
//! chunk's `entities` (a read-modify-write in the writer, skipped if the text
//! changed meanwhile) and to the stream's graph, and notes `llm_ner` in
//! `extraction_meta`. The stream's daily LLM budget applies; past it, or when
//! the queue is full, memories keep their rule-based entities.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::mpsc;

use crate::core::model::Chunk;
use crate::providers::llm::{Llm, LlmError};
use crate::store::graph::{entity_key, Mention};
use crate::store::{Filter, Store};

/// Memories per LLM call.
const BATCH: usize = 8;
/// How long the task gathers a batch after the first memory arrives.
const GATHER: Duration = Duration::from_millis(300);
/// Checks for a memory that is not committed yet (it may have been dropped as
/// a duplicate; then it never will be).
const MAX_ATTEMPTS: u32 = 5;
const QUEUE_CAPACITY: usize = 10_000;

const TYPES: &[&str] = &[
    "PERSON",
    "ORGANIZATION",
    "TECHNOLOGY",
    "PROJECT",
    "PLACE",
    "PRODUCT",
    "EVENT",
    "OTHER",
];

const SYSTEM_PROMPT: &str = "You find named entities in short memories about a user. For each \
numbered memory, list the people, organizations, technologies, projects, places, products and \
events it names (not pronouns, not generic nouns), with the number of the memory they appear in. \
Return JSON {\"entities\": [{\"memory\": n, \"name\": \"…\", \"type\": \"PERSON|ORGANIZATION|\
TECHNOLOGY|PROJECT|PLACE|PRODUCT|EVENT|OTHER\"}]}.";

#[derive(Debug, Clone)]
struct Item {
    stream: String,
    id: String,
    content: String,
    content_hash: String,
    attempt: u32,
}

/// Counters for `/v1/status`.
#[derive(schemars::JsonSchema, Debug, Default, Clone, serde::Serialize)]
pub struct NerStats {
    pub queued: u64,
    pub enriched: u64,
    pub skipped_budget: u64,
    pub dropped_full: u64,
    pub failed_calls: u64,
}

#[derive(Clone)]
pub struct NerQueue {
    tx: mpsc::Sender<Item>,
    stats: Arc<Mutex<NerStats>>,
}

#[derive(Deserialize)]
struct Answer {
    entities: Vec<AnswerEntity>,
}

#[derive(Deserialize)]
struct AnswerEntity {
    memory: usize,
    name: String,
    #[serde(rename = "type")]
    entity_type: String,
}

fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["entities"],
        "properties": {"entities": {"type": "array", "items": {
            "type": "object",
            "additionalProperties": false,
            "required": ["memory", "name", "type"],
            "properties": {
                "memory": {"type": "integer"},
                "name": {"type": "string"},
                "type": {"type": "string", "enum": TYPES},
            },
        }}},
    })
}

/// The valid entities of an answer about `n` memories, as (memory index, name,
/// type); anything out of range, empty or over-long is left out.
fn entities_of(
    answer: serde_json::Value,
    n: usize,
) -> Result<Vec<(usize, String, String)>, String> {
    let answer: Answer = serde_json::from_value(answer).map_err(|e| format!("schema: {e}"))?;
    Ok(answer
        .entities
        .into_iter()
        .filter_map(|e| {
            let name = e.name.trim().to_string();
            let t = e.entity_type.trim().to_uppercase();
            let ok = (1..=n).contains(&e.memory)
                && !name.is_empty()
                && name.chars().count() <= 100
                && !entity_key(&name).is_empty();
            ok.then(|| {
                let t = if TYPES.contains(&t.as_str()) {
                    t
                } else {
                    "OTHER".into()
                };
                (e.memory - 1, name, t)
            })
        })
        .collect())
}

impl NerQueue {
    pub fn spawn(llm: Arc<Llm>, store: Arc<Store>) -> NerQueue {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let stats = Arc::new(Mutex::new(NerStats::default()));
        let queue = NerQueue { tx, stats };
        tokio::spawn(run(rx, queue.clone(), llm, store));
        queue
    }

    pub fn stats(&self) -> NerStats {
        self.stats.lock().expect("ner stats").clone()
    }

    fn count(&self, f: impl FnOnce(&mut NerStats)) {
        f(&mut self.stats.lock().expect("ner stats"));
    }

    /// Queue kept memories; never blocks the pipeline (a full queue drops them,
    /// counted in `dropped_full`: they keep their rule-based entities).
    pub fn push(&self, chunks: &[&Chunk]) {
        for c in chunks {
            let item = Item {
                stream: c.stream.clone(),
                id: c.id.clone(),
                content: c.content.clone(),
                content_hash: c.content_hash.clone(),
                attempt: 0,
            };
            match self.tx.try_send(item) {
                Ok(()) => self.count(|s| s.queued += 1),
                Err(_) => self.count(|s| s.dropped_full += 1),
            }
        }
    }

    fn retry_later(&self, mut items: Vec<Item>) {
        items.retain(|i| i.attempt + 1 < MAX_ATTEMPTS);
        if items.is_empty() {
            return;
        }
        let tx = self.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            for mut i in items {
                i.attempt += 1;
                let _ = tx.try_send(i);
            }
        });
    }
}

async fn run(mut rx: mpsc::Receiver<Item>, queue: NerQueue, llm: Arc<Llm>, store: Arc<Store>) {
    while let Some(first) = rx.recv().await {
        let mut items = vec![first];
        let deadline = tokio::time::Instant::now() + GATHER;
        while items.len() < BATCH * 4 {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(i)) => items.push(i),
                _ => break,
            }
        }
        let mut by_stream: HashMap<String, Vec<Item>> = HashMap::new();
        for i in items {
            by_stream.entry(i.stream.clone()).or_default().push(i);
        }
        for (stream, items) in by_stream {
            for group in items.chunks(BATCH) {
                if let Err(e) = enrich(&queue, &llm, &store, &stream, group.to_vec()).await {
                    tracing::warn!(error = %e, stream, "LLM entity extraction failed");
                    queue.count(|s| s.failed_calls += 1);
                }
            }
        }
    }
}

async fn enrich(
    queue: &NerQueue,
    llm: &Llm,
    store: &Store,
    stream: &str,
    items: Vec<Item>,
) -> Result<(), String> {
    // Only committed memories whose text is unchanged; the rest come back later.
    let ids: Vec<String> = items.iter().map(|i| i.id.clone()).collect();
    let stored = store
        .find(&Filter::new().ids(&ids), Some(ids.len()))
        .await
        .map_err(|e| e.to_string())?;
    let hash_of: HashMap<&str, &str> = stored
        .iter()
        .map(|c| (c.id.as_str(), c.content_hash.as_str()))
        .collect();
    let (ready, waiting): (Vec<Item>, Vec<Item>) = items
        .into_iter()
        .filter(|i| {
            hash_of
                .get(i.id.as_str())
                .is_none_or(|h| *h == i.content_hash)
        })
        .partition(|i| hash_of.contains_key(i.id.as_str()));
    queue.retry_later(waiting);
    if ready.is_empty() {
        return Ok(());
    }
    let prompt: String = ready
        .iter()
        .enumerate()
        .map(|(n, i)| format!("[{}] {}\n", n + 1, i.content))
        .collect();
    let reply = match llm
        .chat_json(
            stream,
            "ner",
            SYSTEM_PROMPT,
            &prompt,
            "memory_entities",
            schema(),
        )
        .await
    {
        Ok(r) => r,
        Err(LlmError::CapReached { .. }) => {
            queue.count(|s| s.skipped_budget += ready.len() as u64);
            return Ok(());
        }
        Err(e) => return Err(e.to_string()),
    };
    let found = entities_of(reply.json, ready.len())?;
    let at = crate::core::model::now_micros();
    let mut per_id: HashMap<String, (String, BTreeSet<String>)> = ready
        .iter()
        .map(|i| (i.id.clone(), (i.content_hash.clone(), BTreeSet::new())))
        .collect();
    let mut mentions = Vec::new();
    for (n, name, entity_type) in found {
        let item = &ready[n];
        let key = entity_key(&name);
        if let Some((_, keys)) = per_id.get_mut(&item.id) {
            keys.insert(key.clone());
        }
        mentions.push(Mention {
            stream: stream.to_string(),
            key,
            surface: name.clone(),
            name,
            entity_type,
            chunk_id: item.id.clone(),
            at,
        });
    }
    let model = reply.model.clone();
    let applied = Arc::new(Mutex::new(0u64));
    let counter = applied.clone();
    store
        .modify(
            ids_of(&ready),
            Box::new(move |chunk| match per_id.remove(&chunk.id) {
                Some((hash, keys)) if hash == chunk.content_hash => {
                    let mut all: BTreeSet<String> = chunk.entities.iter().cloned().collect();
                    let added: Vec<&String> = keys.iter().filter(|k| !all.contains(*k)).collect();
                    chunk.annotate(
                        "llm_ner",
                        serde_json::json!({"model": model, "added": added}),
                    );
                    all.extend(keys.iter().cloned());
                    chunk.entities = all.into_iter().collect();
                    *counter.lock().expect("counter") += 1;
                    true
                }
                _ => false,
            }),
        )
        .await
        .map_err(|e| e.to_string())?;
    if !mentions.is_empty() {
        store
            .graph
            .record(&mentions, &[])
            .await
            .map_err(|e| e.to_string())?;
    }
    let n = *applied.lock().expect("counter");
    queue.count(|s| s.enriched += n);
    Ok(())
}

fn ids_of(items: &[Item]) -> Vec<String> {
    items.iter().map(|i| i.id.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_checked_entity_by_entity() {
        let found = entities_of(
            serde_json::json!({"entities": [
                {"memory": 1, "name": "Ana", "type": "PERSON"},
                {"memory": 3, "name": "Out of range", "type": "PERSON"},
                {"memory": 2, "name": "  ", "type": "PLACE"},
                {"memory": 2, "name": "Lisbon", "type": "city"}
            ]}),
            2,
        )
        .unwrap();
        assert_eq!(
            found,
            vec![
                (0, "Ana".to_string(), "PERSON".to_string()),
                (1, "Lisbon".to_string(), "OTHER".to_string())
            ]
        );
        assert!(entities_of(serde_json::json!({"names": []}), 2).is_err());
    }
}
