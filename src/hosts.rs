//! Connections per host: at most `service.max_per_host` transfers are
//! connected to one host at once, counting the host actually connected to
//! (the url, a mirror or a redirect target), normalised (case, trailing
//! dot). The scheduler's slots decide which downloads start; these bound
//! what they connect to, hop by hop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Per-host connection slots, shared by every transfer of a fetcher.
#[derive(Debug, Clone)]
pub(crate) struct HostSlots {
    per_host: usize,
    hosts: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
}

/// A connection slot of one host, given back on drop.
#[derive(Debug)]
pub(crate) struct HostPermit {
    _permit: OwnedSemaphorePermit,
}

impl HostSlots {
    /// `per_host` connections per host (at least one).
    pub(crate) fn new(per_host: usize) -> HostSlots {
        HostSlots {
            per_host: per_host.max(1),
            hosts: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Waits for a connection slot of `host`.
    pub(crate) async fn enter(&self, host: &str) -> HostPermit {
        let key = host.trim_end_matches('.').to_ascii_lowercase();
        let semaphore = {
            let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
            // Forget hosts nobody is connected to, so the map stays small.
            hosts.retain(|_, s| s.available_permits() < self.per_host);
            hosts
                .entry(key)
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_host)))
                .clone()
        };
        if semaphore.available_permits() == 0 {
            tracing::debug!(host, "waiting for a connection slot of the host");
        }
        match semaphore.acquire_owned().await {
            Ok(permit) => HostPermit { _permit: permit },
            // Never closed; a fresh semaphore keeps the type total.
            Err(_) => HostPermit {
                _permit: Arc::new(Semaphore::new(1))
                    .try_acquire_owned()
                    .unwrap_or_else(|_| unreachable!("a fresh semaphore has a permit")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_host_gets_at_most_its_slots_whatever_its_spelling() {
        let slots = HostSlots::new(2);
        let _a = slots.enter("cdn.test").await;
        let _b = slots.enter("CDN.test.").await;
        let third = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            slots.enter("cdn.TEST"),
        );
        assert!(third.await.is_err(), "a third connection to the same host");
        let _other = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            slots.enter("other.test"),
        )
        .await
        .expect("another host is not held back");
        drop(_a);
        let _c = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            slots.enter("cdn.test"),
        )
        .await
        .expect("a freed slot is reused");
    }
}
