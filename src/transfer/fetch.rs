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
//! The body is streamed: each chunk is counted as it arrives (a body that
//! runs past the declared size is cut off at once) and handed to the sink,
//! which batches chunks to a writer thread that hashes and writes them
//! (`sink`); the batches are bounded, so memory stays constant
//! whatever the size.
//!
//! The user's policy is live for the whole transfer: the policy version is
//! taken before the first hop is checked, and the current hop is checked
//! again after every wait (a host slot, connect and TLS, the response head),
//! right before the request is written and on every change while the body
//! arrives.

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
use crate::net::connecting::{permitted, Connecting, ReportConnections, CONNECTING};
use crate::net::guard::{normalise_host, AddressGuard, Blocked};
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
    /// A connection to the address (or a redirect target, or a tunnel
    /// through the proxy) was made: every rule refusing it before any
    /// connection (scheme, policy, address) passed.
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
    /// How long the minimum-progress rule looks back.
    progress_window: Duration,
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
            .dns_resolver(resolver.clone())
            .connector_layer(ReportConnections);
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
            progress_window: PROGRESS_WINDOW,
            throttle: Throttle::new(settings.max_bytes_per_sec),
            hosts: HostSlots::new(settings.max_per_host),
            proxy: Arc::new(proxy),
            tunnels,
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

    /// `network.min_bytes_per_min` (0: no floor) and the window it is
    /// measured over.
    pub(crate) fn progress_floor(&self) -> (u64, Duration) {
        (self.min_per_minute, self.progress_window)
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
        permitted(&self.policy, url)
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
        // Taken before the first hop is checked: a change from here on is
        // seen, whatever the transfer is waiting for.
        let mut policy_changes = self.policy_version.subscribe();
        let (hop, mut response, offset, _host_permit) = loop {
            let head = tokio::select! {
                head = self.response_head(address, resume.as_ref(), limit, &mut policy_changes, &mut *control.reporter) => head,
                () = &mut cancelled => return Err(TransferError::Cancelled),
            };
            match head {
                Ok(head) => break head,
                Err(HeadError::Attempt(hop, error)) => return Err(fail(&hop, error)),
                Err(HeadError::RangeRefused(hop, why)) => {
                    // The kept bytes cannot be continued: start afresh.
                    tracing::debug!(%hop, "resume refused: {why}; starting from zero");
                    if let Some(paths) = paths {
                        let paths = paths.clone();
                        let _ = tokio::task::spawn_blocking(move || paths.remove()).await;
                    }
                    resume = None;
                }
            }
        };
        if let Some(detail) = announced_mismatch(&response, expected, limit, offset) {
            return Err(fail(&hop, size_error(expected, limit, detail)));
        }
        if offset > 0 {
            control.reporter.resumed(offset);
        }
        if let (None, Some(announced)) = (expected, response.content_length()) {
            control.reporter.length(offset.saturating_add(announced));
        }
        let mut sink = match paths {
            None => Sink::hash_only(),
            Some(paths) => {
                let validator = match (offset, &resume) {
                    (1.., Some(r)) => Some(r.validator.clone()),
                    _ => validator(&response),
                };
                open_sink(paths, address, offset, validator).await?
            }
        };
        let sink_path = paths.map(|p| p.data.clone()).unwrap_or_default();
        let body = Body {
            hop: &hop,
            response: &mut response,
            sink: &mut sink,
            sink_path: &sink_path,
            received: offset,
            expected,
            limit,
        };
        // Every way out before `finish` closes the sink first, so the kept
        // bytes are flushed and recorded before anyone looks at them.
        let failure = self
            .receive(
                body,
                cancelled.as_mut(),
                &mut policy_changes,
                control.reporter,
                &fail,
            )
            .await?;
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

    /// Reads the body into its sink until it ends (`Ok(None)`) or the try
    /// fails (`Ok(Some(failure))`, the sink still to be closed): the
    /// cancellation, the live policy, checkpoints, the stall timer, the
    /// size limit, the progress floor and the bandwidth cap. `Err` is a
    /// local failure.
    async fn receive<C: std::future::Future<Output = ()>>(
        &self,
        body: Body<'_>,
        mut cancelled: std::pin::Pin<&mut C>,
        policy: &mut watch::Receiver<u64>,
        reporter: &mut dyn Reporter,
        fail: &(dyn Fn(&Url, AttemptError) -> TransferError + Sync),
    ) -> Result<Option<TransferError>, TransferError> {
        let Body {
            hop,
            response,
            sink,
            sink_path,
            mut received,
            expected,
            limit,
        } = body;
        let mut window = (Instant::now(), received);
        let mut checkpoints = tokio::time::interval(crate::transfer::sink::CHECKPOINT_EVERY);
        checkpoints.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        checkpoints.reset();
        // The stall timer runs from the last byte, whatever else wakes the
        // loop.
        let mut stall_at = Instant::now() + self.stall;
        loop {
            let next = tokio::select! {
                biased;
                () = cancelled.as_mut() => return Ok(Some(TransferError::Cancelled)),
                Ok(()) = policy.changed() => {
                    match self.check_policy(hop) {
                        Ok(()) => continue,
                        Err(e) => return Ok(Some(fail(hop, e))),
                    }
                }
                _ = checkpoints.tick() => {
                    sink.checkpoint().await.map_err(|e| local_write(sink_path, e))?;
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
                    return Ok(Some(fail(hop, AttemptError::Network { reason })));
                }
                Ok(Err(e)) => {
                    return Ok(Some(fail(hop, body_error(&e, received, expected, limit))))
                }
                Ok(Ok(None)) => return Ok(None),
                Ok(Ok(Some(chunk))) => chunk,
            };
            stall_at = Instant::now() + self.stall;
            let len = chunk.len();
            received += len as u64;
            if received > limit {
                let detail = format!("received more than {limit} bytes");
                return Ok(Some(fail(hop, size_error(expected, limit, detail))));
            }
            sink.write(chunk)
                .await
                .map_err(|e| local_write(sink_path, e))?;
            reporter.bytes(received);
            if let Err(reason) = self.check_progress(&mut window, received) {
                return Ok(Some(fail(hop, AttemptError::Network { reason })));
            }
            if self.throttle.is_limited() {
                tokio::select! {
                    () = self.throttle.take(len) => {}
                    () = cancelled.as_mut() => return Ok(Some(TransferError::Cancelled)),
                }
            }
        }
    }

    /// The minimum-progress rule: fewer than `network.min_bytes_per_min`
    /// bytes in a window of [`PROGRESS_WINDOW`] abandons the transfer, so a
    /// server dripping a byte just under the stall timeout cannot hold a
    /// download slot forever. A transfer that keeps moving faster than the
    /// floor is never cut, however long it takes.
    fn check_progress(&self, window: &mut (Instant, u64), received: u64) -> Result<(), String> {
        let (since, at_start) = *window;
        if since.elapsed() < self.progress_window {
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
    ///
    /// Every wait (the host slot, the connection, the head) watches
    /// `policy` and stops when the hop is no longer permitted; the hop is
    /// checked again right before its request is sent.
    async fn response_head(
        &self,
        address: &Url,
        resume: Option<&Resume>,
        limit: u64,
        policy: &mut watch::Receiver<u64>,
        reporter: &mut dyn Reporter,
    ) -> Result<(Url, Response, u64, HostPermit), HeadError> {
        let mut hop = address.clone();
        let mut redirects = 0;
        loop {
            let attempt = |hop: &Url, error| HeadError::Attempt(hop.clone(), error);
            self.check_hop(&hop).map_err(|e| attempt(&hop, e))?;
            let host = hop.host_str().unwrap_or_default();
            let permit = self
                .live(&hop, policy, None, self.hosts.enter(host))
                .await
                .map_err(|e| attempt(&hop, e))?;
            self.check_policy(&hop).map_err(|e| attempt(&hop, e))?;
            let response = self
                .live(&hop, policy, Some(&mut *reporter), self.send(&hop, resume))
                .await
                .and_then(|sent| sent)
                .and_then(|response| self.check_policy(&hop).map(|()| response))
                .map_err(|e| attempt(&hop, e))?;
            let status = response.status().as_u16();
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                if redirects == MAX_REDIRECTS {
                    return Err(attempt(
                        &hop,
                        AttemptError::Redirects {
                            limit: MAX_REDIRECTS,
                        },
                    ));
                }
                let next = next_hop(&hop, &response).map_err(|e| attempt(&hop, e))?;
                tracing::debug!(from = %hop, to = %next, "redirect");
                redirects += 1;
                hop = next;
                continue;
            }
            let offset = head_offset(&hop, &response, resume, limit).map_err(|e| *e)?;
            return Ok((hop, response, offset, permit));
        }
    }

    /// Runs `wait` for `hop` while watching the policy: a change that no
    /// longer permits the hop stops the wait with the policy failure. With
    /// a `reporter`, a connection made while waiting is reported.
    async fn live<T>(
        &self,
        hop: &Url,
        policy: &mut watch::Receiver<u64>,
        mut reporter: Option<&mut dyn Reporter>,
        wait: impl std::future::Future<Output = T>,
    ) -> Result<T, AttemptError> {
        let connected = Arc::new(tokio::sync::Notify::new());
        let connecting = Connecting {
            made: connected.clone(),
            policy: self.policy.clone(),
            hop: hop.clone(),
        };
        let wait = CONNECTING.scope(connecting, wait);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                biased;
                Ok(()) = policy.changed() => self.check_policy(hop)?,
                () = connected.notified(), if reporter.is_some() => {
                    if let Some(r) = reporter.take() {
                        r.connected();
                    }
                }
                out = &mut wait => return Ok(out),
            }
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
    /// tunnel to the vetted address. The hop is checked against the policy
    /// again once the tunnel is open, right before the request is written.
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
                .body(http_body_util::Empty::new())
                .map_err(|e| AttemptError::Network {
                    reason: format!("cannot build the request: {e}"),
                })?;
        request.headers_mut().extend(request_headers(resume));
        let check = || self.check_policy(url);
        let response = self
            .tunnels
            .send(proxy, &target, url, request, &check)
            .await?;
        Ok(Response::Proxied(response))
    }

    async fn send_direct(
        &self,
        url: &Url,
        resume: Option<&Resume>,
    ) -> Result<reqwest::Response, AttemptError> {
        self.client
            .get(url.clone())
            .headers(request_headers(resume))
            .send()
            .await
            .map_err(|e| request_error(&e))
    }
}

/// The headers of every request, direct or through a proxy: no
/// compression, and `Range` with `If-Range` when resuming.
fn request_headers(resume: Option<&Resume>) -> reqwest::header::HeaderMap {
    use reqwest::header::HeaderValue;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(USER_AGENT, HeaderValue::from_static(user_agent()));
    headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    if let Some(r) = resume {
        let range = HeaderValue::from_str(&format!("bytes={}-", r.offset));
        // The validator was checked when it was kept (visible ASCII).
        let validator = HeaderValue::from_str(&r.validator);
        if let (Ok(range), Ok(validator)) = (range, validator) {
            headers.insert(RANGE, range);
            headers.insert(IF_RANGE, validator);
        }
    }
    headers
}

/// Where the body of an accepted response head starts: 0 for a `200`, the
/// kept offset for a `206` that continues exactly the kept bytes (its
/// start, end and total checked); anything else is refused.
fn head_offset(
    hop: &Url,
    response: &Response,
    resume: Option<&Resume>,
    limit: u64,
) -> Result<u64, Box<HeadError>> {
    let status = response.status().as_u16();
    match (status, resume) {
        (200, _) => Ok(0),
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
                    Ok(r.offset)
                }
                other => {
                    let why = format!("206 with Content-Range {other:?}");
                    Err(Box::new(HeadError::RangeRefused(hop.clone(), why)))
                }
            }
        }
        (416, Some(_)) => Err(Box::new(HeadError::RangeRefused(hop.clone(), "416".into()))),
        _ => {
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| headers::parse_retry_after(v.as_bytes(), SystemTime::now()));
            Err(Box::new(HeadError::Attempt(
                hop.clone(),
                AttemptError::Http {
                    status,
                    retry_after,
                },
            )))
        }
    }
}

/// The `User-Agent` of every request.
fn user_agent() -> &'static str {
    concat!("gem-resources/", env!("CARGO_PKG_VERSION"))
}

/// One response body being read into its sink ([`Fetcher::receive`]).
struct Body<'a> {
    /// The hop that answered.
    hop: &'a Url,
    /// Its response.
    response: &'a mut Response,
    /// Where the bytes go.
    sink: &'a mut Sink,
    /// The partial file, for error messages (empty when discarding).
    sink_path: &'a std::path::Path,
    /// Bytes of the file present before the body (the resumed offset).
    received: u64,
    /// What the bytes must be.
    expected: Option<Expected<'a>>,
    /// The most bytes the file may have.
    limit: u64,
}

/// Why a response's announced length cannot be the rest of the file
/// after `offset`, if it cannot.
fn announced_mismatch(
    response: &Response,
    expected: Option<Expected<'_>>,
    limit: u64,
    offset: u64,
) -> Option<String> {
    let announced = response.content_length()?;
    let rest = limit - offset;
    let exact = expected.is_some() || offset > 0;
    if announced <= rest && !(exact && announced != rest) {
        return None;
    }
    let detail = format!("the server announced {announced} bytes");
    Some(match offset {
        0 => detail,
        _ => format!("{detail} for the rest after byte {offset}"),
    })
}

/// Opens the partial file (on the blocking threads) and a sink writing to
/// it from `offset`, its records naming `address` and `validator`.
async fn open_sink(
    paths: &PartialPaths,
    address: &Url,
    offset: u64,
    validator: Option<String>,
) -> Result<Sink, TransferError> {
    let opening = paths.clone();
    let file = tokio::task::spawn_blocking(move || opening.open_data())
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        .map_err(|e| local_write(&paths.data, e))?;
    Ok(Sink::to_file(Target {
        file,
        offset,
        checkpoints: Checkpointer::new(paths, address.as_str(), validator),
    }))
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

/// The next hop of a redirect: its `Location` resolved against the
/// current hop by [`headers::join_location`] (the parser the fuzz target
/// runs). A missing, empty or unparsable `Location` is one failure with a
/// short reason, never a redirect to the current hop.
fn next_hop(current: &Url, response: &Response) -> Result<Url, AttemptError> {
    let status = response.status().as_u16();
    let location = response.headers().get(LOCATION).ok_or(AttemptError::Http {
        status,
        retry_after: None,
    })?;
    headers::join_location(current, location.as_bytes()).map_err(|why| AttemptError::Network {
        reason: format!("redirect ({status}): {why}"),
    })
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
        if let Some(refused @ AttemptError::Policy { .. }) = s.downcast_ref::<AttemptError>() {
            return refused.clone();
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
