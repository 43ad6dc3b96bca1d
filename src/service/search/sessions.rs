//! Results grouped by conversation (`group_sessions`): which sessions a query
//! is about, best first. A session scores as its best result plus
//! `search.session_rest_weight` times the sum of its other results' scores,
//! so a session several of whose turns match outranks one that matches in a
//! single lucky turn, while one strong turn still carries its session. The
//! results counted are the first `search.session_pool` (100) whatever the
//! request's `top_k`: a session's rank does not hang on how many results
//! the caller reads, and a session whose turns rank 11th to 40th still adds
//! them up. The memories' own order is not touched: the turn an agent
//! quotes first stays where the fusion put it.

use std::collections::HashMap;

use serde::Serialize;

/// One session among a search's results.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize)]
pub struct SessionHit {
    pub session_id: String,
    /// The best result's `score_final` plus `session_rest_weight` times the
    /// sum of the others'.
    pub score: f32,
    /// Its memories among the results counted, best first: those of
    /// `results` in their order, then any beyond the top k.
    pub chunk_ids: Vec<String>,
}

/// The sessions of `results`, best first. `results` are
/// `(session_id, chunk_id, score)` in the search's order (best first);
/// those without a session are left out. Ties keep the order in which the
/// sessions first appear.
pub fn rank<'a>(
    results: impl IntoIterator<Item = (Option<&'a str>, &'a str, f32)>,
    rest_weight: f32,
) -> Vec<SessionHit> {
    let mut ranked: Vec<SessionHit> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for (session, id, score) in results {
        let Some(session) = session else { continue };
        // Results arrive best first: a session's first one is its best.
        match at.get(session) {
            Some(&i) => {
                ranked[i].score += rest_weight * score;
                ranked[i].chunk_ids.push(id.to_string());
            }
            None => {
                at.insert(session, ranked.len());
                ranked.push(SessionHit {
                    session_id: session.to_string(),
                    score,
                    chunk_ids: vec![id.to_string()],
                });
            }
        }
    }
    // A stable sort: equal scores keep their first appearance's order.
    ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(ranked: &[SessionHit]) -> Vec<&str> {
        ranked.iter().map(|s| s.session_id.as_str()).collect()
    }

    #[test]
    fn several_matching_turns_outrank_one_lucky_turn() {
        let results = [
            (Some("lucky"), "a", 0.58),
            (Some("steady"), "b", 0.50),
            (Some("steady"), "c", 0.45),
            (Some("steady"), "d", 0.40),
            (None, "loose", 0.39),
        ];
        let ranked = rank(results, 0.1);
        assert_eq!(ids(&ranked), ["steady", "lucky"]);
        assert!((ranked[0].score - (0.50 + 0.1 * (0.45 + 0.40))).abs() < 1e-6);
        assert_eq!(ranked[0].chunk_ids, ["b", "c", "d"]);
        assert_eq!(ranked[1].score, 0.58);
        // Without the rest's weight a session is its best result.
        assert_eq!(ids(&rank(results, 0.0)), ["lucky", "steady"]);
    }

    #[test]
    fn ties_keep_the_order_of_first_appearance_and_no_session_no_group() {
        let ranked = rank(
            [
                (Some("x"), "1", 0.5),
                (None, "2", 0.9),
                (Some("y"), "3", 0.5),
            ],
            0.1,
        );
        assert_eq!(ids(&ranked), ["x", "y"]);
        assert!(rank([(None, "1", 0.5)], 0.1).is_empty());
    }
}
