//! The LLM-free extractor. Its behaviour lives in `pipelines/extract/facts.toml`:
//! which sentences are skipped, which rules (tried in order) make a clause a
//! fact of which type, which assistant suggestions a user confirmation turns into
//! a fact, and how first person becomes third. The code segments sentences,
//! matches, resolves dates and rewrites.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use chrono::NaiveDate;
use regex::Regex;
use serde::Deserialize;

use super::dates::DateResolver;
use super::{Fact, Role, Source, Turn};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    segment: SegmentFile,
    skip: PatternList,
    continuation: PatternList,
    rewrites: Vec<RewriteFile>,
    hedges: HedgeFile,
    person: PersonFile,
    assistant: AssistantFile,
    rules: Vec<RuleFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SegmentFile {
    abbreviations: Vec<String>,
    discourse_markers: Vec<String>,
    clause_split: String,
    compound_subject: String,
    min_words: usize,
    max_words: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatternList {
    patterns: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RewriteFile {
    pattern: String,
    replace: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HedgeFile {
    patterns: Vec<String>,
    factor: f32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PersonFile {
    adverbs: Vec<String>,
    unchanged: Vec<String>,
    third_person: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AssistantFile {
    confirm: String,
    confirm_not: String,
    suggestions: Vec<SuggestionFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SuggestionFile {
    pattern: String,
    template: String,
    #[serde(rename = "type")]
    memory_type: String,
    confidence: f32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    name: String,
    #[serde(rename = "type")]
    memory_type: String,
    confidence: f32,
    #[serde(default)]
    subject: Option<String>,
    /// A shorter clause than `segment.min_words` this rule still reads
    /// ("I'm 32").
    #[serde(default)]
    min_words: Option<usize>,
    patterns: Vec<String>,
}

struct Rule {
    name: String,
    memory_type: String,
    confidence: f32,
    subject_from_capture: bool,
    /// The fewest words of a clause this rule reads.
    min_words: usize,
    patterns: Vec<Regex>,
}

struct Suggestion {
    pattern: Regex,
    template: String,
    memory_type: String,
    confidence: f32,
}

struct Person {
    adverbs: HashSet<String>,
    unchanged: HashSet<String>,
    third_person: BTreeMap<String, String>,
    pronoun: Regex,
    second_person: Regex,
}

pub struct RuleExtractor {
    abbreviations: HashSet<String>,
    /// Longest first, so "oh and" wins over "oh".
    markers: Vec<String>,
    clause_split: Regex,
    compound_subject: Regex,
    /// The fewest words any rule reads in a clause.
    min_words: usize,
    max_words: usize,
    skip: Vec<Regex>,
    continuation: Vec<Regex>,
    rewrites: Vec<(Regex, String)>,
    hedges: Vec<Regex>,
    hedge_factor: f32,
    person: Person,
    confirm: Regex,
    confirm_not: Regex,
    suggestions: Vec<Suggestion>,
    rules: Vec<Rule>,
    dates: DateResolver,
}

fn compile(what: &str, pattern: &str) -> Result<Regex, String> {
    Regex::new(&format!("(?i){pattern}")).map_err(|e| format!("{what}: {e}"))
}

fn compile_all(what: &str, patterns: &[String]) -> Result<Vec<Regex>, String> {
    patterns
        .iter()
        .enumerate()
        .map(|(i, p)| compile(&format!("{what}[{i}]"), p))
        .collect()
}

/// Curly quotes to straight ones, so patterns need only one apostrophe.
fn normalize(text: &str) -> String {
    text.replace(['\u{2019}', '\u{2018}'], "'")
        .replace(['\u{201c}', '\u{201d}'], "\"")
}

/// Why a rules file was refused: the file (when read from one), and the key
/// or pattern at fault.
#[derive(Debug, thiserror::Error)]
#[error("{}{message}", file.as_ref().map(|f| format!("{}: ", f.display())).unwrap_or_default())]
pub struct RulesError {
    pub file: Option<std::path::PathBuf>,
    pub message: String,
}

impl RuleExtractor {
    /// Load the rules file; errors name the file and the offending key or pattern.
    pub fn load(path: &Path) -> Result<RuleExtractor, RulesError> {
        let in_file = |message: String| RulesError {
            file: Some(path.to_path_buf()),
            message,
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| in_file(format!("cannot read: {e}")))?;
        RuleExtractor::parse_text(&text).map_err(in_file)
    }

    /// Rules from the text of a rules file.
    pub fn parse(text: &str) -> Result<RuleExtractor, RulesError> {
        RuleExtractor::parse_text(text).map_err(|message| RulesError {
            file: None,
            message,
        })
    }

    fn parse_text(text: &str) -> Result<RuleExtractor, String> {
        let file: RulesFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut markers: Vec<String> = file
            .segment
            .discourse_markers
            .iter()
            .map(|m| m.to_lowercase())
            .collect();
        markers.sort_by_key(|m| std::cmp::Reverse(m.len()));
        let rules = file
            .rules
            .iter()
            .map(|r| {
                if !super::FACT_TYPES.contains(&r.memory_type.as_str()) {
                    return Err(format!(
                        "rule `{}`: type `{}` is not one of {:?}",
                        r.name,
                        r.memory_type,
                        super::FACT_TYPES
                    ));
                }
                Ok(Rule {
                    name: r.name.clone(),
                    memory_type: r.memory_type.clone(),
                    confidence: r.confidence.clamp(0.0, 1.0),
                    subject_from_capture: r.subject.as_deref() == Some("capture"),
                    min_words: r.min_words.unwrap_or(file.segment.min_words),
                    patterns: compile_all(&format!("rule `{}` pattern", r.name), &r.patterns)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let suggestions = file
            .assistant
            .suggestions
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Ok(Suggestion {
                    pattern: compile(&format!("assistant.suggestions[{i}]"), &s.pattern)?,
                    template: s.template.clone(),
                    memory_type: s.memory_type.clone(),
                    confidence: s.confidence.clamp(0.0, 1.0),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(RuleExtractor {
            abbreviations: file
                .segment
                .abbreviations
                .iter()
                .map(|a| a.to_lowercase())
                .collect(),
            markers,
            clause_split: compile("segment.clause_split", &file.segment.clause_split)?,
            compound_subject: compile("segment.compound_subject", &file.segment.compound_subject)?,
            min_words: rules
                .iter()
                .map(|r| r.min_words)
                .fold(file.segment.min_words, usize::min),
            max_words: file.segment.max_words,
            skip: compile_all("skip.patterns", &file.skip.patterns)?,
            continuation: compile_all("continuation.patterns", &file.continuation.patterns)?,
            rewrites: file
                .rewrites
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    Ok((
                        compile(&format!("rewrites[{i}]"), &r.pattern)?,
                        r.replace.clone(),
                    ))
                })
                .collect::<Result<Vec<_>, String>>()?,
            hedges: compile_all("hedges.patterns", &file.hedges.patterns)?,
            hedge_factor: file.hedges.factor.clamp(0.0, 1.0),
            person: Person {
                adverbs: file
                    .person
                    .adverbs
                    .iter()
                    .map(|a| a.to_lowercase())
                    .collect(),
                unchanged: file
                    .person
                    .unchanged
                    .iter()
                    .map(|a| a.to_lowercase())
                    .collect(),
                third_person: file
                    .person
                    .third_person
                    .into_iter()
                    .map(|(k, v)| (k.to_lowercase(), v))
                    .collect(),
                pronoun: Regex::new(r"(?i)\b(?:i'm|i've|i'll|i'd|i|me|my|mine|myself)\b")
                    .expect("static regex"),
                second_person: Regex::new(
                    r"(?i)\b(?:you're|you've|you'll|you|your|yours|yourself)\b",
                )
                .expect("static regex"),
            },
            confirm: compile("assistant.confirm", &file.assistant.confirm)?,
            confirm_not: compile("assistant.confirm_not", &file.assistant.confirm_not)?,
            suggestions,
            rules,
            dates: DateResolver::new(),
        })
    }

    /// The facts of a conversation held on `date`.
    pub fn extract(&self, turns: &[Turn], date: NaiveDate) -> Vec<Fact> {
        let mut facts = Vec::new();
        for (i, turn) in turns.iter().enumerate() {
            if turn.role != Role::User {
                continue;
            }
            let text = normalize(&turn.content);
            let sentences = self.sentences(&text);
            if let (Some(first), Some(prev)) = (sentences.first(), i.checked_sub(1)) {
                // A confirmation that says what was chosen is a fact of its own.
                let says_more = self
                    .clauses(first)
                    .iter()
                    .any(|c| self.fact(c, i, date).is_some());
                if turns[prev].role == Role::Assistant && !says_more {
                    if let Some(f) = self.confirmed_suggestion(first, &turns[prev], prev, date) {
                        facts.push(f);
                    }
                }
            }
            let turn_start = facts.len();
            for sentence in sentences {
                for clause in self.clauses(sentence) {
                    if let Some(f) = self.fact(clause, i, date) {
                        facts.push(f);
                    } else if facts.len() > turn_start {
                        let last = facts.last_mut().expect("a fact of this turn");
                        self.continue_fact(last, clause, date);
                    }
                }
            }
        }
        facts
    }

    /// Sentence spans of `text`: split after `.`, `!`, `?` (not after an
    /// abbreviation or inside a number) and at line breaks.
    fn sentences<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut out = Vec::new();
        let mut start = 0;
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        for (k, &(pos, c)) in chars.iter().enumerate() {
            let next = chars.get(k + 1).map(|&(_, n)| n);
            let boundary = match c {
                '\n' => true,
                '!' | '?' => next.is_none_or(|n| n.is_whitespace() || n == '"'),
                '.' => {
                    let raw = text[start..pos]
                        .rsplit(|ch: char| ch.is_whitespace() || ch == '(')
                        .next()
                        .unwrap_or("");
                    let word = raw.to_lowercase();
                    // Not after an abbreviation or an initial ("Ursula K. Le Guin").
                    let initial = raw.chars().count() == 1 && raw.chars().all(char::is_uppercase);
                    next.is_none_or(|n| n.is_whitespace() || n == '"' || n == ')')
                        && !self.abbreviations.contains(word.trim_start_matches('.'))
                        && !initial
                }
                _ => false,
            };
            if boundary {
                let end = pos + c.len_utf8();
                let s = text[start..end].trim();
                if !s.is_empty() {
                    out.push(s);
                }
                start = end;
            }
        }
        let s = text[start..].trim();
        if !s.is_empty() {
            out.push(s);
        }
        out
    }

    /// Remove opening discourse markers ("Also, ", "Oh and ").
    fn strip_markers<'t>(&self, mut s: &'t str) -> &'t str {
        loop {
            let rest = self.markers.iter().find_map(|m| {
                strip_prefix_lowercase(s, m).filter(|rest| {
                    rest.chars()
                        .next()
                        .is_some_and(|c| c == ',' || c.is_whitespace() || c == '-')
                })
            });
            match rest {
                Some(rest) => s = rest.trim_start_matches([',', ' ', '-', '\u{2014}']),
                None => return s,
            }
        }
    }

    /// The clauses of a sentence: split where a conjunction opens a new
    /// first-person clause.
    fn clauses<'t>(&self, sentence: &'t str) -> Vec<&'t str> {
        let mut out = Vec::new();
        let mut start = 0;
        for caps in self.clause_split.captures_iter(sentence) {
            let whole = caps.get(0).expect("group 0");
            let Some(resume) = caps.iter().skip(1).flatten().next() else {
                continue;
            };
            if self.compound_subject.is_match(&sentence[resume.start()..]) {
                continue;
            }
            out.push(&sentence[start..whole.start()]);
            start = resume.start();
        }
        out.push(&sentence[start..]);
        out.into_iter()
            .map(|c| c.trim().trim_end_matches([',', ';']))
            .filter(|c| !c.is_empty())
            .collect()
    }

    /// Whether no rule reads `clause` (of `words` words); a clause shorter
    /// than `segment.min_words` is read only by rules that allow it.
    fn skipped(&self, clause: &str, words: usize) -> bool {
        words < self.min_words
            || words > self.max_words
            || clause.trim_end().ends_with('?')
            || self.skip.iter().any(|p| p.is_match(clause))
    }

    fn hedged(&self, clause: &str) -> bool {
        self.hedges.iter().any(|h| h.is_match(clause))
    }

    fn fact(&self, clause: &str, turn: usize, date: NaiveDate) -> Option<Fact> {
        let clause = self.strip_markers(clause);
        let words = clause.split_whitespace().count();
        if self.skipped(clause, words) {
            return None;
        }
        let (rule, caps) = self
            .rules
            .iter()
            .filter(|r| words >= r.min_words)
            .find_map(|r| {
                r.patterns
                    .iter()
                    .find_map(|p| p.captures(clause))
                    .map(|c| (r, c))
            })?;
        let subject = if rule.subject_from_capture {
            caps.name("subject").map(|m| m.as_str().to_string())
        } else {
            None
        }
        .unwrap_or_else(|| "user".into());
        let mut confidence = rule.confidence;
        if self.hedged(clause) {
            confidence *= self.hedge_factor;
        }
        let dates = self.dates.resolve(clause, date);
        let content = finish(
            &self
                .person
                .third(&self.rewrite(&DateResolver::rewrite(clause, &dates))),
        );
        Some(Fact {
            content,
            memory_type: rule.memory_type.clone(),
            subject,
            confidence,
            dates,
            source: Source {
                turn,
                role: Role::User,
                text: clause.to_string(),
            },
            rule: rule.name.clone(),
        })
    }

    /// The configured phrase rewrites, in order.
    fn rewrite(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (pattern, replace) in &self.rewrites {
            out = pattern.replace_all(&out, replace.as_str()).into_owned();
        }
        out
    }

    /// Fold a clause that only adds a date ("It's on January 9th.") into the
    /// fact before it.
    fn continue_fact(&self, fact: &mut Fact, clause: &str, date: NaiveDate) {
        let clause = self.strip_markers(clause);
        if !self.continuation.iter().any(|p| p.is_match(clause)) {
            return;
        }
        let dates = self.dates.resolve(clause, date);
        if dates.is_empty() {
            return;
        }
        let added = DateResolver::rewrite(clause, &dates);
        let added = added.trim_end_matches(['.', '!']);
        let mut lowered = added.chars();
        let added: String = lowered
            .next()
            .map(|c| c.to_lowercase().chain(lowered).collect())
            .unwrap_or_default();
        fact.content = format!("{} ({added}).", fact.content.trim_end_matches(['.', '!']));
        fact.source.text = format!("{} {clause}", fact.source.text);
        fact.dates.extend(dates);
    }

    /// The assistant's last suggestion in `assistant`, when `reply` (the first
    /// sentence of the next user turn) confirms it without reservation.
    fn confirmed_suggestion(
        &self,
        reply: &str,
        assistant: &Turn,
        turn: usize,
        date: NaiveDate,
    ) -> Option<Fact> {
        if !self.confirm.is_match(reply) || self.confirm_not.is_match(reply) {
            return None;
        }
        let text = normalize(&assistant.content);
        let (s, caps) = self
            .sentences(&text)
            .into_iter()
            .rev()
            .filter(|s| {
                !s.ends_with('?')
                    || s.to_lowercase().starts_with("how about")
                    || s.to_lowercase().starts_with("what about")
            })
            .find_map(|sentence| {
                self.suggestions
                    .iter()
                    .find_map(|s| s.pattern.captures(sentence).map(|c| (s, c)))
            })?;
        let rest = caps
            .name("rest")?
            .as_str()
            .trim()
            .trim_end_matches([',', '?', '!']);
        let dates = self.dates.resolve(rest, date);
        let rest = self
            .person
            .third_from_second(&DateResolver::rewrite(rest, &dates));
        Some(Fact {
            content: finish(&s.template.replace("{rest}", &rest)),
            memory_type: s.memory_type.clone(),
            subject: "user".into(),
            confidence: s.confidence,
            dates,
            source: Source {
                turn,
                role: Role::Assistant,
                text: caps[0].to_string(),
            },
            rule: "assistant_confirmed".into(),
        })
    }
}

/// Capitalise and end with a period.
/// `s` after a prefix whose lower case is `lower`, cut on one of `s`'s own
/// character boundaries. (A length measured on the lower-case form does not
/// fit the original: "K", the Kelvin sign, is three bytes and lowers to "k".)
fn strip_prefix_lowercase<'t>(s: &'t str, lower: &str) -> Option<&'t str> {
    let mut want = lower.chars();
    for (at, c) in s.char_indices() {
        if want.as_str().is_empty() {
            return Some(&s[at..]);
        }
        for l in c.to_lowercase() {
            if want.next() != Some(l) {
                return None;
            }
        }
    }
    want.as_str().is_empty().then_some("")
}

fn finish(s: &str) -> String {
    let s = s.trim().trim_end_matches([',', ';', ':', ' ']);
    let mut out: String = match s.chars().next() {
        Some(c) => c.to_uppercase().chain(s.chars().skip(1)).collect(),
        None => String::new(),
    };
    if !out.ends_with(['.', '!']) {
        out.push('.');
    }
    out
}

/// The third person singular of a present-tense verb.
fn third_singular(verb: &str) -> String {
    let lower = verb.to_lowercase();
    if ["s", "sh", "ch", "x", "z", "o"]
        .iter()
        .any(|e| lower.ends_with(e))
    {
        format!("{verb}es")
    } else if lower.ends_with('y')
        && lower.len() > 1
        && !"aeiou".contains(lower.chars().rev().nth(1).unwrap_or('a'))
    {
        format!("{}ies", &verb[..verb.len() - 1])
    } else {
        format!("{verb}s")
    }
}

impl Person {
    /// First person to third: "I love my dog" → "User loves their dog".
    fn third(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() + 16);
        let mut at = 0;
        let mut named = false;
        // After "I": the verb that follows takes "User" (false) or "they" (true).
        let mut verb_of: Option<bool> = None;
        for m in self.pronoun.find_iter(text) {
            // "i.e." is not a pronoun.
            if m.as_str().eq_ignore_ascii_case("i") && text[m.end()..].starts_with('.') {
                continue;
            }
            out.push_str(&self.conjugate(&text[at..m.start()], verb_of.take()));
            let lower = m.as_str().to_lowercase();
            let sentence_start = out.trim_end().is_empty();
            let word = match (lower.as_str(), named) {
                ("i", false) => "User",
                ("i", true) => "they",
                ("i'm", false) => "User is",
                ("i'm", true) => "they're",
                ("i've", false) => "User has",
                ("i've", true) => "they've",
                ("i'll", false) => "User will",
                ("i'll", true) => "they'll",
                ("i'd", false) => "User would",
                ("i'd", true) => "they'd",
                ("me", false) => "the user",
                ("me", true) => "them",
                ("my", false) if sentence_start => "User's",
                ("my", false) => "the user's",
                ("my", true) => "their",
                ("mine", false) => "the user's",
                ("mine", true) => "theirs",
                _ => "themselves",
            };
            if lower == "i" {
                verb_of = Some(named);
            }
            named = true;
            out.push_str(word);
            at = m.end();
        }
        out.push_str(&self.conjugate(&text[at..], verb_of));
        out
    }

    /// Put the verb at the start of `after` (past any adverbs) in the person of
    /// the subject just written: `Some(false)` third singular ("User loves"),
    /// `Some(true)` plural ("they are"), `None` leaves the text alone.
    fn conjugate(&self, after: &str, plural: Option<bool>) -> String {
        let Some(plural) = plural else {
            return after.to_string();
        };
        let mut result = String::with_capacity(after.len() + 2);
        let mut rest = after;
        loop {
            let trimmed = rest.trim_start();
            let lead = &rest[..rest.len() - trimmed.len()];
            let word_len = trimmed
                .find(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '-'))
                .unwrap_or(trimmed.len());
            let word = &trimmed[..word_len];
            if lead.is_empty() || word.is_empty() {
                // "I, for one": no verb right after the subject.
                result.push_str(rest);
                return result;
            }
            result.push_str(lead);
            let lower = word.to_lowercase();
            if self.adverbs.contains(&lower) {
                result.push_str(word);
                rest = &trimmed[word_len..];
                continue;
            }
            let verb = match (plural, lower.as_str()) {
                (true, "am") => "are".to_string(),
                (true, "was") => "were".to_string(),
                (true, "wasn't") => "weren't".to_string(),
                (true, _) => word.to_string(),
                (false, _) => {
                    if let Some(v) = self.third_person.get(&lower) {
                        v.clone()
                    } else if self.unchanged.contains(&lower)
                        || (lower.ends_with("ed") && !lower.ends_with("eed"))
                        || lower.ends_with("n't")
                    {
                        word.to_string()
                    } else {
                        third_singular(word)
                    }
                }
            };
            result.push_str(&verb);
            result.push_str(&trimmed[word_len..]);
            return result;
        }
    }

    /// Second person to third, for assistant suggestions the user took on.
    fn third_from_second(&self, text: &str) -> String {
        self.second_person
            .replace_all(text, |c: &regex::Captures| {
                match c[0].to_lowercase().as_str() {
                    "you're" => "they're",
                    "you've" => "they've",
                    "you'll" => "they'll",
                    "your" => "their",
                    "yours" => "theirs",
                    "yourself" => "themselves",
                    _ => "them",
                }
                .to_string()
            })
            .into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::facts::parse_transcript;

    fn rules() -> RuleExtractor {
        RuleExtractor::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/extract/facts.toml"),
        )
        .unwrap()
    }

    fn facts(text: &str) -> Vec<Fact> {
        rules().extract(
            &parse_transcript(text),
            NaiveDate::from_ymd_opt(2026, 4, 2).unwrap(),
        )
    }

    #[test]
    fn a_marker_in_letters_that_change_length_when_lowered_is_cut_safely() {
        // "OK" with the Kelvin sign: three bytes that lower to one. Measuring
        // the marker on the lower-case text cut inside the character and panicked.
        let kelvin = facts("User: O\u{212a}, I switched from VSCode to Cursor last week.");
        let plain = facts("User: OK, I switched from VSCode to Cursor last week.");
        assert!(!plain.is_empty());
        assert_eq!(
            kelvin.iter().map(|f| &f.content).collect::<Vec<_>>(),
            plain.iter().map(|f| &f.content).collect::<Vec<_>>()
        );
        assert_eq!(strip_prefix_lowercase("O\u{212a}, x", "ok"), Some(", x"));
        assert_eq!(strip_prefix_lowercase("Oh", "ok"), None);
        assert_eq!(strip_prefix_lowercase("O", "ok"), None);
        assert_eq!(strip_prefix_lowercase("OK", "ok"), Some(""));
    }

    #[test]
    fn asides_in_a_request_become_facts() {
        // A request to the assistant with a fact told on the way: the fact
        // alone is kept, in the third person.
        let cases = [
            (
                "Can you suggest a gym routine? By the way, I just turned 41 last month.",
                "turned 41",
                "fact",
            ),
            (
                "I come from a family with four brothers, so noise never bothers me.",
                "family with four brothers",
                "fact",
            ),
            (
                "I've had my blue road bike for about 6 years and it still rides well.",
                "road bike for about 6 years",
                "fact",
            ),
            (
                "I've been dedicating two hours each weekend to woodworking.",
                "two hours each weekend",
                "fact",
            ),
            (
                "Any tips for public speaking? I presented my thesis to the faculty on Monday.",
                "presented their thesis",
                "event",
            ),
            (
                "I also bought 10 pounds of bird seed for the feeders.",
                "10 pounds of bird seed",
                "event",
            ),
            (
                "I just got diagnosed with asthma, so I need a gentler workout plan.",
                "diagnosed with asthma",
                "event",
            ),
            (
                "I'm 47, so I'm in my late forties. My skin is dry.",
                "User is 47",
                "fact",
            ),
            (
                "Any gym near me? I've been enjoying the outdoors lately, just did a 5-mile hike last Sunday.",
                "5-mile hike",
                "preference",
            ),
        ];
        for (text, words, kind) in cases {
            let found = facts(&format!("User: {text}"));
            let fact = found
                .iter()
                .find(|f| f.content.contains(words))
                .unwrap_or_else(|| panic!("{text}: {found:?}"));
            assert!(fact.content.starts_with("User "), "{fact:?}");
            assert_eq!(fact.memory_type, kind, "{fact:?}");
        }
        // Still no fact: a hypothetical, and small talk about having had a time.
        assert!(facts("User: If I had a dog for about 3 years, would it be calm?").is_empty());
        assert!(facts("User: I've had a great time, thanks!").is_empty());
        // Two words are read only as an age.
        let age = facts("User: I'm tired. I'm 47!");
        assert_eq!(age.len(), 1, "{age:?}");
        assert!(age[0].content.starts_with("User is 47"), "{age:?}");
        assert_eq!(age[0].rule, "age");
        assert!(facts("User: I'm tired.").is_empty());
    }

    #[test]
    fn first_person_becomes_third() {
        let r = rules();
        let t = |s: &str| r.person.third(s);
        assert_eq!(t("I love my dog"), "User loves their dog");
        assert_eq!(t("I really enjoy hiking"), "User really enjoys hiking");
        assert_eq!(
            t("I'm a nurse and I am tired"),
            "User is a nurse and they are tired"
        );
        assert_eq!(t("I don't eat meat"), "User doesn't eat meat");
        assert_eq!(
            t("I need to renew my passport"),
            "User needs to renew their passport"
        );
        assert_eq!(t("I have two cats"), "User has two cats");
        assert_eq!(t("I switched to Cursor"), "User switched to Cursor");
        assert_eq!(t("My sister called me"), "User's sister called them");
        assert_eq!(t("I watch TV, i.e. a lot"), "User watches TV, i.e. a lot");
    }

    #[test]
    fn the_reference_example_yields_a_preference_and_a_dated_project() {
        let f = facts("User: I switched from VSCode to Cursor last week. Also, the dashboard deadline is April 15th.");
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0].memory_type, "preference");
        assert_eq!(
            f[0].content,
            "User switched from VSCode to Cursor around 2026-03-26."
        );
        assert_eq!(f[1].memory_type, "project");
        assert_eq!(f[1].subject, "dashboard");
        assert_eq!(f[1].content, "The dashboard deadline is 2026-04-15.");
        assert_eq!(f[1].dates[0].date, "2026-04-15");
    }

    #[test]
    fn questions_greetings_and_requests_are_not_facts() {
        assert!(facts("User: Hi there!\nUser: Can you help me with my resume?\nUser: What time is it in Tokyo?\nUser: Thanks so much!").is_empty());
        assert!(facts("User: Please write a haiku about autumn.\nUser: I loved it.").is_empty());
    }

    #[test]
    fn clauses_split_on_a_new_first_person_subject_only() {
        let f = facts("User: I'm a vegan and I can't eat soy either.");
        assert_eq!(f.len(), 2, "{f:?}");
        let f = facts("User: My wife and I are going to Rome next month.");
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].content
                .starts_with("User and their wife are going to Rome in 2026-05"),
            "{f:?}"
        );
    }

    #[test]
    fn a_date_in_the_next_sentence_joins_its_fact() {
        let f = facts("User: We're planning my dad's retirement party. It's on May 9th.");
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].dates[0].date, "2026-05-09");
        assert!(f[0].content.ends_with("(it's on 2026-05-09)."), "{f:?}");
    }

    #[test]
    fn a_broken_rules_file_names_the_pattern() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/extract/facts.toml"),
        )
        .unwrap()
        .replacen("name = \"decision\"", "name = \"decision\"\n# broken\n", 1)
        .replacen("'''\\b(?:I|we)(?:'ve", "'''(unclosed\\b(?:I|we)(?:'ve", 1);
        let err = RuleExtractor::parse(&text).err().unwrap();
        assert!(err.to_string().contains("rule `decision` pattern"), "{err}");
    }
}
