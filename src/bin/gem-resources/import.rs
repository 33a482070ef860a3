//! `import FILE…`: files the user already has, stored without a network.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use gem_resources::{Config, ImportOutcome, Resources};
use serde_json::json;

use crate::context::FAILED;
use crate::render::{self, print_json};

/// Imports every file, one line (or one JSON entry) per file. Exit status
/// 0 when every file was imported or already present, 1 when one matched
/// nothing or failed.
pub async fn run(config: &Config, files: &[PathBuf], json: bool) -> anyhow::Result<ExitCode> {
    // A path that is not a readable file is a wrong argument: say so before
    // touching the store.
    for file in files {
        check_file(file)?;
    }
    // Looking for matches in a store that does not exist must not create
    // one: nothing is installed, so nothing can match.
    let service = if crate::context::store_exists(config) {
        Some(Resources::open(config)?)
    } else {
        None
    };
    let mut entries = Vec::new();
    let mut ok = true;
    let mut interrupted = crate::interrupt::signal();
    for (done, file) in files.iter().enumerate() {
        let outcome = match &service {
            Some(service) => tokio::select! {
                outcome = service.import(file) => outcome,
                () = &mut interrupted => {
                    // A file is published whole or not at all, never half.
                    service.shutdown().await;
                    crate::errln!(
                        "interrupted while importing {}: {done} of {} file(s) done before it; run `import` again for the rest",
                        file.display(),
                        files.len()
                    );
                    return Ok(ExitCode::from(crate::interrupt::INTERRUPTED));
                }
            },
            None => Ok(ImportOutcome::NoMatch {
                size: std::fs::metadata(file).map(|m| m.len()).unwrap_or(0),
                sha256: None,
            }),
        };
        match outcome {
            Ok(outcome) => {
                ok &= !matches!(outcome, ImportOutcome::NoMatch { .. });
                if json {
                    let mut entry = json!(outcome);
                    entry["file"] = json!(file);
                    entries.push(entry);
                } else {
                    crate::outln!("{}", render::import_line(file, &outcome));
                }
            }
            Err(e) => {
                ok = false;
                if json {
                    let mut entry = render::error_json(&e);
                    entry["file"] = json!(file);
                    entry["outcome"] = json!("error");
                    entries.push(entry);
                } else {
                    crate::errln!("{}: {}", file.display(), render::error_text(&e));
                }
            }
        }
    }
    if json {
        print_json(&json!({ "ok": ok, "files": entries }));
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(FAILED)
    })
}

fn check_file(file: &Path) -> anyhow::Result<()> {
    let meta =
        std::fs::metadata(file).with_context(|| format!("cannot import {}", file.display()))?;
    anyhow::ensure!(
        meta.is_file(),
        "cannot import {}: not a file",
        file.display()
    );
    Ok(())
}
