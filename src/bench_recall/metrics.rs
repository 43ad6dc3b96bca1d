//! The retrieval metrics of the official LongMemEval evaluation:
//! `recall_any@k` (some evidence document in the top k), `recall_all@k` (every
//! evidence document in the top k) and `ndcg_any@k` (binary relevance; DCG =
//! rel₁ + Σ_{i≥2} relᵢ / log₂ i, normalised by the DCG of the ideal ranking of
//! the whole corpus), at turn and at session granularity.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// The cut-offs every report covers.
pub const KS: &[usize] = &[1, 3, 5, 10, 30, 50];

/// DCG of the first `k` relevances, as the official `dcg`.
pub fn dcg(relevances: &[f64], k: usize) -> f64 {
    relevances
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, r)| {
            if i == 0 {
                *r
            } else {
                r / ((i + 1) as f64).log2()
            }
        })
        .sum()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Scores {
    pub recall_any: f64,
    pub recall_all: f64,
    pub ndcg_any: f64,
}

/// Scores of one ranking (document ids, best first) against the evidence, over a
/// corpus of `corpus` documents.
pub fn evaluate(
    ranked: &[String],
    correct: &BTreeSet<String>,
    corpus: &[String],
    k: usize,
) -> Scores {
    let top: BTreeSet<&String> = ranked.iter().take(k).collect();
    let recall_any = correct.iter().any(|d| top.contains(d));
    let recall_all = correct.iter().all(|d| top.contains(d));
    let relevance = |d: &String| if correct.contains(d) { 1.0 } else { 0.0 };
    let actual: Vec<f64> = ranked.iter().take(k).map(relevance).collect();
    let mut ideal: Vec<f64> = corpus.iter().map(relevance).collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    let ideal_dcg = dcg(&ideal, k);
    Scores {
        recall_any: f64::from(u8::from(recall_any)),
        recall_all: f64::from(u8::from(recall_all)),
        ndcg_any: if ideal_dcg > 0.0 {
            dcg(&actual, k) / ideal_dcg
        } else {
            0.0
        },
    }
}

/// A turn ranking as a session ranking: each session at the rank of its best
/// turn (`session_of` maps a turn id to its session id).
pub fn sessions_of(ranked_turns: &[String], session_of: impl Fn(&str) -> String) -> Vec<String> {
    let mut seen = BTreeSet::new();
    ranked_turns
        .iter()
        .map(|t| session_of(t))
        .filter(|s| seen.insert(s.clone()))
        .collect()
}

/// Mean scores per k, over any number of questions.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub questions: usize,
    /// k → mean scores.
    pub at: BTreeMap<usize, Scores>,
}

impl Summary {
    pub fn add(&mut self, per_k: &BTreeMap<usize, Scores>) {
        let n = self.questions as f64;
        for (k, s) in per_k {
            let m = self.at.entry(*k).or_default();
            m.recall_any = (m.recall_any * n + s.recall_any) / (n + 1.0);
            m.recall_all = (m.recall_all * n + s.recall_all) / (n + 1.0);
            m.ndcg_any = (m.ndcg_any * n + s.ndcg_any) / (n + 1.0);
        }
        self.questions += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn dcg_discounts_from_the_second_position() {
        assert_eq!(dcg(&[1.0, 1.0, 1.0], 3), 1.0 + 1.0 + 1.0 / 3f64.log2());
        assert_eq!(dcg(&[0.0, 1.0], 1), 0.0);
        assert_eq!(dcg(&[], 5), 0.0);
    }

    #[test]
    fn recall_and_ndcg_follow_the_official_definitions() {
        let corpus = ids(&["a", "b", "c", "d", "e"]);
        let correct: BTreeSet<String> = ids(&["b", "d"]).into_iter().collect();
        let ranked = ids(&["a", "b", "c", "d", "e"]);
        let s1 = evaluate(&ranked, &correct, &corpus, 1);
        assert_eq!((s1.recall_any, s1.recall_all, s1.ndcg_any), (0.0, 0.0, 0.0));
        let s2 = evaluate(&ranked, &correct, &corpus, 2);
        assert_eq!((s2.recall_any, s2.recall_all), (1.0, 0.0));
        // actual [0, 1] → 1/log2(2) = 1; ideal [1, 1] → 2.
        assert!((s2.ndcg_any - 0.5).abs() < 1e-12);
        let s4 = evaluate(&ranked, &correct, &corpus, 4);
        assert_eq!(s4.recall_all, 1.0);
        // actual [0, 1, 0, 1] → 1/log2(2) + 1/log2(4) = 1.5; ideal → 2.
        let want = 1.5 / 2.0;
        assert!((s4.ndcg_any - want).abs() < 1e-12);
        // A perfect ranking scores 1.
        let best = evaluate(&ids(&["d", "b", "a"]), &correct, &corpus, 10);
        assert!((best.ndcg_any - 1.0).abs() < 1e-12);
    }

    #[test]
    fn turn_rankings_become_session_rankings_at_their_best_turn() {
        let turns = ids(&["s2_1", "s1_4", "s2_3", "s3_1"]);
        let sessions = sessions_of(&turns, |t| t.split('_').next().unwrap().to_string());
        assert_eq!(sessions, ids(&["s2", "s1", "s3"]));
    }

    #[test]
    fn summaries_average_per_k() {
        let mut s = Summary::default();
        let one = |x: f64| {
            BTreeMap::from([(
                5,
                Scores {
                    recall_any: x,
                    recall_all: x,
                    ndcg_any: x,
                },
            )])
        };
        s.add(&one(1.0));
        s.add(&one(0.0));
        s.add(&one(1.0));
        assert_eq!(s.questions, 3);
        assert!((s.at[&5].recall_any - 2.0 / 3.0).abs() < 1e-12);
    }
}
