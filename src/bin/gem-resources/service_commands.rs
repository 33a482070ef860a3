//! Subcommands of the resource service: install, uninstall, path, status,
//! sync, verify and serve.

use std::process::ExitCode;
use std::sync::Arc;

use gem_resources::{Config, Error, Event, GemStatus, ResourceState, Resources};
use serde_json::json;

use crate::cli::Command;
use crate::commands::read_manifest;
use crate::render::{self, print_json};
use crate::watch::Output;

/// Runs a service subcommand.
pub async fn run(config: &Config, command: Command, json: bool) -> anyhow::Result<ExitCode> {
    let service = Resources::open(config)?;
    match command {
        Command::Install {
            gem,
            manifest,
            no_wait,
        } => {
            let manifest = read_manifest(&manifest)?;
            let watcher = crate::watch::spawn(&service, json, Output::Stderr);
            let report = service.install(&gem, &manifest).await?;
            if !no_wait {
                service.wait_idle().await;
            }
            watcher.stop().await;
            if json {
                print_json(&json!({ "event": "install_report", "report": report }));
            } else {
                let verb = if report.upgrade {
                    "upgraded"
                } else {
                    "installed"
                };
                crate::errln!(
                    "{verb} {}: {} resource(s), {} already present, {} downloaded in the background, {} deleted",
                    report.gem,
                    report.resources,
                    report.present,
                    report.queued,
                    report.deleted.len()
                );
            }
            // A failed download never fails an install.
            Ok(ExitCode::SUCCESS)
        }
        Command::Uninstall { gem } => {
            let report = service.uninstall(&gem).await?;
            if json {
                print_json(&json!(report));
            } else {
                crate::errln!(
                    "uninstalled {}: {} file(s) deleted, {} kept (declared by another gem)",
                    report.gem,
                    report.deleted.len(),
                    report.kept.len()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Path { gem, resource } => {
            let watcher = crate::watch::spawn(&service, json, Output::Stderr);
            let result = service.path(&gem, &resource).await;
            watcher.stop().await;
            match result {
                Ok(path) => {
                    if json {
                        print_json(&json!({ "gem": gem, "resource": resource, "path": path }));
                    } else {
                        crate::outln!("{}", path.display());
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => fail(&e, json),
            }
        }
        Command::Status { gem } => {
            let status = service.status(gem.as_deref())?;
            if json {
                print_json(&json!({ "gems": status }));
            } else {
                print_status(&status);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Sync => {
            let watcher = crate::watch::spawn(&service, json, Output::Stderr);
            let queued = service.start().await?;
            service.wait_idle().await;
            watcher.stop().await;
            let status = service.status(None)?;
            let failed = failed_required(&status);
            if json {
                print_json(&json!({ "event": "sync_report", "queued": queued, "failed": failed }));
            } else {
                crate::errln!(
                    "sync: {queued} required file(s) were missing, {} still missing",
                    failed.len()
                );
            }
            Ok(if failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Verify => {
            let report = service.verify().await?;
            if json {
                print_json(&json!(report));
            } else {
                crate::outln!(
                    "verified {} file(s), {} corrupted",
                    report.ok,
                    report.corrupted.len()
                );
                for sha in &report.corrupted {
                    crate::outln!("removed corrupted file {sha}");
                }
            }
            Ok(if report.corrupted.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Serve { gems, interval } => {
            crate::serve::run(&service, &gems, interval, json).await?;
            Ok(ExitCode::SUCCESS)
        }
        other => anyhow::bail!("unexpected command {other:?}"),
    }
}

fn fail(e: &Arc<Error>, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        print_json(&render::error_json(e));
    } else {
        crate::errln!("{e}");
    }
    Ok(ExitCode::from(1))
}

/// `gem/resource` of every required resource that is not present.
fn failed_required(status: &[GemStatus]) -> Vec<String> {
    status
        .iter()
        .flat_map(|g| {
            g.resources
                .iter()
                .filter(|r| r.required && !matches!(r.state, ResourceState::Present { .. }))
                .map(move |r| format!("{}/{}", g.gem, r.id))
        })
        .collect()
}

fn print_status(status: &[GemStatus]) {
    if status.is_empty() {
        crate::outln!("no gems installed");
        return;
    }
    for gem in status {
        crate::outln!("{}", gem.gem);
        for r in &gem.resources {
            let when = if r.required { "eager" } else { "lazy" };
            let state = match &r.state {
                ResourceState::Present { .. } => "present".to_string(),
                ResourceState::Missing => "missing".to_string(),
                ResourceState::Queued => "queued".to_string(),
                ResourceState::Downloading { bytes } => {
                    format!(
                        "downloading {}/{}",
                        render::bytes(*bytes),
                        render::bytes(r.size)
                    )
                }
                ResourceState::Failed { failure } => {
                    format!("failed ({}) at {}", failure.code, render::utc(failure.at))
                }
            };
            crate::outln!(
                "  {:<20} {:>10}  {:<24} {:<5}  {}",
                r.label,
                render::bytes(r.size),
                r.host,
                when,
                state
            );
            if let ResourceState::Failed { failure } = &r.state {
                for a in &failure.attempts {
                    crate::outln!("      {} {}: {}", a.code, a.address, a.reason);
                }
            }
        }
    }
}

/// Renders one event: a JSON line, or a log line on stderr.
pub fn print_event(event: &Event, json: bool, output: Output) {
    if json {
        match output {
            Output::Stdout => print_json(&json!(event)),
            Output::Stderr => crate::errln!("{}", json!(event)),
        }
        return;
    }
    match event {
        Event::Verified {
            gem,
            resource,
            path,
        } => {
            crate::errln!("verified {gem}/{resource}: {}", path.display())
        }
        Event::Failed { message, .. } => crate::errln!("{message}"),
        Event::Deleted { sha256 } => crate::errln!("deleted {sha256}"),
        _ => {}
    }
}
