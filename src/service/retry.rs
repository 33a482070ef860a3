//! The periodic retry of failed required files (`service.retry_failed_after`).
//!
//! A long-lived service does not wait for the next app start to try a
//! required file again: `retry_failed_after` after its download failed, it
//! is queued again. A file that keeps failing waits twice as long each time,
//! up to eight times the setting or an hour, whichever is shorter (10, 20,
//! 40, 60, 60… minutes with the default of ten; a setting longer than an
//! hour is kept as it is), and never less than a server's `Retry-After`
//! among the failed attempts (at most a day).
//! A success, here or by any other call, resets the count.
//!
//! When the timer fires, the file is queued only if an installed gem still
//! declares it as required (with the same SHA-256 and addresses) and it is
//! not in the store: files of uninstalled gems are not retried, and lazy
//! ("on first use") files wait for their next `path` call.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::error::{AttemptError, Error};

/// The longest wait the doubling reaches (unless the setting is longer).
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// The doubling stops at this many times the setting (or an hour).
const MAX_GROWTH: u32 = 8;
/// The longest `Retry-After` honoured by the periodic retry.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);

/// The retry timers of one scheduler, by job key.
#[derive(Debug, Default)]
pub(crate) struct Retries {
    pending: Mutex<HashMap<String, Pending>>,
}

/// The retry state of one job key.
#[derive(Debug)]
struct Pending {
    /// Failures in a row.
    failures: u32,
    /// Stops the timer that waits for the next try.
    timer: CancellationToken,
    /// When the next try is due, while its timer waits (the status row's
    /// `next_try`).
    due: Option<SystemTime>,
    /// The wait of a timer not started yet (see [`Retries::arm`]).
    unarmed: Option<Duration>,
}

impl Retries {
    fn pending(&self) -> MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one more failure of `key` and returns the count with a fresh
    /// timer token (the previous timer, if any, is stopped).
    pub(crate) fn failed(&self, key: &str) -> (u32, CancellationToken) {
        let mut pending = self.pending();
        let entry = pending.entry(key.to_string()).or_insert_with(|| Pending {
            failures: 0,
            timer: CancellationToken::new(),
            due: None,
            unarmed: None,
        });
        entry.timer.cancel();
        entry.failures = entry.failures.saturating_add(1);
        entry.timer = CancellationToken::new();
        entry.due = None;
        entry.unarmed = None;
        (entry.failures, entry.timer.clone())
    }

    /// Notes that the next try of `key` is due after `wait` (from now),
    /// for a timer started by [`Retries::arm`]; returns when that is.
    pub(crate) fn plan(&self, key: &str, wait: Duration) -> Option<SystemTime> {
        let mut pending = self.pending();
        let entry = pending.get_mut(key)?;
        let due = SystemTime::now().checked_add(wait)?;
        entry.due = Some(due);
        entry.unarmed = Some(wait);
        Some(due)
    }

    /// The wait and the timer token of the planned try of `key`, once: the
    /// caller starts that timer.
    pub(crate) fn arm(&self, key: &str) -> Option<(Duration, CancellationToken)> {
        let mut pending = self.pending();
        let entry = pending.get_mut(key)?;
        let wait = entry.unarmed.take()?;
        Some((wait, entry.timer.clone()))
    }

    /// When the next try of `key` is due, while its timer waits.
    pub(crate) fn due(&self, key: &str) -> Option<SystemTime> {
        self.pending().get(key).and_then(|p| p.due)
    }

    /// `key` succeeded: its count starts over and its timer stops.
    pub(crate) fn succeeded(&self, key: &str) {
        if let Some(p) = self.pending().remove(key) {
            p.timer.cancel();
        }
    }

    /// The timer of `key` fired: forgets it, unless a later failure
    /// replaced it (then `false`).
    pub(crate) fn fired(&self, key: &str, timer: &CancellationToken) -> bool {
        if timer.is_cancelled() {
            return false;
        }
        match self.pending().get_mut(key) {
            Some(entry) => {
                entry.due = None;
                true
            }
            None => false,
        }
    }
}

/// How long to wait before the next try after `failures` failures in a
/// row: `base · 2^(failures−1)`, at most `8 · base` or an hour, whichever is
/// shorter (and never less than `base`), and at least `retry_after`, the
/// server's wish (at most a day).
pub(crate) fn delay(base: Duration, failures: u32, retry_after: Option<Duration>) -> Duration {
    let doublings = failures.saturating_sub(1).min(32);
    let grown = base.saturating_mul(1u32 << doublings.min(31));
    let ceiling = base.saturating_mul(MAX_GROWTH).min(MAX_BACKOFF).max(base);
    let backoff = grown.min(ceiling);
    match retry_after {
        Some(wait) => backoff.max(wait.min(MAX_RETRY_AFTER)),
        None => backoff,
    }
}

/// How long the servers of `error` asked to be left alone: the shortest
/// `Retry-After` among its attempts, and only when every attempt gave one.
/// One address's wish (a mirror's "come back in an hour") never holds back
/// the addresses that asked for nothing.
pub(crate) fn retry_after(error: &Error) -> Option<Duration> {
    match error {
        Error::Unavailable { attempts, .. } => {
            let asked: Option<Vec<Duration>> = attempts
                .iter()
                .map(|a| match &a.error {
                    AttemptError::Http { retry_after, .. } => *retry_after,
                    _ => None,
                })
                .collect();
            asked?.into_iter().min()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable(waits: &[Option<u64>]) -> Error {
        let attempts = waits
            .iter()
            .enumerate()
            .map(|(i, wait)| crate::error::Attempt {
                address: url::Url::parse(&format!("https://cdn{i}.test/m.bin")).unwrap(),
                hop: None,
                error: match wait {
                    Some(secs) => AttemptError::Http {
                        status: 503,
                        retry_after: Some(Duration::from_secs(*secs)),
                        body: None,
                    },
                    None => AttemptError::Network {
                        reason: "connection reset".into(),
                    },
                },
            })
            .collect();
        Error::Unavailable {
            resource: "m".into(),
            attempts,
        }
    }

    #[test]
    fn one_address_asking_for_an_hour_does_not_hold_back_the_others() {
        assert_eq!(retry_after(&unavailable(&[Some(3600), None])), None);
        assert_eq!(
            retry_after(&unavailable(&[Some(3600), Some(2)])),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&unavailable(&[Some(5)])),
            Some(Duration::from_secs(5))
        );
    }

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn the_wait_doubles_up_to_an_hour_and_never_goes_below_the_setting() {
        let ten = 10 * MIN;
        let waits: Vec<u64> = (1..=6)
            .map(|n| delay(ten, n, None).as_secs() / 60)
            .collect();
        assert_eq!(waits, [10, 20, 40, 60, 60, 60]);
        assert_eq!(delay(ten, u32::MAX, None), 60 * MIN);
        // A short setting grows to eight times itself.
        let five = Duration::from_secs(5);
        let waits: Vec<u64> = (1..=6).map(|n| delay(five, n, None).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 40, 40]);
        // A setting longer than an hour is kept as it is.
        assert_eq!(delay(120 * MIN, 5, None), 120 * MIN);
        assert_eq!(delay(ten, 0, None), ten);
    }

    #[test]
    fn a_servers_retry_after_is_waited_for_but_never_shortens_the_wait() {
        let ten = 10 * MIN;
        assert_eq!(delay(ten, 1, Some(30 * MIN)), 30 * MIN);
        assert_eq!(delay(ten, 1, Some(MIN)), ten);
        assert_eq!(
            delay(ten, 1, Some(Duration::from_secs(u64::MAX))),
            MAX_RETRY_AFTER
        );
    }

    #[test]
    fn a_success_starts_the_count_over_and_a_new_failure_stops_the_old_timer() {
        let retries = Retries::default();
        let (n, first) = retries.failed("k");
        assert_eq!(n, 1);
        let (n, second) = retries.failed("k");
        assert_eq!(n, 2);
        assert!(first.is_cancelled());
        assert!(!retries.fired("k", &first));
        assert!(retries.fired("k", &second));
        retries.succeeded("k");
        assert!(second.is_cancelled());
        assert_eq!(retries.failed("k").0, 1);
    }
}
