//! Recent query vectors. Agents repeat their questions (the same recall on
//! every turn, a retried tool call), and the query embedding is the largest
//! share of a search; a repeated query skips it. Bounded, oldest out first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::core::error::Result;
use crate::providers::embed::Embedder;

/// Query vectors kept.
pub const CAPACITY: usize = 4096;

#[derive(Default)]
pub struct QueryVectors {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    vectors: HashMap<String, Arc<[f32]>>,
    order: VecDeque<String>,
}

impl QueryVectors {
    /// The vector of `query` by `embedder`, embedded only when not seen lately.
    pub async fn embed(&self, embedder: &dyn Embedder, query: &str) -> Result<Arc<[f32]>> {
        let key = format!("{}\u{0}{query}", embedder.model());
        if let Some(v) = self
            .inner
            .lock()
            .expect("query cache lock")
            .vectors
            .get(&key)
        {
            return Ok(v.clone());
        }
        let started = std::time::Instant::now();
        let v: Arc<[f32]> = embedder.embed_query(query).await?.into();
        let m = crate::core::metrics::metrics();
        let labels = [embedder.model(), "query"];
        m.embed_batch.with_label_values(&labels).observe(1.0);
        crate::core::metrics::observe(
            &m.embed_seconds.with_label_values(&labels),
            started.elapsed(),
        );
        let mut inner = self.inner.lock().expect("query cache lock");
        if inner.vectors.insert(key.clone(), v.clone()).is_none() {
            inner.order.push_back(key);
            while inner.order.len() > CAPACITY {
                if let Some(old) = inner.order.pop_front() {
                    inner.vectors.remove(&old);
                }
            }
        }
        Ok(v)
    }

    pub fn len(&self) -> usize {
        self.inner.lock().expect("query cache lock").vectors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::embed::HashEmbedder;

    #[tokio::test]
    async fn a_repeated_query_is_not_embedded_again_and_the_cache_is_bounded() {
        let e = HashEmbedder::new(16);
        let cache = QueryVectors::default();
        let a = cache.embed(&e, "where do I live").await.unwrap();
        let again = cache.embed(&e, "where do I live").await.unwrap();
        assert!(Arc::ptr_eq(&a, &again), "served from the cache");
        assert_eq!(&*a, e.embed_one("where do I live").as_slice());
        for i in 0..CAPACITY + 10 {
            cache.embed(&e, &format!("q{i}")).await.unwrap();
        }
        assert_eq!(cache.len(), CAPACITY);
        let fresh = cache.embed(&e, "where do I live").await.unwrap();
        assert!(!Arc::ptr_eq(&a, &fresh), "the oldest went first");
    }
}
