//! `serve` follows its configuration file: on `SIGHUP`, and when the file
//! changes (polled with the gems folder).
//!
//! A valid new file takes effect at once where it can: the network policy
//! (allowlist/blocklist) goes to the running service, downloads in flight
//! included. Settings that only a restart can apply (the store, timeouts,
//! limits, the bandwidth cap, `[dev]`) are reported as needing one. An
//! invalid file is refused with its error and the running configuration is
//! kept: a bad edit never stops the service.

use std::path::PathBuf;

use gem_resources::{Config, Resources};
use sha2::{Digest, Sha256};

use crate::render::error_text;

/// The configuration `serve` runs with and where it came from.
pub struct Reloader {
    /// The configuration file, if `serve` was started with one.
    path: Option<PathBuf>,
    /// The configuration in force.
    running: Config,
    /// Digest of the file's bytes as last read, to notice changes.
    digest: Option<[u8; 32]>,
}

impl Reloader {
    /// Starts from the configuration `serve` was started with.
    pub fn new(config: &Config) -> Reloader {
        let path = config.source.clone();
        let digest = path.as_ref().and_then(|p| read_digest(p));
        Reloader {
            path,
            running: config.clone(),
            digest,
        }
    }

    /// Re-reads the file when it changed, or always when `forced` (SIGHUP),
    /// and applies what can be applied.
    pub fn check(&mut self, service: &Resources, forced: bool) {
        let Some(path) = self.path.clone() else {
            if forced {
                tracing::info!("SIGHUP: no configuration file to reload");
            }
            return;
        };
        let digest = read_digest(&path);
        if !forced && digest == self.digest {
            return;
        }
        self.digest = digest;
        let new = match Config::load(&path) {
            Ok(new) => new,
            Err(e) => {
                tracing::error!(
                    "configuration rejected; keeping the running one: {}",
                    error_text(&e)
                );
                return;
            }
        };
        let policy = match new.policy() {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(
                    "configuration rejected; keeping the running one: {}",
                    error_text(&e)
                );
                return;
            }
        };
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

fn read_digest(path: &std::path::Path) -> Option<[u8; 32]> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(gem_resources::manifest::MAX_MANIFEST_BYTES as u64)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(Sha256::digest(&bytes).into())
}
