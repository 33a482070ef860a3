//! The service's calls as blocking functions, for a host without an
//! executor (a plain thread, a C callback, a synchronous plugin API).
//!
//! Each call runs on the runtime the service was opened on and blocks the
//! calling thread until it is done. On a thread of a Tokio runtime (inside
//! an async task, a runtime's `block_on`, or one of its blocking threads)
//! the calls that wait refuse with `E_RESOURCE_RUNTIME`
//! ([`Error::BlockingInRuntime`]) instead of stalling or deadlocking that
//! runtime: from async code, await [`Resources`]' own methods; from a
//! blocking section, call from a thread of your own.
//!
//! Safe from any thread, a runtime's included, because they never wait:
//! [`Blocking::status`] here, and [`Resources::download_now`],
//! [`Resources::set_policy`], [`Resources::policy`],
//! [`Resources::status`], [`Resources::installed`] and
//! [`Resources::subscribe`] on the service.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::manifest::Manifest;
use crate::service::import::ImportOutcome;
use crate::service::{GemStatus, InstallReport, Resources, UninstallReport, VerifyReport};

/// Blocking versions of [`Resources`]' calls: [`Resources::blocking`].
#[derive(Debug, Clone)]
pub struct Blocking {
    service: Resources,
}

impl Resources {
    /// Blocking versions of the service's calls, for code without an
    /// executor. On a thread of a Tokio runtime (inside an async task, for
    /// one) those that wait return `E_RESOURCE_RUNTIME` instead: await the
    /// methods of [`Resources`] there (see [`crate::service::blocking`]).
    pub fn blocking(&self) -> Blocking {
        Blocking::new(self.clone())
    }
}

impl Blocking {
    pub(crate) fn new(service: Resources) -> Blocking {
        Blocking { service }
    }

    /// The service these calls go to.
    pub fn service(&self) -> &Resources {
        &self.service
    }

    /// Runs `work` to its end on this thread, or refuses on a thread of a
    /// Tokio runtime (where Tokio would panic, or the wait would stall it).
    fn wait<T>(
        &self,
        call: &'static str,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(Error::BlockingInRuntime { call });
        }
        self.service.handle().block_on(work)
    }

    /// [`Resources::install`], blocking.
    pub fn install(&self, gem: &str, manifest: &Manifest) -> Result<InstallReport> {
        self.wait("install", self.service.install(gem, manifest))
    }

    /// [`Resources::uninstall`], blocking.
    pub fn uninstall(&self, gem: &str) -> Result<UninstallReport> {
        self.wait("uninstall", self.service.uninstall(gem))
    }

    /// [`Resources::path`], blocking: a missing file is downloaded first.
    pub fn path(&self, gem: &str, resource_id: &str) -> Result<PathBuf> {
        self.wait("path", self.service.path(gem, resource_id))
    }

    /// [`Resources::status`] (which does not wait for anything anyway).
    pub fn status(&self, gem: Option<&str>) -> Result<Vec<GemStatus>> {
        self.service.status(gem)
    }

    /// [`Resources::start`], blocking.
    pub fn start(&self) -> Result<usize> {
        self.wait("start", self.service.start())
    }

    /// [`Resources::cancel`], blocking.
    pub fn cancel(&self, gem: &str, resource_id: &str) -> Result<bool> {
        self.wait("cancel", self.service.cancel(gem, resource_id))
    }

    /// [`Resources::retry`], blocking.
    pub fn retry(&self, gem: &str, resource_id: &str) -> Result<bool> {
        self.wait("retry", self.service.retry(gem, resource_id))
    }

    /// [`Resources::import`], blocking: the file is hashed and copied first.
    pub fn import(&self, path: &Path) -> Result<ImportOutcome> {
        self.wait("import", self.service.import(path))
    }

    /// [`Resources::verify`], blocking.
    pub fn verify(&self) -> Result<VerifyReport> {
        self.wait("verify", self.service.verify())
    }

    /// [`Resources::wait_idle`], blocking; `Err` only on a thread of a
    /// Tokio runtime.
    pub fn wait_idle(&self) -> Result<()> {
        self.wait("wait_idle", async {
            self.service.wait_idle().await;
            Ok(())
        })
    }

    /// [`Resources::shutdown`], blocking; `Err` only on a thread of a
    /// Tokio runtime.
    pub fn shutdown(&self) -> Result<()> {
        self.wait("shutdown", async {
            self.service.shutdown().await;
            Ok(())
        })
    }
}
