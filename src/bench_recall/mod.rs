//! `just bench-recall`: retrieval quality on LongMemEval-format data. This
//! module reads the published format and scores rankings with the official
//! metrics; the runner ingests each haystack through the real pipeline and
//! searches it.

pub mod chart;
pub mod gen;
pub mod metrics;
pub mod qa;
pub mod run;

use std::collections::BTreeSet;

use crate::core::model::Micros;
use crate::service::import::{longmemeval_turns, parse_longmemeval_date, Turn};

/// The six question types of LongMemEval (abstention questions are any of
/// them with an `_abs` id).
pub const QUESTION_TYPES: &[&str] = &[
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "knowledge-update",
    "temporal-reasoning",
];

/// One LongMemEval question with its haystack.
pub struct Question {
    pub id: String,
    pub question_type: String,
    pub question: String,
    pub answer: String,
    /// When the question is asked ("now" for the search).
    pub question_date: Micros,
    pub turns: Vec<Turn>,
    /// Sessions holding the evidence.
    pub answer_sessions: BTreeSet<String>,
    /// The id ends in `_abs`: there is no evidence; left out of recall.
    pub abstention: bool,
}

impl Question {
    /// The id a turn has in the metrics: `{session_id}_{turn index + 1}`.
    pub fn turn_id(t: &Turn) -> String {
        format!("{}_{}", t.session_id, t.turn_index + 1)
    }

    /// Turn ids of the evidence (`has_answer` turns).
    pub fn answer_turns(&self) -> BTreeSet<String> {
        self.turns
            .iter()
            .filter(|t| t.has_answer)
            .map(Question::turn_id)
            .collect()
    }

    /// Every session id of the haystack, in order.
    pub fn sessions(&self) -> Vec<String> {
        let mut seen = BTreeSet::new();
        self.turns
            .iter()
            .filter(|t| seen.insert(t.session_id.clone()))
            .map(|t| t.session_id.clone())
            .collect()
    }
}

/// One entry of the file, or why it is malformed.
pub fn question(entry: &serde_json::Value) -> Result<Question, String> {
    let text = |key: &str| -> Result<String, String> {
        match &entry[key] {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Number(n) => Ok(n.to_string()),
            serde_json::Value::Null => Err(format!("missing `{key}`")),
            other => Ok(other.to_string()),
        }
    };
    let id = text("question_id")?;
    let question_type = text("question_type")?;
    let date = text("question_date")?;
    let question_date = parse_longmemeval_date(&date)
        .ok_or_else(|| format!("question_date `{date}` is not like 2023/05/30 (Tue) 23:40"))?;
    let answer_sessions = entry["answer_session_ids"]
        .as_array()
        .ok_or("missing `answer_session_ids` array")?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or("answer_session_ids holds a non-string")
        })
        .collect::<Result<BTreeSet<String>, _>>()?;
    Ok(Question {
        abstention: id.ends_with("_abs"),
        id,
        question_type,
        question: text("question")?,
        answer: text("answer")?,
        question_date,
        turns: longmemeval_turns(entry)?,
        answer_sessions,
    })
}

/// Entries left out of a load, as `(index, reason)`.
pub type Skipped = Vec<(usize, String)>;

/// The questions of a LongMemEval-format file, and the entries skipped as
/// malformed.
pub fn load(text: &str) -> Result<(Vec<Question>, Skipped), String> {
    let entries: Vec<serde_json::Value> =
        serde_json::from_str(text).map_err(|e| format!("not a JSON array of questions: {e}"))?;
    let mut questions = Vec::new();
    let mut skipped = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        match question(entry) {
            Ok(q) => questions.push(q),
            Err(e) => skipped.push((i, e)),
        }
    }
    Ok((questions, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_load_and_malformed_ones_are_reported_by_index() {
        let text = serde_json::json!([
            {
                "question_id": "q1", "question_type": "single-session-user",
                "question": "Where did I go?", "answer": "Lisbon",
                "question_date": "2023/05/30 (Tue) 23:40",
                "haystack_session_ids": ["s1", "s2"],
                "haystack_dates": ["2023/05/01 (Mon) 10:00", "2023/05/02 (Tue) 11:00"],
                "haystack_sessions": [
                    [{"role": "user", "content": "I flew to Lisbon", "has_answer": true},
                     {"role": "assistant", "content": "Nice!"}],
                    [{"role": "user", "content": "Recipe ideas?"}]
                ],
                "answer_session_ids": ["s1"]
            },
            {"question_id": "q2_abs", "question_type": "multi-session"},
            {
                "question_id": "q3_abs", "question_type": "temporal-reasoning",
                "question": "When?", "answer": "unknown",
                "question_date": "2023/06/01 (Thu) 09:00",
                "haystack_session_ids": [], "haystack_dates": [], "haystack_sessions": [],
                "answer_session_ids": []
            }
        ])
        .to_string();
        let (qs, skipped) = load(&text).unwrap();
        assert_eq!(qs.len(), 2);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].0, 1);
        assert!(skipped[0].1.contains("question"), "{skipped:?}");
        let q = &qs[0];
        assert!(!q.abstention && qs[1].abstention);
        assert_eq!(q.answer_turns(), BTreeSet::from(["s1_1".to_string()]));
        assert_eq!(q.sessions(), vec!["s1".to_string(), "s2".to_string()]);
        assert!(load("{").is_err());
    }
}
