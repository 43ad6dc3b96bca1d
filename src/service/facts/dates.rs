//! Dates in conversational text, resolved against the conversation's date:
//! "yesterday", "in two days", "3 weeks ago", "last week", "next Friday",
//! "this weekend", "April 15th", "the 3rd of May", "in March", "last year",
//! "2026-04-15".
//!
//! Conventions (documented in the README and `datasets/README.md`):
//! - `last/next/this week` = the date 7 days before / after / the date itself;
//! - `next <weekday>` = that weekday in the following Monday-based week,
//!   `this <weekday>` = that weekday in the current week, `last <weekday>` =
//!   the latest such day before the date; a bare `<weekday>` = the next one
//!   after the date, or the latest one before it when the sentence is in the
//!   past tense;
//! - a month and day without a year take the year that puts them closest to
//!   the conversation date; so does a bare month ("in May");
//! - `in N months` / `N months ago` resolve to a month, `… years` to a year.

use chrono::{Datelike, Duration, Months, NaiveDate, Weekday};
use regex::Regex;
use serde::Serialize;

#[derive(schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    Day,
    Month,
    Year,
}

/// A date expression found in a text and what it means.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize)]
pub struct ResolvedDate {
    /// The words as written.
    pub expression: String,
    /// `YYYY-MM-DD`, `YYYY-MM` or `YYYY`.
    pub date: String,
    pub granularity: Granularity,
    #[serde(skip)]
    pub start: usize,
    #[serde(skip)]
    pub end: usize,
    /// How the absolute date reads in place of the expression ("on", "around",
    /// "in", or nothing for absolute forms).
    #[serde(skip)]
    pub lead: &'static str,
}

const MONTHS: &str = r"jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?";
const WEEKDAYS: &str = r"monday|tuesday|wednesday|thursday|friday|saturday|sunday";
const NUMBER: &str =
    r"\d{1,3}|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|a couple of";
const UNITS: &str = r"days?|weeks?|months?|years?";

#[derive(Clone, Copy)]
enum Kind {
    Iso,
    MonthDay,
    DayMonth,
    Named,
    InOffset,
    Ago,
    RelUnit,
    RelWeekday,
    WeekdayNth,
    Weekday,
    Month,
    Year,
}

pub struct DateResolver {
    patterns: Vec<(Kind, Regex)>,
    past: Regex,
    preposition: Regex,
}

impl Default for DateResolver {
    fn default() -> Self {
        DateResolver::new()
    }
}

fn month_number(s: &str) -> Option<u32> {
    let m = s.to_lowercase();
    let names = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    names
        .iter()
        .position(|n| m.starts_with(n))
        .map(|i| i as u32 + 1)
}

fn weekday(s: &str) -> Option<Weekday> {
    s.to_lowercase().parse().ok()
}

fn number(s: &str) -> Option<i64> {
    let s = s.to_lowercase();
    let words = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve",
    ];
    match s.as_str() {
        "a" | "an" => Some(1),
        "a couple of" => Some(2),
        _ => s
            .parse()
            .ok()
            .or_else(|| words.iter().position(|w| *w == s).map(|i| i as i64)),
    }
}

fn day(d: NaiveDate) -> (String, Granularity) {
    (d.format("%Y-%m-%d").to_string(), Granularity::Day)
}

fn month(d: NaiveDate) -> (String, Granularity) {
    (d.format("%Y-%m").to_string(), Granularity::Month)
}

fn year(y: i32) -> (String, Granularity) {
    (format!("{y:04}"), Granularity::Year)
}

/// Of the given candidates, the one closest to `base`.
fn closest(base: NaiveDate, candidates: impl IntoIterator<Item = NaiveDate>) -> Option<NaiveDate> {
    candidates
        .into_iter()
        .min_by_key(|d| (*d - base).num_days().abs())
}

fn add_months(d: NaiveDate, n: i64) -> Option<NaiveDate> {
    if n >= 0 {
        d.checked_add_months(Months::new(n as u32))
    } else {
        d.checked_sub_months(Months::new((-n) as u32))
    }
}

/// `d` moved by `days`, unless that leaves the calendar (a text can ask for
/// "in 9999999999 days").
fn shift(d: NaiveDate, days: i64) -> Option<NaiveDate> {
    d.checked_add_signed(Duration::try_days(days)?)
}

fn monday_of(d: NaiveDate) -> Option<NaiveDate> {
    shift(d, -i64::from(d.weekday().num_days_from_monday()))
}

impl DateResolver {
    pub fn new() -> DateResolver {
        let re = |p: String| Regex::new(&format!("(?i){p}")).expect("static date regex");
        let patterns = vec![
            (Kind::Iso, re(r"\b(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})\b".into())),
            (
                Kind::MonthDay,
                re(format!(
                    r"\b(?P<month>{MONTHS})\.?\s+(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+(?P<y>\d{{4}})\b)?"
                )),
            ),
            (
                Kind::DayMonth,
                re(format!(
                    r"\b(?:the\s+)?(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<month>{MONTHS})\b(?:,?\s+(?P<y>\d{{4}})\b)?"
                )),
            ),
            (
                Kind::Named,
                re(r"\b(?P<named>the\s+day\s+before\s+yesterday|the\s+day\s+after\s+tomorrow|yesterday|today|tonight|tomorrow|this\s+(?:morning|afternoon|evening))\b".into()),
            ),
            // Before `in N days`: "the wedding I was in a week ago" is a
            // week back, not ahead (an earlier pattern's span wins).
            (
                Kind::Ago,
                re(format!(r"\b(?P<n>{NUMBER})\s+(?P<unit>{UNITS})\s+ago\b")),
            ),
            (
                Kind::InOffset,
                re(format!(r"\bin\s+(?P<n>{NUMBER})\s+(?P<unit>{UNITS})\b")),
            ),
            (
                Kind::RelUnit,
                re(r"\b(?P<rel>last|next|this|coming)\s+(?P<unit>week|weekend|month|year)\b".into()),
            ),
            (
                Kind::RelWeekday,
                re(format!(
                    r"\b(?P<rel>last|next|this|coming)\s+(?P<wd>{WEEKDAYS})\b"
                )),
            ),
            (
                Kind::WeekdayNth,
                re(format!(
                    r"\b(?:on\s+)?(?P<wd>{WEEKDAYS}),?\s+(?:the\s+)?(?P<d>\d{{1,2}})(?:st|nd|rd|th)\b"
                )),
            ),
            (
                Kind::Weekday,
                re(format!(r"\b(?:on\s+)?(?P<wd>{WEEKDAYS})\b")),
            ),
            (
                Kind::Month,
                re(format!(
                    r"\b(?P<rel>in|last|next|this|since|until|by|early|late|mid)[\s-]+(?P<month>{MONTHS})\b(?:\s+(?P<y>\d{{4}})\b)?"
                )),
            ),
            (
                Kind::Year,
                re(r"\b(?P<rel>in|since|until|by|back in)\s+(?P<y>(?:19|20)\d{2})\b".into()),
            ),
        ];
        DateResolver {
            patterns,
            past: Regex::new(
                r"(?i)\b(?:was|were|went|did|had|got|ago|last|yesterday|came|saw|met|took|made|bought|ran|left|broke|fell|lost|won|sold|drove|flew|ate|wrote|found|felt|began|gave|hurt|sent|spent|paid|told|said|caught|brought|thought|knew|swam|rode|forgot|threw|wore|chose|sang|slept)\b|\b\w{3,}ed\b",
            )
            .expect("static regex"),
            preposition: Regex::new(r"(?i)\b(?:on|by|until|till|before|after|since|from|for|at|around|in)\s*$")
                .expect("static regex"),
        }
    }

    /// Every date expression in `text`, left to right, resolved against `base`.
    pub fn resolve(&self, text: &str, base: NaiveDate) -> Vec<ResolvedDate> {
        let past = self.past.is_match(text);
        let mut found: Vec<ResolvedDate> = Vec::new();
        for (kind, re) in &self.patterns {
            for caps in re.captures_iter(text) {
                let m = caps.get(0).expect("group 0");
                if found.iter().any(|f| m.start() < f.end && f.start < m.end()) {
                    continue;
                }
                let Some((date, granularity, lead)) = self.meaning(*kind, &caps, base, past) else {
                    continue;
                };
                // "by next Friday" keeps its preposition; "Today is …" needs none.
                let opens_clause = m.start() == 0
                    && [" is ", " was ", " will be "]
                        .iter()
                        .any(|v| text[m.end()..].to_lowercase().starts_with(v));
                let lead = if opens_clause
                    || (self.preposition.is_match(&text[..m.start()])
                        && !lead.is_empty()
                        && lead != "in")
                {
                    ""
                } else {
                    lead
                };
                found.push(ResolvedDate {
                    expression: m.as_str().to_string(),
                    date,
                    granularity,
                    start: m.start(),
                    end: m.end(),
                    lead,
                });
            }
        }
        found.sort_by_key(|f| f.start);
        found
    }

    fn meaning(
        &self,
        kind: Kind,
        caps: &regex::Captures,
        base: NaiveDate,
        past: bool,
    ) -> Option<(String, Granularity, &'static str)> {
        let get = |name: &str| caps.name(name).map(|m| m.as_str());
        let explicit_year = get("y").and_then(|y| y.parse::<i32>().ok());
        match kind {
            Kind::Iso => {
                let d = NaiveDate::from_ymd_opt(
                    explicit_year?,
                    get("m")?.parse().ok()?,
                    get("d")?.parse().ok()?,
                )?;
                let (s, g) = day(d);
                Some((s, g, ""))
            }
            Kind::MonthDay | Kind::DayMonth => {
                let m = month_number(get("month")?)?;
                let d: u32 = get("d")?.parse().ok()?;
                let date = match explicit_year {
                    Some(y) => NaiveDate::from_ymd_opt(y, m, d)?,
                    None => closest(
                        base,
                        (base.year() - 1..=base.year() + 1)
                            .filter_map(|y| NaiveDate::from_ymd_opt(y, m, d)),
                    )?,
                };
                let (s, g) = day(date);
                Some((s, g, ""))
            }
            Kind::Named => {
                let named = get("named")?.to_lowercase();
                let offset = if named.starts_with("the day before") {
                    -2
                } else if named.starts_with("the day after") {
                    2
                } else if named == "yesterday" {
                    -1
                } else if named == "tomorrow" {
                    1
                } else {
                    0
                };
                let (s, g) = day(shift(base, offset)?);
                Some((s, g, "on"))
            }
            Kind::InOffset | Kind::Ago => {
                let n = number(get("n")?)?;
                let n = if matches!(kind, Kind::Ago) { -n } else { n };
                let unit = get("unit")?.to_lowercase();
                if unit.starts_with("day") {
                    let (s, g) = day(shift(base, n)?);
                    Some((s, g, "on"))
                } else if unit.starts_with("week") {
                    let (s, g) = day(shift(base, n.checked_mul(7)?)?);
                    Some((s, g, "around"))
                } else if unit.starts_with("month") {
                    let (s, g) = month(add_months(base, n)?);
                    Some((s, g, "in"))
                } else {
                    let (s, g) = year(base.year().checked_add(i32::try_from(n).ok()?)?);
                    Some((s, g, "in"))
                }
            }
            Kind::RelUnit => {
                let rel = get("rel")?.to_lowercase();
                let step: i64 = match rel.as_str() {
                    "last" => -1,
                    "next" => 1,
                    _ => 0,
                };
                match get("unit")?.to_lowercase().as_str() {
                    "week" => {
                        let (s, g) = day(shift(base, 7 * step)?);
                        Some((s, g, "around"))
                    }
                    "weekend" => {
                        let saturday = shift(monday_of(base)?, 5 + 7 * step)?;
                        let (s, g) = day(saturday);
                        Some((s, g, "on the weekend of"))
                    }
                    "month" => {
                        let (s, g) = month(add_months(base, step)?);
                        Some((s, g, "in"))
                    }
                    _ => {
                        let (s, g) = year(base.year().checked_add(step as i32)?);
                        Some((s, g, "in"))
                    }
                }
            }
            Kind::RelWeekday => {
                let wd = weekday(get("wd")?)?;
                let offset = wd.num_days_from_monday() as i64;
                let date = match get("rel")?.to_lowercase().as_str() {
                    "last" => last_before(base, wd)?,
                    "next" => shift(monday_of(base)?, 7 + offset)?,
                    "this" => shift(monday_of(base)?, offset)?,
                    _ => next_after(base, wd)?,
                };
                let (s, g) = day(date);
                Some((s, g, "on"))
            }
            Kind::WeekdayNth => {
                // "Saturday the 4th": the day of that number nearest the
                // conversation that falls on that weekday (else just nearest).
                let wd = weekday(get("wd")?)?;
                let d: u32 = get("d")?.parse().ok()?;
                let this = base.with_day(1)?;
                let candidates: Vec<NaiveDate> = [-1i64, 0, 1]
                    .iter()
                    .filter_map(|k| add_months(this, *k)?.with_day(d))
                    .collect();
                let on_weekday = candidates.iter().copied().filter(|c| c.weekday() == wd);
                let date = closest(base, on_weekday).or_else(|| closest(base, candidates))?;
                let (s, g) = day(date);
                Some((s, g, "on"))
            }
            Kind::Weekday => {
                let wd = weekday(get("wd")?)?;
                let date = if past {
                    last_before(base, wd)?
                } else {
                    next_after(base, wd)?
                };
                let (s, g) = day(date);
                Some((s, g, "on"))
            }
            Kind::Month => {
                let rel = get("rel")?.to_lowercase();
                let m = month_number(get("month")?)?;
                let first = |y: i32| NaiveDate::from_ymd_opt(y, m, 1);
                let date = match (explicit_year, rel.as_str()) {
                    (Some(y), _) => first(y)?,
                    (None, "last") => [first(base.year()), first(base.year() - 1)]
                        .into_iter()
                        .flatten()
                        .find(|d| *d < base.with_day(1).unwrap_or(base))?,
                    (None, "next") => (0..=1)
                        .filter_map(|k| first(base.year() + k))
                        .find(|d| *d > base)?,
                    (None, _) => closest(
                        base,
                        (base.year() - 1..=base.year() + 1).filter_map(|y| {
                            // The month's middle decides which year is closest.
                            NaiveDate::from_ymd_opt(y, m, 15)
                        }),
                    )?
                    .with_day(1)?,
                };
                let lead = if rel == "in" { "in" } else { "" };
                let (s, g) = month(date);
                Some((s, g, lead))
            }
            Kind::Year => {
                let rel = get("rel")?.to_lowercase();
                let (s, g) = year(explicit_year?);
                Some((s, g, if rel == "in" { "in" } else { "" }))
            }
        }
    }

    /// `text` with every resolved expression replaced by its absolute date.
    pub fn rewrite(text: &str, dates: &[ResolvedDate]) -> String {
        let mut out = String::with_capacity(text.len() + 16);
        let mut at = 0;
        for d in dates {
            out.push_str(&text[at..d.start]);
            let kept_preposition = match d.granularity {
                // "since March", "by May": keep the preposition of month/year forms.
                Granularity::Month | Granularity::Year if d.lead.is_empty() => {
                    let first = d.expression.split_whitespace().next().unwrap_or("");
                    let first = first.to_lowercase();
                    [
                        "since", "until", "by", "early", "late", "mid", "back", "last", "next",
                        "this",
                    ]
                    .iter()
                    .find(|p| first.starts_with(*p))
                    .map(|p| match *p {
                        "last" | "next" | "this" => "in",
                        "back" => "back in",
                        other => other,
                    })
                }
                _ => None,
            };
            match (kept_preposition, d.lead) {
                (Some(p), _) => out.push_str(&format!("{p} {}", d.date)),
                (None, "") => out.push_str(&d.date),
                (None, lead) => out.push_str(&format!("{lead} {}", d.date)),
            }
            at = d.end;
        }
        out.push_str(&text[at..]);
        out
    }
}

fn last_before(base: NaiveDate, wd: Weekday) -> Option<NaiveDate> {
    let back = (base.weekday().num_days_from_monday() as i64 - wd.num_days_from_monday() as i64)
        .rem_euclid(7);
    shift(base, -(if back == 0 { 7 } else { back }))
}

fn next_after(base: NaiveDate, wd: Weekday) -> Option<NaiveDate> {
    let ahead = (wd.num_days_from_monday() as i64 - base.weekday().num_days_from_monday() as i64)
        .rem_euclid(7);
    shift(base, if ahead == 0 { 7 } else { ahead })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str, base: &str) -> Vec<String> {
        let base = NaiveDate::parse_from_str(base, "%Y-%m-%d").unwrap();
        DateResolver::new()
            .resolve(text, base)
            .into_iter()
            .map(|d| d.date)
            .collect()
    }

    #[test]
    fn dates_at_the_ends_of_the_calendar_resolve_to_nothing_instead_of_panicking() {
        let r = DateResolver::new();
        for base in [NaiveDate::MAX, NaiveDate::MIN] {
            for text in [
                "I moved here in 99999999999 days",
                "it was 99999999999 weeks ago",
                "see you next week",
                "last weekend was fun",
                "next Monday we start",
                "on Friday I left",
                "tomorrow is the day",
                "in 5 years",
            ] {
                // Whatever it resolves, it must not panic.
                let _ = r.resolve(text, base);
            }
        }
        let huge = r.resolve(
            "in 99999999999 days",
            NaiveDate::from_ymd_opt(2026, 4, 2).unwrap(),
        );
        assert!(huge.is_empty(), "{huge:?}");
    }

    #[test]
    fn relative_days_and_weeks() {
        // 2026-04-02 is a Thursday.
        let b = "2026-04-02";
        assert_eq!(resolve("I switched last week", b), ["2026-03-26"]);
        assert_eq!(resolve("see you tomorrow", b), ["2026-04-03"]);
        assert_eq!(resolve("it was yesterday", b), ["2026-04-01"]);
        assert_eq!(resolve("the day after tomorrow", b), ["2026-04-04"]);
        assert_eq!(resolve("in two days", b), ["2026-04-04"]);
        assert_eq!(resolve("in 3 weeks", b), ["2026-04-23"]);
        assert_eq!(resolve("two weeks ago", b), ["2026-03-19"]);
        assert_eq!(resolve("in a couple of days", b), ["2026-04-04"]);
        // "in" belongs to the verb here, and the span is in the past.
        assert_eq!(
            resolve("the wedding I took part in a week ago", b),
            ["2026-03-26"]
        );
        assert_eq!(resolve("I ran in 10 days ago", b), ["2026-03-23"]);
    }

    #[test]
    fn weekdays() {
        let b = "2026-04-02"; // Thursday
        assert_eq!(resolve("next Friday", b), ["2026-04-10"]);
        assert_eq!(resolve("this Friday", b), ["2026-04-03"]);
        assert_eq!(resolve("last Friday", b), ["2026-03-27"]);
        assert_eq!(resolve("last Thursday", b), ["2026-03-26"]);
        assert_eq!(resolve("I'll call her on Monday", b), ["2026-04-06"]);
        assert_eq!(resolve("I called her on Monday", b), ["2026-03-30"]);
        assert_eq!(resolve("this weekend", b), ["2026-04-04"]);
        assert_eq!(resolve("on Saturday the 4th", "2026-03-28"), ["2026-04-04"]);
        assert_eq!(
            resolve("I broke my wrist on Tuesday", "2026-08-14"),
            ["2026-08-11"]
        );
        assert_eq!(resolve("last weekend", b), ["2026-03-28"]);
    }

    #[test]
    fn months_and_years() {
        let b = "2026-04-02";
        assert_eq!(resolve("the deadline is April 15th", b), ["2026-04-15"]);
        assert_eq!(resolve("on the 3rd of May", b), ["2026-05-03"]);
        assert_eq!(resolve("Dec 20", b), ["2025-12-20"]);
        assert_eq!(resolve("January 10, 2027", b), ["2027-01-10"]);
        assert_eq!(resolve("last month", b), ["2026-03"]);
        assert_eq!(resolve("in two months", b), ["2026-06"]);
        assert_eq!(resolve("last year", b), ["2025"]);
        assert_eq!(resolve("in May", b), ["2026-05"]);
        assert_eq!(resolve("we met in 2019", b), ["2019"]);
        assert_eq!(resolve("2026-05-01", b), ["2026-05-01"]);
        // A December conversation about "January" means the coming one.
        assert_eq!(resolve("in January", "2026-12-10"), ["2027-01"]);
        // "may" the modal verb is not a month.
        assert!(resolve("I may go", b).is_empty());
    }

    #[test]
    fn expressions_are_rewritten_in_place() {
        let r = DateResolver::new();
        let base = NaiveDate::from_ymd_opt(2026, 4, 2).unwrap();
        let t = "I switched to Cursor last week and the deadline is April 15th";
        assert_eq!(
            DateResolver::rewrite(t, &r.resolve(t, base)),
            "I switched to Cursor around 2026-03-26 and the deadline is 2026-04-15"
        );
        let t = "I'm flying to Rome next Friday, back by Sunday";
        assert_eq!(
            DateResolver::rewrite(t, &r.resolve(t, base)),
            "I'm flying to Rome on 2026-04-10, back by 2026-04-05"
        );
        let t = "We moved here last year";
        assert_eq!(
            DateResolver::rewrite(t, &r.resolve(t, base)),
            "We moved here in 2025"
        );
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    const PHRASES: &[&str] = &[
        "tomorrow",
        "yesterday",
        "the day after tomorrow",
        "next week",
        "last week",
        "last weekend",
        "next month",
        "last month",
        "last year",
        "next year",
        "next Friday",
        "this Friday",
        "on Monday",
        "in {n} days",
        "in {n} weeks",
        "in {n} months",
        "in {n} years",
        "{n} days ago",
        "{n} weeks ago",
        "{n} months ago",
        "{n} years ago",
        "back in March",
        "early May",
        "late December",
        "mid June",
        "on March {n}",
        "by {n}/12",
    ];

    proptest! {
        /// Relative and partial dates from any base day of chrono's calendar,
        /// the first and the last included, resolve or are skipped: never a
        /// panic or an overflow.
        #[test]
        fn relative_dates_from_any_base_day(
            day in prop_oneof![
                Just(NaiveDate::MIN.num_days_from_ce()),
                Just(NaiveDate::MAX.num_days_from_ce()),
                NaiveDate::MIN.num_days_from_ce()..=NaiveDate::MAX.num_days_from_ce(),
            ],
            phrase in proptest::sample::select(PHRASES),
            n in prop_oneof![Just(0u64), Just(1), Just(31), Just(u64::MAX), any::<u64>()],
        ) {
            let base = NaiveDate::from_num_days_from_ce_opt(day).unwrap();
            let text = format!("We met {}.", phrase.replace("{n}", &n.to_string()));
            let _ = DateResolver::new().resolve(&text, base);
        }
    }
}
