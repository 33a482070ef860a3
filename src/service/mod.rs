//! The resource service the app embeds: install, upgrade, uninstall, the
//! `path` lookup for tools, background downloads, status and events.
//!
//! Rules from the specification, and where they hold:
//! - A download never fails or delays an install: [`Resources::install`]
//!   returns once the registration is durable; required files are queued.
//! - Required files missing at app start are queued again by
//!   [`Resources::start`]; lazy files download on first [`Resources::path`].
//! - A required file whose download failed is queued again
//!   `service.retry_failed_after` later, the wait doubling (up to eight
//!   times the setting or an hour) while it keeps failing, and never before
//!   a server's `Retry-After`: a service that stays up for days does not
//!   wait for the next start. Lazy files wait for their next `path`.
//! - Upgrades reuse every file whose `sha256` is unchanged (the store is
//!   content-addressed), and delete files the new version no longer declares
//!   only after the new registration is written. A file another installed
//!   gem declares is never deleted.
//! - One download per file (SHA-256 and size) and address list however
//!   many callers wait, in this process (one job) or across processes (the
//!   store's lock per file and lane). Another gem's download of the same
//!   file from other addresses is waited for only so long (see
//!   [`crate::store::lanes`]).

pub mod autofill;
pub mod blocking;
pub mod events;
pub mod gem;
pub mod import;
pub(crate) mod limiter;
pub(crate) mod retry;
pub(crate) mod scheduler;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio::runtime::Handle;
use tokio::sync::broadcast;

use crate::config::Config;
use crate::error::{Error, ErrorCode, Result};
use crate::manifest::{Manifest, Resource};
use crate::net::policy::Policy;
use crate::service::events::{Event, Events, DEFAULT_EVENT_BUFFER};
use crate::service::scheduler::{Deps, JobResult, JobState, Scheduler};
use crate::store::policy_record;
use crate::store::registry::{check_gem_id, FailureRecord, InstalledBy, Registration, Registry};
use crate::store::{Listing, Store};
use crate::transfer::fetch::Fetcher;

pub use crate::service::blocking::Blocking;
pub use crate::service::gem::{BlockingGem, GemResources};

/// Files deleted at once by an uninstall or upgrade.
const DELETE_WORKERS: usize = 16;

/// How often a running service looks at the store's policy record.
pub const POLICY_WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// The resource service. Cheap to clone; clones share everything.
///
/// # Runtime
/// The service runs its downloads on a Tokio runtime: the one
/// [`Resources::open`] is called in, or the one whose [`Handle`]
/// [`Resources::open_with_handle`] is given. Once open, its methods can be
/// called and awaited from any executor or thread (`futures::executor`,
/// another runtime); work that needs Tokio is moved onto that runtime.
/// For code without any executor, [`Resources::blocking`] offers the same
/// calls as blocking functions.
///
/// # After shutdown
/// [`Resources::shutdown`] ends the service for every clone: each later
/// call returns [`Error::Shutdown`] (`E_RESOURCE_SHUTDOWN`),
/// [`Resources::import`] included, every event subscription ends, and
/// [`Resources::is_shut_down`] says so.
#[derive(Clone)]
pub struct Resources {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resources")
            .field("store", &self.inner.store.root())
            .field("shut_down", &self.is_shut_down())
            .field("subscribers", &self.inner.events.receiver_count())
            .finish_non_exhaustive()
    }
}

/// Opens a [`Resources`] with options: [`Resources::builder`].
#[derive(Debug, Clone)]
pub struct ResourcesBuilder<'a> {
    config: &'a Config,
    store_dir: Option<PathBuf>,
    handle: Option<Handle>,
    event_buffer: usize,
}

impl ResourcesBuilder<'_> {
    /// Uses the store in `dir` instead of the configuration's.
    pub fn store_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.store_dir = Some(dir.into());
        self
    }

    /// Runs downloads on this runtime instead of the current one.
    pub fn handle(mut self, handle: Handle) -> Self {
        self.handle = Some(handle);
        self
    }

    /// Events each subscriber's buffer holds before the oldest are dropped
    /// (default [`DEFAULT_EVENT_BUFFER`], at least 1).
    pub fn event_buffer(mut self, events: usize) -> Self {
        self.event_buffer = events.max(1);
        self
    }

    /// Opens the service. Fails with `E_RESOURCE_RUNTIME` when no runtime
    /// was given and this is not called inside one.
    pub fn open(self) -> Result<Resources> {
        let handle = match self.handle {
            Some(handle) => handle,
            None => Handle::try_current().map_err(|_| Error::NoRuntime)?,
        };
        let dir = self.store_dir.unwrap_or_else(|| self.config.store_dir());
        Resources::build(self.config, &dir, handle, self.event_buffer)
    }
}

struct Inner {
    store: Store,
    registry: Registry,
    scheduler: Arc<Scheduler>,
    events: Events,
    /// How long an interrupted download is kept for resume.
    partial_max_age: std::time::Duration,
    /// The store's policy record as last seen.
    /// The generation of the store's policy record last applied (or
    /// written) here.
    policy_seen: std::sync::Mutex<Option<u64>>,
    /// The configuration file the service was opened with, named in the
    /// policy records it writes.
    config_file: Option<PathBuf>,
    /// The most bytes auto-fill reads from one address.
    autofill_max_bytes: u64,
    /// Files auto-fill reads at once.
    autofill_parallel: usize,
}

/// What [`Resources::install`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct InstallReport {
    /// The gem.
    pub gem: String,
    /// Whether an earlier version declaring other resources was registered
    /// (an unchanged reinstall is no upgrade).
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

/// What [`Resources::set_policy_counted`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PolicyChange {
    /// Downloads the new policy stopped (an address of theirs it refuses).
    pub stopped: usize,
    /// Failed required files queued again because it permits them now.
    pub queued: usize,
}

/// What [`Resources::uninstall`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct UninstallReport {
    /// The gem.
    pub gem: String,
    /// SHA-256s of files deleted.
    pub deleted: Vec<String>,
    /// SHA-256s kept because another installed gem declares them.
    pub kept: Vec<String>,
}

/// The state of one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ResourceState {
    /// Verified and in the store.
    #[non_exhaustive]
    Present {
        /// Its local path.
        path: PathBuf,
        /// The address from the manifest (the url or a mirror, as
        /// declared, before any redirect) that served the file, `import`
        /// for a file imported from this machine; `null` when it is not
        /// known (a file kept by an earlier version). A file that one gem
        /// or version downloaded and another reuses keeps what served it.
        served_by: Option<String>,
    },
    /// Not in the store, nothing running.
    Missing,
    /// Waiting for a download slot.
    Queued,
    /// Being downloaded (here or by another process sharing the store).
    #[non_exhaustive]
    Downloading {
        /// Bytes of the file held so far: the live count of this service's
        /// download; for another process's, the durable bytes its partial
        /// file's record names (the prefix and every range its parts
        /// wrote), else what that file occupies on disk, never its length.
        bytes: u64,
        /// The current rate in bytes per second, as the progress events
        /// say it; `null` for another process's download.
        #[serde(default)]
        bytes_per_sec: Option<u64>,
    },
    /// Between two tries of an address of this service's download: the
    /// try that comes next (`attempt`) of how many (`of`), and why the last
    /// one failed (`reason`); `downloading` again once bytes arrive.
    #[non_exhaustive]
    Retrying {
        /// The try that comes next (2 for the first retry).
        attempt: u32,
        /// Of how many.
        of: u32,
        /// Why the last try failed.
        reason: String,
        /// Bytes of the file held so far.
        bytes: u64,
    },
    /// Waiting for another gem's download of the same file (the same
    /// SHA-256 and size from other addresses, in this process or another),
    /// none of this resource's own addresses in use yet. It waits at most
    /// `network.wait_for_others_secs`, then fetches from its own addresses
    /// too.
    #[non_exhaustive]
    Waiting {
        /// The gem whose download it waits for (`None`: not known, or a
        /// download by hand).
        on: Option<String>,
        /// Bytes that download holds so far (its, not this resource's
        /// hosts').
        bytes: u64,
    },
    /// The last download failed (and nothing is running now).
    #[non_exhaustive]
    Failed {
        /// The failure.
        #[serde(flatten)]
        failure: FailureRecord,
    },
}

/// One resource in [`Resources::status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ResourceStatus {
    /// The resource id.
    pub id: String,
    /// The description, or the id when there is none.
    pub label: String,
    /// The file's name in the store (`ocr-v3.onnx`).
    pub file: String,
    /// Declared size.
    pub size: u64,
    /// Its description as the manifest gives it (`None`: none given, and
    /// `label` is the id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The host of its `url`.
    pub host: String,
    /// Every address: the url, then the mirrors, as declared.
    pub addresses: Vec<String>,
    /// The hosts of those addresses, each once, in order.
    pub hosts: Vec<String>,
    /// Whether it downloads right after install (`required`) or on first use.
    pub required: bool,
    /// SHA-256.
    pub sha256: String,
    /// Where it stands.
    #[serde(flatten)]
    pub state: ResourceState,
    /// Bytes of an interrupted download kept for resuming, when the file is
    /// missing (or failed) and no download runs: the next one continues
    /// from there. The durable bytes its record names (the prefix and every
    /// range), never the partial file's length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_bytes: Option<u64>,
}

/// One gem in [`Resources::status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GemStatus {
    /// The gem.
    pub gem: String,
    /// Who installed it (the last install or upgrade); `null` for a gem
    /// registered before this was kept.
    #[serde(default)]
    pub installed_by: Option<InstalledBy>,
    /// Its resources in manifest order.
    pub resources: Vec<ResourceStatus>,
}

/// What [`Resources::verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct VerifyReport {
    /// Stored files checked (every name of every stored file).
    pub checked: usize,
    /// Stored contents (SHA-256s) whose bytes still match (`intact` in
    /// JSON, where `ok` says whether nothing was corrupted).
    #[serde(rename = "intact")]
    pub ok: usize,
    /// SHA-256s of files that did not match and were removed.
    pub corrupted: Vec<String>,
    /// The removed files, named.
    pub removed: Vec<RemovedFile>,
}

/// A stored file [`Resources::verify`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RemovedFile {
    /// Its SHA-256.
    pub sha256: String,
    /// Its file names in the store.
    pub files: Vec<String>,
    /// `gem/resource` of every installed resource that declares it.
    pub declared_by: Vec<String>,
}

impl Resources {
    /// Opens the service on the configuration's store, running downloads
    /// on the current Tokio runtime. Fails with `E_RESOURCE_RUNTIME`
    /// outside a runtime: use [`Resources::open_with_handle`] there.
    ///
    /// Opening does file work on the calling thread, synchronously: it
    /// creates the store's folders, checks their owner and mode, reads the
    /// store's version, and reads any `[dev]` certificate files (a few
    /// milliseconds on a local disk, more on a slow or network one). It
    /// does not hash, download or scan stored files; [`Resources::start`]
    /// does the cleaning, asynchronously. Where a worker thread must not
    /// block even that long, open on a blocking thread, which still finds
    /// the runtime: `tokio::task::spawn_blocking(move ||
    /// Resources::open(&config)).await`.
    pub fn open(config: &Config) -> Result<Resources> {
        Resources::builder(config).open()
    }

    /// Opens the service on the configuration's store, running downloads
    /// on the runtime of `handle`; callable from anywhere.
    pub fn open_with_handle(config: &Config, handle: Handle) -> Result<Resources> {
        Resources::builder(config).handle(handle).open()
    }

    /// Opens the service on the store in `dir` (on the current runtime).
    pub fn open_at(config: &Config, dir: &Path) -> Result<Resources> {
        Resources::builder(config).store_dir(dir).open()
    }

    /// Options for opening the service: another store folder, another
    /// runtime, the event buffer's size.
    pub fn builder(config: &Config) -> ResourcesBuilder<'_> {
        ResourcesBuilder {
            config,
            store_dir: None,
            handle: None,
            event_buffer: DEFAULT_EVENT_BUFFER,
        }
    }

    fn build(config: &Config, dir: &Path, handle: Handle, buffer: usize) -> Result<Resources> {
        let store = Store::open(dir)?;
        let registry = Registry::new(&store);
        let events = Events::new(buffer);
        let fetcher = Fetcher::new(config)?;
        // The store's last policy holds when it is newer than the
        // configuration file (see `store::policy_record`).
        let policy = policy_record::effective(
            config.policy()?,
            config.source.as_deref(),
            store.policy_record()?,
        );
        fetcher.set_policy(policy);
        let policy_seen = store.policy_generation();
        let deps = Deps {
            fetcher,
            store: store.clone(),
            registry: registry.clone(),
            retry: config.retry_policy(),
            events: events.clone(),
            retry_failed_after: config.retry_failed_after(),
        };
        let scheduler = Scheduler::new(
            deps,
            config.service.max_concurrent_downloads,
            config.service.max_per_host,
            handle,
        );
        let service = Resources {
            inner: Arc::new(Inner {
                store,
                registry,
                scheduler: Arc::new(scheduler),
                events,
                partial_max_age: config.partial_max_age(),
                policy_seen: std::sync::Mutex::new(policy_seen),
                config_file: config.source.clone(),
                autofill_max_bytes: config.network.autofill_max_bytes,
                autofill_parallel: config.service.max_concurrent_downloads.max(1),
            }),
        };
        service.watch_policy_record();
        Ok(service)
    }

    /// Follows the store's policy record while the service runs: a policy
    /// that another process sets for this store applies here within
    /// [`POLICY_WATCH_EVERY`] (and at once before each download starts).
    fn watch_policy_record(&self) {
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

    /// Subscribes to progress events (see [`crate::service::events`] for what they
    /// promise, and for the buffer). [`Resources::shutdown`] ends every
    /// subscription (`Closed`); after it, the receiver is closed at once.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.inner.events.subscribe()
    }

    /// Subscribes to events and takes [`Resources::status`] after, so that
    /// every change after the status arrives as an event: a view drawn
    /// from the status and then updated from the events misses nothing.
    /// Call it again after a `Lagged` to start over. An event may repeat
    /// what the status already shows; applying it again is harmless.
    pub fn subscribe_with_status(
        &self,
        gem: Option<&str>,
    ) -> Result<(broadcast::Receiver<Event>, Vec<GemStatus>)> {
        let events = self.subscribe();
        let status = self.status(gem)?;
        Ok((events, status))
    }

    fn emit(&self, event: Event) {
        self.inner.events.send(event);
    }

    /// Whether [`Resources::shutdown`] was called (on any clone).
    pub fn is_shut_down(&self) -> bool {
        self.inner.scheduler.is_shut_down()
    }

    /// `Err(E_RESOURCE_SHUTDOWN)` once the service is shut down.
    pub(crate) fn check_live(&self) -> Result<()> {
        self.live()
    }

    /// `Err(E_RESOURCE_SHUTDOWN)` once the service is shut down.
    fn live(&self) -> Result<()> {
        if self.is_shut_down() {
            Err(Error::Shutdown)
        } else {
            Ok(())
        }
    }

    /// Runs `work` on the service's runtime and waits for it from any
    /// executor; `E_RESOURCE_SHUTDOWN` once the service is shut down.
    pub(crate) async fn on_runtime<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.live()?;
        match self.inner.scheduler.handle().spawn(work).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime itself is shutting down.
            Err(_) => Err(Error::Shutdown),
        }
    }

    /// Runs blocking file work (writes, fsyncs, deletions, copies) on the
    /// service runtime's blocking threads, from any executor: a slow disk
    /// then holds up only the call that waits for it, never the transfers
    /// running on the runtime's workers.
    async fn on_blocking<T: Send + 'static>(
        &self,
        path: &Path,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        match self.handle().spawn_blocking(work).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::io(
                "the file work stopped:",
                path,
                std::io::Error::other(e),
            )),
        }
    }

    /// The stored file of `resource` under its own name, made on a
    /// blocking thread when it needs a link or a copy.
    async fn find(&self, resource: &Resource) -> Result<Option<PathBuf>> {
        let store = self.inner.store.clone();
        let (sha256, name) = (resource.sha256.clone(), resource.file_name());
        let wanted = store.blob_path(&sha256, &name);
        if let Some(path) = store.find_unchanged(&sha256, &name)? {
            return Ok(Some(path));
        }
        if !store.has(&sha256) {
            return Ok(None);
        }
        self.on_blocking(&wanted, move || store.find(&sha256, &name))
            .await
    }

    /// The runtime the service runs on.
    pub(crate) fn handle(&self) -> &Handle {
        self.inner.scheduler.handle()
    }

    /// Registers a gem's validated resources: a new install, or an upgrade
    /// of an installed gem. Returns once the registration is durable, never
    /// waiting for a download; required files then download in the
    /// background. Files the previous version declared and no installed gem
    /// declares now are deleted after the new registration is written.
    /// [`Event::Installed`] is published once the registration is written,
    /// before the events of what it causes.
    ///
    /// The registration records [`InstalledBy::Library`] as who installed
    /// it; [`Resources::install_by`] names another installer.
    pub async fn install(&self, gem: &str, manifest: &Manifest) -> Result<InstallReport> {
        self.install_by(gem, manifest, InstalledBy::Library).await
    }

    /// [`Resources::install`], recording `by` as who installed the gem (the
    /// last install or upgrade wins). `serve` uninstalls only the gems its
    /// own folder installed; [`GemStatus::installed_by`] shows it.
    pub async fn install_by(
        &self,
        gem: &str,
        manifest: &Manifest,
        by: InstalledBy,
    ) -> Result<InstallReport> {
        check_gem_id(gem)?;
        let (this, gem, manifest) = (self.clone(), gem.to_string(), manifest.clone());
        self.on_runtime(async move { this.install_here(&gem, &manifest, by).await })
            .await
    }

    async fn install_here(
        &self,
        gem: &str,
        manifest: &Manifest,
        by: InstalledBy,
    ) -> Result<InstallReport> {
        let inner = &self.inner;
        let store = inner.store.clone();
        let name = gem.to_string();
        self.on_blocking(inner.store.root(), move || store.check_installable(&name))
            .await?;
        let lock = inner.registry.lock().await?;
        let old = inner.registry.get(gem)?;
        let registration = Registration {
            gem: gem.to_string(),
            resources: manifest.resources.clone(),
            installed_by: Some(by),
        };
        let registry = inner.registry.clone();
        self.on_blocking(inner.store.root(), move || registry.put(&registration))
            .await?;
        self.emit(Event::Installed {
            at: SystemTime::now(),
            gem: gem.to_string(),
            resources: self.rows(gem, &manifest.resources),
        });
        // The upgrade has succeeded: only now may dropped files go.
        let kept = shas(&manifest.resources);
        let dropped: BTreeMap<String, String> = match &old {
            Some(old) => ids_by_sha(&old.resources)
                .into_iter()
                .filter(|(sha, _)| !kept.contains(sha))
                .collect(),
            None => BTreeMap::new(),
        };
        let (deleted, _) = self.delete_unclaimed(gem, dropped).await?;
        drop(lock);
        let unchanged = old
            .as_ref()
            .is_some_and(|o| o.resources == manifest.resources);
        let mut report = InstallReport {
            gem: gem.to_string(),
            upgrade: old.is_some() && !unchanged,
            unchanged,
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
        Ok(report)
    }

    /// Removes a gem: cancels its downloads and deletes every file of it
    /// that no other installed gem declares.
    ///
    /// A gem that is not installed is an error here, `E_RESOURCE_NOT_FOUND`
    /// ([`Error::NotFound`]), and nothing changes or is published: an app
    /// that removes a gem it never installed usually has a bug worth
    /// seeing. [`Resources::uninstall_if_installed`] is the same call for
    /// callers to whom "already gone" is success (the command line's
    /// `uninstall` behaves so: it says "nothing to do" and exits 0).
    ///
    /// Its events, in order: [`Event::Cancelled`] for each of the gem's
    /// downloads it stops, [`Event::Deleted`] for each stored file no gem
    /// declares any more, then [`Event::Uninstalled`], last, once the
    /// registration and the files are gone.
    pub async fn uninstall(&self, gem: &str) -> Result<UninstallReport> {
        check_gem_id(gem)?;
        let (this, gem) = (self.clone(), gem.to_string());
        self.on_runtime(async move { this.uninstall_here(&gem, None).await })
            .await
    }

    /// [`Resources::uninstall`], with a gem that is not installed as
    /// success: `Ok(None)`, and nothing changes or is published. Other
    /// errors (an invalid gem id, a file that cannot be deleted) are still
    /// errors.
    pub async fn uninstall_if_installed(&self, gem: &str) -> Result<Option<UninstallReport>> {
        match self.uninstall(gem).await {
            Ok(report) => Ok(Some(report)),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Resources::uninstall`], only when `by` installed the gem: checked
    /// under the registry lock, so an install by anyone else in between
    /// (another process included) keeps it. `Ok(None)`: not installed, or
    /// installed by someone else (nothing changes or is published).
    pub async fn uninstall_installed_by(
        &self,
        gem: &str,
        by: &InstalledBy,
    ) -> Result<Option<UninstallReport>> {
        check_gem_id(gem)?;
        let (this, gem, by) = (self.clone(), gem.to_string(), by.clone());
        match self
            .on_runtime(async move { this.uninstall_here(&gem, Some(&by)).await })
            .await
        {
            Ok(report) => Ok(Some(report)),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn uninstall_here(
        &self,
        gem: &str,
        only_by: Option<&InstalledBy>,
    ) -> Result<UninstallReport> {
        let inner = &self.inner;
        let lock = inner.registry.lock().await?;
        let Some(old) = inner.registry.get(gem)? else {
            return Err(Error::NotFound(format!("gem {gem:?} is not installed")));
        };
        if let Some(by) = only_by {
            if old.installed_by.as_ref() != Some(by) {
                let who = old
                    .installed_by
                    .as_ref()
                    .map_or_else(|| "an earlier version".to_string(), |w| w.describe());
                return Err(Error::NotFound(format!(
                    "gem {gem:?} was installed by {who}, not {}",
                    by.describe()
                )));
            }
        }
        let (registry, owner) = (inner.registry.clone(), gem.to_string());
        self.on_blocking(inner.store.root(), move || registry.remove(&owner))
            .await?;
        let (deleted, kept) = self
            .delete_unclaimed(gem, ids_by_sha(&old.resources))
            .await?;
        drop(lock);
        self.emit(Event::Uninstalled {
            at: SystemTime::now(),
            gem: gem.to_string(),
        });
        Ok(UninstallReport {
            gem: gem.to_string(),
            deleted,
            kept,
        })
    }

    /// Deletes those of `candidates` (SHA-256 → the id `gem` gave it) no
    /// registration declares (cancelling their downloads first); each
    /// [`Event::Deleted`] names `gem` and that id. Call with the registry
    /// lock held.
    async fn delete_unclaimed(
        &self,
        gem: &str,
        candidates: BTreeMap<String, String>,
    ) -> Result<(Vec<String>, Vec<String>)> {
        let inner = &self.inner;
        let mut claimed = BTreeSet::new();
        for reg in inner.registry.list()? {
            claimed.extend(shas(&reg.resources));
        }
        let (mut unclaimed, mut kept) = (Vec::new(), Vec::new());
        for sha in candidates.keys().cloned() {
            if claimed.contains(&sha) {
                kept.push(sha);
                continue;
            }
            inner
                .scheduler
                .cancel(&sha, "no installed gem declares it any more")
                .await;
            unclaimed.push(sha);
        }
        let (store, registry) = (inner.store.clone(), inner.registry.clone());
        let removal = move || {
            store.remove_partials_of(&unclaimed.iter().cloned().collect());
            unclaimed.retain(|sha| store.has(sha));
            let deleted = remove_blobs(&store, &unclaimed)?;
            for sha in &deleted {
                registry.forget_served_by(sha);
            }
            Ok(deleted)
        };
        let blobs = inner.store.root().join("blobs");
        let deleted = self.on_blocking(&blobs, removal).await?;
        let at = SystemTime::now();
        for sha in &deleted {
            self.emit(Event::Deleted {
                at,
                sha256: sha.clone(),
                gem: Some(gem.to_string()),
                resource: candidates.get(sha).cloned(),
            });
        }
        Ok((deleted, kept))
    }

    /// The local path of a gem's resource. Present: returned at once (no
    /// hashing, no network). Missing (required or not): downloaded now,
    /// ahead of queued background work, and shared with every other caller
    /// waiting for the same file. A failure errors this call only; the next
    /// call tries again.
    pub async fn path(&self, gem: &str, resource_id: &str) -> Result<PathBuf> {
        self.path_until(gem, resource_id, None).await
    }

    /// [`Resources::path`] that gives up waiting when `cancel` fires, with
    /// [`Error::CallCancelled`]: the download goes on when another caller
    /// waits for it or something else wants it (a gem requires the file, a
    /// retry or `download_now` asked for it), and stops otherwise, its
    /// bytes kept for the next call. A `path` future dropped before it ends
    /// leaves the same way.
    pub async fn path_until(
        &self,
        gem: &str,
        resource_id: &str,
        cancel: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<PathBuf> {
        self.live()?;
        let resource = self.resource(gem, resource_id)?;
        if let Some(path) = self.find(&resource).await? {
            return Ok(path);
        }
        // A store this user may only read cannot take a download; say so
        // before a lock file fails (the download says it too; here no job
        // is queued for it).
        let store = self.inner.store.clone();
        let what = format!("{gem}/{resource_id} ({})", resource.file_name());
        self.on_blocking(self.inner.store.root(), move || store.check_writable(&what))
            .await?;
        // Another process may have set a policy a moment ago.
        self.follow_policy_record();
        let (mut done, caller) = self.inner.scheduler.ensure_for_caller(gem, &resource);
        let given_up = async {
            match cancel {
                Some(token) => token.cancelled().await,
                None => std::future::pending().await,
            }
        };
        // A watch channel: waiting needs no runtime of its own.
        let result: JobResult = tokio::select! {
            waited = done.wait_for(|r| r.is_some()) => match waited {
                Ok(r) => r.clone().unwrap_or_else(|| Err(cancelled(&resource))),
                Err(_) => Err(cancelled(&resource)),
            },
            () = given_up => {
                return Err(Error::CallCancelled {
                    resource: resource.id.clone(),
                    download_goes_on: caller.leave(),
                });
            }
        };
        caller.done();
        match result {
            Err(Error::Cancelled { .. }) if self.is_shut_down() => return Err(Error::Shutdown),
            other => other?,
        };
        // The job stored the bytes under its own resource's file name; this
        // caller gets its own name for the same bytes.
        match self.find(&resource).await? {
            Some(path) => Ok(path),
            None => Err(Error::NotFound(format!(
                "resource {resource_id:?} of gem {gem:?} was deleted while it downloaded"
            ))),
        }
    }

    /// Stops the download of a gem's resource (the settings page's
    /// "cancel"). The bytes received so far are kept, and the next
    /// download of the file continues from them. Every caller waiting for
    /// it gets `E_RESOURCE_CANCELLED`, and each waiting gem an
    /// [`Event::Cancelled`]. Returns whether a download was running or
    /// queued.
    pub async fn cancel(&self, gem: &str, resource_id: &str) -> Result<bool> {
        self.live()?;
        let resource = self.resource(gem, resource_id)?;
        Ok(self
            .inner
            .scheduler
            .cancel_job(&resource, "cancelled on request")
            .await)
    }

    /// Forgets the last failure of a gem's resource and queues its
    /// download now, ahead of background work (the settings page's
    /// "retry"). Returns `false` when the file is present already.
    pub async fn retry(&self, gem: &str, resource_id: &str) -> Result<bool> {
        self.live()?;
        let resource = self.resource(gem, resource_id)?;
        if self.inner.store.has(&resource.sha256) {
            return Ok(false);
        }
        let (this, owner, id) = (self.clone(), gem.to_string(), resource.id.clone());
        self.on_runtime(async move { this.inner.registry.set_failure(&owner, &id, None).await })
            .await?;
        self.inner.scheduler.ensure(gem, &resource, true);
        Ok(true)
    }

    /// Queues the download of a gem's resource now, ahead of background
    /// work, without waiting for it: a lazy file the user wants before a
    /// tool asks for it. Returns `false` when the file is present already.
    pub fn download_now(&self, gem: &str, resource_id: &str) -> Result<bool> {
        self.live()?;
        let resource = self.resource(gem, resource_id)?;
        if self.inner.store.has(&resource.sha256) {
            return Ok(false);
        }
        self.inner.scheduler.ensure(gem, &resource, true);
        Ok(true)
    }

    fn resource(&self, gem: &str, resource_id: &str) -> Result<Resource> {
        check_gem_id(gem)?;
        let reg = self
            .inner
            .registry
            .get_shared(gem)?
            .ok_or_else(|| Error::NotFound(format!("gem {gem:?} is not installed")))?;
        if let Some(found) = reg.resources.iter().find(|r| r.id == resource_id) {
            return Ok(found.clone());
        }
        let ids: Vec<&str> = reg.resources.iter().map(|r| r.id.as_str()).collect();
        let known = if ids.is_empty() {
            "it declares none".to_string()
        } else {
            format!("its resources are: {}", ids.join(", "))
        };
        Err(Error::NotFound(format!(
            "gem {gem:?} declares no resource {resource_id:?}; {known}"
        )))
    }

    /// What an app start does: removes leftovers of a crash that nobody
    /// can resume, partial files no installed gem declares or older than
    /// `network.partial_max_age_days`, and queues every installed gem's
    /// missing required files (continuing kept partial files). Returns how
    /// many were queued; does not wait for them.
    pub async fn start(&self) -> Result<usize> {
        let this = self.clone();
        self.on_runtime(async move { this.start_here().await })
            .await
    }

    async fn start_here(&self) -> Result<usize> {
        let inner = &self.inner;
        let removed = {
            let _lock = inner.registry.lock().await?;
            let (store, registry) = (inner.store.clone(), inner.registry.clone());
            let max_age = inner.partial_max_age;
            let clean = move || {
                let mut declared = BTreeSet::new();
                for reg in registry.list()? {
                    declared.extend(shas(&reg.resources));
                }
                Ok(store.clean_tmp(max_age)? + store.prune_partials(&declared) + registry.clean())
            };
            self.on_blocking(inner.store.root(), clean).await?
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

    /// Waits until no download is queued or running.
    pub async fn wait_idle(&self) {
        self.inner.scheduler.idle().await;
    }

    /// Stops every download and waits until all of them have finished:
    /// each waiting gem gets [`Event::Cancelled`], and each caller waiting
    /// in [`Resources::path`] gets `E_RESOURCE_SHUTDOWN`
    /// ([`Error::Shutdown`]). The bytes a download received stay in the
    /// store as a partial file, and the next run continues from them, when
    /// they can be resumed (they reached the disk, and the server named
    /// the version it sent with an `ETag` or `Last-Modified`); a partial
    /// file with nothing resumable in it is removed. Nothing unverified is
    /// ever left at a final path.
    ///
    /// Then it ends every event subscription: each receiver gets the
    /// events still in its buffer (the `Cancelled` ones included), then
    /// `Closed`. From then on every call returns `E_RESOURCE_SHUTDOWN`,
    /// and [`Resources::subscribe`] gives a closed receiver. Calling it
    /// again does nothing more.
    pub async fn shutdown(&self) {
        let this = self.clone();
        let stop = async move { this.inner.scheduler.shutdown().await };
        // Nothing runs any more when the runtime itself has gone away.
        let _ = self.handle().spawn(stop).await;
        self.inner.events.close();
    }

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
                installed_by: reg.installed_by,
            });
        }
        Ok(out)
    }

    /// The status rows of `gem`'s `resources`, for [`Event::Installed`]: a
    /// failure record that cannot be read shows as none, since the install
    /// has succeeded by then.
    fn rows(&self, gem: &str, resources: &[Resource]) -> Vec<ResourceStatus> {
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

    /// Re-hashes every stored file; a file whose bytes no longer match its
    /// SHA-256 is removed (it downloads again when next needed).
    pub async fn verify(&self) -> Result<VerifyReport> {
        let this = self.clone();
        self.on_runtime(async move { this.verify_here().await })
            .await
    }

    async fn verify_here(&self) -> Result<VerifyReport> {
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
                let declared_by = self.declared_by(&sha)?;
                let first = declared_by.first().cloned();
                report.removed.push(RemovedFile {
                    sha256: sha.clone(),
                    files: files
                        .iter()
                        .filter_map(|f| f.file_name()?.to_str().map(str::to_string))
                        .collect(),
                    declared_by: declared_by
                        .iter()
                        .map(|(gem, id)| format!("{gem}/{id}"))
                        .collect(),
                });
                let (doomed, sha256) = (store.clone(), sha.clone());
                let registry = self.inner.registry.clone();
                let remove = move || {
                    doomed.remove(&sha256)?;
                    registry.forget_served_by(&sha256);
                    Ok(())
                };
                self.on_blocking(store.root(), remove).await?;
                let (gem, resource) = first.unzip();
                self.emit(Event::Deleted {
                    at: SystemTime::now(),
                    sha256: sha.clone(),
                    gem,
                    resource,
                });
                report.corrupted.push(sha);
            }
        }
        Ok(report)
    }
}

impl Resources {
    /// The gem and resource id of every installed resource whose SHA-256
    /// is `sha256`, in the order of [`Resources::status`].
    fn declared_by(&self, sha256: &str) -> Result<Vec<(String, String)>> {
        Ok(self
            .inner
            .registry
            .list()?
            .iter()
            .flat_map(|reg| {
                reg.resources
                    .iter()
                    .filter(|r| r.sha256 == sha256)
                    .map(|r| (reg.gem.clone(), r.id.clone()))
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
    record.code == ErrorCode::Policy
        || record.primary_cause == ErrorCode::Policy
        || record.attempts.iter().any(|a| a.code == ErrorCode::Policy)
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

/// Each SHA-256 of `resources` with the id of the first resource that
/// declares it.
fn ids_by_sha(resources: &[Resource]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for r in resources {
        out.entry(r.sha256.clone()).or_insert_with(|| r.id.clone());
    }
    out
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
