//! Configuration: the TOML file, its defaults, and what the rest of the
//! crate derives from it.
//!
//! ```toml
//! store = "/path/to/store"
//! [network]
//! mode = "blocklist"        # or "allowlist"
//! hosts = ["cdn.example.com", "*.example.org"]
//! connect_timeout_secs = 10
//! stall_timeout_secs = 30
//! proxy = "env"             # or "none", or "http://user:pass@proxy:3128"
//! proxy_resolves = false
//! [service]
//! retry_failed_after = "10m"  # a failed required file is queued again (0: off)
//! [dev]                     # development and tests only; empty in production
//! extra_root_certs = ["ca.pem"]
//! resolve = { "cdn.test" = ["127.0.0.1"] }
//! allow_addresses = ["127.0.0.1/32", "::1/128"]
//! allow_public_addresses = false   # true: allow_addresses may go beyond local ranges
//! ```
//!
//! Relative paths in the file resolve against the file's folder. Unknown keys
//! are refused, so a misspelt setting never silently falls back to a default.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::net::policy::{Mode, Policy};
use crate::net::proxy::ProxyConfig;
use crate::net::NetSettings;
use crate::transfer::retry::RetryPolicy;

mod cache;
mod dev;
mod keys;
mod rate;
pub use cache::{CacheConfig, DockerConfig};
pub use dev::DevConfig;
/// Address ranges, as `[dev] allow_addresses` holds them.
pub use ipnet::{IpNet, Ipv4Net, Ipv6Net};
pub use rate::parse_rate;

/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// Where verified files and the service's records live.
    #[serde(default)]
    pub store: Option<PathBuf>,
    /// Network policy and timeouts.
    #[serde(default)]
    pub network: NetworkConfig,
    /// Scheduling limits of the background service.
    #[serde(default)]
    pub service: ServiceConfig,
    /// An organisation's OCI registry, asked for every file first
    /// (docs/cache.md). Empty: no cache.
    #[serde(default)]
    pub cache: CacheConfig,
    /// Development and test exemptions. Empty in production.
    #[serde(default)]
    pub dev: DevConfig,
    /// The file it was loaded from, if any (for a reload).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// `[network]`: the user's network policy and the timeouts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NetworkConfig {
    /// `allowlist`: only `hosts` may be reached; `blocklist`: `hosts` may not.
    #[serde(default = "default_mode", with = "mode_serde")]
    pub mode: Mode,
    /// Host patterns: `cdn.example.com` or `*.example.org`.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Seconds allowed to open a connection (TCP and TLS).
    #[serde(default = "default_connect")]
    pub connect_timeout_secs: f64,
    /// Seconds without a single byte after which a transfer is abandoned.
    /// There is no total timeout: files can be gigabytes.
    #[serde(default = "default_stall")]
    pub stall_timeout_secs: f64,
    /// How many more tries of one address after a transient failure
    /// (network, 408, 429, 5xx) before the next address; a try that
    /// received bytes does not count.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Backoff base in seconds: retry `n` waits a random time up to
    /// `retry_backoff_secs · 2ⁿ` (at most a minute).
    #[serde(default = "default_backoff")]
    pub retry_backoff_secs: f64,
    /// Longest `Retry-After` (on 429 and 503) honoured; a longer one moves
    /// on to the next address.
    #[serde(default = "default_retry_after_max")]
    pub retry_after_max_secs: f64,
    /// A transfer receiving fewer bytes than this in a minute is abandoned
    /// (0: no floor).
    #[serde(default = "default_min_per_min")]
    pub min_bytes_per_min: u64,
    /// Cap on all downloads of the process together, in bytes per second
    /// (unset: unlimited). The file may also give a rate as `--limit-rate`
    /// takes it, `"500k"` or `"2M"` ([`parse_rate`]).
    #[serde(default, deserialize_with = "rate::deserialize_opt")]
    pub max_bytes_per_sec: Option<u64>,
    /// Interrupted downloads are kept for resume this many days.
    #[serde(default = "default_partial_max_age")]
    pub partial_max_age_days: f64,
    /// Largest body auto-fill reads before giving up, in bytes.
    #[serde(default = "default_autofill_max")]
    pub autofill_max_bytes: u64,
    /// `"env"` (`HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`), `"none"`, or an
    /// `http://` or `https://` proxy URL.
    #[serde(default)]
    pub proxy: ProxyConfig,
    /// Let the proxy resolve names (`CONNECT <name>:<port>`): for networks
    /// where only the proxy can. The check of DNS answers is then lost.
    #[serde(default)]
    pub proxy_resolves: bool,
    /// Connections one large file is fetched over at once, in ranged
    /// parts (1: one stream); bounded by `service.max_per_host`.
    #[serde(default = "default_connections_per_file")]
    pub connections_per_file: usize,
    /// Fetch the parts of a large file from the url and its mirrors at
    /// once, instead of from the first address that works.
    #[serde(default)]
    pub spread_over_mirrors: bool,
    /// Seconds a download waits for another download of the same file
    /// from other addresses (another gem's) before it fetches from its own
    /// as well; also how long a new download reserves its whole declared
    /// size before its rate decides what it reserves.
    #[serde(default = "default_wait_for_others")]
    pub wait_for_others_secs: f64,
}

/// `[service]`: bounds on concurrent downloads, and the periodic retry of
/// failed required files.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ServiceConfig {
    /// Downloads running at once, across all hosts.
    #[serde(default = "default_max_downloads")]
    pub max_concurrent_downloads: usize,
    /// Downloads running at once against one host.
    #[serde(default = "default_max_per_host")]
    pub max_per_host: usize,
    /// How long after a required file's download failed it is queued
    /// again by a running service: `"10m"` (the default), `"30s"`, `"1h"`,
    /// or a number of seconds; `0` turns the periodic retry off (failed
    /// files then wait for the next start). A file that keeps failing waits
    /// twice as long each time, up to an hour (or this setting, when
    /// longer), and never less than a server's `Retry-After`.
    #[serde(default = "default_retry_failed_after", with = "duration_serde")]
    pub retry_failed_after: Duration,
}

/// Ten minutes.
fn default_retry_failed_after() -> Duration {
    Duration::from_secs(600)
}

fn default_mode() -> Mode {
    Mode::Blocklist
}
fn default_connect() -> f64 {
    10.0
}
fn default_wait_for_others() -> f64 {
    crate::store::lanes::DEFAULT_WAIT_FOR_OTHERS.as_secs_f64()
}

fn default_stall() -> f64 {
    30.0
}
fn default_retries() -> u32 {
    RetryPolicy::default().retries
}
fn default_retry_after_max() -> f64 {
    RetryPolicy::default().retry_after_max.as_secs_f64()
}
fn default_min_per_min() -> u64 {
    64 << 10
}
fn default_partial_max_age() -> f64 {
    7.0
}
fn default_backoff() -> f64 {
    RetryPolicy::default().backoff.as_secs_f64()
}
fn default_autofill_max() -> u64 {
    64 << 30
}
fn default_connections_per_file() -> usize {
    8
}
fn default_max_downloads() -> usize {
    8
}
/// HTTP/1.1 carries one transfer per connection. Eight per host, so that
/// one large file from a server that caps each connection gets all of
/// `network.connections_per_file` (8) by default, as `aria2c -x8` opens;
/// for many small files 8 measured no different from 6 (BENCHMARKS.md).
fn default_max_per_host() -> usize {
    8
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            mode: default_mode(),
            hosts: Vec::new(),
            connect_timeout_secs: default_connect(),
            stall_timeout_secs: default_stall(),
            retries: default_retries(),
            retry_backoff_secs: default_backoff(),
            retry_after_max_secs: default_retry_after_max(),
            min_bytes_per_min: default_min_per_min(),
            max_bytes_per_sec: None,
            partial_max_age_days: default_partial_max_age(),
            autofill_max_bytes: default_autofill_max(),
            proxy: ProxyConfig::Env,
            proxy_resolves: false,
            connections_per_file: default_connections_per_file(),
            spread_over_mirrors: false,
            wait_for_others_secs: default_wait_for_others(),
        }
    }
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            max_concurrent_downloads: default_max_downloads(),
            max_per_host: default_max_per_host(),
            retry_failed_after: default_retry_failed_after(),
        }
    }
}

/// A duration: a number of seconds, or text such as `"500ms"`, `"30s"`,
/// `"10m"`, `"1h"`, `"1d"`.
mod duration_serde {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Seconds(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = match Given::deserialize(d)? {
            Given::Seconds(secs) => Some(secs),
            Given::Text(text) => parse(&text),
        };
        secs.filter(|s| s.is_finite() && (0.0..1e9).contains(s))
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                serde::de::Error::custom(
                    "a duration must be a number of seconds or text such as \"30s\", \"10m\", \"1h\"",
                )
            })
    }

    /// Seconds of `"10m"`, `"1.5h"`, `"500ms"`, `"20"` (seconds).
    pub fn parse(text: &str) -> Option<f64> {
        let text = text.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let unit = match unit.trim() {
            "ms" => 0.001,
            "" | "s" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            _ => return None,
        };
        number.parse::<f64>().ok().map(|n| n * unit)
    }
}

mod mode_serde {
    use serde::{Deserialize, Deserializer};

    use crate::net::policy::Mode;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Mode, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "allowlist" => Ok(Mode::Allowlist),
            "blocklist" => Ok(Mode::Blocklist),
            other => Err(serde::de::Error::custom(format!(
                "mode must be \"allowlist\" or \"blocklist\", got {other:?}"
            ))),
        }
    }
}

impl Config {
    /// Reads a TOML file; relative paths in it resolve against its folder,
    /// and every path is made absolute and normalised (no `..`) here, once.
    /// An error names the file, the line and the key.
    ///
    /// Only a regular file of at most [`MAX_CONFIG_BYTES`] is read (a FIFO
    /// or a device is refused without waiting on it).
    pub fn load(path: &Path) -> Result<Config> {
        Config::from_text(path, &Config::read_text(path)?)
    }

    /// The text of the configuration file at `path`, read as
    /// [`Config::load`] does: a regular file only (never waiting on a FIFO),
    /// at most [`MAX_CONFIG_BYTES`], UTF-8.
    pub fn read_text(path: &Path) -> Result<String> {
        let io = |e| Error::io("cannot read configuration", path, e);
        let bytes = crate::manifest::read_regular_file(path, MAX_CONFIG_BYTES).map_err(io)?;
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("larger than the {MAX_CONFIG_BYTES}-byte limit"),
            )));
        }
        String::from_utf8(bytes)
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
    }

    /// [`Config::load`] of text already read from `path`: relative paths
    /// resolve against its folder, and the text's errors name the file.
    pub fn from_text(path: &Path, text: &str) -> Result<Config> {
        let path = normalise(path);
        let mut config =
            Config::parse(text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.resolve_paths(base);
        config.source = Some(path);
        Ok(config)
    }

    /// Parses TOML text (paths are kept as written). An error says on which
    /// line and for which key.
    pub fn parse(text: &str) -> std::result::Result<Config, crate::error::ConfigError> {
        // A byte-order mark (which Windows editors write) is skipped.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let config: Config =
            toml::from_str(text).map_err(|e| redact_userinfo(&locate(text, &e)))?;
        config.check().map_err(|e| redact_userinfo(&e))?;
        Ok(config)
    }

    /// The `[dev]` keys this configuration sets (see
    /// [`DevConfig::active_keys`]): development and test exemptions that a
    /// production setup never has, which a front end shows on every run.
    pub fn active_dev_keys(&self) -> Vec<&'static str> {
        self.dev.active_keys()
    }

    /// The default configuration file: `<config dir>/gem-resources/config.toml`,
    /// the config dir being `$XDG_CONFIG_HOME` or `~/.config` on Linux,
    /// `~/Library/Application Support` on macOS and `%APPDATA%` (roaming)
    /// on Windows.
    pub fn default_path() -> Option<PathBuf> {
        dirs::config_dir().map(|d| d.join("gem-resources").join("config.toml"))
    }

    /// The default store: `<local data dir>/gem-resources`, the local data
    /// dir being `$XDG_DATA_HOME` or `~/.local/share` on Linux,
    /// `~/Library/Application Support` on macOS and `%LOCALAPPDATA%` on
    /// Windows (large files stay on the machine, they do not roam); the
    /// temporary folder when none is known.
    pub fn default_store() -> PathBuf {
        dirs::data_local_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("gem-resources")
    }

    /// The store folder: the configured one or the default.
    pub fn store_dir(&self) -> PathBuf {
        self.store.clone().unwrap_or_else(Config::default_store)
    }

    /// Checks a configuration as [`Config::parse`] does (timeouts, limits,
    /// host patterns, the `[dev]` ranges): for one built in code.
    /// [`Config::net_settings`], and so opening the service or a
    /// [`Fetcher`](crate::Fetcher), runs the same checks.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(|e| Error::Config(redact_userinfo(&e)))
    }

    /// What the network side needs from this configuration, once it passes
    /// [`Config::validate`].
    pub fn net_settings(&self) -> Result<NetSettings> {
        self.validate()?;
        Ok(NetSettings {
            policy: self.policy()?,
            connect_timeout: self.connect_timeout(),
            stall_timeout: self.stall_timeout(),
            min_bytes_per_min: self.network.min_bytes_per_min,
            max_bytes_per_sec: self.network.max_bytes_per_sec,
            max_per_host: self.service.max_per_host,
            proxy: self.network.proxy.clone(),
            proxy_resolves: self.network.proxy_resolves,
            connections_per_file: self.network.connections_per_file,
            spread_over_mirrors: self.network.spread_over_mirrors,
            wait_for_others: Duration::from_secs_f64(self.network.wait_for_others_secs),
            resolve: self.dev.resolve.clone(),
            allow_addresses: self.dev.allow_addresses.clone(),
            extra_root_certs: self.dev.extra_root_certs.clone(),
            extra_root_pems: self.dev.extra_root_pems.clone(),
        })
    }

    /// The `[cache]` registry's settings, its password read from the
    /// variable or file named; `None` when no cache is configured.
    pub fn cache_settings(&self) -> Result<Option<crate::cache::CacheSettings>> {
        self.cache.settings()
    }

    /// The network policy described by `[network]`.
    pub fn policy(&self) -> Result<Policy> {
        Policy::new(self.network.mode, &self.network.hosts)
            .map_err(|e| Error::Config(redact_userinfo(&format!("network.hosts: {e}"))))
    }

    /// The policy a process using this configuration's store must apply:
    /// the store's last policy ([`crate::store::policy_record`]) when it
    /// is newer than the configuration file, else [`Config::policy`].
    pub fn effective_policy(&self) -> Result<Policy> {
        let record = crate::store::policy_record::read_in(&self.store_dir())?;
        Ok(crate::store::policy_record::effective(
            self.policy()?,
            self.source.as_deref(),
            record,
        ))
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.network.connect_timeout_secs)
    }

    /// How often to go over a resource's addresses again after transient
    /// failures, and how long to wait first.
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            retries: self.network.retries,
            backoff: Duration::from_secs_f64(self.network.retry_backoff_secs),
            retry_after_max: Duration::from_secs_f64(self.network.retry_after_max_secs),
        }
    }

    /// How long after a failure a running service queues a required file
    /// again (`service.retry_failed_after`); `None` when that is turned
    /// off (`0`).
    pub fn retry_failed_after(&self) -> Option<Duration> {
        let after = self.service.retry_failed_after;
        (!after.is_zero()).then_some(after)
    }

    /// How long an interrupted download is kept for resume.
    pub fn partial_max_age(&self) -> Duration {
        Duration::from_secs_f64(self.network.partial_max_age_days * 86_400.0)
    }

    /// The stall timeout.
    pub fn stall_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.network.stall_timeout_secs)
    }

    fn check(&self) -> std::result::Result<(), String> {
        for (name, value) in [
            (
                "network.connect_timeout_secs",
                self.network.connect_timeout_secs,
            ),
            (
                "network.stall_timeout_secs",
                self.network.stall_timeout_secs,
            ),
        ] {
            if !(value.is_finite() && value > 0.0 && value < 1e9) {
                return Err(format!("{name} must be a positive number of seconds"));
            }
        }
        for (name, value) in [
            (
                "network.retry_backoff_secs",
                self.network.retry_backoff_secs,
            ),
            (
                "network.retry_after_max_secs",
                self.network.retry_after_max_secs,
            ),
            (
                "network.partial_max_age_days",
                self.network.partial_max_age_days,
            ),
            (
                "network.wait_for_others_secs",
                self.network.wait_for_others_secs,
            ),
        ] {
            if !(value.is_finite() && (0.0..1e6).contains(&value)) {
                return Err(format!("{name} must be zero or more (and finite)"));
            }
        }
        if self.service.max_concurrent_downloads == 0 || self.service.max_per_host == 0 {
            return Err("service limits must be at least 1".into());
        }
        if !(1..=64).contains(&self.network.connections_per_file) {
            return Err("network.connections_per_file must be between 1 and 64".into());
        }
        Policy::new(self.network.mode, &self.network.hosts)
            .map_err(|e| format!("network.hosts: {e}"))?;
        self.cache.check()?;
        self.dev.check()
    }

    fn resolve_paths(&mut self, base: &Path) {
        if let Some(store) = &self.store {
            self.store = Some(normalise(&base.join(store)));
        }
        if let Some(file) = &self.cache.password_file {
            self.cache.password_file = Some(normalise(&base.join(file)));
        }
        if let cache::DockerConfig::File(file) = &self.cache.docker_config {
            self.cache.docker_config = cache::DockerConfig::File(normalise(&base.join(file)));
        }
        for cert in &mut self.dev.extra_root_certs {
            *cert = normalise(&base.join(&*cert));
        }
    }
}

/// `path` made absolute (against the working folder) with `.` and `..`
/// removed, so printed paths read `/home/u/store/…`, not
/// `/home/u/conf/../store/…`. Purely lexical: symbolic links are not
/// followed, and nothing needs to exist.
pub fn normalise(path: &Path) -> PathBuf {
    use std::path::Component;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for part in absolute.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                // `/..` is `/`.
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The table a `[table]` header line names, if the line is one.
fn header(line: &str) -> Option<&str> {
    let line = line.trim();
    (line.starts_with('[') && line.ends_with(']')).then(|| line.trim_matches(['[', ']']).trim())
}

/// A TOML error as `line N, key K: message`, with a hint for the commonest
/// slip, a text value without quotes.
fn locate(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end();
    let Some(span) = error.span() else {
        return message.to_string();
    };
    let start = span.start.min(text.len());
    let line_no = text[..start].matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or_default();
    let table = text.lines().take(line_no).filter_map(header).last();
    // The table the failing key is in: none for a table's own header.
    let within = table.filter(|_| header(line).is_none());
    let message = match keys::unknown_key(message, within, text.lines().find_map(header)) {
        Some(better) => better,
        None => message.to_string(),
    };
    let message = message.as_str();
    let Some((key, value)) = line.split_once('=') else {
        return format!("line {line_no}: {message}");
    };
    let key = key.trim();
    let key = match table {
        Some(t) if !line.trim_start().starts_with('[') => format!("{t}.{key}"),
        _ => key.to_string(),
    };
    let value = redact_token(value.trim());
    let value = value.as_str();
    let bare = value
        .chars()
        .next()
        .is_some_and(|c| !(c.is_ascii_digit() || "\"'[{+-".contains(c)))
        && !matches!(value, "true" | "false" | "inf" | "nan");
    let hint = if bare {
        format!(
            " (a text value needs quotes: {} = \"{value}\")",
            key.rsplit('.').next().unwrap_or(&key)
        )
    } else {
        String::new()
    };
    format!("line {line_no}, key {key}: {message}{hint}")
}

impl TryFrom<&Config> for NetSettings {
    type Error = Error;

    fn try_from(config: &Config) -> Result<NetSettings> {
        config.net_settings()
    }
}

/// `text` with the user name and password of every address in it replaced
/// by `***` (`http://***@proxy.corp:3128`), so that no configuration error
/// shows a secret. An address is a run of characters between white space,
/// quotes, brackets, commas and `=` with an `@` before its first `/`.
pub(crate) fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut token = String::new();
    for c in text.chars() {
        if c.is_whitespace() || "\"'`()[]{}<>,=".contains(c) {
            out.push_str(&redact_token(&token));
            token.clear();
            out.push(c);
        } else {
            token.push(c);
        }
    }
    out.push_str(&redact_token(&token));
    out
}

/// One address with what stands before the last `@` of its authority
/// (after `scheme://`, before the first `/`, `?` or `#`) replaced by `***`.
fn redact_token(token: &str) -> String {
    let start = token.find("://").map_or(0, |i| i + 3);
    let rest = &token[start..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{}***{}", &token[..start], &rest[at..]),
        None => token.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    #[test]
    fn empty_file_gives_production_defaults() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.network.mode, Mode::Blocklist);
        assert!(c.network.hosts.is_empty());
        assert_eq!(c.connect_timeout(), Duration::from_secs(10));
        assert_eq!(c.stall_timeout(), Duration::from_secs(30));
        assert!(c.dev.allow_addresses.is_empty());
        assert!(c.dev.resolve.is_empty());
        assert!(c.dev.extra_root_certs.is_empty());
    }

    #[test]
    fn the_periodic_retry_takes_a_duration_and_zero_turns_it_off() {
        let after = |text: &str| {
            Config::parse(&format!("[service]\nretry_failed_after = {text}"))
                .map(|c| c.retry_failed_after())
        };
        let default = Config::parse("").unwrap().retry_failed_after();
        assert_eq!(default, Some(Duration::from_secs(600)));
        assert_eq!(after("\"5s\"").unwrap(), Some(Duration::from_secs(5)));
        assert_eq!(after("\"10m\"").unwrap(), Some(Duration::from_secs(600)));
        assert_eq!(after("\"1h\"").unwrap(), Some(Duration::from_secs(3600)));
        assert_eq!(
            after("\"250ms\"").unwrap(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(after("90").unwrap(), Some(Duration::from_secs(90)));
        assert_eq!(after("0.5").unwrap(), Some(Duration::from_millis(500)));
        assert_eq!(after("0").unwrap(), None);
        for bad in ["\"10 parsecs\"", "\"m\"", "-1", "\"\"", "true"] {
            assert!(after(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn full_example_parses() {
        let c = Config::parse(
            r#"
store = "data"
[network]
mode = "allowlist"
hosts = ["cdn.example.com", "*.example.org"]
connect_timeout_secs = 5
stall_timeout_secs = 0.5
[dev]
extra_root_certs = ["ca.pem"]
resolve = { "cdn.test" = ["127.0.0.1"] }
allow_addresses = ["127.0.0.1/32", "::1/128"]
"#,
        )
        .unwrap();
        assert_eq!(c.network.mode, Mode::Allowlist);
        assert_eq!(c.stall_timeout(), Duration::from_millis(500));
        assert_eq!(
            c.dev.resolve["cdn.test"],
            vec!["127.0.0.1".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn misspelt_keys_and_bad_values_are_refused() {
        assert!(Config::parse("[network]\nmdoe = \"allowlist\"").is_err());
        assert!(Config::parse("[network]\nmode = \"denylist\"").is_err());
        assert!(Config::parse("[network]\nstall_timeout_secs = 0").is_err());
        assert!(Config::parse("[network]\nhosts = [\"*\"]").is_err());
        assert!(Config::parse("[dev]\nallow_addresses = [\"not-a-net\"]").is_err());
    }

    #[test]
    fn config_errors_never_show_a_password() {
        for (text, shown) in [
            (
                "[network]\nproxy = http://user:secret@proxy.corp:3128\n",
                "(a text value needs quotes: proxy = \"http://***@proxy.corp:3128\")",
            ),
            (
                "[network]\nproxy = http://u:sec ret@proxy.corp:3128\n",
                "proxy = \"http://***@proxy.corp:3128\")",
            ),
            (
                "[network]\nproxy = user:secret@proxy.corp:3128\n",
                "proxy = \"***@proxy.corp:3128\"",
            ),
            (
                "[network]\nproxy = https://u:p@ss:secret@proxy.corp:8443/x\n",
                "proxy = \"https://***@proxy.corp:8443/x\"",
            ),
            (
                "[network]\nhosts = [\"http://u:secret@cdn.example.com/\"]\n",
                "network.hosts: invalid host pattern \"http://***@cdn.example.com/\"",
            ),
            (
                "[dev]\nallow_addresses = [\"u:secret@127.0.0.1\"]\n",
                "\"***@127.0.0.1\" is neither an address",
            ),
            (
                "[network]\nmode = \"http://u:secret@x\"\n",
                "got \"http://***@x\"",
            ),
        ] {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(!e.contains("secret"), "{text:?}: {e}");
            assert!(e.contains(shown), "{text:?}: {e}");
        }
    }

    #[test]
    fn redaction_keeps_text_without_userinfo() {
        for text in [
            "line 2, key network.proxy: invalid string (a text value needs quotes: proxy = \"http://proxy.corp:3128/a@b\")",
            "dev.allow_addresses: 0.0.0.0/0 covers public addresses",
            "/home/me/config.toml: line 1",
        ] {
            assert_eq!(redact_userinfo(text), text);
        }
        assert_eq!(
            redact_userinfo("a (http://u:pw@h:1), 'x:y@z' and=k@l"),
            "a (http://***@h:1), '***@z' and=***@l"
        );
    }

    #[test]
    fn relative_paths_resolve_against_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "store = \"s\"\n[dev]\nextra_root_certs = [\"ca.pem\"]\n",
        )
        .unwrap();
        let c = Config::load(&path).unwrap();
        assert_eq!(c.store_dir(), dir.path().join("s"));
        assert_eq!(c.dev.extra_root_certs, vec![dir.path().join("ca.pem")]);
    }
}
