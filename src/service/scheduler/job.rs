//! A job (one download that many callers wait for), the callers and gems
//! that wait on it, and the key that makes it one per file and address list.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::manifest::Resource;

/// The outcome every waiter of a job gets.
pub(crate) type JobResult = Result<PathBuf, Error>;

/// What a job is doing, for status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for a slot.
    Queued,
    /// Waiting for another download of the same file (another gem's, here
    /// or in another process): the gem it depends on, when known.
    Waiting(Option<String>),
    /// Transferring; bytes received so far, and the current rate in bytes
    /// per second ([`Meter`]).
    Downloading(u64, u64),
    /// Between two tries of an address: which try comes next, of how
    /// many, and why the last one failed; and the bytes held.
    Retrying(Retry, u64),
}

/// What a job between two tries says ([`JobState::Retrying`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// The try that comes next (2 for the first retry).
    pub attempt: u32,
    /// Of how many.
    pub of: u32,
    /// Why the last one failed.
    pub reason: String,
}

/// A running or queued job.
#[derive(Debug, Clone)]
pub(super) struct Job {
    /// Distinguishes this job from a later one for the same SHA-256.
    pub(super) id: u64,
    /// Set when an on-demand caller waits; moves the job up the queue.
    pub(super) urgent: Arc<AtomicBool>,
    /// Stops the job.
    pub(super) cancel: CancellationToken,
    /// Whether its `Started` went out (with its first report about an
    /// address); set under the `waiters` lock.
    pub(super) started: Arc<AtomicBool>,
    /// The address being tried (the url or a mirror, as declared), for
    /// the events that name it.
    pub(super) address: Arc<Mutex<String>>,
    /// Bytes received by the current attempt.
    pub(super) bytes: Arc<AtomicU64>,
    /// The current try's rate in bytes per second, as its [`Meter`] says.
    pub(super) rate: Arc<AtomicU64>,
    /// While it waits for another download of the same file: the gem that
    /// one is for (`Some(None)`: not known).
    pub(super) waiting_on: Arc<Mutex<Option<Option<String>>>>,
    /// Between two tries: the next one (cleared when bytes arrive).
    pub(super) retry: Arc<Mutex<Option<Retry>>>,
    /// Resolves once with the outcome.
    pub(super) done: watch::Receiver<Option<JobResult>>,
    /// The SHA-256 it downloads.
    pub(super) sha256: String,
    /// Every gem and resource waiting on it, for their events and
    /// failure records. Held while its events are published, so a waiter
    /// that joins gets its `Queued` and `Started` before any later event.
    pub(super) waiters: Arc<Mutex<Vec<Waiter>>>,
    /// Why it was cancelled, when something other than shutdown did.
    pub(super) why: Arc<Mutex<Option<String>>>,
    /// Callers waiting for it now ([`Scheduler::ensure_for_caller`]).
    pub(super) callers: Arc<AtomicUsize>,
    /// Whether it is wanted whoever waits: a required file, a retry, a
    /// `download_now`. A job only callers want stops when the last one
    /// leaves.
    pub(super) wanted: Arc<AtomicBool>,
    /// Held while a caller joins or leaves, or something else comes to
    /// want the job: a job that its last caller's leaving cancels is never
    /// joined in between ([`Job::join`]).
    pub(super) joins: Arc<Mutex<()>>,
}

/// A caller waiting for a job ([`Scheduler::ensure_for_caller`]). When the
/// last caller of a job nobody else wants leaves before it ends (its call
/// cancelled, its future dropped), the job stops; its bytes are kept.
#[derive(Debug)]
pub(crate) struct Caller {
    pub(super) job: Option<Job>,
}

/// Why a job stops when its last caller leaves.
const NO_CALLER_LEFT: &str = "no caller waits for it any more";

impl Caller {
    /// The caller leaves: whether the download goes on (another caller
    /// waits, it is wanted otherwise, or it has ended).
    pub(crate) fn leave(mut self) -> bool {
        self.job.take().is_none_or(|job| job.caller_left())
    }

    /// The caller got its result: nothing to stop.
    pub(crate) fn done(mut self) {
        if let Some(job) = self.job.take() {
            job.callers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            job.caller_left();
        }
    }
}

/// One gem's resource waiting on a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Waiter {
    /// The gem.
    pub(super) gem: String,
    /// Its resource id.
    pub(super) resource: String,
    /// Its file name for the bytes.
    pub(super) file: String,
}

impl Waiter {
    pub(super) fn of(gem: &str, resource: &Resource) -> Waiter {
        Waiter {
            gem: gem.to_string(),
            resource: resource.id.clone(),
            file: resource.file_name(),
        }
    }
}

impl Job {
    pub(super) fn lock_waiters(&self) -> MutexGuard<'_, Vec<Waiter>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn waiters(&self) -> Vec<Waiter> {
        self.lock_waiters().clone()
    }

    /// The address being tried.
    pub(super) fn address(&self) -> String {
        self.address
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Joins the job, as a caller (`as_caller`) or as something else that
    /// wants it; `false`, and nothing joined, once its cancellation has
    /// begun (its last caller left, the user cancelled it, an uninstall or
    /// the shutdown stopped it): a dying job is nobody's download any more.
    pub(super) fn join(&self, as_caller: bool) -> bool {
        let _joins = self.joins.lock().unwrap_or_else(|p| p.into_inner());
        if self.cancel.is_cancelled() {
            return false;
        }
        if as_caller {
            self.callers.fetch_add(1, Ordering::SeqCst);
        } else {
            self.wanted.store(true, Ordering::SeqCst);
        }
        true
    }

    /// One caller left: stops the job when it was the last and nobody else
    /// wants it; whether the download goes on.
    pub(super) fn caller_left(&self) -> bool {
        let _joins = self.joins.lock().unwrap_or_else(|p| p.into_inner());
        let last = self.callers.fetch_sub(1, Ordering::SeqCst) == 1;
        let ended = self.done.borrow().is_some();
        if last && !ended && !self.wanted.load(Ordering::SeqCst) {
            self.cancel_because(NO_CALLER_LEFT);
            return false;
        }
        true
    }

    /// Cancels the job, saying why (the first reason given wins).
    pub(super) fn cancel_because(&self, why: &str) {
        let mut slot = self.why.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert_with(|| why.to_string());
        drop(slot);
        self.cancel.cancel();
    }

    pub(super) fn why(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The key of a job: the bytes, their declared size and where they are
/// fetched from. The size belongs to it: a manifest that declares the right
/// bytes with a wrong size must fail on its own, not for every gem that
/// declares the same bytes correctly.
pub(super) fn job_key(resource: &Resource) -> String {
    let mut key = format!("{} {}", resource.sha256, resource.size);
    for address in resource.addresses() {
        key.push(' ');
        key.push_str(address.as_str());
    }
    key
}
