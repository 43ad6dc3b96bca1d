//! An embedder that remembers: vectors keyed by the SHA-256 of the text, so a
//! text seen before (within a run, or in an earlier run whose cache file is
//! given) is never embedded again. bench-recall uses it: LongMemEval haystacks
//! repeat the same filler sessions across questions.
//!
//! The file is `LMEC1`, the dimension (u32 LE), then records of a 32-byte hash
//! and `dim` f32 LE values; new vectors are appended by [`CachedEmbedder::save`].

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use sha2::{Digest, Sha256};

use super::{EmbedError, Embedder};

const MAGIC: &[u8; 5] = b"LMEC1";

type Key = [u8; 32];

pub struct CachedEmbedder {
    inner: Arc<dyn Embedder>,
    known: Mutex<HashMap<Key, Arc<[f32]>>>,
    /// Vectors embedded since the last save.
    fresh: Mutex<Vec<Key>>,
    file: Option<PathBuf>,
    hits: AtomicU64,
    misses: AtomicU64,
}

fn key(text: &str) -> Key {
    Sha256::digest(text.as_bytes()).into()
}

impl CachedEmbedder {
    /// Wrap `inner`, loading the vectors of `file` when it exists. A file of
    /// another dimension, or damaged, is an error naming it.
    pub fn open(inner: Arc<dyn Embedder>, file: Option<&Path>) -> std::io::Result<CachedEmbedder> {
        let mut known = HashMap::new();
        if let Some(path) = file.filter(|p| p.exists()) {
            let bad = |why: &str| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("embedding cache {}: {why}", path.display()),
                )
            };
            let mut bytes = Vec::new();
            std::fs::File::open(path)?.read_to_end(&mut bytes)?;
            if bytes.len() < 9 || &bytes[..5] != MAGIC {
                return Err(bad("not a loomem embedding cache"));
            }
            let dim = u32::from_le_bytes(bytes[5..9].try_into().expect("4 bytes")) as usize;
            if dim != inner.dim() {
                return Err(bad(&format!(
                    "holds {dim}-dimensional vectors, the embedder makes {}",
                    inner.dim()
                )));
            }
            let record = 32 + dim * 4;
            let body = &bytes[9..];
            if body.len() % record != 0 {
                return Err(bad("truncated record"));
            }
            for r in body.chunks(record) {
                let k: Key = r[..32].try_into().expect("32 bytes");
                let v: Vec<f32> = r[32..]
                    .chunks(4)
                    .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                    .collect();
                known.insert(k, Arc::from(v));
            }
        }
        Ok(CachedEmbedder {
            inner,
            known: Mutex::new(known),
            fresh: Mutex::new(Vec::new()),
            file: file.map(Path::to_path_buf),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// (texts served from the cache, texts embedded).
    pub fn stats(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// Append the vectors embedded since the last save to the file.
    pub fn save(&self) -> std::io::Result<()> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let fresh: Vec<Key> = std::mem::take(&mut *self.fresh.lock().expect("cache lock"));
        if fresh.is_empty() {
            return Ok(());
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let new_file = !path.exists();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let mut buf = Vec::new();
        if new_file {
            buf.extend_from_slice(MAGIC);
            buf.extend_from_slice(&(self.inner.dim() as u32).to_le_bytes());
        }
        let known = self.known.lock().expect("cache lock");
        for k in fresh {
            if let Some(v) = known.get(&k) {
                buf.extend_from_slice(&k);
                for x in v.iter() {
                    buf.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        f.write_all(&buf)
    }
}

impl Embedder for CachedEmbedder {
    fn model(&self) -> &str {
        self.inner.model()
    }

    fn dim(&self) -> usize {
        self.inner.dim()
    }

    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        Box::pin(async move {
            let keys: Vec<Key> = texts.iter().map(|t| key(t)).collect();
            let missing: Vec<usize> = {
                let known = self.known.lock().expect("cache lock");
                let mut seen = std::collections::HashSet::new();
                (0..texts.len())
                    .filter(|&i| !known.contains_key(&keys[i]) && seen.insert(keys[i]))
                    .collect()
            };
            if !missing.is_empty() {
                let batch: Vec<String> = missing.iter().map(|&i| texts[i].clone()).collect();
                let vectors = self.inner.embed(&batch).await?;
                let mut known = self.known.lock().expect("cache lock");
                let mut fresh = self.fresh.lock().expect("cache lock");
                for (&i, v) in missing.iter().zip(vectors) {
                    known.insert(keys[i], Arc::from(v));
                    fresh.push(keys[i]);
                }
            }
            self.misses
                .fetch_add(missing.len() as u64, Ordering::Relaxed);
            self.hits
                .fetch_add((texts.len() - missing.len()) as u64, Ordering::Relaxed);
            let known = self.known.lock().expect("cache lock");
            Ok(keys.iter().map(|k| known[k].to_vec()).collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::HashEmbedder;
    use super::*;

    /// Counts the texts it is asked to embed.
    struct Counting(HashEmbedder, AtomicU64);

    impl Embedder for Counting {
        fn model(&self) -> &str {
            self.0.model()
        }
        fn dim(&self) -> usize {
            self.0.dim()
        }
        fn embed<'a>(
            &'a self,
            texts: &'a [String],
        ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
            self.1.fetch_add(texts.len() as u64, Ordering::Relaxed);
            self.0.embed(texts)
        }
    }

    fn texts(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn each_text_is_embedded_once_within_and_across_runs() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cache/hash-16.bin");
        let inner = Arc::new(Counting(HashEmbedder::new(16), AtomicU64::new(0)));
        let cache = CachedEmbedder::open(inner.clone(), Some(&file)).unwrap();
        let a = cache
            .embed(&texts(&["tea", "coffee", "tea"]))
            .await
            .unwrap();
        assert_eq!(a[0], a[2]);
        assert_eq!(a[0], HashEmbedder::new(16).embed_one("tea"));
        cache.embed(&texts(&["coffee"])).await.unwrap();
        assert_eq!(inner.1.load(Ordering::Relaxed), 2);
        assert_eq!(cache.stats(), (2, 2));
        cache.save().unwrap();

        // A later run reads the file and embeds only what is new.
        let inner2 = Arc::new(Counting(HashEmbedder::new(16), AtomicU64::new(0)));
        let again = CachedEmbedder::open(inner2.clone(), Some(&file)).unwrap();
        let b = again
            .embed(&texts(&["coffee", "tea", "milk"]))
            .await
            .unwrap();
        assert_eq!(b[1], a[0]);
        assert_eq!(inner2.1.load(Ordering::Relaxed), 1);
        again.save().unwrap();
        let third = CachedEmbedder::open(Arc::new(HashEmbedder::new(16)), Some(&file)).unwrap();
        third.embed(&texts(&["milk"])).await.unwrap();
        assert_eq!(third.stats(), (1, 0));

        // Another dimension is refused, naming the file.
        let err = CachedEmbedder::open(Arc::new(HashEmbedder::new(8)), Some(&file))
            .err()
            .unwrap();
        assert!(err.to_string().contains("hash-16.bin"), "{err}");
    }
}
