//! Fact extraction by an LLM: the prompt, the JSON schema the answer must
//! follow, and the validation that decides whether the answer is used (or the
//! rule extractor takes over).

use chrono::NaiveDate;
use serde::Deserialize;

use super::dates::{Granularity, ResolvedDate};
use super::{Fact, Role, Source, Turn, FACT_TYPES};

pub const SCHEMA_NAME: &str = "memory_facts";

/// Most facts one answer may hold.
const MAX_FACTS: usize = 50;
const MAX_FACT_CHARS: usize = 2000;

pub const SYSTEM_PROMPT: &str = "You extract long-term memories about the user from a conversation. \
Return JSON with a `facts` array. Each fact is one self-contained statement in the third person \
(\"User prefers Cursor over VSCode\"), with: `content`; `memory_type`, one of preference, decision, \
plan, project, event, fact, correction; `subject` (\"user\" for the user, else the person, project \
or thing the fact is about, lower case); `date`: the absolute date the fact names (YYYY-MM-DD, \
YYYY-MM or YYYY), resolving relative expressions such as \"last week\" or \"next Friday\" against \
the conversation date, or null; `confidence` between 0 and 1; `quote`: the words of the \
conversation the fact comes from. Write absolute dates inside `content` too. Only include what \
the user stated or clearly confirmed; skip questions, greetings, small talk and the assistant's \
own suggestions unless the user accepted them. Return {\"facts\": []} when there is nothing to \
remember.";

/// The JSON schema the answer must follow (strict mode: every key required).
pub fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["facts"],
        "properties": {
            "facts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["content", "memory_type", "subject", "date", "confidence", "quote"],
                    "properties": {
                        "content": {"type": "string"},
                        "memory_type": {"type": "string", "enum": FACT_TYPES},
                        "subject": {"type": "string"},
                        "date": {"type": ["string", "null"]},
                        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                        "quote": {"type": "string"},
                    },
                },
            },
        },
    })
}

/// The user message: the conversation date, then the turns.
pub fn prompt(turns: &[Turn], date: NaiveDate) -> String {
    let mut p = format!(
        "Conversation date: {} ({})\n\n",
        date.format("%Y-%m-%d"),
        date.format("%A")
    );
    for t in turns {
        let role = match t.role {
            Role::User => "User",
            Role::Assistant => "Assistant",
            Role::Other => "Other",
        };
        p.push_str(role);
        p.push_str(": ");
        p.push_str(&t.content);
        p.push('\n');
    }
    p
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    facts: Vec<AnswerFact>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerFact {
    content: String,
    memory_type: String,
    subject: String,
    date: Option<String>,
    confidence: f64,
    #[serde(default)]
    quote: String,
}

fn parse_date(s: &str) -> Option<(String, Granularity)> {
    let s = s.trim();
    if NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok() {
        return Some((s.to_string(), Granularity::Day));
    }
    if NaiveDate::parse_from_str(&format!("{s}-01"), "%Y-%m-%d").is_ok() && s.len() == 7 {
        return Some((s.to_string(), Granularity::Month));
    }
    if s.len() == 4 && s.chars().all(|c| c.is_ascii_digit()) {
        return Some((s.to_string(), Granularity::Year));
    }
    None
}

/// The facts in an LLM answer, or why the answer cannot be used. One bad fact
/// rejects the whole answer: a model that breaks the schema once is not trusted
/// for the rest.
pub fn validate(answer: serde_json::Value, turns: &[Turn]) -> Result<Vec<Fact>, String> {
    let answer: Answer = serde_json::from_value(answer).map_err(|e| format!("schema: {e}"))?;
    if answer.facts.len() > MAX_FACTS {
        return Err(format!("{} facts; at most {MAX_FACTS}", answer.facts.len()));
    }
    let mut facts = Vec::with_capacity(answer.facts.len());
    for (i, f) in answer.facts.into_iter().enumerate() {
        let content = f.content.trim();
        if content.is_empty() || content.chars().count() > MAX_FACT_CHARS {
            return Err(format!(
                "facts[{i}].content: must be 1-{MAX_FACT_CHARS} characters"
            ));
        }
        let memory_type = f.memory_type.trim().to_lowercase();
        if !FACT_TYPES.contains(&memory_type.as_str()) {
            return Err(format!(
                "facts[{i}].memory_type: `{}` is not one of {FACT_TYPES:?}",
                f.memory_type
            ));
        }
        if !(0.0..=1.0).contains(&f.confidence) {
            return Err(format!("facts[{i}].confidence: must be between 0 and 1"));
        }
        let dates = match f.date.as_deref().map(str::trim).filter(|d| !d.is_empty()) {
            None => Vec::new(),
            Some(d) => {
                let (date, granularity) = parse_date(d).ok_or_else(|| {
                    format!("facts[{i}].date: `{d}` is not YYYY-MM-DD, YYYY-MM or YYYY")
                })?;
                vec![ResolvedDate {
                    expression: d.to_string(),
                    date,
                    granularity,
                    start: 0,
                    end: 0,
                    lead: "",
                }]
            }
        };
        let quote = f.quote.trim().to_string();
        // The turn the quote comes from (the first user turn when it is not found).
        let turn = turns
            .iter()
            .position(|t| !quote.is_empty() && t.content.contains(&quote))
            .or_else(|| turns.iter().position(|t| t.role == Role::User))
            .unwrap_or(0);
        let subject = f.subject.trim();
        facts.push(Fact {
            content: content.to_string(),
            memory_type,
            subject: if subject.is_empty() {
                "user".into()
            } else {
                subject.to_string()
            },
            confidence: f.confidence as f32,
            dates,
            source: Source {
                turn,
                role: turns.get(turn).map_or(Role::User, |t| t.role),
                text: quote,
            },
            rule: "llm".into(),
        });
    }
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turns() -> Vec<Turn> {
        super::super::parse_transcript("User: I switched from VSCode to Cursor last week.")
    }

    #[test]
    fn a_valid_answer_becomes_facts() {
        let facts = validate(
            serde_json::json!({"facts": [{
                "content": "User switched from VSCode to Cursor around 2026-03-26.",
                "memory_type": "preference", "subject": "user", "date": "2026-03-26",
                "confidence": 0.95, "quote": "I switched from VSCode to Cursor"
            }]}),
            &turns(),
        )
        .unwrap();
        assert_eq!(facts.len(), 1);
        assert_eq!(facts[0].dates[0].date, "2026-03-26");
        assert_eq!(facts[0].rule, "llm");
    }

    #[test]
    fn a_broken_answer_is_rejected_with_its_reason() {
        let bad_type = serde_json::json!({"facts": [{
            "content": "x", "memory_type": "gossip", "subject": "user", "date": null,
            "confidence": 0.5, "quote": ""
        }]});
        assert!(validate(bad_type, &turns())
            .unwrap_err()
            .contains("memory_type"));
        let bad_date = serde_json::json!({"facts": [{
            "content": "x", "memory_type": "fact", "subject": "user", "date": "next week",
            "confidence": 0.5, "quote": ""
        }]});
        assert!(validate(bad_date, &turns()).unwrap_err().contains("date"));
        assert!(validate(serde_json::json!({"items": []}), &turns()).is_err());
        assert!(validate(serde_json::json!({"facts": [{"content": "x"}]}), &turns()).is_err());
    }
}
