//! The progress rule across the tries of one address ([`Patience`]): how
//! a failed try counts against the retries of a download.

use std::time::Duration;

use tokio::time::Instant;

/// How a failed try of an address counts.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Progress {
    /// No new kept bytes: the try uses up a retry.
    None,
    /// The kept bytes moved past the best of the earlier tries: the try is
    /// forgiven.
    Forgiven,
    /// The tries together moved too little in the last window: leave the
    /// address.
    TooSlow(String),
}

/// The progress rule across the tries of one address: a try is forgiven
/// only when it moved the durable offset past the best of the earlier
/// tries, and forgiveness ends once the tries together, stalls and backoff
/// included, kept fewer than `network.min_bytes_per_min` bytes in a window.
pub(super) struct Patience {
    /// The best durable offset so far.
    best: u64,
    /// `network.min_bytes_per_min` (0: no floor) and the window it covers.
    floor: (u64, Duration),
    /// When the current window began, and `best` then.
    since: (Instant, u64),
    /// Tries in the current window.
    tries: u32,
}

impl Patience {
    pub(super) fn new(best: u64, floor: (u64, Duration)) -> Patience {
        Patience {
            best,
            floor,
            since: (Instant::now(), best),
            tries: 0,
        }
    }

    /// The kept bytes were thrown away: the next bytes count from zero.
    pub(super) fn discarded(&mut self) {
        self.best = 0;
        self.since.1 = 0;
    }

    /// Classifies a failed try that left `durable` trusted bytes of this
    /// address.
    pub(super) fn after_try(&mut self, durable: u64) -> Progress {
        self.tries += 1;
        let moved = durable > self.best;
        if moved {
            self.best = durable;
        }
        let (floor, window) = self.floor;
        let (start, at_start) = self.since;
        if start.elapsed() >= window {
            let kept = self.best.saturating_sub(at_start);
            if floor > 0 && kept < floor {
                return Progress::TooSlow(format!(
                    "too slow: {kept} bytes kept in {:.0}s over {} tries (minimum {floor} bytes per minute)",
                    start.elapsed().as_secs_f64(),
                    self.tries
                ));
            }
            self.since = (Instant::now(), self.best);
            self.tries = 0;
        }
        if moved {
            Progress::Forgiven
        } else {
            Progress::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn progress_forgives_only_new_bytes_and_only_above_the_floor() {
        let mut p = Patience::new(0, (1000, Duration::from_secs(60)));
        assert_eq!(p.after_try(0), Progress::None);
        assert_eq!(p.after_try(100), Progress::Forgiven);
        // Back at an offset already reached: nothing new.
        assert_eq!(p.after_try(100), Progress::None);
        assert_eq!(p.after_try(50), Progress::None);
        tokio::time::advance(Duration::from_secs(61)).await;
        // 200 bytes in a minute is under the floor, progress or not.
        assert!(matches!(p.after_try(200), Progress::TooSlow(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_above_the_floor_keeps_its_forgiveness() {
        let mut p = Patience::new(0, (1000, Duration::from_secs(60)));
        for minute in 1..=10u64 {
            tokio::time::advance(Duration::from_secs(61)).await;
            assert_eq!(p.after_try(minute * 5000), Progress::Forgiven);
        }
        let mut none = Patience::new(0, (0, Duration::from_secs(60)));
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!(none.after_try(1), Progress::Forgiven);
    }
}
