//! The connections a transfer makes: each one is reported to the transfer
//! that asked for it (so `Started` comes with the first connection) and
//! passes the live policy once more before a request is written on it,
//! whether the HTTP client's connector or a proxy tunnel made it.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use url::{Host, Url};

use crate::error::AttemptError;
use crate::net::policy::Policy;

/// Whether `policy` permits the host of `url`.
pub(crate) fn permitted(policy: &RwLock<Policy>, url: &Url) -> Result<(), AttemptError> {
    let Some(host) = url.host() else {
        return Ok(());
    };
    let text = host_text(&host);
    let policy = policy.read().unwrap_or_else(|p| p.into_inner());
    if policy.permits(&text) {
        Ok(())
    } else {
        Err(AttemptError::Policy {
            host: text,
            mode: policy.mode().as_str(),
        })
    }
}

/// Checks one hop without resolving: scheme (https only), no credentials
/// in the address, a well-formed host name, the policy, then the host by
/// name or as an IP literal (in any spelling the URL parser accepts)
/// against `guard`. Every address a download or the cache is about to ask
/// passes here.
pub(crate) fn check_hop(
    policy: &RwLock<Policy>,
    guard: &crate::net::guard::AddressGuard,
    url: &Url,
) -> Result<(), AttemptError> {
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
            return Err(AttemptError::Address(crate::net::guard::Blocked {
                address: name.to_string(),
                reason: "malformed host name (empty label)".into(),
            }));
        }
    }
    permitted(policy, url)?;
    guard.check_host(&host)?;
    Ok(())
}

/// Whether `policy` lets a connection for `url` read from `ip`, the
/// address it dialled (the policy's IP entries, [`Policy::permits_address`]).
pub(crate) fn permitted_address(
    policy: &RwLock<Policy>,
    url: &Url,
    ip: IpAddr,
) -> Result<(), AttemptError> {
    let policy = policy.read().unwrap_or_else(|p| p.into_inner());
    if policy.permits_address(ip) {
        return Ok(());
    }
    let host = url.host().map(|h| host_text(&h)).unwrap_or_default();
    let host = if host == ip.to_string() {
        host
    } else {
        format!("{host} (connected to {ip})")
    };
    Err(AttemptError::Policy {
        host,
        mode: policy.mode().as_str(),
    })
}

/// The request being sent on a task: told when its connection is made,
/// and the policy check that connection must pass before the request is
/// written on it.
#[derive(Clone)]
pub(crate) struct Connecting {
    /// Notified once the connection is made.
    pub(crate) made: Arc<tokio::sync::Notify>,
    /// The policy in force and the hop.
    pub(crate) policy: Arc<RwLock<Policy>>,
    /// The hop being connected to.
    pub(crate) hop: Url,
}

tokio::task_local! {
    /// The request being sent on this task, if any.
    pub(crate) static CONNECTING: Connecting;
}

/// Says that the request being sent on this task has its connection (the
/// connector and the tunnel call it) and checks the policy once more
/// before the request is written on it.
pub(crate) fn mark_connected() -> Result<(), AttemptError> {
    CONNECTING
        .try_with(|c| {
            c.made.notify_one();
            permitted(&c.policy, &c.hop)
        })
        .unwrap_or(Ok(()))
}

/// Says that the request being sent on this task was answered, on a
/// connection made for it or kept open from an earlier request (which no
/// connector reports): the transfer counts either as connected.
pub(crate) fn mark_answered() {
    let _ = CONNECTING.try_with(|c| c.made.notify_one());
}

/// Tells the transfer each connection the HTTP client makes for it
/// ([`mark_connected`]).
#[derive(Clone)]
pub(crate) struct ReportConnections;

impl<S> tower_layer::Layer<S> for ReportConnections {
    type Service = Reported<S>;

    fn layer(&self, inner: S) -> Reported<S> {
        Reported(inner)
    }
}

/// The HTTP client's connector, reporting each connection it made.
#[derive(Clone)]
pub(crate) struct Reported<S>(S);

impl<S, R> tower_service::Service<R> for Reported<S>
where
    S: tower_service::Service<R>,
    S::Future: Send + 'static,
    S::Error: From<AttemptError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let connecting = self.0.call(request);
        Box::pin(async move {
            let connection = connecting.await?;
            // A policy change during connect or TLS: no request on it.
            mark_connected()?;
            Ok(connection)
        })
    }
}

/// A URL's host as the policy and messages name it.
pub(crate) fn host_text(host: &Host<&str>) -> String {
    match host {
        Host::Domain(d) => d.to_string(),
        Host::Ipv4(ip) => ip.to_string(),
        Host::Ipv6(ip) => ip.to_string(),
    }
}
