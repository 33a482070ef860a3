//! Text for people of the service's reports: install summaries, status and
//! verify.

use std::collections::BTreeSet;

use gem_resources::{GemStatus, InstallReport, ResourceState, ResourceStatus, VerifyReport};

use crate::render;
use crate::text::field;

/// What waiting for an install's downloads came to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Files in the store now.
    pub present: usize,
    /// Of those, downloaded by this install.
    pub downloaded: usize,
    /// Files whose download failed, and the distinct codes.
    pub failed: usize,
    /// The failures' codes, each once.
    pub codes: BTreeSet<String>,
    /// Lazy files not downloaded yet (they download at the first `path`).
    pub lazy: usize,
    /// Required files neither present nor failed (stopped, or downloading
    /// in another process).
    pub missing: usize,
}

impl Outcome {
    /// Reads a gem's status after its install's downloads have ended.
    pub fn of(report: &InstallReport, status: &[GemStatus]) -> Outcome {
        let mut out = Outcome::default();
        for r in status.iter().flat_map(|g| &g.resources) {
            match &r.state {
                ResourceState::Present { .. } => out.present += 1,
                ResourceState::Failed { failure, .. } => {
                    out.failed += 1;
                    out.codes.insert(failure.code.to_string());
                }
                _ if !r.required => out.lazy += 1,
                _ => out.missing += 1,
            }
        }
        out.downloaded = out.present.saturating_sub(report.present);
        out
    }
}

/// `installed g: 2 present, 1 downloaded, 1 failed (E_…, see `status`)`.
pub fn install_summary(report: &InstallReport, outcome: &Outcome) -> String {
    let mut parts = vec![format!("{} present", outcome.present - outcome.downloaded)];
    if outcome.downloaded > 0 {
        parts.push(format!("{} downloaded", outcome.downloaded));
    }
    if outcome.failed > 0 {
        let codes: Vec<&str> = outcome.codes.iter().map(String::as_str).collect();
        parts.push(format!(
            "{} failed ({}, see `status`)",
            outcome.failed,
            codes.join(", ")
        ));
    }
    if outcome.missing > 0 {
        parts.push(format!("{} missing", outcome.missing));
    }
    if outcome.lazy > 0 {
        parts.push(format!("{} on first use", outcome.lazy));
    }
    if !report.deleted.is_empty() {
        parts.push(format!("{} deleted", report.deleted.len()));
    }
    format!("{}: {}", headline(report), parts.join(", "))
}

/// An install report as JSON (an unchanged reinstall is no upgrade: the
/// report says so itself).
pub fn report_json(report: &InstallReport) -> serde_json::Value {
    serde_json::to_value(report).unwrap_or_default()
}

/// `installed g`, `upgraded g` or `g is unchanged`, and who keeps the gem
/// when that is news: someone else (`g is unchanged; kept by serve's gems
/// folder /srv/gems …`), or the command line since this install took it
/// over (`…; now kept by the command line (was …)`).
pub fn headline(report: &InstallReport) -> String {
    let what = if report.unchanged {
        format!("{} is unchanged", report.gem)
    } else if report.upgrade {
        format!("upgraded {}", report.gem)
    } else {
        format!("installed {}", report.gem)
    };
    match (&report.taken_from, &report.installed_by) {
        (Some(was), Some(now)) => format!(
            "{what}; now kept by {} (was {})",
            now.describe(),
            was.describe()
        ),
        (None, Some(owner)) if *owner != gem_resources::InstalledBy::Cli => format!(
            "{what}; kept by {} (`install --take-over` makes it the command line's)",
            owner.describe()
        ),
        _ => what,
    }
}

/// When a resource is downloaded, in the words of `check` and `status`:
/// `required` (right after install, and at every start until present) or
/// `on first use`.
pub fn when(required: bool) -> &'static str {
    if required {
        "required"
    } else {
        "on first use"
    }
}

/// `status`'s output: the document with `--json`; else the table, the
/// line about undeclared files, and the store that was read.
pub fn print_status_result(result: &gem_resources::api::protocol::StatusResult, json: bool) {
    if json {
        render::print_doc(serde_json::json!(result), true);
        return;
    }
    print_status(&result.gems);
    if let Some(line) = render::undeclared_line(result.undeclared_files, result.undeclared_bytes) {
        crate::outln!("{line}");
    }
    crate::outln!("store: {}", result.store.display());
}

/// `uninstall` of a gem that is not installed: `place` says in which
/// store (`in the store /path`, `no store at /path`).
pub fn not_installed(gem: &str, place: &str, store: &std::path::Path, json: bool) {
    if json {
        render::print_doc(
            serde_json::json!({ "gem": gem, "installed": false, "deleted": [], "kept": [], "store": store }),
            true,
        );
    } else {
        crate::errln!("{gem} is not installed ({place}); nothing to do");
    }
}

/// `uninstall`'s output for a gem that was installed: the counts, then a
/// line per kept file naming the other gems that declare it (`before`:
/// the gem's status rows before the uninstall, for the files' names;
/// `after`: every gem's rows after it). `--json` adds `kept_files`
/// (`sha256`, `file`, `id`, `declared_by`: `gem/id` entries) to the
/// API's answer.
pub fn print_uninstalled(
    result: &gem_resources::api::protocol::UninstallResult,
    before: &[GemStatus],
    after: &[GemStatus],
    json: bool,
) {
    let kept: Vec<serde_json::Value> = result
        .kept
        .iter()
        .map(|sha256| {
            let own = before
                .iter()
                .flat_map(|g| &g.resources)
                .find(|r| &r.sha256 == sha256);
            let declared_by: Vec<String> = after
                .iter()
                .flat_map(|g| g.resources.iter().map(move |r| (g, r)))
                .filter(|(_, r)| &r.sha256 == sha256)
                .map(|(g, r)| format!("{}/{}", g.gem, r.id))
                .collect();
            // A file never downloaded is declared elsewhere, not kept.
            let stored = own.is_none_or(|r| matches!(r.state, ResourceState::Present { .. }));
            serde_json::json!({
                "sha256": sha256,
                "file": own.map(|r| r.file.as_str()),
                "id": own.map(|r| r.id.as_str()),
                "declared_by": declared_by,
                "stored": stored,
            })
        })
        .collect();
    let installed_by = before
        .iter()
        .find(|g| g.gem == result.gem)
        .and_then(|g| g.installed_by.clone());
    let comes_back = match &installed_by {
        Some(gem_resources::InstalledBy::Folder { path }) => Some(format!(
            "{} was installed by `serve` from its gems folder {path}: while {} holds its manifest, a running `serve` installs it again at its next scan; remove that folder to keep it uninstalled",
            result.gem,
            std::path::Path::new(path).join(&result.gem).display()
        )),
        _ => None,
    };
    if json {
        let mut doc = serde_json::json!(result);
        doc["kept_files"] = serde_json::json!(kept);
        doc["installed_by"] = serde_json::json!(installed_by);
        if let Some(note) = &comes_back {
            doc["note"] = serde_json::json!(note);
        }
        render::print_doc(doc, true);
        return;
    }
    let stored: Vec<&serde_json::Value> = kept.iter().filter(|k| k["stored"] != false).collect();
    let mut said = format!(
        "uninstalled {}: {} deleted",
        result.gem,
        files(result.deleted.len())
    );
    if !stored.is_empty() {
        said.push_str(&format!(
            ", {} kept (declared by another gem)",
            stored.len()
        ));
    }
    crate::errln!("{said}");
    if let Some(note) = &comes_back {
        crate::errln!("note: {note}");
    }
    for k in stored {
        let text = |key: &str| k[key].as_str().map(str::to_string);
        let sha256 = text("sha256").unwrap_or_default();
        let name = match (text("file"), text("id")) {
            (Some(file), Some(id)) => format!("{file} ({}/{id})", result.gem),
            _ => sha256.get(..12).unwrap_or(&sha256).to_string(),
        };
        let by: Vec<&str> = k["declared_by"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .collect();
        let why = match by.as_slice() {
            [] => "declared by another gem".to_string(),
            [one] => format!("{one} declares it"),
            [first @ .., last] => format!("{} and {last} declare it", first.join(", ")),
        };
        crate::errln!("  kept {name}: {why}");
    }
}

/// The `status` table: one line per resource, its id first (what `path`
/// takes), then its description.
pub fn print_status(status: &[GemStatus]) {
    if status.is_empty() {
        crate::outln!("nothing installed");
        return;
    }
    for gem in status {
        match &gem.installed_by {
            Some(by) => crate::outln!(
                "{}  (installed by {})",
                field(&gem.gem),
                field(&by.describe())
            ),
            None => crate::outln!("{}  (installed by an earlier version)", field(&gem.gem)),
        }
        print_rows(&gem.resources, crate::platform::stdout_columns());
    }
}

/// Widest a description is shown.
const DESCRIPTION_WIDTH: usize = 24;
/// Narrowest a description is shown; below, it is left out.
const DESCRIPTION_MIN: usize = 8;

/// One gem's rows of the `status` table, fitted to `columns` when stdout
/// is a terminal: the description is cut (then left out) before anything
/// else, and a state that still does not fit goes on a line of its own.
/// Text from the manifest and the servers is kept to one line each.
fn print_rows(resources: &[ResourceStatus], columns: Option<u16>) {
    let width = |t: &str| field(t).chars().count();
    let id_width = resources.iter().map(|r| width(&r.id)).max().unwrap_or(0);
    let host_width = resources
        .iter()
        .map(|r| width(&r.host))
        .max()
        .unwrap_or(0)
        .min(DESCRIPTION_WIDTH);
    let states: Vec<String> = resources.iter().map(state).collect();
    let state_width = states.iter().map(|s| s.chars().count()).max().unwrap_or(0);
    // "  id  " description " " size(10) "  " host " " when(12) "  " state
    let fixed = 2 + id_width + 2 + 1 + 10 + 2 + host_width + 1 + 12 + 2;
    let described = resources.iter().any(|r| r.label != r.id);
    let description_width = match columns {
        None => DESCRIPTION_WIDTH,
        Some(cols) => {
            let room = usize::from(cols).saturating_sub(fixed + state_width);
            if room >= DESCRIPTION_MIN {
                room.min(DESCRIPTION_WIDTH)
            } else {
                0
            }
        }
    };
    let state_on_its_own = columns.is_some_and(|cols| {
        let used = fixed
            + if description_width > 0 {
                description_width
            } else {
                0
            };
        used + state_width > usize::from(cols)
    });
    for (r, state) in resources.iter().zip(states) {
        let description = if r.label == r.id { "" } else { &r.label };
        let description = if description_width == 0 {
            String::new()
        } else {
            format!(
                "{:<description_width$} ",
                cut(&field(description), description_width)
            )
        };
        let description = if described || columns.is_none() {
            description
        } else {
            // No resource has one: no empty column.
            String::new()
        };
        let row = format!(
            "  {:<id_width$}  {description}{:>10}  {:<host_width$} {:<12}",
            field(&r.id),
            render::bytes(r.size),
            cut(&field(&r.host), host_width),
            when(r.required),
        );
        if state_on_its_own {
            crate::outln!("{}", row.trim_end());
            crate::outln!("      {state}");
        } else {
            crate::outln!("{row}  {state}");
        }
        if let ResourceState::Failed { failure, .. } = &r.state {
            for a in &failure.attempts {
                crate::outln!(
                    "      {} {}: {}",
                    a.code,
                    field(&a.address),
                    field(&a.reason)
                );
            }
        }
    }
}

/// `text` cut to `width` characters, ending in `…` when cut.
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn state(r: &ResourceStatus) -> String {
    let (state, size) = (&r.state, r.size);
    let partial = r
        .partial_bytes
        .map(|n| format!("partial {}/{}", render::bytes(n), render::bytes(size)));
    match state {
        ResourceState::Present { served_by, .. } => match served_by {
            Some(by) => format!("present, {}", served_by_text(by, &r.addresses)),
            None => "present".to_string(),
        },
        ResourceState::Missing => partial.unwrap_or_else(|| "missing".to_string()),
        ResourceState::Queued => "queued".to_string(),
        ResourceState::Downloading {
            bytes,
            bytes_per_sec,
            ..
        } => {
            let done = format!("{}/{}", render::bytes(*bytes), render::bytes(size));
            match bytes_per_sec {
                // Nothing arrived lately: said, not hidden in a rate of 0.
                Some(0) => format!("stalled at {done}"),
                Some(rate) => format!("downloading {done}, {}/s", render::bytes(*rate)),
                None => format!("downloading {done}"),
            }
        }
        ResourceState::Retrying {
            attempt,
            of,
            reason,
            bytes,
            ..
        } => format!(
            "retrying (attempt {attempt} of {of}, {}) at {}/{}",
            field(reason),
            render::bytes(*bytes),
            render::bytes(size)
        ),
        ResourceState::Waiting { on, bytes, .. } => {
            let whose = match on {
                Some(gem) => format!("gem {}'s download", field(gem)),
                None => "another download".to_string(),
            };
            format!(
                "waiting for {whose} of the same file ({}/{})",
                render::bytes(*bytes),
                render::bytes(size)
            )
        }
        ResourceState::Failed { failure, .. } => {
            let failed = format!(
                "failed ({}) at {}",
                failure.code,
                render::utc(unix_secs(failure.at))
            );
            match partial {
                Some(kept) => format!("{failed}; {kept} kept"),
                None => failed,
            }
        }
        // A state added by a later version of the library.
        _ => "unknown".to_string(),
    }
}

/// Where a present file came from, in the words of `status`: `from the
/// url`, `from mirror 2 (cdn2.example.com)`, `imported`, or, for bytes
/// another gem or version declared elsewhere, `from <host>`.
pub fn served_by_text(served_by: &str, addresses: &[String]) -> String {
    if served_by == gem_resources::registry::SERVED_BY_IMPORT {
        return "imported".to_string();
    }
    let host = url::Url::parse(served_by)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| served_by.to_string());
    match addresses.iter().position(|a| a == served_by) {
        Some(0) => "from the url".to_string(),
        Some(n) => format!("from mirror {n} ({})", field(&host)),
        None => format!("from {}", field(&host)),
    }
}

fn unix_secs(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `verified 3 file(s): 2 good, 1 corrupted`, then one line per removed file.
pub fn print_verify(report: &VerifyReport, repairing: bool) {
    let bad: usize = report.removed.iter().map(|r| r.files.len().max(1)).sum();
    crate::outln!(
        "verified {} file(s): {} good, {} corrupted",
        report.checked,
        report.checked.saturating_sub(bad),
        bad
    );
    for removed in &report.removed {
        let files = removed.files.join(", ");
        if removed.declared_by.is_empty() {
            crate::outln!("removed corrupted {files} ({})", removed.sha256);
        } else {
            // What brings it back, lazy or required: a `path` of it (a
            // later `verify --repair` finds nothing left to repair).
            let then = match removed.declared_by.first().and_then(|d| d.split_once('/')) {
                _ if repairing => "downloading it again".to_string(),
                Some((gem, id)) => {
                    format!("`gem-resources path {gem} {id}` downloads it again")
                }
                None => "nothing declares it any more".to_string(),
            };
            crate::outln!(
                "removed corrupted {} ({files}); {then}",
                removed.declared_by.join(", "),
            );
        }
    }
}

/// `1 file`, `3 files`.
fn files(n: usize) -> String {
    match n {
        1 => "1 file".to_string(),
        n => format!("{n} files"),
    }
}

/// `gem/resource` of every required resource that is not present.
pub fn failed_required(status: &[GemStatus]) -> Vec<String> {
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

/// What `sync` says once its downloads ended (in process or through a
/// service): the `sync_report` document, or a line; exit status 1 while a
/// required file is still missing.
pub fn print_sync(queued: usize, status: &[GemStatus], json: bool) -> std::process::ExitCode {
    let failed = failed_required(status);
    if json {
        let ok = failed.is_empty();
        let mut doc =
            serde_json::json!({ "event": "sync_report", "queued": queued, "failed": failed });
        if !ok {
            // A failure says what failed, as every `--json` error does: the
            // most specific cause among the files' own failures.
            let causes: Vec<gem_resources::ErrorCode> = status
                .iter()
                .flat_map(|g| g.resources.iter())
                .filter_map(|r| match &r.state {
                    ResourceState::Failed { failure, .. } if r.required => {
                        Some(failure.primary_cause)
                    }
                    _ => None,
                })
                .collect();
            let primary = gem_resources::ErrorCode::most_specific(causes.iter().copied())
                .unwrap_or(gem_resources::ErrorCode::Unavailable);
            doc["code"] = serde_json::json!(gem_resources::ErrorCode::Unavailable);
            doc["primary_cause"] = serde_json::json!(primary);
            doc["message"] = serde_json::json!(format!(
                "{} required file(s) still missing: {} (`gem-resources status` says why)",
                failed.len(),
                failed.join(", ")
            ));
        }
        render::print_doc(doc, ok);
    } else {
        crate::errln!(
            "sync: {queued} required file(s) were missing, {} still missing",
            failed.len()
        );
    }
    if failed.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    }
}

/// What `install --no-wait` says: the report, and where the queued files
/// will download (`later`).
pub fn print_queued(report: &InstallReport, json: bool, later: &str) {
    if json {
        render::print_doc(
            serde_json::json!({ "event": "install_report", "report": report_json(report) }),
            true,
        );
        return;
    }
    crate::errln!(
        "{}: {} resource(s), {} present",
        headline(report),
        report.resources,
        report.present
    );
    if report.queued > 0 {
        crate::errln!("queued: {} file(s); {later}", report.queued);
    }
}

/// What `install` says once its downloads ended (`status`: the gem's).
/// A failed download never fails an install: the gem is registered, and
/// `status` and `sync` report and retry the file.
pub fn print_installed(report: &InstallReport, status: &[GemStatus], json: bool) {
    let outcome = Outcome::of(report, status);
    if json {
        render::print_doc(
            serde_json::json!({
                "event": "install_report",
                "report": report_json(report),
                "downloaded": outcome.downloaded,
                "failed": outcome.failed,
            }),
            true,
        );
    } else {
        crate::errln!("{}", install_summary(report, &outcome));
    }
}
