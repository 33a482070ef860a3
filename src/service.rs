//! The resource service the app embeds: install, upgrade, uninstall, the
//! `path` lookup for tools, background downloads, status and events.
//!
//! Rules from the specification, and where they hold:
//! - A download never fails or delays an install: [`Resources::install`]
//!   returns once the registration is durable; required files are queued.
//! - Required files missing at app start are queued again by
//!   [`Resources::start`]; lazy files download on first [`Resources::path`].
//! - Upgrades reuse every file whose `sha256` is unchanged (the store is
//!   content-addressed), and delete files the new version no longer declares
//!   only after the new registration is written. A file another installed
//!   gem declares is never deleted.
//! - One download per SHA-256 however many callers wait, in this process
//!   (one job) or across processes (the store's per-SHA-256 lock).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio::sync::broadcast;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::events::Event;
use crate::fetch::Fetcher;
use crate::manifest::{Manifest, Resource};
use crate::policy::Policy;
use crate::registry::{valid_gem_id, FailureRecord, Registration, Registry};
use crate::scheduler::{Deps, JobResult, JobState, Scheduler};
use crate::store::Store;

/// Events buffered per subscriber before the oldest are dropped.
const EVENT_BUFFER: usize = 1024;

/// Files deleted at once by an uninstall or upgrade.
const DELETE_WORKERS: usize = 16;

/// The resource service. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Resources {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    registry: Registry,
    scheduler: Arc<Scheduler>,
    events: broadcast::Sender<Event>,
    /// How long an interrupted download is kept for resume.
    partial_max_age: std::time::Duration,
}

/// What [`Resources::install`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct InstallReport {
    /// The gem.
    pub gem: String,
    /// Whether an earlier version was registered.
    pub upgrade: bool,
    /// Whether the earlier version declared exactly the same resources.
    pub unchanged: bool,
    /// Resources declared.
    pub resources: usize,
    /// Declared files already in the store (reused, not downloaded).
    pub present: usize,
    /// Required files queued for download.
    pub queued: usize,
    /// SHA-256s of files deleted because no installed gem declares them now.
    pub deleted: Vec<String>,
}

/// What [`Resources::uninstall`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UninstallReport {
    /// The gem.
    pub gem: String,
    /// SHA-256s of files deleted.
    pub deleted: Vec<String>,
    /// SHA-256s kept because another installed gem declares them.
    pub kept: Vec<String>,
}

/// The state of one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ResourceState {
    /// Verified and in the store.
    Present {
        /// Its local path.
        path: PathBuf,
    },
    /// Not in the store, nothing running.
    Missing,
    /// Waiting for a download slot.
    Queued,
    /// Being downloaded (here or by another process sharing the store).
    Downloading {
        /// Bytes received so far.
        bytes: u64,
    },
    /// The last download failed (and nothing is running now).
    Failed {
        /// The failure.
        #[serde(flatten)]
        failure: FailureRecord,
    },
}

/// One resource in [`Resources::status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResourceStatus {
    /// The resource id.
    pub id: String,
    /// The description, or the id when there is none.
    pub label: String,
    /// The file's name in the store (`ocr-v3.onnx`).
    pub file: String,
    /// Declared size.
    pub size: u64,
    /// The host of its `url`.
    pub host: String,
    /// Whether it downloads right after install (`required`) or on first use.
    pub required: bool,
    /// SHA-256.
    pub sha256: String,
    /// Where it stands.
    #[serde(flatten)]
    pub state: ResourceState,
    /// Bytes of an interrupted download kept for resuming, when the file is
    /// missing (or failed) and no download runs: the next one continues
    /// from there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial_bytes: Option<u64>,
}

/// One gem in [`Resources::status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GemStatus {
    /// The gem.
    pub gem: String,
    /// Its resources in manifest order.
    pub resources: Vec<ResourceStatus>,
}

/// What [`Resources::verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Stored files checked (every name of every stored file).
    pub checked: usize,
    /// Stored contents (SHA-256s) whose bytes still match.
    pub ok: usize,
    /// SHA-256s of files that did not match and were removed.
    pub corrupted: Vec<String>,
    /// The removed files, named.
    pub removed: Vec<RemovedFile>,
}

/// A stored file [`Resources::verify`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RemovedFile {
    /// Its SHA-256.
    pub sha256: String,
    /// Its file names in the store.
    pub files: Vec<String>,
    /// `gem/resource` of every installed resource that declares it.
    pub declared_by: Vec<String>,
}

impl Resources {
    /// Opens the service on the configuration's store.
    pub fn open(config: &Config) -> Result<Resources> {
        Resources::open_at(config, &config.store_dir())
    }

    /// Opens the service on the store in `dir`.
    pub fn open_at(config: &Config, dir: &Path) -> Result<Resources> {
        let store = Store::open(dir)?;
        let registry = Registry::new(&store);
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let deps = Deps {
            fetcher: Fetcher::new(config)?,
            store: store.clone(),
            registry: registry.clone(),
            retry: config.retry_policy(),
            events: events.clone(),
        };
        let scheduler = Scheduler::new(
            deps,
            config.service.max_concurrent_downloads,
            config.service.max_per_host,
        );
        Ok(Resources {
            inner: Arc::new(Inner {
                store,
                registry,
                scheduler: Arc::new(scheduler),
                events,
                partial_max_age: config.partial_max_age(),
            }),
        })
    }

    /// How many registration files this service has parsed: for tests that
    /// check the work per resource stays constant.
    #[doc(hidden)]
    pub fn registry_parses(&self) -> u64 {
        self.inner.registry.parses()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Subscribes to progress events.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.inner.events.subscribe()
    }

    fn emit(&self, event: Event) {
        let _ = self.inner.events.send(event);
    }

    /// Registers a gem's validated resources: a new install, or an upgrade
    /// of an installed gem. Returns once the registration is durable, never
    /// waiting for a download; required files then download in the
    /// background. Files the previous version declared and no installed gem
    /// declares now are deleted after the new registration is written.
    pub async fn install(&self, gem: &str, manifest: &Manifest) -> Result<InstallReport> {
        check_gem_id(gem)?;
        let inner = &self.inner;
        let lock = inner.registry.lock().await?;
        let old = inner.registry.get(gem)?;
        let registration = Registration {
            gem: gem.to_string(),
            resources: manifest.resources.clone(),
        };
        inner.registry.put(&registration)?;
        // The upgrade has succeeded: only now may dropped files go.
        let dropped: BTreeSet<String> = match &old {
            Some(old) => shas(&old.resources)
                .difference(&shas(&manifest.resources))
                .cloned()
                .collect(),
            None => BTreeSet::new(),
        };
        let (deleted, _) = self.delete_unclaimed(dropped).await?;
        drop(lock);
        let mut report = InstallReport {
            gem: gem.to_string(),
            upgrade: old.is_some(),
            unchanged: old
                .as_ref()
                .is_some_and(|o| o.resources == manifest.resources),
            resources: manifest.resources.len(),
            deleted,
            ..InstallReport::default()
        };
        for resource in &manifest.resources {
            if inner.store.has(&resource.sha256) {
                report.present += 1;
            } else if resource.required {
                inner.scheduler.ensure(gem, resource, false);
                report.queued += 1;
            }
        }
        self.emit(Event::Installed {
            gem: gem.to_string(),
            resources: manifest.resources.len(),
        });
        Ok(report)
    }

    /// Removes a gem: cancels its downloads and deletes every file of it
    /// that no other installed gem declares.
    pub async fn uninstall(&self, gem: &str) -> Result<UninstallReport> {
        check_gem_id(gem)?;
        let inner = &self.inner;
        let lock = inner.registry.lock().await?;
        let Some(old) = inner.registry.get(gem)? else {
            return Err(Error::NotFound(format!("gem {gem:?} is not installed")));
        };
        inner.registry.remove(gem)?;
        let (deleted, kept) = self.delete_unclaimed(shas(&old.resources)).await?;
        drop(lock);
        self.emit(Event::Uninstalled {
            gem: gem.to_string(),
        });
        Ok(UninstallReport {
            gem: gem.to_string(),
            deleted,
            kept,
        })
    }

    /// Deletes those of `candidates` no registration declares (cancelling
    /// their downloads first). Call with the registry lock held.
    async fn delete_unclaimed(
        &self,
        candidates: BTreeSet<String>,
    ) -> Result<(Vec<String>, Vec<String>)> {
        let inner = &self.inner;
        let mut claimed = BTreeSet::new();
        for reg in inner.registry.list()? {
            claimed.extend(shas(&reg.resources));
        }
        let (mut doomed, mut kept) = (Vec::new(), Vec::new());
        for sha in candidates {
            if claimed.contains(&sha) {
                kept.push(sha);
                continue;
            }
            inner.scheduler.cancel(&sha).await;
            inner.store.remove_partials(&sha);
            if inner.store.has(&sha) {
                doomed.push(sha);
            }
        }
        let store = inner.store.clone();
        let removal = tokio::task::spawn_blocking(move || remove_blobs(&store, &doomed));
        let blobs = inner.store.root().join("blobs");
        let deleted = removal
            .await
            .map_err(|e| Error::io("cannot delete files in", blobs, std::io::Error::other(e)))??;
        for sha in &deleted {
            self.emit(Event::Deleted {
                sha256: sha.clone(),
            });
        }
        Ok((deleted, kept))
    }

    /// The local path of a gem's resource. Present: returned at once (no
    /// hashing, no network). Missing (required or not): downloaded now,
    /// ahead of queued background work, and shared with every other caller
    /// waiting for the same file. A failure errors this call only; the next
    /// call tries again.
    pub async fn path(&self, gem: &str, resource_id: &str) -> Result<PathBuf, Arc<Error>> {
        let resource = self.resource(gem, resource_id).map_err(Arc::new)?;
        let name = resource.file_name();
        let store = &self.inner.store;
        if let Some(path) = store.find(&resource.sha256, &name).map_err(Arc::new)? {
            return Ok(path);
        }
        let mut done = self.inner.scheduler.ensure(gem, &resource, true);
        let result: JobResult = match done.wait_for(|r| r.is_some()).await {
            Ok(r) => r
                .clone()
                .unwrap_or_else(|| Err(Arc::new(cancelled(&resource)))),
            Err(_) => Err(Arc::new(cancelled(&resource))),
        };
        result?;
        // The job stored the bytes under its own resource's file name; this
        // caller gets its own name for the same bytes.
        match store.find(&resource.sha256, &name).map_err(Arc::new)? {
            Some(path) => Ok(path),
            None => Err(Arc::new(Error::NotFound(format!(
                "resource {resource_id:?} of gem {gem:?} was deleted while it downloaded"
            )))),
        }
    }

    fn resource(&self, gem: &str, resource_id: &str) -> Result<Resource> {
        check_gem_id(gem)?;
        let reg = self
            .inner
            .registry
            .get(gem)?
            .ok_or_else(|| Error::NotFound(format!("gem {gem:?} is not installed")))?;
        let ids: Vec<&str> = reg.resources.iter().map(|r| r.id.as_str()).collect();
        let known = if ids.is_empty() {
            "it declares none".to_string()
        } else {
            format!("its resources are: {}", ids.join(", "))
        };
        let message = format!("gem {gem:?} declares no resource {resource_id:?}; {known}");
        reg.resources
            .iter()
            .find(|r| r.id == resource_id)
            .cloned()
            .ok_or(Error::NotFound(message))
    }

    /// What an app start does: removes leftovers of a crash that nobody
    /// can resume, partial files no installed gem declares or older than
    /// `network.partial_max_age_days`, and queues every installed gem's
    /// missing required files (continuing kept partial files). Returns how
    /// many were queued; does not wait for them.
    pub async fn start(&self) -> Result<usize> {
        let inner = &self.inner;
        let removed = {
            let _lock = inner.registry.lock().await?;
            let mut declared = BTreeSet::new();
            for reg in inner.registry.list()? {
                declared.extend(shas(&reg.resources));
            }
            inner.store.clean_tmp(inner.partial_max_age)?
                + inner.store.prune_partials(&declared)
                + inner.registry.clean()
        };
        if removed > 0 {
            tracing::info!(
                removed,
                "removed temporary files left by an interrupted download or write"
            );
        }
        let mut queued = 0;
        for reg in inner.registry.list()? {
            for resource in reg.resources.iter().filter(|r| r.required) {
                if !inner.store.has(&resource.sha256) {
                    inner.scheduler.ensure(&reg.gem, resource, false);
                    queued += 1;
                }
            }
        }
        Ok(queued)
    }

    /// The network policy in force.
    pub fn policy(&self) -> Policy {
        self.inner.scheduler.fetcher().policy()
    }

    /// Replaces the network policy (the app's "Settings › System"), at any
    /// time. From this moment it applies to every connection and redirect
    /// hop; a download in flight whose current host (url, mirror or
    /// redirect target) it no longer permits stops within a second with
    /// `E_RESOURCE_POLICY`, its bytes kept for resume. Required files whose
    /// last failure was the policy, and which the new policy lets through,
    /// are queued again at once; lazy ones wait for their next
    /// [`Resources::path`]. Emits [`Event::PolicyChanged`]; returns how many
    /// files were queued again.
    pub fn set_policy(&self, policy: Policy) -> Result<usize> {
        let inner = &self.inner;
        let old = self.policy();
        self.emit(Event::PolicyChanged {
            old_mode: old.mode().as_str().into(),
            old_hosts: old.host_count(),
            new_mode: policy.mode().as_str().into(),
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

    /// Waits until no download is queued or running.
    pub async fn wait_idle(&self) {
        self.inner.scheduler.idle().await;
    }

    /// Stops every download, removes their temporary files, and waits until
    /// all of them have finished.
    pub async fn shutdown(&self) {
        self.inner.scheduler.shutdown().await;
    }

    /// The ids of every installed gem.
    pub fn installed(&self) -> Result<Vec<String>> {
        Ok(self
            .inner
            .registry
            .list()?
            .into_iter()
            .map(|r| r.gem)
            .collect())
    }

    /// Every installed gem (or just `gem`) with each resource's state.
    pub fn status(&self, gem: Option<&str>) -> Result<Vec<GemStatus>> {
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
            let resources = reg
                .resources
                .iter()
                .map(|r| {
                    let state = self.state_of(r, failures.get(&r.id));
                    ResourceStatus {
                        id: r.id.clone(),
                        label: r.label().to_string(),
                        file: r.file_name(),
                        size: r.size,
                        host: r.url.host_str().unwrap_or_default().to_string(),
                        required: r.required,
                        sha256: r.sha256.clone(),
                        partial_bytes: self.partial_of(r, &state),
                        state,
                    }
                })
                .collect();
            out.push(GemStatus {
                gem: reg.gem,
                resources,
            });
        }
        Ok(out)
    }

    fn state_of(&self, r: &Resource, failure: Option<&FailureRecord>) -> ResourceState {
        let store = &self.inner.store;
        if store.has(&r.sha256) {
            let path = store
                .blob_files(&r.sha256)
                .into_iter()
                .find(|p| p.file_name().is_some_and(|n| n == r.file_name().as_str()))
                .unwrap_or_else(|| store.blob_path(&r.sha256, &r.file_name()));
            return ResourceState::Present { path };
        }
        match self.inner.scheduler.state(&r.sha256) {
            Some(JobState::Queued) => return ResourceState::Queued,
            Some(JobState::Downloading(bytes)) => return ResourceState::Downloading { bytes },
            None => {}
        }
        if let Some(bytes) = store.downloading_elsewhere(&r.sha256) {
            return ResourceState::Downloading { bytes };
        }
        match failure {
            Some(f) => ResourceState::Failed { failure: f.clone() },
            None => ResourceState::Missing,
        }
    }

    /// The resumable bytes kept for `r`, shown while nothing downloads it.
    fn partial_of(&self, r: &Resource, state: &ResourceState) -> Option<u64> {
        matches!(state, ResourceState::Missing | ResourceState::Failed { .. })
            .then(|| self.inner.store.partial_len(&r.sha256))
            .flatten()
    }

    /// Re-hashes every stored file; a file whose bytes no longer match its
    /// SHA-256 is removed (it downloads again when next needed).
    pub async fn verify(&self) -> Result<VerifyReport> {
        let store = &self.inner.store;
        let mut report = VerifyReport::default();
        for sha in store.blobs()? {
            let mut good = true;
            let files = store.blob_files(&sha);
            for file in &files {
                report.checked += 1;
                if hash_file(file).await? != sha {
                    good = false;
                }
            }
            if good {
                report.ok += 1;
            } else {
                report.removed.push(RemovedFile {
                    sha256: sha.clone(),
                    files: files
                        .iter()
                        .filter_map(|f| f.file_name()?.to_str().map(str::to_string))
                        .collect(),
                    declared_by: self.declared_by(&sha)?,
                });
                store.remove(&sha)?;
                self.emit(Event::Deleted {
                    sha256: sha.clone(),
                });
                report.corrupted.push(sha);
            }
        }
        Ok(report)
    }
}

impl Resources {
    /// `gem/resource` of every installed resource whose SHA-256 is `sha256`.
    fn declared_by(&self, sha256: &str) -> Result<Vec<String>> {
        Ok(self
            .inner
            .registry
            .list()?
            .iter()
            .flat_map(|reg| {
                reg.resources
                    .iter()
                    .filter(|r| r.sha256 == sha256)
                    .map(|r| format!("{}/{}", reg.gem, r.id))
            })
            .collect())
    }
}

fn cancelled(resource: &Resource) -> Error {
    Error::Cancelled {
        resource: resource.id.clone(),
        reason: "the download was stopped".into(),
    }
}

/// Whether a failure was (at least on one address) the network policy.
fn failed_on_policy(record: &FailureRecord) -> bool {
    record.code == "E_RESOURCE_POLICY"
        || record
            .attempts
            .iter()
            .any(|a| a.code == "E_RESOURCE_POLICY")
}

fn check_gem_id(gem: &str) -> Result<()> {
    if valid_gem_id(gem) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "invalid gem id {gem:?}: letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128"
        )))
    }
}

/// Deletes the stored files of every SHA-256 in `doomed`, several at a time:
/// deleting a file can wait on the device (a file system mounted with
/// `discard` trims each file's blocks as it goes), and those waits overlap.
/// Returns `doomed` once every deletion has finished, or the first error.
fn remove_blobs(store: &Store, doomed: &[String]) -> Result<Vec<String>> {
    let next = AtomicUsize::new(0);
    let workers = doomed.len().min(DELETE_WORKERS);
    let failures: Vec<Error> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut failures = Vec::new();
                    while let Some(sha) = doomed.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if let Err(e) = store.remove(sha) {
                            failures.push(e);
                        }
                    }
                    failures
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    match failures.into_iter().next() {
        Some(error) => Err(error),
        None => Ok(doomed.to_vec()),
    }
}

fn shas(resources: &[Resource]) -> BTreeSet<String> {
    resources.iter().map(|r| r.sha256.clone()).collect()
}

async fn hash_file(path: &Path) -> Result<String> {
    let mut file = tokio::fs::File::open(path)
        .await
        .map_err(|e| Error::io("cannot open", path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file
            .read(&mut buf)
            .await
            .map_err(|e| Error::io("cannot read", path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}
