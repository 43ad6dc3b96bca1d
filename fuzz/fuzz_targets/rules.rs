//! The transcript parser and the rule extractor over any text (the rules
//! the daemon ships), at the calendar's ends too.
#![no_main]

use std::sync::OnceLock;

use chrono::NaiveDate;
use libfuzzer_sys::fuzz_target;
use loomem::service::facts::{parse_transcript, rules::RuleExtractor};

fn rules() -> &'static RuleExtractor {
    static RULES: OnceLock<RuleExtractor> = OnceLock::new();
    RULES.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../pipelines/extract/facts.toml");
        RuleExtractor::load(&path).expect("the shipped rules load")
    })
}

fuzz_target!(|text: &str| {
    let turns = parse_transcript(text);
    for date in [
        NaiveDate::MIN,
        NaiveDate::MAX,
        NaiveDate::from_ymd_opt(2026, 11, 24).unwrap(),
    ] {
        let _ = rules().extract(&turns, date);
    }
});
