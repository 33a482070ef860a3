//! The run of a job: a slot, the download, the outcome recorded and told
//! to each waiter; and the timer that queues a failed required file again.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::error::Error;
use crate::manifest::Resource;
use crate::service::events::Event;
use crate::service::retry;
use crate::service::scheduler::job::{job_key, Job, Waiter};
use crate::service::scheduler::progress::JobProgress;
use crate::service::scheduler::{Deps, JobResult, Scheduler};
use crate::store::registry::FailureRecord;
use crate::transfer::download::download_for;
use crate::transfer::meter::Meter;
use crate::transfer::slots::Handover;

impl Scheduler {
    /// Plans the next try of the job of `key` after it failed with
    /// `error` (see [`crate::service::retry`]), when an installed gem
    /// declares it as a required file that is missing: returns when that
    /// try is due. [`Scheduler::retry_later`] starts the timer.
    pub(super) fn plan_retry(&self, key: &str, error: &Error) -> Option<SystemTime> {
        let base = self.deps.retry_failed_after?;
        if self.required_now(key).is_empty() {
            return None;
        }
        let (failures, _) = self.retries.failed(key);
        let wait = retry::delay(base, failures, retry::retry_after(error));
        tracing::debug!(
            failures,
            ?wait,
            "a failed required file is tried again after a wait"
        );
        self.retries.plan(key, wait)
    }

    /// When the next try of `resource`'s download is due, while a failed
    /// required file waits for it.
    pub(crate) fn next_try(&self, resource: &Resource) -> Option<SystemTime> {
        self.retries.due(&job_key(resource))
    }

    /// Queues the job of `key` again once the wait [`Scheduler::plan_retry`]
    /// planned is over, for every installed gem that then declares it as a
    /// required file that is missing. Not only for the gems that waited
    /// for this try: the timer replaces the one a former try of the same
    /// bytes set, whose gems may still need them when this try's gems are
    /// gone.
    pub(super) fn retry_later(self: &Arc<Self>, key: &str) {
        let Some((wait, timer)) = self.retries.arm(key) else {
            return;
        };
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
        // The key starts with the SHA-256: only the resources declaring it
        // are looked at, however many the gems declare.
        let sha256 = key.split(' ').next().unwrap_or_default();
        let Ok(declaring) = self.deps.registry.declaring(sha256) else {
            return Vec::new();
        };
        declaring
            .into_iter()
            .filter(|(_, r)| r.required && job_key(r) == key && !self.deps.store.has(&r.sha256))
            .collect()
    }

    /// Publishes one event for each waiter of `job`, all observed at the
    /// same instant.
    pub(super) fn each(&self, job: &Job, event: impl Fn(&Waiter, SystemTime) -> Event) {
        let at = SystemTime::now();
        for waiter in job.lock_waiters().iter() {
            self.emit(event(waiter, at));
        }
    }

    /// Publishes `Started` for every waiter of `job`, once: the first
    /// report about one of its addresses (a connection, a retry, a
    /// fallback) calls it before its own event, so that nothing about the
    /// addresses ever comes before `Started`.
    pub(super) fn start(&self, job: &Job, sha256: &str, size: u64) {
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

    pub(super) async fn run(&self, gem: &str, resource: &Resource, job: &Job) -> JobResult {
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
        let next_try = self.plan_retry(&job_key(resource), &error);
        self.each(job, |w, at| Event::Failed {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: resource.sha256.clone(),
            code: error.code(),
            primary_cause: error.primary_cause(),
            message: error.to_string(),
            next_try,
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
        // Most often a gem that asked for the file declares it: looked at
        // first, the other registrations are not read nor `gems/` listed.
        let waiters = job.waiters();
        let likely = waiters.iter().map(|w| w.gem.as_str());
        let drop = async {
            let _lock = registry.lock().await?;
            if registry.declares_looking_first_at(sha256, likely)? {
                return Ok(0);
            }
            let (store, sha) = (self.deps.store.clone(), sha256.to_string());
            crate::store::quick_step(self.deps.store.root(), move || {
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
