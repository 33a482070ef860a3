//! A large file in ranged parts over several connections.
//!
//! A file of at least [`PARTS_MIN_BYTES`] asks for its first share as a
//! range (`Range: bytes=0-E`, an eighth with 8 parts; a resumed one the rest
//! after kept bytes, with `If-Range`). When the server answers with a `206`
//! whose `Content-Range` is exactly that range and a validator (a strong
//! `ETag`, else `Last-Modified`), the file may be split: that first
//! response is read as one stream while its rate is measured, and only
//! when it is below [`SPLIT_BELOW_BYTES_PER_SEC`] (a connection capped by
//! its server, or a slow link), or when it came [`FAR_ANSWER`] or more
//! after its request (a far server), do up to `network.connections_per_file`
//! parts (at most `service.max_per_host`) take over equal ranges of the
//! rest, each asked for exactly, with `Range` and `If-Range` (the first
//! connection keeps the share it asked for, so its request is not cut
//! short either). A first connection that is not split asks for the rest
//! on the same connection when its share is done. A
//! connection faster than that is left alone: past it, more connections add
//! work (decryption, a read-back of the bytes written ahead of the hashed
//! prefix) on the same cores instead of speed. A part that finishes takes
//! over the upper half of the largest range still to come (work stealing,
//! down to [`MIN_PART_BYTES`]), leaving its connection what it has on the
//! way (its rate over a request-to-answer time): a request cut short wastes
//! those bytes, up to a window. Near the end, when nothing is left worth
//! splitting, an idle part hedges: when a range's connection would need
//! more than twice what the idle one would for the rest of it (a new
//! request counted, at the slowest request-to-answer time the parts have
//! seen), the idle one asks for that rest once more. Both read the same
//! range and a byte is written once, by whichever connection brings it
//! first; the one left behind stops, at once once the range is done (not
//! at its next chunk, which a slow connection may send a second later),
//! so the file is finished when its last byte is written. A range whose hedge is
//! slow too is hedged again (at most three times). Hedges ask for
//! at most an eighth of the file again, so the origin sends at most about a quarter
//! more than the file. One slow connection so does not set the finishing
//! time.
//!
//! Every part is one exchange like a single stream's: each hop checked
//! (scheme, policy, address, via the proxy when there is one), its host's
//! connection slot taken, the live policy watched, the stall timer and the
//! progress floor per connection, the bandwidth cap shared by all. A part's
//! `206` must be exactly the bytes asked for, with the same validator;
//! anything else (a `200`, another range or total, another validator) is
//! refused: every part stops and the file is fetched once more as one
//! stream. Any other failure of one part stops every part, and the try
//! fails as a single stream's would.
//!
//! The parts write at their offsets through one writer thread
//! (`scatter`) that keeps one SHA-256 over the whole file;
//! memory stays bounded: with 8 parts, at most 16 batches of 256 KiB in
//! the channel, a batch being gathered per part and a 1 MiB read-back
//! buffer, about 7.5 MiB besides the connections' own buffers. Progress is
//! one stream per file: the bytes of all parts together.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::error::AttemptError;
use crate::net::hosts::HostPermit;
use crate::net::response::Response;
use crate::store::partial::{Checkpointer, PartialPaths};
use crate::transfer::body::{attempt_error, check_finished, local_write, size_error, Body};
use crate::transfer::exchange::{validator, Ask, HeadError};
use crate::transfer::fetch::{Expected, Fetcher, Reporter, Transfer, TransferError};
use crate::transfer::scatter::{self, Scatter};
use crate::transfer::sink::{BodySink, Written, BATCH_BYTES};

/// Files smaller than this are one request each.
pub const PARTS_MIN_BYTES: u64 = 8 << 20;

/// No part is split below this: a range is stolen only when at least twice
/// this much of it is still to come. Small enough that near the end every
/// connection keeps working (and that `connections_per_file` connections
/// all get a range on any file above [`PARTS_MIN_BYTES`]), large enough
/// that a new request's round trips stay small against its bytes.
pub const MIN_PART_BYTES: u64 = 256 << 10;

/// A range is measured this long before its rate can ask for a hedge
/// (and a hedged one again before another).
const HEDGE_LOOK: Duration = Duration::from_millis(250);

/// Hedges of one range at most: a hedge's own connection may be slow too.
const MAX_HEDGES: u32 = 3;

/// A range is hedged when its connection would finish it more than this
/// many times later than an idle one, set-up included...
const HEDGE_FACTOR: f64 = 2.0;

/// ...counting this much for the idle one's new request until a part's
/// request has been timed (then the slowest request-to-answer seen).
const HEDGE_SETUP: Duration = Duration::from_millis(500);

/// An idle part with nothing to take looks again this often while others
/// still run (a range may become worth hedging), and at once whenever a
/// range moves.
const IDLE_LOOK: Duration = Duration::from_millis(250);

pub use crate::transfer::fetch::{FAR_ANSWER, SPLIT_BELOW_BYTES_PER_SEC};

/// The first connection's rate is measured over windows this long, from
/// its first byte on...
pub const RATE_WINDOW: Duration = Duration::from_millis(250);

/// ...and a window this old that is already below the rate splits the file.
const FIRST_LOOK: Duration = Duration::from_millis(100);

/// The accepted answer to the first request, which becomes the first part.
pub(super) struct FirstPart {
    /// The hop that answered.
    pub hop: Url,
    /// Its `206`, from `offset` to `end`.
    pub response: Response,
    /// Its host's connection slot.
    pub permit: HostPermit,
    /// How long it took to answer once its slot was free.
    pub answered: Duration,
    /// Where its body starts (the kept prefix before it).
    pub offset: u64,
    /// Where its body ends: at most the first kept range after `offset`
    /// (a fresh file asks for its first share only, [`first_share_end`]).
    pub end: u64,
    /// The kept ranges beyond the prefix (`[start, end)`, sorted, apart):
    /// only the ranges between them are asked for.
    pub ranges: Vec<[u64; 2]>,
    /// The validator every part must match.
    pub validator: String,
    /// The policy changes, as seen since before the first hop was checked.
    pub policy: watch::Receiver<u64>,
    /// Other sources of the same bytes the parts may come from
    /// (`network.spread_over_mirrors`).
    pub also: Vec<Url>,
    /// `Some`: read as one stream until its connection was found slow
    /// (`carry`), with the SHA-256 of the bytes before `offset` so far.
    /// The file is split at once, and that prefix is not read back.
    pub handed: Option<sha2::Sha256>,
}

/// One part's range: the next byte it receives and where it stops.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The next byte to be written: every connection reading this range
    /// writes only bytes from here on, so a byte that arrives twice (a
    /// hedged range) is written once, by whichever connection brought it
    /// first.
    next: u64,
    end: u64,
    /// Bumped each time the slot is given a new range, so that a connection
    /// still reading for an earlier one stops.
    turn: u64,
    /// When the current range was given, and the bytes written into it
    /// since: its rate.
    since: Instant,
    got: u64,
    /// Hedges of this range so far (connections that asked for its rest
    /// once more).
    hedges: u32,
}

impl Slot {
    fn new(next: u64, end: u64) -> Slot {
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
    fn assign(&mut self, next: u64, end: u64) {
        *self = Slot {
            turn: self.turn + 1,
            ..Slot::new(next, end)
        };
    }

    /// Bytes a second this slot's connection wrote into its range so far,
    /// once it has been measured long enough ([`HEDGE_LOOK`]).
    fn rate(&self, now: Instant) -> Option<f64> {
        let elapsed = now.duration_since(self.since);
        (elapsed >= HEDGE_LOOK).then(|| self.got as f64 / elapsed.as_secs_f64())
    }

    /// Seconds this slot's connection would still need at its rate so
    /// far, once it has been measured long enough.
    fn eta(&self, now: Instant) -> Option<f64> {
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
struct Task {
    slot: usize,
    turn: u64,
    hedge: bool,
}

/// Whether the parts beyond the first run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The first connection is being measured.
    Probing,
    /// It is slow: the other parts take over ranges.
    Split,
    /// The first connection ended (or the parts stopped) without a split.
    Done,
}

/// The first connection's current rate window: the rule that splits a
/// file, whether its first connection is read by the parts or as one
/// stream that carries on while it is fast (`carry`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    since: Instant,
    bytes: u64,
}

impl Window {
    /// A window starting now.
    pub(super) fn new() -> Window {
        Window {
            since: Instant::now(),
            bytes: 0,
        }
    }

    /// Counts `bytes` more; `Some(rate)` once the window is old enough
    /// ([`FIRST_LOOK`]) and its rate is below `split_below` bytes a second:
    /// the file is to be split. A window as long as [`RATE_WINDOW`] that
    /// kept up starts again.
    pub(super) fn slow(&mut self, bytes: u64, split_below: u64) -> Option<f64> {
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

/// Why the parts stopped.
enum Stop {
    /// A part was refused: fetch the file again as one stream.
    Refused(String),
    /// The try failed.
    Failed(Box<TransferError>),
}

impl Stop {
    fn failed(e: TransferError) -> Stop {
        Stop::Failed(Box::new(e))
    }
}

/// The state the parts of one file share.
struct Run<'a> {
    address: &'a Url,
    expected: Expected<'a>,
    /// Where the parts come from: the address, then any other sources;
    /// part `i` asks `sources[i % len]`.
    sources: Vec<Url>,
    /// Each source's validator, once it answered a part (the address's is
    /// the first response's).
    validators: Mutex<Vec<Option<String>>>,
    slots: Mutex<Vec<Slot>>,
    /// Where the first connection's request in flight ends: the first
    /// request's share, then its range's end. The split leaves it that
    /// range, so that its request is never cut short.
    first_asked: std::sync::atomic::AtomicU64,
    /// Missing ranges between kept ones that no part has taken yet.
    pending: Mutex<std::collections::VecDeque<(u64, u64)>>,
    /// Bytes hedges may still ask for a second time: the waste is bounded
    /// (the origin sends at most a quarter more than the file, stolen
    /// ranges' last pieces included).
    hedge_left: Mutex<u64>,
    progress: Mutex<Progress<'a>>,
    scatter: Scatter,
    sink_path: PathBuf,
    /// Stops every part: the caller's cancellation, or a part's failure.
    stop: CancellationToken,
    policy: watch::Receiver<u64>,
    failure: Mutex<Option<Stop>>,
    /// The first connection's rate window, until the file is split.
    window: Mutex<Option<Window>>,
    /// Below this rate of the first connection the file is split.
    split_below: u64,
    phase: watch::Sender<Phase>,
    /// Told whenever a range is done or a slot gets another turn: a
    /// connection still reading for it stops at once rather than at its
    /// next chunk (a slow connection's next chunk may be a second away).
    moved: tokio::sync::Notify,
    /// The slowest time a part's request took to be answered: what a new
    /// request of a hedge costs.
    setup: Mutex<Option<Duration>>,
}

/// The file's one progress stream.
struct Progress<'a> {
    reporter: &'a mut dyn Reporter,
    total: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Run<'_> {
    /// Keeps the first reason to stop, and stops every part.
    fn fail(&self, stop: Stop) {
        let mut failure = lock(&self.failure);
        if failure.is_none() {
            *failure = Some(stop);
        }
        self.stop.cancel();
    }

    /// Counts `bytes` more of the first connection, and splits the file
    /// when its window is old enough and its rate below the threshold.
    fn measure(&self, bytes: u64) {
        let mut window = lock(&self.window);
        let Some(w) = window.as_mut() else {
            return;
        };
        if let Some(rate) = w.slow(bytes, self.split_below) {
            tracing::debug!(address = %self.address, rate, "a slow connection: fetching in parts");
            *window = None;
            let asked = self.first_asked.load(std::sync::atomic::Ordering::Relaxed);
            share_first(&mut lock(&self.slots), asked);
            self.set_phase(Phase::Split);
        }
    }

    /// The first connection ended: the other parts no longer wait.
    fn first_done(&self) {
        *lock(&self.window) = None;
        self.set_phase(Phase::Done);
    }

    /// Leaves [`Phase::Probing`] for `to`, once.
    fn set_phase(&self, to: Phase) {
        self.phase.send_if_modified(|p| {
            let probing = *p == Phase::Probing;
            if probing {
                *p = to;
            }
            probing
        });
    }

    /// Waits until the file is split (`Some`: what part `i` takes over) or
    /// will not be.
    async fn opened(&self, i: usize) -> Option<Task> {
        let mut phase = self.phase.subscribe();
        let split = tokio::select! {
            () = self.stop.cancelled() => false,
            p = phase.wait_for(|p| *p != Phase::Probing) => p.is_ok_and(|p| *p == Phase::Split),
        };
        if !split {
            return None;
        }
        let own = self.own(i);
        match self.claim(own) {
            Some(_) => Some(own),
            None => self.steal(i, None),
        }
    }

    /// Part `i`'s own slot, as it is now.
    fn own(&self, i: usize) -> Task {
        let turn = lock(&self.slots).get(i).map_or(0, |s| s.turn);
        Task {
            slot: i,
            turn,
            hedge: false,
        }
    }

    /// The range `task` still has to ask for, if any.
    fn claim(&self, task: Task) -> Option<(u64, u64)> {
        let slots = lock(&self.slots);
        let s = slots.get(task.slot)?;
        (s.turn == task.turn && s.next < s.end).then_some((s.next, s.end))
    }

    /// Whether any range is still to come.
    /// Whether `task` has nothing left to do: its range is done (by any
    /// connection) or its slot was given another turn.
    fn superseded(&self, task: Task) -> bool {
        lock(&self.slots)
            .get(task.slot)
            .is_none_or(|s| s.turn != task.turn || s.next >= s.end)
    }

    /// Resolves once `task` is [`Run::superseded`].
    async fn until_superseded(&self, task: Task) {
        loop {
            let notified = self.moved.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.superseded(task) {
                return;
            }
            notified.await;
        }
    }

    /// Counts a part's request that was answered after `took`.
    fn note_setup(&self, took: Duration) {
        let mut setup = lock(&self.setup);
        *setup = Some(setup.map_or(took, |s| s.max(took)));
    }

    /// What a new request is expected to cost before its first byte.
    fn setup(&self) -> Duration {
        lock(&self.setup).unwrap_or(HEDGE_SETUP)
    }

    fn unfinished(&self) -> bool {
        lock(&self.slots).iter().any(|s| s.next < s.end) || !lock(&self.pending).is_empty()
    }

    /// Part `i` (whose connection wrote at `rate` bytes a second, when it
    /// wrote) takes the next missing range no part has taken, else the
    /// upper half of the largest range still to come, else a hedge of the
    /// range that would finish last; `None` when nothing is worth taking.
    fn steal(&self, i: usize, rate: Option<f64>) -> Option<Task> {
        let mut slots = lock(&self.slots);
        let taken = take_over(&mut slots, &mut lock(&self.pending), i, |s| {
            self.in_flight(s)
        });
        if taken {
            self.moved.notify_waiters();
            return Some(self.task_of(&slots, i));
        }
        self.hedge(&mut slots, rate)
    }

    /// About what `slot`'s connection has on the way (sent by the server,
    /// not yet received): its rate over one request-to-answer time, an
    /// upper bound of its window.
    fn in_flight(&self, slot: &Slot) -> u64 {
        slot.rate(Instant::now())
            .map_or(0, |rate| (rate * self.setup().as_secs_f64()) as u64)
    }

    fn task_of(&self, slots: &[Slot], i: usize) -> Task {
        Task {
            slot: i,
            turn: slots[i].turn,
            hedge: false,
        }
    }

    /// A second request for the rest of the range that would finish last,
    /// when its connection would need more than [`HEDGE_FACTOR`] times what
    /// an idle one at `rate` would (its new request counted), and the
    /// waste allowed leaves room for it. Whichever connection brings a byte
    /// first writes it; the one left behind stops.
    fn hedge(&self, slots: &mut [Slot], rate: Option<f64>) -> Option<Task> {
        let now = Instant::now();
        let setup = self.setup().as_secs_f64();
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
        let mut left = lock(&self.hedge_left);
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
        tracing::debug!(address = %self.address, from = slots[j].next, to = slots[j].end, "a slow range: asking for it once more");
        Some(Task {
            slot: j,
            turn: slots[j].turn,
            hedge: true,
        })
    }

    fn attempt(&self, hop: &Url, error: AttemptError) -> TransferError {
        self.attempt_of(self.address, hop, error)
    }

    fn attempt_of(&self, address: &Url, hop: &Url, error: AttemptError) -> TransferError {
        attempt_error(address, hop, error)
    }

    /// The source part `i` asks, and the validator it must match (`None`
    /// before that source answered a part).
    fn source(&self, i: usize) -> (usize, &Url, Option<String>) {
        let k = i % self.sources.len();
        (k, &self.sources[k], lock(&self.validators)[k].clone())
    }

    /// Checks a part's validator against its source's, keeping the first
    /// one a source gives.
    fn same_validator(&self, k: usize, given: Option<String>) -> bool {
        let Some(given) = given else {
            return false;
        };
        let mut validators = lock(&self.validators);
        match &validators[k] {
            Some(known) => *known == given,
            None => {
                validators[k] = Some(given);
                true
            }
        }
    }
}

/// The missing ranges of `[offset, size)`: those between the kept
/// `ranges` (sorted, apart, after `offset`).
fn missing(offset: u64, size: u64, ranges: &[[u64; 2]]) -> Vec<(u64, u64)> {
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

/// What an idle part finds when it looks for work.
enum Look<T> {
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
async fn idle<T>(
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

/// The first ranges: the first missing range for the first connection,
/// and an empty one for each other part, up to `n` parts in all and one
/// per [`MIN_PART_BYTES`] still missing; they take over ranges once the
/// file is split.
fn first_slots(gaps: &[(u64, u64)], n: usize) -> Vec<Slot> {
    let missing: u64 = gaps.iter().map(|(s, e)| e - s).sum();
    let count = (missing / MIN_PART_BYTES).clamp(1, n as u64);
    let (next, end) = gaps.first().copied().unwrap_or((0, 0));
    let mut slots = vec![Slot::new(end, end); count as usize];
    slots[0].next = next;
    slots
}

/// Gives slot `i` the next missing range no part has taken, else the upper
/// half of the largest range still to come ([`steal_point`], `in_flight`
/// telling what a slot's connection has on the way); whether it did. Never
/// while `i`'s own range is unfinished: then a hedge that overtook its
/// connection still reads it, and a new range in its slot would end that
/// hedge and lose the rest of the range (a gap in the file).
fn take_over(
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
fn steal_point(next: u64, end: u64, in_flight: u64) -> Option<u64> {
    let rest = end.saturating_sub(next);
    let mid = next + (rest / 2).max(in_flight);
    (rest >= 2 * MIN_PART_BYTES && end.saturating_sub(mid) >= MIN_PART_BYTES).then_some(mid)
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
fn share_first(slots: &mut [Slot], asked: u64) {
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
pub(super) fn first_share_end(size: u64, parts: usize) -> u64 {
    let count = (size / MIN_PART_BYTES).clamp(1, parts.max(1) as u64);
    (size / count).max(MIN_PART_BYTES.min(size))
}

impl Fetcher {
    /// Whether a server that answered the first request after `answered`
    /// is far: its file's parts open at once.
    pub(super) fn is_far(&self, answered: Duration) -> bool {
        self.split_below > 0 && answered >= self.far_answer
    }

    /// Whether a file of `expected` is fetched in parts when its server
    /// answers ranges.
    pub(super) fn parts_for(&self, expected: Option<Expected<'_>>) -> bool {
        self.parts > 1 && expected.is_some_and(|e| e.size >= PARTS_MIN_BYTES)
    }

    /// Fetches the file in parts, `first` being the accepted answer to the
    /// first request. `Ok(None)`: a part was refused.
    pub(super) async fn parts(
        &self,
        address: &Url,
        expected: Expected<'_>,
        paths: &PartialPaths,
        first: FirstPart,
        cancel: Option<&CancellationToken>,
        reporter: &mut dyn Reporter,
    ) -> Result<Option<Transfer>, TransferError> {
        let FirstPart {
            hop,
            response,
            permit,
            answered,
            offset,
            end,
            ranges,
            validator,
            policy,
            also,
            handed,
        } = first;
        let mut sources = vec![address.clone()];
        sources.extend(also);
        let mut validators = vec![None; sources.len()];
        validators[0] = Some(validator.clone());
        let opening = paths.clone();
        let file = tokio::task::spawn_blocking(move || opening.open_data())
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            .map_err(|e| local_write(&paths.data, e))?;
        let checkpoints = Checkpointer::new(paths, address.as_str(), Some(validator.clone()));
        let gaps = missing(offset, expected.size, &ranges);
        let within =
            |&(start, gap_end): &(u64, u64)| start == offset && offset < end && end <= gap_end;
        if !gaps.first().is_some_and(within) {
            return Err(local_write(
                &paths.data,
                std::io::Error::other("the first part is not the first missing range"),
            ));
        }
        let kept = Written {
            prefix: offset,
            ranges,
        };
        let present = kept.bytes();
        let slow = handed.is_some();
        let (scatter, thread) = scatter::start(file, kept, handed, checkpoints)
            .map_err(|e| local_write(&paths.data, e))?;
        let mut slots = first_slots(&gaps, self.parts);
        // Parts from several sources were asked for, the server is far, or
        // the stream before was found slow: they start at once.
        let far = self.is_far(answered);
        let spread = sources.len() > 1 || far || slow;
        if spread {
            share_first(&mut slots, end);
        }
        if slow {
            tracing::debug!(%address, parts = slots.len(), from = offset, "a slow connection: fetching the rest in parts");
        } else if far {
            tracing::debug!(%address, parts = slots.len(), answered_ms = answered.as_millis(), "a far server: fetching in parts at once");
        } else {
            tracing::debug!(%address, parts = slots.len(), "ranges answered: parts when slow");
        }
        let count = slots.len();
        let run = Run {
            address,
            expected,
            sources,
            validators: Mutex::new(validators),
            slots: Mutex::new(slots),
            first_asked: std::sync::atomic::AtomicU64::new(end),
            pending: Mutex::new(gaps.into_iter().skip(1).collect()),
            hedge_left: Mutex::new(expected.size / 8),
            progress: Mutex::new(Progress {
                reporter,
                total: present,
            }),
            scatter,
            sink_path: paths.data.clone(),
            stop: cancel.map_or_else(CancellationToken::new, CancellationToken::child_token),
            policy,
            failure: Mutex::new(None),
            window: Mutex::new((!spread).then(Window::new)),
            split_below: self.split_below,
            phase: watch::channel(if spread { Phase::Split } else { Phase::Probing }).0,
            moved: tokio::sync::Notify::new(),
            setup: Mutex::new(None),
        };
        let mut first = Some((hop.clone(), response, permit, end));
        // Polled only when woken: the parts waiting for a split cost the
        // first connection nothing.
        let mut workers: futures_util::stream::FuturesUnordered<_> = (0..count)
            .map(|i| self.worker(&run, i, if i == 0 { first.take() } else { None }))
            .collect();
        while futures_util::StreamExt::next(&mut workers).await.is_some() {}
        drop(workers);
        let failure = lock(&run.failure).take();
        let outcome = match failure {
            None => self.finish_parts(&run, &hop).await,
            Some(stop) => {
                run.scatter.close().await;
                match stop {
                    Stop::Refused(why) => {
                        tracing::info!(%address, "{why}: fetching as one stream");
                        Ok(None)
                    }
                    Stop::Failed(e) => Err(*e),
                }
            }
        };
        drop(run);
        if let Err(e) = thread.join().await {
            tracing::warn!("the writer of {} failed: {e}", paths.data.display());
        }
        outcome
    }

    /// Every part ended: the whole file's size and SHA-256.
    async fn finish_parts(
        &self,
        run: &Run<'_>,
        hop: &Url,
    ) -> Result<Option<Transfer>, TransferError> {
        let finished = run
            .scatter
            .finish()
            .await
            .map_err(|e| local_write(&run.sink_path, e))?;
        let expected = Some(run.expected);
        check_finished(&finished, expected, run.expected.size).map_err(|e| run.attempt(hop, e))?;
        Ok(Some(Transfer {
            size: finished.len,
            sha256: finished.sha256,
            final_url: hop.clone(),
        }))
    }

    /// One connection's work: its range (the first's, or one taken over
    /// once the file is split), then ranges taken over from the others,
    /// until nothing is worth taking.
    async fn worker(&self, run: &Run<'_>, i: usize, first: Option<First>) {
        let task = match i {
            0 => Some(run.own(0)),
            _ => run.opened(i).await,
        };
        if let Some(task) = task {
            self.work(run, i, task, first).await;
        }
        if i == 0 {
            run.first_done();
        }
    }

    async fn work(&self, run: &Run<'_>, i: usize, mut task: Task, mut first: Option<First>) {
        let mut policy = run.policy.clone();
        let started = Instant::now();
        loop {
            let result = match first.take() {
                // Its body may run past its range (the range was cut when
                // the file was split): the sink stops at the range's end,
                // and only more than it asked for is a size error.
                Some((hop, response, _permit, asked)) => match run.claim(task) {
                    Some((start, _)) => {
                        let body = (run.address, &hop, response, start, asked);
                        self.part_body(run, i, task, body, started, &mut policy)
                            .await
                    }
                    None => Ok(Ended::default()),
                },
                None => self.part(run, i, task, &mut policy).await,
            };
            let rate = match result {
                // Its request is done and its range goes on: it asks for
                // the rest.
                Ok(Ended { more: true, .. }) => continue,
                Ok(ended) => ended.rate,
                Err(stop) => {
                    run.fail(stop);
                    return;
                }
            };
            let next = idle(&run.stop, &run.moved, || match run.steal(i, rate) {
                Some(next) => Look::Take(next),
                None if run.unfinished() => Look::Wait,
                None => Look::Done,
            });
            match next.await {
                Some(next) => task = next,
                None => return,
            }
        }
    }

    /// Asks for the range of `task` (part `i`'s connection) and reads it.
    async fn part(
        &self,
        run: &Run<'_>,
        i: usize,
        task: Task,
        policy: &mut watch::Receiver<u64>,
    ) -> Result<Ended, Stop> {
        let started = Instant::now();
        let Some((start, end)) = run.claim(task) else {
            return Ok(Ended::default());
        };
        if i == 0 {
            run.first_asked
                .store(end, std::sync::atomic::Ordering::Relaxed);
        }
        let (k, source, known) = run.source(i);
        let ask = Ask {
            start,
            end: Some(end - 1),
            validator: known,
        };
        let mut quiet = Quiet;
        let head = tokio::select! {
            biased;
            () = run.stop.cancelled() => return Err(Stop::Failed(Box::new(TransferError::Cancelled))),
            head = self.response_head(source, Some(&ask), run.expected.size, policy, &mut quiet) => head,
        };
        let (hop, response, _, _permit, answered) = match head {
            Ok(head) => head,
            Err(HeadError::Attempt(hop, e)) => {
                return Err(Stop::failed(run.attempt_of(source, &hop, e)))
            }
            Err(HeadError::RangeRefused(hop, why)) => {
                return Err(Stop::Refused(format!("{hop} refused a part: {why}")))
            }
        };
        run.note_setup(answered);
        let status = response.status().as_u16();
        if status != 206 {
            return Err(Stop::Refused(format!(
                "{hop} answered {status} to a ranged part"
            )));
        }
        if !run.same_validator(k, validator(&response)) {
            return Err(Stop::Refused(format!("{hop} changed the file's validator")));
        }
        if response.content_length().is_some_and(|n| n != end - start) {
            return Err(Stop::Refused(format!(
                "{hop} announced another length for a part"
            )));
        }
        let body = (source, &hop, response, start, end);
        self.part_body(run, i, task, body, started, policy).await
    }

    /// Reads one part's body (from `start` up to `limit`, what it asked
    /// for) into its task's range, stopping where the range ends now, or
    /// when another connection of the range is ahead of it.
    async fn part_body(
        &self,
        run: &Run<'_>,
        i: usize,
        task: Task,
        body: (&Url, &Url, Response, u64, u64),
        started: Instant,
        policy: &mut watch::Receiver<u64>,
    ) -> Result<Ended, Stop> {
        let (source, hop, mut response, start, limit) = body;
        let mut sink = PartSink {
            run,
            i,
            task,
            pos: start,
            wrote: 0,
            behind: false,
            batch: Vec::new(),
            at: start,
            len: 0,
        };
        let fail = |hop: &Url, e: AttemptError| run.attempt_of(source, hop, e);
        let body = Body {
            hop,
            response: &mut response,
            sink: &mut sink,
            sink_path: &run.sink_path,
            received: start,
            expected: Some(run.expected),
            limit,
        };
        // The run's stop, or this range done by another connection (a
        // hedge that was faster): the connection ends at once.
        let stopped = async {
            tokio::select! {
                () = run.stop.cancelled() => {}
                () = run.until_superseded(task) => {}
            }
        };
        tokio::pin!(stopped);
        let outcome = self
            .receive(body, stopped.as_mut(), policy, &mut Quiet, &fail)
            .await;
        let outcome = match outcome {
            Ok(Some(TransferError::Cancelled)) if !run.stop.is_cancelled() => {
                // Nothing left for it: what it wrote stands.
                sink.behind = true;
                Ok(None)
            }
            other => other,
        };
        let flushed = sink
            .flush()
            .await
            .map_err(|e| local_write(&run.sink_path, e));
        let rate =
            (sink.wrote > 0).then(|| sink.wrote as f64 / started.elapsed().as_secs_f64().max(1e-3));
        let ended = |more| Ok(Ended { rate, more });
        match (outcome, flushed) {
            (Err(e), _) | (Ok(_), Err(e)) => Err(Stop::failed(e)),
            (Ok(Some(failure)), _) => Err(Stop::failed(failure)),
            (Ok(None), _) if sink.behind => ended(false),
            (Ok(None), _) => match run.claim(task) {
                None => ended(false),
                // All it asked for came, and its range goes on.
                Some((next, _)) if next >= limit => ended(true),
                Some((next, _)) => {
                    let detail = format!("a part's connection closed after byte {next}");
                    let error = size_error(Some(run.expected), run.expected.size, detail);
                    Err(Stop::failed(run.attempt_of(source, hop, error)))
                }
            },
        }
    }
}

/// The accepted answer to the first request as its part reads it: the hop,
/// the response, its host's slot and where the bytes it asked for end.
type First = (Url, Response, HostPermit, u64);

/// How a part's request ended.
#[derive(Debug, Default)]
struct Ended {
    /// The rate it wrote at, when it wrote.
    rate: Option<f64>,
    /// It brought all it asked for and its range goes on past that (the
    /// first request asked for its share only): the part asks for the rest.
    more: bool,
}

/// A part's reporter: the file's progress comes from [`PartSink`] (or
/// from the stream that carries on, `carry`).
pub(super) struct Quiet;

impl Reporter for Quiet {
    fn bytes(&mut self, _total: u64) {}
}

/// One connection's bytes into its task's range of the file.
struct PartSink<'r, 'a> {
    run: &'r Run<'a>,
    i: usize,
    task: Task,
    /// Where the connection's next byte belongs in the file.
    pos: u64,
    /// Bytes it wrote (not those another connection of the range brought
    /// first).
    wrote: u64,
    /// It fell behind another connection of its range and stopped.
    behind: bool,
    /// Chunks gathered, from `at`.
    batch: Vec<Bytes>,
    at: u64,
    /// Their bytes.
    len: u64,
}

/// What one chunk of a connection adds to its range.
#[derive(Debug, PartialEq, Eq)]
enum Take {
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
fn take(slot: &mut Slot, task: Task, from: u64, len: u64, wrote: u64) -> Take {
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

impl PartSink<'_, '_> {
    async fn flush(&mut self) -> std::io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        let at = self.at;
        self.at += std::mem::take(&mut self.len);
        self.run.scatter.write_at(at, batch).await
    }
}

impl BodySink for PartSink<'_, '_> {
    async fn write(&mut self, chunk: Bytes) -> std::io::Result<bool> {
        let from = self.pos;
        self.pos += chunk.len() as u64;
        let (taken, more) = {
            let mut slots = lock(&self.run.slots);
            let Some(s) = slots.get_mut(self.task.slot) else {
                return Ok(false);
            };
            let taken = take(s, self.task, from, chunk.len() as u64, self.wrote);
            let more = s.next < s.end;
            (taken, more)
        };
        if !more && matches!(taken, Take::Write(..)) {
            // This chunk finished the range: another connection reading it
            // stops now.
            self.run.moved.notify_waiters();
        }
        let (lo, hi) = match taken {
            Take::Write(lo, hi) => (lo, hi),
            Take::Skip => return Ok(true),
            Take::Done => {
                self.flush().await?;
                return Ok(false);
            }
            Take::Behind => {
                self.behind = true;
                self.flush().await?;
                return Ok(false);
            }
        };
        if self.i == 0 {
            self.run.measure(hi - lo);
        }
        if !self.batch.is_empty() && self.at + self.len != lo {
            // Another connection wrote in between: a batch is contiguous.
            self.flush().await?;
        }
        if self.batch.is_empty() {
            self.at = lo;
        }
        self.batch
            .push(chunk.slice((lo - from) as usize..(hi - from) as usize));
        self.len += hi - lo;
        self.wrote += hi - lo;
        {
            let mut progress = lock(&self.run.progress);
            progress.total += hi - lo;
            let total = progress.total;
            progress.reporter.bytes(total);
        }
        if self.len >= BATCH_BYTES as u64 || !more {
            self.flush().await?;
        }
        Ok(more)
    }

    async fn checkpoint(&mut self) -> std::io::Result<()> {
        if self.i == 0 {
            // A silent first connection is slow too.
            self.run.measure(0);
        }
        self.flush().await?;
        self.run.scatter.checkpoint().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
