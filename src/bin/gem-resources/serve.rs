//! `serve`: the store's local API, and a gems folder's resources kept
//! installed, until SIGINT/SIGTERM (or the end of the app that started it:
//! `--parent-pid`, `--exit-with-stdin`).
//!
//! Without a gems folder nothing is scanned: the service keeps what is
//! installed through its local API and the command line.
//!
//! The folder holds one sub-folder per installed gem, named by the gem's id,
//! with its `notochord.json` (or Gem Studio's `manifest.json`). Every
//! `interval` seconds the folder is scanned: a new or changed manifest is an
//! install or upgrade, a removed sub-folder an uninstall of a gem this
//! folder installed (every registration records who installed it; a gem
//! from anywhere else is never uninstalled by a scan). A folder whose gem
//! someone else keeps (the local API, the command line, a program, another
//! gems folder), or whose manifest declares another gem `id` than the
//! folder's name, is said once and left alone. A manifest that fails
//! validation is reported and the gem keeps its previous version (a failed
//! upgrade changes nothing). Polling works the same on every file system,
//! network mounts included.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use gem_resources::api::lifetime::Parent;
use gem_resources::manifest::{parse_json, read_manifest_file, validate};
use gem_resources::registry::valid_gem_id;
use gem_resources::{InstalledBy, Resources};
use sha2::{Digest, Sha256};

use crate::reload::{Overrides, Reloader};
use crate::render::error_text;
use crate::watch::{self, Output};

/// Manifest file names, in the order they are looked for.
const MANIFEST_NAMES: [&str; 2] = ["notochord.json", "manifest.json"];

/// Longest accepted `--interval` (a day).
const MAX_INTERVAL_SECS: f64 = 86_400.0;

/// Scans in a row a gem must be missing from the folder before it is
/// uninstalled: an app that replaces a gem folder (delete, then extract)
/// must not have its files deleted and downloaded again.
const MISSING_SCANS_TO_UNINSTALL: u32 = 2;

/// What the scans have seen so far.
#[derive(Debug)]
struct Seen {
    /// Who this folder is as an installer: what its installs record, and
    /// the only gems its scans ever uninstall.
    owner: InstalledBy,
    /// SHA-256 of each gem's manifest as last seen, and whether it was
    /// installed (`false`: rejected, or unreadable).
    manifests: BTreeMap<String, ([u8; 32], bool)>,
    /// Consecutive scans each gem this folder installed has been missing
    /// from.
    missing: BTreeMap<String, u32>,
    /// Folders ignored at the last scan, with why (each is logged once).
    ignored: BTreeMap<String, String>,
    /// Gems of the folder that someone else keeps, with who: each is left
    /// alone, and said once until its owner changes.
    others: BTreeMap<String, InstalledBy>,
    /// Whether the folder holding no manifest, while gems it installed are
    /// registered, has been said (it is said once, until a manifest shows).
    said_empty: bool,
    /// The last failed scan's error, said once until it changes.
    said_failure: Option<String>,
}

impl Seen {
    fn new(gems: &Path) -> Seen {
        Seen {
            owner: InstalledBy::folder(gems),
            manifests: BTreeMap::new(),
            missing: BTreeMap::new(),
            ignored: BTreeMap::new(),
            others: BTreeMap::new(),
            said_empty: false,
            said_failure: None,
        }
    }
}

/// What `serve` runs with, said once at start: the configuration file,
/// the store, the gems folder, the policy, the bandwidth cap and the
/// concurrency limits.
fn start_line(config: &gem_resources::Config, gems: Option<&Path>) -> String {
    let file = config.source.as_ref().map_or_else(
        || "none (defaults)".to_string(),
        |p| p.display().to_string(),
    );
    let policy = match config.policy() {
        Ok(p) => format!("{} ({} host(s))", p.mode().as_str(), p.host_count()),
        Err(e) => format!("invalid ({e})"),
    };
    let cap = config.network.max_bytes_per_sec.map_or_else(
        || "none".to_string(),
        |n| format!("{}/s", crate::render::bytes(n)),
    );
    let gems = gems.map_or_else(
        || "none (what the local API and the command line install)".to_string(),
        |g| g.display().to_string(),
    );
    format!(
        "serving: configuration {file}; store {}; gems {gems}; policy {policy}; bandwidth cap {cap}; at most {} download(s) at once, {} per host",
        config.store_dir().display(),
        config.service.max_concurrent_downloads,
        config.service.max_per_host,
    )
}

/// What ends `serve` besides a signal: the app that started it.
#[derive(Debug, Default)]
pub struct Lifetime {
    /// `--parent-pid`: the process whose end stops the service.
    pub parent: Option<Parent>,
    /// `--exit-with-stdin`: standard input's end stops the service.
    pub exit_with_stdin: bool,
}

/// Why `serve` stops.
enum Why {
    /// A signal (SIGINT, SIGTERM, …).
    Signal(crate::platform::Stop),
    /// `--parent-pid`'s process ended.
    ParentEnded(u32),
    /// `--exit-with-stdin`: standard input reached its end.
    StdinClosed,
}

/// Resolves at the first of: a stop signal, the parent's end, standard
/// input's end. The signals are registered now.
fn stop_reasons(lifetime: Lifetime) -> Pin<Box<dyn Future<Output = Why> + Send>> {
    let signal = crate::platform::stop_signal();
    let stdin = lifetime.exit_with_stdin.then(stdin_closed);
    let parent = lifetime.parent;
    Box::pin(async move {
        let parent_ended = async {
            match &parent {
                Some(p) => {
                    p.ended().await;
                    p.pid()
                }
                None => std::future::pending().await,
            }
        };
        let stdin_ended = async {
            let said = match stdin {
                Some(rx) => rx.await.is_ok(),
                None => false,
            };
            // A reader that could not start never says the end.
            if !said {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            stop = signal => Why::Signal(stop),
            pid = parent_ended => Why::ParentEnded(pid),
            () = stdin_ended => Why::StdinClosed,
        }
    })
}

/// Says when standard input reaches its end (or cannot be read). Read on
/// a thread of its own, not the runtime's: a read that never ends must not
/// hold up the exit.
fn stdin_closed() -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let reader = move || {
        use std::io::Read;
        let mut input = std::io::stdin().lock();
        let mut buf = [0u8; 512];
        loop {
            match input.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = tx.send(());
    };
    if let Err(e) = std::thread::Builder::new()
        .name("stdin".into())
        .spawn(reader)
    {
        tracing::warn!("cannot watch standard input ({e}): --exit-with-stdin has no effect");
    }
    rx
}

/// Runs the service until a shutdown signal, or the end of the app that
/// started it ([`Lifetime`]). Exit status: 0 after SIGTERM (a service
/// manager's stop) and after the app's end, 130 after SIGINT (Ctrl-C), as
/// the other commands.
pub async fn run(
    service: &Resources,
    config: &gem_resources::Config,
    gems: Option<&Path>,
    interval: f64,
    lifetime: Lifetime,
    json: bool,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        interval.is_finite() && interval > 0.0 && interval <= MAX_INTERVAL_SECS,
        "--interval must be a positive number of seconds, at most {MAX_INTERVAL_SECS}"
    );
    if let Some(gems) = gems.filter(|g| !g.is_dir()) {
        return Err(gem_resources::Error::NotFound(format!(
            "gems folder {} does not exist (or is not a folder)",
            gems.display()
        ))
        .into());
    }
    // Registered before the service starts, so a signal during the start
    // is not lost (nor kills the process before its downloads stop).
    let mut signal = stop_reasons(lifetime);
    let mut hangup = crate::platform::hangup_signal();
    // The command line that started `serve` (it parsed once already):
    // its overrides hold over every reload of the file.
    let overrides = <crate::cli::Args as clap::Parser>::try_parse()
        .map(|args| Overrides::of(&args))
        .unwrap_or_default();
    let mut reloader = Reloader::new(config, overrides);
    // The local API: every other process using the store goes through it.
    let api = service.listen()?;
    if json {
        crate::render::print_json(&serde_json::json!({
            "event": "listening",
            "at": gem_resources::time::to_rfc3339_millis(std::time::SystemTime::now()),
            "socket": api.socket(),
            "pid": std::process::id(),
        }));
    }
    let watcher = watch::spawn(service, json, Output::Stdout);
    let queued = service.start().await?;
    tracing::info!(
        "{}; local API on {}",
        start_line(config, gems),
        api.socket()
    );
    match crate::context::dev_warning(config) {
        Some(warning) => tracing::warn!(queued, "started; {warning}"),
        None => tracing::info!(queued, "started"),
    }
    let mut seen = gems.map(|gems| (gems, Seen::new(gems)));
    let mut forced = false;
    let stop = loop {
        if let Some((gems, seen)) = &mut seen {
            scan_once(service, gems, seen).await;
        }
        // One look at the configuration per round; after SIGHUP, one that
        // applies what it finds at once. A slow file system never holds up
        // SIGINT/SIGTERM.
        tokio::select! {
            () = reloader.check(service, forced) => {}
            stop = &mut signal => break stop,
        }
        forced = tokio::select! {
            () = tokio::time::sleep(Duration::from_secs_f64(interval)) => false,
            Some(()) = hangup.recv() => true,
            stop = &mut signal => break stop,
        };
    };
    match stop {
        Why::ParentEnded(pid) => tracing::info!("stopping: parent process {pid} ended"),
        Why::StdinClosed => tracing::info!("stopping: standard input closed"),
        Why::Signal(_) => {}
    }
    tracing::info!("stopping: cancelling downloads");
    let unfinished = crate::interrupt::unfinished(service, None);
    crate::progress::clear_all();
    api.stop().await;
    service.shutdown().await;
    watcher.stop().await;
    // What each download in flight kept, as every command says it.
    if !unfinished.is_empty() {
        crate::interrupt::report(service.store(), &unfinished);
    }
    Ok(match stop {
        Why::Signal(crate::platform::Stop::Interrupt) => {
            ExitCode::from(crate::interrupt::INTERRUPTED)
        }
        _ => ExitCode::SUCCESS,
    })
}

/// One scan of the gems folder; a failure is said once until it changes.
async fn scan_once(service: &Resources, gems: &Path, seen: &mut Seen) {
    match scan(service, gems, seen).await {
        Ok(()) => seen.said_failure = None,
        Err(e) => {
            let text = format!("{e:#}");
            if seen.said_failure.as_ref() != Some(&text) {
                tracing::warn!(
                    "scan of {} failed: {text}; uninstalling nothing until it can be read",
                    gems.display()
                );
                seen.said_failure = Some(text);
            }
        }
    }
}

/// One scan: installs what is new or changed in the folder, and
/// uninstalls what the folder installed and no longer holds. A gem that
/// anyone else installed (the local API, the command line, a program using
/// the library, another gems folder) is left alone, its folder said once;
/// one that an earlier version registered without saying who is the
/// folder's once a scan installs its manifest. No gem anyone else keeps is
/// ever uninstalled by a scan.
async fn scan(service: &Resources, gems: &Path, seen: &mut Seen) -> anyhow::Result<()> {
    let (present, ignored) = manifests(gems)?;
    for (name, why) in &ignored {
        if seen.ignored.get(name) != Some(why) {
            let folder = gems.join(name).display().to_string();
            tracing::warn!("ignoring {}: {why}", crate::text::field(&folder));
        }
    }
    seen.ignored = ignored;
    let installed_before = service.installed_by()?;
    seen.others.retain(|gem, _| present.contains_key(gem));
    for (gem, path) in &present {
        // Someone else's gem is theirs, whatever this folder holds.
        match installed_before.get(gem) {
            Some(Some(owner)) if *owner != seen.owner => {
                say_kept_by_other(gems, gem, owner, seen);
                continue;
            }
            installed => {
                seen.others.remove(gem);
                install_from(service, gem, path, gems, installed.is_some(), seen).await;
            }
        }
    }
    uninstall_gone(service, gems, &present, seen).await
}

/// Installs `gem` from its manifest at `path` when it is new or changed
/// since the last scan, or said once why not (`installed`: whether a
/// version of it is registered, which it then keeps).
async fn install_from(
    service: &Resources,
    gem: &str,
    path: &Path,
    gems: &Path,
    installed: bool,
    seen: &mut Seen,
) {
    let keeping = if installed {
        "keeping the installed version"
    } else {
        "not installed"
    };
    let bytes = match read_gem_manifest(gems, path) {
        Ok(b) => b,
        Err(why) => {
            // Remembered like a rejected manifest, so an unchanged problem
            // is reported once and the installed version kept.
            let digest: [u8; 32] = Sha256::digest(&why).into();
            if seen.manifests.insert(gem.to_string(), (digest, false)) != Some((digest, false)) {
                tracing::error!(gem, "{why}; {keeping}");
            }
            return;
        }
    };
    let digest: [u8; 32] = Sha256::digest(&bytes).into();
    match seen.manifests.get(gem) {
        // Installed from this manifest, and still installed (by this
        // folder: a gem someone else took is left alone before this).
        Some(&(d, true)) if d == digest && installed => return,
        // Rejected as it is: said once.
        Some(&(d, false)) if d == digest => return,
        _ => {}
    }
    let shown = crate::text::field(&path.display().to_string()).into_owned();
    let manifest = match parse_json(&bytes).and_then(|value| {
        let declared = value.get("id").and_then(serde_json::Value::as_str);
        Ok((declared.map(str::to_string), validate(&value)?))
    }) {
        // The folder's name is the gem's id: a manifest naming another gem
        // is a copy put in the wrong folder, or a renamed folder.
        Ok((Some(declared), _)) if declared != gem => {
            seen.manifests.insert(gem.to_string(), (digest, false));
            tracing::error!(
                gem,
                "{shown} declares the gem id {}, not {} (its folder's name); {keeping}: name its folder {}, or change its `id`",
                crate::text::field(&declared),
                crate::text::field(gem),
                crate::text::field(&declared),
            );
            return;
        }
        Ok((_, manifest)) => manifest,
        Err(e) => {
            // Remembered, so an unchanged invalid manifest is reported
            // once; a fixed one is installed at the next scan.
            seen.manifests.insert(gem.to_string(), (digest, false));
            tracing::error!(gem, "{shown} rejected; {keeping}:\n{e}");
            return;
        }
    };
    match service.install_by(gem, &manifest, seen.owner.clone()).await {
        // Taken by someone else since the listing (checked again under
        // the registry lock): theirs, and left alone.
        Ok(report) if report.installed_by.as_ref() != Some(&seen.owner) => {
            if let Some(owner) = &report.installed_by {
                say_kept_by_other(gems, gem, owner, seen);
            }
        }
        // The same: the next scan says whose it is.
        Err(e) if e.code() == gem_resources::ErrorCode::Owner => {}
        Ok(report) => {
            seen.manifests.insert(gem.to_string(), (digest, true));
            tracing::info!(
                gem,
                upgrade = report.upgrade,
                queued = report.queued,
                "installed"
            )
        }
        // Not remembered: the next scan tries again.
        Err(e) => tracing::error!(gem, "install failed: {}", error_text(&e)),
    }
}

/// Uninstalls the gems this folder installed and no longer holds (after
/// [`MISSING_SCANS_TO_UNINSTALL`] scans in a row), unless the folder holds
/// no manifest at all.
async fn uninstall_gone(
    service: &Resources,
    gems: &Path,
    present: &BTreeMap<String, PathBuf>,
    seen: &mut Seen,
) -> anyhow::Result<()> {
    // The gems this folder installed (as the registry says now: an install
    // by anyone else since makes a gem theirs) that it no longer holds.
    let gone: Vec<String> = service
        .installed_by()?
        .into_iter()
        .filter(|(gem, by)| by.as_ref() == Some(&seen.owner) && !present.contains_key(gem))
        .map(|(gem, _)| gem)
        .collect();
    seen.missing.retain(|gem, _| gone.contains(gem));
    if present.is_empty() && !gone.is_empty() {
        // A wrong path, an unmounted disk, a folder being replaced: an
        // empty folder is never taken as "every gem was removed".
        if !seen.said_empty {
            tracing::warn!(
                "the gems folder {} holds no manifest, while {} gem(s) installed from it are registered ({}): uninstalling nothing until a manifest appears in it (`gem-resources uninstall GEM` removes one)",
                gems.display(),
                gone.len(),
                gone.join(", ")
            );
            seen.said_empty = true;
        }
        seen.missing.clear();
        return Ok(());
    }
    seen.said_empty = false;
    for gem in &gone {
        let scans = seen.missing.entry(gem.clone()).or_default();
        *scans += 1;
        tracing::info!(
            gem,
            "missing from the gems folder (scan {scans} of {MISSING_SCANS_TO_UNINSTALL})"
        );
        if *scans < MISSING_SCANS_TO_UNINSTALL {
            continue;
        }
        seen.missing.remove(gem);
        seen.manifests.remove(gem);
        // Checked again under the registry lock: a gem installed by anyone
        // else since the listing above is theirs, and stays.
        match service.uninstall_installed_by(gem, &seen.owner).await {
            Ok(Some(report)) => {
                tracing::info!(gem, deleted = report.deleted.len(), "uninstalled")
            }
            Ok(None) => tracing::info!(gem, "installed by someone else since; left alone"),
            Err(e) => tracing::error!(gem, "uninstall failed: {}", error_text(&e)),
        }
    }
    Ok(())
}

/// Says once (until its owner changes) that `gem`, which the gems folder
/// holds, is kept by `owner`, and is left alone.
fn say_kept_by_other(gems: &Path, gem: &str, owner: &InstalledBy, seen: &mut Seen) {
    if seen.others.get(gem) == Some(owner) {
        return;
    }
    let folder = gems.join(gem).display().to_string();
    tracing::warn!(
        gem,
        "leaving {} alone: the gem is kept by {}, not by this gems folder (it stays theirs, and removing the folder uninstalls nothing; once they uninstall it, this folder installs it)",
        crate::text::field(&folder),
        owner.describe()
    );
    seen.others.insert(gem.to_string(), owner.clone());
}

/// The manifest at `path`, read where it really is: a symbolic link (the
/// manifest's, or its gem folder's) may lead to another place in the gems
/// folder, never out of it, so a gem cannot have `serve` read (and echo
/// values of) a file elsewhere on the machine.
fn read_gem_manifest(gems: &Path, path: &Path) -> Result<Vec<u8>, String> {
    let shown = crate::text::field(&path.display().to_string()).into_owned();
    let unreadable = |e: std::io::Error| format!("cannot read manifest {shown}: {e}");
    let real = std::fs::canonicalize(path).map_err(unreadable)?;
    let root = std::fs::canonicalize(gems).map_err(unreadable)?;
    if !real.starts_with(&root) {
        return Err(format!(
            "refusing manifest {shown}: a symbolic link leading out of the gems folder"
        ));
    }
    // Capped like `check`: a huge file or a FIFO in the gems folder is
    // refused from its metadata, never read whole.
    read_manifest_file(&real).map_err(|e| error_text(&e))
}

/// Gem folders: id → manifest path for every sub-folder that has one,
/// and name → why for every other sub-folder.
type Folders = (BTreeMap<String, PathBuf>, BTreeMap<String, String>);

/// Gem id → manifest path for every sub-folder that has one; the other
/// sub-folders with why they are ignored.
fn manifests(gems: &Path) -> anyhow::Result<Folders> {
    let mut out = BTreeMap::new();
    let mut ignored = BTreeMap::new();
    let entries =
        std::fs::read_dir(gems).with_context(|| format!("cannot list {}", gems.display()))?;
    for entry in entries.flatten() {
        let Some(gem) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !entry.path().is_dir() {
            continue;
        }
        if !valid_gem_id(&gem) {
            let why = "not a valid gem id (letters, digits, `.`, `_` and `-`, starting with a letter or digit)";
            ignored.insert(gem, why.to_string());
            continue;
        }
        // Any entry by that name counts (a folder or FIFO is then refused
        // with a message), so a broken manifest is never mistaken for a
        // removed gem.
        if let Some(path) = MANIFEST_NAMES
            .iter()
            .map(|n| entry.path().join(n))
            .find(|p| p.symlink_metadata().is_ok())
        {
            out.insert(gem, path);
        } else {
            let why = format!("no {} in it", MANIFEST_NAMES.join(" or "));
            ignored.insert(gem, why);
        }
    }
    Ok((out, ignored))
}
