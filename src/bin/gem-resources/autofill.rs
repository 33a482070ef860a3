//! `autofill URL` and `autofill --manifest FILE [--all] [--write]`: size
//! and SHA-256 by the download rules (redirects, policy, retries, mirrors),
//! keeping nothing.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use gem_resources::manifest::fill::{fill_text, parse_unfilled, Fill, Unfilled};
use gem_resources::transfer::autofill::{autofill_addresses, Filled};
use gem_resources::{Config, Error, Fetcher};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::context::FAILED;
use crate::progress::{Bar, Reporting};
use crate::render::{self, print_json};

/// What `autofill` was asked.
pub struct Request<'a> {
    /// One address, or
    pub url: Option<&'a str>,
    /// a manifest file.
    pub manifest: Option<&'a Path>,
    /// Every resource of the manifest, not only those lacking a value.
    pub all: bool,
    /// Write the manifest back instead of printing it.
    pub write: bool,
}

/// Runs `autofill`.
pub async fn run(
    config: &Config,
    request: Request<'_>,
    json: bool,
    no_service: bool,
) -> anyhow::Result<ExitCode> {
    if request.manifest.is_none() && (request.all || request.write) {
        anyhow::bail!("--all and --write go with --manifest FILE");
    }
    // A service listening on the store reads under its live policy.
    if let Some(client) = crate::remote::client(config, no_service).await {
        return remote(&client, &request, json).await;
    }
    match (request.manifest, request.url) {
        (Some(path), _) => manifest(config, path, &request, json).await,
        (None, Some(url)) => one_url(config, url, json).await,
        (None, None) => anyhow::bail!("give a URL or --manifest FILE"),
    }
}

/// Reads `addresses` by the download rules, drawing a bar labelled
/// `label`, until `cancel` fires.
async fn read(
    config: &Config,
    fetcher: &Fetcher,
    label: &str,
    addresses: &[Url],
    json: bool,
    cancel: &CancellationToken,
) -> Result<Filled, Error> {
    let mut bar = Bar::new(label, None, json);
    let outcome = {
        let mut reporting = Reporting::new(&bar, label, json);
        autofill_addresses(
            fetcher,
            label,
            addresses,
            config.network.autofill_max_bytes,
            config.retry_policy(),
            &mut reporting,
            Some(cancel),
        )
        .await
    };
    bar.finish();
    outcome
}

async fn one_url(config: &Config, text: &str, json: bool) -> anyhow::Result<ExitCode> {
    let url = Url::parse(text).with_context(|| format!("not a valid URL: {text:?}"))?;
    let fetcher = crate::context::fetcher(config)?;
    let cancel = CancellationToken::new();
    let mut interrupted = crate::interrupt::signal();
    let label = file_label(&url);
    let outcome = tokio::select! {
        r = read(config, &fetcher, &label, std::slice::from_ref(&url), json, &cancel) => Some(r),
        () = &mut interrupted => None,
    };
    let Some(outcome) = outcome else {
        return Ok(interrupted_exit());
    };
    let transfer = outcome?.transfer;
    if json {
        print_json(&json!({
            "size": transfer.size,
            "sha256": transfer.sha256,
            "url": url.as_str(),
            "final_url": transfer.final_url.as_str(),
        }));
    } else {
        crate::outln!("size: {}", transfer.size);
        crate::outln!("sha256: {}", transfer.sha256);
        if transfer.final_url != url {
            crate::outln!("final url: {}", transfer.final_url);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn interrupted_exit() -> ExitCode {
    crate::progress::clear_all();
    crate::errln!("interrupted: nothing was kept");
    ExitCode::from(crate::interrupt::INTERRUPTED)
}

/// The last path segment of `url`, for a progress bar.
fn file_label(url: &Url) -> String {
    url.path_segments()
        .and_then(|mut s| s.next_back().map(str::to_string))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| url.host_str().unwrap_or_default().to_string())
}

/// The outcome for one resource.
type Outcome = (Unfilled, Result<Filled, Error>);

async fn manifest(
    config: &Config,
    path: &Path,
    request: &Request<'_>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let in_file = |e: Error| crate::context::in_file(e, path);
    let bytes = gem_resources::manifest::read_manifest_file(path).map_err(in_file)?;
    let entries = parse_unfilled(&bytes).map_err(|e| in_file(e.into()))?;
    let text = String::from_utf8(bytes).context("the manifest is not UTF-8")?;
    let selected: Vec<Unfilled> = entries
        .into_iter()
        .filter(|e| request.all || e.lacks_any())
        .collect();
    let fetcher = crate::context::fetcher(config)?;
    let cancel = CancellationToken::new();
    let one = |entry: Unfilled| {
        let (fetcher, cancel) = (&fetcher, &cancel);
        async move {
            let addresses: Vec<Url> = entry.resource.addresses().cloned().collect();
            let outcome = read(
                config,
                fetcher,
                &entry.resource.id,
                &addresses,
                json,
                cancel,
            )
            .await
            .and_then(|filled| gem_resources::service::autofill::agrees(&entry, filled));
            (entry, outcome)
        }
    };
    let parallel = config.service.max_concurrent_downloads.max(1);
    // A slot takes the next entry as soon as its own ends; the outcomes
    // come back in the manifest's order.
    let all = crate::context::unordered(selected.into_iter().map(one), parallel);
    tokio::pin!(all);
    let mut interrupted = crate::interrupt::signal();
    let outcomes = tokio::select! {
        outcomes = &mut all => outcomes,
        () = &mut interrupted => {
            cancel.cancel();
            return Ok(interrupted_exit());
        }
    };
    let fills: Vec<Fill> = outcomes
        .iter()
        .filter_map(|(entry, outcome)| {
            let filled = outcome.as_ref().ok()?;
            Some(Fill {
                index: entry.index,
                size: filled.transfer.size,
                sha256: filled.transfer.sha256.clone(),
            })
        })
        .collect();
    let filled_text =
        fill_text(&text, &fills).context("the manifest changed its shape while it was read")?;
    if request.write && !fills.is_empty() {
        write_back(path, &filled_text)?;
    }
    let failed = report(path, &outcomes, &filled_text, request.write, json);
    Ok(if failed {
        ExitCode::from(FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

/// Prints what was filled and what failed; true when something failed.
fn report(path: &Path, outcomes: &[Outcome], text: &str, written: bool, json: bool) -> bool {
    let failed = outcomes.iter().any(|(_, o)| o.is_err());
    if json {
        let resources: Vec<serde_json::Value> = outcomes
            .iter()
            .map(|(entry, outcome)| match outcome {
                Ok(filled) => json!({
                    "id": entry.resource.id,
                    "size": filled.transfer.size,
                    "sha256": filled.transfer.sha256,
                    "served_by": filled.address.as_str(),
                }),
                Err(e) => {
                    let mut value = render::error_json(e);
                    value["id"] = json!(entry.resource.id);
                    value
                }
            })
            .collect();
        let manifest: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        print_json(&json!({
            "ok": !failed,
            "file": path,
            "written": written && outcomes.iter().any(|(_, o)| o.is_ok()),
            "resources": resources,
            "manifest": manifest,
        }));
        return failed;
    }
    for (entry, outcome) in outcomes {
        if let Err(e) = outcome {
            crate::errln!(
                "not filled: {}: {}",
                entry.resource.id,
                render::error_text(e)
            );
        }
    }
    let filled = outcomes.iter().filter(|(_, o)| o.is_ok()).count();
    if written {
        crate::errln!("filled {filled} resource(s) in {}", path.display());
    } else {
        crate::render::write_out_exact(format_args!("{}", text.trim_end_matches('\n')));
        if outcomes.is_empty() {
            crate::errln!(
                "nothing to fill: every resource has size and sha256 (--all reads them all again)"
            );
        }
    }
    failed
}

/// Replaces `path` with `text` atomically: a temporary file in the same
/// folder, flushed, given the file's permissions, renamed over it.
fn write_back(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let context = || format!("cannot write {}", path.display());
    let permissions = std::fs::metadata(path).with_context(context)?.permissions();
    let mut file = tempfile::NamedTempFile::new_in(folder).with_context(context)?;
    file.write_all(text.as_bytes()).with_context(context)?;
    file.as_file().sync_all().with_context(context)?;
    file.as_file()
        .set_permissions(permissions)
        .with_context(context)?;
    file.persist(path)
        .map_err(|e| e.error)
        .with_context(context)?;
    Ok(())
}

/// `autofill` through the service's local API.
async fn remote(
    client: &gem_resources::api::Client,
    request: &Request<'_>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use gem_resources::api::protocol::Autofilled;
    use gem_resources::service::autofill::{AutofillReport, FilledResource};
    let mut interrupted = crate::interrupt::signal();
    let Some(path) = request.manifest else {
        let text = request.url.unwrap_or_default();
        let call = client.call::<Autofilled>("autofill", json!({ "url": text }));
        let filled = tokio::select! {
            filled = call => filled?,
            () = &mut interrupted => return Ok(interrupted_exit()),
        };
        if json {
            print_json(&json!({
                "size": filled.size,
                "sha256": filled.sha256,
                "url": text,
                "served_by": filled.served_by,
            }));
        } else {
            crate::outln!("size: {}", filled.size);
            crate::outln!("sha256: {}", filled.sha256);
        }
        return Ok(ExitCode::SUCCESS);
    };
    let in_file = |e: Error| crate::context::in_file(e, path);
    let bytes = gem_resources::manifest::read_manifest_file(path).map_err(in_file)?;
    let entries = parse_unfilled(&bytes).map_err(|e| in_file(e.into()))?;
    let text = String::from_utf8(bytes).context("the manifest is not UTF-8")?;
    let manifest: serde_json::Value = serde_json::from_str(&text)?;
    let call = client.call::<AutofillReport>(
        "autofill",
        json!({ "manifest": manifest, "all": request.all }),
    );
    let report = tokio::select! {
        report = call => report?,
        () = &mut interrupted => return Ok(interrupted_exit()),
    };
    // The values go into this file's own text, its layout kept.
    let fills: Vec<Fill> = report
        .resources
        .iter()
        .filter_map(|r| match r {
            FilledResource::Filled {
                id, size, sha256, ..
            } => {
                let entry = entries.iter().find(|e| &e.resource.id == id)?;
                Some(Fill {
                    index: entry.index,
                    size: *size,
                    sha256: sha256.clone(),
                })
            }
            _ => None,
        })
        .collect();
    let filled_text =
        fill_text(&text, &fills).context("the manifest changed its shape while it was read")?;
    if request.write && !fills.is_empty() {
        write_back(path, &filled_text)?;
    }
    let failed = !report.ok;
    if json {
        print_json(&json!({
            "ok": report.ok,
            "file": path,
            "written": request.write && !fills.is_empty(),
            "resources": report.resources,
            "manifest": report.manifest,
        }));
    } else {
        for r in &report.resources {
            if let FilledResource::Failed { id, error, .. } = r {
                crate::errln!("not filled: {id}: {}: {}", error.code, error.message);
            }
        }
        if request.write {
            crate::errln!("filled {} resource(s) in {}", fills.len(), path.display());
        } else {
            crate::render::write_out_exact(format_args!("{}", filled_text.trim_end_matches('\n')));
        }
    }
    Ok(if failed {
        ExitCode::from(FAILED)
    } else {
        ExitCode::SUCCESS
    })
}
