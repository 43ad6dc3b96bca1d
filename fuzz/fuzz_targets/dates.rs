//! Instants and relative dates from any text, against the calendar's ends.
#![no_main]

use chrono::NaiveDate;
use libfuzzer_sys::fuzz_target;
use loomem::service::facts::dates::DateResolver;

fuzz_target!(|text: &str| {
    let _ = loomem::core::time::parse_instant_str(text);
    let _ = loomem::core::time::parse_instant("at", &serde_json::Value::String(text.into()));
    let resolver = DateResolver::new();
    for base in [NaiveDate::MIN, NaiveDate::MAX, NaiveDate::from_ymd_opt(2026, 2, 28).unwrap()] {
        let found = resolver.resolve(text, base);
        let _ = DateResolver::rewrite(text, &found);
    }
});
