//! The rule that splits a file: the first connection's rate, over short
//! windows from its first byte on.

use std::time::Duration;

use tokio::time::Instant;

/// The first connection's rate is measured over windows this long, from
/// its first byte on...
pub const RATE_WINDOW: Duration = Duration::from_millis(250);

/// ...and a window this old that is already below the rate splits the file.
const FIRST_LOOK: Duration = Duration::from_millis(100);

/// The first connection's current rate window: the rule that splits a
/// file, whether its first connection is read by the parts or as one
/// stream that carries on while it is fast (`carry`).
#[derive(Debug, Clone, Copy)]
pub(in crate::transfer) struct Window {
    since: Instant,
    bytes: u64,
}

impl Window {
    /// A window starting now.
    pub(in crate::transfer) fn new() -> Window {
        Window {
            since: Instant::now(),
            bytes: 0,
        }
    }

    /// Counts `bytes` more; `Some(rate)` once the window is old enough
    /// ([`FIRST_LOOK`]) and its rate is below `split_below` bytes a second:
    /// the file is to be split. A window as long as [`RATE_WINDOW`] that
    /// kept up starts again.
    pub(in crate::transfer) fn slow(&mut self, bytes: u64, split_below: u64) -> Option<f64> {
        self.bytes += bytes;
        let elapsed = self.since.elapsed();
        if elapsed < FIRST_LOOK {
            return None;
        }
        let rate = self.bytes as f64 / elapsed.as_secs_f64();
        if rate < split_below as f64 {
            return Some(rate);
        }
        if elapsed >= RATE_WINDOW {
            *self = Window::new();
        }
        None
    }
}
