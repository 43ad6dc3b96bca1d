//! The static embedder (`embed.provider = "static"`): one vector per token,
//! distilled from the installed MiniLM model, so that embedding a text is a
//! tokenizer pass and a weighted sum instead of six transformer layers.
//!
//! Distillation, done once and kept beside the model (`static-v1.bin`):
//! 1. every vocabulary entry is run through MiniLM alone (`[CLS] t [SEP]`),
//!    giving the model's own sentence vector of that token;
//! 2. the mean of those vectors (the direction every text shares) is taken
//!    out of each;
//! 3. each is scaled by a smooth inverse frequency weight, `a / (a + p(t))`,
//!    with `p` a Zipf law over the vocabulary's frequency order (BERT's
//!    WordPiece vocabulary lists words by frequency from `the` on), so that
//!    function words count little and rare words much.
//!
//! A text's vector is the sum of its tokens' rows, scaled to unit length.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use tokenizers::Tokenizer;

use super::minilm::{token_vectors, LoadError};
use super::{EmbedError, Embedder};
use crate::core::vector::l2_normalize;

/// Name recorded in `embed_model`.
pub const MODEL_NAME: &str = "static-all-MiniLM-L6-v2";

/// The distilled table's file, in the model's directory.
pub const TABLE_FILE: &str = "static-v1.bin";

const MAGIC: &[u8; 8] = b"LOOMSTv1";

/// The smooth inverse frequency constant (`a`).
const SIF: f64 = 1e-4;

/// The first vocabulary entry in frequency order (`the` in BERT's uncased
/// vocabulary); entries before it (special tokens, single characters) are
/// taken as the most frequent.
const FIRST_WORD: usize = 1996;

struct Table {
    tokenizer: Tokenizer,
    dim: usize,
    /// `vocab × dim`, row per token id, weighted.
    rows: Vec<f32>,
    /// The token ids of words seen before (see [`Table::ids`]).
    words: std::sync::Mutex<HashMap<String, Vec<u32>>>,
    /// Whether the tokenizer normalises and splits as BERT's does.
    bert: bool,
}

/// Words whose token ids [`Table::ids`] remembers; past it the memo starts over.
const WORD_MEMO: usize = 200_000;

impl Table {
    fn new(tokenizer: Tokenizer, dim: usize, rows: Vec<f32>) -> Table {
        use tokenizers::normalizers::NormalizerWrapper;
        use tokenizers::pre_tokenizers::PreTokenizerWrapper;
        let bert = matches!(
            tokenizer.get_normalizer(),
            Some(NormalizerWrapper::BertNormalizer(_))
        ) && matches!(
            tokenizer.get_pre_tokenizer(),
            Some(PreTokenizerWrapper::BertPreTokenizer(_))
        );
        Table {
            bert,
            tokenizer,
            dim,
            rows,
            words: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut words = self.words.lock().unwrap_or_else(|e| e.into_inner());
        texts
            .iter()
            .map(|text| {
                let mut v = vec![0f32; self.dim];
                for id in self.ids(text, &mut words)? {
                    let start = id as usize * self.dim;
                    if let Some(row) = self.rows.get(start..start + self.dim) {
                        v.iter_mut().zip(row).for_each(|(a, b)| *a += b);
                    }
                }
                l2_normalize(&mut v);
                Ok(v)
            })
            .collect()
    }

    /// The token ids of `text`, as the tokenizer's `encode` gives them
    /// (truncation included), without building its `Encoding` (offsets,
    /// token strings, masks). With BERT's normaliser and pre-tokeniser (the
    /// MiniLM tokenizer's), a text's ids are its space-separated pieces' ids
    /// one after the other: the normaliser works a character at a time (its
    /// accent stripping decomposes, and no combining mark crosses a space),
    /// and the pre-tokeniser splits at every space. So each piece as written
    /// ("Hello,") is tokenised once and remembered in `words`. Another
    /// tokenizer goes through `encode`, and so does a text that may hold one
    /// of the added tokens (`[CLS]`, `[MASK]`…), which `encode` matches
    /// before it normalises.
    fn ids(
        &self,
        text: &str,
        words: &mut HashMap<String, Vec<u32>>,
    ) -> Result<Vec<u32>, EmbedError> {
        if text.contains('[') || !self.bert {
            return self.encoded_ids(text);
        }
        let limit = self
            .tokenizer
            .get_truncation()
            .map_or(usize::MAX, |t| t.max_length);
        if words.len() > WORD_MEMO {
            words.clear();
        }
        let mut ids = Vec::new();
        for piece in text
            .split([' ', '\t', '\n', '\r'])
            .filter(|p| !p.is_empty())
        {
            if ids.len() >= limit {
                break;
            }
            if !words.contains_key(piece) {
                let piece_ids = match self.ascii_ids(piece, words)? {
                    Some(ids) => ids,
                    None => self.encoded_ids(piece)?,
                };
                words.insert(piece.to_string(), piece_ids);
            }
            ids.extend_from_slice(&words[piece]);
        }
        ids.truncate(limit);
        Ok(ids)
    }

    /// The ids of a piece of printable ASCII without `encode`: BERT's
    /// normaliser only lower-cases such text, and its pre-tokeniser splits
    /// it into runs of letters and digits and single punctuation marks,
    /// each run tokenised alone (and remembered in `words`, as a word of
    /// its own). None for any other piece.
    fn ascii_ids(
        &self,
        piece: &str,
        words: &mut HashMap<String, Vec<u32>>,
    ) -> Result<Option<Vec<u32>>, EmbedError> {
        use tokenizers::Model as _;
        if !piece.bytes().all(|b| b.is_ascii_graphic()) {
            return Ok(None);
        }
        let lower = piece.to_ascii_lowercase();
        let mut ids = Vec::new();
        let mut rest = lower.as_str();
        while !rest.is_empty() {
            let end = match rest.find(|c: char| c.is_ascii_punctuation()) {
                Some(0) => 1,
                Some(i) => i,
                None => rest.len(),
            };
            let (word, tail) = rest.split_at(end);
            rest = tail;
            if !words.contains_key(word) {
                let tokens = self
                    .tokenizer
                    .get_model()
                    .tokenize(word)
                    .map_err(EmbedError::tokenizer)?;
                words.insert(word.to_string(), tokens.iter().map(|t| t.id).collect());
            }
            ids.extend_from_slice(&words[word]);
        }
        Ok(Some(ids))
    }

    /// The token ids `encode` gives `text`.
    fn encoded_ids(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(EmbedError::tokenizer)?;
        Ok(enc.get_ids().to_vec())
    }
}

/// The static provider: the distilled table, shared by the blocking tasks
/// that embed with it.
pub struct StaticEmbedder {
    table: Arc<Table>,
}

impl StaticEmbedder {
    /// Load the table distilled from the MiniLM model in `dir`, distilling it
    /// first (a few seconds to a minute) when `dir` holds none, or one made
    /// from other weights. A table that cannot be saved (a read-only
    /// directory) is used all the same. Texts are cut at `max_tokens`.
    pub fn load(dir: &Path, max_tokens: usize) -> Result<StaticEmbedder, LoadError> {
        let (tokenizer, dim, vocab) = super::minilm::tokenizer(dir, max_tokens)?;
        let path = dir.join(TABLE_FILE);
        let stamp = weights_stamp(dir);
        let rows = match read_table(&path, stamp, vocab, dim) {
            Some(rows) => rows,
            None => {
                let rows = distil(token_vectors(dir)?, dim);
                if let Err(e) = write_table(&path, stamp, vocab, dim, &rows) {
                    tracing::warn!(path = %path.display(), "cannot save the static embedding table: {e}");
                }
                rows
            }
        };
        Ok(StaticEmbedder {
            table: Arc::new(Table::new(tokenizer, dim, rows)),
        })
    }
}

/// Steps 2 and 3 of the distillation (see the module's documentation).
fn distil(mut rows: Vec<f32>, dim: usize) -> Vec<f32> {
    let vocab = rows.len() / dim;
    let mut mean = vec![0f64; dim];
    for row in rows.chunks_exact(dim) {
        mean.iter_mut().zip(row).for_each(|(m, x)| *m += *x as f64);
    }
    mean.iter_mut().for_each(|m| *m /= vocab.max(1) as f64);
    // Zipf: p(rank) = 1 / (rank · H), H the harmonic number of the vocabulary.
    let harmonic: f64 = (1..=vocab).map(|r| 1.0 / r as f64).sum();
    for (id, row) in rows.chunks_exact_mut(dim).enumerate() {
        let rank = id.saturating_sub(FIRST_WORD) + 1;
        let p = 1.0 / (rank as f64 * harmonic);
        let weight = SIF / (SIF + p);
        row.iter_mut()
            .zip(&mean)
            .for_each(|(x, m)| *x = ((*x as f64 - m) * weight) as f32);
    }
    rows
}

/// What identifies the weights a table was distilled from: their size.
fn weights_stamp(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("model.safetensors"))
        .map(|m| m.len())
        .unwrap_or(0)
}

fn header(stamp: u64, vocab: usize, dim: usize) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    h.extend(stamp.to_le_bytes());
    h.extend((vocab as u64).to_le_bytes());
    h.extend((dim as u64).to_le_bytes());
    h
}

/// The saved table, if it is whole and was made from these weights for this
/// vocabulary and dimension.
fn read_table(path: &Path, stamp: u64, vocab: usize, dim: usize) -> Option<Vec<f32>> {
    let bytes = std::fs::read(path).ok()?;
    let head = header(stamp, vocab, dim);
    let body = bytes.strip_prefix(head.as_slice())?;
    if body.len() != vocab * dim * 4 {
        return None;
    }
    Some(
        body.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

/// Saved whole or not at all (written aside, then renamed).
fn write_table(
    path: &Path,
    stamp: u64,
    vocab: usize,
    dim: usize,
    rows: &[f32],
) -> std::io::Result<()> {
    let aside: PathBuf = path.with_extension("part");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&aside)?);
    out.write_all(&header(stamp, vocab, dim))?;
    for x in rows {
        out.write_all(&x.to_le_bytes())?;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&aside, path)
}

impl Embedder for StaticEmbedder {
    fn model(&self) -> &str {
        MODEL_NAME
    }

    fn dim(&self) -> usize {
        self.table.dim
    }

    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        Box::pin(async move {
            if texts.is_empty() {
                return Ok(Vec::new());
            }
            let table = self.table.clone();
            let texts = texts.to_vec();
            tokio::task::spawn_blocking(move || table.embed(&texts))
                .await
                .map_err(|e| EmbedError::Provider(format!("static embedder: {e}")))?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_table_is_used_only_whole_and_for_the_same_weights() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TABLE_FILE);
        let rows: Vec<f32> = (0..12).map(|i| i as f32 / 4.0).collect();
        write_table(&path, 99, 3, 4, &rows).unwrap();
        assert_eq!(read_table(&path, 99, 3, 4), Some(rows));
        assert_eq!(read_table(&path, 98, 3, 4), None, "other weights");
        assert_eq!(read_table(&path, 99, 4, 3), None, "another shape");
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 4)
            .unwrap();
        assert_eq!(read_table(&path, 99, 3, 4), None, "torn");
        assert!(!path.with_extension("part").exists());
    }

    /// The installed model's directory: the override, else the default
    /// config's (its `~/` the home directory).
    fn model_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("LOOMEM_EMBED__MODEL_DIR") {
            return PathBuf::from(dir);
        }
        let default = super::super::config::default_model_dir();
        match default.strip_prefix("~") {
            Ok(rest) => std::env::home_dir().expect("a home directory").join(rest),
            Err(_) => default,
        }
    }

    #[test]
    fn token_ids_are_the_tokenizers_own() {
        let (tokenizer, _, _) = super::super::minilm::tokenizer(&model_dir(), 24).unwrap();
        let table = Table::new(tokenizer, 1, Vec::new());
        let mut words = HashMap::new();
        let long = "the quick brown fox jumps over the lazy dog ".repeat(10);
        let texts = [
            "",
            "Hello, world!",
            "I switched from VSCode to Cursor on 2024-03-26.",
            "Café Ünïcödé naïve façade — “quotes” and 'apostrophes' don't",
            "東京で寿司を食べた 2023年",
            "unbelievably antidisestablishmentarianism pneumonoultramicroscopic",
            "tabs\tand\nnew lines\r\n  and   spaces",
            "emoji 🎉🎉 and control \u{7}chars",
            "e-mail alice.smith@example.com, phone +48 123 456 789",
            long.as_str(),
            "Hello, world!",
            "[CLS] a text with [MASK] tokens [SEP]",
            "brackets [like this] are fine",
            "no\u{a0}break\u{85}next\u{2028}line\u{3000}wide",
            "e\u{301} cafe\u{301} \u{301}alone",
            "punctuation...everywhere!!! (really?) \"yes\"",
            "note s123) x_y a~b `tick` {brace} <tag> 50% $3.50 #7 @me ^up |bar \\back",
            "MiXeD CaSe WORDS and ABC123def",
        ];
        for text in texts {
            assert_eq!(
                table.ids(text, &mut words).unwrap(),
                table.encoded_ids(text).unwrap(),
                "{text:?}"
            );
        }
        assert!(table.bert, "MiniLM's tokenizer is BERT's");
        assert!(words.contains_key("Hello,"), "pieces are remembered");
        assert_eq!(table.encoded_ids(&long).unwrap().len(), 24, "truncated");
    }

    #[test]
    fn function_words_weigh_less_than_rare_ones() {
        let dim = 2;
        // Every token's vector is (1, 0) plus a distinct offset; the mean is taken out.
        let vocab = FIRST_WORD + 5000;
        let rows: Vec<f32> = (0..vocab).flat_map(|t| [1.0, (t % 2) as f32]).collect();
        let out = distil(rows, dim);
        let norm = |t: usize| {
            out[t * dim..(t + 1) * dim]
                .iter()
                .map(|x| x * x)
                .sum::<f32>()
                .sqrt()
        };
        // `the` (the first word) against a word 4,000 places down the frequency order.
        assert!(
            norm(FIRST_WORD) * 20.0 < norm(FIRST_WORD + 4000),
            "{} {}",
            norm(FIRST_WORD),
            norm(FIRST_WORD + 4000)
        );
    }
}
