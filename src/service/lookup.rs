//! The calls about one gem's resource: its local path (downloading it on
//! demand), and the settings page's cancel, retry and "download now".

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::manifest::Resource;
#[cfg(doc)]
use crate::service::events::Event;
use crate::service::scheduler::JobResult;
use crate::service::Resources;
use crate::store::registry::check_gem_id;

impl Resources {
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
        // The wait runs as the call's work: dropped with the call.
        let (this, gem, cancel) = (self.clone(), gem.to_string(), cancel.cloned());
        self.on_runtime(async move { this.fetch_for_path(&gem, resource, cancel).await })
            .await
    }

    /// The download behind [`Resources::path_until`]: joined or started,
    /// waited for until `cancel` fires, the caller's own name for the
    /// bytes made.
    async fn fetch_for_path(
        &self,
        gem: &str,
        resource: Resource,
        cancel: Option<tokio_util::sync::CancellationToken>,
    ) -> Result<PathBuf> {
        let resource_id = resource.id.as_str();
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
            match &cancel {
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
        let (this, owner) = (self.clone(), gem.to_string());
        // The record cleared and the download queued go together.
        self.on_runtime_to_end(async move {
            let registry = &this.inner.registry;
            registry.set_failure(&owner, &resource.id, None).await?;
            this.inner.scheduler.ensure(&owner, &resource, true);
            Ok(())
        })
        .await?;
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
}

fn cancelled(resource: &Resource) -> Error {
    Error::Cancelled {
        resource: resource.id.clone(),
        reason: "the download was stopped".into(),
    }
}
