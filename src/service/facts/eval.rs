//! Scoring an extractor against a labelled set of transcripts
//! (`datasets/ingest/transcripts.json`): precision, recall, memory-type accuracy
//! and date accuracy.
//!
//! A gold fact is *covered* by an extracted fact whose content contains all of
//! its `keys` (case-insensitive); one extracted fact may cover several gold
//! facts (a sentence that says two things is one memory holding both).
//! Precision counts extracted facts that cover at least one gold fact; recall
//! counts gold facts covered. Type and date accuracy are over covered gold
//! facts: some covering fact has the gold `type`, or names the gold `date`.

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use super::{parse_transcript, Fact};

#[derive(Debug, Clone, Deserialize)]
pub struct Case {
    pub id: String,
    pub conversation_date: String,
    pub transcript: String,
    pub facts: Vec<GoldFact>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GoldFact {
    pub keys: Vec<String>,
    #[serde(rename = "type")]
    pub memory_type: String,
    #[serde(default)]
    pub date: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub transcripts: usize,
    pub extracted: usize,
    pub correct: usize,
    pub gold: usize,
    pub covered: usize,
    pub typed_right: usize,
    pub dated: usize,
    pub dated_right: usize,
    /// Extracted facts that cover nothing, as `case: content`.
    pub false_positives: Vec<String>,
    /// Gold facts nothing covers, as `case: keys`.
    pub missed: Vec<String>,
    /// Covered gold facts whose date was not found, as `case: keys (want date)`.
    pub wrong_dates: Vec<String>,
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

impl Report {
    pub fn precision(&self) -> f64 {
        ratio(self.correct, self.extracted)
    }
    pub fn recall(&self) -> f64 {
        ratio(self.covered, self.gold)
    }
    pub fn type_accuracy(&self) -> f64 {
        ratio(self.typed_right, self.covered)
    }
    pub fn date_accuracy(&self) -> f64 {
        ratio(self.dated_right, self.dated)
    }

    pub fn summary(&self) -> String {
        format!(
            "{} transcripts, {} gold facts, {} extracted: precision {:.3} ({}/{}), recall {:.3} ({}/{}), type accuracy {:.3}, dates resolved {:.3} ({}/{})",
            self.transcripts,
            self.gold,
            self.extracted,
            self.precision(),
            self.correct,
            self.extracted,
            self.recall(),
            self.covered,
            self.gold,
            self.type_accuracy(),
            self.date_accuracy(),
            self.dated_right,
            self.dated
        )
    }
}

fn covers(fact: &Fact, gold: &GoldFact) -> bool {
    let content = fact.content.to_lowercase();
    gold.keys
        .iter()
        .all(|k| content.contains(&k.to_lowercase()))
}

/// Run `extract` over every case and score it.
pub fn evaluate(
    cases: &[Case],
    extract: impl Fn(&[super::Turn], NaiveDate) -> Vec<Fact>,
) -> Result<Report, String> {
    let mut r = Report {
        transcripts: cases.len(),
        ..Default::default()
    };
    for case in cases {
        let date = NaiveDate::parse_from_str(&case.conversation_date, "%Y-%m-%d")
            .map_err(|e| format!("{}: conversation_date: {e}", case.id))?;
        let facts = extract(&parse_transcript(&case.transcript), date);
        r.extracted += facts.len();
        for f in &facts {
            if case.facts.iter().any(|g| covers(f, g)) {
                r.correct += 1;
            } else {
                r.false_positives
                    .push(format!("{}: {}", case.id, f.content));
            }
        }
        for g in &case.facts {
            r.gold += 1;
            let covering: Vec<&Fact> = facts.iter().filter(|f| covers(f, g)).collect();
            if covering.is_empty() {
                r.missed.push(format!("{}: {:?}", case.id, g.keys));
                continue;
            }
            r.covered += 1;
            if covering.iter().any(|f| f.memory_type == g.memory_type) {
                r.typed_right += 1;
            }
            if let Some(want) = &g.date {
                r.dated += 1;
                if covering
                    .iter()
                    .any(|f| f.dates.iter().any(|d| &d.date == want))
                {
                    r.dated_right += 1;
                } else {
                    r.wrong_dates
                        .push(format!("{}: {:?} (want {want})", case.id, g.keys));
                }
            }
        }
    }
    Ok(r)
}
