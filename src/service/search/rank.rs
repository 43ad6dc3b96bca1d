//! After fusion: the score a memory's standing earns it (age against its
//! type's half-life, importance, feedback, how often it was recalled), and the
//! collapse of near-identical results.

use std::sync::OnceLock;

use regex::Regex;
use serde::Serialize;

use crate::core::model::{Chunk, Micros};
use crate::core::time::DAY_MICROS;
use crate::core::vector::l2_normalize;
use crate::service::facts::Role;
use crate::service::feedback::Tally;
use crate::service::search::config::SearchConfig;
use crate::service::search::question::TimeWindow;

/// The multipliers applied to a memory's fused score.
#[derive(schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Factors {
    pub decay: f32,
    pub importance: f32,
    pub feedback: f32,
    pub access: f32,
    /// `assistant_weight` for a conversation turn by the speaker the query is
    /// not about (see [`speaker_factor`]); 1 otherwise.
    pub speaker: f32,
    /// `1 + time_weight` for a memory recorded within a date the query names
    /// (see [`super::question`]); 1 otherwise.
    pub time: f32,
}

impl Factors {
    pub fn of(cfg: &SearchConfig, chunk: &Chunk, feedback: Tally, now: Micros) -> Factors {
        Factors {
            decay: decay(cfg, chunk, now),
            importance: chunk
                .importance
                .clamp(0.05, 20.0)
                .powf(cfg.importance_weight),
            feedback: feedback.factor(cfg.feedback_weight),
            access: 1.0 + cfg.access_boost * (1.0 + chunk.access_count.max(0) as f32).ln(),
            speaker: 1.0,
            time: 1.0,
        }
    }

    pub fn product(&self) -> f32 {
        self.decay * self.importance * self.feedback * self.access * self.speaker * self.time
    }
}

/// Who said a memory: the `role` its metadata names (imported conversation
/// turns carry one); `None` for everything else.
pub fn speaker(chunk: &Chunk) -> Option<Role> {
    let meta = chunk.metadata.as_deref()?;
    if !meta.contains("\"role\"") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(meta).ok()?;
    match Role::parse(v.get("role")?.as_str()?) {
        Role::Other => None,
        r => Some(r),
    }
}

/// Whether a query asks about what the assistant said ("you recommended",
/// "our previous conversation", "did you mention").
pub fn asks_about_assistant(query: &str) -> bool {
    static CUES: OnceLock<Regex> = OnceLock::new();
    CUES.get_or_init(|| {
        Regex::new(
            r"(?i)\b(?:our (?:previous|last|earlier|past|prior) (?:conversation|chat|discussion|session)s?|you (?:mentioned|recommended|suggested|provided|told|said|gave|listed|shared|explained|wrote|created|made|came up with|described|showed)|did you (?:say|mention|recommend|suggest)|we (?:talked|chatted|spoke) about|we discussed|your (?:suggestions?|recommendations?|advice|answers?|responses?|list))\b",
        )
        .expect("the cue pattern compiles")
    })
    .is_match(query)
}

/// A conversation turn by the speaker the query is not about weighs
/// `assistant_weight`: the assistant's turns, unless the query asks what the
/// assistant said; then the user's. Memories without a speaker weigh 1.
pub fn speaker_factor(cfg: &SearchConfig, chunk: &Chunk, about_assistant: bool) -> f32 {
    match (speaker(chunk), about_assistant) {
        (Some(Role::Assistant), false) | (Some(Role::User), true) => cfg.assistant_weight,
        _ => 1.0,
    }
}

/// For a memory recorded within one of `windows`: `1 + time_weight_day`
/// when that window is a day the query names, else `1 + time_weight` (a
/// month, a year); the larger when it is within several.
pub fn time_factor(cfg: &SearchConfig, chunk: &Chunk, windows: &[TimeWindow]) -> f32 {
    windows
        .iter()
        .filter(|w| (w.from..w.to).contains(&chunk.created_at))
        .map(|w| {
            1.0 + if w.day {
                cfg.time_weight_day
            } else {
                cfg.time_weight
            }
        })
        .fold(1.0, f32::max)
}

/// The query vector moved toward the mean of `near` (the vector leg's first
/// hits) by `weight`, normalised: `q/|q| + weight * mean(near)`. None when
/// `near` is empty or holds vectors of another dimension.
pub fn feedback_query<V: AsRef<[f32]>>(query: &[f32], near: &[V], weight: f32) -> Option<Vec<f32>> {
    if near.is_empty() || near.iter().any(|v| v.as_ref().len() != query.len()) {
        return None;
    }
    let mut q = query.to_vec();
    l2_normalize(&mut q);
    let share = weight / near.len() as f32;
    for v in near {
        let mut v = v.as_ref().to_vec();
        l2_normalize(&mut v);
        q.iter_mut().zip(&v).for_each(|(a, b)| *a += share * b);
    }
    l2_normalize(&mut q);
    Some(q)
}

/// `(1 - w) + w * 0.5^(age / half_life)`; 1 for pinned memories and for
/// memories not older than `now`.
pub fn decay(cfg: &SearchConfig, chunk: &Chunk, now: Micros) -> f32 {
    if chunk.pinned || cfg.decay_weight == 0.0 {
        return 1.0;
    }
    let age_days = (now - chunk.created_at).max(0) as f64 / DAY_MICROS as f64;
    let fresh = 0.5f64.powf(age_days / cfg.half_life(&chunk.memory_type));
    let w = f64::from(cfg.decay_weight);
    ((1.0 - w) + w * fresh) as f32
}

/// A text's lower-cased words, for near-duplicate comparison: each word's
/// 64-bit hash, sorted and without repeats, so that two sets meet in one
/// merge pass. (As sets of strings, hashed again at every lookup, the
/// comparisons of a search's near-duplicate collapse were a sixth of its
/// time under closed-loop searchers.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WordSet(Vec<u64>);

/// The words of `text` (runs of alphanumeric characters), lower-cased.
pub fn word_set(text: &str) -> WordSet {
    // Fixed seeds: the same word hashes alike in every set.
    let hasher = ahash::RandomState::with_seeds(0x6c6f, 0x6f6d, 0x656d, 0x7773);
    let mut lower = String::new();
    let mut words: Vec<u64> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            if w.is_ascii() {
                lower.clear();
                lower.extend(w.bytes().map(|b| char::from(b.to_ascii_lowercase())));
                hasher.hash_one(lower.as_str())
            } else {
                hasher.hash_one(w.to_lowercase().as_str())
            }
        })
        .collect();
    words.sort_unstable();
    words.dedup();
    WordSet(words)
}

/// Whether `a` and `b` overlap at least `threshold` ([`jaccard`]). The
/// overlap is at most the smaller set's size over the larger's, so sets of
/// very different sizes are told apart without comparing their words (a
/// pool of a hundred long turns holds few pairs of like length).
pub fn near_duplicate(a: &WordSet, b: &WordSet, threshold: f32) -> bool {
    let (small, large) = match a.0.len() <= b.0.len() {
        true => (a.0.len(), b.0.len()),
        false => (b.0.len(), a.0.len()),
    };
    // Divided as `jaccard` divides: rounding keeps the bound above it.
    if large > 0 && (small as f32 / large as f32) < threshold {
        return false;
    }
    jaccard(a, b) >= threshold
}

/// |a ∩ b| / |a ∪ b| (1 for two empty sets).
pub fn jaccard(a: &WordSet, b: &WordSet) -> f32 {
    let (a, b) = (&a.0, &b.0);
    let (mut i, mut j, mut both) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                both += 1;
                i += 1;
                j += 1;
            }
        }
    }
    let union = a.len() + b.len() - both;
    if union == 0 {
        return 1.0;
    }
    both as f32 / union as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> SearchConfig {
        crate::service::search::config::shipped()
    }

    fn chunk(memory_type: &str, age_days: i64) -> Chunk {
        let mut c = Chunk::new("a".into(), "s".into(), "x".into(), 0);
        c.memory_type = memory_type.into();
        c.created_at = 1_000 * DAY_MICROS - age_days * DAY_MICROS;
        c
    }

    #[test]
    fn decay_follows_each_types_half_life() {
        let cfg = cfg();
        let now = 1_000 * DAY_MICROS;
        let w = cfg.decay_weight;
        // One half-life old: the fresh part is halved.
        let half = (1.0 - w) + w * 0.5;
        assert!((decay(&cfg, &chunk("project", 30), now) - half).abs() < 1e-6);
        assert!((decay(&cfg, &chunk("preference", 180), now) - half).abs() < 1e-6);
        assert!((decay(&cfg, &chunk("observation", 14), now) - half).abs() < 1e-6);
        // Unlisted types take `default`.
        assert!((decay(&cfg, &chunk("plan", 60), now) - half).abs() < 1e-6);
        assert_eq!(decay(&cfg, &chunk("general", 0), now), 1.0);
        // A month hurts a project more than a preference.
        assert!(
            decay(&cfg, &chunk("project", 30), now) < decay(&cfg, &chunk("preference", 30), now)
        );
        let mut pinned = chunk("observation", 3650);
        pinned.pinned = true;
        assert_eq!(decay(&cfg, &pinned, now), 1.0);
        // Never below the floor, never above 1 (future memories count as new).
        assert!(decay(&cfg, &chunk("observation", 36500), now) >= 1.0 - w);
        assert_eq!(decay(&cfg, &chunk("general", -5), now), 1.0);
    }

    #[test]
    fn importance_feedback_and_access_multiply() {
        let cfg = cfg();
        let mut c = chunk("general", 0);
        let plain = Factors::of(&cfg, &c, Tally::default(), 1_000 * DAY_MICROS);
        assert_eq!(plain.product(), 1.0);
        c.importance = 2.0;
        c.access_count = 10;
        let f = Factors::of(&cfg, &c, Tally::default(), 1_000 * DAY_MICROS);
        let w = cfg.importance_weight;
        assert!((f.importance - 2f32.powf(w)).abs() < 1e-6, "{f:?}");
        assert!((f.access - (1.0 + cfg.access_boost * 11f32.ln())).abs() < 1e-6);
        assert!(f.product() > 1.0);
    }

    #[test]
    fn the_speaker_the_query_is_not_about_weighs_less() {
        let cfg = cfg();
        let turn = |role: &str| {
            let mut c = chunk("observation", 0);
            c.metadata = Some(serde_json::json!({"role": role, "turn_index": 3}).to_string());
            c
        };
        let (user, assistant, plain) = (turn("user"), turn("assistant"), chunk("general", 0));
        assert_eq!(speaker(&user), Some(Role::User));
        assert_eq!(speaker(&assistant), Some(Role::Assistant));
        assert_eq!(speaker(&plain), None);
        assert_eq!(speaker(&turn("tool")), None);
        let w = cfg.assistant_weight;
        assert!(w < 1.0);
        assert_eq!(speaker_factor(&cfg, &assistant, false), w);
        assert_eq!(speaker_factor(&cfg, &user, false), 1.0);
        assert_eq!(speaker_factor(&cfg, &assistant, true), 1.0);
        assert_eq!(speaker_factor(&cfg, &user, true), w);
        assert_eq!(speaker_factor(&cfg, &plain, true), 1.0);
        for q in [
            "Can you remind me of the Mayo Clinic video you recommended?",
            "I'm going back to our previous chat about the one-shot.",
            "Which traditional game did you say was performed by skilled players?",
            "What was the move you made after 27. Kg2 Bd5+?",
        ] {
            assert!(asks_about_assistant(q), "{q}");
        }
        for q in [
            "What IDE do I use?",
            "How many days ago did I attend the jazz concert?",
            "Can you recommend a podcast for my commute?",
            "Where did you go last summer, according to my notes?",
        ] {
            assert!(!asks_about_assistant(q), "{q}");
        }
    }

    #[test]
    fn near_duplicates_overlap() {
        let a = word_set("User prefers dark mode in all tools.");
        let b = word_set("user prefers DARK mode in all tools");
        let c = word_set("User prefers light mode");
        assert_eq!(jaccard(&a, &b), 1.0);
        assert!(jaccard(&a, &c) < 0.5);
    }

    proptest::proptest! {
        /// On any two texts, the hashed sets give the set algebra's
        /// |a ∩ b| / |a ∪ b| over the texts' lower-cased words.
        #[test]
        fn jaccard_is_intersection_over_union(
            a in proptest::collection::vec("[a-eA-EÉéΣσ]{1,3}", 0..12),
            b in proptest::collection::vec("[a-eA-EÉéΣσ]{1,3}", 0..12),
            sep in "[ ,.!?-]{1,2}",
        ) {
            let words = |w: &[String]| -> std::collections::HashSet<String> {
                w.iter().map(|w| w.to_lowercase()).collect()
            };
            let (wa, wb) = (words(&a), words(&b));
            let union = wa.union(&wb).count();
            let expected = if union == 0 {
                1.0
            } else {
                wa.intersection(&wb).count() as f32 / union as f32
            };
            let (ta, tb) = (word_set(&a.join(&sep)), word_set(&b.join(&sep)));
            proptest::prop_assert_eq!(jaccard(&ta, &tb), expected);
            proptest::prop_assert_eq!(jaccard(&tb, &ta), expected);
        }

        /// The size bound never changes the answer, only skips the count.
        #[test]
        fn near_duplicate_is_jaccard_at_the_threshold(
            a in proptest::collection::vec("[a-f]{1,2}", 0..30),
            b in proptest::collection::vec("[a-f]{1,2}", 0..30),
            threshold in 0.01f32..=1.0,
        ) {
            let (ta, tb) = (word_set(&a.join(" ")), word_set(&b.join(" ")));
            let want = jaccard(&ta, &tb) >= threshold;
            proptest::prop_assert_eq!(near_duplicate(&ta, &tb, threshold), want);
            proptest::prop_assert_eq!(near_duplicate(&tb, &ta, threshold), want);
        }
    }

    #[test]
    fn feedback_moves_the_query_toward_its_first_hits() {
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let q = [2.0, 0.0, 0.0];
        let near = vec![vec![0.0, 3.0, 0.0], vec![0.0, 0.0, 1.0]];
        let moved = feedback_query(&q, &near, 0.5).unwrap();
        // q/|q| + 0.5 * mean = (1, 0.25, 0.25), normalised.
        let n = (1.0f32 + 0.0625 + 0.0625).sqrt();
        for (got, want) in moved.iter().zip([1.0 / n, 0.25 / n, 0.25 / n]) {
            assert!((got - want).abs() < 1e-6, "{moved:?}");
        }
        assert!((dot(&moved, &moved) - 1.0).abs() < 1e-6);
        // Closer to each hit than the question was, still nearest the question.
        assert!(dot(&moved, &[0.0, 1.0, 0.0]) > 0.0);
        assert!(dot(&moved, &[1.0, 0.0, 0.0]) > 0.8);
        assert_eq!(feedback_query::<Vec<f32>>(&q, &[], 0.5), None);
        assert_eq!(
            feedback_query(&q, &[vec![1.0, 0.0]], 0.5),
            None,
            "another dimension"
        );
    }

    #[test]
    fn a_query_naming_a_time_lifts_what_was_recorded_then() {
        use chrono::TimeZone;
        let now = chrono::Utc
            .with_ymd_and_hms(2023, 5, 30, 12, 0, 0)
            .unwrap()
            .timestamp_micros();
        let on = |y, m, d| {
            chrono::Utc
                .with_ymd_and_hms(y, m, d, 15, 0, 0)
                .unwrap()
                .timestamp_micros()
        };
        let cfg = cfg();
        // The windows a search weighs (the shipped time weights are on).
        let time_windows =
            |query: &str, now| super::super::question::read(query, now, &cfg).windows;
        let mut c = Chunk::new("x".into(), "s".into(), "t".into(), on(2023, 5, 20));
        let w = time_windows("What did I buy last Saturday?", now);
        assert_eq!(w.len(), 1);
        assert_eq!(
            time_factor(&cfg, &c, &w),
            1.0,
            "Saturday 2023-05-27 ± 1 day holds no 05-20"
        );
        c.created_at = on(2023, 5, 27);
        assert_eq!(time_factor(&cfg, &c, &w), 1.0 + cfg.time_weight_day);
        c.created_at = on(2023, 5, 20);
        let w = time_windows("Where did I go two weeks ago?", now);
        assert_eq!(time_factor(&cfg, &c, &w), 1.0);
        c.created_at = on(2023, 5, 16);
        assert_eq!(time_factor(&cfg, &c, &w), 1.0 + cfg.time_weight_day);
        // A month or a year lifts less than a day.
        let w = time_windows("What happened in March?", now);
        c.created_at = on(2023, 3, 31);
        assert_eq!(time_factor(&cfg, &c, &w), 1.0 + cfg.time_weight);
        assert!(cfg.time_weight < cfg.time_weight_day);
        // A day within the month named: the day's lift.
        let w = time_windows("What did I do in March, ten days ago?", on(2023, 3, 25));
        c.created_at = on(2023, 3, 15);
        assert_eq!(time_factor(&cfg, &c, &w), 1.0 + cfg.time_weight_day);
        assert!(time_windows("What is my favourite colour?", now).is_empty());
    }
}
