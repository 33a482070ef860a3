//! The rule that splits a file: the first connection's rate, over short
//! windows from its first byte on, unless the connection was held back by
//! the writer (the disk, the hash) for a share of the window: then the file
//! already comes at this machine's pace, and more connections would bring
//! it no sooner (they would add work on the same cores and disk instead).

use std::time::Duration;

use tokio::time::Instant;

/// The first connection's rate is measured over windows this long, from
/// its first byte on...
pub const RATE_WINDOW: Duration = Duration::from_millis(250);

/// ...and a window this old that is already below the rate splits the file.
const FIRST_LOOK: Duration = Duration::from_millis(100);

/// A window in which the connection waited for the writer at least this
/// share of the time ran at the writer's pace: it does not split the file.
/// A writer that keeps up never holds the connection back (its channel has
/// room), so any steady share means the disk or the hash sets the pace.
const HELD_SHARE: f64 = 0.25;

/// The first connection's current rate window: the rule that splits a
/// file, whether its first connection is read by the parts or as one
/// stream that carries on while it is fast (`carry`).
#[derive(Debug, Clone, Copy)]
pub(in crate::transfer) struct Window {
    since: Instant,
    bytes: u64,
    /// How long the connection waited for the writer in this window.
    held: Duration,
}

impl Window {
    /// A window starting now.
    pub(in crate::transfer) fn new() -> Window {
        Window {
            since: Instant::now(),
            bytes: 0,
            held: Duration::ZERO,
        }
    }

    /// Counts `bytes` more, which the connection brought while it waited
    /// `held` for the writer to take earlier ones; `Some(rate)` once the
    /// window is old enough ([`FIRST_LOOK`]) and its rate is below
    /// `split_below` bytes a second, unless the writer held the connection
    /// back for [`HELD_SHARE`] of it or more: the file is to be split. A
    /// window as long as [`RATE_WINDOW`] that kept up (or ran at the
    /// writer's pace) starts again.
    pub(in crate::transfer) fn slow(
        &mut self,
        bytes: u64,
        held: Duration,
        split_below: u64,
    ) -> Option<f64> {
        self.bytes += bytes;
        self.held += held;
        let elapsed = self.since.elapsed();
        if elapsed < FIRST_LOOK {
            return None;
        }
        let rate = self.bytes as f64 / elapsed.as_secs_f64();
        let ours = self.held.as_secs_f64() >= HELD_SHARE * elapsed.as_secs_f64();
        if rate < split_below as f64 && !ours {
            return Some(rate);
        }
        if elapsed >= RATE_WINDOW {
            *self = Window::new();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 64 KiB every 10 ms: about 6.5 MB/s, below a threshold of 64 MiB/s.
    const PIECE: u64 = 64 << 10;
    const EVERY: Duration = Duration::from_millis(10);

    #[tokio::test(start_paused = true)]
    async fn a_slow_connection_splits_the_file() {
        let mut window = Window::new();
        let mut split = None;
        for _ in 0..30 {
            tokio::time::sleep(EVERY).await;
            split = split.or(window.slow(PIECE, Duration::ZERO, 64 << 20));
        }
        let rate = split.expect("a connection at 6.5 MB/s is split");
        assert!((rate - 6_553_600.0).abs() < 100_000.0, "{rate}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_held_back_by_the_writer_is_not_split() {
        // The same bytes at the same pace, but each piece waited 4 ms of
        // its 10 for the writer (the disk, the hash): the file comes at
        // this machine's pace, and more connections would not help.
        let mut window = Window::new();
        for _ in 0..100 {
            tokio::time::sleep(EVERY).await;
            let held = Duration::from_millis(4);
            assert_eq!(window.slow(PIECE, held, 64 << 20), None);
        }
        // Held back a little (1 ms in 10, a checkpoint's flush): the
        // connection itself is slow, and the file is split.
        let mut window = Window::new();
        let mut split = None;
        for _ in 0..30 {
            tokio::time::sleep(EVERY).await;
            split = split.or(window.slow(PIECE, Duration::from_millis(1), 64 << 20));
        }
        assert!(split.is_some());
    }
}
