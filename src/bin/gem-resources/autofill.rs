//! `autofill URL` and `autofill --manifest FILE [--all] [--write]`: size
//! and SHA-256 by the download rules (redirects, policy, retries, mirrors),
//! keeping nothing.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use gem_resources::manifest::fill::{fill_text, parse_unfilled, Fill, Unfilled};
use gem_resources::service::autofill::{
    agrees, check_every_address, short, AddressReport, Changed,
};
use gem_resources::transfer::autofill::{autofill_addresses, Filled};
use gem_resources::{Config, Error, Fetcher};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::context::FAILED;
use crate::progress::{Bar, Reporting};
use crate::render::{self, print_json};

mod check;

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
    /// Read each resource only until an address answers (no mirror check).
    pub url_only: bool,
    /// Compare what is read with what the manifest declares: a
    /// difference is a failure, never a replacement.
    pub check: bool,
}

/// Runs `autofill`.
pub async fn run(
    config: &Config,
    request: Request<'_>,
    json: bool,
    no_service: bool,
) -> anyhow::Result<ExitCode> {
    if request.manifest.is_none() && (request.all || request.write || request.url_only) {
        anyhow::bail!("--all, --write and --url-only go with --manifest FILE");
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
    let filled = outcome?;
    let read = gem_resources::api::protocol::Autofilled {
        size: filled.transfer.size,
        sha256: filled.transfer.sha256,
        served_by: filled.address.to_string(),
        final_url: Some(filled.transfer.final_url.to_string()),
    };
    print_one(&url, &read, json);
    Ok(ExitCode::SUCCESS)
}

/// `autofill URL`'s output, in process or from a service: the values, a
/// snippet to paste into the resource's entry, and which address the
/// manifest should declare when the one given redirected or looks signed.
fn print_one(given: &Url, read: &gem_resources::api::protocol::Autofilled, json: bool) {
    let final_url = read
        .final_url
        .as_deref()
        .and_then(|f| Url::parse(f).ok())
        .unwrap_or_else(|| given.clone());
    let advice = Advice::of(given, &final_url);
    if json {
        render::print_doc(
            json!({
                "size": read.size,
                "sha256": read.sha256,
                "url": given.as_str(),
                "final_url": final_url.as_str(),
                "served_by": read.served_by,
                "manifest_url": advice.declare.as_str(),
            }),
            true,
        );
        return;
    }
    crate::outln!("size: {}", read.size);
    crate::outln!("sha256: {}", read.sha256);
    if final_url != *given {
        crate::outln!("final url: {final_url}");
    }
    crate::outln!("\"size\": {}, \"sha256\": \"{}\"", read.size, read.sha256);
    if let Some(note) = advice.note {
        if !crate::progress::quiet() {
            crate::errln!("{note}");
        }
    }
}

/// Which address a manifest should declare for what `autofill URL` read.
struct Advice {
    /// The address to put in `"url"`.
    declare: Url,
    /// What to tell the author, when there is anything to tell.
    note: Option<String>,
}

impl Advice {
    /// The address given, unless it is signed or expiring and the final
    /// one is not: a redirect's target may move or expire, while the
    /// address the author chose is the one meant to last.
    fn of(given: &Url, final_url: &Url) -> Advice {
        use gem_resources::transfer::autofill::expiring_parameter;
        let shown = |u: &Url| crate::text::elide_query(u.as_str()).into_owned();
        let (given_expires, final_expires) =
            (expiring_parameter(given), expiring_parameter(final_url));
        match (given_expires, final_url == given) {
            (None, true) => Advice {
                declare: given.clone(),
                note: None,
            },
            (None, false) => Advice {
                declare: given.clone(),
                note: Some(format!(
                    "note: it redirected to {}; put the address you gave in the manifest (\"url\": \"{given}\"): the final one is where it led this time{}",
                    shown(final_url),
                    if final_expires.is_some() { ", and it is signed and will expire" } else { "" }
                )),
            },
            (Some(param), false) if final_expires.is_none() => Advice {
                declare: final_url.clone(),
                note: Some(format!(
                    "note: the address you gave is signed or expiring ({param}); put the final one in the manifest (\"url\": \"{final_url}\")"
                )),
            },
            (Some(param), _) => Advice {
                declare: given.clone(),
                note: Some(format!(
                    "warning: the address is signed or expiring ({param}), so a manifest declaring it stops working; declare a lasting address of the file"
                )),
            },
        }
    }
}

fn interrupted_exit() -> ExitCode {
    crate::progress::clear_all();
    crate::interrupt::say("interrupted: nothing was kept", json!({}));
    ExitCode::from(crate::interrupt::INTERRUPTED)
}

/// The last path segment of `url`, for a progress bar.
fn file_label(url: &Url) -> String {
    url.path_segments()
        .and_then(|mut s| s.next_back().map(str::to_string))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| url.host_str().unwrap_or_default().to_string())
}

/// What was read of one resource, and how each of its addresses answered
/// (empty with `--url-only`).
type Read = (Unfilled, Result<Filled, Error>, Vec<AddressReport>);

/// The outcome for one resource.
struct Outcome {
    entry: Unfilled,
    /// The values to write, or why there are none.
    outcome: Result<Filled, Error>,
    /// How each of its addresses answered (empty with `--url-only`).
    checked: Vec<AddressReport>,
    /// What it declares that differs from what was read: replaced with
    /// `--all`, a problem without.
    changed: Changed,
}

async fn manifest(
    config: &Config,
    path: &Path,
    request: &Request<'_>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    render::manifest_file(path);
    let in_file = |e: Error| crate::context::in_file(e, path);
    let bytes = crate::context::read_manifest_bytes(path)?;
    let entries = parse_unfilled(&bytes).map_err(|e| in_file(e.into()))?;
    let text = String::from_utf8(bytes).context("the manifest is not UTF-8")?;
    let selected: Vec<Unfilled> = entries
        .into_iter()
        .filter(|e| request.all || e.lacks_any())
        .collect();
    let fetcher = crate::context::fetcher(config)?;
    let cancel = CancellationToken::new();
    let url_only = request.url_only;
    let one = |entry: Unfilled| {
        let (fetcher, cancel) = (&fetcher, &cancel);
        async move {
            let addresses: Vec<Url> = entry.resource.addresses().cloned().collect();
            let id = entry.resource.id.clone();
            let (outcome, checked) = if url_only {
                let outcome = read(config, fetcher, &id, &addresses, json, cancel).await;
                (outcome, Vec::new())
            } else {
                // Each address on a bar of its own.
                let one_address = |index: usize, address: Url| {
                    let label = match index {
                        0 => id.clone(),
                        n => format!("{id} (mirror {n})"),
                    };
                    async move { read(config, fetcher, &label, &[address], json, cancel).await }
                };
                check_every_address(&id, &addresses, one_address).await
            };
            (entry, outcome, checked)
        }
    };
    let parallel = config.service.max_concurrent_downloads.max(1);
    // A slot takes the next entry as soon as its own ends; the outcomes
    // come back in the manifest's order.
    let all = crate::context::unordered(selected.into_iter().map(one), parallel);
    let all = async {
        let reads: Vec<Read> = all.await;
        reads
    };
    tokio::pin!(all);
    let mut interrupted = crate::interrupt::signal();
    let outcomes = tokio::select! {
        outcomes = &mut all => outcomes,
        () = &mut interrupted => {
            cancel.cancel();
            return Ok(interrupted_exit());
        }
    };
    if request.check {
        return Ok(check::report(path, &outcomes, json));
    }
    let outcomes: Vec<Outcome> = outcomes
        .into_iter()
        .map(|(entry, read, checked)| {
            let changed = read
                .as_ref()
                .map(|filled| Changed::of(&entry, filled))
                .unwrap_or_default();
            let outcome = read.and_then(|filled| agrees(&entry, filled, request.all));
            Outcome {
                entry,
                outcome,
                checked,
                changed,
            }
        })
        .collect();
    let fills =
        gem_resources::service::autofill::fills_of(outcomes.iter().map(|o| (&o.entry, &o.outcome)));
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

/// Prints what was filled, what failed and how each address answered;
/// true when something failed or an address disagreed.
fn report(path: &Path, outcomes: &[Outcome], text: &str, write: bool, json: bool) -> bool {
    let failed = outcomes
        .iter()
        .any(|o| o.outcome.is_err() || o.checked.iter().any(|a| !a.ok));
    let written = write && outcomes.iter().any(|o| o.outcome.is_ok());
    if json {
        let resources: Vec<serde_json::Value> = outcomes
            .iter()
            .map(|o| {
                let mut value = match &o.outcome {
                    // The verdict, as the local API gives it.
                    Ok(filled) => json!({
                        "id": o.entry.resource.id,
                        "size": filled.transfer.size,
                        "sha256": filled.transfer.sha256,
                        "served_by": filled.address.as_str(),
                        "ok": o.checked.iter().all(|a| a.ok),
                        "disagreeing": o.checked.iter().filter(|a| !a.ok).map(|a| a.role.as_str()).collect::<Vec<_>>(),
                    }),
                    Err(e) => {
                        let mut value = render::error_json(e);
                        value["id"] = json!(o.entry.resource.id);
                        value
                    }
                };
                if let Some(replaced) = replaced_json(o) {
                    value["replaced"] = replaced;
                }
                if !o.checked.is_empty() {
                    value["addresses"] = json!(o.checked);
                }
                value
            })
            .collect();
        let manifest: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        print_json(&json!({
            "ok": !failed,
            "file": path,
            "written": written,
            "resources": resources,
            "manifest": manifest,
        }));
        return failed;
    }
    let mut wrong = 0;
    for o in outcomes {
        let id = &o.entry.resource.id;
        address_lines(id, &o.checked);
        match &o.outcome {
            Ok(filled) => change_line(
                &o.entry,
                filled.transfer.size,
                &filled.transfer.sha256,
                &o.changed,
            ),
            Err(_) if !o.changed.is_empty() => {
                wrong += 1;
                crate::errln!("wrong: {id}: {}", wrong_values(o));
            }
            Err(e) => crate::errln!(
                "not filled: {id}: {}",
                render::with_manifest_file(&render::error_text(e))
            ),
        }
    }
    let file = crate::platform::shell_word(&path.display().to_string());
    if wrong > 0 {
        crate::errln!(
            "error: {wrong} resource(s) declare values their addresses do not serve; `gem-resources autofill --manifest {file} --all --write` replaces them"
        );
    }
    if outcomes.is_empty() {
        crate::errln!(
            "nothing to fill: every resource has size and sha256 (`gem-resources autofill --manifest {file} --check` compares them with what the addresses serve; --all --write replaces them)"
        );
    }
    if written {
        let changes = outcomes
            .iter()
            .filter(|o| o.outcome.is_ok())
            .map(|o| (&o.entry, o.changed.is_empty()));
        wrote_line(path, changes);
    } else if !write {
        crate::render::write_out_exact(format_args!("{}", text.trim_end_matches('\n')));
    }
    failed
}

/// `wrote FILE: 1 filled, 1 updated, 2 unchanged`, from each resource
/// written and whether its declared values stayed.
fn wrote_line<'a>(path: &Path, written: impl Iterator<Item = (&'a Unfilled, bool)>) {
    let (mut filled, mut updated, mut unchanged) = (0, 0, 0);
    for (entry, same) in written {
        match (same, entry.lacks_any()) {
            (false, _) => updated += 1,
            (true, true) => filled += 1,
            (true, false) => unchanged += 1,
        }
    }
    let mut parts = vec![format!("{filled} filled"), format!("{updated} updated")];
    if unchanged > 0 {
        parts.push(format!("{unchanged} unchanged"));
    }
    crate::errln!("wrote {}: {}", path.display(), parts.join(", "));
}

/// The values a resource declared, when `--all` replaced them.
fn replaced_json(o: &Outcome) -> Option<serde_json::Value> {
    if o.outcome.is_err() || o.changed.is_empty() {
        return None;
    }
    let (size, sha256) = (&o.entry.resource.size, &o.entry.resource.sha256);
    Some(json!({
        "size": (!o.entry.lacks_size).then_some(size),
        "sha256": (!o.entry.lacks_sha256).then_some(sha256),
    }))
}

/// `Filling a: size 3000, sha256 b43f…` for values a resource lacked,
/// `Updating b: size 5 → 7, sha256 0000… → b43f…` for values `--all`
/// replaced (as `cargo update` lists versions); nothing for a resource
/// whose values stay.
fn change_line(entry: &Unfilled, size: u64, sha256: &str, changed: &Changed) {
    let id = &entry.resource.id;
    if !changed.is_empty() {
        let mut parts = vec![changed.to_string()];
        if entry.lacks_size {
            parts.push(format!("size {size}"));
        }
        if entry.lacks_sha256 {
            parts.push(format!("sha256 {}", short(sha256)));
        }
        crate::errln!("Updating {id}: {}", parts.join(", "));
    } else if entry.lacks_any() {
        let mut parts = Vec::new();
        if entry.lacks_size {
            parts.push(format!("size {size}"));
        }
        if entry.lacks_sha256 {
            parts.push(format!("sha256 {}", short(sha256)));
        }
        crate::errln!("Filling {id}: {}", parts.join(", "));
    }
}

/// What a resource declares that its address does not serve:
/// `https://…/b.bin serves size 7, sha256 b43f…; the manifest says size 5, sha256 0000…`.
fn wrong_values(o: &Outcome) -> String {
    let mut served = Vec::new();
    let mut declared = Vec::new();
    if let Some((old, new)) = &o.changed.size {
        served.push(format!("size {new}"));
        declared.push(format!("size {old}"));
    }
    if let Some((old, new)) = &o.changed.sha256 {
        served.push(format!("sha256 {}", short(new)));
        declared.push(format!("sha256 {}", short(old)));
    }
    let address = match &o.outcome {
        Err(Error::Unavailable { attempts, .. }) => attempts
            .first()
            .map(|a| crate::text::elide_query(a.address.as_str()).into_owned())
            .unwrap_or_default(),
        _ => String::new(),
    };
    format!(
        "{address} serves {}; the manifest says {}",
        served.join(", "),
        declared.join(", ")
    )
}

/// How each address of a resource with mirrors answered, one line each on
/// stderr: `ID: mirror 1: ok`, `ID: mirror 2: HTTP status 404
/// (E_RESOURCE_HTTP: ADDRESS)`, `ID: mirror 1: SHA-256 differs from the
/// url's (…)`. With `--quiet`, only the addresses that disagree.
fn address_lines(id: &str, checked: &[AddressReport]) {
    if checked.len() < 2 {
        return;
    }
    for a in checked {
        match (&a.problem, a.code) {
            (Some(problem), Some(code)) => {
                let address = crate::text::elide_query(&a.address);
                let at = a.hop.as_deref().map_or(String::new(), |hop| {
                    format!(" at its redirect to {}", crate::text::elide_query(hop))
                });
                crate::errln!("{id}: {}: {problem}{at} ({code}: {address})", a.role);
            }
            (Some(problem), None) => crate::errln!("{id}: {}: {problem}", a.role),
            (None, _) if !crate::progress::quiet() => crate::errln!("{id}: {}: ok", a.role),
            (None, _) => {}
        }
    }
}

/// Replaces the file `path` names with `text` atomically: a temporary file
/// in the folder of the file itself (through any symbolic link, which
/// stays a link), flushed, given the file's permission bits (never its
/// setuid, setgid or sticky bits), renamed over it.
fn write_back(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let context = || format!("cannot write {}", path.display());
    let target = std::fs::canonicalize(path).with_context(context)?;
    let folder = target.parent().unwrap_or(Path::new("."));
    let meta = std::fs::metadata(&target).with_context(context)?;
    anyhow::ensure!(
        meta.is_file(),
        "cannot write {}: {} is not a regular file",
        path.display(),
        target.display()
    );
    let permissions = crate::platform::permission_bits(meta.permissions());
    let mut file = tempfile::NamedTempFile::new_in(folder).with_context(context)?;
    file.write_all(text.as_bytes()).with_context(context)?;
    file.as_file().sync_all().with_context(context)?;
    file.as_file()
        .set_permissions(permissions)
        .with_context(context)?;
    file.persist(&target)
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
    tracing::debug!(socket = client.socket(), "using the service's local API");
    let mut interrupted = crate::interrupt::signal();
    let Some(path) = request.manifest else {
        let text = request.url.unwrap_or_default();
        let call = client.call::<Autofilled>("autofill", json!({ "url": text }));
        let filled = tokio::select! {
            filled = call => filled?,
            () = &mut interrupted => return Ok(interrupted_exit()),
        };
        let given = Url::parse(text).with_context(|| format!("not a valid URL: {text:?}"))?;
        print_one(&given, &filled, json);
        return Ok(ExitCode::SUCCESS);
    };
    render::manifest_file(path);
    let in_file = |e: Error| crate::context::in_file(e, path);
    let bytes = crate::context::read_manifest_bytes(path)?;
    let entries = parse_unfilled(&bytes).map_err(|e| in_file(e.into()))?;
    let text = String::from_utf8(bytes).context("the manifest is not UTF-8")?;
    let manifest =
        gem_resources::manifest::parse_json(text.as_bytes()).map_err(|e| in_file(e.into()))?;
    let call = client.call::<AutofillReport>(
        "autofill",
        json!({ "manifest": manifest, "all": request.all, "url_only": request.url_only }),
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
        let entry_of = |id: &str| entries.iter().find(|e| e.resource.id == id);
        let mut written = Vec::new();
        for r in &report.resources {
            match r {
                FilledResource::Filled {
                    id,
                    addresses,
                    size,
                    sha256,
                    ..
                } => {
                    address_lines(id, addresses);
                    if let Some(entry) = entry_of(id) {
                        let changed = Changed::between(entry, *size, sha256);
                        change_line(entry, *size, sha256, &changed);
                        written.push((entry, changed.is_empty()));
                    }
                }
                FilledResource::Failed {
                    id,
                    addresses,
                    error,
                    ..
                } => {
                    address_lines(id, addresses);
                    crate::errln!(
                        "not filled: {id}: {}",
                        render::failure_text(error.code, &error.message)
                    );
                }
                _ => {}
            }
        }
        if report.resources.is_empty() {
            let file = crate::platform::shell_word(&path.display().to_string());
            crate::errln!(
                "nothing to fill: every resource has size and sha256 (`gem-resources autofill --manifest {file} --check` compares them with what the addresses serve; --all --write replaces them)"
            );
        }
        if request.write && !fills.is_empty() {
            wrote_line(path, written.into_iter());
        } else if !request.write {
            crate::render::write_out_exact(format_args!("{}", filled_text.trim_end_matches('\n')));
        }
    }
    Ok(if failed {
        ExitCode::from(FAILED)
    } else {
        ExitCode::SUCCESS
    })
}
