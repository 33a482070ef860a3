//! One resource, downloaded exactly once into the store.
//!
//! This is the one place that decides "try the next address": the url, then
//! each mirror in order. Each address is tried until [`crate::transfer::retry`] says
//! to move on: transient failures (network, `408`, `429`, `5xx`) are
//! retried on the same address after a backoff (or the server's
//! `Retry-After`), continuing the bytes already received with `Range`;
//! permanent ones move on at once.
//!
//! Resume rules:
//! - the partial file is continued only with the address it came from
//!   (a validator belongs to one server), and only once that address is the
//!   one being tried; another address's `200` starts it afresh;
//! - a resumed file that fails the final size or SHA-256 check may hold bad
//!   old bytes: it is discarded and the same address is tried once more from
//!   zero before moving on.

use std::path::PathBuf;

use tokio_util::sync::CancellationToken;
use url::Url;

use crate::error::{Attempt, AttemptError, Error, Result};
use crate::manifest::Resource;
use crate::store::partial::PartialPaths;
use crate::store::Store;
use crate::transfer::fetch::{Control, Expected, Fetcher, Output, Reporter, Resume, TransferError};
use crate::transfer::retry::Decision;
pub use crate::transfer::retry::RetryPolicy;

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
    let name = resource.file_name();
    if let Some(path) = store.find(&resource.sha256, &name)? {
        return Ok(path);
    }
    let waiting_since = std::time::SystemTime::now();
    let (lock, waited) = match store.try_lock(&resource.sha256)? {
        Some(lock) => (lock, false),
        None => {
            tracing::debug!(sha256 = %resource.sha256, "waiting for another download of the same file");
            let lock = store.lock(&resource.sha256);
            let lock = match cancel {
                Some(token) => tokio::select! {
                    lock = lock => lock?,
                    () = token.cancelled() => return Err(cancelled(resource)),
                },
                None => lock.await?,
            };
            (lock, true)
        }
    };
    if let Some(path) = store.find(&resource.sha256, &name)? {
        return Ok(path);
    }
    let addresses: Vec<String> = resource.addresses().map(|a| a.to_string()).collect();
    // A download of the same bytes from the same addresses that failed while
    // this caller waited for the lock (another process sharing the store)
    // is this caller's result too; only a later call tries again.
    let shared = waited
        .then(|| store.failure_since(&resource.sha256, resource.size, &addresses, waiting_since))
        .flatten();
    if let Some(failure) = shared {
        return Err(Error::failed_elsewhere(failure.code, failure.message));
    }
    // File-system work (creating the file, fsyncs, renames) runs off the
    // runtime's workers: on a slow disk it would stall every transfer.
    let paths = crate::store::off_runtime(store.root(), {
        let (store, id, sha256, size) = (
            store.clone(),
            resource.id.clone(),
            resource.sha256.clone(),
            resource.size,
        );
        move || store.prepare(&id, &sha256, size)
    })
    .await?;
    let job = Job {
        fetcher,
        resource,
        paths: &paths,
        retry,
        cancel,
    };
    let outcome = job.run(progress).await;
    let finish = {
        let (store, sha256, size) = (store.clone(), resource.sha256.clone(), resource.size);
        // The lock goes with the work: it is released when the file is
        // published, even if this caller stops waiting for that.
        move || {
            let _lock = lock;
            let result = outcome.and_then(|()| store.publish(&paths, &sha256, &name));
            if result.is_err() && paths.kept().is_none() {
                // Nothing in it can be resumed.
                paths.remove();
            }
            match &result {
                Ok(_) => store.clear_failure(&sha256),
                Err(Error::Cancelled { .. }) => {}
                Err(e) => store.record_failure(&sha256, size, &addresses, e),
            }
            result
        }
    };
    crate::store::off_runtime(store.root(), finish).await
}

fn cancelled(resource: &Resource) -> Error {
    Error::Cancelled {
        resource: resource.id.clone(),
        reason: "stopped before it finished".into(),
    }
}

/// One download over the address list, with the SHA-256 lock held.
struct Job<'a> {
    fetcher: &'a Fetcher,
    resource: &'a Resource,
    paths: &'a PartialPaths,
    retry: RetryPolicy,
    cancel: Option<&'a CancellationToken>,
}

impl Job<'_> {
    /// Leaves verified bytes in the partial file, or fails with every
    /// address's last reason.
    async fn run(&self, progress: &mut dyn Reporter) -> Result<()> {
        let mut attempts: Vec<Attempt> = Vec::new();
        for address in self.resource.addresses() {
            match self.address(address, progress).await {
                Ok(()) => return Ok(()),
                Err(TransferError::Attempt(a)) => {
                    tracing::debug!(resource = %self.resource.id, "{a}");
                    attempts.push(a);
                }
                Err(TransferError::Local(e)) => return Err(e),
                Err(TransferError::Cancelled) => return Err(cancelled(self.resource)),
            }
        }
        Err(Error::Unavailable {
            resource: self.resource.id.clone(),
            attempts,
        })
    }

    /// Tries one address until it succeeds or [`RetryPolicy::decide`] says
    /// to move on.
    async fn address(
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
        loop {
            let resume = self.resume_from(address);
            let resumed_from = resume.as_ref().map_or(0, |r| r.offset);
            tracing::debug!(resource = %self.resource.id, %address, resumed_from, "trying");
            let mut received = 0u64;
            let mut tracker = Tracker {
                inner: &mut *progress,
                last: &mut received,
            };
            let control = Control {
                cancel: self.cancel,
                reporter: &mut tracker,
            };
            let output = Output::Partial {
                paths: self.paths,
                resume,
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
                self.paths.remove();
                if resumed_from > 0 && !fresh_retry_used {
                    // The fault may be in the kept bytes: once from zero.
                    fresh_retry_used = true;
                    tracing::info!(resource = %self.resource.id, %address, "{attempt}; trying again from zero");
                    continue;
                }
                return Err(TransferError::Attempt(attempt));
            }
            let progressed = received > resumed_from;
            if progressed {
                retries = 0;
            }
            match self.retry.decide(&attempt.error, retries) {
                Decision::NextAddress => return Err(TransferError::Attempt(attempt)),
                Decision::Retry(wait) => {
                    tracing::info!(resource = %self.resource.id, "{attempt}; retrying in {:.1}s", wait.as_secs_f64());
                    retries += 1;
                    self.sleep(wait).await?;
                }
            }
        }
    }

    /// The kept bytes, when they came from `address` and can be continued.
    fn resume_from(&self, address: &Url) -> Option<Resume> {
        let (meta, offset) = self.paths.kept()?;
        if meta.address != address.as_str() || offset >= self.resource.size {
            return None;
        }
        Some(Resume {
            offset,
            validator: meta.validator?,
        })
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

/// Passes progress on and remembers how far this attempt got.
struct Tracker<'a> {
    inner: &'a mut dyn Reporter,
    last: &'a mut u64,
}

impl Reporter for Tracker<'_> {
    fn resumed(&mut self, offset: u64) {
        *self.last = offset;
        self.inner.resumed(offset);
    }

    fn bytes(&mut self, total: u64) {
        *self.last = total;
        self.inner.bytes(total);
    }
}
