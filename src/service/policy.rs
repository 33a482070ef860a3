//! The network policy of a running service: set here, written to the
//! store's record, and followed when another process changes that record.

use std::sync::Arc;
use std::time::SystemTime;

use crate::error::{ErrorCode, Result};
use crate::net::policy::Policy;
use crate::service::events::Event;
use crate::service::{PolicyChange, Resources, POLICY_WATCH_EVERY};
use crate::store::policy_record;
use crate::store::registry::FailureRecord;

impl Resources {
    /// Follows the store's policy record while the service runs: a policy
    /// that another process sets for this store applies here within
    /// [`POLICY_WATCH_EVERY`] (and at once before each download starts).
    pub(super) fn watch_policy_record(&self) {
        let weak = Arc::downgrade(&self.inner);
        self.handle().spawn(async move {
            loop {
                tokio::time::sleep(POLICY_WATCH_EVERY).await;
                let Some(inner) = weak.upgrade() else { return };
                let service = Resources { inner };
                if service.is_shut_down() {
                    return;
                }
                service.follow_policy_record();
            }
        });
    }

    /// Applies the store's policy record when its generation changed since
    /// last seen.
    pub(crate) fn follow_policy_record(&self) {
        let generation = self.inner.store.policy_generation();
        {
            let mut seen = self
                .inner
                .policy_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if *seen == generation {
                return;
            }
            *seen = generation;
        }
        match self.inner.store.policy_record() {
            Ok(Some(record)) if !policy_record::same(&record.policy, &self.policy()) => {
                tracing::info!(
                    pid = record.pid,
                    "the network policy of this store was changed by another process: applying it"
                );
                if let Err(e) = self.apply_policy(record.policy) {
                    tracing::warn!("cannot apply the store's policy record: {e}");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("{e}"),
        }
    }

    /// The network policy in force.
    pub fn policy(&self) -> Policy {
        self.inner.scheduler.fetcher().policy()
    }

    /// Replaces the network policy (the app's "Settings › System"), at any
    /// time. From this moment it applies to every connection and redirect
    /// hop; a download in flight whose current host (url, mirror or
    /// redirect target) it no longer permits stops within a second, its
    /// bytes kept for resume: it fails (caller, [`Event::Failed`], failure
    /// record) with `code` `E_RESOURCE_UNAVAILABLE` and `primary_cause`
    /// `E_RESOURCE_POLICY`, the stopped address's line in the message
    /// carrying `E_RESOURCE_POLICY`. Required files whose
    /// last failure was the policy, and which the new policy lets through,
    /// are queued again at once; lazy ones wait for their next
    /// [`Resources::path`]. Emits [`Event::PolicyChanged`]; returns how many
    /// files were queued again.
    ///
    /// The policy is also written to the store's record
    /// ([`crate::store::policy_record`]), so that every other process using
    /// the store (a command-line run, another service) applies it too.
    pub fn set_policy(&self, policy: Policy) -> Result<usize> {
        Ok(self.set_policy_counted(policy)?.queued)
    }

    /// [`Resources::set_policy`], saying also how many downloads the new
    /// policy stopped.
    pub fn set_policy_counted(&self, policy: Policy) -> Result<PolicyChange> {
        self.live()?;
        let stopped = self.stopped_by(&policy)?;
        let generation = self
            .inner
            .store
            .write_policy_record(&policy, self.inner.config_file.as_deref())?;
        // Our own write is not news to the watcher.
        *self
            .inner
            .policy_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(generation);
        let queued = self.apply_policy(policy)?;
        Ok(PolicyChange { stopped, queued })
    }

    /// How many running downloads have an address that `policy` refuses and
    /// the policy in force permits.
    fn stopped_by(&self, policy: &Policy) -> Result<usize> {
        let old = self.policy();
        let running = self.inner.scheduler.running();
        if running.is_empty() {
            return Ok(0);
        }
        let regs = self.inner.registry.list()?;
        Ok(running
            .iter()
            .filter(|sha| {
                regs.iter()
                    .flat_map(|r| r.resources.iter())
                    .filter(|r| &&r.sha256 == sha)
                    .flat_map(|r| r.addresses())
                    .filter_map(|a| a.host_str().map(str::to_string))
                    .any(|h| old.permits(&h) && !policy.permits(&h))
            })
            .count())
    }

    fn apply_policy(&self, policy: Policy) -> Result<usize> {
        self.live()?;
        let inner = &self.inner;
        let old = self.policy();
        self.emit(Event::PolicyChanged {
            at: SystemTime::now(),
            old_mode: old.mode(),
            old_hosts: old.host_count(),
            new_mode: policy.mode(),
            new_hosts: policy.host_count(),
        });
        inner.scheduler.fetcher().set_policy(policy.clone());
        let mut queued = 0;
        for reg in inner.registry.list()? {
            let failures = inner.registry.failures(&reg.gem)?;
            for resource in reg.resources.iter().filter(|r| r.required) {
                let blocked = failures.get(&resource.id).is_some_and(failed_on_policy);
                let allowed_now = resource
                    .addresses()
                    .any(|a| a.host_str().is_some_and(|h| policy.permits(h)));
                if blocked && allowed_now && !inner.store.has(&resource.sha256) {
                    inner.scheduler.ensure(&reg.gem, resource, false);
                    queued += 1;
                }
            }
        }
        Ok(queued)
    }
}

/// Whether a failure was (at least on one address) the network policy.
fn failed_on_policy(record: &FailureRecord) -> bool {
    record.code == ErrorCode::Policy
        || record.primary_cause == ErrorCode::Policy
        || record.attempts.iter().any(|a| a.code == ErrorCode::Policy)
}
