//! Name resolution that only ever hands out addresses the guard accepts.
//!
//! The HTTP client asks [`GuardedResolver`] for every connection it opens,
//! so the check happens on the very addresses we connect to: a name that
//! answered with a public address for a check and with `127.0.0.1` a moment
//! later (DNS rebinding) gets the second answer filtered out too. IP-literal
//! hosts never reach a resolver; the fetcher checks those itself.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};

use hickory_resolver::config::ResolverConfig;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::error::AttemptError;
use crate::net::guard::{normalise_host, AddressGuard, Blocked};
use crate::net::policy::Policy;

/// The answers of a name lookup, or why there are none.
pub type LookupResult = Result<Vec<IpAddr>, AttemptError>;

/// Looks up the names that have no fixed answer: the system's DNS in
/// production ([`SystemDns`]). Replaceable, so that the guard's filtering of
/// real answers can be tested without a network.
pub trait SystemLookup: Send + Sync {
    /// Every address `name` (lowercase, no trailing dot) resolves to.
    fn lookup<'a>(
        &'a self,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = LookupResult> + Send + 'a>>;
}

/// The system's DNS configuration, read on first use (inside the runtime).
#[derive(Default)]
pub struct SystemDns {
    resolver: OnceLock<Option<TokioResolver>>,
}

impl SystemLookup for SystemDns {
    fn lookup<'a>(
        &'a self,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = LookupResult> + Send + 'a>> {
        Box::pin(async move {
            let Some(resolver) = self.resolver.get_or_init(build_system_resolver) else {
                return Err(AttemptError::Network {
                    reason: format!("cannot resolve {name}: no DNS resolver could be set up"),
                });
            };
            // A fully qualified name stops the search-domain expansion.
            let fqdn = format!("{name}.");
            match resolver.lookup_ip(fqdn.as_str()).await {
                Ok(lookup) => Ok(lookup.iter().collect()),
                Err(e) => Err(dns_error(name, &e)),
            }
        })
    }
}

/// A DNS failure as an attempt's error, in words (never the resolver's
/// `Debug` text): a name that does not exist or has no address is the
/// name server's answer ([`AttemptError::UnknownHost`]); a failed or
/// timed-out lookup may succeed later ([`AttemptError::Network`]).
fn dns_error(name: &str, e: &hickory_resolver::net::NetError) -> AttemptError {
    use hickory_resolver::net::{DnsError, NetError};
    if let NetError::Dns(DnsError::NoRecordsFound(_)) = e {
        return AttemptError::UnknownHost {
            reason: format!("DNS: no address for {name}"),
        };
    }
    AttemptError::Network {
        reason: dns_reason(name, e),
    }
}

/// A DNS failure in words.
fn dns_reason(name: &str, e: &hickory_resolver::net::NetError) -> String {
    use hickory_resolver::net::{DnsError, NetError};
    match e {
        NetError::Dns(DnsError::NoRecordsFound(_)) => format!("DNS: no address for {name}"),
        NetError::Dns(DnsError::ResponseCode(code)) => {
            format!("DNS: lookup of {name} failed ({code})")
        }
        NetError::Timeout => format!("DNS: lookup of {name} timed out"),
        NetError::NoConnections => {
            format!("DNS: no name server could be reached to look up {name}")
        }
        other => {
            tracing::debug!("DNS lookup of {name}: {other:?}");
            format!("DNS: lookup of {name} failed")
        }
    }
}

/// Resolves names (system DNS, or the fixed `[dev] resolve` answers) and
/// keeps only the answers the address guard accepts.
#[derive(Clone)]
pub struct GuardedResolver {
    inner: Arc<Inner>,
}

struct Inner {
    /// Rejects local and internal-network answers.
    guard: AddressGuard,
    /// Fixed answers from `[dev] resolve`, keyed by lowercase name.
    fixed: BTreeMap<String, Vec<IpAddr>>,
    /// Every other name.
    system: Arc<dyn SystemLookup>,
    /// The live network policy, whose blocked addresses no answer may be.
    policy: Option<Arc<RwLock<Policy>>>,
}

impl GuardedResolver {
    /// A resolver with the given guard and fixed answers, asking the
    /// system's DNS for every other name.
    pub fn new(guard: AddressGuard, fixed: BTreeMap<String, Vec<IpAddr>>) -> Self {
        Self::with_system_lookup(guard, fixed, Arc::new(SystemDns::default()))
    }

    /// Like [`GuardedResolver::new`], asking `system` instead of the
    /// system's DNS.
    pub fn with_system_lookup(
        guard: AddressGuard,
        fixed: BTreeMap<String, Vec<IpAddr>>,
        system: Arc<dyn SystemLookup>,
    ) -> Self {
        let fixed = fixed
            .into_iter()
            .map(|(name, ips)| (normalise_host(&name), ips))
            .collect();
        GuardedResolver {
            inner: Arc::new(Inner {
                guard,
                fixed,
                system,
                policy: None,
            }),
        }
    }

    /// Like [`GuardedResolver::new`], also keeping only the answers the
    /// live `policy` lets a connection dial ([`Policy::permits_address`]).
    pub(crate) fn with_policy(
        guard: AddressGuard,
        fixed: BTreeMap<String, Vec<IpAddr>>,
        policy: Arc<RwLock<Policy>>,
    ) -> Self {
        let mut resolver = Self::new(guard, fixed);
        if let Some(inner) = Arc::get_mut(&mut resolver.inner) {
            inner.policy = Some(policy);
        }
        resolver
    }

    /// The same resolver (guard, fixed answers, policy) asking `system`
    /// for every name without a fixed answer.
    pub(crate) fn with_system(&self, system: Arc<dyn SystemLookup>) -> GuardedResolver {
        GuardedResolver {
            inner: Arc::new(Inner {
                guard: self.inner.guard.clone(),
                fixed: self.inner.fixed.clone(),
                system,
                policy: self.inner.policy.clone(),
            }),
        }
    }

    /// The same resolver (fixed answers, system lookup, policy) judging
    /// answers with `guard`.
    pub(crate) fn with_guard(&self, guard: AddressGuard) -> GuardedResolver {
        GuardedResolver {
            inner: Arc::new(Inner {
                guard,
                fixed: self.inner.fixed.clone(),
                system: self.inner.system.clone(),
                policy: self.inner.policy.clone(),
            }),
        }
    }

    /// The guard in use.
    pub fn guard(&self) -> &AddressGuard {
        &self.inner.guard
    }

    /// Resolves `name` and returns the answers that passed the guard (and
    /// the policy, when the resolver has one).
    ///
    /// Fails with [`AttemptError::Address`] when there were answers but none
    /// passed the guard, with [`AttemptError::Policy`] when those that did
    /// are all blocked by the policy, with [`AttemptError::UnknownHost`]
    /// when the name does not exist or has no address, and with
    /// [`AttemptError::Network`] when the lookup failed.
    pub async fn lookup(&self, name: &str) -> Result<Vec<IpAddr>, AttemptError> {
        let key = normalise_host(name);
        // A host the `[cache]` section names as internal: every answer.
        let internal = self.inner.guard.is_internal_host(&key);
        let answers = match self.inner.fixed.get(&key) {
            Some(ips) => ips.clone(),
            None => {
                if let (Some(reason), false) = (crate::net::guard::classify_name(&key), internal) {
                    return Err(AttemptError::Address(Blocked {
                        address: key,
                        reason: reason.to_string(),
                    }));
                }
                self.inner.system.lookup(&key).await?
            }
        };
        let mut allowed = Vec::new();
        let mut first_refusal = None;
        for ip in answers {
            if internal {
                allowed.push(ip);
                continue;
            }
            match self.inner.guard.check_ip(ip) {
                Ok(()) => allowed.push(ip),
                Err(blocked) => {
                    first_refusal.get_or_insert(blocked);
                }
            }
        }
        if let (Some(policy), false) = (&self.inner.policy, allowed.is_empty()) {
            let policy = policy.read().unwrap_or_else(|p| p.into_inner());
            let first = allowed[0];
            allowed.retain(|ip| policy.permits_address(*ip));
            if allowed.is_empty() {
                return Err(AttemptError::Policy {
                    host: format!("{key} (resolves to {first})"),
                    mode: policy.mode().as_str(),
                });
            }
        }
        match (allowed.is_empty(), first_refusal) {
            (false, _) => Ok(allowed),
            (true, Some(blocked)) => Err(AttemptError::Address(Blocked {
                address: format!("{key} (resolves to {})", blocked.address),
                reason: blocked.reason,
            })),
            (true, None) => Err(AttemptError::UnknownHost {
                reason: format!("DNS: no address for {key}"),
            }),
        }
    }
}

/// The system resolver, or `None` when even an empty configuration cannot
/// be built (names then fail to resolve with a clear error).
fn build_system_resolver() -> Option<TokioResolver> {
    match TokioResolver::builder_tokio().and_then(|b| b.build()) {
        Ok(resolver) => Some(resolver),
        Err(e) => {
            tracing::warn!("no system DNS configuration ({e}); names will not resolve");
            let empty = ResolverConfig::from_name_servers(Vec::new());
            TokioResolver::builder_with_config(empty, TokioRuntimeProvider::default())
                .build()
                .ok()
        }
    }
}

/// The error a refused lookup travels as through the HTTP client, so the
/// fetcher can recover the typed reason from the error chain.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct LookupRefused(pub AttemptError);

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let this = self.clone();
        let name = name.as_str().to_string();
        Box::pin(async move {
            match this.lookup(&name).await {
                Ok(ips) => {
                    let addrs: Addrs = Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
                    Ok(addrs)
                }
                Err(e) => {
                    Err(Box::new(LookupRefused(e)) as Box<dyn std::error::Error + Send + Sync>)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Answers every name with `answers` and counts the questions.
    struct Stub {
        answers: Vec<IpAddr>,
        asked: AtomicUsize,
    }

    impl SystemLookup for Stub {
        fn lookup<'a>(
            &'a self,
            _name: &'a str,
        ) -> Pin<Box<dyn Future<Output = LookupResult> + Send + 'a>> {
            self.asked.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move { Ok(self.answers.clone()) })
        }
    }

    fn resolver(answers: &[&str]) -> (GuardedResolver, Arc<Stub>) {
        let stub = Arc::new(Stub {
            answers: answers.iter().map(|a| a.parse().unwrap()).collect(),
            asked: AtomicUsize::new(0),
        });
        let resolver =
            GuardedResolver::with_system_lookup(AddressGuard::new(), BTreeMap::new(), stub.clone());
        (resolver, stub)
    }

    #[tokio::test]
    async fn a_system_answer_with_a_private_address_is_refused() {
        let (resolver, stub) = resolver(&["10.0.0.7"]);
        let err = resolver.lookup("Cdn.Example.com.").await.unwrap_err();
        assert_eq!(stub.asked.load(Ordering::Relaxed), 1);
        assert_eq!(err.code(), "E_RESOURCE_ADDRESS");
        assert_eq!(
            err.to_string(),
            "cdn.example.com (resolves to 10.0.0.7) is a local or internal-network address (private network (10.0.0.0/8); for a local test origin, see `[dev] allow_addresses` in docs/configuration.md)"
        );
    }

    #[tokio::test]
    async fn only_the_public_system_answers_are_handed_out() {
        let (resolver, _) = resolver(&["127.0.0.1", "93.184.215.14", "::ffff:192.168.1.1"]);
        let ips = resolver.lookup("cdn.example.com").await.unwrap();
        assert_eq!(ips, ["93.184.215.14".parse::<IpAddr>().unwrap()]);
    }

    #[tokio::test]
    async fn a_local_name_is_refused_before_asking_the_system() {
        let (resolver, stub) = resolver(&["93.184.215.14"]);
        let err = resolver.lookup("printer.local").await.unwrap_err();
        assert_eq!(err.code(), "E_RESOURCE_ADDRESS");
        assert_eq!(stub.asked.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn no_system_answers_is_a_network_failure() {
        let (resolver, _) = resolver(&[]);
        let err = resolver.lookup("cdn.example.com").await.unwrap_err();
        assert_eq!(err.code(), "E_RESOURCE_NETWORK");
    }
}
