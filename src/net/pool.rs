//! The HTTP client of a fetcher and the connections it keeps open.
//!
//! One client serves every file of a fetcher, so consecutive requests to the
//! same host reuse a connection kept open (no new TCP and TLS handshakes),
//! and one TLS client configuration serves every client this pool builds and
//! every proxy tunnel, so a new connection to a host seen before resumes its
//! TLS session (one round trip instead of two).
//!
//! A kept connection is trusted no longer than what it was vetted against:
//! - on every policy change the client is replaced by a new one, and the
//!   old client's idle connections close with it ([`Pool::drop_connections`]);
//! - before each request to a name, the name is resolved again under the
//!   guard and the policy, and if a connection kept for that host was made
//!   to an address that is no longer among the vetted answers, the client is
//!   replaced too ([`Pool::client`]), so the request goes on a new connection
//!   to an address that passed.
//!
//! The connections in use by a transfer are not cut here: a transfer
//! watches the policy itself, for its host and for the address it dialled.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::ClientConfig;

use crate::error::{AttemptError, Error};
use crate::net::connecting::ReportConnections;
use crate::net::reason::chain;
use crate::net::resolve::GuardedResolver;

/// The client in use and the addresses its kept connections go to.
pub(crate) struct Pool {
    /// TLS trust and the session store every client shares.
    tls: Arc<ClientConfig>,
    /// Every name the clients connect to is resolved here.
    resolver: GuardedResolver,
    /// Longest wait for a TCP connection.
    connect_timeout: Duration,
    /// The current client.
    current: Mutex<Current>,
}

/// The current client, which of the pool's clients it is, and the peers of
/// the connections it made, by host and port.
struct Current {
    /// `Err`: it could not be built (its reason); requests fail.
    client: Result<reqwest::Client, String>,
    /// Counts the clients built.
    generation: u64,
    /// The addresses its connections were made to, by `host:port`.
    peers: HashMap<String, BTreeSet<IpAddr>>,
}

/// What [`Pool::client`] hands out: the client, and which one it is (for
/// [`Pool::record`]).
pub(crate) struct Lease {
    /// The client to send with.
    pub(crate) client: reqwest::Client,
    /// Which client of the pool it is.
    pub(crate) generation: u64,
}

impl Pool {
    /// A pool whose clients trust what `tls` trusts and resolve with
    /// `resolver`.
    pub(crate) fn new(
        tls: Arc<ClientConfig>,
        resolver: GuardedResolver,
        connect_timeout: Duration,
    ) -> Result<Pool, Error> {
        let pool = Pool {
            tls,
            resolver,
            connect_timeout,
            current: Mutex::new(Current {
                client: Err(String::new()),
                generation: 0,
                peers: HashMap::new(),
            }),
        };
        let client = pool
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        pool.lock().client = Ok(client);
        Ok(pool)
    }

    /// The TLS configuration every client and tunnel shares.
    pub(crate) fn tls(&self) -> Arc<ClientConfig> {
        self.tls.clone()
    }

    /// A new client: no redirects, no proxy, the guarded resolver, the
    /// shared TLS configuration; connections are kept open between requests.
    fn build(&self) -> Result<reqwest::Client, String> {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .referer(false)
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .dns_resolver(self.resolver.clone())
            .connector_layer(ReportConnections)
            // A clone shares the session store: resumption works across
            // clients and with the tunnels.
            .tls_backend_preconfigured(ClientConfig::clone(&self.tls))
            .build()
            .map_err(|e| chain(&e))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the client by a new one: no request goes on a connection
    /// the old one kept (they close once the requests in flight on it end).
    pub(crate) fn drop_connections(&self) {
        let client = self.build();
        if let Err(e) = &client {
            tracing::warn!("cannot build the HTTP client: {e}");
        }
        let mut current = self.lock();
        current.client = client;
        current.generation += 1;
        current.peers.clear();
    }

    /// The client for a request to `authority` (`host:port`), whose name
    /// now resolves to `answers` (vetted; `None` for an IP literal). When a
    /// connection kept for it goes to an address not among them, a new
    /// client is built first.
    pub(crate) fn client(
        &self,
        authority: &str,
        answers: Option<&[IpAddr]>,
    ) -> Result<Lease, AttemptError> {
        let moved = answers.is_some_and(|answers| {
            self.lock().peers.get(authority).is_some_and(|peers| {
                peers
                    .iter()
                    .any(|ip| !answers.iter().any(|a| a.to_canonical() == *ip))
            })
        });
        if moved {
            tracing::debug!(
                authority,
                "its name resolves elsewhere now: new connections"
            );
            self.drop_connections();
        }
        let current = self.lock();
        match &current.client {
            Ok(client) => Ok(Lease {
                client: client.clone(),
                generation: current.generation,
            }),
            Err(e) => Err(AttemptError::Network {
                reason: format!("cannot build the HTTP client: {e}"),
            }),
        }
    }

    /// Notes that the client `generation` answered a request to `authority`
    /// from `peer` (the connection may be kept for the next request).
    pub(crate) fn record(&self, authority: &str, generation: u64, peer: IpAddr) {
        let mut current = self.lock();
        if current.generation == generation {
            current
                .peers
                .entry(authority.to_string())
                .or_default()
                .insert(peer.to_canonical());
        }
    }

    /// Which client is current.
    #[cfg(test)]
    fn generation(&self) -> u64 {
        self.lock().generation
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::net::guard::AddressGuard;

    fn pool() -> Pool {
        crate::install_crypto_provider();
        let tls = crate::net::tls::client_config(Vec::new()).unwrap();
        let resolver = GuardedResolver::new(AddressGuard::new(), BTreeMap::new());
        Pool::new(Arc::new(tls), resolver, Duration::from_secs(5)).unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_kept_connection_to_an_address_its_name_no_longer_has_is_dropped() {
        let pool = pool();
        let first = pool.client("cdn.example:443", Some(&[ip("192.0.2.1")]));
        let generation = first.unwrap().generation;
        pool.record("cdn.example:443", generation, ip("192.0.2.1"));
        // The same answers (and more): the kept connection may carry it.
        let answers = [ip("192.0.2.1"), ip("192.0.2.2")];
        let same = pool.client("cdn.example:443", Some(&answers)).unwrap();
        assert_eq!(same.generation, generation);
        // An answer spelled as an IPv4-mapped address is the same address.
        let mapped = [ip("::ffff:192.0.2.1")];
        let same = pool.client("cdn.example:443", Some(&mapped)).unwrap();
        assert_eq!(same.generation, generation);
        // An IP literal, or another host: nothing to compare.
        assert_eq!(
            pool.client("192.0.2.9:443", None).unwrap().generation,
            generation
        );
        let other = pool.client("other.example:443", Some(&[ip("192.0.2.7")]));
        assert_eq!(other.unwrap().generation, generation);
        // The name now resolves elsewhere: a new client, no kept connection.
        let moved = pool
            .client("cdn.example:443", Some(&[ip("192.0.2.2")]))
            .unwrap();
        assert_ne!(moved.generation, generation);
        assert_eq!(pool.generation(), moved.generation);
        // What the old client answered later is not recorded for the new one.
        pool.record("cdn.example:443", generation, ip("192.0.2.1"));
        let again = pool
            .client("cdn.example:443", Some(&[ip("192.0.2.2")]))
            .unwrap();
        assert_eq!(again.generation, moved.generation);
    }

    #[test]
    fn dropping_the_connections_builds_a_new_client() {
        let pool = pool();
        let before = pool.generation();
        pool.record("cdn.example:443", before, ip("192.0.2.1"));
        pool.drop_connections();
        assert_ne!(pool.generation(), before);
        assert!(pool.lock().peers.is_empty());
    }
}
