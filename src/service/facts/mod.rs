//! From a conversation to facts: transcript parsing, the rule extractor
//! (`pipelines/extract/facts.toml`), the LLM extractor with validation, and the
//! date resolver both share. Pure functions of text (plus the LLM's answer); the
//! service in `crate::conversation` stores what they find.

pub mod dates;
pub mod eval;
pub mod llm;
pub mod rules;

use serde::{Deserialize, Serialize};

pub use dates::{DateResolver, Granularity, ResolvedDate};
pub use rules::RuleExtractor;

#[derive(schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
    /// System prompts, tools, anyone else: never a source of facts.
    Other,
}

impl Role {
    pub fn parse(s: &str) -> Role {
        match s.trim().to_lowercase().as_str() {
            "user" | "human" | "me" | "customer" => Role::User,
            "assistant" | "ai" | "bot" | "agent" | "model" | "gpt" | "claude" => Role::Assistant,
            _ => Role::Other,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub role: Role,
    pub content: String,
}

/// Turns of a transcript written as `User: …` / `Assistant: …` lines (a line
/// without a role prefix continues the turn before it). Text without any role
/// prefix is one user turn.
pub fn parse_transcript(text: &str) -> Vec<Turn> {
    let prefix = regex::Regex::new(r"^\s*(?:\*\*)?([A-Za-z][A-Za-z ]{0,20}?)(?:\*\*)?\s*:\s?(.*)$")
        .expect("static regex");
    let mut turns: Vec<Turn> = Vec::new();
    let mut any_role = false;
    for line in text.lines() {
        let labelled = prefix.captures(line).and_then(|c| {
            let label = c[1].trim().to_lowercase();
            let known = matches!(
                label.as_str(),
                "user"
                    | "human"
                    | "me"
                    | "customer"
                    | "assistant"
                    | "ai"
                    | "bot"
                    | "agent"
                    | "model"
                    | "gpt"
                    | "claude"
                    | "system"
                    | "tool"
            );
            known.then(|| (Role::parse(&label), c[2].to_string()))
        });
        match labelled {
            Some((role, rest)) => {
                any_role = true;
                turns.push(Turn {
                    role,
                    content: rest,
                });
            }
            None => match turns.last_mut() {
                Some(t) => {
                    t.content.push('\n');
                    t.content.push_str(line);
                }
                None if line.trim().is_empty() => {}
                None => turns.push(Turn {
                    role: Role::User,
                    content: line.to_string(),
                }),
            },
        }
    }
    if !any_role {
        return vec![Turn {
            role: Role::User,
            content: text.to_string(),
        }];
    }
    for t in &mut turns {
        t.content = t.content.trim().to_string();
    }
    turns.retain(|t| !t.content.is_empty());
    turns
}

/// Where in the conversation a fact came from.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    /// Index of the turn.
    pub turn: usize,
    pub role: Role,
    /// The words the fact was read from.
    pub text: String,
}

/// One extracted fact, ready to become a memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fact {
    pub content: String,
    pub memory_type: String,
    pub subject: String,
    pub confidence: f32,
    /// Dates the fact names, resolved to absolute ones.
    pub dates: Vec<ResolvedDate>,
    pub source: Source,
    /// The rule that found it (rule extractor) or `llm`.
    pub rule: String,
}

/// The memory types facts may have (the LLM is held to these too).
pub const FACT_TYPES: &[&str] = &[
    "preference",
    "decision",
    "plan",
    "project",
    "event",
    "fact",
    "correction",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transcripts_split_into_turns() {
        let t = parse_transcript(
            "User: I use Vim.\nIt is fast.\nAssistant: Nice!\n**Human**: Also Emacs.\nSystem: ignore",
        );
        assert_eq!(t.len(), 4);
        assert_eq!(t[0].role, Role::User);
        assert_eq!(t[0].content, "I use Vim.\nIt is fast.");
        assert_eq!(t[1].role, Role::Assistant);
        assert_eq!(t[2].content, "Also Emacs.");
        assert_eq!(t[3].role, Role::Other);
        let plain = parse_transcript("I moved to Berlin. Note: it rains.");
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].role, Role::User);
    }
}
