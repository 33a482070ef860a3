//! `[cache]`: an organisation's OCI registry, asked for every file before
//! the file's own addresses (see docs/cache.md).
//!
//! ```toml
//! [cache]
//! oci = "https://registry.corp.example/gem-resources"
//! push = true
//! username = "gem-resources"
//! password_env = "GEM_RESOURCES_CACHE_PASSWORD"
//! # or: docker_config = true      # the login `docker login` left (or its credential helper)
//! allow_internal = true          # or ["registry.corp.example", "blobs.corp.example"]
//! timeout_secs = 2
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::cache::{AllowInternal, CacheSettings, PasswordSource};

/// `[cache]`: the registry a file is asked for first. Without `oci`,
/// nothing is asked and nothing changes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CacheConfig {
    /// The registry and repository,
    /// `https://registry.corp.example/gem-resources`.
    #[serde(default)]
    pub oci: Option<String>,
    /// Uploads a file verified from its own addresses to the registry
    /// afterwards, in the background.
    #[serde(default)]
    pub push: bool,
    /// The user name for HTTP basic or the registry's token service.
    #[serde(default)]
    pub username: Option<String>,
    /// The environment variable holding the password (or token).
    #[serde(default)]
    pub password_env: Option<String>,
    /// A file holding the password (or token); its first line is used.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Repositories of the same registry a file may already be in: before
    /// an upload, the blob is mounted from them (a cross-repository mount,
    /// no bytes sent) when the registry has it there.
    #[serde(default)]
    pub mount_from: Vec<String>,
    /// Credentials from a Docker `config.json`: `true` for
    /// `$DOCKER_CONFIG/config.json` or `~/.docker/config.json` (the home
    /// folder from `HOME`, else `USERPROFILE`), or the file's path. For
    /// the registry's host, as Docker: the credential helper `credHelpers`
    /// or `credsStore` names (run when the registry first asks), else the
    /// entry of `auths`.
    #[serde(default)]
    pub docker_config: DockerConfig,
    /// The hosts that may be on a local or internal-network address:
    /// `true` for the registry's own host, or a list of host names (the
    /// registry's, its token service's, its blob storage's).
    #[serde(default)]
    pub allow_internal: AllowInternal,
    /// Longest wait for the registry to connect, answer, or send the next
    /// byte; a registry that is down costs a download at most this.
    #[serde(default = "default_timeout")]
    pub timeout_secs: f64,
    /// After a failure, the registry is left alone this long (the circuit
    /// breaker).
    #[serde(default = "default_breaker")]
    pub breaker_secs: f64,
    /// Cap on uploads to the registry, bytes per second or `"10M"`.
    #[serde(
        default = "default_push_rate",
        deserialize_with = "super::rate::deserialize_opt"
    )]
    pub push_max_bytes_per_sec: Option<u64>,
}

/// `[cache] docker_config`: `true`, `false` or a path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum DockerConfig {
    /// `true`: Docker's own file; `false`: none.
    Use(bool),
    /// This file.
    File(PathBuf),
    /// Not set: none.
    #[default]
    #[serde(skip)]
    None,
}

fn default_timeout() -> f64 {
    2.0
}

fn default_breaker() -> f64 {
    60.0
}

fn default_push_rate() -> Option<u64> {
    Some(20 << 20)
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            oci: None,
            push: false,
            username: None,
            password_env: None,
            password_file: None,
            mount_from: Vec::new(),
            docker_config: DockerConfig::default(),
            allow_internal: AllowInternal::default(),
            timeout_secs: default_timeout(),
            breaker_secs: default_breaker(),
            push_max_bytes_per_sec: default_push_rate(),
        }
    }
}

impl CacheConfig {
    /// Checks the section as the file is read: the address, the
    /// credentials' shape and the numbers. The password itself is read
    /// only when the cache is set up ([`CacheConfig::settings`]).
    pub(crate) fn check(&self) -> Result<(), String> {
        for (name, value) in [
            ("cache.timeout_secs", self.timeout_secs),
            ("cache.breaker_secs", self.breaker_secs),
        ] {
            if !(value.is_finite() && value > 0.0 && value < 1e6) {
                return Err(format!("{name} must be a positive number of seconds"));
            }
        }
        let Some(oci) = &self.oci else {
            let set = self.push
                || self.username.is_some()
                || self.password_env.is_some()
                || self.password_file.is_some()
                || self.docker_config != DockerConfig::default()
                || !self.mount_from.is_empty()
                || self.allow_internal != AllowInternal::default();
            if set {
                return Err("cache: the section needs `oci`, the registry to use".into());
            }
            return Ok(());
        };
        crate::cache::Registry::parse(oci).map_err(|e| format!("cache.oci: {e}"))?;
        if self.password_env.is_some() && self.password_file.is_some() {
            return Err("cache: give either password_env or password_file, not both".into());
        }
        let password = self.password_env.is_some() || self.password_file.is_some();
        let docker = matches!(
            self.docker_config,
            DockerConfig::Use(true) | DockerConfig::File(_)
        );
        if docker && (password || self.username.is_some()) {
            return Err(
                "cache: give either docker_config or username and password_env/password_file, not both"
                    .into(),
            );
        }
        if password && self.username.is_none() {
            return Err("cache: a password needs a username".into());
        }
        if self.username.is_some() && !password {
            return Err("cache: a username needs password_env or password_file".into());
        }
        if let Some(bad) = self
            .mount_from
            .iter()
            .find(|r| !crate::cache::oci::valid_repository(r))
        {
            return Err(format!(
                "cache.mount_from: {bad:?} is not a repository name (lower-case letters, digits, `.`, `_`, `-` and `/`)"
            ));
        }
        if let AllowInternal::Hosts(hosts) = &self.allow_internal {
            if let Some(bad) = hosts.iter().find(|h| url::Host::parse(h).is_err()) {
                return Err(format!("cache.allow_internal: {bad:?} is not a host name"));
            }
        }
        Ok(())
    }

    /// The cache's settings (`None` without `oci`), its password read from
    /// the variable or file named.
    pub(crate) fn settings(&self) -> crate::error::Result<Option<CacheSettings>> {
        let config = |e: String| crate::error::Error::Config(e);
        self.check().map_err(config)?;
        let Some(oci) = &self.oci else {
            return Ok(None);
        };
        let password = match (&self.password_env, &self.password_file) {
            (Some(var), _) => Some(PasswordSource::Env(var.clone())),
            (None, Some(file)) => Some(PasswordSource::File(file.clone())),
            (None, None) => None,
        };
        let docker_config = match &self.docker_config {
            DockerConfig::File(path) => Some(path.clone()),
            DockerConfig::Use(true) => Some(crate::cache::docker_default_path().ok_or_else(|| {
                config(
                    "cache.docker_config: none of DOCKER_CONFIG, HOME and USERPROFILE is set, so there is no Docker config.json to read".into(),
                )
            })?),
            DockerConfig::Use(false) | DockerConfig::None => None,
        };
        let settings = CacheSettings {
            registry: crate::cache::Registry::parse(oci).map_err(config)?,
            push: self.push,
            username: self.username.clone(),
            password,
            docker_config,
            mount_from: self.mount_from.clone(),
            allow_internal: self.allow_internal.clone(),
            timeout: Duration::from_secs_f64(self.timeout_secs),
            breaker: Duration::from_secs_f64(self.breaker_secs),
            push_max_bytes_per_sec: self.push_max_bytes_per_sec,
        };
        Ok(Some(settings))
    }
}
