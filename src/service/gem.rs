//! One gem's view of the service: the `ctx.resources` a tool of that gem
//! is handed.
//!
//! [`Resources::gem`] gives a [`GemResources`], and [`Blocking::gem`] its
//! blocking twin [`BlockingGem`]. Both name the gem once, so a tool asks
//! for `path("model")` and never sees (or spoofs) another gem's id. They
//! hold a clone of the service and the gem id, nothing else: cloning one is
//! cheap, and it stays valid across installs, upgrades and uninstalls of
//! the gem (a call made while the gem is not installed returns
//! `E_RESOURCE_NOT_FOUND`).

use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::service::blocking::Blocking;
use crate::service::{GemStatus, Resources};

/// The service scoped to one gem: [`Resources::gem`].
#[derive(Debug, Clone)]
pub struct GemResources {
    service: Resources,
    gem: Arc<str>,
}

impl Resources {
    /// The service scoped to the gem `id`: what a tool of that gem gets as
    /// its `ctx.resources`. Checks nothing yet: an invalid or uninstalled
    /// id makes each call return its error (`E_RESOURCE_GEM_ID`,
    /// `E_RESOURCE_NOT_FOUND`).
    pub fn gem(&self, id: &str) -> GemResources {
        GemResources {
            service: self.clone(),
            gem: Arc::from(id),
        }
    }
}

impl GemResources {
    /// The gem's id.
    pub fn id(&self) -> &str {
        &self.gem
    }

    /// The whole service.
    pub fn service(&self) -> &Resources {
        &self.service
    }

    /// [`Resources::path`] for this gem: the local path of one of its
    /// resources, downloaded first when missing.
    pub async fn path(&self, resource_id: &str) -> Result<PathBuf> {
        self.service.path(&self.gem, resource_id).await
    }

    /// [`Resources::status`] for this gem: each of its resources' state.
    /// Cheap and never waits (safe from async code and any thread).
    pub fn status(&self) -> Result<GemStatus> {
        only(&self.gem, self.service.status(Some(&self.gem))?)
    }

    /// [`Resources::download_now`] for this gem; never waits.
    pub fn download_now(&self, resource_id: &str) -> Result<bool> {
        self.service.download_now(&self.gem, resource_id)
    }

    /// [`Resources::cancel`] for this gem.
    pub async fn cancel(&self, resource_id: &str) -> Result<bool> {
        self.service.cancel(&self.gem, resource_id).await
    }

    /// [`Resources::retry`] for this gem.
    pub async fn retry(&self, resource_id: &str) -> Result<bool> {
        self.service.retry(&self.gem, resource_id).await
    }

    /// The same calls as blocking functions (see [`crate::service::blocking`]
    /// for the threads they may be called from).
    pub fn blocking(&self) -> BlockingGem {
        BlockingGem {
            calls: self.service.blocking(),
            gem: self.gem.clone(),
        }
    }
}

/// [`GemResources`] as blocking calls: [`Blocking::gem`] or
/// [`GemResources::blocking`].
#[derive(Debug, Clone)]
pub struct BlockingGem {
    calls: Blocking,
    gem: Arc<str>,
}

impl Blocking {
    /// The blocking calls scoped to the gem `id` (see [`Resources::gem`]).
    pub fn gem(&self, id: &str) -> BlockingGem {
        BlockingGem {
            calls: self.clone(),
            gem: Arc::from(id),
        }
    }
}

impl BlockingGem {
    /// The gem's id.
    pub fn id(&self) -> &str {
        &self.gem
    }

    /// The async handle for the same gem.
    pub fn scoped(&self) -> GemResources {
        self.calls.service().gem(&self.gem)
    }

    /// [`Blocking::path`] for this gem.
    pub fn path(&self, resource_id: &str) -> Result<PathBuf> {
        self.calls.path(&self.gem, resource_id)
    }

    /// [`GemResources::status`]; never waits (safe from any thread).
    pub fn status(&self) -> Result<GemStatus> {
        only(&self.gem, self.calls.status(Some(&self.gem))?)
    }

    /// [`Resources::download_now`] for this gem; never waits (safe from
    /// any thread).
    pub fn download_now(&self, resource_id: &str) -> Result<bool> {
        self.calls.service().download_now(&self.gem, resource_id)
    }

    /// [`Blocking::cancel`] for this gem.
    pub fn cancel(&self, resource_id: &str) -> Result<bool> {
        self.calls.cancel(&self.gem, resource_id)
    }

    /// [`Blocking::retry`] for this gem.
    pub fn retry(&self, resource_id: &str) -> Result<bool> {
        self.calls.retry(&self.gem, resource_id)
    }
}

/// The one gem's row of a status asked for that gem.
fn only(gem: &str, status: Vec<GemStatus>) -> Result<GemStatus> {
    status
        .into_iter()
        .next()
        .ok_or_else(|| Error::NotFound(format!("gem {gem:?} is not installed")))
}
