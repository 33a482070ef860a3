//! Subcommands of the resource service: install, uninstall, path, status,
//! sync, verify and serve.

use std::process::ExitCode;

use gem_resources::{Config, Error, Event, Resources, VerifyReport};
use serde_json::json;

use crate::cli::Command;
use crate::context::{no_store, store_exists, store_folder};
use crate::interrupt;
use crate::render;
use crate::report;
use crate::watch::{Output, Show, Watcher};

/// Runs a service subcommand.
pub async fn run(
    config: &Config,
    command: Command,
    json: bool,
    no_service: bool,
) -> anyhow::Result<ExitCode> {
    if matches!(command, Command::Status { .. }) {
        crate::context::warn_dev(config);
    }
    // A service listening on the store does the work: its live policy,
    // its events, one download per file for every process.
    let through_api = matches!(
        command,
        Command::Path { .. }
            | Command::Status { .. }
            | Command::Install { .. }
            | Command::Uninstall { .. }
            | Command::Sync
    );
    if through_api {
        // `path` says when it works in this process: without the
        // service's configuration, it may fail where the service would not.
        let say = matches!(command, Command::Path { .. }) && !json;
        if let Some(client) = crate::remote::client_saying(config, no_service, say).await {
            // A look at the status needs no service: one that does not
            // answer in time (or goes away) is read around.
            let Command::Status { gem } = &command else {
                return crate::remote::run(&client, config, command, json).await;
            };
            match client.status(gem.as_deref()).await {
                Ok(result) => {
                    crate::report::print_status_result(&result, json);
                    return Ok(ExitCode::SUCCESS);
                }
                Err(e) => crate::errln!(
                    "warning: the store's service did not answer, reading the store in process: {e}"
                ),
            }
        }
    }
    // Looking at a store must not create one, nor pass a mistyped folder
    // for an empty store.
    if matches!(
        command,
        Command::Status { .. }
            | Command::Uninstall { .. }
            | Command::Verify { .. }
            | Command::Path { .. }
    ) && !store_exists(config)
    {
        if let Command::Uninstall { gem } = command {
            // Like `rm -f`: the wanted end state already holds.
            let store = store_folder(config);
            report::not_installed(
                &gem,
                &format!("no store at {}", store.display()),
                &store,
                json,
            );
            return Ok(ExitCode::SUCCESS);
        }
        return Err(no_store(config).into());
    }
    // A parent already gone starts no service (nor opens the store).
    let parent = match &command {
        Command::Serve {
            parent_pid: Some(pid),
            ..
        } => Some(
            gem_resources::api::lifetime::Parent::watch(*pid)
                .map_err(|e| anyhow::anyhow!("--parent-pid {pid}: {e}"))?,
        ),
        _ => None,
    };
    let service = Resources::open(config)?;
    match command {
        Command::Install {
            args,
            as_gem,
            no_wait,
            take_over,
        } => {
            let (gem, manifest) = crate::context::install_target(&args, as_gem.as_deref())?;
            install(&service, &gem, &manifest, no_wait, take_over, json).await
        }
        Command::Uninstall { gem } => uninstall(&service, &gem, json).await,
        Command::Path { gem, resource } => path(&service, &gem, &resource, json).await,
        Command::Status { gem } => {
            let result = gem_resources::api::status_of(&service, gem.as_deref())?;
            report::print_status_result(&result, json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Sync => sync(&service, json).await,
        Command::Verify { repair } => verify(&service, repair, json).await,
        Command::Serve {
            gems,
            interval,
            exit_with_stdin,
            ..
        } => {
            let lifetime = crate::serve::Lifetime {
                parent,
                exit_with_stdin,
            };
            crate::serve::run(&service, config, gems.as_deref(), interval, lifetime, json).await
        }
        other => anyhow::bail!("unexpected command {other:?}"),
    }
}

/// `path GEM RESOURCE`: the file's path, downloading it first when it is
/// missing; Ctrl-C stops the download and keeps what it received.
async fn path(
    service: &Resources,
    gem: &str,
    resource: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut interrupted = interrupt::signal();
    // The command's own error reports a failure: no event line too.
    let show = Show {
        json,
        output: Output::Stderr,
        failures: false,
    };
    let watcher = crate::watch::spawn_with(service, show);
    let result = tokio::select! {
        result = service.path(gem, resource) => result,
        () = &mut interrupted => return stop(service, Some(watcher), Some(gem)).await,
    };
    watcher.stop().await;
    match result {
        Ok(path) => {
            if json {
                render::print_doc(
                    json!({ "gem": gem, "resource": resource, "path": path }),
                    true,
                );
            } else {
                crate::outln!("{}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => fail(&e, json),
    }
}

/// `verify`: re-hashes every stored file. Ctrl-C stops it between reads;
/// what it removed until then is said. With `--repair`, each removed file
/// an installed gem declares is downloaded again (from the first such
/// gem's addresses) and verified, and so is each required file that is
/// missing (an earlier `verify` removed it); the exit status is then 0
/// when every one came back.
async fn verify(service: &Resources, repair: bool, json: bool) -> anyhow::Result<ExitCode> {
    let mut interrupted = interrupt::signal();
    let mut events = service.subscribe();
    let report = tokio::select! {
        report = service.verify() => report?,
        () = &mut interrupted => {
            service.shutdown().await;
            let mut removed = 0;
            while let Ok(event) = events.try_recv() {
                removed += usize::from(matches!(event, Event::Deleted { .. }));
            }
            interrupt::say(
                &format!("interrupted: verify stopped before the end; {removed} corrupted file(s) removed until then"),
                json!({ "removed": removed }),
            );
            return Ok(ExitCode::from(interrupt::INTERRUPTED));
        }
    };
    if !repair {
        if json {
            render::print_doc(json!(report), report.corrupted.is_empty());
        } else {
            report::print_verify(&report, false);
        }
        return Ok(if report.corrupted.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    if !json {
        report::print_verify(&report, true);
    }
    let show = Show {
        json,
        output: Output::Stderr,
        failures: false,
    };
    let watcher = crate::watch::spawn_with(service, show);
    let (repaired, unrepaired) = tokio::select! {
        done = download_again(service, &report, json) => done,
        () = &mut interrupted => return stop(service, Some(watcher), None).await,
    };
    watcher.stop().await;
    let ok = unrepaired.is_empty();
    if json {
        let mut doc = json!(report);
        doc["repaired"] = json!(repaired);
        doc["unrepaired"] = json!(unrepaired);
        render::print_doc(doc, ok);
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Downloads again each file `verify` removed that an installed gem declares, from
/// the first such gem's addresses: the JSON rows of those that came back
/// and of those that did not (with their error), each said as it ends.
async fn download_again(
    service: &Resources,
    report: &VerifyReport,
    json: bool,
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let mut repaired = Vec::new();
    let mut unrepaired = Vec::new();
    let mut again: Vec<(String, String, String, bool)> = Vec::new();
    for removed in &report.removed {
        // Not declared by any installed gem: nothing to download it from.
        let Some((gem, id)) = removed.declared_by.first().and_then(|d| d.split_once('/')) else {
            continue;
        };
        again.push((removed.sha256.clone(), gem.into(), id.into(), false));
    }
    // A required file missing (an earlier `verify` removed it, or it
    // never came): a repair brings it back too.
    for (sha256, gem, id) in missing_required(service) {
        if again.iter().all(|(sha, ..)| *sha != sha256) {
            if !json {
                crate::outln!("missing required {gem}/{id}; downloading it again");
            }
            again.push((sha256, gem, id, true));
        }
    }
    for (sha256, gem, id, missing) in &again {
        match service.path(gem, id).await {
            Ok(path) => {
                if !json {
                    crate::outln!(
                        "repaired {gem}/{id}: downloaded again and verified, {}",
                        path.display()
                    );
                }
                repaired.push(json!({
                    "sha256": sha256, "gem": gem, "resource": id, "path": path, "was_missing": missing,
                }));
            }
            Err(e) => {
                if !json {
                    crate::errln!("cannot repair {gem}/{id}: {}", render::error_text(&e));
                }
                let mut value = render::error_json(&e);
                value["sha256"] = json!(sha256);
                value["was_missing"] = json!(missing);
                value["gem"] = json!(gem);
                value["resource"] = json!(id);
                unrepaired.push(value);
            }
        }
    }
    (repaired, unrepaired)
}

/// `(sha256, gem, id)` of each required file of an installed gem that is
/// not in the store and not on its way, once per file.
fn missing_required(service: &Resources) -> Vec<(String, String, String)> {
    let mut missing: Vec<(String, String, String)> = Vec::new();
    for gem in service.status(None).unwrap_or_default() {
        for r in gem.resources.iter().filter(|r| r.required) {
            let gone = matches!(
                r.state,
                gem_resources::ResourceState::Missing | gem_resources::ResourceState::Failed { .. }
            );
            if gone && missing.iter().all(|(sha, ..)| *sha != r.sha256) {
                missing.push((r.sha256.clone(), gem.gem.clone(), r.id.clone()));
            }
        }
    }
    missing
}

async fn install(
    service: &Resources,
    gem: &str,
    manifest: &std::path::Path,
    no_wait: bool,
    take_over: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    crate::render::manifest_file(manifest);
    let (manifest, declared) = crate::context::read_manifest_declaring(manifest)?;
    if let Some(declared) = declared.filter(|d| d != gem && !crate::progress::quiet()) {
        crate::errln!(
            "note: installing {} as {} (--as)",
            crate::text::field(&declared),
            crate::text::field(gem)
        );
    }
    let mut interrupted = interrupt::signal();
    let watcher = (!no_wait).then(|| crate::watch::spawn(service, json, Output::Stderr));
    let by = gem_resources::InstalledBy::Cli;
    let report = if take_over {
        service.install_taking_over(gem, &manifest, by).await?
    } else {
        service.install_by(gem, &manifest, by).await?
    };
    if no_wait {
        // This process ends now: stop what it queued, cleanly, so that
        // nothing is half-written and no failure is recorded. `serve` or
        // `sync` downloads the files.
        service.shutdown().await;
        report::print_queued(
            &report,
            json,
            "they download in the background of `serve`, or now with `sync`",
        );
        return Ok(ExitCode::SUCCESS);
    }
    tokio::select! {
        () = service.wait_idle() => {}
        () = &mut interrupted => return stop(service, watcher, Some(gem)).await,
    }
    if let Some(w) = watcher {
        w.stop().await;
    }
    let status = service.status(Some(gem))?;
    report::print_installed(&report, &status, json);
    // A failed download never fails an install: the gem is registered, and
    // `status` and `sync` report and retry the file.
    Ok(ExitCode::SUCCESS)
}

async fn uninstall(service: &Resources, gem: &str, json: bool) -> anyhow::Result<ExitCode> {
    if !service.installed()?.iter().any(|g| g == gem) {
        // Like `rm -f`: the wanted end state already holds.
        let store = service.store().folder();
        report::not_installed(
            gem,
            &format!("in the store {}", store.display()),
            store,
            json,
        );
        return Ok(ExitCode::SUCCESS);
    }
    let before = service.status(Some(gem))?;
    let report = service.uninstall(gem).await?;
    let result = gem_resources::api::protocol::UninstallResult {
        gem: report.gem.clone(),
        installed: true,
        deleted: report.deleted.clone(),
        kept: report.kept.clone(),
    };
    let after = if report.kept.is_empty() {
        Vec::new()
    } else {
        service.status(None)?
    };
    report::print_uninstalled(&result, &before, &after, json);
    Ok(ExitCode::SUCCESS)
}

async fn sync(service: &Resources, json: bool) -> anyhow::Result<ExitCode> {
    let mut interrupted = interrupt::signal();
    let watcher = crate::watch::spawn(service, json, Output::Stderr);
    let queued = service.start().await?;
    tokio::select! {
        () = service.wait_idle() => {}
        () = &mut interrupted => return stop(service, Some(watcher), None).await,
    }
    watcher.stop().await;
    let status = service.status(None)?;
    Ok(report::print_sync(queued, &status, json))
}

/// Ctrl-C: notes what is downloading, stops every download, says what was
/// kept, exits 130.
async fn stop(
    service: &Resources,
    watcher: Option<Watcher>,
    gem: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let unfinished = interrupt::unfinished(service, gem);
    crate::progress::clear_all();
    service.shutdown().await;
    if let Some(w) = watcher {
        w.stop().await;
    }
    interrupt::report(service.store(), &unfinished);
    Ok(ExitCode::from(interrupt::INTERRUPTED))
}

fn fail(e: &Error, json: bool) -> anyhow::Result<ExitCode> {
    Ok(render::fail(e, json))
}
