//! The service commands through the local API, when a service listens on
//! the store: `path`, `status`, `install`, `uninstall`, `sync` then share
//! its live policy, its events and its single download per file.

use std::process::ExitCode;
use std::time::Duration;

use gem_resources::api::protocol::{PathResult, StatusResult, UninstallResult};
use gem_resources::api::Client;
use gem_resources::{Config, Error, GemStatus, InstallReport, ResourceState, Store};
use serde_json::{json, Value};

use crate::cli::Command;
use crate::context::store_exists;
use crate::interrupt;
use crate::render;
use crate::report;
use crate::watch::{Output, Show, Watcher};

/// How often a waiting command looks at the service's status.
const POLL: Duration = Duration::from_millis(200);

/// The service listening on the configured store, unless `--no-service`
/// or nothing listens.
pub async fn client(config: &Config, no_service: bool) -> Option<Client> {
    client_saying(config, no_service, false).await
}

/// [`client`]; when `say` and no service listens, a line on stderr says
/// that the command works in this process, and with which configuration
/// (a service's may differ).
pub async fn client_saying(config: &Config, no_service: bool, say: bool) -> Option<Client> {
    if no_service || !store_exists(config) {
        return None;
    }
    let store = Store::open(&config.store_dir()).ok()?;
    match Client::for_store_checked(&store).await {
        Ok(Some(client)) => Some(client),
        Ok(None) => {
            if say && !crate::progress::quiet() {
                crate::errln!("no service; {}", working_here(config));
            }
            None
        }
        Err(e) => {
            crate::errln!(
                "warning: not using the store's service, working in process with {}: {e}",
                configuration(config)
            );
            None
        }
    }
}

/// `working in this process with /home/me/.config/gem-resources/config.toml`
/// (or `with the default configuration`).
pub fn working_here(config: &Config) -> String {
    format!("working in this process with {}", configuration(config))
}

/// The configuration file `config` was read from, or `the default
/// configuration`.
fn configuration(config: &Config) -> String {
    match &config.source {
        Some(path) => path.display().to_string(),
        None => "the default configuration".to_string(),
    }
}

/// Runs a service command through `client`, the service on `config`'s
/// store.
pub async fn run(
    client: &Client,
    config: &Config,
    command: Command,
    json: bool,
) -> anyhow::Result<ExitCode> {
    tracing::debug!(socket = client.socket(), "using the service's local API");
    // `path` cancels its own call when interrupted, and says what the
    // service did with the download.
    if let Command::Path { gem, resource } = &command {
        return path(client, gem, resource, json).await;
    }
    let mut interrupted = interrupt::signal();
    // What an interruption leaves: a download going on, an uninstall the
    // service finishes, or nothing (a look at the status).
    let socket = client.socket();
    let left = match &command {
        Command::Install { .. } | Command::Sync => {
            format!("the download goes on in the service listening on {socket}")
        }
        Command::Uninstall { .. } => {
            format!("the service listening on {socket} finishes the uninstall")
        }
        _ => format!("nothing was changed (the service listening on {socket} goes on)"),
    };
    let work = async {
        match command {
            Command::Install {
                args,
                as_gem,
                no_wait,
                take_over,
            } => {
                let (gem, manifest) = crate::context::install_target(&args, as_gem.as_deref())?;
                install(client, &gem, &manifest, no_wait, take_over, json).await
            }
            Command::Uninstall { gem } => {
                let store = crate::context::store_folder(config);
                uninstall(client, &gem, &store, json).await
            }
            Command::Sync => sync(client, json).await,
            other => anyhow::bail!("unexpected command {other:?}"),
        }
    };
    tokio::select! {
        outcome = work => outcome,
        () = &mut interrupted => {
            interrupt::say(&format!("interrupted: {left}"), json!({ "service": socket }));
            Ok(ExitCode::from(interrupt::INTERRUPTED))
        }
    }
}

/// Follows `gem`'s events from the service while a command waits: bars on
/// a terminal, JSON lines on stderr with `--json`, as in process.
async fn watch(client: &Client, gem: Option<&str>, show: Show) -> anyhow::Result<Watcher> {
    let (_, notifications) = client.subscribe(gem).await?;
    Ok(crate::watch::spawn_remote(notifications, show))
}

async fn path(client: &Client, gem: &str, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    // The command's own error reports a failure: no event line too.
    let show = Show {
        json,
        output: Output::Stderr,
        failures: false,
    };
    // Only this resource's events: the gem's other files are not this
    // command's business.
    let (_, notifications) = client.subscribe(Some(gem)).await?;
    let watcher = crate::watch::spawn_remote_for(notifications, show, Some(id.to_string()));
    let mut interrupted = interrupt::signal();
    let cancel = tokio_util::sync::CancellationToken::new();
    let call = client.call_until::<PathResult>("path", json!({ "gem": gem, "id": id }), &cancel);
    tokio::pin!(call);
    let outcome = tokio::select! {
        outcome = &mut call => outcome,
        () = &mut interrupted => {
            cancel.cancel();
            let outcome = call.await;
            watcher.stop().await;
            return Ok(interrupted_path(client, &outcome));
        }
    };
    watcher.stop().await;
    let result = match outcome {
        Ok(r) => r,
        Err(e @ Error::Service { .. }) => {
            // The connection's end is told a moment after the call's.
            let closed = client.closed();
            let _ = tokio::time::timeout(Duration::from_secs(1), closed).await;
            if client.is_closed() {
                return fail(&service_gone(client, gem, id), json);
            }
            return fail(&e, json);
        }
        Err(e) => return fail(&e, json),
    };
    if json {
        render::print_doc(json!(result), true);
    } else {
        crate::outln!("{}", result.path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `path`'s error when the service went away before the file was ready:
/// what was downloaded is kept, and either way on resumes from it.
fn service_gone(client: &Client, gem: &str, id: &str) -> Error {
    Error::Service {
        socket: client.socket().to_string(),
        reason: format!(
            "the service stopped before {gem}/{id} was ready; the bytes downloaded so far are kept: start the service again (`gem-resources serve`), or run `gem-resources path {gem} {id}` again to go on from them in this process"
        ),
    }
}

/// Says what an interrupted `path` left: the service's answer to the
/// cancelled call tells whether the download goes on (another caller waits
/// for it, or a gem requires the file) or stopped, its bytes kept.
fn interrupted_path(client: &Client, outcome: &Result<PathResult, Error>) -> ExitCode {
    let socket = client.socket();
    let download = match outcome {
        Err(Error::Remote(data)) => data.details.get("download").and_then(|d| d.as_str()),
        _ => None,
    };
    let said = match download {
        Some("continues") => format!(
            "interrupted: the download goes on in the service listening on {socket} (another caller waits for it, or a gem requires the file)"
        ),
        Some("stopped") => format!(
            "interrupted: the service stopped the download; its bytes are kept for the next run (service {socket})"
        ),
        _ => format!("interrupted (the service listening on {socket} did not say what it did with the download)"),
    };
    interrupt::say(&said, json!({ "service": socket, "download": download }));
    ExitCode::from(interrupt::INTERRUPTED)
}

async fn install(
    client: &Client,
    gem: &str,
    manifest: &std::path::Path,
    no_wait: bool,
    take_over: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    // Checked here as in process, so the errors name the file.
    let (_, declared) = crate::context::read_manifest_declaring(manifest)?;
    if let Some(declared) = declared.filter(|d| d != gem && !crate::progress::quiet()) {
        crate::errln!(
            "note: installing {} as {} (--as)",
            crate::text::field(&declared),
            crate::text::field(gem)
        );
    }
    let bytes = crate::context::read_manifest_bytes(manifest)?;
    let value = gem_resources::manifest::parse_json(&bytes)
        .map_err(|e| crate::context::in_file(e.into(), manifest))?;
    let show = Show {
        json,
        output: Output::Stderr,
        failures: true,
    };
    let watcher = if no_wait {
        None
    } else {
        Some(watch(client, Some(gem), show).await?)
    };
    let report: InstallReport = client
        .call(
            "install",
            json!({ "gem": gem, "manifest": value, "installed_by": "cli", "take_over": take_over }),
        )
        .await?;
    if no_wait {
        report::print_queued(&report, json, "the service downloads them");
        return Ok(ExitCode::SUCCESS);
    }
    let status = settled(client, Some(gem)).await?;
    if let Some(watcher) = watcher {
        watcher.stop().await;
    }
    report::print_installed(&report, &status, json);
    Ok(ExitCode::SUCCESS)
}

/// The status once no required file (of `gem`, or of any gem) is queued
/// or downloading.
async fn settled(client: &Client, gem: Option<&str>) -> anyhow::Result<Vec<GemStatus>> {
    loop {
        let result: StatusResult = client.call("status", json!({ "gem": gem })).await?;
        let busy = result.gems.iter().flat_map(|g| &g.resources).any(|r| {
            r.required
                && matches!(
                    r.state,
                    ResourceState::Queued
                        | ResourceState::Downloading { .. }
                        | ResourceState::Retrying { .. }
                        | ResourceState::Waiting { .. }
                )
        });
        if !busy {
            return Ok(result.gems);
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn uninstall(
    client: &Client,
    gem: &str,
    store: &std::path::Path,
    json: bool,
) -> anyhow::Result<ExitCode> {
    // The gem's rows name the files it kept; the other gems' say why.
    let before = client
        .call::<StatusResult>("status", json!({ "gem": gem }))
        .await
        .map(|r| r.gems)
        .unwrap_or_default();
    let result: UninstallResult = client.call("uninstall", json!({ "gem": gem })).await?;
    if !result.installed {
        let place = format!("in the store {}", store.display());
        report::not_installed(gem, &place, store, json);
        return Ok(ExitCode::SUCCESS);
    }
    let after = if result.kept.is_empty() {
        Vec::new()
    } else {
        client.call::<StatusResult>("status", json!({})).await?.gems
    };
    report::print_uninstalled(&result, &before, &after, json);
    Ok(ExitCode::SUCCESS)
}

/// `sync`: every missing required file queued now (a failed one retried),
/// then waited for.
async fn sync(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let show = Show {
        json,
        output: Output::Stderr,
        failures: true,
    };
    let watcher = watch(client, None, show).await?;
    let result: StatusResult = client.call("status", json!({})).await?;
    let mut queued = 0;
    for gem in &result.gems {
        for r in gem.resources.iter().filter(|r| r.required) {
            let method = match r.state {
                ResourceState::Present { .. }
                | ResourceState::Queued
                | ResourceState::Downloading { .. }
                | ResourceState::Retrying { .. }
                | ResourceState::Waiting { .. } => continue,
                ResourceState::Failed { .. } => "retry",
                _ => "download_now",
            };
            let _: Value = client
                .call(method, json!({ "gem": gem.gem, "id": r.id }))
                .await?;
            queued += 1;
        }
    }
    let status = settled(client, None).await?;
    watcher.stop().await;
    Ok(report::print_sync(queued, &status, json))
}

fn fail(e: &Error, json: bool) -> anyhow::Result<ExitCode> {
    Ok(render::fail(e, json))
}
