//! Rate limits: a token bucket per key and role, and a second, smaller one
//! per key for the expensive routes (SQL, exports, dreams, re-embedding,
//! running a job, ingesting with an LLM). A request over either is refused
//! with 429 and `Retry-After`; nothing of it runs. Buckets live in the
//! process: each daemon of a shared data directory counts its own requests.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::{Caller, Role};

/// `[server.rate_limit]`: requests a second and burst per key. A rate of 0
/// means no limit; with `admin_per_sec = 0` (the default) admin keys are
/// not limited at all.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    pub enabled: bool,
    pub reader_per_sec: f64,
    pub reader_burst: f64,
    pub writer_per_sec: f64,
    pub writer_burst: f64,
    pub admin_per_sec: f64,
    pub admin_burst: f64,
    /// The expensive routes' own budget, per key, on top of the role's.
    pub expensive_per_sec: f64,
    pub expensive_burst: f64,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            enabled: true,
            reader_per_sec: 100.0,
            reader_burst: 200.0,
            writer_per_sec: 100.0,
            writer_burst: 200.0,
            admin_per_sec: 0.0,
            admin_burst: 0.0,
            expensive_per_sec: 5.0,
            expensive_burst: 20.0,
        }
    }
}

impl RateLimitConfig {
    /// Every rate and burst is finite and not negative; a limited rate has
    /// a burst of at least one request.
    pub fn validate(&self) -> std::result::Result<(), String> {
        for (name, rate, burst) in [
            ("reader", self.reader_per_sec, self.reader_burst),
            ("writer", self.writer_per_sec, self.writer_burst),
            ("admin", self.admin_per_sec, self.admin_burst),
            ("expensive", self.expensive_per_sec, self.expensive_burst),
        ] {
            if !rate.is_finite() || rate < 0.0 || !burst.is_finite() || burst < 0.0 {
                return Err(format!("{name}_per_sec and {name}_burst must be 0 or more"));
            }
            if rate > 0.0 && burst < 1.0 {
                return Err(format!(
                    "{name}_burst must be at least 1 when {name}_per_sec is set"
                ));
            }
        }
        Ok(())
    }

    fn of(&self, class: Class, role: Role) -> (f64, f64) {
        match (class, role) {
            (Class::Expensive, _) => (self.expensive_per_sec, self.expensive_burst),
            (Class::Normal, Role::Reader) => (self.reader_per_sec, self.reader_burst),
            (Class::Normal, Role::Writer) => (self.writer_per_sec, self.writer_burst),
            (Class::Normal, Role::Admin) => (self.admin_per_sec, self.admin_burst),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Normal,
    Expensive,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Normal => "normal",
            Class::Expensive => "expensive",
        }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Refusals so far, for `/v1/status`.
#[derive(schemars::JsonSchema, Debug, Clone, Default, Serialize)]
pub struct LimitStats {
    pub refused_normal: u64,
    pub refused_expensive: u64,
}

#[derive(Default)]
pub struct RateLimiter {
    cfg: RateLimitConfig,
    buckets: Mutex<HashMap<(String, Class), Bucket>>,
    stats: Mutex<LimitStats>,
}

impl RateLimiter {
    pub fn new(cfg: RateLimitConfig) -> RateLimiter {
        RateLimiter {
            cfg,
            ..Default::default()
        }
    }

    /// Take one request of `caller`'s budget (and of the expensive one for an
    /// expensive route), or refuse it with how long to wait. The caller of
    /// local passthrough mode is not limited.
    pub fn check(&self, caller: &Caller, expensive: bool) -> Result<()> {
        if !self.cfg.enabled || caller.name == crate::service::auth::PASSTHROUGH {
            return Ok(());
        }
        if caller.role == Role::Admin && self.cfg.admin_per_sec <= 0.0 {
            // Admin keys are not limited unless admin_per_sec is set.
            return Ok(());
        }
        let classes: &[Class] = if expensive {
            &[Class::Normal, Class::Expensive]
        } else {
            &[Class::Normal]
        };
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("rate limit lock");
        // Both buckets must have a token before either is taken.
        let mut wait: f64 = 0.0;
        let mut refused = None;
        for &class in classes {
            let (rate, burst) = self.cfg.of(class, caller.role);
            if rate <= 0.0 {
                continue;
            }
            let b = buckets
                .entry((caller.key.clone(), class))
                .or_insert(Bucket {
                    tokens: burst,
                    at: now,
                });
            b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(burst);
            b.at = now;
            if b.tokens < 1.0 {
                wait = wait.max((1.0 - b.tokens) / rate);
                refused.get_or_insert(class);
            }
        }
        if let Some(class) = refused {
            drop(buckets);
            let mut stats = self.stats.lock().expect("rate limit lock");
            match class {
                Class::Normal => stats.refused_normal += 1,
                Class::Expensive => stats.refused_expensive += 1,
            }
            crate::core::metrics::metrics()
                .rate_limited
                .with_label_values(&[caller.role.as_str(), class.as_str()])
                .inc();
            return Err(Error::RateLimited {
                detail: format!(
                    "rate limit: this key's {} budget is spent; retry in {:.1} s",
                    class.as_str(),
                    wait
                ),
                retry_after_secs: wait.ceil() as u64,
            });
        }
        for &class in classes {
            if let Some(b) = buckets.get_mut(&(caller.key.clone(), class)) {
                b.tokens -= 1.0;
            }
        }
        Ok(())
    }

    pub fn stats(&self) -> LimitStats {
        self.stats.lock().expect("rate limit lock").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RateLimitConfig {
        RateLimitConfig {
            writer_per_sec: 1.0,
            writer_burst: 3.0,
            expensive_per_sec: 0.5,
            expensive_burst: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn a_burst_then_refusals_with_the_wait() {
        let limits = RateLimiter::new(cfg());
        let w = Caller::scoped("w", vec!["s".into()]);
        for _ in 0..3 {
            limits.check(&w, false).unwrap();
        }
        match limits.check(&w, false) {
            Err(Error::RateLimited {
                retry_after_secs, ..
            }) => assert_eq!(retry_after_secs, 1),
            other => panic!("{other:?}"),
        }
        // Another key has its own bucket; an admin is not limited here.
        limits
            .check(
                &Caller::scoped("w2", vec!["s".into()]).with_key("w2"),
                false,
            )
            .unwrap();
        for _ in 0..50 {
            limits.check(&Caller::admin("boss"), true).unwrap();
        }
        assert_eq!(limits.stats().refused_normal, 1);
    }

    #[test]
    fn expensive_routes_have_their_own_smaller_budget() {
        let limits = RateLimiter::new(cfg());
        let w = Caller::scoped("w", vec!["s".into()]);
        limits.check(&w, true).unwrap();
        match limits.check(&w, true) {
            Err(Error::RateLimited {
                retry_after_secs,
                detail,
            }) => {
                assert_eq!(retry_after_secs, 2);
                assert!(detail.contains("expensive"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        // The refused request took nothing from the normal budget: two left.
        limits.check(&w, false).unwrap();
        limits.check(&w, false).unwrap();
        assert!(limits.check(&w, false).is_err());
        assert!(RateLimitConfig {
            writer_burst: 0.5,
            ..cfg()
        }
        .validate()
        .is_err());
    }
}
