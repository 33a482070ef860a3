//! The `[cache]` registry in a download: asked first for every file, its
//! blob fetched through a fetcher of its own (the same engine: ranged
//! parts, resume, the bandwidth cap, the live policy), whose address guard
//! lets only the hosts `[cache] allow_internal` names be internal and
//! whose requests carry the registry's `Authorization` on the registry's
//! own hops only. The main fetcher never gets either: a manifest cannot
//! point a download at the cache.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::cache::{Cache, CacheSettings, Probe};
use crate::error::{AttemptError, Result};
use crate::net::pool::Pool;
use crate::net::proxy::{ProxyConfig, ProxySettings};
use crate::transfer::download::Job;
use crate::transfer::fetch::{CacheRoute, Fetcher, Reporter, TransferError};
use crate::transfer::retry::RetryPolicy;

impl Fetcher {
    /// The same fetcher asking the `[cache]` registry of `settings` for
    /// every file first (`None`: no cache, nothing changes). Fails when the
    /// cache's password cannot be read.
    pub fn with_cache(mut self, settings: Option<CacheSettings>) -> Result<Fetcher> {
        let Some(settings) = settings else {
            self.cache = None;
            return Ok(self);
        };
        let guard = self
            .guard()
            .clone()
            .with_internal_hosts(&settings.internal_hosts());
        let resolver = self.resolver.with_guard(guard);
        let pool = Arc::new(Pool::new(
            self.pool.tls(),
            resolver.clone(),
            settings.timeout,
        )?);
        let timeout = settings.timeout;
        let cache = Arc::new(Cache::new(
            settings,
            pool.clone(),
            resolver.clone(),
            self.policy.clone(),
        )?);
        let mut via = self.clone();
        via.pool = pool;
        via.resolver = resolver;
        // The registry answers, and sends the next byte, within its short
        // timeout, or the file's own addresses are used.
        via.connect = timeout;
        via.stall = timeout;
        via.spread = false;
        // Reached directly: the cache is the organisation's own.
        via.proxy = Arc::new(ProxySettings::from_vars(
            &ProxyConfig::None,
            false,
            &BTreeMap::new(),
        )?);
        via.authorize = Some(cache.clone());
        via.cache = None;
        self.cache = Some(Arc::new(CacheRoute {
            cache,
            fetcher: via,
        }));
        Ok(self)
    }

    /// The `[cache]` registry, when one is configured.
    pub fn cache(&self) -> Option<&Arc<Cache>> {
        self.cache.as_ref().map(|route| &route.cache)
    }

    /// The addresses whose kept bytes a download of `sha256` resumes: its
    /// own, and the cache's blob when a cache is configured.
    pub(crate) fn kept_addresses(&self, addresses: &[String], sha256: &str) -> Vec<String> {
        let mut all = addresses.to_vec();
        if let Some(cache) = self.cache() {
            all.push(cache.blob_url(sha256).to_string());
        }
        all
    }

    /// Offers a file verified from its own addresses to the cache
    /// (`[cache] push`): uploaded in the background, never waited for.
    pub(crate) fn offer_to_cache(&self, sha256: &str, size: u64, path: &Path) {
        if let Some(cache) = self.cache() {
            cache.offer(sha256, size, path);
        }
    }
}

impl Job<'_> {
    /// Tries the cache: `Ok(true)` when it served the file (verified),
    /// `Ok(false)` when it was not asked or has no such blob. A failure of
    /// the cache (down, refusing, other bytes) is said to `progress` as a
    /// fallback to the url, opens the cache's breaker, and is returned
    /// as an attempt; the file's own addresses follow.
    pub(super) async fn try_cache(
        &self,
        progress: &mut dyn Reporter,
    ) -> std::result::Result<bool, TransferError> {
        let Some(route) = self.fetcher.cache.as_deref() else {
            return Ok(false);
        };
        let (cache, sha256) = (&route.cache, &self.resource.sha256);
        let address = cache.blob_url(sha256);
        match cache.probe(sha256).await {
            Probe::Hit => {}
            Probe::Miss | Probe::Skipped => return Ok(false),
            Probe::Failed(error) => {
                let attempt = crate::error::Attempt {
                    address,
                    hop: None,
                    error,
                };
                tracing::info!(resource = %self.resource.id, "cache: {attempt}; trying the url");
                return Err(TransferError::Attempt(attempt));
            }
        }
        let job = Job {
            fetcher: &route.fetcher,
            resource: self.resource,
            paths: self.paths,
            // One try: a cache that fails is left for the file's own
            // addresses at once.
            retry: RetryPolicy {
                retries: 0,
                ..self.retry
            },
            cancel: self.cancel,
        };
        match job.address(&address, progress).await {
            Ok(()) => {
                cache.succeeded();
                tracing::debug!(resource = %self.resource.id, "served by the cache");
                Ok(true)
            }
            Err(TransferError::Attempt(attempt)) => {
                if matches!(
                    attempt.error,
                    AttemptError::Size { .. } | AttemptError::Sha256 { .. }
                ) {
                    tracing::warn!(resource = %self.resource.id, "the cache served other bytes ({}): they are discarded, the file comes from its own addresses", attempt.error);
                }
                cache.failed(&attempt);
                progress.fell_back(&attempt, &self.resource.url);
                Err(TransferError::Attempt(attempt))
            }
            Err(other) => Err(other),
        }
    }
}
