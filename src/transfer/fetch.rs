//! HTTPS transfers under the address rules.
//!
//! Every hop of a transfer (the address itself and each redirect) goes
//! through [`Fetcher::check_hop`]: `https` only, the user's policy, and no
//! local or internal-network host. Redirects are followed here, by hand, at
//! most [`MAX_REDIRECTS`] times; the client itself never follows one. Names
//! are resolved by [`GuardedResolver`], so the addresses the client connects
//! to are the ones that passed the guard.
//!
//! Through a proxy ([`crate::net::proxy`]), the hop's address is resolved and
//! vetted the same way and the proxy is asked to `CONNECT` to that address,
//! never to the name (`tunnel`); only `[network] proxy_resolves`
//! hands the name over.
//!
//! The request and redirect exchange of each hop is in
//! `exchange`; the body loop into the sink in
//! `stream`: each chunk is counted as it arrives (a body
//! that runs past the declared size is cut off at once) and handed to the
//! sink, which batches chunks to a writer thread that hashes and writes them
//! (`sink`); the batches are bounded, so memory stays constant whatever the
//! size. A large file whose server answers ranges exactly is fetched in
//! parts over several connections ([`parts`](super::parts)).
//!
//! The user's policy is live for the whole transfer: the policy version is
//! taken before the first hop is checked, and the current hop is checked
//! again after every wait (a host slot, connect and TLS, the response head),
//! right before the request is written and on every change while the body
//! arrives.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use std::sync::{Arc, RwLock};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use url::{Host, Url};

use crate::error::{Attempt, AttemptError, Error, Result};
use crate::net::connecting::{permitted, permitted_address};
use crate::net::guard::{normalise_host, AddressGuard};
use crate::net::hosts::HostSlots;
use crate::net::policy::Policy;
use crate::net::pool::Pool;
use crate::net::proxy::ProxySettings;
use crate::net::resolve::{GuardedResolver, SystemLookup};
use crate::net::throttle::Throttle;
use crate::net::tunnel::Tunnels;
use crate::net::NetSettings;
use crate::store::partial::PartialPaths;

/// Redirects followed at most; the next one is refused.
pub const MAX_REDIRECTS: usize = 5;

/// A large file is split into ranged parts only while its first connection
/// brings less than this (bytes per second, over the parts' rate window of
/// 250 ms): CDNs that cap one connection do so well below it, and a
/// connection above it keeps a core busy already (decryption, SHA-256, the
/// copy into the page cache).
pub const SPLIT_BELOW_BYTES_PER_SEC: u64 = 64 << 20;

/// A first request answered this long after it was sent (connection and
/// TLS set-up included) came from a far server: its file is split into
/// parts at once. Its connection cannot reach [`SPLIT_BELOW_BYTES_PER_SEC`]
/// before many round trips of slow start, so measuring it would only keep
/// the other parts waiting (on a link of 160 ms, a round trip per look). On
/// loopback and in a LAN the answer comes within milliseconds.
pub const FAR_ANSWER: Duration = Duration::from_millis(100);

/// What the bytes must be.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// Exact size in bytes.
    pub size: u64,
    /// SHA-256, 64 lowercase hex digits.
    pub sha256: &'a str,
}

/// A finished transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes received.
    pub size: u64,
    /// Their SHA-256, lowercase hex.
    pub sha256: String,
    /// The URL that finally answered 200 (after redirects).
    pub final_url: Url,
}

/// Why a transfer failed: the address, something on this machine, or a
/// cancellation.
#[derive(Debug)]
pub(crate) enum TransferError {
    /// The address failed; the same address may be retried or the next one
    /// tried ([`crate::transfer::retry`] decides).
    Attempt(Attempt),
    /// Writing locally failed; trying another address would not help.
    Local(Error),
    /// The caller cancelled; every byte received is kept.
    Cancelled,
}

/// Receives a transfer's progress.
pub trait Reporter: Send {
    /// A connection to the address (or a redirect target, or a tunnel
    /// through the proxy) was made, or one kept open from an earlier
    /// request answered: every rule refusing it before any connection
    /// (scheme, policy, address) passed.
    fn connected(&mut self) {}
    /// The server agreed to continue a kept partial file at `offset`.
    fn resumed(&mut self, offset: u64) {
        let _ = offset;
    }
    /// Bytes of the file present so far (a resumed prefix included).
    fn bytes(&mut self, total: u64);
    /// The whole file is `total` bytes, as the server announced
    /// (`Content-Length`, plus a resumed prefix); reported only when no
    /// size was declared (auto-fill).
    fn length(&mut self, total: u64) {
        let _ = total;
    }
    /// A try failed for `reason` and the same address is tried again in
    /// `wait`: that will be try `attempt` of at most `of`.
    fn retrying(&mut self, wait: Duration, attempt: u32, of: u32, reason: &str) {
        let _ = (wait, attempt, of, reason);
    }
    /// Another download of the same file (in this process or another one
    /// sharing the store) holds its lock: this one waits for it to finish.
    fn waiting(&mut self) {}
    /// [`Reporter::waiting`], naming the gem whose download this one waits
    /// for (`None`: not known, or a download by hand). By default, calls
    /// [`Reporter::waiting`].
    fn waiting_on(&mut self, gem: Option<&str>) {
        let _ = gem;
        self.waiting();
    }
    /// A try of `address` (the url or a mirror, as declared) begins; the
    /// reports that follow are about it.
    fn trying(&mut self, address: &Url) {
        let _ = address;
    }
    /// `failed` was the last try of its address: the download goes on with
    /// the next address, `next`.
    fn fell_back(&mut self, failed: &Attempt, next: &Url) {
        let _ = (failed, next);
    }
    /// Every byte of the file arrived and its size and SHA-256 matched: what
    /// is left is local (making the file durable and giving it its name),
    /// and the network is no longer used for it.
    fn transferred(&mut self) {}
}

impl<F: FnMut(u64) + Send> Reporter for F {
    fn bytes(&mut self, total: u64) {
        self(total)
    }
}

/// Bytes kept from an earlier, interrupted transfer of the same address.
#[derive(Debug, Clone)]
pub(crate) struct Resume {
    /// How many (all flushed to disk).
    pub offset: u64,
    /// The validator that address gave them, sent as `If-Range`.
    pub validator: String,
    /// Kept ranges beyond `offset` (`[start, end)`, sorted, apart, all
    /// flushed), from a transfer in parts; a transfer in parts asks only
    /// for the ranges between them, one stream ignores them.
    pub ranges: Vec<[u64; 2]>,
}

/// Where a transfer's bytes go.
pub(crate) enum Output<'a> {
    /// Nowhere: they are only counted and hashed (auto-fill).
    Discard,
    /// The resource's partial file, continuing `resume` when the server
    /// agrees. The file is touched only once a response is accepted, so a
    /// partial file kept for another address survives a failed try.
    Partial {
        /// The partial file's paths.
        paths: &'a PartialPaths,
        /// Kept bytes of this very address, if any.
        resume: Option<Resume>,
        /// Other sources of the same bytes that parts may come from at
        /// once (`network.spread_over_mirrors`); empty: this address only.
        also: &'a [Url],
    },
}

/// The per-transfer context: cancellation and progress.
pub(crate) struct Control<'a> {
    /// Stops the transfer (bytes kept).
    pub cancel: Option<&'a CancellationToken>,
    /// Progress.
    pub reporter: &'a mut dyn Reporter,
}

/// The `[cache]` registry and the fetcher its blobs come through
/// (`transfer::cached`).
pub(crate) struct CacheRoute {
    /// The registry.
    pub(crate) cache: Arc<crate::cache::Cache>,
    /// Its fetcher: its own guard, connections and timeouts.
    pub(crate) fetcher: Fetcher,
}

/// Downloads over HTTPS under the scheme, policy and address rules.
#[derive(Clone)]
pub struct Fetcher {
    /// The HTTP client (no redirects, no proxy, guarded resolver) and the
    /// connections it keeps open between requests, dropped on every policy
    /// change.
    pub(super) pool: Arc<Pool>,
    /// Resolves names and filters the answers.
    pub(super) resolver: GuardedResolver,
    /// The user's allowlist or blocklist; replaced live by [`Fetcher::set_policy`].
    pub(super) policy: Arc<RwLock<Policy>>,
    /// Bumped on every policy change, so transfers in flight re-check their
    /// current host.
    pub(super) policy_version: Arc<watch::Sender<u64>>,
    /// Longest wait for the next byte (or the response head).
    pub(super) stall: Duration,
    /// Connect timeout, added to the wait for a response head.
    pub(super) connect: Duration,
    /// Fewer bytes than this in a minute abandons a transfer (0: no floor).
    pub(super) min_per_minute: u64,
    /// How long the minimum-progress rule looks back.
    pub(super) progress_window: Duration,
    /// `network.wait_for_others_secs`.
    pub(super) wait_for_others: Duration,
    /// The process-wide bandwidth cap.
    pub(super) throttle: Throttle,
    /// Connections per host (`service.max_per_host`), counted on the host
    /// each hop actually connects to.
    pub(super) hosts: HostSlots,
    /// Which hops go through a proxy.
    pub(super) proxy: Arc<ProxySettings>,
    /// Opens the tunnels through it.
    pub(super) tunnels: Tunnels,
    /// Connections one large file is fetched over at once
    /// (`network.connections_per_file`, at most `service.max_per_host`).
    pub(super) parts: usize,
    /// Whether the parts come from the url and its mirrors at once
    /// (`network.spread_over_mirrors`).
    pub(super) spread: bool,
    /// A large file is split into parts only while its first connection
    /// brings less than this, in bytes per second.
    pub(super) split_below: u64,
    /// A first request answered this long or more after it was sent is
    /// from a far server: its file is split at once.
    pub(super) far_answer: Duration,
    /// The `[cache]` registry, asked for every file first, and the fetcher
    /// its blobs come through (`None`: no cache).
    pub(super) cache: Option<Arc<CacheRoute>>,
    /// A cache's own fetcher: the registry whose hops get its
    /// `Authorization` (and no other hop).
    pub(super) authorize: Option<Arc<crate::cache::Cache>>,
}

/// How a transfer of an address would connect (see [`Fetcher::route`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Straight to the addresses that passed the guard.
    Direct,
    /// Through a proxy.
    Proxy {
        /// The proxy, without credentials.
        proxy: String,
        /// What the proxy is asked to `CONNECT` to: a vetted `ip:port`, or
        /// `name:port` when the proxy resolves names.
        connect: String,
        /// The addresses that passed the guard (empty when the proxy
        /// resolves names).
        addresses: Vec<IpAddr>,
    },
}

/// How long the minimum-progress rule looks back.
pub const PROGRESS_WINDOW: Duration = Duration::from_secs(60);

impl Fetcher {
    /// Builds a fetcher from the configuration (`&Config`, or anything else
    /// that yields [`NetSettings`]), taking the proxy variables
    /// (`HTTPS_PROXY`, `NO_PROXY`, …) from the process environment.
    pub fn new<S>(settings: S) -> Result<Fetcher>
    where
        S: TryInto<NetSettings, Error = Error>,
    {
        let settings = settings.try_into()?;
        let proxy = ProxySettings::from_env(&settings.proxy, settings.proxy_resolves)?;
        Fetcher::from_settings(settings, proxy)
    }

    /// Builds a fetcher from the configuration with these proxy settings.
    pub fn with_proxy<S>(settings: S, proxy: ProxySettings) -> Result<Fetcher>
    where
        S: TryInto<NetSettings, Error = Error>,
    {
        Fetcher::from_settings(settings.try_into()?, proxy)
    }

    /// Builds a fetcher from network settings and proxy settings.
    pub fn from_settings(settings: NetSettings, proxy: ProxySettings) -> Result<Fetcher> {
        crate::install_crypto_provider();
        let names: Vec<String> = settings.resolve.keys().cloned().collect();
        let guard = if settings.allow_addresses.is_empty() && names.is_empty() {
            AddressGuard::new()
        } else {
            AddressGuard::with_exemptions(settings.allow_addresses.clone(), names)
        };
        let policy = Arc::new(RwLock::new(settings.policy.clone()));
        let resolver =
            GuardedResolver::with_policy(guard, settings.resolve.clone(), policy.clone());
        let certs =
            crate::net::tls::extra_roots(&settings.extra_root_certs, &settings.extra_root_pems)?;
        // One TLS configuration for every client and tunnel of this
        // fetcher: one session store, so new connections resume.
        let tls = Arc::new(crate::net::tls::client_config(certs)?);
        let pool = Pool::new(tls, resolver.clone(), settings.connect_timeout)?;
        let tunnels = Tunnels::new(pool.tls(), settings.connect_timeout);
        Ok(Fetcher {
            pool: Arc::new(pool),
            resolver,
            policy,
            policy_version: Arc::new(watch::channel(0).0),
            stall: settings.stall_timeout,
            connect: settings.connect_timeout,
            min_per_minute: settings.min_bytes_per_min,
            progress_window: PROGRESS_WINDOW,
            wait_for_others: settings.wait_for_others,
            throttle: Throttle::new(settings.max_bytes_per_sec),
            hosts: HostSlots::new(settings.max_per_host),
            proxy: Arc::new(proxy),
            tunnels,
            parts: settings
                .connections_per_file
                .min(settings.max_per_host)
                .max(1),
            spread: settings.spread_over_mirrors,
            split_below: SPLIT_BELOW_BYTES_PER_SEC,
            far_answer: FAR_ANSWER,
            cache: None,
            authorize: None,
        })
    }

    /// The same fetcher with the minimum-progress rule
    /// (`network.min_bytes_per_min`) measured over `window` instead of
    /// [`PROGRESS_WINDOW`], within one try and across the tries of one
    /// address.
    pub fn with_progress_window(mut self, window: Duration) -> Fetcher {
        self.progress_window = window;
        self
    }

    /// The same fetcher splitting a large file into parts only while its
    /// first connection brings less than `bytes_per_sec` (measured over
    /// [`RATE_WINDOW`](crate::transfer::parts::RATE_WINDOW)) instead of
    /// [`SPLIT_BELOW_BYTES_PER_SEC`]:
    /// 0 never splits, `u64::MAX` splits at the first look.
    pub fn with_split_below(mut self, bytes_per_sec: u64) -> Fetcher {
        self.split_below = bytes_per_sec;
        self
    }

    /// The same fetcher splitting a large file into parts at once when its
    /// first request took `after` or more to be answered (a far server)
    /// instead of [`FAR_ANSWER`];
    /// `Duration::MAX` never does. A fetcher that never splits
    /// ([`Fetcher::with_split_below`] 0) does not either.
    pub fn with_far_answer(mut self, after: Duration) -> Fetcher {
        self.far_answer = after;
        self
    }

    /// The same fetcher asking `lookup` for every name without a fixed
    /// answer (`[dev] resolve`) instead of the system's DNS: a resolver of
    /// the app's own, or a test's. Its answers pass the address guard and
    /// the policy like any other, and connections kept open are checked
    /// against them before every request. Fails only as
    /// [`Fetcher::new`] would.
    pub fn with_system_lookup(mut self, lookup: Arc<dyn SystemLookup>) -> Result<Fetcher> {
        self.resolver = self.resolver.with_system(lookup);
        let pool = Pool::new(self.pool.tls(), self.resolver.clone(), self.connect)?;
        self.pool = Arc::new(pool);
        Ok(self)
    }

    /// `network.min_bytes_per_min` (0: no floor) and the window it is
    /// measured over.
    pub(crate) fn progress_floor(&self) -> (u64, Duration) {
        (self.min_per_minute, self.progress_window)
    }

    /// How long a download waits for another gem's download of the same
    /// file (`network.wait_for_others_secs`).
    pub(crate) fn wait_for_others(&self) -> Duration {
        self.wait_for_others
    }

    /// The network policy in force.
    pub fn policy(&self) -> Policy {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the network policy. Once this returns, no new request goes
    /// to a host it does not permit: it applies to every connection and
    /// redirect hop from now on, and a transfer in flight whose current hop
    /// it no longer permits (waiting for a host slot, connecting, waiting
    /// for the response head or receiving the body) stops within a second,
    /// its bytes kept for resume. That try fails with an attempt of code
    /// `E_RESOURCE_POLICY`, which moves on to the next address; a download
    /// whose every address failed ends with `E_RESOURCE_UNAVAILABLE`, whose
    /// [`Error::primary_cause`] is then `E_RESOURCE_POLICY`.
    ///
    /// The policy's IP entries apply to the address each connection dialled
    /// too: a transfer reading from an address the new policy refuses stops
    /// the same way, even when its URL named a host that resolved to it.
    /// Connections kept open between requests are all dropped, so the next
    /// request goes on a new connection vetted under the new policy.
    pub fn set_policy(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = policy;
        self.pool.drop_connections();
        if let Some(route) = &self.cache {
            route.fetcher.pool.drop_connections();
        }
        self.policy_version.send_modify(|v| *v += 1);
    }

    /// Checks one hop without resolving: scheme, policy, then the host by
    /// name or as an IP literal (in any spelling the URL parser accepts).
    pub fn check_hop(&self, url: &Url) -> Result<(), AttemptError> {
        crate::net::connecting::check_hop(&self.policy, self.guard(), url)
    }

    /// Whether the parts of a large file come from all its addresses at
    /// once.
    pub(crate) fn spreads(&self) -> bool {
        self.spread && self.parts > 1
    }

    /// The policy part of [`Fetcher::check_hop`], re-run on a live change.
    pub(super) fn check_policy(&self, url: &Url) -> Result<(), AttemptError> {
        permitted(&self.policy, url)
    }

    /// [`Fetcher::check_policy`] for a hop being read, and the policy's IP
    /// entries for the address its connection dialled (`None`: not known,
    /// as through a proxy that resolves names).
    pub(super) fn check_live(
        &self,
        url: &Url,
        dialled: Option<IpAddr>,
    ) -> Result<(), AttemptError> {
        self.check_policy(url)?;
        match dialled {
            Some(ip) => permitted_address(&self.policy, url, ip),
            None => Ok(()),
        }
    }

    /// Applies the address rules to `url`, resolving its name (connecting to
    /// nothing). Returns the addresses a transfer would connect to.
    pub async fn check_url(&self, url: &Url) -> Result<Vec<IpAddr>, AttemptError> {
        self.check_hop(url)?;
        match url.host() {
            Some(Host::Domain(name)) => self.resolver.lookup(name).await,
            Some(Host::Ipv4(ip)) => Ok(vec![IpAddr::V4(ip)]),
            Some(Host::Ipv6(ip)) => Ok(vec![IpAddr::V6(ip)]),
            None => Err(AttemptError::Network {
                reason: "address has no host".into(),
            }),
        }
    }

    /// Applies the address rules to `url` as a transfer would and says how
    /// it would connect: directly, or through which proxy to which
    /// `CONNECT` target. Connects to nothing.
    pub async fn route(&self, url: &Url) -> Result<Route, AttemptError> {
        self.check_hop(url)?;
        let Some(proxy) = self.proxy.proxy_for_url(url).cloned() else {
            return Ok(Route::Direct);
        };
        let (connect, addresses) = self.connect_target(url).await?;
        Ok(Route::Proxy {
            proxy: proxy.to_string(),
            connect,
            addresses,
        })
    }

    /// The `CONNECT` target for `url`: its IP literal, or the first
    /// address its name resolves to that passed the guard; the name itself
    /// only when the proxy resolves names. Also returns the vetted
    /// addresses.
    pub(super) async fn connect_target(
        &self,
        url: &Url,
    ) -> Result<(String, Vec<IpAddr>), AttemptError> {
        let port = url.port_or_known_default().unwrap_or(443);
        let addresses = match url.host() {
            Some(Host::Domain(name)) if self.proxy.proxy_resolves() => {
                return Ok((format!("{}:{port}", normalise_host(name)), Vec::new()));
            }
            Some(Host::Domain(name)) => self.resolver.lookup(name).await?,
            Some(Host::Ipv4(ip)) => vec![IpAddr::V4(ip)],
            Some(Host::Ipv6(ip)) => vec![IpAddr::V6(ip)],
            None => Vec::new(),
        };
        let first = addresses.first().ok_or_else(|| AttemptError::Network {
            reason: "address has no host".into(),
        })?;
        Ok((SocketAddr::new(*first, port).to_string(), addresses))
    }

    /// Downloads `url` by the same rules as a resource and returns its size
    /// and SHA-256, keeping nothing. Reads at most `max_bytes`.
    pub async fn autofill(&self, url: &Url, max_bytes: u64) -> Result<Transfer> {
        self.autofill_with_progress(url, max_bytes, &mut |_| {})
            .await
    }

    /// [`Fetcher::autofill`], reporting the bytes received so far.
    pub async fn autofill_with_progress(
        &self,
        url: &Url,
        max_bytes: u64,
        progress: &mut dyn Reporter,
    ) -> Result<Transfer> {
        let control = Control {
            cancel: None,
            reporter: progress,
        };
        match self
            .transfer(url, None, max_bytes, Output::Discard, control)
            .await
        {
            Ok(t) => Ok(t),
            Err(TransferError::Attempt(a)) => Err(a.into()),
            Err(TransferError::Local(e)) => Err(e),
            Err(TransferError::Cancelled) => Err(Error::Cancelled {
                resource: url.to_string(),
                reason: "stopped before it finished".into(),
            }),
        }
    }

    pub(super) fn guard(&self) -> &AddressGuard {
        self.resolver.guard()
    }
}
