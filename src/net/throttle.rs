//! The bandwidth cap: one token bucket shared by every transfer of a
//! [`crate::Fetcher`] (`[network] max_bytes_per_sec`).
//!
//! The bucket holds at most one second's worth of bytes, so a burst after a
//! quiet moment is short; it starts empty, so the first second keeps to
//! the cap too (as curl's `--limit-rate`), and a bar shows the cap from the
//! start. A transfer takes tokens for each chunk it
//! received before reading the next; when the bucket is short it goes into
//! debt and sleeps until the debt is paid, which keeps the average rate at
//! the cap whatever the chunk sizes and shares it between transfers in the
//! order they asked.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// A shared token bucket; cheap to clone. `None` inside means unlimited.
#[derive(Debug, Clone, Default)]
pub struct Throttle {
    bucket: Option<Arc<Mutex<Bucket>>>,
}

#[derive(Debug)]
struct Bucket {
    /// Bytes per second.
    rate: f64,
    /// Tokens available now; negative while in debt.
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: Instant,
}

impl Throttle {
    /// A cap of `bytes_per_sec` (`None` or 0: unlimited).
    pub fn new(bytes_per_sec: Option<u64>) -> Throttle {
        let bucket = bytes_per_sec.filter(|r| *r > 0).map(|rate| {
            Arc::new(Mutex::new(Bucket {
                rate: rate as f64,
                tokens: 0.0,
                at: Instant::now(),
            }))
        });
        Throttle { bucket }
    }

    /// Whether a cap is set.
    pub fn is_limited(&self) -> bool {
        self.bucket.is_some()
    }

    /// Accounts for `bytes` just received, waiting as long as the cap
    /// requires.
    pub async fn take(&self, bytes: usize) {
        let Some(bucket) = &self.bucket else {
            return;
        };
        let wait = {
            let mut b = bucket.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
            b.tokens = (b.tokens + elapsed * b.rate).min(b.rate);
            b.at = now;
            b.tokens -= bytes as f64;
            if b.tokens >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-b.tokens / b.rate)
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes a set of transfers gets through in `secs` under a cap,
    /// on tokio's paused clock.
    async fn through(rate: u64, transfers: usize, secs: u64) -> u64 {
        let t = Throttle::new(Some(rate));
        let start = Instant::now();
        let end = start + Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for _ in 0..transfers {
            let t = t.clone();
            tasks.push(tokio::spawn(async move {
                let mut got = 0u64;
                while Instant::now() < end {
                    t.take(16_384).await;
                    got += 16_384;
                }
                got
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.unwrap();
        }
        total
    }

    #[tokio::test(start_paused = true)]
    async fn the_cap_holds_for_one_and_for_two_transfers() {
        let rate = 1_000_000;
        for transfers in [1, 2] {
            let secs = 10;
            let total = through(rate, transfers, secs).await as f64;
            // The cap from the start: the bucket starts empty.
            let expected = (rate * secs) as f64;
            let error = (total - expected).abs() / expected;
            assert!(
                error < 0.05,
                "{transfers} transfer(s): {total} bytes, expected {expected}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn two_transfers_share_the_cap_evenly() {
        let t = Throttle::new(Some(100_000));
        let end = Instant::now() + Duration::from_secs(100);
        let run = |t: Throttle| async move {
            let mut got = 0u64;
            while Instant::now() < end {
                t.take(1000).await;
                got += 1000;
            }
            got
        };
        let (a, b) = tokio::join!(run(t.clone()), run(t.clone()));
        let ratio = a as f64 / b as f64;
        assert!((0.9..1.1).contains(&ratio), "{a} vs {b}");
    }

    #[tokio::test]
    async fn unlimited_never_waits() {
        let t = Throttle::new(None);
        assert!(!t.is_limited());
        let start = std::time::Instant::now();
        for _ in 0..1000 {
            t.take(1 << 20).await;
        }
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
