//! Ctrl-C (or SIGTERM) during `fetch`, `install`, `sync` and `path`: the downloads
//! stop, the bars are cleared, the command says what was kept of each
//! unfinished file and exits with status 130, as shells expect of a command
//! ended by SIGINT.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// Whether the command runs with `--json`: then an interruption is said
/// as the last JSON document on stdout, and nothing on stderr.
static JSON: AtomicBool = AtomicBool::new(false);

/// Sets the output mode for [`say`] (once, at start).
pub fn set_json(json: bool) {
    JSON.store(json, Ordering::Relaxed);
}

/// Whether the command prints JSON (`--json`), as set by [`set_json`].
pub fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// Says that the command was interrupted: `text` on stderr, or with
/// `--json` the document `{"ok": false, "interrupted": true, "code":
/// "E_RESOURCE_CANCELLED", "message": text, …fields}` as the last line on
/// stdout.
pub fn say(text: &str, fields: serde_json::Value) {
    crate::progress::clear_all();
    if JSON.load(Ordering::Relaxed) {
        let mut doc = serde_json::json!({
            "ok": false,
            "interrupted": true,
            "code": "E_RESOURCE_CANCELLED",
            "primary_cause": "E_RESOURCE_CANCELLED",
            "message": text,
        });
        if let (Some(doc), Some(extra)) = (doc.as_object_mut(), fields.as_object()) {
            doc.extend(extra.clone());
        }
        render::print_json(&doc);
    } else {
        crate::errln!("{text}");
    }
}

/// Clears the bars and says, once the downloads have stopped, what was
/// kept of each unfinished file.
pub fn report(store: &Store, unfinished: &[Unfinished]) {
    report_with(store, unfinished, &[]);
}

/// A file that was verified before the command was interrupted: its
/// resource's id and path.
pub struct Completed {
    /// The resource's id.
    pub id: String,
    /// Where the verified file is.
    pub path: std::path::PathBuf,
}

/// [`report`], after the files the command finished before it was
/// interrupted: their paths on stdout as the command prints them (`id`, a
/// tab, the path), or with `--json` in the document (`"resources": [{"id",
/// "path"}]`).
pub fn report_with(store: &Store, unfinished: &[Unfinished], completed: &[Completed]) {
    if !JSON.load(Ordering::Relaxed) {
        crate::progress::clear_all();
        for done in completed {
            crate::outln!("{}\t{}", done.id, done.path.display());
        }
    }
    let resources: Vec<serde_json::Value> = completed
        .iter()
        .map(|d| serde_json::json!({ "id": d.id, "path": d.path }))
        .collect();
    let mut lines = Vec::new();
    let mut files = Vec::new();
    if unfinished.is_empty() {
        lines.push("interrupted: no download was running".to_string());
    }
    for file in unfinished {
        let kept = store.partial_len(&file.sha256).filter(|n| *n > 0);
        lines.push(match kept {
            Some(kept) => format!(
                "interrupted: {} of {} kept; the next run continues",
                render::bytes(kept),
                file.name
            ),
            None => format!(
                "interrupted: the unfinished {} was removed; the next run downloads it again",
                file.name
            ),
        });
        files.push(serde_json::json!({
            "file": file.name,
            "sha256": file.sha256,
            "kept_bytes": kept.unwrap_or(0),
        }));
    }
    say(
        &lines.join("\n"),
        serde_json::json!({ "files": files, "resources": resources }),
    );
}

/// The downloads running now (of `gem`, or of every gem), each file once,
/// for what a stop says was kept.
pub fn unfinished(service: &Resources, gem: Option<&str>) -> Vec<Unfinished> {
    let mut out: Vec<Unfinished> = Vec::new();
    let status = service.status(gem).unwrap_or_default();
    for r in status.iter().flat_map(|g| &g.resources) {
        let running = matches!(
            r.state,
            ResourceState::Downloading { .. } | ResourceState::Retrying { .. }
        );
        if running && !out.iter().any(|u| u.sha256 == r.sha256) {
            out.push(Unfinished {
                name: r.file.clone(),
                sha256: r.sha256.clone(),
            });
        }
    }
    out
}
