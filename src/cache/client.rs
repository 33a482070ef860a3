//! The cache's own requests (the probe of a blob, a token, an upload),
//! each under the rules every transfer follows: `https` only, no user name
//! in the address, the user's network policy (before the request and on
//! the address dialled), and the address guard, which lets only the hosts
//! `[cache] allow_internal` names be on an internal address. No redirect
//! is followed here; the registry is reached directly, never through a
//! proxy.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::Method;
use url::{Host, Url};

use crate::error::AttemptError;
use crate::net::connecting::{check_hop, permitted_address};
use crate::net::policy::Policy;
use crate::net::pool::Pool;
use crate::net::resolve::{GuardedResolver, LookupRefused};

/// Sends the cache's requests.
pub(crate) struct Client {
    /// Keeps connections to the registry open; resolves with `resolver`.
    pub(crate) pool: Arc<Pool>,
    /// The guard with the cache's internal hosts.
    pub(crate) resolver: GuardedResolver,
    /// The user's policy, live.
    pub(crate) policy: Arc<RwLock<Policy>>,
    /// Longest wait for a response head.
    pub(crate) timeout: Duration,
}

impl Client {
    /// Applies the rules to `url` (connecting to nothing) and returns the
    /// addresses its name resolves to (`None` for an IP literal).
    async fn vet(&self, url: &Url) -> Result<Option<Vec<IpAddr>>, AttemptError> {
        check_hop(&self.policy, self.resolver.guard(), url)?;
        let host = url.host().ok_or_else(|| AttemptError::Network {
            reason: "address has no host".into(),
        })?;
        match host {
            Host::Domain(name) => Ok(Some(self.resolver.lookup(name).await?)),
            _ => Ok(None),
        }
    }

    /// Sends one request and waits at most the cache's timeout for its
    /// head (`body_time`, when given, is added: an upload's body goes out
    /// before its answer comes).
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &Url,
        headers: HeaderMap,
        body: Option<reqwest::Body>,
        body_time: Option<Duration>,
    ) -> Result<reqwest::Response, AttemptError> {
        let answers = self.vet(url).await?;
        let port = url.port_or_known_default().unwrap_or(443);
        let authority = match url.host() {
            Some(Host::Ipv6(ip)) => format!("[{ip}]:{port}"),
            Some(host) => format!("{host}:{port}"),
            None => String::new(),
        };
        let lease = self.pool.client(&authority, answers.as_deref())?;
        let mut request = lease.client.request(method, url.clone()).headers(headers);
        request = request.header(
            reqwest::header::USER_AGENT,
            concat!("gem-resources/", env!("CARGO_PKG_VERSION")),
        );
        if let Some(body) = body {
            request = request.body(body);
        }
        let wait = self.timeout + body_time.unwrap_or_default();
        let response = match tokio::time::timeout(wait, request.send()).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return Err(request_error(&e, url)),
            Err(_) => {
                return Err(AttemptError::Network {
                    reason: format!(
                        "no answer from {} within {}s",
                        url.host_str().unwrap_or_default(),
                        wait.as_secs_f64()
                    ),
                })
            }
        };
        if let Some(peer) = response.remote_addr() {
            permitted_address(&self.policy, url, peer.ip().to_canonical())?;
            self.pool.record(&authority, lease.generation, peer.ip());
        }
        Ok(response)
    }

    /// Reads at most `max` bytes of `response`'s body within the timeout.
    pub(crate) async fn body(
        &self,
        mut response: reqwest::Response,
        max: usize,
    ) -> Result<Vec<u8>, AttemptError> {
        let read = async {
            let mut out = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(|e| AttemptError::Network {
                reason: crate::net::reason::chain(&e),
            })? {
                out.extend_from_slice(&chunk);
                if out.len() > max {
                    return Err(AttemptError::Network {
                        reason: format!("an answer longer than {max} bytes"),
                    });
                }
            }
            Ok(out)
        };
        tokio::time::timeout(self.timeout, read)
            .await
            .unwrap_or_else(|_| {
                Err(AttemptError::Network {
                    reason: "the answer's body did not arrive in time".into(),
                })
            })
    }
}

/// A request error, with a refused lookup or address recovered from the
/// chain.
fn request_error(e: &reqwest::Error, url: &Url) -> AttemptError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<LookupRefused>() {
            return refused.0.clone();
        }
        if let Some(refused @ AttemptError::Policy { .. }) = s.downcast_ref::<AttemptError>() {
            return refused.clone();
        }
        source = s.source();
    }
    crate::net::reason::network_failure(e, url.host_str().unwrap_or_default())
}
