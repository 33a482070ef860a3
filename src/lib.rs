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
//! - [`store`]: the content-addressed store and its atomic publication.
//! - [`import`]: files the user already has, matched and copied in offline.
//! - [`download`](mod@download): one resource over its url and mirrors, resuming.
//! - [`proxy`]: which proxy a hop uses (`[network] proxy`, `HTTPS_PROXY`,
//!   `NO_PROXY`), credentials kept out of every message.
//! - `tunnel`: `CONNECT` to a vetted address through the proxy, TLS inside.
//! - `response`: one response type for direct and proxied transfers.
//! - [`retry`]: which failures are retried, backoff and `Retry-After`.
//! - [`headers`]: parsers for the response headers a server controls.
//! - [`partial`]: resumable partial files and their records.
//! - `hosts`: connections per host, counted on the host actually connected to.
//! - `reason`: short reasons for network failures.
//! - `sink`: the writer thread that hashes and writes a transfer's bytes.
//! - [`throttle`]: the bandwidth cap shared by every transfer.
//! - [`registry`]: installed gems and failure records, crash-safe.
//! - `limiter`, `scheduler`: bounded, fair, cancellable background downloads.
//! - `lockfile`: cross-process file locks whose waits can be cancelled.
//! - `tls`: certificate trust for the `[dev] extra_root_certs` setting.
//! - [`service`]: [`Resources`], the service the app embeds.
//! - [`events`]: progress events for a UI.
//! - [`blocking`]: the service's calls for code without an executor.
//! - [`error`]: typed errors with stable codes; `code`: the codes as a type.
//! - [`time`]: RFC 3339 timestamps.
//!
//! The binary `gem-resources` is a thin command-line shell over this API.
//!
//! # Embedding
//! An app runs the service inside its own process; `examples/embed.rs` is
//! a complete, offline version of the steps below
//! (`cargo run --example embed`).
//!
//! 1. **Open once, start once.** [`Resources::open`] inside the app's Tokio
//!    runtime (or [`Resources::open_with_handle`] from anywhere; options in
//!    [`Resources::builder`]). The service is `Clone + Send + Sync` and
//!    [`Debug`](std::fmt::Debug); keep one and clone it. Its calls can then
//!    be awaited from any executor, and [`Resources::blocking`] serves code
//!    without one (on a Tokio runtime's threads its waiting calls return
//!    `E_RESOURCE_RUNTIME`: await the async method there). [`Resources::start`] at app start cleans up after a
//!    crash and queues missing required files.
//! 2. **Install from the manifest.** [`parse_manifest`], then
//!    [`Resources::install`]; it returns once the registration is durable,
//!    never waiting for a download. [`Resources::uninstall`] removes a gem.
//! 3. **Serve tools.** `ctx.resources` is [`Resources::path`]: a present
//!    file at once, a missing one downloaded first (one download however
//!    many tools ask).
//! 4. **Draw the gem page.** [`Resources::subscribe_with_status`] gives the
//!    page's starting state and the [`Event`]s that follow; after a
//!    `Lagged`, call it again and redraw (see [`events`] for the buffer and
//!    what each event promises). [`ResourceStatus`] has each file's
//!    description, size, hosts and state; a failure's
//!    [`primary_cause`](registry::FailureRecord::primary_cause) says, for
//!    example, "blocked by your network policy". The page's buttons are
//!    [`Resources::cancel`], [`Resources::retry`] and
//!    [`Resources::download_now`].
//! 5. **Settings.** [`Resources::set_policy`] applies a new network policy
//!    at once; [`Resources::policy`] reads it.
//! 6. **Quit.** [`Resources::shutdown`] stops downloads (their bytes kept
//!    for resume), waits for them, and ends every event subscription
//!    (`Closed`, after the events still buffered); afterwards every call,
//!    [`Resources::import`] included, returns `E_RESOURCE_SHUTDOWN`.
//!
//! Every fallible call returns [`Result`], whose [`Error`] is cheap to
//! clone and has a typed [`ErrorCode`]; [`PolicyError`] and
//! [`ConfigError`] convert into it, so `?` works throughout an app.

#![warn(missing_docs)]

pub mod blocking;
mod code;
pub mod config;
pub mod download;
pub mod error;
pub mod events;
pub mod fetch;
pub mod guard;
pub mod headers;
mod hosts;
pub mod import;
mod limiter;
mod lockfile;
pub mod manifest;
pub mod partial;
pub mod policy;
pub mod proxy;
mod reason;
pub mod registry;
pub mod resolve;
mod response;
pub mod retry;
mod scheduler;
pub mod service;
mod sink;
pub mod store;
pub mod throttle;
pub mod time;
mod tls;
mod tunnel;

pub use config::Config;
pub use download::{download, download_with, RetryPolicy};
pub use error::{Attempt, AttemptError, ConfigError, Error, ErrorCode, Result, CODES};
pub use events::{Event, DEFAULT_EVENT_BUFFER};
pub use fetch::{Fetcher, Reporter, Route, Transfer, MAX_REDIRECTS};
pub use import::ImportOutcome;
pub use manifest::{parse_manifest, Manifest, Resource};
pub use policy::{Mode, Policy, PolicyError};
pub use service::{
    Blocking, GemStatus, InstallReport, ResourceState, ResourceStatus, Resources, ResourcesBuilder,
    UninstallReport, VerifyReport,
};
pub use store::Store;

/// Installs the process-wide TLS crypto provider (ring) once.
pub fn install_crypto_provider() {
    // Another part of the program may have installed it already; either way
    // a provider is in place afterwards.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
