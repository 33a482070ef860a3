//! Install, upgrade and uninstall of gems, and what an app start does:
//! registrations written under the registry lock, required files queued,
//! files no installed gem declares any more deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use crate::error::{Error, Result};
use crate::manifest::{Manifest, Resource};
use crate::service::events::Event;
#[cfg(doc)]
use crate::service::GemStatus;
use crate::service::{InstallReport, Resources, UninstallReport};
use crate::store::registry::{check_gem_id, InstalledBy, Registration};
use crate::store::Store;

/// Files deleted at once by an uninstall or upgrade.
const DELETE_WORKERS: usize = 16;

impl Resources {
    /// Registers a gem's validated resources: a new install, or an upgrade
    /// of an installed gem. Returns once the registration is durable, never
    /// waiting for a download; required files then download in the
    /// background. Files the previous version declared and no installed gem
    /// declares now are deleted after the new registration is written.
    /// [`Event::Installed`] is published once the registration is written,
    /// before the events of what it causes.
    ///
    /// The registration records [`InstalledBy::Library`] as who installed
    /// it; [`Resources::install_by`] names another installer, and says what
    /// happens to a gem someone else keeps.
    pub async fn install(&self, gem: &str, manifest: &Manifest) -> Result<InstallReport> {
        self.install_by(gem, manifest, InstalledBy::Library).await
    }

    /// [`Resources::install`], by `by`. A gem changes hands only when its
    /// installer asks for it ([`Resources::install_taking_over`]):
    ///
    /// - a new gem, one `by` keeps, or one registered before owners were
    ///   recorded becomes (or stays) `by`'s;
    /// - a gem someone else keeps stays theirs: the same resources as
    ///   theirs change nothing ([`InstallReport::installed_by`] names
    ///   them), others are refused with [`Error::Owned`]
    ///   (`E_RESOURCE_OWNER`) and nothing changes.
    ///
    /// `serve` uninstalls only the gems its own folder keeps;
    /// [`GemStatus::installed_by`] shows who keeps each gem.
    pub async fn install_by(
        &self,
        gem: &str,
        manifest: &Manifest,
        by: InstalledBy,
    ) -> Result<InstallReport> {
        self.install_owned(gem, manifest, by, false).await
    }

    /// [`Resources::install_by`] that takes the gem from whoever keeps it:
    /// it becomes `by`'s, whatever the manifest, and
    /// [`InstallReport::taken_from`] names the earlier owner.
    pub async fn install_taking_over(
        &self,
        gem: &str,
        manifest: &Manifest,
        by: InstalledBy,
    ) -> Result<InstallReport> {
        self.install_owned(gem, manifest, by, true).await
    }

    async fn install_owned(
        &self,
        gem: &str,
        manifest: &Manifest,
        by: InstalledBy,
        take_over: bool,
    ) -> Result<InstallReport> {
        check_gem_id(gem)?;
        let (this, gem, manifest) = (self.clone(), gem.to_string(), manifest.clone());
        self.on_runtime_to_end(
            async move { this.install_here(&gem, &manifest, by, take_over).await },
        )
        .await
    }

    async fn install_here(
        &self,
        gem: &str,
        manifest: &Manifest,
        by: InstalledBy,
        take_over: bool,
    ) -> Result<InstallReport> {
        let inner = &self.inner;
        let store = inner.store.clone();
        let name = gem.to_string();
        self.on_blocking(inner.store.root(), move || store.check_installable(&name))
            .await?;
        let lock = inner.registry.lock().await?;
        let old = inner.registry.get(gem)?;
        let unchanged = old
            .as_ref()
            .is_some_and(|o| o.resources == manifest.resources);
        // Decided under the registry lock: whoever keeps the gem now.
        let other = old
            .as_ref()
            .and_then(|o| o.installed_by.clone())
            .filter(|owner| *owner != by);
        let (owner, taken_from) = match other {
            Some(other) if take_over => (by, Some(other)),
            Some(other) if unchanged => (other, None),
            Some(other) => {
                return Err(Error::Owned {
                    gem: gem.to_string(),
                    owner: other.describe(),
                })
            }
            None => (by, None),
        };
        let registration = Registration {
            gem: gem.to_string(),
            name: manifest.name.clone(),
            resources: manifest.resources.clone(),
            installed_by: Some(owner.clone()),
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
        let mut report = InstallReport {
            gem: gem.to_string(),
            upgrade: old.is_some() && !unchanged,
            unchanged,
            resources: manifest.resources.len(),
            deleted,
            installed_by: Some(owner),
            taken_from,
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
        self.on_runtime_to_end(async move { this.uninstall_here(&gem, None).await })
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
            .on_runtime_to_end(async move { this.uninstall_here(&gem, Some(&by)).await })
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

    /// What an app start does: removes leftovers of a crash that nobody
    /// can resume, partial files no installed gem declares or older than
    /// `network.partial_max_age_days`, and queues every installed gem's
    /// missing required files (continuing kept partial files). Returns how
    /// many were queued; does not wait for them.
    pub async fn start(&self) -> Result<usize> {
        let this = self.clone();
        self.on_runtime_to_end(async move { this.start_here().await })
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
