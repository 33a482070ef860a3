//! `serve` follows its configuration file: on `SIGHUP`, and when the file
//! changes (polled with the gems folder).
//!
//! A valid new file takes effect at once where it can: the network policy
//! (allowlist/blocklist) goes to the running service, downloads in flight
//! included. Settings that only a restart can apply (the store, timeouts,
//! limits, the bandwidth cap, `[dev]`) are reported as needing one. An
//! invalid file is refused with its error and the running configuration is
//! kept: a bad edit never stops the service.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gem_resources::{Config, Resources};
use sha2::{Digest, Sha256};

use crate::render::error_text;

/// How long a changed file must stay unchanged (over two looks at least)
/// before it is applied. Editors and tools write configuration files in
/// several steps, and an empty or half-written file is often valid TOML
/// (`cat > config.toml` first truncates: a blocklist with no hosts).
pub const SETTLE: Duration = Duration::from_secs(1);

/// What the command line sets over the configuration file (`--limit-rate`,
/// `--store`): applied to the file at start and again at every reload, so
/// a reload never drops them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--limit-rate`: `network.max_bytes_per_sec` (`0`: no cap).
    pub limit_rate: Option<u64>,
    /// `--store`: the store folder.
    pub store: Option<PathBuf>,
}

impl Overrides {
    /// The overrides the command line gave.
    pub fn of(args: &crate::cli::Args) -> Overrides {
        Overrides {
            limit_rate: args.limit_rate,
            store: args.store.clone(),
        }
    }

    /// Sets them over `config`.
    pub fn apply(&self, config: &mut Config) {
        // `--limit-rate 0`: no cap, as curl and wget read it.
        if let Some(rate) = self.limit_rate {
            config.network.max_bytes_per_sec = (rate > 0).then_some(rate);
        }
        if let Some(store) = &self.store {
            config.store = Some(gem_resources::config::normalise(store));
        }
    }

    /// The configuration a reload of the file at `path` holding `text`
    /// comes to: the file's settings with these overrides over them.
    pub fn settings(&self, path: &Path, text: &str) -> gem_resources::Result<Config> {
        let mut config = Config::from_text(path, text)?;
        self.apply(&mut config);
        Ok(config)
    }
}

/// The configuration `serve` runs with and where it came from.
pub struct Reloader {
    /// The configuration file, if `serve` was started with one.
    path: Option<PathBuf>,
    /// The command line's settings over the file's.
    overrides: Overrides,
    /// The configuration in force.
    running: Config,
    /// Digest of what the file held when last applied (or rejected).
    digest: Option<[u8; 32]>,
    /// Whether the file in force has a `[network]` section.
    had_network: bool,
    /// A change not applied yet: its digest and when it was first seen.
    pending: Option<([u8; 32], Instant)>,
}

/// What one look at the file found: its text, or why it cannot be used.
struct Look {
    digest: [u8; 32],
    text: Result<String, gem_resources::Error>,
}

impl Reloader {
    /// Starts from the configuration `serve` was started with (the file's
    /// with `overrides` over it).
    pub fn new(config: &Config, overrides: Overrides) -> Reloader {
        let path = config.source.clone();
        let first = path.as_deref().map(read);
        let had_network = first
            .as_ref()
            .and_then(|l| l.text.as_ref().ok())
            .is_some_and(|t| has_network(t));
        Reloader {
            path,
            overrides,
            running: config.clone(),
            digest: first.map(|l| l.digest),
            had_network,
            pending: None,
        }
    }

    /// Looks at the file, off the main loop, and applies what can be
    /// applied: when `forced` (SIGHUP) at once, otherwise once a change has
    /// stayed the same for [`SETTLE`].
    pub async fn check(&mut self, service: &Resources, forced: bool) {
        let Some(path) = self.path.clone() else {
            if forced {
                tracing::info!("SIGHUP: no configuration file to reload");
            }
            return;
        };
        let look = {
            let file = path.clone();
            match tokio::task::spawn_blocking(move || read(&file)).await {
                Ok(look) => look,
                Err(e) => {
                    tracing::error!("cannot read {}: {e}", path.display());
                    return;
                }
            }
        };
        tracing::debug!(forced, "looked at the configuration file");
        if !forced && !self.settled(&path, look.digest) {
            return;
        }
        self.pending = None;
        self.digest = Some(look.digest);
        let text = match look.text {
            Ok(text) => text,
            Err(e) => return rejected(&e),
        };
        match self.overrides.settings(&path, &text) {
            Ok(new) => self.apply(service, &path, new, has_network(&text), forced),
            Err(e) => rejected(&e),
        }
    }

    /// Whether the file's content `digest` is to be applied now: it differs
    /// from what is in force and was seen the same at an earlier look, at
    /// least [`SETTLE`] ago.
    fn settled(&mut self, path: &Path, digest: [u8; 32]) -> bool {
        if self.digest == Some(digest) {
            self.pending = None;
            return false;
        }
        match self.pending {
            Some((seen, since)) if seen == digest => since.elapsed() >= SETTLE,
            _ => {
                self.pending = Some((digest, Instant::now()));
                tracing::info!(
                    "{} changed; it applies once unchanged for {} s",
                    path.display(),
                    SETTLE.as_secs_f64()
                );
                false
            }
        }
    }

    fn apply(
        &mut self,
        service: &Resources,
        path: &Path,
        new: Config,
        network: bool,
        forced: bool,
    ) {
        let policy = match new.policy() {
            Ok(p) => p,
            Err(e) => return rejected(&e),
        };
        if self.had_network && !network {
            tracing::warn!(
                "{} has no [network] section any more: the network policy is now the default (mode = \"{}\", {} host(s))",
                path.display(),
                new.network.mode.as_str(),
                new.network.hosts.len()
            );
        }
        self.had_network = network;
        let restart = needs_restart(&self.running, &new);
        if !restart.is_empty() {
            tracing::warn!(
                "{}: {} changed; restart `serve` to apply (the rest applies now)",
                path.display(),
                restart.join(", ")
            );
        }
        let net = (&new.network.mode, &new.network.hosts);
        if net != (&self.running.network.mode, &self.running.network.hosts) {
            match service.set_policy(policy) {
                Ok(queued) => tracing::info!(
                    mode = new.network.mode.as_str(),
                    hosts = new.network.hosts.len(),
                    queued,
                    forced,
                    "network policy reloaded"
                ),
                Err(e) => {
                    tracing::error!("cannot apply the new network policy: {}", error_text(&e))
                }
            }
            self.running.network.mode = new.network.mode;
            self.running.network.hosts = new.network.hosts.clone();
        } else if forced {
            tracing::info!("SIGHUP: configuration reloaded; the network policy is unchanged");
        }
    }
}

fn rejected(e: &gem_resources::Error) {
    tracing::error!(
        "configuration rejected; keeping the running one: {}",
        error_text(e)
    );
}

/// Whether the TOML `text` has a `[network]` table (an unparsable text has
/// none; it is rejected anyway).
fn has_network(text: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|t| t.contains_key("network"))
}

/// The settings that differ and only apply at the next start.
fn needs_restart(running: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if running.store_dir() != new.store_dir() {
        changed.push("store");
    }
    // Everything in [network] but the policy.
    let mut network = new.network.clone();
    network.mode = running.network.mode;
    network.hosts = running.network.hosts.clone();
    if format!("{network:?}") != format!("{:?}", running.network) {
        changed.push("[network] timeouts, retries or bandwidth");
    }
    if format!("{:?}", new.service) != format!("{:?}", running.service) {
        changed.push("[service]");
    }
    if format!("{:?}", new.dev) != format!("{:?}", running.dev) {
        changed.push("[dev]");
    }
    changed
}

/// One look at the configuration file, with the guards of every file read:
/// a regular file only (a FIFO is refused without waiting for a writer),
/// at most `MAX_CONFIG_BYTES` ([`Config::read_text`]).
fn read(path: &Path) -> Look {
    let text = Config::read_text(path);
    // A problem is a content too: an unchanged one is reported once.
    let digest = match &text {
        Ok(text) => Sha256::digest(text.as_bytes()).into(),
        Err(e) => Sha256::digest(format!("error: {e}").as_bytes()).into(),
    };
    Look { digest, text }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_keeps_the_command_lines_rate_and_store() {
        let path = Path::new("/etc/gem-resources/config.toml");
        let text = "[network]\nmode = \"blocklist\"\nhosts = []\n";
        let overrides = Overrides {
            limit_rate: Some(1 << 20),
            store: Some(PathBuf::from("/srv/store")),
        };
        // What `serve` started with: the file, then the command line.
        let running = overrides.settings(path, text).unwrap();
        assert_eq!(running.network.max_bytes_per_sec, Some(1 << 20));
        // A reload of the same file (SIGHUP) changes nothing, and asks for
        // no restart.
        let reloaded = overrides.settings(path, text).unwrap();
        assert_eq!(reloaded.network.max_bytes_per_sec, Some(1 << 20));
        assert_eq!(reloaded.store_dir(), running.store_dir());
        assert!(needs_restart(&running, &reloaded).is_empty());
        // A file that sets its own cap: the command line's still wins.
        let capped = format!("{text}max_bytes_per_sec = 5000\n");
        let reloaded = overrides.settings(path, &capped).unwrap();
        assert_eq!(reloaded.network.max_bytes_per_sec, Some(1 << 20));
        // Without overrides, the file's own settings.
        let plain = Overrides::default().settings(path, &capped).unwrap();
        assert_eq!(plain.network.max_bytes_per_sec, Some(5000));
    }
}
