//! What the network side needs to know, handed down by the layer above
//! (`Config::net_settings` builds it from the configuration file), so that
//! the network code never reads the configuration itself.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use crate::net::policy::Policy;
use crate::net::proxy::ProxyConfig;

/// The network settings of a [`Fetcher`](crate::Fetcher): from
/// [`Config::net_settings`](crate::Config::net_settings), whose fields can
/// then be changed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NetSettings {
    /// The user's allowlist or blocklist at start (replaceable live).
    pub policy: Policy,
    /// Longest wait for a TCP connection.
    pub connect_timeout: Duration,
    /// Longest wait for the next byte (or, added to the connect timeout,
    /// the response head).
    pub stall_timeout: Duration,
    /// Fewer bytes than this in a minute abandons a transfer (0: no floor).
    pub min_bytes_per_min: u64,
    /// The cap on all transfers of the process together (`None`: no cap).
    pub max_bytes_per_sec: Option<u64>,
    /// Connections at once to any one host.
    pub max_per_host: usize,
    /// Which proxy to use (`[network] proxy`).
    pub proxy: ProxyConfig,
    /// Whether the proxy resolves names (`[network] proxy_resolves`).
    pub proxy_resolves: bool,
    /// Connections one large file is fetched over at once
    /// (`[network] connections_per_file`).
    pub connections_per_file: usize,
    /// Whether the parts of a file come from its url and mirrors at once
    /// (`[network] spread_over_mirrors`).
    pub spread_over_mirrors: bool,
    /// How long a download waits for another gem's download of the same
    /// file before it fetches from its own addresses too, and how long a new
    /// download reserves its whole size (`[network] wait_for_others_secs`).
    pub wait_for_others: Duration,
    /// Development only: fixed DNS answers (`[dev] resolve`).
    pub resolve: BTreeMap<String, Vec<IpAddr>>,
    /// Development only: ranges exempt from the address rule
    /// (`[dev] allow_addresses`).
    pub allow_addresses: Vec<IpNet>,
    /// Development only: PEM files trusted besides the system roots
    /// (`[dev] extra_root_certs`).
    pub extra_root_certs: Vec<PathBuf>,
    /// Development only: PEM text trusted besides the system roots
    /// (`[dev] extra_root_pems`).
    pub extra_root_pems: Vec<String>,
}
