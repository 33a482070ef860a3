//! One resource, downloaded exactly once into the store.
//!
//! This is the one place that decides "try the next address": the url, then
//! each mirror in order, with no wait between them. Only when every address
//! failed, and every failure was transient, does it back off and go over the
//! list again (at most `network.retries` more rounds).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Attempt, Error, Result};
use crate::fetch::{Expected, Fetcher, TransferError};
use crate::manifest::Resource;
use crate::store::Store;

/// How often to go over the address list again after transient failures.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Extra rounds after the first.
    pub retries: u32,
    /// Wait before the first extra round; doubles each round.
    pub backoff: Duration,
}

/// Returns the local path of `resource`, downloading and verifying it first
/// when the store does not have it. `progress` receives the bytes received so
/// far of the current attempt.
///
/// Other tasks and processes that want the same bytes wait on the store's
/// lock and then find the file in place.
pub async fn download(
    fetcher: &Fetcher,
    store: &Store,
    resource: &Resource,
    retry: RetryPolicy,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<PathBuf> {
    let name = resource.file_name();
    if let Some(path) = store.find(&resource.sha256, &name)? {
        return Ok(path);
    }
    let waiting_since = std::time::SystemTime::now();
    let (_lock, waited) = match store.try_lock(&resource.sha256)? {
        Some(lock) => (lock, false),
        None => {
            tracing::debug!(sha256 = %resource.sha256, "waiting for another download of the same file");
            (store.lock(&resource.sha256).await?, true)
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
        return Err(Error::FailedElsewhere {
            code: failure.code,
            message: failure.message,
        });
    }
    let result = transfer_verified(fetcher, store, resource, retry, progress, &name).await;
    match &result {
        Ok(_) => store.clear_failure(&resource.sha256),
        Err(e) => store.record_failure(&resource.sha256, resource.size, &addresses, e),
    }
    result
}

async fn transfer_verified(
    fetcher: &Fetcher,
    store: &Store,
    resource: &Resource,
    retry: RetryPolicy,
    progress: &mut (dyn FnMut(u64) + Send),
    name: &str,
) -> Result<PathBuf> {
    let mut partial = store.begin(&resource.id, &resource.sha256, resource.size)?;
    let expected = Expected {
        size: resource.size,
        sha256: &resource.sha256,
    };
    let mut round = 0;
    loop {
        let mut attempts: Vec<Attempt> = Vec::new();
        for address in resource.addresses() {
            partial.rewind().await?;
            tracing::debug!(resource = %resource.id, %address, "trying");
            let result = fetcher
                .transfer(
                    address,
                    Some(expected),
                    resource.size,
                    partial.writer(),
                    progress,
                )
                .await;
            match result {
                Ok(_) => return partial.commit(store, &resource.sha256, name).await,
                Err(TransferError::Local(e)) => return Err(e),
                Err(TransferError::Attempt(a)) => {
                    tracing::info!(resource = %resource.id, "{a}");
                    attempts.push(a);
                }
            }
        }
        let transient = attempts.iter().all(|a| a.error.is_transient());
        if !transient || round >= retry.retries {
            return Err(Error::Unavailable {
                resource: resource.id.clone(),
                attempts,
            });
        }
        let wait = retry.backoff.saturating_mul(1 << round.min(16));
        tracing::info!(resource = %resource.id, ?wait, "every address failed; retrying");
        tokio::time::sleep(wait).await;
        round += 1;
    }
}
