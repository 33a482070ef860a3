//! Work stealing: a part that finished its range takes the next missing
//! range no part has taken, else the upper half of the largest range
//! still to come, leaving its connection what it has on the way; a part
//! with nothing to take waits ([`idle`]) until a range moves or may be
//! worth hedging.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::map::{Slot, MIN_PART_BYTES};

/// An idle part with nothing to take looks again this often while others
/// still run (a range may become worth hedging), and at once whenever a
/// range moves.
pub(super) const IDLE_LOOK: Duration = Duration::from_millis(250);

/// Gives slot `i` the next missing range no part has taken, else the upper
/// half of the largest range still to come ([`steal_point`], `in_flight`
/// telling what a slot's connection has on the way); whether it did. Never
/// while `i`'s own range is unfinished: then a hedge that overtook its
/// connection still reads it, and a new range in its slot would end that
/// hedge and lose the rest of the range (a gap in the file).
pub(super) fn take_over(
    slots: &mut [Slot],
    pending: &mut std::collections::VecDeque<(u64, u64)>,
    i: usize,
    in_flight: impl Fn(&Slot) -> u64,
) -> bool {
    if slots[i].next < slots[i].end {
        return false;
    }
    if let Some((next, end)) = pending.pop_front() {
        slots[i].assign(next, end);
        return true;
    }
    let largest = slots
        .iter()
        .map(|s| s.end.saturating_sub(s.next))
        .enumerate()
        .max_by_key(|&(_, rest)| rest);
    let Some((j, _)) = largest else {
        return false;
    };
    let (next, end) = (slots[j].next, slots[j].end);
    let Some(mid) = steal_point(next, end, in_flight(&slots[j])) else {
        return false;
    };
    slots[j].end = mid;
    slots[i].assign(mid, end);
    true
}

/// Where a part takes over the range `[next, end)` of another whose
/// connection has about `in_flight` bytes of it on the way: the upper half,
/// but never those bytes (they would come twice, and the other's request is
/// cut where its range now ends); `None` when less than [`MIN_PART_BYTES`]
/// would be left to either.
pub(super) fn steal_point(next: u64, end: u64, in_flight: u64) -> Option<u64> {
    let rest = end.saturating_sub(next);
    let mid = next + (rest / 2).max(in_flight);
    (rest >= 2 * MIN_PART_BYTES && end.saturating_sub(mid) >= MIN_PART_BYTES).then_some(mid)
}

/// What an idle part finds when it looks for work.
pub(super) enum Look<T> {
    /// Something to take.
    Take(T),
    /// Nothing now, but other parts still run.
    Wait,
    /// The file is done, or nothing is left for this part.
    Done,
}

/// An idle part waiting for work: `look` now, then again as soon as a
/// range moves (taken over, or done: the last range's end ends every idle
/// part at once, not at its next look) and at least every [`IDLE_LOOK`]
/// (a range may become worth hedging); `None` once `look` is done or the
/// run stops.
pub(super) async fn idle<T>(
    stop: &CancellationToken,
    moved: &tokio::sync::Notify,
    mut look: impl FnMut() -> Look<T>,
) -> Option<T> {
    loop {
        if stop.is_cancelled() {
            return None;
        }
        // Listening before looking: a move in between is not missed.
        let notified = moved.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match look() {
            Look::Take(next) => return Some(next),
            Look::Done => return None,
            Look::Wait => {}
        }
        tokio::select! {
            () = stop.cancelled() => return None,
            () = &mut notified => {}
            () = tokio::time::sleep(IDLE_LOOK) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn an_idle_part_ends_when_the_last_range_is_done_not_at_its_next_look() {
        let stop = CancellationToken::new();
        let moved = tokio::sync::Notify::new();
        let done = std::sync::atomic::AtomicBool::new(false);
        let started = Instant::now();
        let waiting = idle(&stop, &moved, || {
            if done.load(std::sync::atomic::Ordering::SeqCst) {
                Look::<()>::Done
            } else {
                Look::Wait
            }
        });
        let finishing = async {
            // The last range ends a little after the part went idle.
            tokio::time::sleep(Duration::from_millis(10)).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            moved.notify_waiters();
        };
        let (ended, ()) = tokio::join!(waiting, finishing);
        assert_eq!(ended, None);
        // The clock is paused: only a sleep moves it.
        assert_eq!(started.elapsed(), Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_part_looks_again_while_nothing_moves() {
        let stop = CancellationToken::new();
        let moved = tokio::sync::Notify::new();
        let looks = std::sync::atomic::AtomicU32::new(0);
        let started = Instant::now();
        let found = idle(&stop, &moved, || {
            match looks.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                0..=2 => Look::Wait,
                _ => Look::Take(7),
            }
        })
        .await;
        // A range that became worth hedging is found at a look.
        assert_eq!(found, Some(7));
        assert_eq!(started.elapsed(), IDLE_LOOK * 3);
    }

    #[test]
    fn a_steal_takes_the_upper_half_but_not_what_is_on_the_way() {
        let m = MIN_PART_BYTES;
        assert_eq!(steal_point(0, 8 * m, 0), Some(4 * m));
        assert_eq!(steal_point(0, 8 * m, m), Some(4 * m));
        // Most of the rest is on the way already: only what is beyond it.
        assert_eq!(steal_point(0, 8 * m, 6 * m), Some(6 * m));
        assert_eq!(steal_point(0, 8 * m, 7 * m + 1), None);
        assert_eq!(steal_point(0, 2 * m - 1, 0), None);
    }

    #[test]
    fn a_part_whose_range_a_hedge_still_reads_takes_no_new_one() {
        let m = 1u64 << 20;
        let mut slots = vec![Slot::new(0, m), Slot::new(m, 8 * m)];
        let mut pending = std::collections::VecDeque::new();
        // Slot 0's connection fell behind the hedge of its range, which
        // still reads it: nothing may take its slot, or the rest of its
        // range would be lost.
        assert!(!take_over(&mut slots, &mut pending, 0, |_| 0));
        assert_eq!((slots[0].next, slots[0].end), (0, m));
        assert_eq!((slots[1].next, slots[1].end), (m, 8 * m));
        pending.push_back((9 * m, 10 * m));
        assert!(!take_over(&mut slots, &mut pending, 0, |_| 0));
        assert_eq!(pending.len(), 1);
        // Once the hedge has finished it: the missing range, then the
        // upper half of the largest.
        slots[0].next = m;
        assert!(take_over(&mut slots, &mut pending, 0, |_| 0));
        assert_eq!((slots[0].next, slots[0].end), (9 * m, 10 * m));
        slots[0].next = 10 * m;
        assert!(take_over(&mut slots, &mut pending, 0, |_| 0));
        assert_eq!((slots[1].next, slots[1].end), (m, 4 * m + m / 2));
        assert_eq!((slots[0].next, slots[0].end), (4 * m + m / 2, 8 * m));
    }
}
