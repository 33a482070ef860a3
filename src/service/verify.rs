//! Re-hashing the stored files, and removing those that no longer match.

use std::path::Path;
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::error::{Error, Result};
use crate::service::events::Event;
use crate::service::{RemovedFile, Resources, VerifyReport};

impl Resources {
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
                let (registry, this) = (self.inner.registry.clone(), self.clone());
                // The removal and its event go together: a verify stopped
                // meanwhile (its caller gone) still says what it removed.
                let remove = move || {
                    doomed.remove(&sha256)?;
                    registry.forget_served_by(&sha256);
                    let (gem, resource) = first.unzip();
                    this.emit(Event::Deleted {
                        at: SystemTime::now(),
                        sha256,
                        gem,
                        resource,
                    });
                    Ok(())
                };
                self.on_blocking(store.root(), remove).await?;
                report.corrupted.push(sha);
            }
        }
        Ok(report)
    }

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
