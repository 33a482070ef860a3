//! What is installed and where each resource stands: the status rows.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::manifest::Resource;
use crate::service::scheduler::JobState;
use crate::service::{GemStatus, ResourceState, ResourceStatus, Resources};
use crate::store::registry::{check_gem_id, FailureRecord, InstalledBy};
use crate::store::Listing;

impl Resources {
    /// The ids of every installed gem.
    pub fn installed(&self) -> Result<Vec<String>> {
        Ok(self.installed_by()?.into_keys().collect())
    }

    /// Every installed gem's id with who installed it (`None`: a gem
    /// registered before this was recorded).
    pub fn installed_by(&self) -> Result<BTreeMap<String, Option<InstalledBy>>> {
        self.live()?;
        Ok(self
            .inner
            .registry
            .list()?
            .into_iter()
            .map(|r| (r.gem, r.installed_by))
            .collect())
    }

    /// Every installed gem (or just `gem`) with each resource's state.
    ///
    /// Blocking but cheap, and safe to call from async code: it reads the
    /// small registry records and looks at the store's folders (no hashing,
    /// no network, no lock another call holds for long).
    pub fn status(&self, gem: Option<&str>) -> Result<Vec<GemStatus>> {
        self.live()?;
        let inner = &self.inner;
        let regs = match gem {
            Some(gem) => {
                check_gem_id(gem)?;
                vec![inner
                    .registry
                    .get(gem)?
                    .ok_or_else(|| Error::NotFound(format!("gem {gem:?} is not installed")))?]
            }
            None => inner.registry.list()?,
        };
        let mut out = Vec::new();
        for reg in regs {
            let failures = inner.registry.failures(&reg.gem)?;
            out.push(GemStatus {
                resources: self.rows_with(&reg.resources, &failures),
                gem: reg.gem,
                name: reg.name,
                installed_by: reg.installed_by,
            });
        }
        Ok(out)
    }

    /// The status rows of `gem`'s `resources`, for [`Event::Installed`]: a
    /// failure record that cannot be read shows as none, since the install
    /// has succeeded by then.
    pub(super) fn rows(&self, gem: &str, resources: &[Resource]) -> Vec<ResourceStatus> {
        let failures = self.inner.registry.failures(gem).unwrap_or_else(|e| {
            tracing::debug!(gem, "failure records unread for the installed event: {e}");
            BTreeMap::new()
        });
        self.rows_with(resources, &failures)
    }

    /// One status row per resource, in their order.
    fn rows_with(
        &self,
        resources: &[Resource],
        failures: &BTreeMap<String, FailureRecord>,
    ) -> Vec<ResourceStatus> {
        // One look at the downloads in progress and the kept bytes for all
        // of them: a gem of thousands of files is not thousands of
        // listings of the same folders.
        let listing = self.inner.store.listing();
        resources
            .iter()
            .map(|r| {
                let state = self.state_of(r, failures.get(&r.id), &listing);
                ResourceStatus {
                    id: r.id.clone(),
                    label: r.label().to_string(),
                    description: r.description.clone(),
                    file: r.file_name(),
                    size: r.size,
                    host: r.url.host_str().unwrap_or_default().to_string(),
                    addresses: r.addresses().map(|a| a.to_string()).collect(),
                    hosts: hosts(r),
                    required: r.required,
                    sha256: r.sha256.clone(),
                    partial_bytes: self.partial_of(r, &state, &listing),
                    next_try: matches!(state, ResourceState::Failed { .. })
                        .then(|| self.inner.scheduler.next_try(r))
                        .flatten(),
                    state,
                }
            })
            .collect()
    }

    fn state_of(
        &self,
        r: &Resource,
        failure: Option<&FailureRecord>,
        listing: &Listing,
    ) -> ResourceState {
        let store = &self.inner.store;
        // One listing of the file's folder says both whether it is present
        // and under which name.
        let files = store.blob_files(&r.sha256);
        if !files.is_empty() {
            let path = files
                .into_iter()
                .find(|p| p.file_name().is_some_and(|n| n == r.file_name().as_str()))
                .unwrap_or_else(|| store.blob_path(&r.sha256, &r.file_name()));
            let served_by = self.inner.registry.served_by(&r.sha256);
            return ResourceState::Present { path, served_by };
        }
        let waiting_on = match self.inner.scheduler.state(r) {
            Some(JobState::Queued) => return ResourceState::Queued,
            Some(JobState::Downloading(bytes, bytes_per_sec)) => {
                return ResourceState::Downloading {
                    bytes,
                    bytes_per_sec: Some(bytes_per_sec),
                }
            }
            Some(JobState::Retrying(retry, bytes)) => {
                return ResourceState::Retrying {
                    attempt: retry.attempt,
                    of: retry.of,
                    reason: retry.reason,
                    bytes,
                }
            }
            Some(JobState::Waiting(on)) => Some(on),
            None => None,
        };
        // Downloads of the file by another process, or by another gem's job
        // here: one from this resource's own addresses is its download;
        // another gem's is what the file waits for, and is named.
        let addresses: Vec<String> = r.addresses().map(|a| a.to_string()).collect();
        let in_use = store.lanes_in_use_listed(listing, &r.sha256, r.size);
        let own = in_use
            .iter()
            .find(|l| l.holder.as_ref().is_none_or(|h| h.addresses == addresses));
        if let Some(lane) = own {
            return ResourceState::Downloading {
                bytes: lane.held,
                bytes_per_sec: None,
            };
        }
        if let Some(lane) = in_use.first() {
            return ResourceState::Waiting {
                on: lane.holder.as_ref().and_then(|h| h.gem.clone()),
                bytes: lane.held,
            };
        }
        if let Some(on) = waiting_on {
            // The download it waited for has just ended.
            return ResourceState::Waiting { on, bytes: 0 };
        }
        match failure {
            Some(f) => ResourceState::Failed { failure: f.clone() },
            None => ResourceState::Missing,
        }
    }

    /// The resumable bytes kept for `r`, shown while nothing downloads it.
    fn partial_of(&self, r: &Resource, state: &ResourceState, listing: &Listing) -> Option<u64> {
        matches!(state, ResourceState::Missing | ResourceState::Failed { .. })
            .then(|| {
                self.inner
                    .store
                    .kept_bytes_listed(listing, &r.sha256, Some(r.size))
            })
            .flatten()
    }
}

/// The hosts of a resource's url and mirrors, each once, in order.
fn hosts(r: &Resource) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for host in r.addresses().filter_map(|a| a.host_str()) {
        if !out.iter().any(|h| h == host) {
            out.push(host.to_string());
        }
    }
    out
}
