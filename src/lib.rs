//! Downloads, verifies and keeps the large files that gems declare in the
//! `resources` list of their manifests.
//!
//! # Layout
//! - [`manifest`]: strict validation of a manifest's `resources`.
//! - [`guard`]: refuses local and internal-network addresses.
//! - [`policy`]: the user's allowlist or blocklist of hosts.
//! - [`config`]: the TOML configuration.
//! - [`resolve`]: DNS resolution that hands out only guarded addresses.
//! - [`fetch`]: HTTPS transfers, redirects followed by hand, streaming checks.
//! - [`headers`]: strict parsers for the response headers a server controls.
//! - [`store`]: the content-addressed store and its atomic publication.
//! - [`download`]: one resource over its url and mirrors.
//! - [`registry`]: installed gems and failure records, crash-safe.
//! - `limiter`, `scheduler`: bounded, fair, cancellable background downloads.
//! - `lockfile`: cross-process file locks whose waits can be cancelled.
//! - `tls`: certificate trust for the `[dev] extra_root_certs` setting.
//! - [`service`]: [`Resources`], the service the app embeds.
//! - [`events`]: progress events for a UI.
//! - [`error`]: typed errors with stable codes.
//!
//! The binary `gem-resources` is a thin command-line shell over this API.

#![warn(missing_docs)]

pub mod config;
pub mod download;
pub mod error;
pub mod events;
pub mod fetch;
pub mod guard;
pub mod headers;
mod limiter;
mod lockfile;
pub mod manifest;
pub mod policy;
pub mod registry;
pub mod resolve;
mod scheduler;
pub mod service;
pub mod store;
mod tls;

pub use config::Config;
pub use download::{download, RetryPolicy};
pub use error::{Attempt, AttemptError, Error, Result};
pub use events::Event;
pub use fetch::{Fetcher, Transfer, MAX_REDIRECTS};
pub use manifest::{parse_manifest, Manifest, Resource};
pub use service::{
    GemStatus, InstallReport, ResourceState, ResourceStatus, Resources, UninstallReport,
    VerifyReport,
};
pub use store::Store;

/// Installs the process-wide TLS crypto provider (ring) once.
pub fn install_crypto_provider() {
    // Another part of the program may have installed it already; either way
    // a provider is in place afterwards.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
