//! `redact_pii`: replaces e-mail addresses, payment card numbers (Luhn-checked),
//! PESEL numbers (checksum-checked), phone numbers and blocklisted words with
//! typed placeholders (`[EMAIL]`, `[CARD]`, `[PESEL]`, `[PHONE]`, `[REDACTED]`).
//!
//! Digits are read as runs joined by single separators, and each whole run is
//! classified, so a sub-span of a long number is never mistaken for a phone.
//! A phone needs a leading `+` or separators between digit groups: a bare run of
//! digits is an identifier of unknown kind and stays.

use std::collections::BTreeMap;

use regex::Regex;
use serde::Deserialize;

use super::parse_params;
use crate::pipeline::{BuildContext, PipelineError, Record, RecordStage, Stage};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactPiiConfig {
    #[serde(default = "yes")]
    pub emails: bool,
    #[serde(default = "yes")]
    pub phones: bool,
    #[serde(default = "yes")]
    pub pesel: bool,
    #[serde(default = "yes")]
    pub cards: bool,
    /// Words or phrases replaced by `[REDACTED]` (whole words, case-insensitive).
    #[serde(default)]
    pub blocklist: Vec<String>,
}

fn yes() -> bool {
    true
}

impl RedactPiiConfig {
    pub fn build(self) -> Result<RedactPii, PipelineError> {
        let blocklist = if self.blocklist.iter().any(|w| !w.trim().is_empty()) {
            let alternatives: Vec<String> = self
                .blocklist
                .iter()
                .filter(|w| !w.trim().is_empty())
                .map(|w| regex::escape(w.trim()))
                .collect();
            Some(
                Regex::new(&format!(r"(?i)\b(?:{})\b", alternatives.join("|"))).map_err(|e| {
                    PipelineError::Config {
                        stage: "redact_pii".into(),
                        message: format!("blocklist: {e}"),
                    }
                })?,
            )
        } else {
            None
        };
        Ok(RedactPii {
            cfg: self,
            email: Regex::new(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
                .expect("static regex"),
            digits: Regex::new(r"[+(]?\d(?:(?:[ .\-]|\) ?|[ .\-]?\()?\d)*").expect("static regex"),
            blocklist,
        })
    }
}

pub fn build(params: toml::Table, _ctx: &BuildContext) -> Result<Box<dyn Stage>, PipelineError> {
    let cfg: RedactPiiConfig = parse_params("redact_pii", params)?;
    Ok(Box::new(cfg.build()?))
}

pub struct RedactPii {
    cfg: RedactPiiConfig,
    email: Regex,
    digits: Regex,
    blocklist: Option<Regex>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PiiKind {
    Email,
    Card,
    Pesel,
    Phone,
    Blocklist,
}

impl PiiKind {
    fn placeholder(self) -> &'static str {
        match self {
            PiiKind::Email => "[EMAIL]",
            PiiKind::Card => "[CARD]",
            PiiKind::Pesel => "[PESEL]",
            PiiKind::Phone => "[PHONE]",
            PiiKind::Blocklist => "[REDACTED]",
        }
    }

    fn key(self) -> &'static str {
        match self {
            PiiKind::Email => "email",
            PiiKind::Card => "card",
            PiiKind::Pesel => "pesel",
            PiiKind::Phone => "phone",
            PiiKind::Blocklist => "blocklist",
        }
    }
}

impl RedactPii {
    /// The redacted text and how many of each kind were replaced.
    pub fn redact(&self, text: &str) -> (String, BTreeMap<&'static str, usize>) {
        let mut counts = BTreeMap::new();
        let mut out = text.to_string();
        if self.cfg.emails {
            out = replace(&self.email, &out, &mut counts, |_| Some(PiiKind::Email));
        }
        out = replace(&self.digits, &out, &mut counts, |run| {
            self.classify_digits(run)
        });
        if let Some(block) = &self.blocklist {
            out = replace(block, &out, &mut counts, |_| Some(PiiKind::Blocklist));
        }
        (out, counts)
    }

    /// What a run of digits and separators is, if it is PII.
    fn classify_digits(&self, run: &str) -> Option<PiiKind> {
        let digits: Vec<u8> = run
            .bytes()
            .filter(u8::is_ascii_digit)
            .map(|b| b - b'0')
            .collect();
        let n = digits.len();
        let separated = run.bytes().any(|b| !b.is_ascii_digit());
        if self.cfg.cards && (13..=19).contains(&n) && !run.starts_with('+') && luhn_valid(&digits)
        {
            return Some(PiiKind::Card);
        }
        if self.cfg.pesel && n == 11 && !separated && pesel_valid(&digits) {
            return Some(PiiKind::Pesel);
        }
        let plus = run.starts_with('+');
        if self.cfg.phones && (9..=15).contains(&n) && (plus || separated) && !looks_like_ipv4(run)
        {
            return Some(PiiKind::Phone);
        }
        None
    }
}

fn replace(
    re: &Regex,
    text: &str,
    counts: &mut BTreeMap<&'static str, usize>,
    classify: impl Fn(&str) -> Option<PiiKind>,
) -> String {
    re.replace_all(text, |caps: &regex::Captures| {
        let m = &caps[0];
        match classify(m) {
            Some(kind) => {
                *counts.entry(kind.key()).or_default() += 1;
                kind.placeholder().to_string()
            }
            None => m.to_string(),
        }
    })
    .into_owned()
}

/// The Luhn checksum used by payment card numbers.
pub fn luhn_valid(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            let d = u32::from(*d);
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 {
                    x - 9
                } else {
                    x
                }
            } else {
                d
            }
        })
        .sum();
    !digits.is_empty() && sum.is_multiple_of(10)
}

/// The PESEL checksum: weights 1,3,7,9 repeating over the first ten digits, and a
/// birth date that exists (month encodes the century).
pub fn pesel_valid(d: &[u8]) -> bool {
    if d.len() != 11 {
        return false;
    }
    const W: [u32; 10] = [1, 3, 7, 9, 1, 3, 7, 9, 1, 3];
    let sum: u32 = d.iter().zip(W).map(|(d, w)| u32::from(*d) * w).sum();
    if (10 - sum % 10) % 10 != u32::from(d[10]) {
        return false;
    }
    let month = u32::from(d[2]) * 10 + u32::from(d[3]);
    let day = u32::from(d[4]) * 10 + u32::from(d[5]);
    (1..=12).contains(&(month % 20)) && (1..=31).contains(&day)
}

fn looks_like_ipv4(run: &str) -> bool {
    let parts: Vec<&str> = run.split('.').collect();
    parts.len() == 4
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()))
}

impl RecordStage for RedactPii {
    fn name(&self) -> &'static str {
        "redact_pii"
    }

    fn apply(&self, record: &mut Record) {
        let (redacted, counts) = self.redact(&record.chunk.content);
        if !counts.is_empty() {
            record.chunk.set_content(redacted);
            record
                .chunk
                .annotate("redactions", serde_json::json!(counts));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(blocklist: &[&str]) -> RedactPii {
        RedactPiiConfig {
            emails: true,
            phones: true,
            pesel: true,
            cards: true,
            blocklist: blocklist.iter().map(|s| s.to_string()).collect(),
        }
        .build()
        .unwrap()
    }

    #[test]
    fn redaction_table() {
        let s = stage(&["Project Nightingale", "hunter2"]);
        let cases: &[(&str, &str)] = &[
            // e-mail
            (
                "mail me at jan.kowalski+x@example.co.uk today",
                "mail me at [EMAIL] today",
            ),
            (
                "user@localhost is not an address",
                "user@localhost is not an address",
            ),
            ("an @ sign alone", "an @ sign alone"),
            // payment cards (Luhn)
            ("card 4111 1111 1111 1111 expires", "card [CARD] expires"),
            ("card 4111-1111-1111-1111", "card [CARD]"),
            ("card 5500005555555559.", "card [CARD]."),
            (
                "not a card 4111 1111 1111 1112",
                "not a card 4111 1111 1111 1112",
            ),
            // PESEL (checksum)
            ("PESEL 44051401359 on file", "PESEL [PESEL] on file"),
            ("PESEL 02070803628", "PESEL [PESEL]"),
            (
                "bad checksum 44051401358 stays",
                "bad checksum 44051401358 stays",
            ),
            ("order 12345678901 stays", "order 12345678901 stays"),
            // phones
            ("call +48 601 234 567 now", "call [PHONE] now"),
            ("call (555) 123-4567", "call [PHONE]"),
            ("call 555.123.4567", "call [PHONE]"),
            ("call +14155550123", "call [PHONE]"),
            ("on 2026-04-15 at 10:30", "on 2026-04-15 at 10:30"),
            (
                "server 192.168.100.200 is up",
                "server 192.168.100.200 is up",
            ),
            ("I have 3 cats and 12 dogs", "I have 3 cats and 12 dogs"),
            ("version 1.2.3", "version 1.2.3"),
            ("ticket 5551234567", "ticket 5551234567"),
            // blocklist
            ("the project nightingale budget", "the [REDACTED] budget"),
            ("password hunter2!", "password [REDACTED]!"),
            ("nightingales sing", "nightingales sing"),
        ];
        for (input, want) in cases {
            assert_eq!(s.redact(input).0, *want, "input: {input}");
        }
    }

    #[test]
    fn counts_each_kind() {
        let (out, counts) = stage(&[]).redact("a@b.io, c@d.io, +48 601 234 567");
        assert_eq!(out, "[EMAIL], [EMAIL], [PHONE]");
        assert_eq!(counts["email"], 2);
        assert_eq!(counts["phone"], 1);
    }

    #[test]
    fn checksums() {
        assert!(luhn_valid(&[
            4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1
        ]));
        assert!(!luhn_valid(&[
            4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2
        ]));
        assert!(pesel_valid(&[4, 4, 0, 5, 1, 4, 0, 1, 3, 5, 9]));
        assert!(!pesel_valid(&[4, 4, 0, 5, 1, 4, 0, 1, 3, 5, 8]));
        // right checksum, impossible month 13
        assert!(!pesel_valid(&[4, 4, 1, 3, 1, 4, 0, 1, 3, 5, 0]));
    }

    #[test]
    fn disabled_kinds_stay() {
        let s = RedactPiiConfig {
            emails: false,
            phones: true,
            pesel: true,
            cards: true,
            blocklist: vec![],
        }
        .build()
        .unwrap();
        assert_eq!(s.redact("x@y.com").0, "x@y.com");
    }
}
