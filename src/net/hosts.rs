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
        let semaphore = self.reserve(host);
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

    /// The semaphore of `host`, found or created under the map lock. The
    /// clone returned (and then the permit, which holds it) keeps the entry
    /// in the map: an entry is forgotten only when nobody waits on it or
    /// holds one of its permits, so every task of one host counts on the
    /// same semaphore.
    fn reserve(&self, host: &str) -> Arc<Semaphore> {
        let key = crate::net::guard::normalise_host(host);
        let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        // Forget the hosts nobody waits for or is connected to, so the map
        // stays small; only the map holds those.
        hosts.retain(|_, s| Arc::strong_count(s) > 1);
        hosts
            .entry(key)
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_host)))
            .clone()
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

    #[tokio::test]
    async fn a_task_between_reserving_and_acquiring_shares_the_hosts_slots() {
        let slots = HostSlots::new(1);
        // One task took its semaphore and has not acquired it yet...
        let reserved = slots.reserve("cdn.test");
        // ...while another enters: the entry must not be forgotten and
        // replaced, or both would hold a slot of one host.
        let _held = slots.enter("cdn.test").await;
        let second = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            reserved.acquire_owned(),
        );
        assert!(second.await.is_err(), "two slots of a one-slot host");
        assert_eq!(slots.hosts.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn hosts_nobody_uses_are_forgotten() {
        let slots = HostSlots::new(2);
        drop(slots.enter("a.test").await);
        let _b = slots.enter("b.test").await;
        let names: Vec<String> = slots.hosts.lock().unwrap().keys().cloned().collect();
        assert_eq!(names, ["b.test"]);
    }
}
