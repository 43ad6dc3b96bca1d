//! After fusion: the score a memory's standing earns it (age against its
//! type's half-life, importance, feedback, how often it was recalled), and the
//! collapse of near-identical results.

use std::collections::HashSet;

use serde::Serialize;

use crate::core::model::{Chunk, Micros};
use crate::core::time::DAY_MICROS;
use crate::service::feedback::Tally;
use crate::service::search::config::SearchConfig;

/// The multipliers applied to a memory's fused score.
#[derive(schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Factors {
    pub decay: f32,
    pub importance: f32,
    pub feedback: f32,
    pub access: f32,
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
        }
    }

    pub fn product(&self) -> f32 {
        self.decay * self.importance * self.feedback * self.access
    }
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

/// The lower-cased words of a text, for near-duplicate comparison.
pub fn word_set(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// |a ∩ b| / |a ∪ b| (1 for two empty sets).
pub fn jaccard(a: &HashSet<String>, b: &HashSet<String>) -> f32 {
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let both = small.iter().filter(|w| large.contains(*w)).count();
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
        let shipped: toml::Table = toml::from_str(include_str!("../../../config.toml")).unwrap();
        shipped["search"].clone().try_into().unwrap()
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
    fn near_duplicates_overlap() {
        let a = word_set("User prefers dark mode in all tools.");
        let b = word_set("user prefers DARK mode in all tools");
        let c = word_set("User prefers light mode");
        assert_eq!(jaccard(&a, &b), 1.0);
        assert!(jaccard(&a, &c) < 0.5);
    }

    proptest::proptest! {
        /// The counting shortcut is the set algebra's |a ∩ b| / |a ∪ b|.
        #[test]
        fn jaccard_is_intersection_over_union(
            a in proptest::collection::hash_set("[a-e]{1,2}", 0..12),
            b in proptest::collection::hash_set("[a-e]{1,2}", 0..12),
        ) {
            let union = a.union(&b).count();
            let expected = if union == 0 {
                1.0
            } else {
                a.intersection(&b).count() as f32 / union as f32
            };
            proptest::prop_assert_eq!(jaccard(&a, &b), expected);
            proptest::prop_assert_eq!(jaccard(&b, &a), expected);
        }
    }
}
