//! What every command needs besides its own work: exit statuses, the
//! manifest read with its guards, whether the store exists, the warning
//! about active `[dev]` settings, and a batch run with no slot waiting for
//! another's result.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use gem_resources::manifest;
use gem_resources::store::policy_record;
use gem_resources::{Config, Error, Fetcher, Manifest};

/// Exit status for a failed operation.
pub const FAILED: u8 = 1;
/// Exit status for a usage error.
pub const USAGE: u8 = 2;

/// Reads and validates a manifest file, with the guards of every manifest
/// read (regular files only, never waiting on a FIFO, a size cap).
pub fn read_manifest(path: &Path) -> anyhow::Result<Manifest> {
    Ok(read_manifest_declaring(path)?.0)
}

/// [`read_manifest`], with the gem id the manifest declares at its top
/// level (`"id"`), if it declares one.
pub fn read_manifest_declaring(path: &Path) -> anyhow::Result<(Manifest, Option<String>)> {
    let (manifest, value) = read_manifest_value(path)?;
    let id = value
        .get("id")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string);
    Ok((manifest, id))
}

/// [`read_manifest`], with the manifest's whole JSON.
pub fn read_manifest_value(path: &Path) -> anyhow::Result<(Manifest, serde_json::Value)> {
    let bytes = read_manifest_bytes(path)?;
    let value = manifest::parse_json(&bytes).map_err(|e| in_file(e.into(), path))?;
    let manifest = manifest::validate(&value).map_err(|e| in_file(e.into(), path))?;
    Ok((manifest, value))
}

/// The bytes of a manifest file, read with the guards of every manifest
/// read. Every reader skips a leading UTF-8 byte-order mark
/// ([`manifest::parse_json`]); it is said once per run, on stderr (not
/// with `--json` or `-q`).
pub fn read_manifest_bytes(path: &Path) -> Result<Vec<u8>, Error> {
    static SAID: AtomicBool = AtomicBool::new(false);
    let bytes = manifest::read_manifest_file(path).map_err(|e| in_file(e, path))?;
    let quiet = crate::progress::quiet() || crate::interrupt::json();
    if bytes.starts_with(manifest::UTF8_BOM) && !quiet && !SAID.swap(true, Ordering::Relaxed) {
        crate::errln!(
            "note: {} starts with a UTF-8 byte-order mark; it was skipped",
            path.display()
        );
    }
    Ok(bytes)
}

/// A manifest error of the file at `path`, as the command line says it:
/// each problem names the file first (`notochord.json:
/// manifest.resources[0].url: …`, and `notochord.json: …` for the
/// manifest as a whole), and the first missing `size` or `sha256` says
/// the command that fills in every one (once, however many lack).
pub fn in_file(error: Error, path: &Path) -> Error {
    let Error::Manifest(mut manifest) = error else {
        return error;
    };
    let mut advised = false;
    let file = crate::platform::shell_word(&path.display().to_string());
    for problem in &mut manifest.problems {
        let missing_value = problem.message == "is required"
            && (problem.path.ends_with(".size") || problem.path.ends_with(".sha256"));
        if missing_value && !advised {
            advised = true;
            problem.message = format!(
                "is required (to fill in every missing size and sha256: `gem-resources autofill --manifest {file} --write`)"
            );
        }
        // A size of 0 with another file's hash: both are to be read again.
        if problem.path.ends_with(".size") && problem.message.starts_with("is 0, but sha256") {
            problem.message.push_str(&format!(
                " (to fill in the true size and sha256: `gem-resources autofill --manifest {file} --all --write`)"
            ));
        }
    }
    Error::Manifest(manifest.in_file(path.display().to_string()))
}

/// A problem's or a remark's place in the file at `path`: the file's name,
/// then the place in the manifest unless it is the whole manifest.
pub fn place(place: &str, path: &Path) -> String {
    let file = path.display();
    match place {
        "manifest" => file.to_string(),
        inner => format!("{file}: {inner}"),
    }
}

/// Whether the configured store was ever created. The folder name is the
/// store's layout version (see `src/store/mod.rs`).
pub fn store_exists(config: &Config) -> bool {
    config.store_dir().join("store-v1").is_dir()
}

/// The configured store folder, absolute, as the messages name it.
pub fn store_folder(config: &Config) -> std::path::PathBuf {
    let dir = config.store_dir();
    std::path::absolute(&dir).unwrap_or(dir)
}

/// What a command that only reads the store says when there is none: the
/// folder it looked in, so a typo in `--store` or `store` shows instead of
/// passing for an empty store.
pub fn no_store(config: &Config) -> Error {
    Error::NotFound(format!(
        "no store at {} (nothing was ever installed there; check --store or `store` in the configuration)",
        store_folder(config).display()
    ))
}

/// The one-line warning about active `[dev]` keys, if any are.
pub fn dev_warning(config: &Config) -> Option<String> {
    let keys = config.active_dev_keys();
    (!keys.is_empty()).then(|| {
        format!(
            "[dev] settings are active: {} (for development and tests only)",
            keys.join(", ")
        )
    })
}

/// Prints the `[dev]` warning on stderr, if any key is active.
pub fn warn_dev(config: &Config) {
    if crate::progress::quiet() {
        return;
    }
    if let Some(warning) = dev_warning(config) {
        crate::errln!("warning: {warning}");
    }
}

/// A fetcher for this command under the store's last policy: the one a
/// service or an app set for the store ([`Config::effective_policy`]),
/// when it is newer than the configuration file.
///
/// While the command runs, a policy that a service or an app sets for the
/// store applies to it too, within a quarter of a second: transfers in
/// flight to a host it refuses stop.
pub fn fetcher(config: &Config) -> Result<Fetcher, Error> {
    let fetcher = Fetcher::new(config)?.with_cache(config.cache_settings()?)?;
    fetcher.set_policy(config.effective_policy()?);
    let (following, config) = (fetcher.clone(), config.clone());
    let store_dir = config.store_dir();
    let mut seen = policy_record::generation_in(&store_dir);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(gem_resources::service::POLICY_WATCH_EVERY).await;
            let now = policy_record::generation_in(&store_dir);
            if now == seen {
                continue;
            }
            seen = now;
            match config.effective_policy() {
                Ok(policy) => following.set_policy(policy),
                Err(e) => tracing::warn!("{e}"),
            }
        }
    });
    Ok(fetcher)
}

/// The gem and manifest of `install [GEM] MANIFEST [--as GEM]`: the gem id
/// given, or the one `--as` names, or the manifest's own `id`. A gem id
/// given that differs from the manifest's is refused (a typo would make a
/// second gem), naming both; `--as` says it is meant.
pub fn install_target(
    args: &[std::path::PathBuf],
    as_gem: Option<&str>,
) -> anyhow::Result<(String, std::path::PathBuf)> {
    let (given, manifest) = match args {
        [manifest] => (None, manifest.clone()),
        [gem, manifest] => (Some(gem.to_string_lossy().into_owned()), manifest.clone()),
        _ => anyhow::bail!("give the manifest, or the gem's id and the manifest"),
    };
    if let (Some(given), Some(as_gem)) = (&given, as_gem) {
        anyhow::bail!("give the gem's id once: {given:?} or --as {as_gem:?}");
    }
    let (_, declared) = read_manifest_declaring(&manifest)?;
    let gem = match (given, as_gem, declared) {
        (_, Some(as_gem), _) => as_gem.to_string(),
        (Some(given), None, Some(declared)) if given != declared => anyhow::bail!(
            "{} declares the gem id {}, not {}: install it as {} (`install {}`), or say `--as {}` to install it under another id",
            manifest.display(),
            crate::text::field(&declared),
            crate::text::field(&given),
            crate::text::field(&declared),
            manifest.display(),
            crate::text::field(&given)
        ),
        (Some(given), None, _) => given,
        (None, None, Some(declared)) => declared,
        (None, None, None) => anyhow::bail!(
            "{} declares no gem id: give it, `install GEM {}`",
            manifest.display(),
            manifest.display()
        ),
    };
    Ok((gem, manifest))
}

/// Runs `job` as a task of its own on the runtime (any worker thread) and
/// waits for its output; a panic in it is resumed here.
pub async fn spawned<T: Send + 'static>(
    job: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    match tokio::spawn(job).await {
        Ok(out) => out,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Tasks are cancelled only when the runtime shuts down, after
            // every command returned.
            Err(e) => unreachable!("a task ended without its output: {e}"),
        },
    }
}

/// Runs `jobs` at most `parallel` at once, each slot taking the next job as
/// soon as its own ends, so one that stalls (a retransmission timeout, a
/// slow server) holds no other back; the outputs come back in the jobs'
/// order, for reports in manifest order.
pub async fn unordered<F: std::future::Future>(
    jobs: impl IntoIterator<Item = F>,
    parallel: usize,
) -> Vec<F::Output> {
    use futures_util::StreamExt;
    let indexed = jobs
        .into_iter()
        .enumerate()
        .map(|(i, job)| async move { (i, job.await) });
    let mut done: Vec<(usize, F::Output)> = futures_util::stream::iter(indexed)
        .buffer_unordered(parallel.max(1))
        .collect()
        .await;
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, out)| out).collect()
}
