//! One function per subcommand: call the library, render the outcome.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use gem_resources::{download_with, Config, Error, Fetcher, Resource, RetryPolicy, Route, Store};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::cli::{Args, Command};
use crate::context::{read_manifest, warn_dev, FAILED, USAGE};
use crate::render::{self, print_json};

/// Runs the parsed command line.
pub async fn run(args: Args) -> ExitCode {
    let json = args.json;
    match dispatch(args).await {
        Ok(code) => code,
        Err(e) => {
            // Library errors carry their code; anything else is a usage or
            // environment problem reported with its context.
            match e.downcast_ref::<Error>() {
                Some(err) => report_error(err, json),
                None if json => render::print_doc(
                    json!({ "code": "E_RESOURCE_USAGE", "primary_cause": "E_RESOURCE_USAGE", "message": format!("{e:#}") }),
                    false,
                ),
                None => crate::errln!("error: {e:#}"),
            }
            let usage = e.downcast_ref::<Error>().is_none();
            ExitCode::from(if usage { USAGE } else { FAILED })
        }
    }
}

fn report_error(e: &Error, json: bool) {
    if json {
        render::print_doc(render::error_json(e), false);
    } else {
        crate::errln!("{}", render::error_text(e));
    }
}

async fn dispatch(args: Args) -> anyhow::Result<ExitCode> {
    let config = load_config(&args)?;
    let json = args.json;
    match args.command {
        Command::Check { manifest } => crate::check::run(&config, &manifest, json),
        Command::CheckUrl { url } => check_url(&config, &url, json).await,
        Command::Autofill {
            url,
            manifest,
            all,
            write,
            url_only,
            check,
        } => {
            let request = crate::autofill::Request {
                url: url.as_deref(),
                manifest: manifest.as_deref(),
                // A check reads every resource.
                all: all || check,
                write,
                url_only,
                check,
            };
            // A check compares in this process (the service replaces values).
            let no_service = args.no_service || check;
            crate::autofill::run(&config, request, json, no_service).await
        }
        Command::Fetch { manifest, ids } => fetch(&config, &manifest, &ids, json).await,
        Command::Import { files } => crate::import::run(&config, &files, json).await,
        Command::Gc { dry_run } => crate::gc::run(&config, dry_run, json).await,
        Command::Cache { action } => crate::cache::run(&config, action, json).await,
        other => crate::service_commands::run(&config, other, json, args.no_service).await,
    }
}

fn load_config(args: &Args) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::load(path).map_err(|e| config_file_error(e, path))?,
        None => match Config::default_path().filter(|p| p.is_file()) {
            Some(path) => Config::load(&path)?,
            None => Config::default(),
        },
    };
    crate::reload::Overrides::of(args).apply(&mut config);
    Ok(config)
}

/// A configuration file that cannot be read is a configuration error
/// naming the file and the option that named it.
fn config_file_error(e: Error, path: &Path) -> Error {
    match e {
        Error::Io { source, .. } => Error::Config(format!(
            "{}: cannot read the configuration file given by --config: {}",
            path.display(),
            source
        )),
        other => other,
    }
}

fn parse_url(text: &str) -> anyhow::Result<Url> {
    Url::parse(text).with_context(|| format!("not a valid URL: {text:?}"))
}

async fn check_url(config: &Config, text: &str, json: bool) -> anyhow::Result<ExitCode> {
    warn_dev(config);
    let url = parse_url(text)?;
    let fetcher = crate::context::fetcher(config)?;
    let checked = match fetcher.route(&url).await {
        Ok(Route::Direct) => fetcher.check_url(&url).await.map(|a| (a, None)),
        Ok(Route::Proxy {
            proxy,
            connect,
            addresses,
        }) => Ok((addresses, Some((proxy, connect)))),
        Err(e) => Err(e),
    };
    match checked {
        Ok((addresses, proxy)) => {
            if json {
                let proxy = proxy.map(|(p, c)| json!({ "url": p, "connect": c }));
                render::print_doc(
                    json!({ "url": url.as_str(), "allowed": true, "addresses": addresses, "proxy": proxy }),
                    true,
                );
            } else {
                let list: Vec<String> = addresses.iter().map(|a| a.to_string()).collect();
                if list.is_empty() {
                    crate::outln!("allowed: {url}");
                } else {
                    crate::outln!("allowed: {url} ({})", list.join(", "));
                }
                match proxy {
                    Some((p, c)) => crate::outln!("  through the proxy {p}: CONNECT {c}"),
                    None => crate::outln!("  direct connection (no proxy)"),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            let attempt = gem_resources::Attempt {
                address: url,
                hop: None,
                error,
            };
            if json {
                // The error object every command prints (`code`,
                // `primary_cause`, `message`, `attempts`), and the verdict.
                let address = attempt.address.to_string();
                let mut value =
                    render::error_json(&gem_resources::Error::Attempt(Box::new(attempt)));
                value["allowed"] = json!(false);
                value["address"] = json!(address);
                render::print_doc(value, false);
            } else {
                crate::errln!("refused: {attempt}");
            }
            Ok(ExitCode::from(FAILED))
        }
    }
}

/// What one download of `fetch` needs, owned (it runs as a task of its
/// own).
struct FetchJob {
    fetcher: Fetcher,
    store: Store,
    cancel: CancellationToken,
    slots: std::sync::Arc<gem_resources::transfer::slots::Slots>,
    retry: RetryPolicy,
    json: bool,
}

impl FetchJob {
    /// Downloads `resource` once a slot is free, with its bar.
    async fn run(self, resource: Resource) -> (Resource, gem_resources::Result<PathBuf>) {
        let FetchJob {
            fetcher,
            store,
            cancel,
            slots,
            retry,
            json,
        } = self;
        // Once interrupted, no slot is waited for: the download then ends
        // at once, with its path when the file is stored.
        let slot = tokio::select! {
            slot = slots.take() => Some(slot),
            () = cancel.cancelled() => None,
        };
        let mut bar = crate::progress::Bar::new(&resource.id, Some(resource.size), json);
        let outcome = {
            let mut reporting = crate::progress::Reporting::new(&bar, &resource.id, json);
            reporting.slot = slot;
            download_with(
                &fetcher,
                &store,
                &resource,
                retry,
                &mut reporting,
                Some(&cancel),
            )
            .await
        };
        // The bar goes whatever happened.
        bar.finish();
        (resource, outcome)
    }
}

async fn fetch(
    config: &Config,
    path: &Path,
    ids: &[String],
    json: bool,
) -> anyhow::Result<ExitCode> {
    let manifest = read_manifest(path)?;
    for id in ids {
        if !manifest.resources.iter().any(|r| &r.id == id) {
            // As `path` says it: the ids there are, to pick from.
            let known: Vec<&str> = manifest.resources.iter().map(|r| r.id.as_str()).collect();
            let known = if known.is_empty() {
                "it declares none".to_string()
            } else {
                format!("its resources are: {}", known.join(", "))
            };
            return Err(Error::NotFound(format!(
                "{} declares no resource {id:?}; {known}",
                path.display()
            ))
            .into());
        }
    }
    let store = Store::open(&config.store_dir())?;
    let fetcher = crate::context::fetcher(config)?;
    let retry = config.retry_policy();
    let selected: Vec<&Resource> = manifest
        .resources
        .iter()
        .filter(|r| ids.is_empty() || ids.contains(&r.id))
        .collect();
    // Ctrl-C cancels every download; each keeps what it received.
    let cancel = CancellationToken::new();
    // Several at once, each slot taking the next file as soon as its own
    // transfer ends (a stalled file holds no other back; a file being made
    // durable and named holds no transfer back); reported in manifest order.
    let slots = std::sync::Arc::new(gem_resources::transfer::slots::Slots::new(
        config.service.max_concurrent_downloads,
    ));
    let jobs = slots.jobs();
    let one = |resource: &Resource| {
        let job = FetchJob {
            fetcher: fetcher.clone(),
            store: store.clone(),
            cancel: cancel.clone(),
            slots: std::sync::Arc::clone(&slots),
            retry,
            json,
        };
        // A task of its own, so the network side of the files in flight
        // runs on every worker thread, not on one.
        crate::context::spawned(job.run(resource.clone()))
    };
    let all = crate::context::unordered(selected.iter().map(|r| one(r)), jobs);
    tokio::pin!(all);
    let mut interrupted = crate::interrupt::signal();
    let (outcomes, stopped) = tokio::select! {
        outcomes = &mut all => (outcomes, false),
        () = &mut interrupted => {
            cancel.cancel();
            (all.await, true)
        }
    };
    if stopped {
        let unfinished: Vec<crate::interrupt::Unfinished> = outcomes
            .iter()
            .filter(|(_, o)| matches!(o, Err(Error::Cancelled { .. })))
            .map(|(r, _)| crate::interrupt::Unfinished {
                name: r.file_name(),
                sha256: r.sha256.clone(),
            })
            .collect();
        let completed: Vec<crate::interrupt::Completed> = outcomes
            .iter()
            .filter_map(|(r, o)| {
                let path = o.as_ref().ok()?;
                Some(crate::interrupt::Completed {
                    id: r.id.clone(),
                    path: path.clone(),
                })
            })
            .collect();
        crate::interrupt::report_with(&store, &unfinished, &completed);
        return Ok(ExitCode::from(crate::interrupt::INTERRUPTED));
    }
    let mut results = Vec::new();
    let mut failed = false;
    for (resource, outcome) in outcomes {
        match outcome {
            Ok(path) => {
                if json {
                    results.push(json!({ "id": resource.id, "path": path, "size": resource.size, "sha256": resource.sha256 }));
                } else {
                    crate::outln!("{}\t{}", resource.id, path.display());
                }
            }
            Err(e) => {
                failed = true;
                if json {
                    let mut value = render::error_json(&e);
                    value["id"] = json!(resource.id);
                    results.push(value);
                } else {
                    crate::errln!("{}", render::error_text(&e));
                }
            }
        }
    }
    if json {
        print_json(&json!({ "ok": !failed, "resources": results }));
    }
    Ok(if failed {
        ExitCode::from(FAILED)
    } else {
        ExitCode::SUCCESS
    })
}
