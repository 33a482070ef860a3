//! The part map: which range of the file each part's connection reads
//! ([`Slot`]), the missing ranges and how they are first shared out, and
//! which bytes of a chunk are new ([`take`]): each byte is written once,
//! by the first connection that brings it.

use std::time::Duration;

use tokio::time::Instant;

/// No part is split below this: a range is stolen only when at least twice
/// this much of it is still to come. Small enough that near the end every
/// connection keeps working (and that `connections_per_file` connections
/// all get a range on any file above [`PARTS_MIN_BYTES`](super::PARTS_MIN_BYTES)),
/// large enough that a new request's round trips stay small against its
/// bytes.
pub const MIN_PART_BYTES: u64 = 256 << 10;

/// A range is measured this long before its rate can ask for a hedge
/// (and a hedged one again before another).
pub(super) const HEDGE_LOOK: Duration = Duration::from_millis(250);

/// One part's range: the next byte it receives and where it stops.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    /// The next byte to be written: every connection reading this range
    /// writes only bytes from here on, so a byte that arrives twice (a
    /// hedged range) is written once, by whichever connection brought it
    /// first.
    pub(super) next: u64,
    pub(super) end: u64,
    /// Bumped each time the slot is given a new range, so that a connection
    /// still reading for an earlier one stops.
    pub(super) turn: u64,
    /// When the current range was given, and the bytes written into it
    /// since: its rate.
    pub(super) since: Instant,
    pub(super) got: u64,
    /// Hedges of this range so far (connections that asked for its rest
    /// once more).
    pub(super) hedges: u32,
}

impl Slot {
    pub(super) fn new(next: u64, end: u64) -> Slot {
        Slot {
            next,
            end,
            turn: 0,
            since: Instant::now(),
            got: 0,
            hedges: 0,
        }
    }

    /// Gives the slot the range `[next, end)`.
    pub(super) fn assign(&mut self, next: u64, end: u64) {
        *self = Slot {
            turn: self.turn + 1,
            ..Slot::new(next, end)
        };
    }

    /// Bytes a second this slot's connection wrote into its range so far,
    /// once it has been measured long enough ([`HEDGE_LOOK`]).
    pub(super) fn rate(&self, now: Instant) -> Option<f64> {
        let elapsed = now.duration_since(self.since);
        (elapsed >= HEDGE_LOOK).then(|| self.got as f64 / elapsed.as_secs_f64())
    }

    /// Seconds this slot's connection would still need at its rate so
    /// far, once it has been measured long enough.
    pub(super) fn eta(&self, now: Instant) -> Option<f64> {
        if self.next >= self.end {
            return None;
        }
        let rate = self.rate(now)?;
        Some((self.end - self.next) as f64 / rate.max(1.0))
    }
}

/// What one connection works on: a slot's range as of one turn, as its
/// owner or as a hedge of another connection's range.
#[derive(Debug, Clone, Copy)]
pub(super) struct Task {
    pub(super) slot: usize,
    pub(super) turn: u64,
    pub(super) hedge: bool,
}

/// The missing ranges of `[offset, size)`: those between the kept
/// `ranges` (sorted, apart, after `offset`).
pub(super) fn missing(offset: u64, size: u64, ranges: &[[u64; 2]]) -> Vec<(u64, u64)> {
    let mut gaps = Vec::new();
    let mut at = offset;
    for &[s, e] in ranges {
        if s > at {
            gaps.push((at, s.min(size)));
        }
        at = at.max(e);
    }
    if at < size {
        gaps.push((at, size));
    }
    gaps
}

/// The first ranges: the first missing range for the first connection,
/// and an empty one for each other part, up to `n` parts in all and one
/// per [`MIN_PART_BYTES`] still missing; they take over ranges once the
/// file is split.
pub(super) fn first_slots(gaps: &[(u64, u64)], n: usize) -> Vec<Slot> {
    let missing: u64 = gaps.iter().map(|(s, e)| e - s).sum();
    let count = (missing / MIN_PART_BYTES).clamp(1, n as u64);
    let (next, end) = gaps.first().copied().unwrap_or((0, 0));
    let mut slots = vec![Slot::new(end, end); count as usize];
    slots[0].next = next;
    slots
}

/// Cuts the first slot's range into equal ones over all slots (each of at
/// least [`MIN_PART_BYTES`] when it can). The first slot keeps the lowest,
/// which its connection may be reading already: up to `asked`, where its
/// request ends, when that is within its range (the first request of a
/// fresh file asks for its share only), the others sharing the rest; else
/// an equal share. Every other slot gets a range of its own to ask for
/// exactly. So no request reaches past its range's end, as it would if the
/// ranges were halved one after another, or if the first asked for the
/// whole file: a request cut short wastes what is on the way on its
/// connection, up to a window (megabytes on a far, fast link).
pub(super) fn share_first(slots: &mut [Slot], asked: u64) {
    let (offset, size) = (slots[0].next, slots[0].end);
    let keep = asked > offset && asked < size && slots.len() > 1;
    let from = if keep { asked } else { offset };
    let sharing = slots.len() - usize::from(keep);
    let rest = size.saturating_sub(from);
    let count = (rest / MIN_PART_BYTES).clamp(1, sharing as u64);
    let step = rest / count;
    let first = usize::from(keep);
    for k in 0..count {
        let start = from + k * step;
        let end = if k + 1 == count { size } else { start + step };
        let slot = first + k as usize;
        if slot == 0 {
            slots[0].end = end;
        } else {
            slots[slot].assign(start, end);
        }
    }
    if keep {
        slots[0].end = asked;
    }
}

/// Where the first request of a fresh file of `size` bytes ends (exclusive)
/// when the file may be fetched in up to `parts` parts: its share of the
/// file. Once the file is split, the first connection keeps that range and
/// the other parts share the rest, so no request is cut short; a first
/// connection fast enough to be left alone asks for the rest on the same
/// connection when its share is done.
pub(in crate::transfer) fn first_share_end(size: u64, parts: usize) -> u64 {
    let count = (size / MIN_PART_BYTES).clamp(1, parts.max(1) as u64);
    (size / count).max(MIN_PART_BYTES.min(size))
}

/// What one chunk of a connection adds to its range.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Take {
    /// The bytes `[from, to)` of the file are new: written by this chunk.
    Write(u64, u64),
    /// Nothing new, but the connection may go on (a hedge catching up
    /// with the bytes the range's first connection already brought).
    Skip,
    /// The range is done, or was given another turn: stop.
    Done,
    /// Another connection of the range is ahead: stop, its bytes win.
    Behind,
}

/// What the chunk `[from, from + len)` of a connection adds to `slot`'s
/// range, and the slot once it took it: each byte is taken once, by the
/// first connection that brings it.
pub(super) fn take(slot: &mut Slot, task: Task, from: u64, len: u64, wrote: u64) -> Take {
    if slot.turn != task.turn || slot.next >= slot.end {
        return Take::Done;
    }
    let (lo, hi) = (from.max(slot.next), (from + len).min(slot.end));
    if hi > lo {
        slot.next = hi;
        slot.got += hi - lo;
        return Take::Write(lo, hi);
    }
    if task.hedge && wrote == 0 {
        Take::Skip
    } else {
        Take::Behind
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_connection_has_the_rest_and_the_others_take_it_over() {
        let size = 100 + 10 * MIN_PART_BYTES + 7;
        let slots = first_slots(&missing(100, size, &[]), 8);
        assert_eq!(slots.len(), 8);
        assert_eq!((slots[0].next, slots[0].end), (100, size));
        assert!(slots[1..].iter().all(|s| s.next == s.end));
        assert_eq!(first_slots(&missing(0, MIN_PART_BYTES, &[]), 8).len(), 1);
        let mut spread = slots.clone();
        share_first(&mut spread, size);
        assert_eq!(spread[0].next, 100);
        for w in spread.windows(2) {
            assert_eq!(w[0].end, w[1].next);
        }
        assert_eq!(spread[7].end, size);
    }

    #[test]
    fn a_range_that_arrives_twice_is_written_once() {
        let mut slot = Slot::new(1000, 2000);
        let owner = Task {
            slot: 0,
            turn: 0,
            hedge: false,
        };
        let hedge = Task {
            hedge: true,
            ..owner
        };
        assert_eq!(
            take(&mut slot, owner, 1000, 100, 0),
            Take::Write(1000, 1100)
        );
        // The hedge asked from 1000 too: what the owner brought is skipped,
        // and the hedge goes on.
        assert_eq!(take(&mut slot, hedge, 1000, 60, 0), Take::Skip);
        assert_eq!(
            take(&mut slot, hedge, 1060, 100, 0),
            Take::Write(1100, 1160)
        );
        // The owner is behind now: it stops, the hedge's bytes win.
        assert_eq!(take(&mut slot, owner, 1100, 50, 100), Take::Behind);
        assert_eq!(
            take(&mut slot, hedge, 1160, 1000, 60),
            Take::Write(1160, 2000)
        );
        assert_eq!(slot.got, 1000, "each byte taken once");
        assert_eq!(take(&mut slot, owner, 1150, 10, 100), Take::Done);
        // A range given another turn (stolen, reassigned) stops the rest.
        slot.assign(3000, 4000);
        assert_eq!(take(&mut slot, hedge, 3000, 10, 0), Take::Done);
    }

    #[test]
    fn the_first_range_is_shared_out_equally_once_the_file_is_split() {
        let size = 16 << 20;
        let mut slots = first_slots(&missing(0, size, &[]), 8);
        // The first connection has read some of it meanwhile.
        slots[0].next = 300_000;
        let turn = slots[0].turn;
        // Its request asked for the whole file (a resumed one, `bytes=N-`).
        share_first(&mut slots, size);
        assert_eq!((slots[0].next, slots[0].turn), (300_000, turn));
        let step = (size - 300_000) / 8;
        for (k, w) in slots.windows(2).enumerate() {
            assert_eq!(w[0].end, w[1].next, "slot {k} meets the next");
            assert_eq!(w[0].end - w[0].next, step, "equal shares: {slots:?}");
        }
        assert_eq!(slots[7].end, size);
    }

    #[test]
    fn the_first_connection_keeps_the_share_its_request_asked_for() {
        let size = 16 << 20;
        let asked = first_share_end(size, 8);
        assert_eq!(asked, 2 << 20);
        let mut slots = first_slots(&missing(0, size, &[]), 8);
        slots[0].next = 300_000;
        share_first(&mut slots, asked);
        // Its range ends where its request does: nothing of it is cut.
        assert_eq!((slots[0].next, slots[0].end), (300_000, asked));
        let step = (size - asked) / 7;
        for (k, w) in slots.windows(2).enumerate() {
            assert_eq!(w[0].end, w[1].next, "slot {k} meets the next");
            if k > 0 {
                assert_eq!(w[0].end - w[0].next, step, "equal shares: {slots:?}");
            }
        }
        assert_eq!(slots[7].end, size);
        // A request that reached past its range's end, or one already
        // over, leaves equal shares of what is left.
        let mut past = first_slots(&missing(0, size, &[]), 8);
        past[0].next = 3 << 20;
        share_first(&mut past, asked);
        assert_eq!(past[0].end, (3 << 20) + (size - (3 << 20)) / 8);
        // Small files: one share each of at least the least part.
        assert_eq!(first_share_end(1 << 20, 8), 256 << 10);
        assert_eq!(first_share_end(100, 8), 100);
    }

    #[test]
    fn only_the_ranges_between_kept_ones_are_missing() {
        assert_eq!(
            missing(10, 100, &[[20, 30], [40, 100]]),
            vec![(10, 20), (30, 40)]
        );
        assert_eq!(missing(10, 100, &[[20, 30]]), vec![(10, 20), (30, 100)]);
        assert_eq!(missing(0, 100, &[]), vec![(0, 100)]);
    }
}
