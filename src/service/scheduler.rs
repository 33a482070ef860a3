//! Runs downloads: one job per SHA-256, bounded concurrency, cancellation.
//!
//! However many callers want the same bytes from the same addresses (a
//! background install, several tools calling `path`), there is one job; each
//! caller waits on its result. Jobs are keyed by SHA-256 *and* address list:
//! a gem whose addresses fail must not decide the fate of another gem that
//! declares the same bytes elsewhere. The second of two such jobs waits for
//! the first only so long (`network.wait_for_others_secs`, see
//! [`crate::store::lanes`]), then fetches from its own addresses; the first
//! verified copy is published and the other job finds it in place.
//! A job takes a slot (global and per host at once, [`Limiter`]), downloads,
//! records the outcome, and publishes events. Jobs are tracked so shutdown
//! can cancel them and wait until every temporary file is gone.
//!
//! Every caller waiting on a job (each gem, each resource id) gets its own
//! copy of the job's events, named with its own gem and resource id, from
//! the moment it joins: a gem whose file another gem is already
//! downloading sees `Queued` (and `Started`) at once, then the same
//! progress and the same end. A job ends, for every waiter, with exactly
//! one of `Verified`, `Failed` or `Cancelled`.
//!
//! Jobs run on the Tokio runtime the service was opened on (a
//! [`Handle`]), whichever executor the caller uses.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::runtime::Handle;
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::Error;
use crate::manifest::Resource;
use crate::service::events::{Event, Events};
use crate::service::limiter::{Limiter, Permit};
use crate::service::retry::{self, Retries};
use crate::store::registry::{FailureRecord, Registry};
use crate::store::Store;
use crate::transfer::download::{download_for, RetryPolicy};
use crate::transfer::fetch::Fetcher;
use crate::transfer::meter::Meter;
use crate::transfer::slots::Handover;

/// How often progress events are published per download at most (the last
/// one, at the declared size, aside): the cadence the events module
/// documents.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

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
struct Job {
    /// Distinguishes this job from a later one for the same SHA-256.
    id: u64,
    /// Set when an on-demand caller waits; moves the job up the queue.
    urgent: Arc<AtomicBool>,
    /// Stops the job.
    cancel: CancellationToken,
    /// Whether its `Started` went out (with its first report about an
    /// address); set under the `waiters` lock.
    started: Arc<AtomicBool>,
    /// The address being tried (the url or a mirror, as declared), for
    /// the events that name it.
    address: Arc<Mutex<String>>,
    /// Bytes received by the current attempt.
    bytes: Arc<AtomicU64>,
    /// The current try's rate in bytes per second, as its [`Meter`] says.
    rate: Arc<AtomicU64>,
    /// While it waits for another download of the same file: the gem that
    /// one is for (`Some(None)`: not known).
    waiting_on: Arc<Mutex<Option<Option<String>>>>,
    /// Between two tries: the next one (cleared when bytes arrive).
    retry: Arc<Mutex<Option<Retry>>>,
    /// Resolves once with the outcome.
    done: watch::Receiver<Option<JobResult>>,
    /// The SHA-256 it downloads.
    sha256: String,
    /// Every gem and resource waiting on it, for their events and
    /// failure records. Held while its events are published, so a waiter
    /// that joins gets its `Queued` and `Started` before any later event.
    waiters: Arc<Mutex<Vec<Waiter>>>,
    /// Why it was cancelled, when something other than shutdown did.
    why: Arc<Mutex<Option<String>>>,
    /// Callers waiting for it now ([`Scheduler::ensure_for_caller`]).
    callers: Arc<AtomicUsize>,
    /// Whether it is wanted whoever waits: a required file, a retry, a
    /// `download_now`. A job only callers want stops when the last one
    /// leaves.
    wanted: Arc<AtomicBool>,
}

/// A caller waiting for a job ([`Scheduler::ensure_for_caller`]). When the
/// last caller of a job nobody else wants leaves before it ends (its call
/// cancelled, its future dropped), the job stops; its bytes are kept.
#[derive(Debug)]
pub(crate) struct Caller {
    job: Option<Job>,
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
struct Waiter {
    /// The gem.
    gem: String,
    /// Its resource id.
    resource: String,
    /// Its file name for the bytes.
    file: String,
}

impl Waiter {
    fn of(gem: &str, resource: &Resource) -> Waiter {
        Waiter {
            gem: gem.to_string(),
            resource: resource.id.clone(),
            file: resource.file_name(),
        }
    }
}

impl Job {
    fn lock_waiters(&self) -> MutexGuard<'_, Vec<Waiter>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn waiters(&self) -> Vec<Waiter> {
        self.lock_waiters().clone()
    }

    /// The address being tried.
    fn address(&self) -> String {
        self.address
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Cancels the job, saying why (the first reason given wins).
    /// One caller left: stops the job when it was the last and nobody else
    /// wants it; whether the download goes on.
    fn caller_left(&self) -> bool {
        let last = self.callers.fetch_sub(1, Ordering::SeqCst) == 1;
        let ended = self.done.borrow().is_some();
        if last && !ended && !self.wanted.load(Ordering::SeqCst) {
            self.cancel_because(NO_CALLER_LEFT);
            return false;
        }
        true
    }

    fn cancel_because(&self, why: &str) {
        let mut slot = self.why.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert_with(|| why.to_string());
        drop(slot);
        self.cancel.cancel();
    }

    fn why(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The key of a job: the bytes, their declared size and where they are
/// fetched from. The size belongs to it: a manifest that declares the right
/// bytes with a wrong size must fail on its own, not for every gem that
/// declares the same bytes correctly.
fn job_key(resource: &Resource) -> String {
    let mut key = format!("{} {}", resource.sha256, resource.size);
    for address in resource.addresses() {
        key.push(' ');
        key.push_str(address.as_str());
    }
    key
}

/// Everything a job needs, shared.
#[derive(Clone)]
pub(crate) struct Deps {
    /// Transfers.
    pub fetcher: Fetcher,
    /// Where files go.
    pub store: Store,
    /// Failure records.
    pub registry: Registry,
    /// Retries of each address after its transient failures, before the
    /// next address is tried.
    pub retry: RetryPolicy,
    /// Event channel.
    pub events: Events,
    /// How long after a failure a required file is queued again
    /// (`service.retry_failed_after`); `None`: only at the next start.
    pub retry_failed_after: Option<Duration>,
}

/// The download scheduler.
pub(crate) struct Scheduler {
    deps: Deps,
    /// Download slots: global, and per host (of the resource's `url`).
    slots: Arc<Limiter>,
    /// Places for files whose bytes are in, being made durable and named,
    /// that gave their download slot back (as many as there are slots; see
    /// `transfer::slots`).
    publishing: Arc<Semaphore>,
    /// Jobs by SHA-256.
    jobs: Mutex<HashMap<String, Job>>,
    /// Next job id.
    next_id: AtomicU64,
    /// Every job task, for a clean drain on shutdown.
    tracker: TaskTracker,
    /// Cancels every job at shutdown.
    shutdown: CancellationToken,
    /// The runtime jobs run on, captured when the service was opened.
    handle: Handle,
    /// Timers that queue failed required files again.
    retries: Retries,
}

impl Scheduler {
    pub(crate) fn new(deps: Deps, global: usize, per_host: usize, handle: Handle) -> Scheduler {
        Scheduler {
            deps,
            slots: Limiter::new(global, per_host),
            publishing: Arc::new(Semaphore::new(global)),
            jobs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            handle,
            retries: Retries::default(),
        }
    }

    /// The runtime jobs run on.
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Whether [`Scheduler::shutdown`] was called.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    fn emit(&self, event: Event) {
        self.deps.events.send(event);
    }

    /// What every job uses.
    pub(crate) fn deps(&self) -> &Deps {
        &self.deps
    }

    /// A token that fires at shutdown, for work outside the jobs.
    pub(crate) fn stopping(&self) -> CancellationToken {
        self.shutdown.child_token()
    }

    /// Holds off the end of [`Scheduler::shutdown`] until it is dropped:
    /// work outside the jobs (an import's copy) cleans up after itself
    /// before the service says it stopped.
    pub(crate) fn hold_shutdown(&self) -> tokio_util::task::task_tracker::TaskTrackerToken {
        self.tracker.token()
    }

    /// The fetcher every job uses.
    pub(crate) fn fetcher(&self) -> &Fetcher {
        &self.deps.fetcher
    }

    fn jobs(&self) -> MutexGuard<'_, HashMap<String, Job>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes sure a job for `resource` exists (starting one when needed) and
    /// returns a handle on its outcome. `urgent` moves it ahead of
    /// background work.
    pub(crate) fn ensure(
        self: &Arc<Self>,
        gem: &str,
        resource: &Resource,
        urgent: bool,
    ) -> watch::Receiver<Option<JobResult>> {
        self.ensure_as(gem, resource, urgent, None)
    }

    /// [`Scheduler::ensure`] for a caller that waits for the result (on
    /// demand, ahead of background work): the job counts it until the
    /// [`Caller`] leaves, and stops when the last caller leaves a job that
    /// nothing else wants.
    pub(crate) fn ensure_for_caller(
        self: &Arc<Self>,
        gem: &str,
        resource: &Resource,
    ) -> (watch::Receiver<Option<JobResult>>, Caller) {
        let mut caller = Caller { job: None };
        let done = self.ensure_as(gem, resource, true, Some(&mut caller));
        (done, caller)
    }

    fn ensure_as(
        self: &Arc<Self>,
        gem: &str,
        resource: &Resource,
        urgent: bool,
        caller: Option<&mut Caller>,
    ) -> watch::Receiver<Option<JobResult>> {
        let key = job_key(resource);
        let mut jobs = self.jobs();
        if let Some(job) = jobs.get(&key) {
            match caller {
                Some(caller) => {
                    job.callers.fetch_add(1, Ordering::SeqCst);
                    caller.job = Some(job.clone());
                }
                None => job.wanted.store(true, Ordering::SeqCst),
            }
            if urgent {
                job.urgent.store(true, Ordering::Relaxed);
                self.slots.urgent_flagged();
            }
            let mut waiters = job.lock_waiters();
            let new = !waiters
                .iter()
                .any(|w| w.gem == gem && w.resource == resource.id);
            if new {
                waiters.push(Waiter::of(gem, resource));
                // The new waiter learns at once where the download stands,
                // before any later event of the job (the lock is held).
                let at = SystemTime::now();
                let (gem, id) = (gem.to_string(), resource.id.clone());
                let (sha256, size) = (resource.sha256.clone(), resource.size);
                self.emit(Event::Queued {
                    at,
                    gem: gem.clone(),
                    resource: id.clone(),
                    sha256: sha256.clone(),
                    size,
                });
                if job.started.load(Ordering::Relaxed) {
                    self.emit(Event::Started {
                        at,
                        gem,
                        resource: id,
                        sha256,
                        size,
                        address: job.address(),
                    });
                }
            }
            drop(waiters);
            tracing::debug!(gem, resource = %resource.id, "joining the download in progress");
            return job.done.clone();
        }
        let (tx, rx) = watch::channel(None);
        let job = Job {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            urgent: Arc::new(AtomicBool::new(urgent)),
            cancel: self.shutdown.child_token(),
            started: Arc::new(AtomicBool::new(false)),
            address: Arc::new(Mutex::new(resource.url.to_string())),
            bytes: Arc::new(AtomicU64::new(0)),
            rate: Arc::new(AtomicU64::new(0)),
            waiting_on: Arc::new(Mutex::new(None)),
            retry: Arc::new(Mutex::new(None)),
            done: rx.clone(),
            sha256: resource.sha256.clone(),
            waiters: Arc::new(Mutex::new(vec![Waiter::of(gem, resource)])),
            why: Arc::new(Mutex::new(None)),
            callers: Arc::new(AtomicUsize::new(usize::from(caller.is_some()))),
            wanted: Arc::new(AtomicBool::new(caller.is_none())),
        };
        if let Some(caller) = caller {
            caller.job = Some(job.clone());
        }
        jobs.insert(key.clone(), job.clone());
        drop(jobs);
        let this = self.clone();
        let (gem, resource) = (gem.to_string(), resource.clone());
        let task = async move {
            let result = this.run(&gem, &resource, &job).await;
            match &result {
                Err(Error::Cancelled { reason, .. }) => {
                    this.each(&job, |w, at| Event::Cancelled {
                        at,
                        gem: w.gem.clone(),
                        resource: w.resource.clone(),
                        sha256: resource.sha256.clone(),
                        reason: reason.clone(),
                    });
                }
                Err(error) => this.retry_later(&key, error),
                Ok(_) => this.retries.succeeded(&key),
            }
            {
                let mut jobs = this.jobs();
                if jobs.get(&key).is_some_and(|j| j.id == job.id) {
                    jobs.remove(&key);
                }
            }
            let _ = tx.send(Some(result));
        };
        self.tracker.spawn_on(task, &self.handle);
        rx
    }

    /// Queues the job of `key` again once its wait is over (see
    /// [`crate::service::retry`]), for every installed gem that then
    /// declares it as a required file that is missing. Not only for the
    /// gems that waited for this try: the timer replaces the one a former
    /// try of the same bytes set, whose gems may still need them when this
    /// try's gems are gone.
    fn retry_later(self: &Arc<Self>, key: &str, error: &Error) {
        let Some(base) = self.deps.retry_failed_after else {
            return;
        };
        if self.required_now(key).is_empty() {
            return;
        }
        let (failures, timer) = self.retries.failed(key);
        let wait = retry::delay(base, failures, retry::retry_after(error));
        tracing::debug!(
            failures,
            ?wait,
            "a failed required file is tried again after a wait"
        );
        let (this, key) = (self.clone(), key.to_string());
        let task = async move {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = timer.cancelled() => return,
                () = this.shutdown.cancelled() => return,
            }
            if !this.retries.fired(&key, &timer) {
                return;
            }
            let due = this.required_now(&key);
            if due.is_empty() {
                // Present by now, lazy, or no longer installed: nothing
                // to keep for it.
                this.retries.succeeded(&key);
            }
            for (gem, resource) in due {
                this.ensure(&gem, &resource, false);
            }
        };
        self.tracker.spawn_on(task, &self.handle);
    }

    /// The installed gems that declare a resource with the job key `key`
    /// as a required file, with that resource, while it is missing from the
    /// store.
    fn required_now(&self, key: &str) -> Vec<(String, Resource)> {
        let Ok(registrations) = self.deps.registry.list_shared() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for reg in registrations {
            let declared = reg
                .resources
                .iter()
                // The key starts with the SHA-256: most resources are
                // ruled out without building theirs.
                .filter(|r| r.required && key.starts_with(&r.sha256) && job_key(r) == key);
            for r in declared {
                if !self.deps.store.has(&r.sha256) {
                    out.push((reg.gem.clone(), r.clone()));
                }
            }
        }
        out
    }

    /// Publishes one event for each waiter of `job`, all observed at the
    /// same instant.
    fn each(&self, job: &Job, event: impl Fn(&Waiter, SystemTime) -> Event) {
        let at = SystemTime::now();
        for waiter in job.lock_waiters().iter() {
            self.emit(event(waiter, at));
        }
    }

    /// Publishes `Started` for every waiter of `job`, once: the first
    /// report about one of its addresses (a connection, a retry, a
    /// fallback) calls it before its own event, so that nothing about the
    /// addresses ever comes before `Started`.
    fn start(&self, job: &Job, sha256: &str, size: u64) {
        if job.started.load(Ordering::Relaxed) {
            return;
        }
        let waiters = job.lock_waiters();
        if job.started.swap(true, Ordering::Relaxed) {
            return;
        }
        let (at, address) = (SystemTime::now(), job.address());
        for w in waiters.iter() {
            self.emit(Event::Started {
                at,
                gem: w.gem.clone(),
                resource: w.resource.clone(),
                sha256: sha256.to_string(),
                size,
                address: address.clone(),
            });
        }
    }

    /// Why `job` stopped, for its `Cancelled` error and event.
    fn cancelled(&self, resource: &Resource, job: &Job) -> Error {
        let reason = match job.why() {
            Some(why) => why,
            None if self.shutdown.is_cancelled() => "the service shut down".into(),
            None => "stopped before it finished".into(),
        };
        Error::Cancelled {
            resource: resource.id.clone(),
            reason,
        }
    }

    async fn run(&self, gem: &str, resource: &Resource, job: &Job) -> JobResult {
        let deps = &self.deps;
        let (sha256, size) = (resource.sha256.clone(), resource.size);
        self.each(job, |w, at| Event::Queued {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: sha256.clone(),
            size,
        });
        let host = resource
            .url
            .host_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let permit = tokio::select! {
            permit = self.slots.acquire(gem, &host, &job.urgent) => permit,
            () = job.cancel.cancelled() => return Err(self.cancelled(resource, job)),
        };
        let mut progress = JobProgress {
            job,
            scheduler: self,
            slot: Handover::new(permit, &self.publishing),
            sha256: &sha256,
            size,
            last: Instant::now(),
            last_bytes: None,
            meter: Meter::new(Instant::now()),
        };
        let outcome = download_for(
            Some(gem),
            &deps.fetcher,
            &deps.store,
            resource,
            deps.retry,
            &mut progress,
            Some(&job.cancel),
        )
        .await;
        // The transfer is over: what follows may wait for the registry
        // lock (another process's install or import), and must not hold a
        // download slot meanwhile.
        drop(progress);
        if job.cancel.is_cancelled() {
            // Stopped by shutdown, uninstall or the user: not a failure.
            return Err(self.cancelled(resource, job));
        }
        let outcome = match outcome {
            Ok(path) => self.still_declared(resource, job, path).await,
            Err(error) => Err(error),
        };
        match outcome {
            Ok(path) => {
                for w in job.waiters() {
                    let clear = deps.registry.set_failure(&w.gem, &w.resource, None);
                    record_outcome(job, &w, clear).await;
                }
                // Each waiter's own name for the bytes, as `path` gives (a
                // link or a copy: file work, off the runtime's workers).
                let (named, served_by) = waiter_paths(deps, &sha256, job.waiters(), &path).await;
                let at = SystemTime::now();
                for (w, file) in named {
                    self.emit(Event::Verified {
                        at,
                        gem: w.gem,
                        resource: w.resource,
                        sha256: sha256.clone(),
                        path: file,
                        served_by: served_by.clone(),
                    });
                }
                Ok(path)
            }
            // Stopped by our own shutdown (or an uninstall) while the
            // download was failing for that very reason (a temporary file
            // cut short, a task cancelled): not a failure of the download.
            Err(_) if job.cancel.is_cancelled() => Err(self.cancelled(resource, job)),
            Err(error @ Error::Cancelled { .. }) => Err(error),
            Err(error) => Err(self.failed(gem, resource, job, error).await),
        }
    }

    /// A download of `resource` that failed with `error`: records the
    /// failure for each waiter, keeps its bytes only while a gem declares
    /// them, and tells each waiter ([`Event::Failed`]); returns `error`.
    async fn failed(&self, gem: &str, resource: &Resource, job: &Job, error: Error) -> Error {
        // The Failed event below is what users see; the log line is for
        // debugging only, so a failure is not printed twice.
        tracing::debug!(gem, "{}: {error}", error.code());
        let record = FailureRecord::new(resource, &error);
        for w in job.waiters() {
            let write = self
                .deps
                .registry
                .set_failure(&w.gem, &w.resource, Some(record.clone()));
            record_outcome(job, &w, write).await;
        }
        self.drop_undeclared_partials(&resource.sha256, job).await;
        self.each(job, |w, at| Event::Failed {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: resource.sha256.clone(),
            code: error.code(),
            primary_cause: error.primary_cause(),
            message: error.to_string(),
        });
        error
    }

    /// After a failed download: bytes no installed gem declares any more
    /// (an uninstall or upgrade, here or in another process, dropped them
    /// while they downloaded) are not kept for resume. The uninstall could
    /// not remove them itself while this download held them. Checked under
    /// the registry lock, as [`Scheduler::still_declared`] does, and given
    /// up when the job is cancelled meanwhile: an uninstall holds that lock
    /// while it waits for the job to stop, and removes the bytes itself.
    async fn drop_undeclared_partials(&self, sha256: &str, job: &Job) {
        let registry = &self.deps.registry;
        let drop = async {
            let _lock = registry.lock().await?;
            if registry.declares(sha256)? {
                return Ok(0);
            }
            let (store, sha) = (self.deps.store.clone(), sha256.to_string());
            crate::store::off_runtime(self.deps.store.root(), move || {
                Ok(store.remove_partials(&sha))
            })
            .await
        };
        let dropped = tokio::select! {
            r = drop => r,
            () = job.cancel.cancelled() => Ok(0),
        };
        match dropped {
            Ok(0) => {}
            Ok(removed) => tracing::debug!(
                sha256,
                removed,
                "removed the bytes of a failed download no installed gem declares"
            ),
            Err(e) => tracing::debug!(sha256, "{}: {e}", e.code()),
        }
    }

    /// Keeps a just-verified file only if an installed gem still declares
    /// it: an uninstall or upgrade (here or in another process) may have
    /// dropped it while it downloaded. Checked under the registry lock, which
    /// install and uninstall hold while they decide what to delete.
    async fn still_declared(
        &self,
        resource: &Resource,
        job: &Job,
        path: PathBuf,
    ) -> Result<PathBuf, Error> {
        let registry = &self.deps.registry;
        // Most often a gem that asked for the file declares it: looked at
        // first, the other registrations are not read.
        let waiters = job.waiters();
        let likely = waiters.iter().map(|w| w.gem.as_str());
        let check = async {
            let _lock = registry.lock().await?;
            let declared = registry.declares_looking_first_at(&resource.sha256, likely)?;
            if !declared {
                let (store, sha256) = (self.deps.store.clone(), resource.sha256.clone());
                let registry = registry.clone();
                let remove = move || {
                    store.remove(&sha256)?;
                    registry.forget_served_by(&sha256);
                    Ok(())
                };
                crate::store::off_runtime(self.deps.store.root(), remove).await?;
            }
            Ok::<bool, Error>(declared)
        };
        let declared = tokio::select! {
            r = check => r?,
            // Uninstall holds the lock while it cancels this job, and
            // deletes the file itself afterwards.
            () = job.cancel.cancelled() => false,
        };
        if declared {
            Ok(path)
        } else {
            Err(Error::Cancelled {
                resource: resource.id.clone(),
                reason: "no installed gem declares it any more".into(),
            })
        }
    }

    /// The SHA-256s of the jobs that are transferring now.
    pub(crate) fn running(&self) -> Vec<String> {
        self.jobs()
            .values()
            .filter(|j| j.started.load(Ordering::Relaxed))
            .map(|j| j.sha256.clone())
            .collect()
    }

    /// What the job downloading `resource` (its bytes, from its
    /// addresses) is doing, if there is one. Another gem's job for the same
    /// bytes from other addresses is not this one's: a job waiting for it
    /// says so ([`JobState::Waiting`]).
    pub(crate) fn state(&self, resource: &Resource) -> Option<JobState> {
        let job = self.jobs().get(&job_key(resource)).cloned()?;
        let waiting_on = job
            .waiting_on
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let retry = job.retry.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Some(match (waiting_on, retry) {
            (Some(on), _) => JobState::Waiting(on),
            (None, Some(retry)) => JobState::Retrying(retry, job.bytes.load(Ordering::Relaxed)),
            (None, None) if job.started.load(Ordering::Relaxed) => JobState::Downloading(
                job.bytes.load(Ordering::Relaxed),
                job.rate.load(Ordering::Relaxed),
            ),
            (None, None) => JobState::Queued,
        })
    }

    /// Cancels every job for `sha256`, saying `why`, and waits until they
    /// have stopped (their temporary files removed).
    pub(crate) async fn cancel(&self, sha256: &str, why: &str) {
        let jobs: Vec<Job> = self
            .jobs()
            .values()
            .filter(|j| j.sha256 == sha256)
            .cloned()
            .collect();
        for mut job in jobs {
            job.cancel_because(why);
            let _ = job.done.wait_for(|r| r.is_some()).await;
        }
    }

    /// Cancels the job downloading `resource` (its bytes, from its
    /// addresses), saying `why`, and waits until it has stopped. Returns
    /// whether there was one.
    pub(crate) async fn cancel_job(&self, resource: &Resource, why: &str) -> bool {
        let job = self.jobs().get(&job_key(resource)).cloned();
        match job {
            Some(mut job) => {
                job.cancel_because(why);
                let _ = job.done.wait_for(|r| r.is_some()).await;
                true
            }
            None => false,
        }
    }

    /// Waits until no job is queued or running.
    pub(crate) async fn idle(&self) {
        loop {
            let pending: Vec<Job> = self.jobs().values().cloned().collect();
            if pending.is_empty() {
                return;
            }
            for mut job in pending {
                let _ = job.done.wait_for(|r| r.is_some()).await;
            }
        }
    }

    /// Cancels every job and waits for all of them to finish.
    pub(crate) async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

/// Turns a job's transfer progress into events (throttled), one for each
/// waiter.
struct JobProgress<'a> {
    job: &'a Job,
    scheduler: &'a Scheduler,
    /// The job's download slot, handed over once its bytes are in.
    slot: Handover<Permit>,
    sha256: &'a str,
    size: u64,
    /// When the last progress event went out (at first: when the job took
    /// its slot).
    last: Instant,
    /// The bytes the last progress event of the current try said.
    last_bytes: Option<u64>,
    /// This try's figures: its rate and time left.
    meter: Meter,
}

impl JobProgress<'_> {
    /// `Started`, unless it went out already.
    fn start(&self) {
        self.scheduler.start(self.job, self.sha256, self.size);
    }
}

impl crate::transfer::fetch::Reporter for JobProgress<'_> {
    /// The slot goes to the next download while this file is made durable
    /// and named (see `transfer::slots`).
    fn transferred(&mut self) {
        self.slot.transferred();
    }

    /// `Started` goes out with the job's first connection, or with a
    /// retry or fallback that comes first: a try refused before connecting
    /// (policy, address rule) announces nothing by itself.
    fn connected(&mut self) {
        self.start();
    }

    fn trying(&mut self, address: &url::Url) {
        // A new try reaches the size afresh.
        self.last_bytes = None;
        // Its own try: no longer waiting for another download.
        *self
            .job
            .waiting_on
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        *self.job.address.lock().unwrap_or_else(|p| p.into_inner()) = address.to_string();
    }

    fn retrying(&mut self, wait: Duration, attempt: u32, of: u32, reason: &str) {
        self.start();
        *self.job.retry.lock().unwrap_or_else(|p| p.into_inner()) = Some(Retry {
            attempt,
            of,
            reason: reason.to_string(),
        });
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let address = self.job.address();
        self.scheduler.each(self.job, |w, at| Event::Retrying {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: self.sha256.to_string(),
            address: address.clone(),
            attempt,
            of,
            wait_ms,
            reason: reason.to_string(),
        });
    }

    fn waiting(&mut self) {
        self.waiting_on(None);
    }

    fn waiting_on(&mut self, on: Option<&str>) {
        let on = on.map(str::to_string);
        *self
            .job
            .waiting_on
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(on.clone());
        self.scheduler.each(self.job, |w, at| Event::Waiting {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: self.sha256.to_string(),
            on: on.clone(),
        });
    }

    fn fell_back(&mut self, failed: &crate::error::Attempt, next: &url::Url) {
        // An address that failed before any connection (refused, not
        // permitted) has not announced the download yet.
        self.start();
        let reason = failed.error.to_string();
        let hop = failed
            .hop
            .as_ref()
            .filter(|hop| *hop != &failed.address)
            .map(|hop| hop.to_string());
        self.scheduler.each(self.job, |w, at| Event::FellBack {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: self.sha256.to_string(),
            from: failed.address.to_string(),
            hop: hop.clone(),
            to: next.to_string(),
            code: failed.code(),
            reason: reason.clone(),
        });
    }

    fn resumed(&mut self, offset: u64) {
        self.start();
        self.job.bytes.store(offset, Ordering::Relaxed);
        self.meter.resumed(Instant::now(), offset);
        let address = self.job.address();
        self.scheduler.each(self.job, |w, at| Event::Resumed {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: self.sha256.to_string(),
            offset,
            size: self.size,
            address: address.clone(),
        });
    }

    /// At most one `Progress` per [`PROGRESS_EVERY`], and the one that
    /// reaches the declared size (once).
    fn bytes(&mut self, bytes: u64) {
        let now = Instant::now();
        if self.last_bytes != Some(bytes) {
            // Bytes flow again: no longer between two tries.
            self.job
                .retry
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
        }
        self.meter.update(now, bytes);
        let rate = self.meter.rate(now);
        self.job.bytes.store(bytes, Ordering::Relaxed);
        self.job.rate.store(rate as u64, Ordering::Relaxed);
        let last = bytes == self.size && self.last_bytes != Some(bytes);
        if self.last.elapsed() < PROGRESS_EVERY && !last {
            return;
        }
        self.start();
        self.last = Instant::now();
        self.last_bytes = Some(bytes);
        let address = self.job.address();
        let eta_secs = self.meter.time_left(now, self.size).map(|d| d.as_secs());
        self.scheduler.each(self.job, |w, at| Event::Progress {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: self.sha256.to_string(),
            bytes,
            size: self.size,
            address: address.clone(),
            bytes_per_sec: rate as u64,
            eta_secs,
        });
    }
}

/// Each waiter with its own name for the verified bytes of `sha256` at
/// `path` (`path` itself where no name can be made), and the address that
/// served them as the registry records it: file work, on a blocking thread.
async fn waiter_paths(
    deps: &Deps,
    sha256: &str,
    waiters: Vec<Waiter>,
    path: &Path,
) -> (Vec<(Waiter, PathBuf)>, Option<String>) {
    let (store, registry) = (deps.store.clone(), deps.registry.clone());
    let sha256 = sha256.to_string();
    let files: Vec<String> = waiters.iter().map(|w| w.file.clone()).collect();
    let verified = path.to_path_buf();
    let name = move || {
        // The name the download just verified and published is handed
        // out as it is (most often every waiter's); another is looked for,
        // linked or copied.
        let named = files.iter().map(|f| {
            if verified.file_name() == Some(std::ffi::OsStr::new(f)) {
                Some(verified.clone())
            } else {
                store.find(&sha256, f).ok().flatten()
            }
        });
        Ok((named.collect::<Vec<_>>(), registry.served_by(&sha256)))
    };
    let (named, served_by) = crate::store::off_runtime(path, name)
        .await
        .unwrap_or_default();
    let mut named = named.into_iter();
    let named = waiters
        .into_iter()
        .map(|w| {
            let file = named.next().flatten();
            (w, file.unwrap_or_else(|| path.to_path_buf()))
        })
        .collect();
    (named, served_by)
}

/// Writes a job's failure record (or clears it) unless the job is cancelled
/// meanwhile. Writing takes the registry lock, and install and uninstall
/// hold that lock while they cancel a job and wait for it to end: waiting
/// for the lock regardless would deadlock them.
///
/// A record that cannot be written (a full disk) is logged and nothing
/// more: the download's own outcome still goes to every caller and event,
/// never replaced by the record's error.
async fn record_outcome(
    job: &Job,
    waiter: &Waiter,
    write: impl std::future::Future<Output = crate::error::Result<()>>,
) {
    tokio::select! {
        result = write => {
            if let Err(e) = result {
                tracing::warn!(
                    gem = %waiter.gem,
                    resource = %waiter.resource,
                    "the outcome of the download could not be recorded, and is reported all the same: {}: {e}",
                    e.code()
                );
            }
        }
        () = job.cancel.cancelled() => {}
    }
}
