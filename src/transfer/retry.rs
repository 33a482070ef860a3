//! What to do after a failed attempt: the one place that classifies
//! failures.
//!
//! - **Transient**, retried on the *same* address (with `Range` when bytes
//!   are kept) after an exponential backoff with full jitter: connect
//!   errors, resets, stalls and other network failures, `408`, `429` and
//!   `5xx`, an unreachable proxy or one answering `CONNECT` with `5xx`. The
//!   server or the path to it may recover.
//! - **Permanent**, moving on to the next address at once: the scheme, the
//!   address rule, the user's policy, other `4xx` (from a proxy too: `403`,
//!   `407`), too many redirects, a
//!   wrong size or digest, a server certificate that fails verification
//!   ([`AttemptError::Certificate`]: the same server presents the same
//!   certificate) and a name that does not exist or has no address
//!   ([`AttemptError::UnknownHost`]: `NXDOMAIN` is the name server's
//!   answer, not an outage). Asking the same address again gives the same
//!   answer.
//!
//! The wait before retry `n` (0-based) is a uniformly random duration in
//! `[0, min(base · 2ⁿ, MAX_BACKOFF)]` ("full jitter"), so clients that
//! failed together do not come back together. A `Retry-After` on `429` or
//! `503` replaces the backoff when it is at most `network.retry_after_max_secs`;
//! a longer one means "not this address, not now": move on.
//!
//! An attempt that moved the kept (durable) bytes of its address past every
//! earlier try made progress, so the retries used before it are given back
//! (`retries = 0` still means one try per address): a link that
//! drops every few hundred megabytes still finishes a multi-gigabyte file.
//! A try that received bytes but kept nothing new (no validator, or a
//! server that starts over) counts like any other failure. Forgiveness is
//! bounded: once the tries of an address together keep fewer than
//! `network.min_bytes_per_min` in a minute, stalls and backoff included,
//! the next address is tried ([`download`](mod@crate::transfer::download)).

use std::time::Duration;

use crate::error::AttemptError;

/// Longest backoff between two tries of one address.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

impl AttemptError {
    /// Whether trying the same address again later may succeed
    /// (decided by [`is_transient`]).
    pub fn is_transient(&self) -> bool {
        is_transient(self)
    }
}

/// Whether another try of the same address may succeed.
pub fn is_transient(error: &AttemptError) -> bool {
    match error {
        AttemptError::Network { .. } => true,
        AttemptError::Http { status, .. } => matches!(status, 408 | 429 | 500..=599),
        // An unreachable proxy may come back, and a 5xx says the proxy could
        // not reach the address this time. A 403 or 407 is the proxy's
        // standing answer: asking again gets it again.
        AttemptError::Proxy { status, .. } => status.is_none_or(|s| (500..=599).contains(&s)),
        _ => false,
    }
}

/// The retry settings of `[network]`.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries of one address after the first, counting only failed tries
    /// that kept no new bytes.
    pub retries: u32,
    /// Backoff base: the first retry waits up to this long, doubling.
    pub backoff: Duration,
    /// Longest `Retry-After` honoured; a longer one moves on.
    pub retry_after_max: Duration,
}

/// The defaults of `[network] retries`, `retry_backoff_secs` and
/// `retry_after_max_secs` (the configuration takes them from here).
impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 5,
            backoff: Duration::from_secs(1),
            retry_after_max: Duration::from_secs(120),
        }
    }
}

/// What to do after one failed attempt of an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Try the same address again after this wait.
    Retry(Duration),
    /// Go on to the next address now.
    NextAddress,
}

impl RetryPolicy {
    /// Decides after a failure. `retry` counts the retries of this address
    /// already used (tries that made progress do not count).
    pub fn decide(&self, error: &AttemptError, retry: u32) -> Decision {
        if !is_transient(error) || retry >= self.retries {
            return Decision::NextAddress;
        }
        if let AttemptError::Http {
            status: 429 | 503,
            retry_after: Some(wait),
            ..
        } = error
        {
            return if *wait <= self.retry_after_max {
                Decision::Retry(*wait)
            } else {
                Decision::NextAddress
            };
        }
        Decision::Retry(jitter(self.backoff_ceiling(retry)))
    }

    /// The longest backoff before retry `retry`.
    pub fn backoff_ceiling(&self, retry: u32) -> Duration {
        self.backoff
            .saturating_mul(1u32 << retry.min(16))
            .min(MAX_BACKOFF)
    }
}

/// A uniformly random duration in `[0, ceiling]`.
fn jitter(ceiling: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // A fresh random seed per call, from the standard library's hasher
    // keys: enough for spreading retries, no extra dependency.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(ceiling.as_nanos());
    let fraction = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
    ceiling.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16, retry_after: Option<u64>) -> AttemptError {
        AttemptError::Http {
            status,
            retry_after: retry_after.map(Duration::from_secs),
            body: None,
        }
    }

    #[test]
    fn a_refused_certificate_and_an_unknown_name_are_permanent() {
        let certificate = AttemptError::Certificate {
            reason: "TLS: the server's certificate is not trusted: it has expired".into(),
        };
        let unknown = AttemptError::UnknownHost {
            reason: "DNS: no address for gone.test".into(),
        };
        let policy = RetryPolicy::default();
        for e in [certificate, unknown] {
            assert!(!is_transient(&e), "{e}");
            assert_eq!(policy.decide(&e, 0), Decision::NextAddress, "{e}");
            assert_eq!(e.code().as_str(), "E_RESOURCE_NETWORK");
        }
    }

    #[test]
    fn transient_and_permanent_failures() {
        let network = AttemptError::Network {
            reason: "reset".into(),
        };
        assert!(is_transient(&network));
        for s in [408, 429, 500, 502, 503, 599] {
            assert!(is_transient(&http(s, None)), "{s}");
        }
        for s in [400, 401, 403, 404, 410, 416] {
            assert!(!is_transient(&http(s, None)), "{s}");
        }
        let size = AttemptError::Size {
            expected: 1,
            detail: "x".into(),
        };
        assert!(!is_transient(&size));
        let proxy = |status| AttemptError::Proxy {
            status,
            reason: "x".into(),
        };
        assert!(is_transient(&proxy(None)));
        for s in [502, 503, 504] {
            assert!(is_transient(&proxy(Some(s))), "{s}");
        }
        for s in [400, 403, 407] {
            assert!(!is_transient(&proxy(Some(s))), "{s}");
        }
    }

    #[test]
    fn backoff_has_full_jitter_under_a_doubling_ceiling() {
        let p = RetryPolicy {
            retries: 10,
            backoff: Duration::from_millis(100),
            retry_after_max: Duration::from_secs(120),
        };
        assert_eq!(p.backoff_ceiling(0), Duration::from_millis(100));
        assert_eq!(p.backoff_ceiling(3), Duration::from_millis(800));
        assert_eq!(p.backoff_ceiling(30), MAX_BACKOFF);
        let net = AttemptError::Network { reason: "x".into() };
        let waits: Vec<Duration> = (0..50)
            .map(|_| match p.decide(&net, 2) {
                Decision::Retry(w) => w,
                Decision::NextAddress => panic!("should retry"),
            })
            .collect();
        assert!(waits.iter().all(|w| *w <= Duration::from_millis(400)));
        assert!(waits.iter().any(|w| *w != waits[0]), "no jitter");
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.decide(&http(503, Some(7)), 0),
            Decision::Retry(Duration::from_secs(7))
        );
        assert_eq!(
            p.decide(&http(429, Some(120)), 0),
            Decision::Retry(Duration::from_secs(120))
        );
        assert_eq!(p.decide(&http(429, Some(121)), 0), Decision::NextAddress);
        assert_eq!(p.decide(&http(404, Some(1)), 0), Decision::NextAddress);
        assert_eq!(
            p.decide(&http(503, Some(1)), p.retries),
            Decision::NextAddress
        );
    }
}
