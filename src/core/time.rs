//! Reading instants from requests: RFC 3339 timestamps, plain dates, and Unix seconds.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};

use crate::core::error::{Error, Result};
use crate::core::model::Micros;

pub const DAY_MICROS: i64 = 86_400_000_000;

/// An instant given as a JSON string (`2026-04-02`, `2026-04-02T10:00:00Z`,
/// `2026-04-02 10:00:00`) or a number of Unix seconds. Dates mean midnight UTC.
pub fn parse_instant(field: &str, value: &serde_json::Value) -> Result<Micros> {
    match value {
        serde_json::Value::Number(n) => n
            .as_f64()
            .filter(|s| s.is_finite() && s.abs() < 1e11)
            .map(|s| (s * 1e6) as i64)
            .ok_or_else(|| Error::invalid(field, "must be Unix seconds within range")),
        serde_json::Value::String(s) => parse_instant_str(s).ok_or_else(|| {
            Error::invalid(
                field,
                format!("cannot read {s:?} as a date or RFC 3339 timestamp"),
            )
        }),
        _ => Err(Error::invalid(
            field,
            "must be a date string or Unix seconds",
        )),
    }
}

/// True when the text is a bare date (no time of day).
pub fn is_date_only(s: &str) -> bool {
    NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d").is_ok()
}

pub fn parse_instant_str(s: &str) -> Option<Micros> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc).timestamp_micros());
    }
    for fmt in [
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y/%m/%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, fmt) {
            return Some(t.and_utc().timestamp_micros());
        }
    }
    for fmt in ["%Y-%m-%d", "%Y/%m/%d"] {
        if let Ok(d) = NaiveDate::parse_from_str(s, fmt) {
            return Some(d.and_hms_opt(0, 0, 0)?.and_utc().timestamp_micros());
        }
    }
    None
}

/// Seconds since the epoch for a microsecond instant.
pub fn to_secs(m: Micros) -> i64 {
    m.div_euclid(1_000_000)
}

pub fn to_rfc3339(m: Micros) -> String {
    DateTime::<Utc>::from_timestamp_micros(m)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_dates_timestamps_and_seconds() {
        let day = parse_instant("f", &json!("2026-04-02")).unwrap();
        assert_eq!(to_rfc3339(day), "2026-04-02T00:00:00Z");
        assert_eq!(
            parse_instant("f", &json!("2026-04-02T02:00:00+02:00")).unwrap(),
            day
        );
        assert_eq!(parse_instant("f", &json!(1_775_088_000)).unwrap(), day);
        assert_eq!(
            parse_instant("f", &json!("2026/04/02 (Thu) 00:00")).ok(),
            None
        );
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse_instant("date_from", &json!("yesterday"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("date_from:"), "{e}");
        assert!(parse_instant("x", &json!(true)).is_err());
    }
}
