//! Auto-fill inside the service: size and SHA-256 read under the service's
//! live network policy, with its bandwidth cap, its connections per host
//! and its retries, falling back through the mirrors as a download does.
//! Nothing is kept.

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use url::Url;

use crate::error::data::ErrorData;
use crate::error::{Attempt, AttemptError, Error, Result};
use crate::manifest::fill::{fill_text, parse_unfilled, Fill, Unfilled};
use crate::service::Resources;
use crate::transfer::autofill::{autofill_addresses, Filled};
use crate::transfer::fetch::Reporter;

/// What [`Resources::autofill`] read: `autofill {url}`'s answer in the
/// local API, and `autofill --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Autofilled {
    /// The size in bytes.
    pub size: u64,
    /// The SHA-256.
    pub sha256: String,
    /// The address that served it (the url or a mirror, as given).
    pub served_by: String,
    /// The address that finally answered, after any redirects; `None`
    /// from a service older than this field.
    #[serde(default)]
    pub final_url: Option<String>,
}

/// One resource of [`Resources::autofill_manifest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum FilledResource {
    /// Read: its values.
    #[non_exhaustive]
    Filled {
        /// The resource id.
        id: String,
        /// Its size.
        size: u64,
        /// Its SHA-256.
        sha256: String,
        /// The address that served it.
        served_by: String,
    },
    /// Not read (or not what the manifest already says): why.
    #[non_exhaustive]
    Failed {
        /// The resource id.
        id: String,
        /// The error.
        #[serde(flatten)]
        error: ErrorData,
    },
}

/// What [`Resources::autofill_manifest`] did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AutofillReport {
    /// Whether every selected resource was filled.
    pub ok: bool,
    /// The manifest with the values filled in (its keys and order kept).
    pub manifest: Value,
    /// The manifest's text with the values filled in, layout kept.
    #[serde(skip)]
    pub text: String,
    /// Each selected resource, in manifest order.
    pub resources: Vec<FilledResource>,
}

/// A reporter that reports nothing (the service's events are for files).
struct Quiet;
impl Reporter for Quiet {
    fn bytes(&mut self, _total: u64) {}
}

impl Resources {
    /// The size and SHA-256 of the file at `url`, read by the download
    /// rules under the service's live policy. Nothing is kept.
    pub async fn autofill(&self, url: &Url) -> Result<Autofilled> {
        let this = self.clone();
        let url = url.clone();
        let label = url
            .path_segments()
            .and_then(|mut s| s.next_back())
            .unwrap_or("file")
            .to_string();
        let filled = self
            .on_runtime(async move { this.autofill_here(&label, std::slice::from_ref(&url)).await })
            .await?;
        Ok(Autofilled {
            size: filled.transfer.size,
            sha256: filled.transfer.sha256,
            served_by: filled.address.to_string(),
            final_url: Some(filled.transfer.final_url.to_string()),
        })
    }

    async fn autofill_here(&self, label: &str, addresses: &[Url]) -> Result<Filled> {
        self.follow_policy_record();
        let deps = self.inner.scheduler.deps();
        autofill_addresses(
            &deps.fetcher,
            label,
            addresses,
            self.inner.autofill_max_bytes,
            deps.retry,
            &mut Quiet,
            Some(&self.inner.scheduler.stopping()),
        )
        .await
    }

    /// Fills `size` and `sha256` of a manifest's resources that lack
    /// either (every resource with `all`), reading each from its url, then
    /// its mirrors, under the service's live policy, several at once. A
    /// value the entry already has must match what was read. Nothing is
    /// kept, and nothing is written: the report has the filled manifest.
    pub async fn autofill_manifest(&self, manifest: &[u8], all: bool) -> Result<AutofillReport> {
        let entries = parse_unfilled(manifest)?;
        let text = String::from_utf8(manifest.to_vec())
            .map_err(|_| Error::Invalid("the manifest is not UTF-8".into()))?;
        let selected: Vec<Unfilled> = entries
            .into_iter()
            .filter(|e| all || e.lacks_any())
            .collect();
        let parallel = self.inner.autofill_parallel;
        let this = self.clone();
        let one = move |entry: Unfilled| {
            let this = this.clone();
            async move {
                let addresses: Vec<Url> = entry.resource.addresses().cloned().collect();
                let id = entry.resource.id.clone();
                let work = {
                    let this = this.clone();
                    async move { this.autofill_here(&id, &addresses).await }
                };
                let outcome = this.on_runtime(work).await.and_then(|f| agrees(&entry, f));
                (entry, outcome)
            }
        };
        // Unordered: one slow file never holds a slot of another.
        let mut outcomes: Vec<(Unfilled, Result<Filled>)> =
            futures_util::stream::iter(selected.into_iter().map(one))
                .buffer_unordered(parallel)
                .collect()
                .await;
        outcomes.sort_by_key(|(entry, _)| entry.index);
        let fills: Vec<Fill> = outcomes
            .iter()
            .filter_map(|(entry, outcome)| {
                let filled = outcome.as_ref().ok()?;
                Some(Fill {
                    index: entry.index,
                    size: filled.transfer.size,
                    sha256: filled.transfer.sha256.clone(),
                })
            })
            .collect();
        let filled_text = fill_text(&text, &fills)
            .ok_or_else(|| Error::Invalid("the manifest's shape could not be kept".into()))?;
        let manifest: Value = serde_json::from_str(&filled_text).unwrap_or_default();
        let resources: Vec<FilledResource> = outcomes
            .into_iter()
            .map(|(entry, outcome)| match outcome {
                Ok(filled) => FilledResource::Filled {
                    id: entry.resource.id,
                    size: filled.transfer.size,
                    sha256: filled.transfer.sha256,
                    served_by: filled.address.to_string(),
                },
                Err(e) => FilledResource::Failed {
                    id: entry.resource.id,
                    error: ErrorData::of(&e),
                },
            })
            .collect();
        Ok(AutofillReport {
            ok: resources
                .iter()
                .all(|r| matches!(r, FilledResource::Filled { .. })),
            manifest,
            text: filled_text,
            resources,
        })
    }
}

/// A value already declared must match what was read (only the missing
/// one is filled), as in a download: otherwise the entry is not filled.
/// When nothing lacks (every resource asked for), the values read replace
/// the declared ones, with a warning.
pub fn agrees(entry: &Unfilled, filled: Filled) -> Result<Filled> {
    let (got, declared) = (&filled.transfer, &entry.resource);
    let error = if !entry.lacks_sha256 && got.sha256 != declared.sha256 {
        AttemptError::Sha256 {
            expected: declared.sha256.clone(),
            actual: got.sha256.clone(),
        }
    } else if !entry.lacks_size && got.size != declared.size {
        AttemptError::Size {
            expected: declared.size,
            detail: format!("got {} bytes", got.size),
        }
    } else {
        return Ok(filled);
    };
    if !entry.lacks_any() {
        tracing::warn!(resource = %declared.id, address = %filled.address, "{error}; the manifest's values are replaced");
        return Ok(filled);
    }
    Err(Error::Unavailable {
        resource: declared.id.clone(),
        attempts: vec![Attempt {
            address: filled.address,
            hop: None,
            error,
        }],
    })
}
