//! What a query says besides what it is about. "What kitchen appliance did I
//! buy 10 days ago?" names a day, which the time factor weighs (see
//! [`super::rank::time_factor`]); matched as words, "10 days ago" finds every
//! memory that says "a few days ago", and "how many", "did I", "my" find every
//! memory that asks or says anything in the first person. So each leg gets the
//! words that find what the query is about:
//!
//! - the dates the query names leave both legs' text while the time factor
//!   is on (their windows weigh them instead);
//! - with `search.strip_question_words` (the default), the BM25 leg also loses
//!   the words that only make the query a question, the spans of time it
//!   reaches back over ("in the past three months", "before today") and the
//!   words that ask how long ago or in which order ("how many days passed
//!   between the day I … and …", "the three trips … from earliest to
//!   latest"). The vector leg keeps them: the model reads a whole question as
//!   a question.
//!
//! A query that is nothing but such words keeps them all.

use std::sync::OnceLock;

use regex::Regex;

use crate::core::model::Micros;
use crate::service::search::config::SearchConfig;

/// A span of time a query names, `from..to`; `day` when the query names a
/// single day ("last Saturday", "ten days ago"), not a month or a year.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeWindow {
    pub from: Micros,
    pub to: Micros,
    pub day: bool,
}

/// A query read for the legs.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    /// The spans of time it names (empty while the time factor is off).
    pub windows: Vec<TimeWindow>,
    /// What the BM25 leg searches for.
    pub words: String,
    /// What the vector leg embeds.
    pub meaning: String,
}

/// Read `query` as of `now` for the legs (see the module doc).
pub fn read(query: &str, now: Micros, cfg: &SearchConfig) -> Question {
    let (windows, undated) = if cfg.time_weight > 0.0 || cfg.time_weight_day > 0.0 {
        dates(query, now)
    } else {
        (Vec::new(), None)
    };
    let meaning = undated.unwrap_or_else(|| query.to_string());
    let words = if cfg.strip_question_words {
        let unspanned = without_spans(&meaning);
        let base = unspanned.as_deref().unwrap_or(&meaning);
        without_question_words(base).unwrap_or_else(|| base.to_string())
    } else {
        meaning.clone()
    };
    Question {
        windows,
        words,
        meaning,
    }
}

/// The spans of time a query names, resolved against `now` as the
/// conversation extractor resolves them ("last Saturday", "two weeks ago",
/// "in March", "2023"): a day with a day either side (a conversation's date
/// and the day it speaks of drift by one), a month, a year; and the query
/// without the words that named them (`None` when it names no date, or is
/// nothing but dates).
fn dates(query: &str, now: Micros) -> (Vec<TimeWindow>, Option<String>) {
    use crate::service::facts::{DateResolver, Granularity};
    use chrono::{Duration, Months, NaiveDate};
    static RESOLVER: OnceLock<DateResolver> = OnceLock::new();
    let Some(base) = chrono::DateTime::from_timestamp_micros(now).map(|t| t.date_naive()) else {
        return (Vec::new(), None);
    };
    let at = |d: NaiveDate| {
        d.and_hms_opt(0, 0, 0)
            .map(|t| t.and_utc().timestamp_micros())
    };
    let resolved = RESOLVER.get_or_init(DateResolver::new).resolve(query, base);
    let windows = resolved
        .iter()
        .filter_map(|d| {
            let (from, to) = match d.granularity {
                Granularity::Day => {
                    let day = NaiveDate::parse_from_str(&d.date, "%Y-%m-%d").ok()?;
                    (day - Duration::days(1), day + Duration::days(2))
                }
                Granularity::Month => {
                    let first =
                        NaiveDate::parse_from_str(&format!("{}-01", d.date), "%Y-%m-%d").ok()?;
                    (first, first.checked_add_months(Months::new(1))?)
                }
                Granularity::Year => {
                    let year: i32 = d.date.parse().ok()?;
                    (
                        NaiveDate::from_ymd_opt(year, 1, 1)?,
                        NaiveDate::from_ymd_opt(year + 1, 1, 1)?,
                    )
                }
            };
            Some(TimeWindow {
                from: at(from)?,
                to: at(to)?,
                day: d.granularity == Granularity::Day,
            })
        })
        .collect();
    // The resolver's spans come sorted and do not overlap.
    let mut rest = String::with_capacity(query.len());
    let mut from = 0;
    for d in &resolved {
        rest.push_str(&query[from..d.start]);
        rest.push(' ');
        from = d.end;
    }
    rest.push_str(&query[from..]);
    let undated = (!resolved.is_empty())
        .then(|| tidy(&rest))
        .filter(|t| has_words(t));
    (windows, undated)
}

/// The query without the spans of time it reaches back over ("in the past
/// three months", "over the last few weeks", "before today", "so far") and
/// the phrases that ask how long ("how many days …", "how long …", "the day
/// I … and the day I …"): not a day or a month to weigh, and words every
/// dated memory may hold.
fn without_spans(query: &str) -> Option<String> {
    static SPANS: OnceLock<Regex> = OnceLock::new();
    let re = SPANS.get_or_init(|| {
        Regex::new(
            r"(?i)\b(?:(?:in|during|over|within|for)\s+)?the\s+(?:past|last|previous)\s+(?:(?:\d{1,3}|few|couple\s+of|several|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\s+)?(?:days?|weeks?|months?|years?)\b|\bbefore\s+today\b|\bso\s+far\b|\bhow\s+many\s+(?:days|weeks|months|years)\b|\bhow\s+long\b|\bthe\s+(?:day|time|date)\s+(?:when\s+|that\s+)?I\b",
        )
        .expect("the span pattern compiles")
    });
    let out = tidy(&re.replace_all(query, " "));
    (has_words(&out) && out != query).then_some(out)
}

/// Words that make a query a question, or say who asks, and little else:
/// interrogatives, auxiliaries, the asker's pronouns, "remind me", words
/// that ask for a count or a list ("how many different …", "in total"), for
/// a length of time or an order ("how many days passed between …", "from
/// earliest to latest"), and the count a question gives its answers ("the
/// three trips I took", "one of my relatives").
const QUESTION_WORDS: &[&str] = &[
    "how",
    "many",
    "much",
    "what",
    "which",
    "who",
    "whom",
    "whose",
    "when",
    "where",
    "why",
    "do",
    "does",
    "did",
    "have",
    "has",
    "had",
    "am",
    "is",
    "are",
    "was",
    "were",
    "can",
    "could",
    "would",
    "should",
    "i",
    "me",
    "my",
    "mine",
    "myself",
    "you",
    "your",
    "i've",
    "i'm",
    "i'd",
    "i'll",
    "remind",
    "remember",
    "tell",
    "different",
    "total",
    "currently",
    "ever",
    "recently",
    "times",
    "ago",
    "passed",
    "since",
    "between",
    "before",
    "after",
    "order",
    "earliest",
    "latest",
    "both",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
];

/// The query without [`QUESTION_WORDS`] (`None` when it holds none, or
/// nothing else).
fn without_question_words(query: &str) -> Option<String> {
    let words: Vec<&str> = query.split_whitespace().collect();
    let keep: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| {
            let bare = w
                .trim_matches(|c: char| !c.is_alphanumeric() && c != '\'' && c != '’')
                .to_lowercase()
                .replace('’', "'");
            !QUESTION_WORDS.contains(&bare.as_str())
        })
        .collect();
    (keep.len() < words.len() && keep.iter().any(|w| has_words(w))).then(|| keep.join(" "))
}

fn tidy(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn has_words(text: &str) -> bool {
    text.chars().any(char::is_alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(y: i32, m: u32, d: u32) -> Micros {
        chrono::Utc
            .with_ymd_and_hms(y, m, d, 12, 0, 0)
            .unwrap()
            .timestamp_micros()
    }

    fn cfg() -> SearchConfig {
        crate::service::search::config::shipped()
    }

    #[test]
    fn a_named_day_leaves_both_legs_and_becomes_a_window() {
        let q = read(
            "What kitchen appliance did I buy 10 days ago?",
            at(2023, 3, 25),
            &cfg(),
        );
        assert_eq!(q.meaning, "What kitchen appliance did I buy ?");
        assert_eq!(q.words, "kitchen appliance buy ?");
        assert_eq!(q.windows.len(), 1);
        assert!(q.windows[0].day);
        assert!((q.windows[0].from..q.windows[0].to).contains(&at(2023, 3, 15)));
        assert!(!(q.windows[0].from..q.windows[0].to).contains(&at(2023, 3, 20)));
    }

    #[test]
    fn dates_stay_while_the_time_factor_is_off() {
        let mut c = cfg();
        c.time_weight = 0.0;
        c.time_weight_day = 0.0;
        let q = read("Which book did I finish a week ago?", at(2023, 2, 7), &c);
        assert!(q.windows.is_empty());
        assert_eq!(q.meaning, "Which book did I finish a week ago?");
        assert_eq!(q.words, "book finish a week", "\"ago?\" asks how long");
    }

    #[test]
    fn spans_and_question_words_leave_only_the_bm25_leg() {
        let q = read(
            "How many graduation ceremonies have I attended in the past three months?",
            at(2023, 5, 30),
            &cfg(),
        );
        assert!(q.windows.is_empty(), "a span reaching back is no window");
        assert_eq!(
            q.meaning,
            "How many graduation ceremonies have I attended in the past three months?"
        );
        assert_eq!(q.words, "graduation ceremonies attended ?");
        let q = read(
            "Which airlines have I flown with so far? I’ve forgotten.",
            at(2023, 5, 30),
            &cfg(),
        );
        assert_eq!(
            q.meaning,
            "Which airlines have I flown with so far? I’ve forgotten."
        );
        assert_eq!(q.words, "airlines flown with ? forgotten.");
    }

    #[test]
    fn words_that_ask_how_long_or_in_which_order_leave_the_bm25_leg() {
        let read = |q: &str| read(q, at(2023, 5, 30), &cfg());
        let cases = [
            (
                "How many days passed between the day I repotted the spider plant and the day I gave Mrs. Johnson a cutting?",
                "repotted the spider plant and gave Mrs. Johnson a cutting?",
            ),
            (
                "What is the order of the three trips I took in the past three months, from earliest to latest?",
                "the of the trips took , from to",
            ),
            (
                "How many months before my anniversary did Rachel get engaged?",
                "anniversary Rachel get engaged?",
            ),
            ("How many days ago did I buy a smoker?", "buy a smoker?"),
            (
                "How long have I been working in my current role?",
                "been working in current role?",
            ),
            (
                "Which one of my relatives got married?",
                "of relatives got married?",
            ),
        ];
        for (query, words) in cases {
            let q = read(query);
            assert_eq!(q.words, words, "{query}");
            assert_eq!(q.meaning, query, "the vector leg reads the whole question");
        }
    }

    #[test]
    fn a_query_of_nothing_but_such_words_keeps_them() {
        let q = read("What did I do yesterday?", at(2023, 5, 30), &cfg());
        assert_eq!(q.meaning, "What did I do ?");
        assert_eq!(
            q.words, "What did I do ?",
            "nothing but question words left"
        );
        let q = read("yesterday", at(2023, 5, 30), &cfg());
        assert_eq!(q.meaning, "yesterday");
        assert_eq!(q.windows.len(), 1);
        let q = read("How many?", at(2023, 5, 30), &cfg());
        assert_eq!(q.words, "How many?");
        let q = read("in the past week", at(2023, 5, 30), &cfg());
        assert_eq!(q.words, "in the past week");
    }

    #[test]
    fn the_switch_keeps_every_word_for_bm25() {
        let mut c = cfg();
        c.strip_question_words = false;
        let q = read("How many projects have I led so far?", at(2023, 5, 30), &c);
        assert_eq!(q.words, "How many projects have I led so far?");
        assert_eq!(q.words, q.meaning);
    }
}
