//! The local API: one service for every process that uses a store.
//!
//! `gem-resources serve`, or an app that embeds the library and calls
//! [`Resources::listen`](crate::Resources::listen), accepts clients on a
//! local socket (a Unix domain socket on Linux and macOS, a named pipe on
//! Windows) and answers JSON-RPC 2.0, one JSON object per line. The app's
//! JavaScript tools, a web-view gem page, Gem Studio and the command line
//! then share the service's live network policy, its events, its single
//! download per file and its true progress. `PROTOCOL.md` is the reference
//! for other languages; `js/` is the JavaScript client.
//!
//! - [`protocol`]: the messages, defined once: the server's answers, the
//!   command line's `--json` documents and the [`Client`]'s results are
//!   the same types.
//! - [`discovery`]: where a store's service listens (`service.json`), and
//!   the lock that keeps a second service off the store.
//! - [`server`]: the server ([`ApiServer`]).
//! - [`lifetime`]: what ends a service besides a stop: its parent
//!   process ending ([`lifetime::Parent`]).
//! - [`client`]: a Rust client ([`Client`]), which the command line uses.
//! - [`election`]: one service per store among an app's instances
//!   ([`Resources::open_or_follow`], [`Member`]): the one that takes the
//!   store's lock serves, the others follow, and one takes over when it
//!   goes.

pub mod client;
pub mod discovery;
pub mod election;
pub mod lifetime;
pub mod protocol;
pub mod server;

pub use client::Client;
pub use election::{Member, Role};
pub use server::ApiServer;

use crate::api::protocol::StatusResult;
use crate::error::Result;
use crate::service::Resources;

/// `status` as the API and `status --json` give it: the rows, what no
/// installed gem declares, the service listening on the store (read
/// from [`discovery`]; the server puts itself there) and the store's
/// folder.
pub fn status_of(service: &Resources, gem: Option<&str>) -> Result<StatusResult> {
    let gems = service.status(gem)?;
    let store = service.store();
    let registry = crate::store::registry::Registry::new(store);
    let items = crate::store::gc::undeclared(store, &registry)?;
    Ok(StatusResult {
        gems,
        undeclared_files: items.len(),
        undeclared_bytes: items.iter().map(|u| u.bytes).sum(),
        service: discovery::info(store),
        store: store.folder().to_path_buf(),
    })
}
