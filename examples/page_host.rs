//! A Rust host feeding the gem page in a web view that is not Electron's
//! (Tauri, WebView2, WKWebView): the host holds the service and sends one
//! gem's feed over its own bridge as plain data, and the page reads it
//! with `bridgeSource` (js/page/README.md, "From a Rust host").
//!
//! The feed of a gem, in order: `{"status": …}` (the gem's status, taken
//! after subscribing, so nothing is missed), then `{"event": …}` for each
//! of the gem's events, `{"lagged": N}` when the host fell behind (the page
//! subscribes again and redraws), `{"error": {"code", "message"}}` to end.
//! In Tauri, `send` is `window.emit("gem-resources:notes", message)` and
//! the page's `open(gem, onMessage)` is `listen(…)` plus an `invoke` that
//! starts [`feed`]; here the bridge is standard output, one JSON message
//! per line.
//!
//! It runs offline: the gem's file comes from an embedded local HTTPS
//! origin reached only through `[dev]` settings built in code.
//!
//! Run with `cargo run --example page_host`.

#[path = "support/offline.rs"]
mod offline;
#[path = "../tests/support/origin.rs"]
mod origin;

use std::io::Write;
use std::time::Duration;

use gem_resources::{parse_manifest, ErrorCode, Resources, Result};
use origin::{Behaviour, Origin};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

/// Standard output as the host's bridge to its web view: one JSON message
/// per line.
fn stdout(message: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{message}");
    let _ = out.flush();
}

/// Feeds `gem`'s page through `send` (the host's bridge: plain data, one
/// message at a time) until the service shuts down: its status, then its
/// events; after a lag, `lagged` and a fresh status.
async fn feed(service: Resources, gem: String, send: impl Fn(Value) + Send + 'static) {
    loop {
        // Subscribe first, then take the status: nothing falls between.
        // A gem not installed yet is a status without it (no rows).
        let mut events = service.subscribe();
        let status = match service.status(Some(&gem)) {
            Ok(status) => status,
            Err(e) if e.code() == ErrorCode::NotFound => Vec::new(),
            Err(e) => {
                let error = json!({ "code": e.code().as_str(), "message": e.to_string() });
                return send(json!({ "error": error }));
            }
        };
        send(json!({ "status": status }));
        loop {
            match events.recv().await {
                Ok(event) => {
                    let Ok(value) = serde_json::to_value(&event) else {
                        continue;
                    };
                    // The gem's own events (and those of no gem: a policy change).
                    let of_gem = value.get("gem").and_then(Value::as_str);
                    if of_gem.is_none_or(|g| g == gem) {
                        send(json!({ "event": value }));
                    }
                }
                Err(RecvError::Lagged(missed)) => {
                    send(json!({ "lagged": missed }));
                    break;
                }
                Err(RecvError::Closed) => {
                    let error = json!({ "code": "E_RESOURCE_SHUTDOWN", "message": "the service shut down" });
                    return send(json!({ "error": error }));
                }
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    // The stand-in for the internet: one file on cdn.test, sent slowly
    // enough for a few progress events.
    let origin = Origin::start().await;
    let model: Vec<u8> = (0..2usize << 20).map(|i| (i * 7 % 251) as u8).collect();
    origin.route(
        "/models/ocr.onnx",
        Behaviour::Slow {
            body: model.clone(),
            chunk: 128 << 10,
            delay: Duration::from_millis(20),
        },
    );
    let dir = tempfile::tempdir().map_err(|e| gem_resources::Error::io("tempdir", ".", e))?;
    let config = offline::dev_config(dir.path(), &origin)?;
    let service = Resources::open(&config)?;
    service.start().await?;

    // The page opened before the gem is installed: a status with no rows.
    let page = tokio::spawn(feed(service.clone(), "notes".into(), stdout));

    let sha = {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(&model))
    };
    let url = origin.url("cdn.test", "/models/ocr.onnx");
    let manifest = format!(
        r#"{{"name": "Notes", "resources": [{{"id": "ocr", "url": "{url}", "sha256": "{sha}", "size": {}, "required": true}}]}}"#,
        model.len()
    );
    service
        .install("notes", &parse_manifest(manifest.as_bytes())?)
        .await?;
    service.gem("notes").path("ocr").await?;

    // Quitting: the feed ends with an error the page shows as lost.
    service.shutdown().await;
    let _ = page.await;
    Ok(())
}
