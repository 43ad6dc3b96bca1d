//! Reading instants from requests: RFC 3339 timestamps, plain dates, and Unix seconds.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};

use crate::core::error::{Error, Result};
use crate::core::model::Micros;

pub const DAY_MICROS: i64 = 86_400_000_000;

/// An instant given as a JSON string (`2026-04-02`, `2026-04-02T10:00:00Z`,
/// `2026-04-02 10:00:00`) or a number of Unix seconds. Dates mean midnight UTC.
/// The JSON Schema of what [`parse_instant`] reads: a date or RFC 3339
/// string, or Unix seconds within ±10^11 (for the OpenAPI description).
pub fn instant_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "anyOf": [
            { "type": "string", "format": "date-time" },
            { "type": "string", "format": "date" },
            { "type": "number", "minimum": -1e11, "maximum": 1e11 }
        ]
    })
}

/// [`instant_schema`], or null.
pub fn optional_instant_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = instant_schema(g);
    if let Some(any) = s.get_mut("anyOf").and_then(|v| v.as_array_mut()) {
        any.push(serde_json::json!({ "type": "null" }));
    }
    s
}

/// A field that may be absent (`None`), or present and null
/// (`Some(Value::Null)`: clear it), or present with a value; use with
/// `#[serde(default, deserialize_with = "present")]`.
pub fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<serde_json::Value>, D::Error> {
    <serde_json::Value as serde::Deserialize>::deserialize(d).map(Some)
}

/// A JSON object or null (for `metadata`).
pub fn optional_object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": ["object", "null"] })
}

pub fn parse_instant(field: &str, value: &serde_json::Value) -> Result<Micros> {
    match value {
        serde_json::Value::Number(n) => n
            .as_f64()
            .and_then(from_secs_f64)
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

/// The farthest instant from the epoch loomem takes, either way (±10^11
/// seconds, about 3,170 years): far inside chrono's range, so date arithmetic
/// on any accepted instant (a week back, a month on) cannot overflow.
pub const MAX_ABS_MICROS: Micros = 100_000_000_000 * 1_000_000;

/// A date or timestamp in one of the accepted forms, within
/// [`MAX_ABS_MICROS`] of the epoch.
pub fn parse_instant_str(s: &str) -> Option<Micros> {
    parse_any_instant(s).filter(|m| m.unsigned_abs() <= MAX_ABS_MICROS as u64)
}

fn parse_any_instant(s: &str) -> Option<Micros> {
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

/// Unix seconds as an instant, when within [`MAX_ABS_MICROS`] of the epoch.
pub fn from_secs(secs: i64) -> Option<Micros> {
    secs.checked_mul(1_000_000)
        .filter(|m| m.unsigned_abs() <= MAX_ABS_MICROS as u64)
}

/// Fractional Unix seconds as an instant, when finite and within range.
pub fn from_secs_f64(secs: f64) -> Option<Micros> {
    (secs.is_finite() && secs.abs() < (MAX_ABS_MICROS / 1_000_000) as f64)
        .then(|| (secs * 1e6) as Micros)
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
    fn instants_far_from_the_epoch_are_refused() {
        for v in [
            json!("-262143-01-01"),
            json!("+262142-12-31"),
            json!("9999-12-31T23:59:59Z"),
            json!(2e11),
        ] {
            assert!(parse_instant("now", &v).is_err(), "{v}");
        }
        assert!(parse_instant("now", &json!("4000-01-01")).is_ok());
        assert!(parse_instant("now", &json!("0001-01-01")).is_ok());
    }

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

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever a request sends, an instant is read within range or refused.
        #[test]
        fn any_text_is_an_instant_in_range_or_none(s in "\\PC{0,40}") {
            if let Some(m) = parse_instant_str(&s) {
                prop_assert!(m.unsigned_abs() <= MAX_ABS_MICROS as u64);
            }
        }

        /// Dates anywhere in chrono's calendar and beyond: in range, they print
        /// and read back to the same second; out of range, they are refused.
        #[test]
        fn dates_at_the_extremes_read_back(
            y in -300_000i32..300_000, mo in 1u32..=12, d in 1u32..=31,
            h in 0u32..24, mi in 0u32..60,
        ) {
            let text = format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:00Z");
            if let Some(m) = parse_instant_str(&text) {
                prop_assert!(m.unsigned_abs() <= MAX_ABS_MICROS as u64);
                prop_assert_eq!(parse_instant_str(&to_rfc3339(m)), Some(m));
            }
        }

        /// Unix seconds of any size or kind never overflow.
        #[test]
        fn unix_seconds_of_any_size(secs in any::<i64>(), f in any::<f64>()) {
            if let Some(m) = from_secs(secs) {
                prop_assert!(m.unsigned_abs() <= MAX_ABS_MICROS as u64);
                prop_assert_eq!(to_secs(m), secs);
            }
            if let Some(m) = from_secs_f64(f) {
                prop_assert!(m.unsigned_abs() <= MAX_ABS_MICROS as u64);
            }
        }
    }
}
