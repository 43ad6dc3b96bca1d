//! `POST /v1/ingest` (MCP `memory_ingest`): a conversation goes in, individual
//! dated facts come out and run through the `ingest` pipeline (near-duplicate
//! skip, contradiction detection) like any other write.
//!
//! Extraction uses the LLM when one is configured (and the stream is within its
//! daily budget), validating its answer; the rule extractor is the default and
//! the fallback, so ingestion never depends on the LLM.

use std::path::PathBuf;

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use crate::bus::Outcome;
use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Chunk, Micros};
use crate::core::time::parse_instant;
use crate::core::Caller;
use crate::service::facts::{self, parse_transcript, Fact, ResolvedDate, Role, Turn};
use crate::service::Services;

#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageIn {
    pub role: String,
    pub content: String,
}

#[derive(schemars::JsonSchema, Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestRequest {
    /// A transcript: `User: …` / `Assistant: …` lines (or plain text from the user).
    pub content: Option<String>,
    /// The conversation as `{role, content}` messages (instead of `content`).
    pub messages: Option<Vec<MessageIn>>,
    /// When the conversation happened (date or timestamp); relative dates resolve
    /// against it and the facts are recorded at it. Default: now.
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_instant_schema")]
    pub conversation_date: Option<serde_json::Value>,
    #[schemars(length(min = 1, max = 256), regex(pattern = r"\S"))]
    pub stream: Option<String>,
    pub session_id: Option<String>,
    pub user_id: Option<String>,
    pub agent_id: Option<String>,
    pub app_id: Option<String>,
    /// Provenance of every fact (default `ingest`).
    pub source: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "crate::core::time::optional_object_schema")]
    pub metadata: Option<serde_json::Value>,
    /// `auto` (the LLM when configured, default), `rules` or `llm`.
    #[schemars(regex(pattern = r"^(auto|rules|llm)$"))]
    pub extractor: Option<String>,
    /// Extract and answer without storing anything.
    #[serde(default)]
    pub dry_run: bool,
    /// Wait for the facts to be committed (default) or answer once accepted.
    pub wait: Option<bool>,
}

#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct FactOut {
    pub id: String,
    pub content: String,
    pub memory_type: String,
    pub subject: String,
    pub confidence: f32,
    pub dates: Vec<ResolvedDate>,
    /// `stored`, `duplicate` (an equal memory exists: `existing_id`), `dropped`,
    /// `accepted` (not waited for) or `preview` (dry run).
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub existing_id: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub supersedes: Vec<String>,
    pub source: facts::Source,
}

#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct LlmUsage {
    pub model: String,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_usd: f64,
}

#[derive(schemars::JsonSchema, Debug, Clone, Serialize)]
pub struct IngestResponse {
    /// `stored`, `accepted` or `dry_run`.
    pub status: &'static str,
    pub stream: String,
    /// `rules` or `llm`: who extracted the facts.
    pub extractor: &'static str,
    /// Why the LLM was not used although configured (budget, failure, invalid answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
    pub conversation_date: String,
    pub facts: Vec<FactOut>,
    pub stored_ids: Vec<String>,
    pub duplicates_skipped: usize,
    pub superseded: Vec<String>,
    pub llm: Option<LlmUsage>,
}

/// The turns of a request, validated.
fn turns_of(req: &IngestRequest, max_chars: usize) -> Result<Vec<Turn>> {
    let turns = match (&req.content, &req.messages) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid(
                "content",
                "give either `content` or `messages`, not both",
            ))
        }
        (None, None) => {
            return Err(Error::invalid(
                "content",
                "a transcript (`content`) or `messages` is required",
            ))
        }
        (Some(text), None) => parse_transcript(text),
        (None, Some(messages)) => messages
            .iter()
            .map(|m| Turn {
                role: Role::parse(&m.role),
                content: m.content.trim().to_string(),
            })
            .filter(|t| !t.content.is_empty())
            .collect(),
    };
    let chars: usize = turns.iter().map(|t| t.content.chars().count()).sum();
    if chars > max_chars {
        return Err(Error::TooLarge(format!(
            "content: {chars} characters; at most {max_chars} are accepted (ingest.max_transcript_chars)"
        )));
    }
    if !turns.iter().any(|t| t.role == Role::User) {
        return Err(Error::invalid(
            "content",
            "the conversation has no user turn to extract facts from",
        ));
    }
    Ok(turns)
}

enum Want {
    Auto,
    Rules,
    Llm,
}

struct Extraction {
    facts: Vec<Fact>,
    extractor: &'static str,
    fallback_reason: Option<String>,
    llm: Option<LlmUsage>,
}

async fn extract_facts(
    engine: &Services,
    stream: &str,
    turns: &[Turn],
    date: NaiveDate,
    want: Want,
) -> Result<Extraction> {
    let rules = |fallback_reason: Option<String>, llm: Option<LlmUsage>| Extraction {
        facts: engine.facts.extract(turns, date),
        extractor: "rules",
        fallback_reason,
        llm,
    };
    let llm = match (&engine.llm, want) {
        (_, Want::Rules) => return Ok(rules(None, None)),
        (None, Want::Llm) => {
            return Err(Error::invalid(
                "extractor",
                "`llm` needs an [llm] endpoint in the configuration",
            ))
        }
        (None, Want::Auto) => return Ok(rules(None, None)),
        (Some(_), Want::Auto) if !engine.cfg.ingest.use_llm => return Ok(rules(None, None)),
        (Some(llm), _) => llm,
    };
    let reply = llm
        .chat_json(
            stream,
            "ingest",
            facts::llm::SYSTEM_PROMPT,
            &facts::llm::prompt(turns, date),
            facts::llm::SCHEMA_NAME,
            facts::llm::schema(),
        )
        .await;
    let reply = match reply {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, stream, "LLM extraction unavailable; using the rules");
            return Ok(rules(Some(e.to_string()), None));
        }
    };
    let usage = LlmUsage {
        model: reply.model.clone(),
        prompt_tokens: reply.prompt_tokens,
        completion_tokens: reply.completion_tokens,
        cost_usd: reply.cost_usd,
    };
    match facts::llm::validate(reply.json, turns) {
        Ok(facts) => Ok(Extraction {
            facts,
            extractor: "llm",
            fallback_reason: None,
            llm: Some(usage),
        }),
        Err(e) => {
            tracing::warn!(error = %e, stream, "LLM answer rejected; using the rules");
            Ok(rules(
                Some(format!("LLM answer rejected: {e}")),
                Some(usage),
            ))
        }
    }
}

/// What every fact of one conversation shares.
struct Conversation<'a> {
    caller: &'a Caller,
    req: &'a IngestRequest,
    extraction: &'a Extraction,
    created_at: Micros,
    date: String,
}

impl Conversation<'_> {
    /// The chunk a fact becomes.
    fn chunk_of(&self, fact: &Fact, id: String) -> Result<Chunk> {
        let (req, extraction, created_at, conversation_date) =
            (self.req, self.extraction, self.created_at, &self.date);
        let mut chunk = crate::service::memory::chunk_from_request(
            self.caller,
            crate::service::memory::StoreRequest {
                content: fact.content.clone(),
                stream: req.stream.clone(),
                metadata: req.metadata.clone(),
                user_id: req.user_id.clone(),
                app_id: req.app_id.clone(),
                agent_id: req.agent_id.clone(),
                session_id: req.session_id.clone(),
                memory_type: Some(fact.memory_type.clone()),
                subject: Some(fact.subject.clone()),
                source: Some(req.source.clone().unwrap_or_else(|| "ingest".into())),
                confidence: Some(fact.confidence.clamp(0.0, 1.0)),
                id: Some(id),
                ..Default::default()
            },
        )?;
        chunk.created_at = created_at;
        chunk.updated_at = created_at;
        let mut meta = serde_json::json!({
            "extractor": extraction.extractor,
            "rule": fact.rule,
            "conversation_date": conversation_date,
            "source_span": fact.source,
            "dates": fact.dates,
        });
        if let (Some(usage), "llm") = (&extraction.llm, extraction.extractor) {
            meta["model"] = serde_json::json!(usage.model);
        }
        if let Some(reason) = &extraction.fallback_reason {
            meta["fallback_reason"] = serde_json::json!(reason);
        }
        chunk.annotate("ingest", meta);
        Ok(chunk)
    }
}

/// Extract the facts of a conversation and store them.
pub async fn ingest(
    engine: &Services,
    caller: &Caller,
    req: IngestRequest,
) -> Result<IngestResponse> {
    let stream = caller.resolve_stream(req.stream.as_deref())?;
    let turns = turns_of(&req, engine.cfg.ingest.max_transcript_chars)?;
    let created_at = match &req.conversation_date {
        Some(v) => parse_instant("conversation_date", v)?,
        None => now_micros(),
    };
    let date = chrono::DateTime::from_timestamp_micros(created_at)
        .ok_or_else(|| Error::invalid("conversation_date", "out of range"))?
        .date_naive();
    let want = match req.extractor.as_deref().map(str::trim) {
        None | Some("auto") | Some("") => Want::Auto,
        Some("rules") => Want::Rules,
        Some("llm") => Want::Llm,
        Some(other) => {
            return Err(Error::invalid(
                "extractor",
                format!("`{other}`: must be auto, rules or llm"),
            ))
        }
    };
    let extraction = extract_facts(engine, &stream, &turns, date, want).await?;
    let conversation_date = date.format("%Y-%m-%d").to_string();
    // Ids derive from the conversation and the fact, so a retried request
    // re-publishes the same messages (deduplicated by the bus) instead of new ones.
    let conversation_key = crate::core::model::content_hash(
        &turns
            .iter()
            .map(|t| format!("{:?}:{}", t.role, t.content))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    let conversation = Conversation {
        caller,
        req: &req,
        extraction: &extraction,
        created_at,
        date: conversation_date.clone(),
    };
    let mut chunks = Vec::with_capacity(extraction.facts.len());
    for (i, fact) in extraction.facts.iter().enumerate() {
        let id = engine.ids.derive(&[
            "ingest",
            &stream,
            &conversation_key,
            &created_at.to_string(),
            &i.to_string(),
            &fact.content,
        ]);
        chunks.push(conversation.chunk_of(fact, id)?);
    }
    let wait = req.wait.unwrap_or(true);
    let status = if req.dry_run {
        "dry_run"
    } else if wait {
        "stored"
    } else {
        "accepted"
    };
    let ids: Vec<String> = chunks.iter().map(|c| c.id.clone()).collect();
    let outcomes: Vec<Option<Outcome>> = if req.dry_run || chunks.is_empty() {
        vec![None; chunks.len()]
    } else if !wait {
        engine
            .bus
            .publish(crate::pipeline::worker::envelopes("ingest", chunks, false))
            .await?;
        vec![None; ids.len()]
    } else {
        crate::service::memory::publish_and_wait(
            engine,
            crate::pipeline::worker::envelopes("ingest", chunks, true),
        )
        .await?
        .into_iter()
        .map(Some)
        .collect()
    };
    let mut out = IngestResponse {
        status,
        stream,
        extractor: extraction.extractor,
        fallback_reason: extraction.fallback_reason.clone(),
        conversation_date,
        facts: Vec::with_capacity(ids.len()),
        stored_ids: Vec::new(),
        duplicates_skipped: 0,
        superseded: Vec::new(),
        llm: extraction.llm.clone(),
    };
    for ((fact, id), outcome) in extraction.facts.into_iter().zip(ids).zip(outcomes) {
        let (fact_status, existing_id, supersedes) = match outcome {
            None if req.dry_run => ("preview", None, Vec::new()),
            None => ("accepted", None, Vec::new()),
            Some(Outcome::Stored { superseded }) => ("stored", None, superseded),
            Some(Outcome::Duplicate { existing_id }) => {
                ("duplicate", Some(existing_id), Vec::new())
            }
            Some(Outcome::Dropped { .. }) => ("dropped", None, Vec::new()),
            Some(Outcome::Failed { error }) => {
                return Err(Error::Internal(format!(
                    "fact {id} was not stored and is kept in dead_letters: {error}"
                )))
            }
        };
        match fact_status {
            "stored" => out.stored_ids.push(id.clone()),
            "duplicate" => out.duplicates_skipped += 1,
            _ => {}
        }
        out.superseded.extend(supersedes.iter().cloned());
        out.facts.push(FactOut {
            id,
            content: fact.content,
            memory_type: fact.memory_type,
            subject: fact.subject,
            confidence: fact.confidence,
            dates: fact.dates,
            status: fact_status,
            existing_id,
            supersedes,
            source: fact.source,
        });
    }
    Ok(out)
}

/// `POST /v1/ingest`: conversations in, facts out.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    /// The rule extractor's patterns (relative to the config file's directory).
    #[serde(default = "default_rules_file")]
    pub rules_file: PathBuf,
    /// Longest transcript accepted, in characters.
    #[serde(default = "default_transcript_chars")]
    pub max_transcript_chars: usize,
    /// Extract with the LLM when one is configured (the rules otherwise).
    #[serde(default = "yes")]
    pub use_llm: bool,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            rules_file: default_rules_file(),
            max_transcript_chars: default_transcript_chars(),
            use_llm: true,
        }
    }
}

fn default_rules_file() -> PathBuf {
    PathBuf::from("pipelines/extract/facts.toml")
}

fn default_transcript_chars() -> usize {
    200_000
}

fn yes() -> bool {
    true
}
