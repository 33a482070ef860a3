//! A minimal app embedding the resource service, as the crate's
//! "Embedding" guide describes: open, listen for the app's other processes,
//! start, install a gem from its manifest, serve `path` to tools, draw the
//! gem page from status and live events (surviving a lag), change the
//! network policy, stop listening, shut down.
//!
//! The order matters at both ends: `listen()` comes before `start()`, so
//! that a store another service already runs (a `gem-resources serve`,
//! another instance of the app) is found by its `E_RESOURCE_BUSY` before
//! this one queues a download, and the other processes see every event of
//! the downloads `start()` queues; `ApiServer::stop()` comes before
//! `shutdown()`, so that no client is answered by a service shutting down.
//!
//! It runs offline: the gem's file comes from an embedded local HTTPS
//! origin (its own throwaway CA), reached only through `[dev]` settings
//! built in code for this run (no configuration file).
//!
//! Run with `cargo run --example embed`.

#[path = "support/offline.rs"]
mod offline;
#[path = "../tests/support/origin.rs"]
mod origin;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use gem_resources::policy::{Mode, Policy};
use gem_resources::{
    parse_manifest, ErrorCode, Event, GemResources, GemStatus, ResourceState, Resources, Result,
};
use origin::{Behaviour, Origin};
use tokio::sync::broadcast::{error::RecvError, Receiver};

#[tokio::main]
async fn main() -> Result<()> {
    // The stand-in for the internet: one slow file on cdn.test.
    let origin = Origin::start().await;
    let model: Vec<u8> = (0..4usize << 20).map(|i| (i * 7 % 251) as u8).collect();
    origin.route(
        "/models/ocr.onnx",
        Behaviour::Slow {
            body: model.clone(),
            chunk: 128 << 10,
            delay: Duration::from_millis(10),
        },
    );
    let dir = tempfile::tempdir().map_err(|e| gem_resources::Error::io("tempdir", ".", e))?;
    let config = offline::dev_config(dir.path(), &origin)?;

    // 1. Open the service once, inside the app's runtime.
    let service = Resources::open(&config)?;

    // 2. Listen for the app's other processes (JavaScript tools, a web-view
    //    page, the command line) before starting: E_RESOURCE_BUSY here
    //    means another service runs this store; then be its client
    //    (`api::Client::for_store`) rather than a second service.
    let api = match service.listen() {
        Ok(api) => api,
        Err(e) if e.code() == ErrorCode::Busy => {
            println!("another service runs this store: {e}");
            service.shutdown().await;
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    println!("other processes reach the service on {}", api.socket());

    // 3. Start it: it cleans up after a crash and queues missing required
    //    files, whose events the listening clients see too.
    let queued = service.start().await?;
    println!(
        "service open on {:?}; {queued} file(s) queued at start",
        service.store().root()
    );

    // 4. The gem page subscribes before it draws, so it misses nothing.
    let (events, status) = service.subscribe_with_status(None)?;
    let (close_page, closed) = tokio::sync::oneshot::channel::<()>();
    let page = tokio::spawn(gem_page(service.clone(), events, status, closed));

    // 5. Install a gem from its manifest (returns before any download).
    let manifest = parse_manifest(manifest_json(&origin, &model).as_bytes())?;
    let report = service.install("notes", &manifest).await?;
    println!("installed {}: {} file(s) queued", report.gem, report.queued);

    // 6. A tool of the gem asks for its file: its `ctx.resources` is the
    //    service scoped to the gem, and `path` waits for a missing file.
    let ctx_resources = service.gem("notes");
    let path = tool_call(&ctx_resources, "ocr").await?;
    println!("tool got {}", path.display());

    // 7. The user blocks the CDN in "Settings › System": a lazy file from
    //    there now fails, and the page can say why.
    let hosts = vec!["cdn.test".to_string()];
    service.set_policy(Policy::new(Mode::Blocklist, &hosts)?)?;
    match tool_call(&ctx_resources, "dictionary").await {
        Ok(path) => println!("unexpected: {}", path.display()),
        Err(e) if e.primary_cause() == ErrorCode::Policy => {
            println!("dictionary: blocked by your network policy")
        }
        Err(e) => println!("dictionary: {e}"),
    }
    service.set_policy(Policy::allow_all())?;

    // 8. Stop listening first (the socket and service.json go, clients see
    //    the connection end), then shut down cleanly: downloads stop (kept
    //    for resume) and every later call says E_RESOURCE_SHUTDOWN. Then
    //    close the page.
    api.stop().await;
    service.shutdown().await;
    assert!(service.is_shut_down());
    if let Err(e) = service.status(None) {
        println!("after shutdown: {e}");
    }
    let _ = close_page.send(());
    let _ = page.await;
    Ok(())
}

/// What a tool's `ctx.resources.path(id)` does in the app.
async fn tool_call(ctx_resources: &GemResources, id: &str) -> Result<PathBuf> {
    ctx_resources.path(id).await
}

/// The gem page: drawn from `status`, kept current from events. After a
/// lag it rebuilds itself from a fresh status instead of guessing.
async fn gem_page(
    service: Resources,
    mut events: Receiver<Event>,
    status: Vec<GemStatus>,
    mut closed: tokio::sync::oneshot::Receiver<()>,
) {
    let mut rows = rows_of(&status);
    loop {
        let event = tokio::select! {
            event = events.recv() => event,
            _ = &mut closed => break,
        };
        match event {
            Ok(Event::Progress {
                gem,
                resource,
                bytes,
                size,
                ..
            }) => {
                let percent = bytes * 100 / size.max(1);
                let row = rows.entry(format!("{gem}/{resource}")).or_default();
                if percent / 25 != row.1 / 25 {
                    println!("  page: {gem}/{resource} {percent}%");
                }
                *row = ("downloading".into(), percent);
            }
            Ok(Event::Verified { gem, resource, .. }) => {
                rows.insert(format!("{gem}/{resource}"), ("present".into(), 100));
                println!("  page: {gem}/{resource} ready");
            }
            Ok(Event::Failed {
                gem,
                resource,
                primary_cause,
                ..
            }) => {
                let why = match primary_cause {
                    ErrorCode::Policy => "blocked by your network policy".to_string(),
                    other => format!("failed ({other})"),
                };
                println!("  page: {gem}/{resource} {why}");
                rows.insert(format!("{gem}/{resource}"), (why, 0));
            }
            Ok(Event::Cancelled { gem, resource, .. }) => {
                rows.insert(format!("{gem}/{resource}"), ("stopped".into(), 0));
            }
            Ok(_) => {}
            Err(RecvError::Lagged(missed)) => match service.subscribe_with_status(None) {
                Ok((fresh, status)) => {
                    println!("  page: {missed} events missed, redrawn from status");
                    events = fresh;
                    rows = rows_of(&status);
                }
                // Shut down meanwhile: nothing more to draw.
                Err(_) => break,
            },
            Err(RecvError::Closed) => break,
        }
    }
    println!("  page: {} row(s) at the end", rows.len());
}

/// One row per resource: its state and percent.
fn rows_of(status: &[GemStatus]) -> BTreeMap<String, (String, u64)> {
    let mut rows = BTreeMap::new();
    for gem in status {
        for r in &gem.resources {
            let row = match &r.state {
                ResourceState::Present { .. } => ("present".into(), 100),
                ResourceState::Downloading { bytes, .. } => {
                    ("downloading".into(), bytes * 100 / r.size.max(1))
                }
                ResourceState::Failed { failure, .. } => (format!("failed ({})", failure.code), 0),
                ResourceState::Queued => ("queued".into(), 0),
                ResourceState::Missing => ("not downloaded".into(), 0),
                // A state added by a later version.
                _ => ("unknown".into(), 0),
            };
            println!("  page: {}/{} ({}) {}", gem.gem, r.id, r.label, row.0);
            rows.insert(format!("{}/{}", gem.gem, r.id), row);
        }
    }
    rows
}

/// The gem's manifest: one required model, one lazy dictionary.
fn manifest_json(origin: &Origin, model: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let sha = hex::encode(Sha256::digest(model));
    let url = origin.url("cdn.test", "/models/ocr.onnx");
    let dict = origin.url("cdn.test", "/dict/en.dic");
    format!(
        r#"{{"resources": [
            {{"id": "ocr", "url": "{url}", "sha256": "{sha}", "size": {}, "required": true, "description": "OCR model"}},
            {{"id": "dictionary", "url": "{dict}", "sha256": "{}", "size": 1024}}
        ]}}"#,
        model.len(),
        "0".repeat(64)
    )
}
