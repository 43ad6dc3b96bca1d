//! Instants and relative dates from any text, against the calendar's ends.
#![no_main]

use std::sync::OnceLock;

use chrono::NaiveDate;
use libfuzzer_sys::fuzz_target;
use loomem::service::facts::dates::DateResolver;

fn resolver() -> &'static DateResolver {
    static RESOLVER: OnceLock<DateResolver> = OnceLock::new();
    RESOLVER.get_or_init(DateResolver::new)
}

fuzz_target!(|text: &str| {
    let _ = loomem::core::time::parse_instant_str(text);
    let _ = loomem::core::time::parse_instant("at", &serde_json::Value::String(text.into()));
    for base in [
        NaiveDate::MIN,
        NaiveDate::MAX,
        NaiveDate::from_ymd_opt(2026, 2, 28).unwrap(),
    ] {
        let found = resolver().resolve(text, base);
        let _ = DateResolver::rewrite(text, &found);
    }
});
