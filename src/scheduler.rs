//! Runs downloads: one job per SHA-256, bounded concurrency, cancellation.
//!
//! However many callers want the same bytes from the same addresses (a
//! background install, several tools calling `path`), there is one job; each
//! caller waits on its result. Jobs are keyed by SHA-256 *and* address list:
//! a gem whose addresses fail must not decide the fate of another gem that
//! declares the same bytes elsewhere. Two such jobs still make at most one
//! transfer at a time (the store's per-SHA-256 lock), and the second finds
//! the file in place when the first succeeded.
//! A job takes a slot (global and per host at once, [`Limiter`]), downloads,
//! records the outcome, and publishes events. Jobs are tracked so shutdown
//! can cancel them and wait until every temporary file is gone.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::download::{download_with, RetryPolicy};
use crate::error::Error;
use crate::events::Event;
use crate::fetch::Fetcher;
use crate::limiter::Limiter;
use crate::manifest::Resource;
use crate::registry::{FailureRecord, Registry};
use crate::store::Store;

/// How often progress events are published per download at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// The outcome every waiter of a job gets.
pub(crate) type JobResult = Result<PathBuf, Arc<Error>>;

/// What a job is doing, for status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for a slot.
    Queued,
    /// Transferring; bytes received so far.
    Downloading(u64),
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
    /// Whether it holds its slots and is transferring.
    started: Arc<AtomicBool>,
    /// Bytes received by the current attempt.
    bytes: Arc<AtomicU64>,
    /// Resolves once with the outcome.
    done: watch::Receiver<Option<JobResult>>,
    /// The SHA-256 it downloads.
    sha256: String,
    /// Every (gem, resource id) waiting on it, for their failure records.
    waiters: Arc<Mutex<Vec<(String, String)>>>,
}

impl Job {
    fn add_waiter(&self, gem: &str, resource: &str) {
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if !waiters.iter().any(|(g, r)| g == gem && r == resource) {
            waiters.push((gem.to_string(), resource.to_string()));
        }
    }

    fn waiters(&self) -> Vec<(String, String)> {
        self.waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
    /// Rounds over the address list after transient failures.
    pub retry: RetryPolicy,
    /// Event channel.
    pub events: broadcast::Sender<Event>,
}

/// The download scheduler.
pub(crate) struct Scheduler {
    deps: Deps,
    /// Download slots: global, and per host (of the resource's `url`).
    slots: Arc<Limiter>,
    /// Jobs by SHA-256.
    jobs: Mutex<HashMap<String, Job>>,
    /// Next job id.
    next_id: AtomicU64,
    /// Every job task, for a clean drain on shutdown.
    tracker: TaskTracker,
    /// Cancels every job at shutdown.
    shutdown: CancellationToken,
}

impl Scheduler {
    pub(crate) fn new(deps: Deps, global: usize, per_host: usize) -> Scheduler {
        Scheduler {
            deps,
            slots: Limiter::new(global, per_host),
            jobs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
        }
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
        let key = job_key(resource);
        let mut jobs = self.jobs();
        if let Some(job) = jobs.get(&key) {
            if urgent {
                job.urgent.store(true, Ordering::Relaxed);
            }
            job.add_waiter(gem, &resource.id);
            tracing::debug!(gem, resource = %resource.id, "joining the download in progress");
            return job.done.clone();
        }
        let (tx, rx) = watch::channel(None);
        let job = Job {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            urgent: Arc::new(AtomicBool::new(urgent)),
            cancel: self.shutdown.child_token(),
            started: Arc::new(AtomicBool::new(false)),
            bytes: Arc::new(AtomicU64::new(0)),
            done: rx.clone(),
            sha256: resource.sha256.clone(),
            waiters: Arc::new(Mutex::new(vec![(gem.to_string(), resource.id.clone())])),
        };
        jobs.insert(key.clone(), job.clone());
        drop(jobs);
        let this = self.clone();
        let (gem, resource) = (gem.to_string(), resource.clone());
        self.tracker.spawn(async move {
            let result = this.run(&gem, &resource, &job).await;
            {
                let mut jobs = this.jobs();
                if jobs.get(&key).is_some_and(|j| j.id == job.id) {
                    jobs.remove(&key);
                }
            }
            let _ = tx.send(Some(result));
        });
        rx
    }

    async fn run(&self, gem: &str, resource: &Resource, job: &Job) -> JobResult {
        let deps = &self.deps;
        let emit = |event: Event| {
            let _ = deps.events.send(event);
        };
        let (gem_s, id, size) = (gem.to_string(), resource.id.clone(), resource.size);
        emit(Event::Queued {
            gem: gem_s.clone(),
            resource: id.clone(),
            size,
        });
        let cancelled = || {
            Arc::new(Error::Cancelled {
                resource: resource.id.clone(),
                reason: "stopped before it finished".into(),
            })
        };
        let host = resource
            .url
            .host_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let _permit = tokio::select! {
            permit = self.slots.acquire(gem, &host, &job.urgent) => permit,
            () = job.cancel.cancelled() => return Err(cancelled()),
        };
        job.started.store(true, Ordering::Relaxed);
        emit(Event::Started {
            gem: gem_s.clone(),
            resource: id.clone(),
            size,
        });
        let mut progress = JobProgress {
            job,
            emit: &emit,
            gem: &gem_s,
            resource: &id,
            size,
            last: Instant::now(),
        };
        let outcome = download_with(
            &deps.fetcher,
            &deps.store,
            resource,
            deps.retry,
            &mut progress,
            Some(&job.cancel),
        )
        .await;
        if job.cancel.is_cancelled() {
            // Stopped by shutdown, uninstall or the user: not a failure.
            return Err(cancelled());
        }
        let outcome = match outcome {
            Ok(path) => self.still_declared(resource, job, path).await,
            Err(error) => Err(error),
        };
        match outcome {
            Ok(path) => {
                for (gem, rid) in job.waiters() {
                    record_outcome(job, deps.registry.set_failure(&gem, &rid, None)).await;
                }
                emit(Event::Verified {
                    gem: gem_s,
                    resource: id,
                    path: path.clone(),
                });
                Ok(path)
            }
            // Stopped by our own shutdown (or an uninstall) while the
            // download was failing for that very reason (a temporary file
            // cut short, a task cancelled): not a failure of the download.
            Err(_) if job.cancel.is_cancelled() => Err(cancelled()),
            Err(error) => {
                // The Failed event below is what users see; the log line is
                // for debugging only, so a failure is not printed twice.
                tracing::debug!(gem, "{error}");
                let record = FailureRecord::from_error(&error);
                for (gem, rid) in job.waiters() {
                    let write = deps.registry.set_failure(&gem, &rid, Some(record.clone()));
                    record_outcome(job, write).await;
                }
                emit(Event::Failed {
                    gem: gem_s,
                    resource: id,
                    code: error.code().to_string(),
                    message: error.to_string(),
                });
                Err(Arc::new(error))
            }
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
        let check = async {
            let _lock = registry.lock().await?;
            let declared = registry.declares(&resource.sha256)?;
            if !declared {
                self.deps.store.remove(&resource.sha256)?;
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

    /// What the job for `sha256` is doing, if there is one.
    pub(crate) fn state(&self, sha256: &str) -> Option<JobState> {
        let jobs = self.jobs();
        let mut mine = jobs.values().filter(|j| j.sha256 == sha256).peekable();
        mine.peek()?;
        let started = mine.find(|j| j.started.load(Ordering::Relaxed));
        Some(match started {
            Some(job) => JobState::Downloading(job.bytes.load(Ordering::Relaxed)),
            None => JobState::Queued,
        })
    }

    /// Cancels every job for `sha256` and waits until they have stopped
    /// (their temporary files removed).
    pub(crate) async fn cancel(&self, sha256: &str) {
        let jobs: Vec<Job> = self
            .jobs()
            .values()
            .filter(|j| j.sha256 == sha256)
            .cloned()
            .collect();
        for mut job in jobs {
            job.cancel.cancel();
            let _ = job.done.wait_for(|r| r.is_some()).await;
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

/// Turns a job's transfer progress into events (throttled).
struct JobProgress<'a, E: Fn(Event) + Sync> {
    job: &'a Job,
    emit: &'a E,
    gem: &'a str,
    resource: &'a str,
    size: u64,
    /// When the last progress event went out.
    last: Instant,
}

impl<E: Fn(Event) + Sync> crate::fetch::Reporter for JobProgress<'_, E> {
    fn resumed(&mut self, offset: u64) {
        self.job.bytes.store(offset, Ordering::Relaxed);
        (self.emit)(Event::Resumed {
            gem: self.gem.to_string(),
            resource: self.resource.to_string(),
            offset,
            size: self.size,
        });
    }

    fn bytes(&mut self, bytes: u64) {
        self.job.bytes.store(bytes, Ordering::Relaxed);
        if self.last.elapsed() >= PROGRESS_EVERY || bytes == self.size {
            self.last = Instant::now();
            (self.emit)(Event::Progress {
                gem: self.gem.to_string(),
                resource: self.resource.to_string(),
                bytes,
                size: self.size,
            });
        }
    }
}

/// Writes a job's failure record (or clears it) unless the job is cancelled
/// meanwhile. Writing takes the registry lock, and install and uninstall
/// hold that lock while they cancel a job and wait for it to end: waiting
/// for the lock regardless would deadlock them.
async fn record_outcome(
    job: &Job,
    write: impl std::future::Future<Output = crate::error::Result<()>>,
) {
    tokio::select! {
        result = write => {
            if let Err(e) = result {
                tracing::warn!("{e}");
            }
        }
        () = job.cancel.cancelled() => {}
    }
}
