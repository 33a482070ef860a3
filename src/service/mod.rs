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
mod install;
pub(crate) mod limiter;
mod lookup;
mod policy;
mod reports;
pub(crate) mod retry;
mod runtime;
pub(crate) mod scheduler;
mod status;
mod verify;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::broadcast;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::service::events::{Event, Events, DEFAULT_EVENT_BUFFER};
use crate::service::scheduler::{Deps, Scheduler};
use crate::store::policy_record;
use crate::store::registry::Registry;
use crate::store::Store;
use crate::transfer::fetch::Fetcher;

pub use crate::service::blocking::Blocking;
pub use crate::service::gem::{BlockingGem, GemResources};
pub use crate::service::reports::{
    GemStatus, InstallReport, PolicyChange, RemovedFile, ResourceState, ResourceStatus,
    UninstallReport, VerifyReport,
};

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
        let fetcher = Fetcher::new(config)?.with_cache(config.cache_settings()?)?;
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

    /// How many events each subscriber buffers before it lags.
    pub(crate) fn event_buffer(&self) -> usize {
        self.inner.events.buffer()
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
}
