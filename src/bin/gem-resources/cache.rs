//! `cache check` and `cache push`: the `[cache]` registry from the command
//! line (the library does the work, `gem_resources::cache`).

use std::process::ExitCode;

use gem_resources::cache::{CheckReport, Pushed};
use gem_resources::{Config, Error, Store};
use serde_json::{json, Value};

use crate::cli::CacheAction;
use crate::render;

/// Runs `cache check` or `cache push`.
pub async fn run(config: &Config, action: CacheAction, json: bool) -> anyhow::Result<ExitCode> {
    let fetcher = crate::context::fetcher(config)?;
    let Some(cache) = fetcher.cache().cloned() else {
        return Err(Error::Config(
            "no cache is configured: add a [cache] section with `oci` (see docs/cache.md)".into(),
        )
        .into());
    };
    match action {
        CacheAction::Check => {
            let report = cache.check().await;
            let push = cache.settings().push;
            let ok = report.reach.is_ok() && report.read.is_ok() && (!push || report.write.is_ok());
            if json {
                render::print_doc(check_json(&report, push), ok);
            } else {
                print_check(&report, push);
            }
            Ok(ExitCode::from(if ok { 0 } else { 1 }))
        }
        CacheAction::Push => push(config, &cache, json).await,
    }
}

/// One line per question: `reach: ok`, `write: refused: …`.
fn print_check(report: &CheckReport, push: bool) {
    crate::outln!("cache {}", report.address);
    for (what, result) in [
        ("reach", &report.reach),
        ("read", &report.read),
        ("write", &report.write),
    ] {
        match result {
            Ok(()) => crate::outln!("  {what}: ok"),
            Err(why) => crate::outln!("  {what}: {why}"),
        }
    }
    if !push && report.write.is_err() {
        crate::outln!("  (push = false: only reading is needed)");
    }
}

fn check_json(report: &CheckReport, push: bool) -> Value {
    let field = |r: &Result<(), String>| match r {
        Ok(()) => json!({ "ok": true }),
        Err(why) => json!({ "ok": false, "reason": why }),
    };
    json!({
        "cache": report.address,
        "push": push,
        "reach": field(&report.reach),
        "read": field(&report.read),
        "write": field(&report.write),
    })
}

/// Uploads every stored file the registry does not have, one at a time.
async fn push(
    config: &Config,
    cache: &gem_resources::cache::Cache,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if !crate::context::store_exists(config) {
        return Err(crate::context::no_store(config).into());
    }
    let store = Store::open(&config.store_dir())?;
    let (mut uploaded, mut present, mut failed) = (Vec::new(), 0usize, Vec::new());
    for sha256 in store.blobs()? {
        let Some(path) = store.blob_files(&sha256).into_iter().next() else {
            continue;
        };
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        match cache.push_file(&sha256, size, &path).await {
            Ok(pushed @ (Pushed::Uploaded | Pushed::Mounted)) => {
                if !json {
                    let how = if pushed == Pushed::Mounted {
                        "mounted"
                    } else {
                        "uploaded"
                    };
                    crate::outln!("{how}: {sha256} ({})", path.display());
                }
                uploaded.push(sha256);
            }
            Ok(Pushed::Present) => present += 1,
            Err(e) => {
                if !json {
                    crate::errln!("failed: {sha256}: {e}");
                }
                failed.push(json!({ "sha256": sha256, "reason": e.to_string() }));
            }
        }
    }
    let ok = failed.is_empty();
    if json {
        render::print_doc(
            json!({ "cache": cache.settings().registry.address(), "uploaded": uploaded, "present": present, "failed": failed }),
            ok,
        );
    } else {
        crate::outln!(
            "{} uploaded, {present} already in the cache, {} failed",
            uploaded.len(),
            failed.len()
        );
    }
    Ok(ExitCode::from(if ok { 0 } else { 1 }))
}
