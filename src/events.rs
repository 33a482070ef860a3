//! Progress events, for a UI to draw bars and for logs.
//!
//! The service publishes them on a broadcast channel
//! ([`crate::Resources::subscribe`]); a slow subscriber misses events rather
//! than slowing downloads down.

use std::path::PathBuf;

use serde::Serialize;

/// Something that happened to a resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A gem's resources were registered (install or upgrade).
    Installed {
        /// The gem.
        gem: String,
        /// How many resources it declares.
        resources: usize,
    },
    /// The network policy was replaced ([`crate::Resources::set_policy`]).
    PolicyChanged {
        /// `allowlist` or `blocklist`, before.
        old_mode: String,
        /// Host patterns listed before.
        old_hosts: usize,
        /// `allowlist` or `blocklist`, now.
        new_mode: String,
        /// Host patterns listed now.
        new_hosts: usize,
    },
    /// A gem was removed.
    Uninstalled {
        /// The gem.
        gem: String,
    },
    /// A download is waiting for a free slot.
    Queued {
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Declared size.
        size: u64,
    },
    /// A download started.
    Started {
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Declared size.
        size: u64,
    },
    /// An attempt continues bytes kept from an interrupted one: the
    /// server agreed to send the rest from `offset`.
    Resumed {
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Bytes kept and not downloaded again.
        offset: u64,
        /// Declared size.
        size: u64,
    },
    /// Bytes received so far (throttled).
    Progress {
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Bytes of the file present so far (a resumed prefix included).
        bytes: u64,
        /// Declared size.
        size: u64,
    },
    /// The file was verified and is in place.
    Verified {
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Its local path.
        path: PathBuf,
    },
    /// Every address failed.
    Failed {
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// The error code.
        code: String,
        /// The full message, with the reason for each address.
        message: String,
    },
    /// A stored file was deleted (no installed gem declares it any more, or
    /// it failed verification).
    Deleted {
        /// Its SHA-256.
        sha256: String,
    },
}
