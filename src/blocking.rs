//! The service's calls as blocking functions, for a host without an
//! executor (a plain thread, a C callback, a synchronous plugin API).
//!
//! Each call runs on the runtime the service was opened on and blocks the
//! calling thread until it is done. **Never call them from inside an async
//! task**: they would block an executor thread, and on the service's own
//! runtime Tokio refuses (panics) rather than deadlock. From async code,
//! use [`Resources`] itself.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::import::ImportOutcome;
use crate::manifest::Manifest;
use crate::service::{GemStatus, InstallReport, Resources, UninstallReport, VerifyReport};

/// Blocking versions of [`Resources`]' calls: [`Resources::blocking`].
#[derive(Debug, Clone)]
pub struct Blocking {
    service: Resources,
}

impl Blocking {
    pub(crate) fn new(service: Resources) -> Blocking {
        Blocking { service }
    }

    /// The service these calls go to.
    pub fn service(&self) -> &Resources {
        &self.service
    }

    fn wait<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        self.service.handle().block_on(work)
    }

    /// [`Resources::install`], blocking.
    pub fn install(&self, gem: &str, manifest: &Manifest) -> Result<InstallReport> {
        self.wait(self.service.install(gem, manifest))
    }

    /// [`Resources::uninstall`], blocking.
    pub fn uninstall(&self, gem: &str) -> Result<UninstallReport> {
        self.wait(self.service.uninstall(gem))
    }

    /// [`Resources::path`], blocking: a missing file is downloaded first.
    pub fn path(&self, gem: &str, resource_id: &str) -> Result<PathBuf> {
        self.wait(self.service.path(gem, resource_id))
    }

    /// [`Resources::status`] (which does not wait for anything anyway).
    pub fn status(&self, gem: Option<&str>) -> Result<Vec<GemStatus>> {
        self.service.status(gem)
    }

    /// [`Resources::start`], blocking.
    pub fn start(&self) -> Result<usize> {
        self.wait(self.service.start())
    }

    /// [`Resources::cancel`], blocking.
    pub fn cancel(&self, gem: &str, resource_id: &str) -> Result<bool> {
        self.wait(self.service.cancel(gem, resource_id))
    }

    /// [`Resources::retry`], blocking.
    pub fn retry(&self, gem: &str, resource_id: &str) -> Result<bool> {
        self.wait(self.service.retry(gem, resource_id))
    }

    /// [`Resources::import`], blocking: the file is hashed and copied first.
    pub fn import(&self, path: &Path) -> Result<ImportOutcome> {
        self.wait(self.service.import(path))
    }

    /// [`Resources::verify`], blocking.
    pub fn verify(&self) -> Result<VerifyReport> {
        self.wait(self.service.verify())
    }

    /// [`Resources::wait_idle`], blocking.
    pub fn wait_idle(&self) {
        self.wait(self.service.wait_idle())
    }

    /// [`Resources::shutdown`], blocking.
    pub fn shutdown(&self) {
        self.wait(self.service.shutdown())
    }
}
