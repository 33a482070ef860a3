//! Auto-fill inside the service: size and SHA-256 read under the service's
//! live network policy, with its bandwidth cap, its connections per host
//! and its retries, falling back through the mirrors as a download does.
//! Nothing is kept.

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use url::Url;

use crate::error::data::ErrorData;
use crate::error::{Attempt, AttemptError, Error, ErrorCode, Result};
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

fn yes() -> bool {
    true
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
        /// How each address answered, when every one was read (see
        /// [`check_every_address`]); empty when only the first that
        /// answers was.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        addresses: Vec<AddressReport>,
        /// The verdict: every address read served these values (`true`
        /// when only the first that answers was read).
        #[serde(default = "yes")]
        ok: bool,
        /// The role (`url`, `mirror 1`, …) of each address that failed or
        /// served other bytes than `served_by`, whose values are the ones
        /// used: where a row of Gem Studio points.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        disagreeing: Vec<String>,
    },
    /// Not read (or not what the manifest already says): why.
    #[non_exhaustive]
    Failed {
        /// The resource id.
        id: String,
        /// How each address answered, as for `Filled`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        addresses: Vec<AddressReport>,
        /// The error.
        #[serde(flatten)]
        error: ErrorData,
    },
}

/// How one address of a resource answered when every address was read:
/// a mirror that serves another file, or none at all, shows before a
/// user's download falls back to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AddressReport {
    /// `url`, or `mirror 1`, `mirror 2`, … in the manifest's order.
    pub role: String,
    /// The address, as declared.
    pub address: String,
    /// Whether it served the same bytes as the address the values come
    /// from (the first that answered).
    pub ok: bool,
    /// The size it served, when it served a whole file.
    #[serde(default)]
    pub size: Option<u64>,
    /// The SHA-256 of what it served, when it served a whole file.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Why it is not ok, for a person: `SHA-256 differs from the url's`,
    /// `HTTP status 404 Not Found`.
    #[serde(default)]
    pub problem: Option<String>,
    /// The redirect target where reading it failed, when that is not the
    /// address itself.
    #[serde(default)]
    pub hop: Option<String>,
    /// The code of that problem (`E_RESOURCE_SHA256`, `E_RESOURCE_HTTP`, …).
    #[serde(default)]
    pub code: Option<ErrorCode>,
    /// The HTTP status, when the problem is one (`404`: no file there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

/// The name of the address at `index` of a resource's addresses.
fn role(index: usize) -> String {
    match index {
        0 => "url".to_string(),
        n => format!("mirror {n}"),
    }
}

/// Reads every one of a resource's `addresses` (the url, then each mirror),
/// each with `read` (one address by the download rules, keeping nothing),
/// and reports each against the first that answered, whose values fill the
/// entry. A cancellation or a local failure stops it and is the outcome.
/// With no address answering, the outcome is the error a read of them in
/// turn gives: the one attempt's, or [`Error::Unavailable`] listing each.
pub async fn check_every_address<F, Fut>(
    resource: &str,
    addresses: &[Url],
    mut read: F,
) -> (Result<Filled>, Vec<AddressReport>)
where
    F: FnMut(usize, Url) -> Fut,
    Fut: std::future::Future<Output = Result<Filled>>,
{
    let mut reads = Vec::new();
    for (index, address) in addresses.iter().enumerate() {
        let outcome = read(index, address.clone()).await;
        if let Err(e) = &outcome {
            if !matches!(e, Error::Attempt(_)) {
                return (Err(e.clone()), Vec::new());
            }
        }
        reads.push(outcome);
    }
    compare(resource, addresses, reads)
}

/// [`check_every_address`]'s verdict on what each address served.
fn compare(
    resource: &str,
    addresses: &[Url],
    reads: Vec<Result<Filled>>,
) -> (Result<Filled>, Vec<AddressReport>) {
    // The values come from the first address that answered.
    let reference: Option<(usize, Filled)> = reads
        .iter()
        .enumerate()
        .find_map(|(i, r)| Some((i, r.as_ref().ok()?.clone())));
    let reports = reads
        .iter()
        .zip(addresses)
        .enumerate()
        .map(|(index, (outcome, address))| {
            let mut report = AddressReport {
                role: role(index),
                address: address.to_string(),
                ok: false,
                size: None,
                sha256: None,
                problem: None,
                hop: None,
                code: None,
                status: None,
            };
            match outcome {
                Ok(read) => {
                    let (whose, want) = reference
                        .as_ref()
                        .map_or((index, read), |(i, filled)| (*i, filled));
                    let (got, want) = (&read.transfer, &want.transfer);
                    report.size = Some(got.size);
                    report.sha256 = Some(got.sha256.clone());
                    report.ok = got.sha256 == want.sha256 && got.size == want.size;
                    if !report.ok {
                        report.problem =
                            Some(format!("SHA-256 differs from the {}'s", role(whose)));
                        report.code = Some(ErrorCode::Sha256);
                    }
                }
                Err(Error::Attempt(a)) => {
                    report.problem = Some(a.error.to_string());
                    report.hop = a
                        .hop
                        .as_ref()
                        .filter(|hop| *hop != &a.address)
                        .map(Url::to_string);
                    report.code = Some(a.code());
                    if let AttemptError::Http { status, .. } = &a.error {
                        report.status = Some(*status);
                    }
                }
                Err(e) => {
                    report.problem = Some(e.to_string());
                    report.code = Some(e.code());
                }
            }
            report
        })
        .collect();
    let filled = match reference {
        Some((_, filled)) => Ok(filled),
        None => {
            let mut attempts: Vec<Attempt> = reads
                .into_iter()
                .filter_map(|r| match r {
                    Err(Error::Attempt(a)) => Some(*a),
                    _ => None,
                })
                .collect();
            if attempts.len() == 1 {
                Err(Error::Attempt(Box::new(attempts.remove(0))))
            } else {
                Err(Error::Unavailable {
                    resource: resource.to_string(),
                    attempts,
                })
            }
        }
    };
    (filled, reports)
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

/// How far an auto-fill has read one resource: the `$/progress` value of
/// an `autofill` call given a progress token, and what an
/// [`AutofillObserver`] is handed. At most one every 100 ms per resource,
/// plus the first of each address and the last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename = "autofill_progress")]
#[non_exhaustive]
pub struct AutofillProgress {
    /// The resource id (for one address, the last part of its path).
    pub resource: String,
    /// The address being read (the url or a mirror, as declared).
    pub address: String,
    /// Bytes read so far from that address.
    pub bytes: u64,
    /// Its size, once the server has announced it; `null` before.
    pub size: Option<u64>,
    /// Whether the resource is done: read (its values are in the answer)
    /// or failed at every address.
    pub done: bool,
}

/// What an auto-fill calls as it reads: see [`AutofillProgress`].
pub type AutofillObserver = std::sync::Arc<dyn Fn(AutofillProgress) + Send + Sync>;

/// The shortest time between two reports of one resource's bytes.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// A reporter that hands an [`AutofillObserver`] its resource's progress,
/// or reports nothing (the service's events are for files).
struct Observed<'a> {
    observer: Option<&'a AutofillObserver>,
    last: AutofillProgress,
    sent: Option<std::time::Instant>,
}

impl<'a> Observed<'a> {
    fn new(observer: Option<&'a AutofillObserver>, resource: &str) -> Self {
        Observed {
            observer,
            last: AutofillProgress {
                resource: resource.to_string(),
                address: String::new(),
                bytes: 0,
                size: None,
                done: false,
            },
            sent: None,
        }
    }

    fn send(&mut self) {
        if let Some(observer) = self.observer {
            self.sent = Some(std::time::Instant::now());
            observer(self.last.clone());
        }
    }
}

/// A resource's last report to `observer`: what was read, or that it
/// failed at every address (the first named).
fn finished(
    observer: Option<&AutofillObserver>,
    resource: &str,
    addresses: &[Url],
    filled: Option<&Filled>,
) {
    let Some(observer) = observer else {
        return;
    };
    let (address, size) = match filled {
        Some(f) => (f.address.to_string(), Some(f.transfer.size)),
        None => (
            addresses.first().map(Url::to_string).unwrap_or_default(),
            None,
        ),
    };
    observer(AutofillProgress {
        resource: resource.to_string(),
        address,
        bytes: size.unwrap_or(0),
        size,
        done: true,
    });
}

impl Reporter for Observed<'_> {
    fn trying(&mut self, address: &Url) {
        self.last.address = address.to_string();
        self.last.bytes = 0;
        self.last.size = None;
        self.send();
    }

    fn length(&mut self, total: u64) {
        self.last.size = Some(total);
    }

    fn bytes(&mut self, total: u64) {
        self.last.bytes = total;
        if self.sent.is_none_or(|at| at.elapsed() >= PROGRESS_EVERY) {
            self.send();
        }
    }
}

impl Resources {
    /// The size and SHA-256 of the file at `url`, read by the download
    /// rules under the service's live policy. Nothing is kept.
    pub async fn autofill(&self, url: &Url) -> Result<Autofilled> {
        self.autofill_observed(url, None).await
    }

    /// [`Resources::autofill`], handing `observer` how far it has read
    /// ([`AutofillProgress`]).
    pub async fn autofill_observed(
        &self,
        url: &Url,
        observer: Option<AutofillObserver>,
    ) -> Result<Autofilled> {
        let this = self.clone();
        let url = url.clone();
        let label = url
            .path_segments()
            .and_then(|mut s| s.next_back())
            .unwrap_or("file")
            .to_string();
        let filled = self
            .on_runtime(async move {
                let addresses = std::slice::from_ref(&url);
                let filled = this
                    .autofill_here(&label, addresses, observer.as_ref())
                    .await;
                finished(observer.as_ref(), &label, addresses, filled.as_ref().ok());
                filled
            })
            .await?;
        Ok(Autofilled {
            size: filled.transfer.size,
            sha256: filled.transfer.sha256,
            served_by: filled.address.to_string(),
            final_url: Some(filled.transfer.final_url.to_string()),
        })
    }

    async fn autofill_here(
        &self,
        label: &str,
        addresses: &[Url],
        observer: Option<&AutofillObserver>,
    ) -> Result<Filled> {
        self.follow_policy_record();
        let deps = self.inner.scheduler.deps();
        autofill_addresses(
            &deps.fetcher,
            label,
            addresses,
            self.inner.autofill_max_bytes,
            deps.retry,
            &mut Observed::new(observer, label),
            Some(&self.inner.scheduler.stopping()),
        )
        .await
    }

    /// Fills `size` and `sha256` of a manifest's resources that lack
    /// either (every resource with `all`), under the service's live
    /// policy, several at once. Each resource's url and every mirror are
    /// read in full ([`check_every_address`]): the values come from the
    /// first that answers, and the report says how each address answered
    /// (`ok` is false when one failed or served other bytes). A value the
    /// entry already has must match what was read. Nothing is kept, and
    /// nothing is written: the report has the filled manifest.
    pub async fn autofill_manifest(&self, manifest: &[u8], all: bool) -> Result<AutofillReport> {
        self.autofill_manifest_with(manifest, all, false).await
    }

    /// [`Resources::autofill_manifest`]; with `url_only`, each resource is
    /// read only until an address answers (its url, then its mirrors in
    /// order, as a download falls back), and the mirrors are not checked.
    pub async fn autofill_manifest_with(
        &self,
        manifest: &[u8],
        all: bool,
        url_only: bool,
    ) -> Result<AutofillReport> {
        self.autofill_manifest_observed(manifest, all, url_only, None)
            .await
    }

    /// [`Resources::autofill_manifest_with`], handing `observer` how far
    /// each resource has been read ([`AutofillProgress`]).
    pub async fn autofill_manifest_observed(
        &self,
        manifest: &[u8],
        all: bool,
        url_only: bool,
        observer: Option<AutofillObserver>,
    ) -> Result<AutofillReport> {
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
            let observer = observer.clone();
            async move {
                let addresses: Vec<Url> = entry.resource.addresses().cloned().collect();
                let id = entry.resource.id.clone();
                let work = {
                    let (this, observer) = (this.clone(), observer.clone());
                    async move {
                        if url_only {
                            let filled = this.autofill_here(&id, &addresses, observer.as_ref());
                            return Ok((filled.await, Vec::new()));
                        }
                        let read = |_, address: Url| {
                            let (this, id, observer) = (this.clone(), id.clone(), observer.clone());
                            async move { this.autofill_here(&id, &[address], observer.as_ref()).await }
                        };
                        Ok(check_every_address(&id, &addresses, read).await)
                    }
                };
                let (outcome, checked) = match this.on_runtime(work).await {
                    Ok(done) => done,
                    Err(e) => (Err(e), Vec::new()),
                };
                if observer.is_some() {
                    let addresses: Vec<Url> = entry.resource.addresses().cloned().collect();
                    let filled = outcome.as_ref().ok();
                    finished(observer.as_ref(), &entry.resource.id, &addresses, filled);
                }
                let outcome = outcome.and_then(|f| {
                    let changed = Changed::of(&entry, &f);
                    if all && !changed.is_empty() {
                        // The service's log keeps what the caller replaces.
                        tracing::warn!(resource = %entry.resource.id, address = %f.address, "{changed}: the manifest's values are replaced");
                    }
                    agrees(&entry, f, all)
                });
                (entry, outcome, checked)
            }
        };
        // Unordered: one slow file never holds a slot of another.
        let mut outcomes: Vec<(Unfilled, Result<Filled>, Vec<AddressReport>)> =
            futures_util::stream::iter(selected.into_iter().map(one))
                .buffer_unordered(parallel)
                .collect()
                .await;
        outcomes.sort_by_key(|(entry, _, _)| entry.index);
        let fills = fills_of(outcomes.iter().map(|(entry, outcome, _)| (entry, outcome)));
        let filled_text = fill_text(&text, &fills)
            .ok_or_else(|| Error::Invalid("the manifest's shape could not be kept".into()))?;
        let manifest: Value = serde_json::from_str(&filled_text).unwrap_or_default();
        let resources: Vec<FilledResource> = outcomes
            .into_iter()
            .map(|(entry, outcome, addresses)| match outcome {
                Ok(filled) => FilledResource::Filled {
                    id: entry.resource.id,
                    size: filled.transfer.size,
                    sha256: filled.transfer.sha256,
                    served_by: filled.address.to_string(),
                    ok: addresses.iter().all(|a| a.ok),
                    disagreeing: addresses
                        .iter()
                        .filter(|a| !a.ok)
                        .map(|a| a.role.clone())
                        .collect(),
                    addresses,
                },
                Err(e) => FilledResource::Failed {
                    id: entry.resource.id,
                    addresses,
                    error: ErrorData::of(&e),
                },
            })
            .collect();
        Ok(AutofillReport {
            ok: resources.iter().all(|r| match r {
                FilledResource::Filled { ok, .. } => *ok,
                FilledResource::Failed { .. } => false,
            }),
            manifest,
            text: filled_text,
            resources,
        })
    }
}

/// The declared values of an entry that differ from what was read: each
/// as (declared, read). A value the entry lacks is never a change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Changed {
    /// The declared size and the size read, when they differ.
    pub size: Option<(u64, u64)>,
    /// The declared SHA-256 and the one read, when they differ.
    pub sha256: Option<(String, String)>,
}

impl Changed {
    /// What `entry` declares that differs from `filled`.
    pub fn of(entry: &Unfilled, filled: &Filled) -> Changed {
        Changed::between(entry, filled.transfer.size, &filled.transfer.sha256)
    }

    /// What `entry` declares that differs from `size` and `sha256`.
    pub fn between(entry: &Unfilled, size: u64, sha256: &str) -> Changed {
        let declared = &entry.resource;
        Changed {
            size: (!entry.lacks_size && size != declared.size).then_some((declared.size, size)),
            sha256: (!entry.lacks_sha256 && sha256 != declared.sha256)
                .then(|| (declared.sha256.clone(), sha256.to_string())),
        }
    }

    /// Whether nothing differs.
    pub fn is_empty(&self) -> bool {
        self.size.is_none() && self.sha256.is_none()
    }
}

/// `size 5 → 7, sha256 0000… → b43f…` (the digests cut to 12 digits).
impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some((old, new)) = &self.size {
            parts.push(format!("size {old} → {new}"));
        }
        if let Some((old, new)) = &self.sha256 {
            parts.push(format!("sha256 {} → {}", short(old), short(new)));
        }
        f.write_str(&parts.join(", "))
    }
}

/// The first 12 digits of a SHA-256 and `…`.
pub fn short(sha256: &str) -> String {
    match sha256.get(..12) {
        Some(head) if head.len() < sha256.len() => format!("{head}…"),
        _ => sha256.to_string(),
    }
}

/// A value already declared must match what was read (only the missing
/// one is filled), as in a download: otherwise the entry is not filled,
/// and the error says how to correct the manifest. With `replace` (every
/// resource asked for, `--all`), the values read replace the declared
/// ones instead.
pub fn agrees(entry: &Unfilled, filled: Filled, replace: bool) -> Result<Filled> {
    let changed = Changed::of(entry, &filled);
    if replace || changed.is_empty() {
        return Ok(filled);
    }
    let error = match (&changed.sha256, &changed.size) {
        (Some((expected, actual)), _) => AttemptError::Sha256 {
            expected: expected.clone(),
            actual: actual.clone(),
        },
        (None, Some((expected, actual))) => AttemptError::Size {
            expected: *expected,
            detail: format!("got {actual} bytes"),
        },
        (None, None) => return Ok(filled),
    };
    Err(Error::Unavailable {
        resource: entry.resource.id.clone(),
        attempts: vec![Attempt {
            address: filled.address,
            hop: None,
            error,
        }],
    })
}

/// The values to write into a manifest's text: one [`Fill`] for each entry
/// that was read.
pub fn fills_of<'a>(
    outcomes: impl Iterator<Item = (&'a Unfilled, &'a Result<Filled>)>,
) -> Vec<Fill> {
    outcomes
        .filter_map(|(entry, outcome)| {
            let filled = outcome.as_ref().ok()?;
            Some(Fill {
                index: entry.index,
                size: filled.transfer.size,
                sha256: filled.transfer.sha256.clone(),
            })
        })
        .collect()
}
