//! What the service's calls return: the reports of install, uninstall,
//! policy changes and verify, and the status rows of gems and resources.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::service::Resources;
use crate::store::registry::{FailureRecord, InstalledBy};

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
    /// Who keeps the gem after this install: the caller, or whoever kept
    /// it already when it was someone else's and the manifest unchanged
    /// (see [`Resources::install_by`]).
    #[serde(default)]
    pub installed_by: Option<InstalledBy>,
    /// Whom this install took the gem from: set by a take-over
    /// ([`Resources::install_taking_over`]) of a gem someone else kept.
    #[serde(default)]
    pub taken_from: Option<InstalledBy>,
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
    /// When the service tries a failed required file again by itself
    /// (`service.retry_failed_after` after the failure, the wait
    /// doubling): RFC 3339 in JSON, only on a `failed` row whose try is
    /// planned.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::time::rfc3339_opt"
    )]
    pub next_try: Option<std::time::SystemTime>,
}

/// One gem in [`Resources::status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GemStatus {
    /// The gem.
    pub gem: String,
    /// The gem's `name` as its manifest gives it, for a heading; absent
    /// when the manifest has none (show `gem`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Who keeps it: its first installer, until a take-over
    /// ([`Resources::install_taking_over`]); `null` for a gem registered
    /// before this was kept.
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
