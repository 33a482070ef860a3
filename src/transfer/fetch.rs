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
//! The body is streamed: each chunk is counted, hashed and written before the
//! next is read, so memory stays constant whatever the size, and a body that
//! runs past the declared size is cut off at once.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use reqwest::header::{
    ACCEPT_ENCODING, CONTENT_RANGE, ETAG, IF_RANGE, LAST_MODIFIED, LOCATION, RANGE, RETRY_AFTER,
    USER_AGENT,
};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use url::{Host, Url};

use crate::error::{Attempt, AttemptError, Error, Result};
use crate::net::guard::{AddressGuard, Blocked};
use crate::net::headers;
use crate::net::hosts::{HostPermit, HostSlots};
use crate::net::policy::Policy;
use crate::net::proxy::{ProxySettings, ProxyUrl};
use crate::net::reason::chain;
use crate::net::resolve::{GuardedResolver, LookupRefused};
use crate::net::response::{BodyError, Response};
use crate::net::throttle::Throttle;
use crate::net::tunnel::Tunnels;
use crate::net::NetSettings;
use crate::store::partial::{Checkpointer, PartialPaths};
use crate::transfer::sink::{Sink, Target};

/// Redirects followed at most; the next one is refused.
pub const MAX_REDIRECTS: usize = 5;

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
    /// The server agreed to continue a kept partial file at `offset`.
    fn resumed(&mut self, offset: u64) {
        let _ = offset;
    }
    /// Bytes of the file present so far (a resumed prefix included).
    fn bytes(&mut self, total: u64);
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
    },
}

/// The per-transfer context: cancellation and progress.
pub(crate) struct Control<'a> {
    /// Stops the transfer (bytes kept).
    pub cancel: Option<&'a CancellationToken>,
    /// Progress.
    pub reporter: &'a mut dyn Reporter,
}

/// Downloads over HTTPS under the scheme, policy and address rules.
#[derive(Clone)]
pub struct Fetcher {
    /// HTTP client: no redirects, no proxy, guarded resolver.
    client: reqwest::Client,
    /// Resolves names and filters the answers.
    resolver: GuardedResolver,
    /// The user's allowlist or blocklist; replaced live by [`Fetcher::set_policy`].
    policy: Arc<RwLock<Policy>>,
    /// Bumped on every policy change, so transfers in flight re-check their
    /// current host.
    policy_version: Arc<watch::Sender<u64>>,
    /// Longest wait for the next byte (or the response head).
    stall: Duration,
    /// Connect timeout, added to the wait for a response head.
    connect: Duration,
    /// Fewer bytes than this in a minute abandons a transfer (0: no floor).
    min_per_minute: u64,
    /// The process-wide bandwidth cap.
    throttle: Throttle,
    /// Connections per host (`service.max_per_host`), counted on the host
    /// each hop actually connects to.
    hosts: HostSlots,
    /// Which hops go through a proxy.
    proxy: Arc<ProxySettings>,
    /// Opens the tunnels through it.
    tunnels: Tunnels,
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
        let resolver = GuardedResolver::new(guard, settings.resolve.clone());
        let mut certs = Vec::new();
        for path in &settings.extra_root_certs {
            certs.extend(crate::net::tls::read_pem_certs(path)?);
        }
        let tunnels = Tunnels::new(
            crate::net::tls::client_config(certs.clone())?,
            settings.connect_timeout,
        );
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .referer(false)
            .connect_timeout(settings.connect_timeout)
            .tcp_nodelay(true)
            .dns_resolver(resolver.clone());
        if !certs.is_empty() {
            builder = builder.tls_backend_preconfigured(crate::net::tls::client_config(certs)?);
        }
        let client = builder
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {}", chain(&e))))?;
        Ok(Fetcher {
            client,
            resolver,
            policy: Arc::new(RwLock::new(settings.policy)),
            policy_version: Arc::new(watch::channel(0).0),
            stall: settings.stall_timeout,
            connect: settings.connect_timeout,
            min_per_minute: settings.min_bytes_per_min,
            throttle: Throttle::new(settings.max_bytes_per_sec),
            hosts: HostSlots::new(settings.max_per_host),
            proxy: Arc::new(proxy),
            tunnels,
        })
    }

    /// The network policy in force.
    pub fn policy(&self) -> Policy {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the network policy. It applies to every connection and
    /// redirect hop from now on, and transfers in flight whose current host
    /// it no longer permits stop within a second with `E_RESOURCE_POLICY`
    /// (their bytes kept for resume).
    pub fn set_policy(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = policy;
        self.policy_version.send_modify(|v| *v += 1);
    }

    /// Checks one hop without resolving: scheme, policy, then the host by
    /// name or as an IP literal (in any spelling the URL parser accepts).
    pub fn check_hop(&self, url: &Url) -> Result<(), AttemptError> {
        if url.scheme() != "https" {
            return Err(AttemptError::Scheme {
                scheme: url.scheme().to_string(),
            });
        }
        if !url.username().is_empty() || url.password().is_some() {
            // They would be sent as a Basic authorization header and end up
            // in logs and failure records.
            return Err(AttemptError::Credentials);
        }
        let host = url.host().ok_or_else(|| AttemptError::Network {
            reason: "address has no host".into(),
        })?;
        if let Host::Domain(name) = host {
            // `blocked.test..` must not slip past a policy or guard that
            // strips one trailing dot: only one is allowed at all.
            let labels = name.strip_suffix('.').unwrap_or(name);
            if labels.is_empty() || labels.split('.').any(str::is_empty) {
                return Err(AttemptError::Address(Blocked {
                    address: name.to_string(),
                    reason: "malformed host name (empty label)".into(),
                }));
            }
        }
        self.check_policy(url)?;
        self.guard().check_host(&host)?;
        Ok(())
    }

    /// The policy part of [`Fetcher::check_hop`], re-run on a live change.
    fn check_policy(&self, url: &Url) -> Result<(), AttemptError> {
        let Some(host) = url.host() else {
            return Ok(());
        };
        let text = host_text(&host);
        let policy = self.policy.read().unwrap_or_else(|p| p.into_inner());
        if policy.permits(&text) {
            Ok(())
        } else {
            Err(AttemptError::Policy {
                host: text,
                mode: policy.mode().as_str(),
            })
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
    async fn connect_target(&self, url: &Url) -> Result<(String, Vec<IpAddr>), AttemptError> {
        let port = url.port_or_known_default().unwrap_or(443);
        let addresses = match url.host() {
            Some(Host::Domain(name)) if self.proxy.proxy_resolves() => {
                return Ok((format!("{}:{port}", name.trim_end_matches('.')), Vec::new()));
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

    fn guard(&self) -> &AddressGuard {
        self.resolver.guard()
    }

    /// Fetches one address (following redirects) into `output`, counting
    /// and hashing as bytes arrive. With `expected`, the size and digest
    /// must match; without, at most `max` bytes are read.
    pub(crate) async fn transfer(
        &self,
        address: &Url,
        expected: Option<Expected<'_>>,
        max: u64,
        output: Output<'_>,
        control: Control<'_>,
    ) -> Result<Transfer, TransferError> {
        let fail = |hop: &Url, error: AttemptError| {
            TransferError::Attempt(Attempt {
                address: address.clone(),
                hop: (hop != address).then(|| hop.clone()),
                error,
            })
        };
        let limit = expected.map_or(max, |e| e.size);
        let (paths, mut resume) = match output {
            Output::Discard => (None, None),
            Output::Partial { paths, resume } => (Some(paths), resume),
        };
        let cancelled = async {
            match control.cancel {
                Some(token) => token.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(cancelled);
        let (hop, mut response, offset, _host_permit) = loop {
            let head = tokio::select! {
                head = self.response_head(address, resume.as_ref(), limit) => head,
                () = &mut cancelled => return Err(TransferError::Cancelled),
            };
            match head {
                Ok(head) => break head,
                Err(HeadError::Attempt(hop, error)) => return Err(fail(&hop, error)),
                Err(HeadError::RangeRefused(hop, why)) => {
                    // The kept bytes cannot be continued: start afresh.
                    tracing::debug!(%hop, "resume refused: {why}; starting from zero");
                    if let Some(paths) = paths {
                        paths.remove();
                    }
                    resume = None;
                }
            }
        };
        if let Some(announced) = response.content_length() {
            let rest = limit - offset;
            let exact = expected.is_some() || offset > 0;
            if announced > rest || (exact && announced != rest) {
                let detail = format!("the server announced {announced} bytes");
                let detail = match offset {
                    0 => detail,
                    _ => format!("{detail} for the rest after byte {offset}"),
                };
                return Err(fail(&hop, size_error(expected, limit, detail)));
            }
        }
        if offset > 0 {
            control.reporter.resumed(offset);
        }
        let mut sink = match paths {
            None => Sink::hash_only(),
            Some(paths) => {
                let validator = match (offset, &resume) {
                    (1.., Some(r)) => Some(r.validator.clone()),
                    _ => validator(&response),
                };
                let file = paths.open_data().map_err(|e| local_write(&paths.data, e))?;
                Sink::to_file(Target {
                    file,
                    offset,
                    checkpoints: Checkpointer::new(paths, address.as_str(), validator),
                })
            }
        };
        let sink_path = paths.map(|p| p.data.clone()).unwrap_or_default();
        let mut policy_changes = self.policy_version.subscribe();
        let mut received = offset;
        let mut window = (Instant::now(), received);
        let mut checkpoints = tokio::time::interval(crate::transfer::sink::CHECKPOINT_EVERY);
        checkpoints.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        checkpoints.reset();
        // The stall timer runs from the last byte, whatever else wakes the
        // loop.
        let mut stall_at = Instant::now() + self.stall;
        // Every way out before `finish` closes the sink first, so the kept
        // bytes are flushed and recorded before anyone looks at them.
        let failure: Option<TransferError> = loop {
            let next = tokio::select! {
                biased;
                () = &mut cancelled => break Some(TransferError::Cancelled),
                Ok(()) = policy_changes.changed() => {
                    match self.check_policy(&hop) {
                        Ok(()) => continue,
                        Err(e) => break Some(fail(&hop, e)),
                    }
                }
                _ = checkpoints.tick() => {
                    if let Err(e) = sink.checkpoint().await {
                        return Err(local_write(&sink_path, e));
                    }
                    continue;
                }
                next = tokio::time::timeout_at(stall_at, response.chunk()) => next,
            };
            let chunk = match next {
                Err(_) => {
                    let reason = format!(
                        "stalled: no data for {}s after {received} bytes",
                        self.stall.as_secs_f64()
                    );
                    break Some(fail(&hop, AttemptError::Network { reason }));
                }
                Ok(Err(e)) => break Some(fail(&hop, body_error(&e, received, expected, limit))),
                Ok(Ok(None)) => break None,
                Ok(Ok(Some(chunk))) => chunk,
            };
            stall_at = Instant::now() + self.stall;
            let len = chunk.len();
            received += len as u64;
            if received > limit {
                let detail = format!("received more than {limit} bytes");
                break Some(fail(&hop, size_error(expected, limit, detail)));
            }
            if let Err(e) = sink.write(chunk).await {
                return Err(local_write(&sink_path, e));
            }
            control.reporter.bytes(received);
            if let Err(reason) = self.check_progress(&mut window, received) {
                break Some(fail(&hop, AttemptError::Network { reason }));
            }
            if self.throttle.is_limited() {
                tokio::select! {
                    () = self.throttle.take(len) => {}
                    () = &mut cancelled => break Some(TransferError::Cancelled),
                }
            }
        };
        if let Some(failure) = failure {
            sink.close().await;
            return Err(failure);
        }
        let finished = sink
            .finish()
            .await
            .map_err(|e| local_write(&sink_path, e))?;
        if let Some(e) = expected {
            if finished.len != e.size {
                let detail = format!("received only {} bytes", finished.len);
                return Err(fail(&hop, size_error(expected, limit, detail)));
            }
            if finished.sha256 != e.sha256 {
                let error = AttemptError::Sha256 {
                    expected: e.sha256.to_string(),
                    actual: finished.sha256,
                };
                return Err(fail(&hop, error));
            }
        }
        Ok(Transfer {
            size: finished.len,
            sha256: finished.sha256,
            final_url: hop,
        })
    }

    /// The minimum-progress rule: fewer than `network.min_bytes_per_min`
    /// bytes in a window of [`PROGRESS_WINDOW`] abandons the transfer, so a
    /// server dripping a byte just under the stall timeout cannot hold a
    /// download slot forever. A transfer that keeps moving faster than the
    /// floor is never cut, however long it takes.
    fn check_progress(&self, window: &mut (Instant, u64), received: u64) -> Result<(), String> {
        let (since, at_start) = *window;
        if since.elapsed() < PROGRESS_WINDOW {
            return Ok(());
        }
        let moved = received - at_start;
        if self.min_per_minute > 0 && moved < self.min_per_minute {
            return Err(format!(
                "too slow: {moved} bytes in the last minute (minimum {} bytes per minute)",
                self.min_per_minute
            ));
        }
        *window = (Instant::now(), received);
        Ok(())
    }

    /// Sends the request (with `Range` and `If-Range` when resuming) and
    /// follows redirects until a response whose body can be read: a `200`,
    /// or a `206` that continues exactly the kept bytes. Returns the final
    /// hop, the response and the offset its body starts at.
    async fn response_head(
        &self,
        address: &Url,
        resume: Option<&Resume>,
        limit: u64,
    ) -> Result<(Url, Response, u64, HostPermit), HeadError> {
        let mut hop = address.clone();
        let mut redirects = 0;
        loop {
            self.check_hop(&hop)
                .map_err(|e| HeadError::Attempt(hop.clone(), e))?;
            let permit = self.hosts.enter(hop.host_str().unwrap_or_default()).await;
            let response = self
                .send(&hop, resume)
                .await
                .map_err(|e| HeadError::Attempt(hop.clone(), e))?;
            let status = response.status().as_u16();
            let attempt = |error| HeadError::Attempt(hop.clone(), error);
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                if redirects == MAX_REDIRECTS {
                    return Err(attempt(AttemptError::Redirects {
                        limit: MAX_REDIRECTS,
                    }));
                }
                let next = next_hop(&hop, &response).map_err(attempt)?;
                tracing::debug!(from = %hop, to = %next, "redirect");
                redirects += 1;
                hop = next;
                continue;
            }
            let offset = match (status, resume) {
                (200, _) => 0,
                (206, Some(r)) => {
                    let range = response
                        .headers()
                        .get(CONTENT_RANGE)
                        .and_then(|v| headers::parse_content_range(v.as_bytes()));
                    match range {
                        Some(cr)
                            if cr.start == r.offset
                                && cr.total == Some(limit)
                                && cr.end.checked_add(1) == Some(limit) =>
                        {
                            r.offset
                        }
                        other => {
                            let why = format!("206 with Content-Range {other:?}");
                            return Err(HeadError::RangeRefused(hop, why));
                        }
                    }
                }
                (416, Some(_)) => {
                    return Err(HeadError::RangeRefused(hop, "416".into()));
                }
                _ => {
                    let retry_after = response
                        .headers()
                        .get(RETRY_AFTER)
                        .and_then(|v| headers::parse_retry_after(v.as_bytes(), SystemTime::now()));
                    return Err(attempt(AttemptError::Http {
                        status,
                        retry_after,
                    }));
                }
            };
            return Ok((hop, response, offset, permit));
        }
    }

    /// Sends the request for one hop, directly or through the proxy, and
    /// waits for the response head.
    async fn send(&self, url: &Url, resume: Option<&Resume>) -> Result<Response, AttemptError> {
        let wait = self.connect + self.stall;
        let proxy = self.proxy.proxy_for_url(url).cloned();
        let sent = async {
            match &proxy {
                None => self.send_direct(url, resume).await.map(Response::Direct),
                Some(proxy) => self.send_proxied(proxy, url, resume).await,
            }
        };
        match tokio::time::timeout(wait, sent).await {
            Ok(result) => result,
            Err(_) => Err(AttemptError::Network {
                reason: format!("no response within {}s", wait.as_secs_f64()),
            }),
        }
    }

    /// [`Fetcher::send`] through `proxy`: the same request headers, over a
    /// tunnel to the vetted address.
    async fn send_proxied(
        &self,
        proxy: &ProxyUrl,
        url: &Url,
        resume: Option<&Resume>,
    ) -> Result<Response, AttemptError> {
        let (target, _) = self.connect_target(url).await?;
        let mut request =
            http::Request::get(&url[url::Position::BeforePath..url::Position::AfterQuery])
                .header(
                    reqwest::header::HOST,
                    &url[url::Position::BeforeHost..url::Position::AfterPort],
                )
                .header(USER_AGENT, user_agent())
                .header(ACCEPT_ENCODING, "identity");
        if let Some(r) = resume {
            request = request
                .header(RANGE, format!("bytes={}-", r.offset))
                .header(IF_RANGE, r.validator.as_str());
        }
        let request =
            request
                .body(http_body_util::Empty::new())
                .map_err(|e| AttemptError::Network {
                    reason: format!("cannot build the request: {e}"),
                })?;
        let response = self.tunnels.send(proxy, &target, url, request).await?;
        Ok(Response::Proxied(response))
    }

    async fn send_direct(
        &self,
        url: &Url,
        resume: Option<&Resume>,
    ) -> Result<reqwest::Response, AttemptError> {
        let mut request = self
            .client
            .get(url.clone())
            .header(USER_AGENT, user_agent())
            .header(ACCEPT_ENCODING, "identity");
        if let Some(r) = resume {
            request = request
                .header(RANGE, format!("bytes={}-", r.offset))
                .header(IF_RANGE, r.validator.as_str());
        }
        request.send().await.map_err(|e| request_error(&e))
    }
}

/// The `User-Agent` of every request.
fn user_agent() -> &'static str {
    concat!("gem-resources/", env!("CARGO_PKG_VERSION"))
}

/// Why no readable response head came.
enum HeadError {
    /// The hop failed.
    Attempt(Url, AttemptError),
    /// The server does not continue the kept bytes as asked.
    RangeRefused(Url, String),
}

/// The validator a response gives its bytes: a strong `ETag`, else
/// `Last-Modified`.
fn validator(response: &Response) -> Option<String> {
    let h = response.headers();
    h.get(ETAG)
        .and_then(|v| headers::parse_strong_etag(v.as_bytes()))
        .or_else(|| {
            h.get(LAST_MODIFIED)
                .and_then(|v| headers::parse_last_modified(v.as_bytes()))
        })
}

/// A write of the partial file at `path` failed: `E_RESOURCE_DISK_SPACE`
/// (with what was still needed and what is free) when the disk is full,
/// `E_RESOURCE_IO` otherwise.
fn local_write(path: &std::path::Path, e: std::io::Error) -> TransferError {
    TransferError::Local(crate::store::partial_write_failed(
        "cannot write download",
        path,
        e,
    ))
}

fn size_error(expected: Option<Expected<'_>>, limit: u64, detail: String) -> AttemptError {
    match expected {
        Some(e) => AttemptError::Size {
            expected: e.size,
            detail,
        },
        None => AttemptError::Size {
            expected: limit,
            detail: format!("{detail} (auto-fill limit)"),
        },
    }
}

fn next_hop(current: &Url, response: &Response) -> Result<Url, AttemptError> {
    let status = response.status().as_u16();
    let location = response.headers().get(LOCATION).ok_or(AttemptError::Http {
        status,
        retry_after: None,
    })?;
    let text = location.to_str().map_err(|_| AttemptError::Network {
        reason: format!("redirect ({status}) with a Location that is not text"),
    })?;
    current.join(text).map_err(|e| AttemptError::Network {
        reason: format!(
            "redirect ({status}) to an invalid Location {:?}: {e}",
            crate::error::shorten(text)
        ),
    })
}

fn host_text(host: &Host<&str>) -> String {
    match host {
        Host::Domain(d) => d.to_string(),
        Host::Ipv4(ip) => ip.to_string(),
        Host::Ipv6(ip) => ip.to_string(),
    }
}

/// Maps a request error, recovering a refused lookup from the chain.
fn request_error(e: &reqwest::Error) -> AttemptError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<LookupRefused>() {
            return refused.0.clone();
        }
        if let Some(blocked) = s.downcast_ref::<Blocked>() {
            return AttemptError::Address(blocked.clone());
        }
        source = s.source();
    }
    let host = e.url().and_then(|u| u.host_str()).unwrap_or_default();
    AttemptError::Network {
        reason: crate::net::reason::network_reason(e, host),
    }
}

/// A body that broke off. A reset or timeout is the network's fault; a
/// connection closed early is the server sending too few bytes.
fn body_error(
    e: &BodyError,
    received: u64,
    expected: Option<Expected<'_>>,
    limit: u64,
) -> AttemptError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | TimedOut
            ) {
                let why = crate::net::reason::network_reason(e, "");
                return AttemptError::Network {
                    reason: format!("{why} after {received} bytes"),
                };
            }
        }
        source = s.source();
    }
    let detail = format!(
        "the connection closed after {received} bytes ({})",
        crate::net::reason::network_reason(e, "")
    );
    size_error(expected, limit, detail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn fetcher(min_per_minute: u64) -> Fetcher {
        let mut config = Config::default();
        config.network.min_bytes_per_min = min_per_minute;
        Fetcher::new(&config).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_transfer_below_the_progress_floor_is_abandoned_after_a_minute() {
        let f = fetcher(64 << 10);
        let mut window = (Instant::now(), 0);
        // A byte every 29 seconds stays under any stall timeout of 30 s...
        let mut received = 0;
        for _ in 0..2 {
            tokio::time::advance(Duration::from_secs(29)).await;
            received += 1;
            assert!(f.check_progress(&mut window, received).is_ok());
        }
        tokio::time::advance(Duration::from_secs(29)).await;
        received += 1;
        // ...but not the floor, once a minute has passed.
        let reason = f.check_progress(&mut window, received).unwrap_err();
        assert!(reason.contains("too slow"), "{reason}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_but_steady_transfer_is_never_cut() {
        let f = fetcher(64 << 10);
        let mut window = (Instant::now(), 0);
        let mut received = 0;
        // 2 KiB a second (120 KiB a minute) for an hour.
        for _ in 0..3600 {
            tokio::time::advance(Duration::from_secs(1)).await;
            received += 2048;
            assert!(f.check_progress(&mut window, received).is_ok());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_floor_disables_the_rule() {
        let f = fetcher(0);
        let mut window = (Instant::now(), 0);
        tokio::time::advance(Duration::from_secs(600)).await;
        assert!(f.check_progress(&mut window, 1).is_ok());
    }
}
