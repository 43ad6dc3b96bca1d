//! Building LongMemEval-format haystacks from ingredients: a pool of filler
//! sessions and, per question, its evidence sessions. Each question's haystack
//! is its evidence plus filler drawn from the pool (without repeats while the
//! pool lasts), the filler dated at random over the half year before the
//! question, everything in date order. Seeded: the same ingredients and seed
//! give the same file, at any haystack size (30 sessions for the shipped set,
//! 10,000 for a scale run).

use chrono::{Duration, NaiveDateTime};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ingredients {
    pub filler: Vec<Session>,
    pub questions: Vec<QuestionIngredients>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Session {
    /// What the session is about (documentation only).
    #[serde(default)]
    pub topic: String,
    /// `YYYY/MM/DD (Day) HH:MM`; evidence sessions need one, filler gets one.
    #[serde(default)]
    pub date: Option<String>,
    pub turns: Vec<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuestionIngredients {
    pub question_id: String,
    pub question_type: String,
    pub question: String,
    pub answer: String,
    pub question_date: String,
    pub evidence: Vec<Session>,
}

/// splitmix64: small, seedable, the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn seed_for(seed: u64, id: &str) -> u64 {
    id.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

const DATE_FORMAT: &str = "%Y/%m/%d (%a) %H:%M";

/// A LongMemEval date (`2023/05/30 (Tue) 23:40`), read as the loader reads it.
fn parse_date(s: &str) -> Option<NaiveDateTime> {
    crate::service::import::parse_longmemeval_date(s)
        .and_then(chrono::DateTime::from_timestamp_micros)
        .map(|t| t.naive_utc())
}

/// The LongMemEval-format entries: every question with a haystack of
/// `sessions` sessions (at least its evidence).
pub fn generate(ing: &Ingredients, sessions: usize, seed: u64) -> Result<Vec<Value>, String> {
    if ing.filler.is_empty() {
        return Err("ingredients: the filler pool is empty".into());
    }
    let mut out = Vec::with_capacity(ing.questions.len());
    for q in &ing.questions {
        let asked = parse_date(&q.question_date).ok_or_else(|| {
            format!(
                "{}: question_date `{}` is not like 2023/05/30 (Tue) 23:40",
                q.question_id, q.question_date
            )
        })?;
        let mut rng = Rng(seed_for(seed, &q.question_id));
        // (date, id, turns, holds evidence)
        let mut haystack: Vec<(NaiveDateTime, String, Vec<Value>, bool)> = Vec::new();
        for (i, e) in q.evidence.iter().enumerate() {
            let date = e.date.as_deref().and_then(parse_date).ok_or_else(|| {
                format!(
                    "{}: evidence[{i}] needs a date like 2023/05/30 (Tue) 23:40",
                    q.question_id
                )
            })?;
            let has_answer = e.turns.iter().any(|t| t["has_answer"] == json!(true));
            haystack.push((
                date,
                format!("{}-e{}", q.question_id, i + 1),
                e.turns.clone(),
                has_answer,
            ));
        }
        let wanted = sessions.saturating_sub(haystack.len());
        let mut order: Vec<usize> = (0..ing.filler.len()).collect();
        for n in 0..wanted {
            let round = n / order.len();
            let slot = n % order.len();
            if slot == 0 {
                // A fresh shuffle of the pool for each round through it.
                for i in (1..order.len()).rev() {
                    let j = rng.below(i + 1);
                    order.swap(i, j);
                }
            }
            let pick = order[slot];
            let minutes = rng.below(180 * 24 * 60) as i64 + 24 * 60;
            let date = asked - Duration::minutes(minutes);
            let id = if round == 0 {
                format!("f{pick}")
            } else {
                format!("f{pick}-r{round}")
            };
            haystack.push((date, id, ing.filler[pick].turns.clone(), false));
        }
        haystack.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let answer_ids: Vec<&String> = haystack.iter().filter(|h| h.3).map(|h| &h.1).collect();
        out.push(json!({
            "question_id": q.question_id,
            "question_type": q.question_type,
            "question": q.question,
            "answer": q.answer,
            "question_date": asked.format(DATE_FORMAT).to_string(),
            "haystack_session_ids": haystack.iter().map(|h| &h.1).collect::<Vec<_>>(),
            "haystack_dates": haystack.iter().map(|h| h.0.format(DATE_FORMAT).to_string()).collect::<Vec<_>>(),
            "haystack_sessions": haystack.iter().map(|h| &h.2).collect::<Vec<_>>(),
            "answer_session_ids": if q.question_id.ends_with("_abs") { Vec::new() } else { answer_ids },
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ingredients() -> Ingredients {
        serde_json::from_value(json!({
            "filler": (0..5).map(|i| json!({"topic": format!("t{i}"), "turns": [{"role": "user", "content": format!("filler {i}")}]})).collect::<Vec<_>>(),
            "questions": [{
                "question_id": "q1", "question_type": "knowledge-update",
                "question": "Where do I live now?", "answer": "Chicago",
                "question_date": "2024/03/15 (Fri) 10:00",
                "evidence": [
                    {"date": "2024/01/05 (Fri) 09:00", "turns": [{"role": "user", "content": "I live in Boston", "has_answer": true}]},
                    {"date": "2024/03/01 (Fri) 09:00", "turns": [{"role": "user", "content": "I moved to Chicago", "has_answer": true}]}
                ]
            }]
        }))
        .unwrap()
    }

    #[test]
    fn haystacks_hold_the_evidence_and_loads_as_longmemeval() {
        let entries = generate(&ingredients(), 12, 7).unwrap();
        let text = serde_json::to_string(&entries).unwrap();
        let (qs, skipped) = super::super::load(&text).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        let q = &qs[0];
        let sessions = q.sessions();
        assert_eq!(sessions.len(), 12);
        assert_eq!(q.answer_sessions.len(), 2);
        assert!(q.answer_sessions.contains("q1-e2"));
        // Five filler sessions, used once each before any repeats.
        let first_round = sessions
            .iter()
            .filter(|s| s.starts_with('f') && !s.contains("-r"))
            .count();
        assert_eq!(first_round, 5);
        // Dates ascend and stay before the question.
        let dates = entries[0]["haystack_dates"].as_array().unwrap();
        let parsed: Vec<_> = dates
            .iter()
            .map(|d| parse_date(d.as_str().unwrap()).unwrap())
            .collect();
        assert!(parsed.windows(2).all(|w| w[0] <= w[1]));
        assert!(parsed
            .iter()
            .all(|d| *d < parse_date("2024/03/15 (Fri) 10:00").unwrap()));
        // Seeded: the same seed gives the same file, another seed another.
        assert_eq!(generate(&ingredients(), 12, 7).unwrap(), entries);
        assert_ne!(generate(&ingredients(), 12, 8).unwrap(), entries);
        // A bad date names the question.
        let mut bad = ingredients();
        bad.questions[0].question_date = "soon".into();
        assert!(generate(&bad, 12, 7).unwrap_err().contains("q1"));
    }
}
