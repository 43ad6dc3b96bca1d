//! `extract_entities`: finds entities (dictionary first, then deterministic
//! rules for people, organisations, projects, places and dates), normalises
//! them to keys ("VS Code" = "VSCode" = "vscode"), fills the chunk's `entities`
//! and, when clear, `subject` and a `preference` type, and folds the mentions
//! and relations ("alice -uses-> cursor", co-occurrence) into the stream's graph.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::future::BoxFuture;
use regex::Regex;
use serde::Deserialize;

use super::parse_params;
use words::*;

mod words;
use crate::pipeline::{BuildContext, PipelineError, Record, Stage};
use crate::store::graph::{entity_key, Dictionary, DictionaryEntry, Mention, Relation};
use crate::store::Store;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtractEntitiesConfig {
    /// Dictionary file (relative to the pipelines directory) with `[[entity]]` entries.
    #[serde(default)]
    pub dictionary_file: Option<String>,
    /// Extra entries given inline.
    #[serde(default)]
    pub entity: Vec<DictionaryEntry>,
    /// Record mentions and relations in the `entities`/`edges` tables.
    #[serde(default = "yes")]
    pub populate_graph: bool,
    /// Most entities per chunk that pair up as co-occurrence edges.
    #[serde(default = "ten")]
    pub max_cooccurrence: usize,
    /// Also queue kept memories for LLM entity extraction (when `[llm]` is
    /// configured with `ner = true`).
    #[serde(default)]
    pub llm_ner: bool,
}

fn yes() -> bool {
    true
}

fn ten() -> usize {
    10
}

impl ExtractEntitiesConfig {
    pub fn build(
        self,
        store: Arc<Store>,
        dir: &std::path::Path,
    ) -> Result<ExtractEntities, PipelineError> {
        let dictionary = Dictionary::load(dir, self.dictionary_file.as_deref(), self.entity)
            .map_err(|e| PipelineError::Config {
                stage: "extract_entities".into(),
                message: e.to_string(),
            })?;
        Ok(ExtractEntities {
            dictionary,
            store,
            populate_graph: self.populate_graph,
            max_cooccurrence: self.max_cooccurrence,
            ner: None,
            word: Regex::new(WORD).expect("static regex"),
            date: Regex::new(
                r"(?i)\b\d{4}-\d{2}-\d{2}\b|\b(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.? \d{1,2}(?:st|nd|rd|th)?(?:,? \d{4})?\b|\b\d{1,2}(?:st|nd|rd|th)? (?:of )?(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)(?:,? \d{4})?\b",
            )
            .expect("static regex"),
            project: Regex::new(r"\b[Pp]roject ([A-Z][\w-]+)|\b(?:the|our|my) ([A-Za-z][\w-]+) project\b").expect("static regex"),
            first_person: Regex::new(FIRST_PERSON).expect("static regex"),
        })
    }
}

pub fn build(params: toml::Table, ctx: &BuildContext) -> Result<Box<dyn Stage>, PipelineError> {
    let cfg: ExtractEntitiesConfig = parse_params("extract_entities", params)?;
    let ner = cfg.llm_ner.then(|| ctx.ner.clone()).flatten();
    let mut stage = cfg.build(ctx.store.clone(), &ctx.dir)?;
    stage.ner = ner;
    Ok(Box::new(stage))
}

pub struct ExtractEntities {
    pub dictionary: Dictionary,
    store: Arc<Store>,
    populate_graph: bool,
    max_cooccurrence: usize,
    /// The LLM entity queue kept memories also go to.
    pub ner: Option<crate::pipeline::ner::NerQueue>,
    word: Regex,
    date: Regex,
    project: Regex,
    first_person: Regex,
}

/// A word: a letter or a digit, then letters, digits and `'’.-+#`.
const WORD: &str = r"[\p{L}\p{N}][\p{L}\p{N}'’.\-+#]*";

/// Text that speaks of its writer in the first person.
const FIRST_PERSON: &str =
    r"(?i)^(?:user\b|i\b|i'm\b|i've\b|my\b|me\b)|\b(?:i|my|me|i'm|i've|myself)\b";

/// `first_person`'s answer for an ASCII text, from its words (runs of
/// `\w`, which in ASCII is letters, digits and `_`): it starts with the
/// word "user", or one of its words is "i", "my", "me" or "myself" ("i'm"
/// and "i've" start with the word "i"), in any case. The pattern's
/// prefilter stops at every "i" of a text, and most texts hold many.
fn first_person_ascii(text: &str) -> bool {
    let mut words = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .enumerate()
        .filter(|(_, w)| !w.is_empty());
    words.any(|(at, w)| {
        (at == 0 && w.eq_ignore_ascii_case("user"))
            || ["i", "my", "me", "myself"]
                .iter()
                .any(|p| w.eq_ignore_ascii_case(p))
    })
}

/// Where the `word` pattern's matches lie in an ASCII text: a letter or a
/// digit, then letters, digits and `'.-+#`. The pattern's searches ran
/// forwards and back for every word.
fn ascii_words(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let bytes = text.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || {
        let start = at + bytes[at..].iter().position(u8::is_ascii_alphanumeric)?;
        let len = bytes[start..]
            .iter()
            .position(|b| !(b.is_ascii_alphanumeric() || b"'.-+#".contains(b)))
            .unwrap_or(bytes.len() - start);
        at = start + len;
        Some((start, at))
    })
}

/// One entity found in a text.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub key: String,
    pub name: String,
    pub entity_type: String,
    pub surface: String,
    /// Byte offset in the text.
    pub start: usize,
    pub end: usize,
}

struct Token<'a> {
    text: &'a str,
    start: usize,
    end: usize,
    sentence_start: bool,
}

/// The `entity_key` of each of `tokens` (of `text`) and of each gap between
/// two of them (empty unless it holds a letter or digit).
fn piece_keys(text: &str, tokens: &[Token<'_>]) -> (Vec<String>, Vec<String>) {
    let token_keys = tokens.iter().map(|t| entity_key(t.text)).collect();
    let gap_keys = tokens
        .windows(2)
        .map(|w| entity_key(&text[w[0].end..w[1].start]))
        .collect();
    (token_keys, gap_keys)
}

/// Into `key`, the `entity_key` of tokens `i..i + n` and the text between
/// them, from each token's key (`token_keys`) and each gap's (`gap_keys[j]`
/// lies between tokens `j` and `j + 1`).
fn ngram_key(key: &mut String, token_keys: &[String], gap_keys: &[String], i: usize, n: usize) {
    key.clear();
    key.push_str(&token_keys[i]);
    for j in i + 1..i + n {
        key.push_str(&gap_keys[j - 1]);
        key.push_str(&token_keys[j]);
    }
}

/// Whether a lowercased word is one of [`NOT_NAMES`].
fn not_name(word: &str) -> bool {
    static SET: std::sync::OnceLock<std::collections::HashSet<&'static str>> =
        std::sync::OnceLock::new();
    SET.get_or_init(|| NOT_NAMES.iter().copied().collect())
        .contains(word)
}

fn is_capitalised(s: &str) -> bool {
    s.chars().next().is_some_and(char::is_uppercase)
}

impl ExtractEntities {
    fn tokens<'a>(&self, text: &'a str) -> Vec<Token<'a>> {
        let mut out = Vec::new();
        let mut last_end = 0;
        let mut push = |(start, end): (usize, usize)| {
            let gap = &text[last_end..start];
            let sentence_start = out.is_empty() || gap.contains(['.', '!', '?', '\n', ':']);
            let t = text[start..end].trim_end_matches(['.', '\'', '’', '-']);
            out.push(Token {
                text: t,
                start,
                end: start + t.len(),
                sentence_start,
            });
            last_end = end;
        };
        if text.is_ascii() {
            ascii_words(text).for_each(&mut push);
        } else {
            self.word
                .find_iter(text)
                .for_each(|m| push((m.start(), m.end())));
        }
        out
    }

    /// Every entity in `text`, in order of appearance.
    pub fn find(&self, text: &str) -> Vec<Found> {
        let tokens = self.tokens(text);
        let mut used = vec![false; tokens.len()];
        let mut found = Vec::new();
        // Each token lowercased once, when first asked for.
        let lowered: Vec<std::cell::OnceCell<String>> = (0..tokens.len())
            .map(|_| std::cell::OnceCell::new())
            .collect();
        let lower = |i: usize| -> &str { lowered[i].get_or_init(|| tokens[i].text.to_lowercase()) };

        // Every date the pattern knows holds a digit (`\d`, any Unicode
        // digit, all of which are numeric): a text without one is not searched.
        let dates = text.chars().any(char::is_numeric);
        for m in dates
            .then(|| self.date.find_iter(text))
            .into_iter()
            .flatten()
        {
            for (i, t) in tokens.iter().enumerate() {
                if t.start >= m.start() && t.end <= m.end() {
                    used[i] = true;
                }
            }
            found.push(Found {
                key: entity_key(m.as_str()),
                name: m.as_str().to_string(),
                entity_type: "DATE".into(),
                surface: m.as_str().to_string(),
                start: m.start(),
                end: m.end(),
            });
        }
        // Dictionary n-grams, longest first. An n-gram's key is its surface's
        // `entity_key`: the keys of its tokens and of the gaps between them
        // (empty unless a gap holds a letter or digit), put together in one
        // buffer, since `entity_key` keeps or drops each char alone.
        // An n-gram's key starts with its first token's: a token no key
        // starts with opens no n-gram of the dictionary.
        let (token_keys, gap_keys) = piece_keys(text, &tokens);
        let opens: Vec<bool> = token_keys
            .iter()
            .map(|k| self.dictionary.has_key_starting(k))
            .collect();
        let mut key = String::new();
        for n in (1..=self.dictionary.max_words.max(1)).rev() {
            for i in 0..tokens.len().saturating_sub(n - 1) {
                if !opens[i] || used[i..i + n].iter().any(|u| *u) {
                    continue;
                }
                ngram_key(&mut key, &token_keys, &gap_keys, i, n);
                let Some(entry) = self.dictionary.get(&key) else {
                    continue;
                };
                let surface = &text[tokens[i].start..tokens[i + n - 1].end];
                if n == 1 && COMMON_WORDS.contains(&key.as_str()) && !is_capitalised(tokens[i].text)
                {
                    continue;
                }
                used[i..i + n].iter_mut().for_each(|u| *u = true);
                found.push(Found {
                    key: entity_key(&entry.name),
                    name: entry.name.clone(),
                    entity_type: entry.entity_type.clone(),
                    surface: surface.to_string(),
                    start: tokens[i].start,
                    end: tokens[i + n - 1].end,
                });
            }
        }
        // Projects named by pattern.
        // Both of the pattern's forms hold "roject".
        let projects = text.contains("roject");
        for caps in projects
            .then(|| self.project.captures_iter(text))
            .into_iter()
            .flatten()
        {
            let Some(m) = caps.get(1).or_else(|| caps.get(2)) else {
                continue;
            };
            let key = entity_key(m.as_str());
            if not_name(&key) || ["side", "new", "big", "whole", "same"].contains(&key.as_str()) {
                continue;
            }
            let whole = caps.get(0).expect("match");
            for (i, t) in tokens.iter().enumerate() {
                if t.start >= whole.start() && t.end <= whole.end() {
                    used[i] = true;
                }
            }
            found.push(Found {
                key,
                name: m.as_str().to_string(),
                entity_type: "PROJECT".into(),
                surface: m.as_str().to_string(),
                start: m.start(),
                end: m.end(),
            });
        }
        // Runs of capitalised words.
        let mut i = 0;
        while i < tokens.len() {
            let starts_name = !used[i]
                && is_capitalised(tokens[i].text)
                && !not_name(lower(i))
                && tokens[i].text.chars().any(char::is_alphabetic);
            if !starts_name {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < tokens.len()
                && !used[j]
                && !tokens[j].sentence_start
                && is_capitalised(tokens[j].text)
                && !not_name(lower(j))
                && j - i < 4
            {
                j += 1;
            }
            let last = lower(j - 1);
            let prev = i.checked_sub(1).map_or("", lower);
            let next = if j < tokens.len() { lower(j) } else { "" };
            let entity_type = if ORG_SUFFIXES.contains(&last) {
                Some("ORGANIZATION")
            } else if PLACE_BEFORE.contains(&prev) {
                Some("PLACE")
            } else if PERSON_BEFORE.contains(&prev) || PERSON_AFTER.contains(&next) {
                Some("PERSON")
            } else if tokens[i].sentence_start && j - i == 1 {
                // A lone capitalised word opening a sentence is most often just a word.
                None
            } else {
                Some("CONCEPT")
            };
            if let Some(t) = entity_type {
                let surface = &text[tokens[i].start..tokens[j - 1].end];
                found.push(Found {
                    key: entity_key(surface),
                    name: surface.to_string(),
                    entity_type: t.into(),
                    surface: surface.to_string(),
                    start: tokens[i].start,
                    end: tokens[j - 1].end,
                });
            }
            i = j;
        }
        found.sort_by_key(|f| f.start);
        found.dedup_by(|a, b| a.key == b.key);
        found.retain(|f| !f.key.is_empty());
        found
    }

    /// "my friend/colleague/… <person>" opens the text, and the user is not
    /// otherwise its subject (no "I", "I'm", "me" elsewhere).
    fn about_someone_else(&self, text: &str, person: &Found) -> bool {
        let before = text[..person.start].to_lowercase();
        let words: Vec<&str> = before.split_whitespace().collect();
        let introduced = matches!(words.as_slice(), [.., "my", rel] if PERSON_BEFORE.contains(rel));
        let rest = &text[person.end..];
        introduced && words.len() <= 3 && !self.is_first_person(rest)
    }

    fn is_first_person(&self, text: &str) -> bool {
        if !text.is_ascii() {
            return self.first_person.is_match(text);
        }
        first_person_ascii(text)
    }

    /// Relations between the found entities (and the user, for first-person text).
    pub fn relations(&self, text: &str, found: &[Found]) -> Vec<(String, String, String)> {
        // Every relation needs an entity for its object.
        if found.iter().all(|f| f.entity_type == "DATE") {
            return Vec::new();
        }
        // ASCII lowercasing keeps every byte where it was, so an offset in
        // `lower` is the same offset in `text` and in `found` (full Unicode
        // lowercasing can change a char's length: "İ" becomes three bytes).
        let lower = text.to_ascii_lowercase();
        let bytes = lower.as_bytes();
        let in_word = |i: usize| i < bytes.len() && bytes[i].is_ascii_alphanumeric();
        let mut out = Vec::new();
        // A verb starts a word and ends one: try the verbs at word starts only.
        for pos in (0..bytes.len()).filter(|&i| in_word(i) && (i == 0 || !in_word(i - 1))) {
            for (surface, relation) in RELATION_VERBS {
                let end = pos + surface.len();
                // The first byte alone turns most verbs away.
                if surface.as_bytes()[0] != bytes[pos]
                    || !bytes[pos..].starts_with(surface.as_bytes())
                    || in_word(end)
                {
                    continue;
                }
                // Subject: the nearest entity before the verb in the same clause, else the user.
                let clause_start = lower[..pos]
                    .rfind(['.', '!', '?', '\n', ';'])
                    .map(|i| i + 1)
                    .unwrap_or(0);
                let subject = found
                    .iter()
                    .rfind(|f| f.end <= pos && f.start >= clause_start && f.entity_type != "DATE")
                    .map(|f| f.key.clone())
                    .or_else(|| {
                        self.is_first_person(&text[clause_start..pos])
                            .then(|| "user".to_string())
                    });
                // Object: the first entity after the verb, within a few words.
                let object = found
                    .iter()
                    .find(|f| {
                        f.start >= end
                            && f.entity_type != "DATE"
                            && text[end..f.start].split_whitespace().count() <= 3
                    })
                    .map(|f| f.key.clone());
                if let (Some(s), Some(o)) = (subject, object) {
                    if s != o {
                        out.push((s, relation.to_string(), o));
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    fn is_preference(&self, text: &str) -> bool {
        if !self.is_first_person(text) {
            return false;
        }
        let lower = text.to_lowercase();
        PREFERENCE_CUES.iter().any(|cue| {
            lower.match_indices(cue).any(|(pos, _)| {
                let end = pos + cue.len();
                (pos == 0 || !lower.as_bytes()[pos - 1].is_ascii_alphabetic())
                    && (end >= lower.len() || !lower.as_bytes()[end].is_ascii_alphabetic())
            })
        })
    }
}

impl Stage for ExtractEntities {
    fn runs_ahead(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "extract_entities"
    }

    fn process<'a>(&'a self, batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>> {
        Box::pin(async move {
            let mut mentions = Vec::new();
            let mut relations = Vec::new();
            for r in batch.iter_mut().filter(|r| r.is_kept()) {
                let (first_mention, first_relation) = (mentions.len(), relations.len());
                let c = &mut r.chunk;
                let found = self.find(&c.content);
                let keys: BTreeSet<String> = c
                    .entities
                    .iter()
                    .cloned()
                    .chain(found.iter().map(|f| f.key.clone()))
                    .collect();
                c.entities = keys.into_iter().collect();
                if c.subject.is_none() {
                    let named: Vec<&Found> = found
                        .iter()
                        .filter(|f| {
                            matches!(
                                f.entity_type.as_str(),
                                "PERSON" | "PROJECT" | "ORGANIZATION"
                            )
                        })
                        .collect();
                    let persons: Vec<&&Found> =
                        named.iter().filter(|f| f.entity_type == "PERSON").collect();
                    if persons.len() == 1 && self.about_someone_else(&c.content, persons[0]) {
                        // "My colleague Bob uses Vim" is about Bob, not the user.
                        c.subject = Some(persons[0].name.clone());
                    } else if self.is_first_person(&c.content) {
                        c.subject = Some("user".into());
                    } else if named.len() == 1 {
                        c.subject = Some(named[0].name.clone());
                    }
                }
                if c.memory_type == "general" && self.is_preference(&c.content) {
                    c.memory_type = "preference".into();
                }
                for f in &found {
                    mentions.push(Mention {
                        stream: c.stream.clone(),
                        key: f.key.clone(),
                        name: f.name.clone(),
                        entity_type: f.entity_type.clone(),
                        surface: f.surface.clone(),
                        chunk_id: c.id.clone(),
                        at: c.created_at,
                    });
                }
                let linked: Vec<&Found> = found
                    .iter()
                    .filter(|f| f.entity_type != "DATE")
                    .take(self.max_cooccurrence)
                    .collect();
                for (i, a) in linked.iter().enumerate() {
                    for b in &linked[i + 1..] {
                        let (s, t) = if a.key < b.key { (a, b) } else { (b, a) };
                        relations.push(Relation {
                            stream: c.stream.clone(),
                            source: s.key.clone(),
                            target: t.key.clone(),
                            relation: "co_occurs".into(),
                            chunk_id: c.id.clone(),
                            at: c.created_at,
                        });
                    }
                }
                for (s, rel, t) in self.relations(&c.content, &found) {
                    relations.push(Relation {
                        stream: c.stream.clone(),
                        source: s,
                        target: t,
                        relation: rel,
                        chunk_id: c.id.clone(),
                        at: c.created_at,
                    });
                }
                if self.populate_graph {
                    r.graph_refs = crate::store::graph::ChunkRefs {
                        entities: mentions[first_mention..]
                            .iter()
                            .map(Mention::entity_id)
                            .collect(),
                        edges: relations[first_relation..]
                            .iter()
                            .map(Relation::edge_id)
                            .collect(),
                    };
                }
            }
            // The graph's rows join its next group commit, which the worker
            // waits for before the batch is acknowledged.
            if let Some(ner) = &self.ner {
                let kept: Vec<&crate::core::model::Chunk> = batch
                    .iter()
                    .filter(|r| r.is_kept())
                    .map(|r| &r.chunk)
                    .collect();
                ner.push(&kept);
            }
            if self.populate_graph && !(mentions.is_empty() && relations.is_empty()) {
                // Queued now, so batches reach the graph in the order pulled.
                let committed = self.store.graph.defer(mentions, relations);
                crate::pipeline::wait_for_graph(batch, &self.store, committed);
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words of an ASCII text lie where the pattern finds them, over
    /// every text of up to five of these characters.
    #[test]
    fn ascii_words_lie_where_the_pattern_finds_them() {
        let word = Regex::new(WORD).unwrap();
        let chars = ["a", "Z", "9", " ", "'", ".", "-", "+", "#", "!", "\n"];
        let mut words = 0;
        for t in crate::pipeline::every_text(&chars, 5) {
            let want: Vec<(usize, usize)> =
                word.find_iter(&t).map(|m| (m.start(), m.end())).collect();
            assert_eq!(ascii_words(&t).collect::<Vec<_>>(), want, "{t:?}");
            words += want.len();
        }
        assert!(words > 100_000, "{words}");
    }

    /// The word test answers as the pattern does, over every ASCII text of
    /// up to three of these pieces.
    #[test]
    fn first_person_words_answer_as_the_pattern_does() {
        let pattern = Regex::new(FIRST_PERSON).unwrap();
        let pieces = [
            "i", "I", "my", "Me", "mE", "myself", "MySelf", "user", "User", "users", "mine", "i'm",
            "I've", "_", "9", " ", "'", "-", "x", "ii", "emy",
        ];
        let (mut yes, mut all) = (0, 0);
        for t in crate::pipeline::every_text(&pieces, 3) {
            let want = pattern.is_match(&t);
            assert_eq!(first_person_ascii(&t), want, "{t:?}");
            yes += usize::from(want);
            all += 1;
        }
        assert!(yes > 1000 && all - yes > 1000, "{yes} of {all}");
    }

    async fn stage() -> (ExtractEntities, tempfile::TempDir) {
        let tmp = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(tmp.path(), 8, 100).await.unwrap());
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines");
        let cfg = ExtractEntitiesConfig {
            dictionary_file: Some("dictionaries/entities.toml".into()),
            entity: vec![],
            populate_graph: true,
            max_cooccurrence: 10,
            llm_ner: false,
        };
        (cfg.build(store, &dir).unwrap(), tmp)
    }

    fn keys(found: &[Found]) -> Vec<(&str, &str)> {
        found
            .iter()
            .map(|f| (f.key.as_str(), f.entity_type.as_str()))
            .collect()
    }

    /// An n-gram's key put together from its tokens' and gaps' keys is the
    /// key of its whole surface, for any text (a Devanagari vowel sign is
    /// alphanumeric to `entity_key` but not a word character, so it can sit
    /// in a gap).
    #[tokio::test]
    async fn an_ngrams_key_is_the_key_of_its_surface() {
        let (s, _t) = stage().await;
        for text in [
            "I moved to New York City and use VS Code, Acme-Labs' v2.0 C++ #rust",
            "नमस्ते दुनिया ा x — Ünïcode ÉCOLE Ⅻ ½ 東京 タワー",
            "",
            "one",
        ] {
            let tokens = s.tokens(text);
            let (token_keys, gap_keys) = piece_keys(text, &tokens);
            let mut key = String::new();
            for n in 1..=4 {
                for i in 0..tokens.len().saturating_sub(n - 1) {
                    ngram_key(&mut key, &token_keys, &gap_keys, i, n);
                    let surface = &text[tokens[i].start..tokens[i + n - 1].end];
                    assert_eq!(key, entity_key(surface), "{surface:?} in {text:?}");
                }
            }
        }
    }

    #[tokio::test]
    async fn dictionary_aliases_are_one_entity() {
        let (s, _t) = stage().await;
        for text in [
            "I use VS Code daily",
            "I use VSCode daily",
            "i use vscode daily",
            "Visual Studio Code is my editor",
        ] {
            assert_eq!(
                keys(&s.find(text)),
                vec![("vscode", "TECHNOLOGY")],
                "{text}"
            );
        }
        // An ordinary word that is also a product name needs its capital.
        assert!(s.find("we go to the rust belt").is_empty());
        assert_eq!(
            keys(&s.find("I write Go and Rust")),
            vec![("go", "TECHNOLOGY"), ("rust", "TECHNOLOGY")]
        );
    }

    #[tokio::test]
    async fn rules_find_people_places_orgs_projects_and_dates() {
        let (s, _t) = stage().await;
        let f = s.find("My friend Alice Kowalski moved from Berlin to work at Acme Labs on Project Falcon, due April 15th.");
        assert_eq!(
            keys(&f),
            vec![
                ("alicekowalski", "PERSON"),
                ("berlin", "PLACE"),
                ("acmelabs", "ORGANIZATION"),
                ("falcon", "PROJECT"),
                ("april15th", "DATE"),
            ]
        );
        assert!(s.find("Yesterday was fine. Thanks!").is_empty());
        assert_eq!(
            keys(&s.find("the dashboard project slipped")),
            vec![("dashboard", "PROJECT")]
        );
    }

    /// The date and project patterns are skipped only in texts they cannot
    /// match: a date in other digits than ASCII ones is still found.
    #[tokio::test]
    async fn dates_in_any_digits_and_projects_are_still_searched() {
        let (s, _t) = stage().await;
        let dates = |t: &str| {
            s.find(t)
                .into_iter()
                .filter(|f| f.entity_type == "DATE")
                .map(|f| f.surface)
                .collect::<Vec<_>>()
        };
        assert_eq!(dates("We met on ٢٠٢٣-٠١-٠٢ there"), vec!["٢٠٢٣-٠١-٠٢"]);
        assert_eq!(dates("due March ３ then"), vec!["March ３"]);
        assert!(dates("due March then").is_empty());
        assert_eq!(
            keys(&s.find("we shipped our Atlas project and Project Orion")),
            vec![("atlas", "PROJECT"), ("orion", "PROJECT")]
        );
    }

    #[tokio::test]
    async fn relations_link_subject_verb_object() {
        let (s, _t) = stage().await;
        let text = "Alice uses Cursor. I prefer Vim.";
        let f = s.find(text);
        let rels = s.relations(text, &f);
        assert!(
            rels.contains(&("alice".into(), "uses".into(), "cursor".into())),
            "{rels:?}"
        );
        assert!(
            rels.contains(&("user".into(), "prefers".into(), "vim".into())),
            "{rels:?}"
        );
    }

    /// The relations of the first version, which searched the text once per
    /// verb (and lowercased it in full, which moved offsets past an "İ").
    fn relations_searched_per_verb(
        s: &ExtractEntities,
        text: &str,
        found: &[Found],
    ) -> Vec<(String, String, String)> {
        let lower = text.to_lowercase();
        let mut out = Vec::new();
        for (surface, relation) in RELATION_VERBS {
            for (pos, _) in lower.match_indices(surface) {
                let end = pos + surface.len();
                let boundary =
                    |i: usize| i >= lower.len() || !lower.as_bytes()[i].is_ascii_alphanumeric();
                if (pos > 0 && !boundary(pos - 1)) || !boundary(end) {
                    continue;
                }
                let before = &lower[..pos];
                let clause_start = before
                    .rfind(['.', '!', '?', '\n', ';'])
                    .map(|i| i + 1)
                    .unwrap_or(0);
                let subject = found
                    .iter()
                    .rfind(|f| f.end <= pos && f.start >= clause_start && f.entity_type != "DATE")
                    .map(|f| f.key.clone())
                    .or_else(|| {
                        s.is_first_person(&text[clause_start..pos])
                            .then(|| "user".to_string())
                    });
                let object = found
                    .iter()
                    .find(|f| {
                        f.start >= end
                            && f.entity_type != "DATE"
                            && text[end..f.start].split_whitespace().count() <= 3
                    })
                    .map(|f| f.key.clone());
                if let (Some(sub), Some(o)) = (subject, object) {
                    if sub != o {
                        out.push((sub, relation.to_string(), o));
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    #[tokio::test]
    async fn relations_at_word_starts_are_the_relations_searched_per_verb() {
        let (s, _t) = stage().await;
        let mut some = 0;
        for text in [
            "Alice uses Cursor. I prefer Vim.",
            "My colleague Bob uses Vim, and I use Zed",
            "Bob works at Acme Labs and lives in Lisbon; Carol manages Project Atlas",
            "I switched to Cursor on March 3rd. Dmitri knows Eve, Eve married Gustavo",
            "users of Vim misuse it; reuse Emacs. Hana joined Acme Labs, founded Globex Corp",
            "I love Tokyo and like Lisbon, I own a Tesla and lead the Atlas project",
            "useless overuse: uses. use! using? (works for) Farah work on Kubernetes",
            "Nothing here relates to anyone at all.",
            "",
        ] {
            let found = s.find(text);
            let want = relations_searched_per_verb(&s, text, &found);
            some += want.len();
            assert_eq!(s.relations(text, &found), want, "{text:?}");
        }
        assert!(some > 10, "{some} relations in all");
    }

    /// Offsets of the lowercased text are offsets of the text: a verb after
    /// chars whose lowercase is longer than they are is still read right.
    #[tokio::test]
    async fn relations_after_chars_that_lowercase_longer() {
        let (s, _t) = stage().await;
        let text = "İİİİİİ. Then Alice use ééé Cursor";
        let found = s.find(text);
        assert_eq!(
            s.relations(text, &found),
            vec![("alice".into(), "uses".into(), "cursor".into())]
        );
    }

    #[tokio::test]
    async fn the_stage_fills_entities_subject_type_and_graph() {
        let (s, _t) = stage().await;
        let mut batch = vec![
            Record::new(crate::core::model::Chunk::new(
                "1".into(),
                "st".into(),
                "I prefer Cursor over VS Code".into(),
                10,
            )),
            Record::new(crate::core::model::Chunk::new(
                "2".into(),
                "st".into(),
                "Alice uses Cursor IDE".into(),
                20,
            )),
            Record::new(crate::core::model::Chunk::new(
                "3".into(),
                "st".into(),
                "My colleague Bob uses Vim, and I use Zed".into(),
                30,
            )),
            Record::new(crate::core::model::Chunk::new(
                "4".into(),
                "st".into(),
                "My colleague Bob uses Vim at work".into(),
                40,
            )),
        ];
        s.process(&mut batch).await.unwrap();
        crate::pipeline::settle(&mut batch, "test").await.unwrap();
        assert_eq!(batch[0].chunk.entities, vec!["cursor", "vscode"]);
        assert_eq!(batch[0].chunk.subject.as_deref(), Some("user"));
        assert_eq!(batch[0].chunk.memory_type, "preference");
        assert_eq!(batch[1].chunk.subject.as_deref(), Some("Alice"));
        assert_eq!(batch[1].chunk.memory_type, "general");
        // Mentioning the user elsewhere keeps the user the subject.
        assert_eq!(batch[2].chunk.subject.as_deref(), Some("user"));
        assert_eq!(batch[3].chunk.subject.as_deref(), Some("Bob"));
        let cursor = s
            .store
            .graph
            .entity("st", "Cursor IDE")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(cursor.chunk_count, 2);
        assert_eq!(cursor.entity_type, "TECHNOLOGY");
        let edges = s.store.graph.edges_of("st", "cursor").await.unwrap();
        assert!(
            edges
                .iter()
                .any(|e| e.source == "alice" && e.relation == "uses"),
            "{edges:?}"
        );
        assert!(s
            .store
            .graph
            .entity("other", "Cursor")
            .await
            .unwrap()
            .is_none());
    }
}
