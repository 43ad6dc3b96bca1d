//! A deterministic embedder for tests and model-free deployments: signed feature
//! hashing of lower-cased words and of their character trigrams, L2-normalised.
//! Texts that share words or word pieces get similar vectors; it knows no synonyms.

use futures::future::BoxFuture;

use super::{l2_normalize, EmbedError, Embedder};

pub struct HashEmbedder {
    dim: usize,
    model: String,
}

impl HashEmbedder {
    pub fn new(dim: usize) -> Self {
        HashEmbedder {
            dim,
            model: format!("hash-{dim}"),
        }
    }

    pub fn embed_one(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0.0f32; self.dim];
        // One buffer for every word ("^word$", lower-cased) and the char
        // boundaries in it: a trigram is the bytes between three of them.
        let (mut padded, mut bounds) = (String::new(), Vec::new());
        for word in text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            padded.clear();
            padded.push('^');
            crate::core::model::push_lowercase(&mut padded, word);
            self.add(&mut v, &padded.as_bytes()[1..], 1.0);
            padded.push('$');
            bounds.clear();
            bounds.extend(padded.char_indices().map(|(i, _)| i));
            bounds.push(padded.len());
            for w in bounds.windows(4) {
                self.add(&mut v, &padded.as_bytes()[w[0]..w[3]], 0.25);
            }
        }
        l2_normalize(&mut v);
        v
    }

    fn add(&self, v: &mut [f32], feature: &[u8], weight: f32) {
        let h = fnv1a(feature);
        let bucket = (h % self.dim as u64) as usize;
        let sign = if (h >> 63) == 0 { 1.0 } else { -1.0 };
        v[bucket] += sign * weight;
    }
}

/// FNV-1a, 64 bit, with MurmurHash3's finaliser so every bit is well mixed:
/// stable across platforms and releases.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

impl Embedder for HashEmbedder {
    fn model(&self) -> &str {
        &self.model
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        Box::pin(async move { Ok(texts.iter().map(|t| self.embed_one(t)).collect()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::embed::dot;

    #[test]
    fn vectors_are_unit_length_and_deterministic() {
        let e = HashEmbedder::new(64);
        let a = e.embed_one("User prefers dark mode");
        assert_eq!(a.len(), 64);
        assert!((dot(&a, &a) - 1.0).abs() < 1e-5);
        assert_eq!(a, e.embed_one("User prefers dark mode"));
    }

    /// The vectors stored by earlier releases stay comparable: the features
    /// are those of the first version (a string per word and per trigram).
    #[test]
    fn vectors_match_the_first_versions_features() {
        fn first_version(e: &HashEmbedder, text: &str) -> Vec<f32> {
            let mut v = vec![0.0f32; e.dim];
            for word in text
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
            {
                let word = word.to_lowercase();
                e.add(&mut v, word.as_bytes(), 1.0);
                let padded: Vec<char> = format!("^{word}$").chars().collect();
                for tri in padded.windows(3) {
                    let s: String = tri.iter().collect();
                    e.add(&mut v, s.as_bytes(), 0.25);
                }
            }
            l2_normalize(&mut v);
            v
        }
        let e = HashEmbedder::new(384);
        for text in [
            "User prefers dark mode in VS Code (note 42)",
            "a I x9 ΟΔΟΣ Straße İstanbul naïve café 東京 — ok",
            "",
        ] {
            assert_eq!(e.embed_one(text), first_version(&e, text), "{text}");
        }
    }

    #[test]
    fn shared_words_score_higher_than_unrelated_text() {
        let e = HashEmbedder::new(384);
        let q = e.embed_one("which editor theme: dark mode?");
        let near = e.embed_one("User prefers dark mode in all tools");
        let far = e.embed_one("The invoice was paid on Tuesday");
        let (near, far) = (dot(&q, &near), dot(&q, &far));
        assert!(
            near > far + 0.1 && near > 2.0 * far,
            "near {near} far {far}"
        );
    }
}
