//! Hedging: near the end, when nothing is left worth splitting, an idle
//! part asks once more for the rest of the range that would finish last,
//! when that range's connection would need more than [`HEDGE_FACTOR`]
//! times what the idle one would. Both read the range; each byte is
//! written once, by whichever connection brings it first
//! ([`take`](super::map::take)).

use std::time::Duration;

use tokio::time::Instant;

use super::map::{Slot, Task};

/// Hedges of one range at most: a hedge's own connection may be slow too.
const MAX_HEDGES: u32 = 3;

/// A range is hedged when its connection would finish it more than this
/// many times later than an idle one, set-up included...
const HEDGE_FACTOR: f64 = 2.0;

/// ...counting this much for the idle one's new request until a part's
/// request has been timed (then the slowest request-to-answer seen).
pub(super) const HEDGE_SETUP: Duration = Duration::from_millis(500);

/// A second request for the rest of the range that would finish last,
/// when its connection would need more than [`HEDGE_FACTOR`] times what
/// an idle one at `rate` would (its new request, `setup`, counted), and
/// the waste allowed (`left` bytes, less the range's rest once taken)
/// leaves room for it. Whichever connection brings a byte first writes
/// it; the one left behind stops.
pub(super) fn hedge(
    slots: &mut [Slot],
    rate: Option<f64>,
    setup: Duration,
    left: &mut u64,
    now: Instant,
) -> Option<Task> {
    let setup = setup.as_secs_f64();
    // A part that wrote nothing yet counts at the fastest range's rate.
    let rate = rate.or_else(|| {
        slots
            .iter()
            .filter_map(|s| s.rate(now))
            .max_by(f64::total_cmp)
    })?;
    let (j, _) = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.hedges < MAX_HEDGES)
        .filter_map(|(j, s)| {
            let slow = s.eta(now)?;
            let fast = (s.end - s.next) as f64 / rate.max(1.0) + setup;
            (slow > HEDGE_FACTOR * fast).then_some((j, slow))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let rest = slots[j].end - slots[j].next;
    if *left < rest {
        return None;
    }
    *left -= rest;
    // Its rate from now on is that of every connection reading it: a
    // hedge that is slow too is hedged again.
    let s = &mut slots[j];
    s.hedges += 1;
    s.since = now;
    s.got = 0;
    Some(Task {
        slot: j,
        turn: s.turn,
        hedge: true,
    })
}
