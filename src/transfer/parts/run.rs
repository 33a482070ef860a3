//! The state the parts of one file share ([`Run`]): the part map behind a
//! lock, whether the file is split yet, the first reason to stop, the
//! sources and their validators, and the file's one progress stream.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::error::AttemptError;
use crate::transfer::body::attempt_error;
use crate::transfer::fetch::{Expected, Reporter, TransferError};
use crate::transfer::scatter::Scatter;

use super::hedge::{self, HEDGE_SETUP};
use super::map::{share_first, Slot, Task};
use super::steal::take_over;
use super::window::Window;

/// Whether the parts beyond the first run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// The first connection is being measured.
    Probing,
    /// It is slow: the other parts take over ranges.
    Split,
    /// The first connection ended (or the parts stopped) without a split.
    Done,
}

/// Why the parts stopped.
pub(super) enum Stop {
    /// A part was refused: fetch the file again as one stream.
    Refused(String),
    /// The try failed.
    Failed(Box<TransferError>),
}

impl Stop {
    pub(super) fn failed(e: TransferError) -> Stop {
        Stop::Failed(Box::new(e))
    }
}

/// The state the parts of one file share.
pub(super) struct Run<'a> {
    pub(super) address: &'a Url,
    pub(super) expected: Expected<'a>,
    /// Where the parts come from: the address, then any other sources;
    /// part `i` asks `sources[i % len]`.
    pub(super) sources: Vec<Url>,
    /// Each source's validator, once it answered a part (the address's is
    /// the first response's).
    pub(super) validators: Mutex<Vec<Option<String>>>,
    pub(super) slots: Mutex<Vec<Slot>>,
    /// Where the first connection's request in flight ends: the first
    /// request's share, then its range's end. The split leaves it that
    /// range, so that its request is never cut short.
    pub(super) first_asked: std::sync::atomic::AtomicU64,
    /// Missing ranges between kept ones that no part has taken yet.
    pub(super) pending: Mutex<std::collections::VecDeque<(u64, u64)>>,
    /// Bytes hedges may still ask for a second time: the waste is bounded
    /// (the origin sends at most a quarter more than the file, stolen
    /// ranges' last pieces included).
    pub(super) hedge_left: Mutex<u64>,
    pub(super) progress: Mutex<Progress<'a>>,
    pub(super) scatter: Scatter,
    pub(super) sink_path: PathBuf,
    /// Stops every part: the caller's cancellation, or a part's failure.
    pub(super) stop: CancellationToken,
    pub(super) policy: watch::Receiver<u64>,
    pub(super) failure: Mutex<Option<Stop>>,
    /// The first connection's rate window, until the file is split.
    pub(super) window: Mutex<Option<Window>>,
    /// Below this rate of the first connection the file is split.
    pub(super) split_below: u64,
    pub(super) phase: watch::Sender<Phase>,
    /// Told whenever a range is done or a slot gets another turn: a
    /// connection still reading for it stops at once rather than at its
    /// next chunk (a slow connection's next chunk may be a second away).
    pub(super) moved: tokio::sync::Notify,
    /// The slowest time a part's request took to be answered: what a new
    /// request of a hedge costs.
    pub(super) setup: Mutex<Option<Duration>>,
}

/// The file's one progress stream.
pub(super) struct Progress<'a> {
    pub(super) reporter: &'a mut dyn Reporter,
    pub(super) total: u64,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Run<'_> {
    /// Keeps the first reason to stop, and stops every part.
    pub(super) fn fail(&self, stop: Stop) {
        let mut failure = lock(&self.failure);
        if failure.is_none() {
            *failure = Some(stop);
        }
        self.stop.cancel();
    }

    /// Counts `bytes` more of the first connection, brought while it
    /// waited `held` for the writer, and splits the file when its window is
    /// old enough and its rate below the threshold ([`Window::slow`]).
    pub(super) fn measure(&self, bytes: u64, held: Duration) {
        let mut window = lock(&self.window);
        let Some(w) = window.as_mut() else {
            return;
        };
        if let Some(rate) = w.slow(bytes, held, self.split_below) {
            tracing::debug!(address = %self.address, rate, "a slow connection: fetching in parts");
            *window = None;
            let asked = self.first_asked.load(std::sync::atomic::Ordering::Relaxed);
            share_first(&mut lock(&self.slots), asked);
            self.set_phase(Phase::Split);
        }
    }

    /// The first connection ended: the other parts no longer wait.
    pub(super) fn first_done(&self) {
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
    pub(super) async fn opened(&self, i: usize) -> Option<Task> {
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
    pub(super) fn own(&self, i: usize) -> Task {
        let turn = lock(&self.slots).get(i).map_or(0, |s| s.turn);
        Task {
            slot: i,
            turn,
            hedge: false,
        }
    }

    /// The range `task` still has to ask for, if any.
    pub(super) fn claim(&self, task: Task) -> Option<(u64, u64)> {
        let slots = lock(&self.slots);
        let s = slots.get(task.slot)?;
        (s.turn == task.turn && s.next < s.end).then_some((s.next, s.end))
    }

    /// Whether any range is still to come.
    /// Whether `task` has nothing left to do: its range is done (by any
    /// connection) or its slot was given another turn.
    pub(super) fn superseded(&self, task: Task) -> bool {
        lock(&self.slots)
            .get(task.slot)
            .is_none_or(|s| s.turn != task.turn || s.next >= s.end)
    }

    /// Resolves once `task` is [`Run::superseded`].
    pub(super) async fn until_superseded(&self, task: Task) {
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
    pub(super) fn note_setup(&self, took: Duration) {
        let mut setup = lock(&self.setup);
        *setup = Some(setup.map_or(took, |s| s.max(took)));
    }

    /// What a new request is expected to cost before its first byte.
    pub(super) fn setup(&self) -> Duration {
        lock(&self.setup).unwrap_or(HEDGE_SETUP)
    }

    pub(super) fn unfinished(&self) -> bool {
        lock(&self.slots).iter().any(|s| s.next < s.end) || !lock(&self.pending).is_empty()
    }

    /// Part `i` (whose connection wrote at `rate` bytes a second, when it
    /// wrote) takes the next missing range no part has taken, else the
    /// upper half of the largest range still to come, else a hedge of the
    /// range that would finish last; `None` when nothing is worth taking.
    pub(super) fn steal(&self, i: usize, rate: Option<f64>) -> Option<Task> {
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

    /// A hedge of the range that would finish last, when it is worth one
    /// ([`hedge::hedge`]).
    fn hedge(&self, slots: &mut [Slot], rate: Option<f64>) -> Option<Task> {
        let mut left = lock(&self.hedge_left);
        let task = hedge::hedge(slots, rate, self.setup(), &mut left, Instant::now())?;
        let s = &slots[task.slot];
        tracing::debug!(address = %self.address, from = s.next, to = s.end, "a slow range: asking for it once more");
        Some(task)
    }

    pub(super) fn attempt(&self, hop: &Url, error: AttemptError) -> TransferError {
        self.attempt_of(self.address, hop, error)
    }

    pub(super) fn attempt_of(
        &self,
        address: &Url,
        hop: &Url,
        error: AttemptError,
    ) -> TransferError {
        attempt_error(address, hop, error)
    }

    /// The source part `i` asks, and the validator it must match (`None`
    /// before that source answered a part).
    pub(super) fn source(&self, i: usize) -> (usize, &Url, Option<String>) {
        let k = i % self.sources.len();
        (k, &self.sources[k], lock(&self.validators)[k].clone())
    }

    /// Checks a part's validator against its source's, keeping the first
    /// one a source gives.
    pub(super) fn same_validator(&self, k: usize, given: Option<String>) -> bool {
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
