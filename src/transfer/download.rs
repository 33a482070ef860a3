//! One resource, downloaded exactly once into the store.
//!
//! This is the one place that decides "try the next address": the url, then
//! each mirror in order. Each address is tried until [`crate::transfer::retry`] says
//! to move on: transient failures (network, `408`, `429`, `5xx`) are
//! retried on the same address after a backoff (or the server's
//! `Retry-After`), continuing the bytes already received with `Range`;
//! permanent ones move on at once.
//!
//! Patience with one address: a failed try that moved the kept (durable)
//! bytes past every earlier try of that address gives back the retries
//! used so far; one that kept nothing new uses one up, however many bytes
//! it received. Forgiveness is
//! bounded: once the address's tries together, stalls and backoff
//! included, keep fewer than `network.min_bytes_per_min` bytes over a
//! minute, the next address is tried, so a source that drips a little per
//! try cannot hold the download.
//!
//! Other downloads of the same file (see [`crate::store::lanes`]): one from
//! the same addresses is waited for, however long it takes, since it
//! fetches the same bytes from the same servers and its failure is this
//! one's too; so is one for the same gem. One from other addresses
//! (another gem's, here or in another process) is waited for at most
//! `network.wait_for_others_secs`; then this download fetches from its own
//! addresses in a lane of its own. Whichever verifies first is published,
//! and every download of the file stops once it finds the file in place
//! (checked twice a second).
//!
//! Resume rules:
//! - the partial file is continued only with the address it came from
//!   (a validator belongs to one server), and only once that address is the
//!   one being tried; another address's `200` starts it afresh;
//! - a resumed file that fails the final size or SHA-256 check may hold bad
//!   old bytes: it is discarded and the same address is tried once more from
//!   zero before moving on.

use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;
use url::Url;

use crate::error::{Attempt, AttemptError, Error, Result};
use crate::manifest::Resource;
use crate::store::lanes::{Holder, LaneLock};
use crate::store::partial::PartialPaths;
use crate::store::registry::{Registry, SERVED_BY_CACHE};
use crate::store::Store;
use crate::transfer::fetch::{Control, Expected, Fetcher, Output, Reporter, Resume, TransferError};
use crate::transfer::parts::PARTS_MIN_BYTES;
use crate::transfer::patience::{Patience, Progress};
use crate::transfer::retry::Decision;
pub use crate::transfer::retry::RetryPolicy;

/// How often a download looks whether another one published its file.
const WATCH_EVERY: Duration = Duration::from_millis(500);
/// Longest pause between two looks at a lane another download holds.
const MAX_LANE_PAUSE: Duration = Duration::from_millis(100);

/// Returns the local path of `resource`, downloading and verifying it first
/// when the store does not have it. `progress` receives the bytes of the
/// file present so far.
///
/// Other tasks and processes that want the same bytes wait on the store's
/// lock and then find the file in place.
pub async fn download(
    fetcher: &Fetcher,
    store: &Store,
    resource: &Resource,
    retry: RetryPolicy,
    progress: &mut dyn Reporter,
) -> Result<PathBuf> {
    download_with(fetcher, store, resource, retry, progress, None).await
}

/// [`download`] that stops when `cancel` fires, with
/// [`Error::Cancelled`]; the bytes received so far are kept for the next
/// try.
pub async fn download_with(
    fetcher: &Fetcher,
    store: &Store,
    resource: &Resource,
    retry: RetryPolicy,
    progress: &mut dyn Reporter,
    cancel: Option<&CancellationToken>,
) -> Result<PathBuf> {
    download_for(None, fetcher, store, resource, retry, progress, cancel).await
}

/// [`download_with`] for `gem`, which other downloads of the same file
/// name when they wait for this one.
pub(crate) async fn download_for(
    gem: Option<&str>,
    fetcher: &Fetcher,
    store: &Store,
    resource: &Resource,
    retry: RetryPolicy,
    progress: &mut dyn Reporter,
    cancel: Option<&CancellationToken>,
) -> Result<PathBuf> {
    let name = resource.file_name();
    if let Some(path) = stored_or_writable(gem, store, resource, &name).await? {
        return Ok(path);
    }
    let addresses: Vec<String> = resource.addresses().map(|a| a.to_string()).collect();
    let waiting_since = std::time::SystemTime::now();
    let taken = take_lane(gem, fetcher, store, resource, &addresses, progress, cancel).await?;
    let (lock, waited) = match taken {
        Lane::Found(path) => return Ok(path),
        Lane::Taken { lock, waited } => (lock, waited),
    };
    let nothing = match store.find_unchanged_or_nothing(&resource.sha256, &name)? {
        Ok(path) => return Ok(path),
        Err(nothing) => nothing,
    };
    // A download of the same bytes from the same addresses that failed while
    // this caller waited for the lock (another process sharing the store)
    // is this caller's result too; only a later call tries again.
    let shared = waited
        .then(|| store.failure_since(&resource.sha256, resource.size, &addresses, waiting_since))
        .flatten();
    if let Some(failure) = shared {
        return Err(failure.to_error());
    }
    // File-system work (creating the file, renames) runs off the runtime's
    // workers while the disk is slow: it would stall every transfer. With
    // something of the file stored, the look may link, copy or hash it:
    // never a short step.
    let grace = fetcher.wait_for_others();
    let prepared = file_step(store, nothing, {
        let (store, id, sha256, size, name) = (
            store.clone(),
            resource.id.clone(),
            resource.sha256.clone(),
            resource.size,
            name.clone(),
        );
        // Bytes kept from the cache resume too.
        let addresses = fetcher.kept_addresses(&addresses, &resource.sha256);
        move || {
            // Published under another name meanwhile: linked or copied
            // here, not downloaded (in the same trip to the disk).
            if !nothing {
                if let Some(path) = store.find(&sha256, &name)? {
                    return Ok(Err(path));
                }
            }
            let paths = store.sort_and_prepare(&lock, &id, &sha256, size, &addresses, grace)?;
            Ok(Ok((lock, paths)))
        }
    })
    .await?;
    let (lock, paths) = match prepared {
        Ok(prepared) => prepared,
        Err(found) => return Ok(found),
    };
    // A new download (no record may exist) starts from an empty file:
    // nothing to look at.
    let held = if paths.may_have_record() {
        paths.held()
    } else {
        0
    };
    lock.describe(&Holder::new(gem, &addresses, held));
    // Stops when the caller cancels, or when another download published
    // the file.
    let stop = cancel.map_or_else(CancellationToken::new, CancellationToken::child_token);
    let job = Job {
        fetcher,
        resource,
        paths: &paths,
        retry,
        cancel: Some(&stop),
    };
    let outcome = job.run_watched(store, &stop, progress).await;
    let from_cache = matches!(&outcome, Ok(served) if served == SERVED_BY_CACHE);
    let stage = {
        let (store, sha256, size) = (store.clone(), resource.sha256.clone(), resource.size);
        // The lock goes with the work: it is released when the file is
        // published (on the thread of its group), even if this caller
        // stops waiting for that.
        move || {
            // Another download of the file published it first: its copy is
            // this one's, and the bytes here are not needed.
            if let Some(path) = store.find(&sha256, &name)? {
                paths.remove();
                return Ok(Err(path));
            }
            let transferred = outcome.is_ok();
            let staged = outcome.and_then(|served| {
                // What served it is recorded before the file takes its
                // name: whoever finds it published (another download
                // waiting for it) finds that too.
                store.stage(&paths, &sha256, &name, served.as_str())
            });
            let settle = {
                let (store, paths) = (store.clone(), paths.clone());
                move |result: &Result<PathBuf>| {
                    let _lock = lock;
                    let ended = Ended {
                        sha256: &sha256,
                        size,
                        addresses: &addresses,
                        transferred,
                    };
                    settle(&store, &paths, &ended, result);
                }
            };
            match staged {
                Ok(staged) => Ok(Ok(staged.then(Box::new(settle)))),
                Err(e) => {
                    let result = Err(e);
                    settle(&result);
                    result.map(Err)
                }
            }
        }
    };
    // The look at the store may link, copy or hash a file another download
    // published meanwhile: a short step only when there is none.
    let short = !store.has(&resource.sha256);
    let path = match file_step(store, short, stage).await? {
        Err(found) => return Ok(found),
        // Made durable and named with the other files verified meanwhile.
        Ok(staged) => store.publish_grouped(staged).await?,
    };
    if !from_cache {
        // Verified from its own addresses: the cache may have it too
        // (`[cache] push`), uploaded in the background.
        fetcher.offer_to_cache(&resource.sha256, resource.size, &path);
    }
    Ok(path)
}

/// The file when the store has it (under this name, or another one linked
/// or copied here), or `None` once the store is known to take a download.
async fn stored_or_writable(
    gem: Option<&str>,
    store: &Store,
    resource: &Resource,
    name: &str,
) -> Result<Option<PathBuf>> {
    let nothing = match store.find_unchanged_or_nothing(&resource.sha256, name)? {
        Ok(path) => return Ok(Some(path)),
        Err(nothing) => nothing,
    };
    // A store this user may only read cannot take a download; say so
    // before a lock file fails. In the same trip off the runtime: the file
    // linked or copied from another name, or hashed again when it changed.
    // With nothing of the file stored and the store found writable a moment
    // ago (many downloads starting together), there is no trip to make.
    if nothing && store.known_writable() {
        return Ok(None);
    }
    let what = match gem {
        Some(gem) => format!("{gem}/{} ({name})", resource.id),
        None => format!("{} ({name})", resource.id),
    };
    crate::store::off_runtime(store.root(), {
        let (store, sha256, name) = (store.clone(), resource.sha256.clone(), name.to_string());
        move || {
            if !nothing {
                if let Some(path) = store.find(&sha256, &name)? {
                    return Ok(Some(path));
                }
            }
            store.check_writable(&what).map(|()| None)
        }
    })
    .await
}

/// Runs `work` on the store: a [`crate::store::quick_step`] when it is
/// `short` (a few system calls, no flush, no file linked, copied or hashed),
/// else on the blocking threads.
async fn file_step<T: Send + 'static>(
    store: &Store,
    short: bool,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    if short {
        crate::store::quick_step(store.root(), work).await
    } else {
        crate::store::off_runtime(store.root(), work).await
    }
}

/// A download that ended, as [`settle`] needs it.
struct Ended<'a> {
    sha256: &'a str,
    size: u64,
    addresses: &'a [String],
    /// Whether its bytes all arrived and were verified.
    transferred: bool,
}

/// What follows a download's publication (or its failure), with a lane
/// of the file held: its failure recorded for other processes, or the
/// last one forgotten, and bytes that can never be resumed removed.
fn settle(store: &Store, paths: &PartialPaths, ended: &Ended<'_>, result: &Result<PathBuf>) {
    let Ended {
        sha256,
        size,
        addresses,
        transferred,
    } = *ended;
    if result.is_err() {
        // A verified file that could not be published: what served it
        // is not recorded for a file the store does not hold.
        if transferred && !store.has(sha256) {
            Registry::new(store).forget_served_by(sha256);
        }
        if paths.kept().is_none() {
            // Nothing in it can be resumed.
            paths.remove();
        }
    }
    match result {
        Ok(_) => store.clear_failure(sha256),
        Err(Error::Cancelled { .. }) => {}
        Err(e) => store.record_failure(sha256, size, addresses, e),
    }
}

/// What [`take_lane`] ends with.
enum Lane {
    /// Another download published the file meanwhile.
    Found(PathBuf),
    /// A lane of the file is this download's; `waited` says whether another
    /// download held the file first.
    Taken { lock: LaneLock, waited: bool },
}

/// Takes a lane of `resource`'s file for `gem`: lane 0 when it is free,
/// else waits for its holder, as long as it takes when that one fetches
/// from the same `addresses` or for the same gem, else at most
/// `network.wait_for_others_secs`, then a free lane of its own. Ends early
/// when the file is published meanwhile.
async fn take_lane(
    gem: Option<&str>,
    fetcher: &Fetcher,
    store: &Store,
    resource: &Resource,
    addresses: &[String],
    progress: &mut dyn Reporter,
    cancel: Option<&CancellationToken>,
) -> Result<Lane> {
    let (sha256, size) = (&resource.sha256, resource.size);
    let patience = fetcher.wait_for_others();
    let since = Instant::now();
    let mut pause = Duration::from_millis(2);
    let mut announced = false;
    loop {
        // A download from the same addresses, or for the same gem, anywhere
        // in the lanes: this one waits for it, whatever lane is free.
        let in_use = store.lanes_in_use(sha256, size);
        let ours = in_use.iter().find(|l| {
            l.holder.as_ref().is_some_and(|h| {
                h.addresses == addresses || (gem.is_some() && h.gem.as_deref() == gem)
            })
        });
        if ours.is_none() {
            if let Some(lock) = store.try_lock_lane(sha256, size, 0)? {
                return Ok(Lane::Taken {
                    lock,
                    waited: announced,
                });
            }
            if since.elapsed() >= patience {
                if let Some(lock) = store.try_lock_other_lane(sha256, size, addresses)? {
                    tracing::info!(
                        resource = %resource.id,
                        "another download of the same file from other addresses has not finished in {:.0}s: fetching from this resource's own addresses as well",
                        patience.as_secs_f64()
                    );
                    return Ok(Lane::Taken { lock, waited: true });
                }
            }
        }
        if !announced {
            tracing::debug!(sha256 = %sha256, "waiting for another download of the same file");
            let holder = ours.or(in_use.first()).and_then(|l| l.holder.as_ref());
            progress.waiting_on(holder.and_then(|h| h.gem.as_deref()));
            announced = true;
        }
        let sleep = tokio::time::sleep(pause);
        match cancel {
            Some(token) => tokio::select! {
                () = sleep => {}
                () = token.cancelled() => return Err(cancelled(resource)),
            },
            None => sleep.await,
        }
        pause = (pause * 2).min(MAX_LANE_PAUSE);
        if let Some(path) = store.find(sha256, &resource.file_name())? {
            return Ok(Lane::Found(path));
        }
    }
}

/// Resolves once the store holds `sha256` (another download published it).
async fn published_elsewhere(store: &Store, sha256: &str) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        if store.has(sha256) {
            return;
        }
    }
}

/// The resume that `kept` bytes recorded by `meta` allow for a file of
/// `size` bytes: when they all lie inside the file, leave something to
/// fetch, and carry a validator.
fn resumable(meta: crate::store::partial::PartialMeta, kept: u64, size: u64) -> Option<Resume> {
    if kept >= size || meta.end() > size {
        return None;
    }
    Some(Resume {
        offset: meta.durable,
        validator: meta.validator?,
        ranges: meta.ranges,
    })
}

/// A local failure of a download of `resource` from `address`: a full disk
/// (`E_RESOURCE_DISK_SPACE`) names the resource and the address besides the
/// partial file it was writing.
fn local_failure(e: Error, resource: &Resource, address: &Url) -> Error {
    match e {
        Error::DiskFull {
            context,
            path,
            needed,
            available,
            source,
        } => Error::DiskFull {
            context: format!("resource {:?} from {address}: {context}", resource.id),
            path,
            needed,
            available,
            source,
        },
        other => other,
    }
}

fn cancelled(resource: &Resource) -> Error {
    Error::Cancelled {
        resource: resource.id.clone(),
        reason: "stopped before it finished".into(),
    }
}

/// One download over the address list, with a lane of the file held.
pub(super) struct Job<'a> {
    pub(super) fetcher: &'a Fetcher,
    pub(super) resource: &'a Resource,
    pub(super) paths: &'a PartialPaths,
    pub(super) retry: RetryPolicy,
    pub(super) cancel: Option<&'a CancellationToken>,
}

impl Job<'_> {
    /// [`Job::run`], stopped (with `stop`) when another download publishes
    /// the file; says the transfer is over once its bytes are verified.
    async fn run_watched(
        &self,
        store: &Store,
        stop: &CancellationToken,
        progress: &mut dyn Reporter,
    ) -> Result<String> {
        let outcome = {
            let run = self.run(progress);
            tokio::pin!(run);
            tokio::select! {
                outcome = &mut run => outcome,
                () = published_elsewhere(store, &self.resource.sha256) => {
                    tracing::debug!(resource = %self.resource.id, "another download published the file: this one stops");
                    stop.cancel();
                    run.await
                }
            }
        };
        if outcome.is_ok() {
            progress.transferred();
        }
        outcome
    }

    /// Leaves verified bytes in the partial file and returns the address
    /// that served them (the url when its parts also came from the
    /// mirrors; [`SERVED_BY_CACHE`] from the `[cache]` registry), or fails
    /// with every address's last reason.
    async fn run(&self, progress: &mut dyn Reporter) -> Result<String> {
        let mut attempts: Vec<Attempt> = Vec::new();
        match self.try_cache(progress).await {
            Ok(true) => return Ok(SERVED_BY_CACHE.to_string()),
            Ok(false) => {}
            Err(TransferError::Local(e)) => {
                return Err(local_failure(e, self.resource, &self.resource.url))
            }
            Err(TransferError::Cancelled) => return Err(cancelled(self.resource)),
            // Said and logged by `try_cache`; the file's own addresses
            // follow.
            Err(TransferError::Attempt(_)) => {}
        }
        if self.spreads() {
            match self.spread(progress).await {
                Ok(()) => return Ok(self.resource.url.to_string()),
                Err(TransferError::Attempt(a)) => {
                    // No part of it is trusted: one source at a time, in
                    // the manifest's order, so a source that sends wrong
                    // bytes is found and named.
                    tracing::info!(resource = %self.resource.id, "{a}; fetching from one source at a time");
                    self.on_disk(PartialPaths::remove).await;
                }
                Err(TransferError::Local(e)) => {
                    return Err(local_failure(e, self.resource, &self.resource.url))
                }
                Err(TransferError::Cancelled) => return Err(cancelled(self.resource)),
            }
        }
        let addresses: Vec<&Url> = self.resource.addresses().collect();
        for (index, address) in addresses.iter().copied().enumerate() {
            match self.address(address, progress).await {
                Ok(()) => return Ok(address.to_string()),
                Err(TransferError::Attempt(a)) if index + 1 < addresses.len() => {
                    // The reporter says it (a warning, an event); the log
                    // keeps it for debugging.
                    tracing::info!(resource = %self.resource.id, "{a}; trying the next address");
                    progress.fell_back(&a, addresses[index + 1]);
                    attempts.push(a);
                }
                Err(TransferError::Attempt(a)) => {
                    tracing::debug!(resource = %self.resource.id, "{a}");
                    attempts.push(a);
                }
                Err(TransferError::Local(e)) => {
                    return Err(local_failure(e, self.resource, address))
                }
                Err(TransferError::Cancelled) => return Err(cancelled(self.resource)),
            }
        }
        Err(Error::Unavailable {
            resource: self.resource.id.clone(),
            attempts,
        })
    }

    /// Whether the parts come from the url and the mirrors at once
    /// (`network.spread_over_mirrors`, a large file with mirrors).
    fn spreads(&self) -> bool {
        self.fetcher.spreads()
            && !self.resource.mirrors.is_empty()
            && self.resource.size >= PARTS_MIN_BYTES
    }

    /// One try of the url whose parts also come from the mirrors.
    async fn spread(&self, progress: &mut dyn Reporter) -> Result<(), TransferError> {
        let url = &self.resource.url;
        let expected = Expected {
            size: self.resource.size,
            sha256: &self.resource.sha256,
        };
        let output = Output::Partial {
            paths: self.paths,
            resume: self.resume_from(url).await,
            also: &self.resource.mirrors,
        };
        tracing::debug!(resource = %self.resource.id, "trying the url and its mirrors at once");
        progress.trying(url);
        let control = Control {
            cancel: self.cancel,
            reporter: progress,
        };
        self.fetcher
            .transfer(url, Some(expected), self.resource.size, output, control)
            .await
            .map(|_| ())
    }

    /// Tries one address until it succeeds or [`RetryPolicy::decide`] says
    /// to move on.
    pub(super) async fn address(
        &self,
        address: &Url,
        progress: &mut dyn Reporter,
    ) -> Result<(), TransferError> {
        let expected = Expected {
            size: self.resource.size,
            sha256: &self.resource.sha256,
        };
        let mut retries = 0;
        let mut fresh_retry_used = false;
        // The first try's look at the kept bytes also gives the patience
        // its start: one trip to the disk, not two.
        let (durable, mut first_resume) = self.kept_from(address).await;
        let mut patience = Patience::new(durable, self.fetcher.progress_floor());
        loop {
            let resume = match first_resume.take() {
                Some(resume) => resume,
                None => self.resume_from(address).await,
            };
            // Kept bytes in all: the prefix and any ranges beyond it.
            let resumed_from = resume.as_ref().map_or(0, |r| {
                r.ranges.iter().fold(r.offset, |n, [s, e]| n + (e - s))
            });
            tracing::debug!(resource = %self.resource.id, %address, resumed_from, "trying");
            progress.trying(address);
            let control = Control {
                cancel: self.cancel,
                reporter: &mut *progress,
            };
            let output = Output::Partial {
                paths: self.paths,
                resume,
                also: &[],
            };
            let result = self
                .fetcher
                .transfer(address, Some(expected), self.resource.size, output, control)
                .await;
            let attempt = match result {
                Ok(_) => return Ok(()),
                Err(TransferError::Attempt(a)) => a,
                Err(other) => return Err(other),
            };
            let bad_bytes = matches!(
                attempt.error,
                AttemptError::Size { .. } | AttemptError::Sha256 { .. }
            );
            if bad_bytes {
                // Whatever is in the partial file is not the declared file.
                self.on_disk(PartialPaths::remove).await;
                patience.discarded();
                if resumed_from > 0 && !fresh_retry_used {
                    // The fault may be in the kept bytes: once from zero.
                    fresh_retry_used = true;
                    tracing::info!(resource = %self.resource.id, %address, "{attempt}; trying again from zero");
                    continue;
                }
                return Err(TransferError::Attempt(attempt));
            }
            match patience.after_try(self.durable_from(address).await) {
                Progress::None => {}
                // Moved the kept bytes past every earlier try: the retries
                // used so far are given back.
                Progress::Forgiven => retries = 0,
                Progress::TooSlow(why) => {
                    tracing::info!(resource = %self.resource.id, %address, "{attempt}; {why}: next address");
                    let reason = format!("{why}; the last try: {}", attempt.error);
                    let error = AttemptError::Network { reason };
                    return Err(TransferError::Attempt(Attempt { error, ..attempt }));
                }
            }
            match self.retry.decide(&attempt.error, retries) {
                Decision::NextAddress => return Err(TransferError::Attempt(attempt)),
                Decision::Retry(wait) => {
                    tracing::info!(resource = %self.resource.id, "{attempt}; retrying in {:.1}s", wait.as_secs_f64());
                    retries += 1;
                    let reason = attempt.error.to_string();
                    progress.retrying(wait, retries + 1, self.retry.retries + 1, &reason);
                    self.sleep(wait).await?;
                }
            }
        }
    }

    /// The trusted bytes kept in the partial file when `address` wrote
    /// them (what a resume of `address` would continue), else 0.
    async fn durable_from(&self, address: &Url) -> u64 {
        let address = address.to_string();
        self.on_disk(move |paths| match paths.kept() {
            Some((meta, offset)) if meta.address == address => offset,
            _ => 0,
        })
        .await
        .unwrap_or(0)
    }

    /// [`Job::durable_from`] and [`Job::resume_from`] of `address`, read
    /// together.
    async fn kept_from(&self, address: &Url) -> (u64, Option<Option<Resume>>) {
        if !self.paths.may_have_record() {
            // A new download: nothing is kept, known without a trip to
            // the blocking threads (a thousand tiny files pay it each).
            return (0, Some(None));
        }
        let (address, size) = (address.to_string(), self.resource.size);
        self.on_disk(move |paths| {
            let Some((meta, kept)) = paths.kept() else {
                return (0, Some(None));
            };
            if meta.address != address {
                return (0, Some(None));
            }
            (kept, Some(resumable(meta, kept, size)))
        })
        .await
        .unwrap_or((0, None))
    }

    /// The kept bytes, when they came from `address` and can be continued:
    /// the prefix and the ranges beyond it, when they all lie inside the
    /// file and leave something to fetch.
    async fn resume_from(&self, address: &Url) -> Option<Resume> {
        let (address, size) = (address.to_string(), self.resource.size);
        self.on_disk(move |paths| {
            let (meta, kept) = paths.kept()?;
            if meta.address != address {
                return None;
            }
            resumable(meta, kept, size)
        })
        .await
        .flatten()
    }

    /// Runs `work` on the partial file's paths, a short step
    /// ([`crate::store::quick_step`]): on the blocking threads while the
    /// disk is slow, which must not stall the transfers on the runtime's
    /// workers. `None` when the runtime shut down before it ran.
    async fn on_disk<T: Send + 'static>(
        &self,
        work: impl FnOnce(&PartialPaths) -> T + Send + 'static,
    ) -> Option<T> {
        let paths = self.paths.clone();
        let root = paths.folder().path().to_path_buf();
        crate::store::quick_step(&root, move || Ok(work(&paths)))
            .await
            .ok()
    }

    async fn sleep(&self, wait: std::time::Duration) -> Result<(), TransferError> {
        match self.cancel {
            Some(token) => tokio::select! {
                () = tokio::time::sleep(wait) => Ok(()),
                () = token.cancelled() => Err(TransferError::Cancelled),
            },
            None => {
                tokio::time::sleep(wait).await;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_names_the_resource_and_the_address() {
        let sha = "a".repeat(64);
        let url = Url::parse("https://cdn.test/big.bin").unwrap();
        let resource = Resource {
            id: "big-model".into(),
            url: url.clone(),
            mirrors: Vec::new(),
            sha256: sha.clone(),
            size: 3 << 30,
            required: false,
            description: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let partial = dir.path().join(format!("{sha}.{}.partial", 3u64 << 30));
        for raw in crate::platform::DISK_FULL_CODES {
            let full = std::io::Error::from_raw_os_error(raw);
            let e = crate::store::partial_write_failed("cannot write download", &partial, full);
            let text = local_failure(e, &resource, &url).to_string();
            assert!(
                text.starts_with(
                    "resource \"big-model\" from https://cdn.test/big.bin: cannot write download "
                ),
                "{text}"
            );
            assert!(text.contains("no space left"), "{text}");
        }
        // Other errors are left as they are.
        let other = Error::io("cannot read", "/x", std::io::Error::other("gone"));
        assert_eq!(
            local_failure(other.clone(), &resource, &url).to_string(),
            other.to_string()
        );
    }
}
