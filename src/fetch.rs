//! HTTPS transfers under the address rules.
//!
//! Every hop of a transfer (the address itself and each redirect) goes
//! through [`Fetcher::check_hop`]: `https` only, the user's policy, and no
//! local or internal-network host. Redirects are followed here, by hand, at
//! most [`MAX_REDIRECTS`] times; the client itself never follows one. Names
//! are resolved by [`GuardedResolver`], so the addresses the client connects
//! to are the ones that passed the guard.
//!
//! The body is streamed: each chunk is counted, hashed and written before the
//! next is read, so memory stays constant whatever the size, and a body that
//! runs past the declared size is cut off at once.

use std::net::IpAddr;
use std::time::Duration;

use reqwest::header::{ACCEPT_ENCODING, LOCATION, USER_AGENT};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use url::{Host, Url};

use crate::config::Config;
use crate::error::{Attempt, AttemptError, Error, Result};
use crate::guard::{AddressGuard, Blocked};
use crate::policy::Policy;
use crate::resolve::{GuardedResolver, LookupRefused};

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

/// Why a transfer failed: the address, or something on this machine.
#[derive(Debug)]
pub(crate) enum TransferError {
    /// The address failed; the next one may be tried.
    Attempt(Attempt),
    /// Writing locally failed; trying another address would not help.
    Local(Error),
}

/// Downloads over HTTPS under the scheme, policy and address rules.
#[derive(Clone)]
pub struct Fetcher {
    /// HTTP client: no redirects, no proxy, guarded resolver.
    client: reqwest::Client,
    /// Resolves names and filters the answers.
    resolver: GuardedResolver,
    /// The user's allowlist or blocklist.
    policy: Policy,
    /// Longest wait for the next byte (or the response head).
    stall: Duration,
    /// Connect timeout, added to the wait for a response head.
    connect: Duration,
}

impl Fetcher {
    /// Builds a fetcher from the configuration.
    pub fn new(config: &Config) -> Result<Fetcher> {
        crate::install_crypto_provider();
        let names: Vec<String> = config.dev.resolve.keys().cloned().collect();
        let guard = if config.dev.allow_addresses.is_empty() && names.is_empty() {
            AddressGuard::new()
        } else {
            AddressGuard::with_exemptions(config.dev.allow_addresses.clone(), names)
        };
        let resolver = GuardedResolver::new(guard, config.dev.resolve.clone());
        let mut certs = Vec::new();
        for path in &config.dev.extra_root_certs {
            certs.extend(crate::tls::read_pem_certs(path)?);
        }
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .referer(false)
            .connect_timeout(config.connect_timeout())
            .dns_resolver(resolver.clone());
        if !certs.is_empty() {
            builder = builder.tls_backend_preconfigured(crate::tls::client_config(certs)?);
        }
        let client = builder
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {}", chain(&e))))?;
        Ok(Fetcher {
            client,
            resolver,
            policy: config.policy()?,
            stall: config.stall_timeout(),
            connect: config.connect_timeout(),
        })
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
        let text = host_text(&host);
        if !self.policy.permits(&text) {
            return Err(AttemptError::Policy {
                host: text,
                mode: self.policy.mode().as_str(),
            });
        }
        self.guard().check_host(&host)?;
        Ok(())
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

    /// Downloads `url` by the same rules as a resource and returns its size
    /// and SHA-256, keeping nothing. Reads at most `max_bytes`.
    pub async fn autofill(&self, url: &Url, max_bytes: u64) -> Result<Transfer> {
        let mut sink = tokio::io::sink();
        match self
            .transfer(url, None, max_bytes, &mut sink, &mut |_| {})
            .await
        {
            Ok(t) => Ok(t),
            Err(TransferError::Attempt(a)) => Err(a.into()),
            Err(TransferError::Local(e)) => Err(e),
        }
    }

    fn guard(&self) -> &AddressGuard {
        self.resolver.guard()
    }

    /// Fetches one address (following redirects) into `out`, counting and
    /// hashing as bytes arrive. With `expected`, the size and digest must
    /// match; without, at most `max` bytes are read.
    pub(crate) async fn transfer<W: AsyncWrite + Unpin>(
        &self,
        address: &Url,
        expected: Option<Expected<'_>>,
        max: u64,
        out: &mut W,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<Transfer, TransferError> {
        let mut hop = address.clone();
        let fail = |hop: &Url, error: AttemptError| {
            TransferError::Attempt(Attempt {
                address: address.clone(),
                hop: (hop != address).then(|| hop.clone()),
                error,
            })
        };
        let limit = expected.map_or(max, |e| e.size);
        let mut redirects = 0;
        let mut response = loop {
            self.check_hop(&hop).map_err(|e| fail(&hop, e))?;
            let response = self.send(&hop).await.map_err(|e| fail(&hop, e))?;
            let status = response.status().as_u16();
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                if redirects == MAX_REDIRECTS {
                    return Err(fail(
                        &hop,
                        AttemptError::Redirects {
                            limit: MAX_REDIRECTS,
                        },
                    ));
                }
                let next = next_hop(&hop, &response).map_err(|e| fail(&hop, e))?;
                tracing::debug!(from = %hop, to = %next, "redirect");
                redirects += 1;
                hop = next;
                continue;
            }
            if status != 200 {
                return Err(fail(&hop, AttemptError::Http { status }));
            }
            break response;
        };
        if let Some(announced) = response.content_length() {
            if announced > limit || expected.is_some_and(|e| e.size != announced) {
                let detail = format!("the server announced {announced} bytes");
                return Err(fail(&hop, size_error(expected, limit, detail)));
            }
        }
        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        loop {
            let chunk = match tokio::time::timeout(self.stall, response.chunk()).await {
                Err(_) => {
                    let reason = format!(
                        "stalled: no data for {:?} after {received} bytes",
                        self.stall
                    );
                    return Err(fail(&hop, AttemptError::Network { reason }));
                }
                Ok(Err(e)) => return Err(fail(&hop, body_error(&e, received, expected, limit))),
                Ok(Ok(None)) => break,
                Ok(Ok(Some(chunk))) => chunk,
            };
            received += chunk.len() as u64;
            if received > limit {
                let detail = format!("received more than {limit} bytes");
                return Err(fail(&hop, size_error(expected, limit, detail)));
            }
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(|e| {
                TransferError::Local(Error::io("cannot write download", "temporary file", e))
            })?;
            progress(received);
        }
        let sha256 = hex::encode(hasher.finalize());
        if let Some(e) = expected {
            if received != e.size {
                let detail = format!("received only {received} bytes");
                return Err(fail(&hop, size_error(expected, limit, detail)));
            }
            if sha256 != e.sha256 {
                return Err(fail(
                    &hop,
                    AttemptError::Sha256 {
                        expected: e.sha256.to_string(),
                        actual: sha256,
                    },
                ));
            }
        }
        Ok(Transfer {
            size: received,
            sha256,
            final_url: hop,
        })
    }

    async fn send(&self, url: &Url) -> Result<reqwest::Response, AttemptError> {
        let request = self
            .client
            .get(url.clone())
            .header(
                USER_AGENT,
                concat!("gem-resources/", env!("CARGO_PKG_VERSION")),
            )
            .header(ACCEPT_ENCODING, "identity")
            .send();
        match tokio::time::timeout(self.connect + self.stall, request).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(request_error(&e)),
            Err(_) => Err(AttemptError::Network {
                reason: format!("no response within {:?}", self.connect + self.stall),
            }),
        }
    }
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

fn next_hop(current: &Url, response: &reqwest::Response) -> Result<Url, AttemptError> {
    let status = response.status().as_u16();
    let location = response
        .headers()
        .get(LOCATION)
        .ok_or(AttemptError::Http { status })?;
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
    AttemptError::Network { reason: chain(e) }
}

/// A body that broke off. A reset or timeout is the network's fault; a
/// connection closed early is the server sending too few bytes.
fn body_error(
    e: &reqwest::Error,
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
                return AttemptError::Network {
                    reason: format!("connection broke after {received} bytes: {}", chain(e)),
                };
            }
        }
        source = s.source();
    }
    let detail = format!(
        "the connection closed after {received} bytes ({})",
        chain(e)
    );
    size_error(expected, limit, detail)
}

/// The error and its causes on one line, without repeats.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}
