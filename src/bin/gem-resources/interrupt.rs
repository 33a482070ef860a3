//! Ctrl-C (or SIGTERM) during `fetch`, `install`, `sync` and `path`: the downloads
//! stop, the bars are cleared, the command says what was kept of each
//! unfinished file and exits with status 130, as shells expect of a command
//! ended by SIGINT.

use std::future::Future;
use std::pin::Pin;

use gem_resources::{ResourceState, Resources, Store};

use crate::render;

/// Exit status of an interrupted command (128 + SIGINT).
pub const INTERRUPTED: u8 = 130;

/// A download that was running when the command was interrupted.
#[derive(Debug, Clone)]
pub struct Unfinished {
    /// The file's name (`ocr-v3.onnx`).
    pub name: String,
    /// Its SHA-256.
    pub sha256: String,
}

/// Registers the stop signals now and returns a future that resolves at
/// the first of them ([`crate::platform::stop_signal`]).
pub fn signal() -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let stop = crate::platform::stop_signal();
    Box::pin(async move {
        stop.await;
    })
}

/// Clears the bars and says, once the downloads have stopped, what was
/// kept of each unfinished file.
pub fn report(store: &Store, unfinished: &[Unfinished]) {
    crate::progress::clear_all();
    if unfinished.is_empty() {
        crate::errln!("interrupted: no download was running");
    }
    for file in unfinished {
        match store.partial_len(&file.sha256).filter(|n| *n > 0) {
            Some(kept) => crate::errln!(
                "interrupted: {} of {} kept; the next run continues",
                render::bytes(kept),
                file.name
            ),
            None => crate::errln!(
                "interrupted: the unfinished {} was removed; the next run downloads it again",
                file.name
            ),
        }
    }
}

/// The downloads running now (of `gem`, or of every gem), each file once,
/// for what a stop says was kept.
pub fn unfinished(service: &Resources, gem: Option<&str>) -> Vec<Unfinished> {
    let mut out: Vec<Unfinished> = Vec::new();
    let status = service.status(gem).unwrap_or_default();
    for r in status.iter().flat_map(|g| &g.resources) {
        let running = matches!(r.state, ResourceState::Downloading { .. });
        if running && !out.iter().any(|u| u.sha256 == r.sha256) {
            out.push(Unfinished {
                name: r.file.clone(),
                sha256: r.sha256.clone(),
            });
        }
    }
    out
}
