//! One honest measure of a transfer's progress: the bytes this run
//! received, the current rate over a sliding window, the time left, and
//! how long nothing has arrived. Bars, progress events and status rows all
//! read it, so they say the same.
//!
//! - Bytes kept from an earlier run ([`Meter::resumed`]) count towards the
//!   position, never towards the rate.
//! - The rate is what arrived in the last [`WINDOW`] divided by the time
//!   that window covers *up to now*: while nothing arrives it falls towards
//!   zero instead of freezing at its last value.
//! - In the first second the time covered is at least [`MIN_SPAN`], so a
//!   burst at the start (a socket buffer, a bandwidth cap's bucket) does
//!   not read as a rate many times the real one.
//! - The time left is unknown (`None`) while the rate is zero or nothing
//!   has arrived for [`STALLED_AFTER`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How far back the current rate looks.
pub const WINDOW: Duration = Duration::from_secs(3);

/// The shortest time a rate is taken over.
pub const MIN_SPAN: Duration = Duration::from_secs(1);

/// After this long with no byte, a transfer is stalled.
pub const STALLED_AFTER: Duration = Duration::from_secs(2);

/// Samples kept (older ones beyond the window are dropped).
const MAX_SAMPLES: usize = 256;

/// The shortest time between two samples.
const SAMPLE_EVERY: Duration = Duration::from_millis(40);

/// A transfer's progress, fed with its byte count as it grows.
#[derive(Debug, Clone)]
pub struct Meter {
    /// When this run started (or was last reset by a resume).
    started: Instant,
    /// `(when, bytes)`, oldest first, within the window.
    samples: VecDeque<(Instant, u64)>,
    /// The latest byte count (the resumed offset included).
    bytes: u64,
    /// When the byte count last grew.
    last_growth: Instant,
}

impl Meter {
    /// A meter starting now at 0 bytes.
    pub fn new(now: Instant) -> Meter {
        Meter {
            started: now,
            samples: VecDeque::from([(now, 0)]),
            bytes: 0,
            last_growth: now,
        }
    }

    /// The transfer continues `offset` kept bytes: they are the position,
    /// and the rate counts from here.
    pub fn resumed(&mut self, now: Instant, offset: u64) {
        self.started = now;
        self.samples.clear();
        self.samples.push_back((now, offset));
        self.bytes = offset;
        self.last_growth = now;
    }

    /// The byte count is now `bytes` (a count that goes back, as when an
    /// attempt starts over, restarts the rate there).
    pub fn update(&mut self, now: Instant, bytes: u64) {
        if bytes < self.bytes {
            self.resumed(now, bytes);
            return;
        }
        if bytes > self.bytes {
            self.last_growth = now;
        }
        self.bytes = bytes;
        // One sample per SAMPLE_EVERY at most: a fast transfer reports
        // thousands of times a second.
        let several = self.samples.len() > 1;
        match self.samples.back_mut() {
            Some((t, b)) if several && now.saturating_duration_since(*t) < SAMPLE_EVERY => {
                *b = bytes;
            }
            _ => self.samples.push_back((now, bytes)),
        }
        // Keep one sample at or before the window's start.
        while self.samples.len() > MAX_SAMPLES
            || self
                .samples
                .get(1)
                .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// The byte count last given.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// When this run started (or resumed).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The current rate in bytes per second: what arrived in the last
    /// [`WINDOW`] (in the run's first [`WINDOW`], since it started, over
    /// at least [`MIN_SPAN`]).
    pub fn rate(&self, now: Instant) -> f64 {
        let Some(&(_, first)) = self.samples.front() else {
            return 0.0;
        };
        let elapsed = now.saturating_duration_since(self.started);
        if elapsed < WINDOW {
            let span = elapsed.max(MIN_SPAN).as_secs_f64();
            return self.bytes.saturating_sub(first) as f64 / span;
        }
        let edge = now - WINDOW;
        // The count at the window's start: that of the last sample then.
        let at_edge = self
            .samples
            .iter()
            .rev()
            .find(|(t, _)| *t <= edge)
            .map_or(first, |(_, b)| *b);
        self.bytes.saturating_sub(at_edge) as f64 / WINDOW.as_secs_f64()
    }

    /// How long nothing has arrived, once that is [`STALLED_AFTER`] or more.
    pub fn stalled_for(&self, now: Instant) -> Option<Duration> {
        let idle = now.saturating_duration_since(self.last_growth);
        (idle >= STALLED_AFTER).then_some(idle)
    }

    /// The time left to reach `total`, when it can be told.
    pub fn time_left(&self, now: Instant, total: u64) -> Option<Duration> {
        if self.stalled_for(now).is_some() {
            return None;
        }
        let rate = self.rate(now);
        if rate < 1.0 {
            return None;
        }
        let left = total.saturating_sub(self.bytes) as f64 / rate;
        (left.is_finite() && left < 365.0 * 86_400.0).then(|| Duration::from_secs_f64(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_resumed_prefix_never_counts_as_rate() {
        let t0 = Instant::now();
        let mut m = Meter::new(t0);
        m.resumed(t0, 17 * MIB);
        // 2.2 MiB/s for 3 s after the resume.
        for i in 1..=30 {
            m.update(
                t0 + Duration::from_millis(100 * i),
                17 * MIB + (22 * MIB / 100) * i,
            );
        }
        let now = t0 + Duration::from_secs(3);
        let rate = m.rate(now) / MIB as f64;
        assert!((2.0..2.4).contains(&rate), "{rate} MiB/s");
        let left = m.time_left(now, 40 * MIB).unwrap().as_secs_f64();
        assert!((6.0..9.0).contains(&left), "{left} s left");
    }

    #[test]
    fn during_a_stall_the_rate_falls_and_the_time_left_is_unknown() {
        let t0 = Instant::now();
        let mut m = Meter::new(t0);
        for i in 1..=20 {
            m.update(t0 + Duration::from_millis(100 * i), MIB * i / 10);
        }
        let t1 = t0 + Duration::from_secs(2);
        let before = m.rate(t1);
        assert!(m.time_left(t1, 10 * MIB).is_some());
        let later = t1 + Duration::from_secs(4);
        assert!(
            m.rate(later) < before / 2.0,
            "{} then {}",
            before,
            m.rate(later)
        );
        assert_eq!(m.stalled_for(later), Some(Duration::from_secs(4)));
        assert_eq!(m.time_left(later, 10 * MIB), None);
        let much_later = t1 + Duration::from_secs(30);
        assert!(m.rate(much_later) < 1.0, "{}", m.rate(much_later));
        // Bytes again: the stall ends, the rate follows.
        m.update(much_later + Duration::from_millis(100), 2 * MIB + 1);
        assert_eq!(m.stalled_for(much_later + Duration::from_millis(100)), None);
    }

    #[test]
    fn a_burst_at_the_start_is_spread_over_a_second_at_least() {
        let t0 = Instant::now();
        let mut m = Meter::new(t0);
        // 4 MiB in the first 50 ms (a socket buffer), then 1 MiB/s.
        m.update(t0 + Duration::from_millis(50), 4 * MIB);
        let early = m.rate(t0 + Duration::from_millis(100)) / MIB as f64;
        assert!(early <= 4.0 + 1e-9, "{early} MiB/s after 100 ms");
        for i in 1..=20u64 {
            m.update(
                t0 + Duration::from_millis(50 + 100 * i),
                4 * MIB + MIB * i / 10,
            );
        }
        let later = m.rate(t0 + Duration::from_millis(2050)) / MIB as f64;
        assert!(later < 4.0, "{later} MiB/s after 2 s");
        // Past the window, only the steady rate remains.
        for i in 21..=80u64 {
            m.update(
                t0 + Duration::from_millis(50 + 100 * i),
                4 * MIB + MIB * i / 10,
            );
        }
        let steady = m.rate(t0 + Duration::from_millis(8050)) / MIB as f64;
        assert!((0.9..1.2).contains(&steady), "{steady} MiB/s steady");
    }

    #[test]
    fn a_count_that_goes_back_restarts_the_rate() {
        let t0 = Instant::now();
        let mut m = Meter::new(t0);
        m.update(t0 + Duration::from_secs(1), 5 * MIB);
        m.update(t0 + Duration::from_secs(2), MIB);
        assert_eq!(m.bytes(), MIB);
        assert!(m.rate(t0 + Duration::from_secs(3)) < 0.5 * MIB as f64 + 1.0);
    }
}
