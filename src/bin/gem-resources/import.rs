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
                    // A file is published whole or not at all, never half:
                    // shutdown returns once the copy removed its partial file.
                    service.shutdown().await;
                    crate::interrupt::say(
                        &format!(
                            "interrupted while importing {}: {done} of {} file(s) done before it; run `import` again for the rest",
                            file.display(),
                            files.len()
                        ),
                        serde_json::json!({ "done": done, "files": files.len() }),
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
                let why = match &outcome {
                    ImportOutcome::NoMatch { size, sha256 } => {
                        Some(no_match_reason(service.as_ref(), *size, sha256.is_some()))
                    }
                    _ => None,
                };
                ok &= why.is_none();
                if json {
                    let mut entry = json!(outcome);
                    entry["file"] = json!(file);
                    if let Some(why) = &why {
                        entry["why"] = json!(why);
                    }
                    entries.push(entry);
                } else {
                    let line = render::import_line(file, &outcome);
                    match why {
                        Some(why) => crate::outln!("{line}: {why}"),
                        None => crate::outln!("{line}"),
                    }
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

/// Why a file of `size` bytes matched nothing: no declared file has its
/// size, or those that do (named) have another SHA-256 (`hashed`).
fn no_match_reason(service: Option<&Resources>, size: u64, hashed: bool) -> String {
    let same_size: Vec<String> = service
        .and_then(|s| s.status(None).ok())
        .unwrap_or_default()
        .iter()
        .flat_map(|gem| {
            gem.resources
                .iter()
                .filter(|r| r.size == size)
                .map(move |r| format!("{}/{}", gem.gem, r.id))
        })
        .collect();
    if !hashed || same_size.is_empty() {
        return format!(
            "no installed gem declares a file of this size ({})",
            render::bytes(size)
        );
    }
    let names = crate::text::field(&same_size.join(", ")).into_owned();
    format!("same size as {names} but a different SHA-256")
}

fn check_file(file: &Path) -> anyhow::Result<()> {
    let meta = std::fs::symlink_metadata(file)
        .with_context(|| format!("cannot import {}", file.display()))?;
    anyhow::ensure!(
        !meta.file_type().is_symlink(),
        "cannot import {}: a symbolic link; import the file it points to",
        file.display()
    );
    anyhow::ensure!(
        meta.is_file(),
        "cannot import {}: not a file",
        file.display()
    );
    Ok(())
}
