//! The hot index's full-text half: per stream, the postings of every memory's
//! text, tokenized exactly as the table's FTS index tokenizes it (Lance's own
//! analyzer with the index's default parameters: simple split, lower case,
//! English stemming and stop words, ASCII folding), scored with BM25 as Lance
//! scores it (k1 = 1.2, b = 0.75, Lucene's idf). The corpus statistics are
//! those of the streams searched, not of the whole table: one tenant's
//! memories do not change how another's words weigh.
//!
//! A replaced or removed memory leaves a dead slot behind; its postings are
//! skipped and swept out once the dead outnumber the living.

use std::collections::HashMap;

/// The hot index's maps: keyed by ids and words that come from users, so the
/// hash is keyed at random (aHash), and a fraction of SipHash's cost on the
/// short keys a stream's load inserts by the million.
pub(super) type Map<K, V> = HashMap<K, V, ahash::RandomState>;

use super::filter::Cond;
use super::hot::Meta;

/// Lance's BM25 parameters.
const K1: f32 = 1.2;
const B: f32 = 0.75;

/// Bytes a posting costs (slot and count).
const POSTING_BYTES: usize = 8;
/// Bytes a term costs in the dictionary beside its text.
const TERM_BYTES: usize = 64;

/// Turns a text into its terms: `true` for a query.
type Analyze = Box<dyn FnMut(&str, bool) -> Vec<String>>;

thread_local! {
    static ANALYZER: std::cell::RefCell<Option<Analyze>> = const { std::cell::RefCell::new(None) };
}

/// The analyzer of the table's FTS index (`FtsIndexBuilder::default()`, as
/// the index is created).
fn analyzer() -> Analyze {
    let mut tokenizer = lancedb::index::scalar::FtsIndexBuilder::default()
        .build()
        .expect("the default FTS parameters are valid");
    Box::new(move |text, query| {
        let mut stream = if query {
            tokenizer.token_stream_for_search(text)
        } else {
            tokenizer.token_stream_for_doc(text)
        };
        let mut out = Vec::new();
        while let Ok(Some(token)) = stream.try_next() {
            out.push(token.text.clone());
        }
        out
    })
}

/// Words whose terms are remembered, per thread, before the memo starts over.
const WORDS_KEPT: usize = 1 << 16;

/// What the analyzer makes of a word: its terms (none for a stop word).
type Words = Map<Box<str>, Box<[Box<str>]>>;

thread_local! {
    static WORDS: std::cell::RefCell<Words> = std::cell::RefCell::new(Map::default());
}

/// The terms of a memory's text, in order, repeats kept, word by word as
/// the index takes them (the tests hold this to the analyzer's answer for
/// the whole text).
#[cfg(test)]
fn doc_terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    WORDS.with(|cell| {
        let mut words = cell.borrow_mut();
        for word in doc_words(text) {
            each_word_term(&mut words, word, |t| out.push(t.to_string()));
        }
    });
    out
}

/// A memory's text split as the analyzer's tokenizer splits it: into runs
/// of alphanumeric characters. Every filter after the tokenizer (length
/// limit, lower case, stemming, stop words, ASCII folding) takes one token
/// at a time, so a word's terms do not depend on its neighbours.
fn doc_words(text: &str) -> DocWords<'_> {
    DocWords { text, at: 0 }
}

/// The runs of alphanumeric characters of a text, as
/// `text.split(|c: char| !c.is_alphanumeric())` without its empty parts:
/// ASCII bytes judged as bytes, only other characters decoded (a load splits
/// every memory's text; decoding each character was a fifth of building
/// its postings).
struct DocWords<'a> {
    text: &'a str,
    at: usize,
}

impl DocWords<'_> {
    /// Whether the character at byte `i` is alphanumeric, and its length.
    fn alnum_at(&self, i: usize) -> (bool, usize) {
        let b = self.text.as_bytes()[i];
        if b.is_ascii() {
            return (b.is_ascii_alphanumeric(), 1);
        }
        let c = self.text[i..].chars().next().expect("i is a char boundary");
        (c.is_alphanumeric(), c.len_utf8())
    }
}

impl<'a> Iterator for DocWords<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let len = self.text.len();
        let mut i = self.at;
        while i < len {
            let (alnum, n) = self.alnum_at(i);
            if alnum {
                break;
            }
            i += n;
        }
        let start = i;
        while i < len {
            let (alnum, n) = self.alnum_at(i);
            if !alnum {
                break;
            }
            i += n;
        }
        self.at = i;
        (start < i).then(|| &self.text[start..i])
    }
}

/// Call `f` with each term of one word: worked out once per thread, not once
/// per memory (a stream's first load puts thousands of texts of a small
/// vocabulary through here), and kept in the thread's memo.
fn each_word_term(words: &mut Words, word: &str, mut f: impl FnMut(&str)) {
    if let Some(terms) = words.get(word) {
        terms.iter().for_each(|t| f(t));
        return;
    }
    let terms: Box<[Box<str>]> = terms(word, false)
        .into_iter()
        .map(String::into_boxed_str)
        .collect();
    terms.iter().for_each(|t| f(t));
    if words.len() >= WORDS_KEPT {
        words.clear();
    }
    words.insert(word.into(), terms);
}

/// A word short enough to be held in a map's slot itself: looking one up
/// compares bytes beside the hash, not behind a pointer (a load looks up
/// every word of every memory, and chasing each key's pointer was most of
/// the postings' build).
///
/// Its bytes, then zeros, then its length in the last byte, as three words:
/// compared and hashed a word at a time, not by a call to `memcmp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ShortWord([u64; 3]);

const SHORT_WORD: usize = 23;

impl ShortWord {
    fn new(word: &str) -> Option<ShortWord> {
        let b = word.as_bytes();
        if b.len() > SHORT_WORD {
            return None;
        }
        let mut bytes = [0; SHORT_WORD + 1];
        bytes[..b.len()].copy_from_slice(b);
        bytes[SHORT_WORD] = b.len() as u8;
        let word =
            |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("eight bytes"));
        Some(ShortWord([word(0), word(1), word(2)]))
    }
}

/// What a short word stands for in one index: no term (a stop word), one
/// term id, or several (looked up term by term, as a long word is).
#[derive(Debug, Clone, Copy)]
enum WordTerms {
    None,
    One(u32),
    Many,
}

/// Bytes a short word's entry costs.
const WORD_BYTES: usize = 40;

/// The distinct terms of a query.
pub(super) fn query_terms(text: &str) -> Vec<String> {
    let mut t = terms(text, true);
    t.sort_unstable();
    t.dedup();
    t
}

fn terms(text: &str, query: bool) -> Vec<String> {
    ANALYZER.with(|cell| {
        let mut cell = cell.borrow_mut();
        (cell.get_or_insert_with(analyzer))(text, query)
    })
}

/// A memory's id as the hot index holds it: one allocation, shared by
/// every map and list of the stream's index that names the memory.
pub(super) type Id = std::sync::Arc<str>;

#[derive(Debug)]
struct Doc {
    id: Id,
    /// Its distinct terms, to take it out again.
    terms: Vec<u32>,
    meta: Meta,
}

/// One stream's postings.
#[derive(Debug, Default)]
pub(super) struct TextIndex {
    slots: Vec<Option<Doc>>,
    /// Per slot, its text's token count, repeats counted (what the scoring
    /// loop reads).
    lens: Vec<u32>,
    slot_of: Map<Id, u32>,
    term_ids: Map<String, u32>,
    /// The term ids of the memory being added.
    scratch: Vec<u32>,
    /// The words met so far and their terms' ids.
    words: Map<ShortWord, WordTerms>,
    /// Per term: (slot, count in that memory); dead slots included.
    postings: Vec<Vec<(u32, u32)>>,
    /// Per term: living memories holding it.
    df: Vec<u32>,
    live: usize,
    total_tokens: u64,
    term_bytes: usize,
    posting_count: usize,
}

/// The corpus statistics a score is computed against.
#[derive(Default, Clone, Copy)]
pub(super) struct Stats {
    pub docs: usize,
    pub tokens: u64,
}

/// Drop `items` one by one, calling `step` after each (how a let-go
/// index is freed a step at a time).
pub(super) fn free_each<T>(items: impl IntoIterator<Item = T>, step: &mut dyn FnMut()) {
    for item in items {
        drop(item);
        step();
    }
}

impl TextIndex {
    /// Insert or replace a memory's text.
    pub fn apply(&mut self, id: impl Into<Id>, text: &str, meta: Meta) {
        let id: Id = id.into();
        self.remove(&id);
        // The text's term ids, sorted (in a list kept from one memory to
        // the next).
        let mut tids = std::mem::take(&mut self.scratch);
        tids.clear();
        let (start, tokens) = self.doc_terms(text, &mut tids);
        self.insert(id, &tids[start..], tokens, meta);
        self.scratch = tids;
    }

    /// Insert or replace the texts of a load's memories, in order: as
    /// [`TextIndex::apply`] each, with every term's postings grown once to
    /// what the memories add to it, not doubled as they come.
    pub fn apply_all<'a>(&mut self, docs: impl IntoIterator<Item = (Id, &'a str, Meta)>) {
        let docs: Vec<(Id, &str, Meta)> = docs.into_iter().collect();
        let mut tids: Vec<u32> = Vec::new();
        let mut spans: Vec<(usize, usize)> = Vec::with_capacity(docs.len());
        for (_, text, _) in &docs {
            spans.push(self.doc_terms(text, &mut tids));
        }
        let mut adds = vec![0u32; self.postings.len()];
        for &(start, tokens) in &spans {
            for run in tids[start..start + tokens].chunk_by(|a, b| a == b) {
                adds[run[0] as usize] += 1;
            }
        }
        for (list, &n) in self.postings.iter_mut().zip(&adds) {
            list.reserve(n as usize);
        }
        for ((id, _, meta), &(start, tokens)) in docs.into_iter().zip(&spans) {
            self.remove(&id);
            self.insert(id, &tids[start..start + tokens], tokens, meta);
        }
    }

    /// Append `text`'s term ids to `tids`, sorted, repeats kept: where they
    /// start, and the text's token count.
    fn doc_terms(&mut self, text: &str, tids: &mut Vec<u32>) -> (usize, usize) {
        let start = tids.len();
        WORDS.with(|memo| {
            for word in doc_words(text) {
                let short = ShortWord::new(word);
                match short.and_then(|w| self.words.get(&w)) {
                    Some(WordTerms::None) => continue,
                    Some(&WordTerms::One(tid)) => {
                        tids.push(tid);
                        continue;
                    }
                    Some(WordTerms::Many) | None => {}
                }
                // Not met yet, long, or several terms: the analyzer's
                // terms, each looked up.
                let before = tids.len();
                each_word_term(&mut memo.borrow_mut(), word, |t| tids.push(self.term_id(t)));
                if let Some(w) = short {
                    let terms = match tids[before..] {
                        [] => WordTerms::None,
                        [tid] => WordTerms::One(tid),
                        _ => WordTerms::Many,
                    };
                    if self.words.insert(w, terms).is_none() {
                        self.term_bytes += WORD_BYTES;
                    }
                }
            }
        });
        tids[start..].sort_unstable();
        (start, tids.len() - start)
    }

    /// A new slot for memory `id`, whose text's sorted term ids are `tids`
    /// (`tokens` of them): equal ids side by side are counted.
    fn insert(&mut self, id: Id, tids: &[u32], tokens: usize, meta: Meta) {
        let slot = self.slots.len() as u32;
        let mut distinct: Vec<u32> = Vec::with_capacity(tids.len());
        for run in tids.chunk_by(|a, b| a == b) {
            let tid = run[0];
            self.postings[tid as usize].push((slot, run.len() as u32));
            self.df[tid as usize] += 1;
            distinct.push(tid);
        }
        self.posting_count += distinct.len();
        self.lens.push(tokens as u32);
        self.slot_of.insert(id.clone(), slot);
        self.slots.push(Some(Doc {
            id,
            terms: distinct,
            meta,
        }));
        self.live += 1;
        self.total_tokens += tokens as u64;
    }

    /// A term's id, a new one if the index has not met the term.
    fn term_id(&mut self, term: &str) -> u32 {
        if let Some(&tid) = self.term_ids.get(term) {
            return tid;
        }
        let tid = self.term_ids.len() as u32;
        self.term_bytes += term.len() + TERM_BYTES;
        self.term_ids.insert(term.to_string(), tid);
        self.postings.push(Vec::new());
        self.df.push(0);
        tid
    }

    /// Free the postings entry by entry, calling `step` after each.
    pub fn free_with(self, step: &mut dyn FnMut()) {
        let TextIndex {
            slots,
            slot_of,
            term_ids,
            postings,
            ..
        } = self;
        free_each(slots, step);
        free_each(slot_of, step);
        free_each(term_ids, step);
        free_each(postings, step);
    }

    /// Room for `n` more memories, so a load grows its slots and its id map
    /// once instead of doubling them.
    pub fn reserve(&mut self, n: usize) {
        self.slots.reserve(n);
        self.lens.reserve(n);
        self.slot_of.reserve(n);
    }

    /// Every living memory's id and filter columns, in slot order: a pass
    /// over a vector, without a lookup by id.
    pub fn metas(&self) -> impl Iterator<Item = (&str, &Meta)> {
        self.slots.iter().flatten().map(|d| (&*d.id, &d.meta))
    }

    /// A memory's filter columns.
    pub fn meta(&self, id: &str) -> Option<&Meta> {
        let slot = *self.slot_of.get(id)?;
        self.slots[slot as usize].as_ref().map(|d| &d.meta)
    }

    /// A memory's filter columns changed, its text did not.
    pub fn set_meta(&mut self, id: &str, meta: Meta) {
        if let Some(Some(doc)) = self
            .slot_of
            .get(id)
            .and_then(|&slot| self.slots.get_mut(slot as usize))
        {
            doc.meta = meta;
        }
    }

    /// Take a memory out (its slot stays, dead, until the next sweep).
    pub fn remove(&mut self, id: &str) {
        let Some(slot) = self.slot_of.remove(id) else {
            return;
        };
        let Some(doc) = self.slots[slot as usize].take() else {
            return;
        };
        for &tid in &doc.terms {
            self.df[tid as usize] -= 1;
        }
        self.live -= 1;
        self.total_tokens -= u64::from(self.lens[slot as usize]);
        if self.slots.len() > 1024 && self.slots.len() > 2 * self.live {
            self.sweep();
        }
    }

    /// Drop dead slots and their postings; slots are numbered anew.
    fn sweep(&mut self) {
        let mut renumber = vec![u32::MAX; self.slots.len()];
        let mut slots = Vec::with_capacity(self.live);
        let mut lens = Vec::with_capacity(self.live);
        for (old, doc) in std::mem::take(&mut self.slots).into_iter().enumerate() {
            if let Some(doc) = doc {
                renumber[old] = slots.len() as u32;
                self.slot_of.insert(doc.id.clone(), slots.len() as u32);
                slots.push(Some(doc));
                lens.push(self.lens[old]);
            }
        }
        self.lens = lens;
        self.slots = slots;
        self.posting_count = 0;
        for list in &mut self.postings {
            list.retain_mut(|(slot, _)| {
                *slot = renumber[*slot as usize];
                *slot != u32::MAX
            });
            self.posting_count += list.len();
        }
    }

    pub fn stats(&self) -> Stats {
        Stats {
            docs: self.live,
            tokens: self.total_tokens,
        }
    }

    /// Living memories holding `term`.
    pub fn df(&self, term: &str) -> u32 {
        self.term_ids.get(term).map_or(0, |&t| self.df[t as usize])
    }

    /// The `k` memories meeting `conds` that score best for `terms` by BM25
    /// against `stats` and the terms' document counts `df` (both over every
    /// stream searched), as (score, id); ties go to the smaller id.
    pub fn score(
        &self,
        terms: &[String],
        df: &[u32],
        stats: Stats,
        conds: &[Cond],
        k: usize,
        out: &mut Vec<(f32, String)>,
    ) {
        if stats.docs == 0 || k == 0 {
            return;
        }
        let avg = (stats.tokens as f32 / stats.docs as f32).max(f32::MIN_POSITIVE);
        let n = stats.docs as f32;
        // Dense accumulators: a common word's postings are long.
        let mut acc = vec![0f32; self.slots.len()];
        let mut touched: Vec<u32> = Vec::new();
        for (term, &df) in terms.iter().zip(df) {
            let Some(&tid) = self.term_ids.get(term) else {
                continue;
            };
            let df = df as f32;
            let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
            for &(slot, tf) in &self.postings[tid as usize] {
                let tf = tf as f32;
                let norm = K1 * (1.0 - B + B * self.lens[slot as usize] as f32 / avg);
                let a = &mut acc[slot as usize];
                if *a == 0.0 {
                    touched.push(slot);
                }
                *a += idf * (K1 + 1.0) * tf / (tf + norm);
            }
        }
        let id = |slot: u32| self.slots[slot as usize].as_ref().map_or("", |d| &*d.id);
        let mut hits: Vec<(f32, u32)> = touched
            .into_iter()
            .filter(|&slot| {
                self.slots[slot as usize]
                    .as_ref()
                    .is_some_and(|d| d.meta.meets(conds))
            })
            .map(|slot| (acc[slot as usize], slot))
            .collect();
        let order =
            |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then_with(|| id(a.1).cmp(id(b.1)));
        if hits.len() > k {
            // By score alone first: comparing ids (a lookup and a string
            // compare each) is needed only among the hits that tie with the
            // k-th, and equal scores are common (one shared word, equal lengths).
            hits.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
            let kth = hits[k - 1].0;
            let mut ties: Vec<(f32, u32)> = hits
                .iter()
                .filter(|h| h.0.total_cmp(&kth).is_eq())
                .copied()
                .collect();
            hits.retain(|h| h.0.total_cmp(&kth).is_gt());
            let wanted = k - hits.len();
            if ties.len() > wanted {
                ties.select_nth_unstable_by(wanted - 1, order);
                ties.truncate(wanted);
            }
            hits.extend(ties);
        }
        hits.sort_by(order);
        out.extend(
            hits.into_iter()
                .map(|(score, slot)| (score, id(slot).to_string())),
        );
    }

    /// What the postings hold in memory, roughly.
    pub fn bytes(&self) -> usize {
        self.term_bytes + self.posting_count * POSTING_BYTES + self.slots.len() * 48
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Chunk;

    fn meta(current: bool) -> Meta {
        let mut c = Chunk::new("x".into(), "s".into(), "x".into(), 10);
        if !current {
            c.superseded_by = Some("y".into());
        }
        Meta::of(&c)
    }

    fn ranked(ix: &TextIndex, query: &str, conds: &[Cond]) -> Vec<String> {
        let terms = query_terms(query);
        let df: Vec<u32> = terms.iter().map(|t| ix.df(t)).collect();
        let mut out = Vec::new();
        ix.score(&terms, &df, ix.stats(), conds, usize::MAX, &mut out);
        out.into_iter().map(|(_, id)| id).collect()
    }

    #[test]
    fn terms_are_the_fts_index_terms() {
        // Lower case, stop words out, English stems, accents folded.
        assert_eq!(
            doc_terms("The Runners were running to the Café"),
            ["runner", "run", "cafe"]
        );
        assert_eq!(query_terms("running runs RUN"), ["run"]);
        assert!(query_terms("the of and").is_empty());
    }

    #[test]
    fn words_are_the_runs_of_alphanumeric_characters() {
        for text in [
            "",
            "   ",
            "plain words here",
            "Café naïve — 42x, ½ 東京 ﬁne émoji🙂ok a_b a-b\tc\nd  ",
            "--edge--",
            "x",
            "ÀÉÎ",
            "١٢٣ arabic digits, Ⅻ roman, ² super",
            "e\u{301}tude combining",
        ] {
            let split: Vec<&str> = text
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect();
            assert_eq!(doc_words(text).collect::<Vec<_>>(), split, "{text:?}");
        }
    }

    #[test]
    fn word_by_word_terms_are_the_analyzers_terms() {
        let long = format!("{} {} end", "a".repeat(39), "b".repeat(45));
        let texts = [
            "The Runners were running to the Café",
            "Straße ÉCOLE naïve façade Œuvre",
            "İstanbul DİYARBAKIR ǅemal",
            "e-mail: bob@example.com, call +1 (555) 010-9999 at 9:30am!",
            long.as_str(),
            "don't won't it's O'Neill's",
            "日本語のテキスト 世界 Hello, こんにちは世界!",
            "٣ ١٢ numbers ²³ ½ 3rd 2nd",
            "snake_case CamelCase kebab-case",
            "cafe\u{301} resume\u{301}",
            "🙂 happy\t tabs\nand newlines",
            "",
            "   ...   ",
        ];
        // Twice: the second pass answers from the memo.
        for _ in 0..2 {
            for text in texts {
                assert_eq!(doc_terms(text), terms(text, false), "{text:?}");
            }
        }
    }

    #[test]
    fn rare_words_weigh_more_and_replacements_and_removals_are_followed() {
        let mut ix = TextIndex::default();
        ix.apply("a", "coffee every morning", meta(true));
        ix.apply("b", "coffee and tea", meta(true));
        ix.apply("c", "green tea in the garden", meta(true));
        ix.apply("d", "a garden of roses", meta(true));
        // The shorter text ranks first.
        assert_eq!(ranked(&ix, "coffee", &[]), ["b", "a"]);
        // "garden" is in two memories, "roses" in one: d has both.
        assert_eq!(ranked(&ix, "garden roses", &[]), ["d", "c"]);
        // A new text replaces the old postings.
        ix.apply("a", "espresso at noon", meta(true));
        assert_eq!(ranked(&ix, "coffee", &[]), ["b"]);
        assert_eq!(ix.df("coffe"), 1);
        assert_eq!(ranked(&ix, "espresso", &[]), ["a"]);
        // Filter columns change without the text: the postings stay.
        ix.set_meta("b", meta(false));
        assert!(ranked(&ix, "coffee", &[Cond::Current]).is_empty());
        assert_eq!(ranked(&ix, "coffee", &[]), ["b"]);
        ix.remove("b");
        assert!(ranked(&ix, "coffee", &[]).is_empty());
        assert_eq!(ix.stats().docs, 3);
    }

    #[test]
    fn the_top_k_are_the_first_k_of_the_whole_ranking() {
        let mut ix = TextIndex::default();
        for i in 0..300 {
            // Many equal scores: ties must fall to the smaller id.
            ix.apply(
                format!("m{i:03}").as_str(),
                &format!("alpha beta{} gamma{}", i % 3, i % 11),
                meta(true),
            );
        }
        let terms = query_terms("alpha beta1 gamma4");
        let df: Vec<u32> = terms.iter().map(|t| ix.df(t)).collect();
        let mut all = Vec::new();
        ix.score(&terms, &df, ix.stats(), &[], usize::MAX, &mut all);
        assert_eq!(all.len(), 300);
        for k in [1, 7, 40, 100, 150, 299] {
            let mut top = Vec::new();
            ix.score(&terms, &df, ix.stats(), &[], k, &mut top);
            assert_eq!(top, all[..k], "k = {k}");
        }
    }

    #[test]
    fn sweeping_dead_slots_keeps_every_answer() {
        let mut ix = TextIndex::default();
        for round in 0..4 {
            for i in 0..1000 {
                ix.apply(
                    format!("m{i}").as_str(),
                    &format!("word{} round{round}", i % 7),
                    meta(true),
                );
            }
        }
        assert!(
            ix.slots.len() < 3000,
            "dead slots are swept: {}",
            ix.slots.len()
        );
        assert_eq!(ix.stats().docs, 1000);
        let found = ranked(&ix, "word3 round3", &[]);
        assert_eq!(found.len(), 1000, "every memory has round3");
        assert!(found[..143]
            .iter()
            .all(|id| id[1..].parse::<usize>().unwrap() % 7 == 3));
        assert!(ranked(&ix, "round0", &[]).is_empty());
    }
}
