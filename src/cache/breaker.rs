//! The circuit breaker: after a failure the cache is left alone for a
//! while, so a registry that is down costs one bounded wait, not one per
//! file. Once that while is over, the next file asks again (one try: a
//! failure opens the breaker again, a success closes it).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Whether the cache may be asked now.
#[derive(Debug)]
pub(crate) struct Breaker {
    /// How long it stays open after a failure.
    cooldown: Duration,
    /// Open until then.
    open_until: Mutex<Option<Instant>>,
}

impl Breaker {
    /// A closed breaker that stays open `cooldown` after each failure.
    pub(crate) fn new(cooldown: Duration) -> Breaker {
        Breaker {
            cooldown,
            open_until: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.open_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the cache may be asked.
    pub(crate) fn allows(&self) -> bool {
        self.lock().is_none_or(|until| Instant::now() >= until)
    }

    /// A failure: the cache is left alone for the cooldown. True when
    /// the breaker was closed until now (the failure is then worth a
    /// warning; those that follow in flight are not).
    pub(crate) fn trip(&self) -> bool {
        let mut open = self.lock();
        let was_closed = open.is_none_or(|until| Instant::now() >= until);
        *open = Some(Instant::now() + self.cooldown);
        was_closed
    }

    /// A success: the cache is asked again for every file.
    pub(crate) fn reset(&self) {
        *self.lock() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_opens_it_for_the_cooldown_and_a_success_closes_it() {
        let b = Breaker::new(Duration::from_secs(60));
        assert!(b.allows());
        assert!(b.trip());
        assert!(!b.allows());
        assert!(!b.trip(), "a second failure in flight is not news");
        b.reset();
        assert!(b.allows());
        let short = Breaker::new(Duration::ZERO);
        short.trip();
        assert!(short.allows(), "half-open once the cooldown is over");
    }
}
