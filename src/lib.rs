//! Downloads, verifies and keeps the large files that gems declare in the
//! `resources` list of their manifests.
//!
//! # Layout
//! The folders follow the data, from the manifest to the service; each
//! uses only the ones above it in this list (`scripts/check-layout.py`
//! checks that no module or folder depends on itself through others).
//! - [`manifest`]: a manifest's `resources`, strictly validated (input).
//! - [`error`]: typed errors with stable codes ([`ErrorCode`]), including
//!   the refusals of the network rules; every layer returns them.
//! - [`net`]: what may be connected to and how: the address rules
//!   ([`guard`]), the user's [`policy`], guarded DNS ([`resolve`]), TLS
//!   trust, [`proxy`] and `CONNECT` tunnels, header parsers ([`headers`]),
//!   the bandwidth cap ([`throttle`]), connections per host, and the
//!   [`NetSettings`](net::NetSettings) it is built from.
//! - [`store`]: the content-addressed store and its atomic publication,
//!   resumable [`partial`] files, the [`registry`] of installed gems and
//!   failures, cross-process locks.
//! - [`transfer`]: one file from its sources: the HTTPS transfer of one
//!   address with hand-followed redirects and streaming checks
//!   ([`fetch`]), url then mirrors with resume ([`download`](mod@download)),
//!   what is retried ([`retry`]), and the writer thread that hashes and
//!   writes.
//! - [`config`]: the TOML configuration, which hands each layer the
//!   settings it needs.
//! - [`service`]: [`Resources`], the service the app embeds: the scheduler
//!   and its fair, bounded slots, progress [`events`], offline
//!   [`import`], and the [`blocking`] calls for code without an executor.
//! - [`api`]: the local API, one service for every process: the protocol's
//!   messages, defined once, the server ([`Resources::listen`]), where a
//!   store's service listens, a Rust client, and the election of one
//!   service among an app's instances ([`Resources::open_or_follow`]).
//! - [`time`]: RFC 3339 timestamps.
//! - `platform`: every call that differs between operating systems
//!   (modes and owners, links, free space, directory fsync, write-back,
//!   reflink, byte-range locks), so that no other module names one.
//!
//! The old flat paths (`gem_resources::fetch`, `gem_resources::guard`, …)
//! are re-exports of the same modules.
//!
//! The binary `gem-resources` is a thin command-line shell over this API.
//!
//! # Embedding
//! An app runs the service inside its own process; `examples/embed.rs` is
//! a complete, offline version of the steps below
//! (`cargo run --example embed`).
//!
//! 1. **Configure.** [`Config::load`] reads the user's TOML file; an app
//!    can equally build one in code, touching no disk (see
//!    [Configuration from code](#configuration-from-code) below).
//! 2. **Open once, start once.** [`Resources::open`] inside the app's Tokio
//!    runtime (or [`Resources::open_with_handle`] from anywhere; options in
//!    [`Resources::builder`]). Opening does a few milliseconds of file
//!    work on the calling thread (see [`Resources::open`]). The service is
//!    `Clone + Send + Sync` and [`Debug`](std::fmt::Debug); keep one and
//!    clone it. Its calls can then be awaited from any executor, and
//!    [`Resources::blocking`] serves code without one (on a Tokio
//!    runtime's threads its waiting calls return `E_RESOURCE_RUNTIME`:
//!    await the async method there). [`Resources::start`] at app start
//!    cleans up after a crash and queues missing required files.
//! 3. **Install from the manifest.** [`parse_manifest`], then
//!    [`Resources::install`]; it returns once the registration is durable,
//!    never waiting for a download. [`Resources::uninstall`] removes a gem;
//!    one that is not installed is `E_RESOURCE_NOT_FOUND` there, and
//!    `Ok(None)` from [`Resources::uninstall_if_installed`].
//! 4. **Serve tools.** A tool's `ctx.resources` is the service scoped to its
//!    gem, [`Resources::gem`]: a cheap-to-clone [`GemResources`] whose
//!    [`path`](GemResources::path) gives a present file at once and
//!    downloads a missing one first (one download however many tools
//!    ask), with [`status`](GemResources::status),
//!    [`download_now`](GemResources::download_now),
//!    [`cancel`](GemResources::cancel) and [`retry`](GemResources::retry)
//!    for that gem only. [`Blocking::gem`] is the same for code without an
//!    executor.
//! 5. **Draw the gem page.** [`Resources::subscribe_with_status`] gives the
//!    page's starting state and the [`Event`]s that follow; after a
//!    `Lagged`, call it again and redraw (see [`events`] for the buffer,
//!    what each event promises and their order). [`ResourceStatus`] has
//!    each file's description, size, hosts and state; a failure's
//!    [`primary_cause`](registry::FailureRecord::primary_cause) says, for
//!    example, "blocked by your network policy". The page's buttons are
//!    [`Resources::cancel`], [`Resources::retry`] and
//!    [`Resources::download_now`].
//! 6. **Settings.** [`Resources::set_policy`] applies a new network policy
//!    at once; [`Resources::policy`] reads it ([`Policy::mode`],
//!    [`Policy::hosts`]), and [`Event::PolicyChanged`] says when it changed.
//! 7. **Other processes.** [`Resources::listen`] accepts the app's other
//!    processes (JavaScript tools, a web-view page, the command line) on
//!    the store's local socket (see [`api`] and `PROTOCOL.md`); they then
//!    share this service's policy, events and downloads. Call it right
//!    after opening, before [`Resources::start`]: its `E_RESOURCE_BUSY`
//!    then says that another service runs the store before this one
//!    queues anything (be its client instead, [`api::Client::for_store`]
//!    with [`Store::open`]`(&config.store_dir())`), and the other processes
//!    see the events of what `start` queues. Stop it with
//!    [`api::ApiServer::stop`] before [`Resources::shutdown`]. **An app that runs in
//!    several windows or processes** makes one call in each instead,
//!    [`Resources::open_or_follow`]: one instance runs the service, the
//!    others are its clients, and when it quits or is killed one of them
//!    takes over, a waiting `path` sent again to it (see
//!    [`api::election`] and `examples/app_instance.rs`).
//! 8. **Quit.** [`Resources::shutdown`] stops downloads, keeping their
//!    resumable bytes for the next run, waits for them, and ends every
//!    event subscription (`Closed`, after the events still buffered);
//!    afterwards every call, [`Resources::import`] included, returns
//!    `E_RESOURCE_SHUTDOWN`.
//!
//! ```no_run
//! # async fn run(config: gem_resources::Config, manifest: gem_resources::Manifest)
//! #     -> gem_resources::Result<()> {
//! use gem_resources::Resources;
//!
//! let service = Resources::open(&config)?;
//! service.start().await?;
//! service.install("notes", &manifest).await?;
//! // What the tools of gem "notes" get as ctx.resources:
//! let ctx_resources = service.gem("notes");
//! let model = ctx_resources.path("ocr").await?;
//! # let _ = model;
//! service.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Every fallible call returns [`Result`], whose [`Error`] is cheap to
//! clone and has a typed [`ErrorCode`]; [`PolicyError`] and
//! [`ConfigError`] convert into it, so `?` works throughout an app.
//!
//! ## Configuration from code
//! [`Config`] and its sections are plain structs with public fields and
//! defaults: start from [`Config::default`] and set what differs.
//! `[dev]` settings (tests and development only) take a CA as PEM text
//! ([`DevConfig::trust_pem`](config::DevConfig::trust_pem), or files in
//! `extra_root_certs`), addresses and ranges as text
//! ([`DevConfig::allow_address`](config::DevConfig::allow_address)) or as
//! [`IpNet`] values. [`Config::validate`] runs the checks a file gets, and
//! opening the service runs them again.
//!
//! ```
//! use std::net::{IpAddr, Ipv4Addr};
//! use gem_resources::{Config, Mode};
//!
//! # fn main() -> gem_resources::Result<()> {
//! # let test_ca_pem = String::new();
//! let mut config = Config::default();
//! config.store = Some(std::env::temp_dir().join("my-app-resources"));
//! config.network.mode = Mode::Allowlist;
//! config.network.hosts = vec!["cdn.example.com".into(), "*.example.org".into()];
//! config.service.max_concurrent_downloads = 2;
//! // A test setup: a local origin under a throwaway CA.
//! # if !test_ca_pem.is_empty() {
//! config.dev.trust_pem(test_ca_pem);
//! # }
//! let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
//! config.dev.resolve.insert("cdn.example.com".into(), vec![loopback]);
//! config.dev.allow_address("127.0.0.1")?;
//! config.validate()?;
//! # Ok(())
//! # }
//! ```
//!
//! # Stability
//! The crate follows semantic versioning, and `CHANGELOG.md` lists every
//! change with a migration note for each breaking one. Enums and structs
//! that grow ([`Event`] and its variants, [`Error`], [`ErrorCode`],
//! [`ResourceState`], the reports and status rows, the configuration
//! sections) are `#[non_exhaustive]`: match them with a `_` arm and `..`,
//! and build the configuration from its defaults, so that a new variant
//! or field is not a breaking change.

#![warn(missing_docs)]
// No function longer than one screen (clippy.toml sets 120 lines).
#![warn(clippy::too_many_lines)]

pub mod api;
pub mod cache;
pub mod config;
pub mod error;
pub mod manifest;
pub mod net;
mod platform;
pub mod service;
pub mod store;
pub mod time;
pub mod transfer;

// The modules' paths from before the wings, kept so that code written
// against them still builds.
pub use net::{guard, headers, policy, proxy, resolve, throttle};
pub use service::{blocking, events, import};
pub use store::{partial, registry};
pub use transfer::{download, fetch, retry};

pub use config::{Config, IpNet};
pub use download::{download, download_with, RetryPolicy};
pub use error::{Attempt, AttemptError, ConfigError, Error, ErrorCode, Result, CODES};
pub use events::{Event, DEFAULT_EVENT_BUFFER};
pub use fetch::{Fetcher, Reporter, Route, Transfer, MAX_REDIRECTS};
pub use import::ImportOutcome;
pub use manifest::{parse_manifest, Manifest, Resource};
pub use policy::{Mode, Policy, PolicyError};
pub use registry::InstalledBy;
pub use service::{
    Blocking, BlockingGem, GemResources, GemStatus, InstallReport, PolicyChange, ResourceState,
    ResourceStatus, Resources, ResourcesBuilder, UninstallReport, VerifyReport,
};
pub use store::Store;

/// Stops a download or a wait ([`download_with`]).
pub use tokio_util::sync::CancellationToken;
/// Addresses, as the API takes them ([`Resource::url`], [`Resources::autofill`]).
pub use url::Url;

/// Installs the process-wide TLS crypto provider (ring) once.
pub fn install_crypto_provider() {
    // Another part of the program may have installed it already; either way
    // a provider is in place afterwards.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
