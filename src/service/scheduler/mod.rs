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
mod job;
mod progress;
mod run;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::runtime::Handle;
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::Error;
use crate::manifest::Resource;
use crate::service::events::{Event, Events};
use crate::service::limiter::Limiter;
use crate::service::retry::Retries;
use crate::store::registry::Registry;
use crate::store::Store;
use crate::transfer::download::RetryPolicy;
use crate::transfer::fetch::Fetcher;

use self::job::{job_key, Job, Waiter};
pub(crate) use self::job::{Caller, JobResult, JobState};

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
    /// that gave their download slot back (see `transfer::slots`).
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
            publishing: Arc::new(Semaphore::new(crate::transfer::slots::publishing_places(
                global,
            ))),
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
        // A job whose cancellation has begun is not joined: the new job
        // waits for it to end, then continues from the bytes it kept.
        let (job, dying) = match jobs.get(&key) {
            Some(job) if job.join(caller.is_some()) => (Some(job), None),
            Some(job) => (None, Some(job.done.clone())),
            None => (None, None),
        };
        if let Some(job) = job {
            if let Some(caller) = caller {
                caller.job = Some(job.clone());
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
            joins: Arc::new(Mutex::new(())),
        };
        if let Some(caller) = caller {
            caller.job = Some(job.clone());
        }
        jobs.insert(key.clone(), job.clone());
        drop(jobs);
        let this = self.clone();
        let (gem, resource) = (gem.to_string(), resource.clone());
        let task = async move {
            if let Some(mut dying) = dying {
                // Waited for even when this job is cancelled meanwhile (it
                // is already stopping): whoever waits for this job to end
                // (an uninstall about to remove the kept bytes) then knows
                // that one has ended too.
                tracing::debug!(gem, resource = %resource.id, "waiting for a stopping download of the same file to end");
                let _ = dying.wait_for(|r| r.is_some()).await;
            }
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
                Err(_) => this.retry_later(&key),
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
