//! The cache wing: an organisation's OCI registry, asked for every file
//! before the file's own addresses, and filled as files are verified.
//!
//! Every file is named by its SHA-256 before a byte arrives and every byte
//! is checked against it, so the cache needs no trust: a registry that
//! serves other bytes is caught as a bad mirror is, and the download goes
//! on from the file's own addresses.
//!
//! - [`oci`]: the distribution API's addresses (a blob, an upload).
//! - `auth`: anonymous, basic and bearer-token credentials; secrets are
//!   never shown.
//! - `docker`, `helper`: credentials from a Docker `config.json`, or from
//!   the credential helper it names, run when the registry first asks.
//! - `breaker`: a registry that failed is left alone for a while.
//! - `client`: the cache's own requests under the address rules, the
//!   policy and the cache's short timeout.
//! - `push`: uploads after a download, in the background, at a bounded
//!   rate; `cache check` and `cache push`.
//!
//! The transfer of a blob itself goes through the same engine as any file
//! ([`crate::transfer::download`]); this wing hands it the address, the
//! `Authorization` of the registry's own hops (`Cache::authorization_for`)
//! and says whether to ask at all ([`Cache::probe`]).
//!
//! Uses [`crate::net`] and [`crate::error`]; knows nothing of the store or
//! the service.

mod auth;
mod breaker;
mod client;
mod docker;
mod helper;
pub mod oci;
mod push;

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use reqwest::header::{HeaderMap, AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::Method;
use url::Url;

use crate::error::{AttemptError, Error, Result};
use crate::net::policy::Policy;
use crate::net::pool::Pool;
use crate::net::resolve::GuardedResolver;

pub use auth::{PasswordSource, Secret};
pub use oci::Registry;
pub use push::{CheckReport, Pushed};

use auth::{Challenge, Credentials, Tokens};
use breaker::Breaker;
use client::Client;

/// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`: the file
/// `[cache] docker_config = true` reads.
pub(crate) fn docker_default_path() -> Option<std::path::PathBuf> {
    docker::default_path(&|name| std::env::var_os(name))
}

/// `[cache] allow_internal`: which hosts of the cache may be on a local or
/// internal-network address.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
pub enum AllowInternal {
    /// `true`: the registry's own host; `false`: none.
    Own(bool),
    /// These hosts (the registry's, its token service's, its storage's).
    Hosts(Vec<String>),
    /// Not set: none.
    #[default]
    #[serde(skip)]
    None,
}

/// The cache's settings, from `[cache]`
/// ([`Config::cache_settings`](crate::Config::cache_settings)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CacheSettings {
    /// The registry and repository.
    pub registry: Registry,
    /// Upload files verified from their own addresses.
    pub push: bool,
    /// The user name, when the registry needs credentials.
    pub username: Option<String>,
    /// Where the password comes from.
    pub password: Option<PasswordSource>,
    /// A Docker `config.json` to take the credentials from.
    pub docker_config: Option<std::path::PathBuf>,
    /// Repositories to mount a blob from before uploading it.
    pub mount_from: Vec<String>,
    /// The hosts that may be on an internal address.
    pub allow_internal: AllowInternal,
    /// Longest wait for the registry to connect, answer or send the next
    /// byte.
    pub timeout: Duration,
    /// How long the cache is left alone after a failure.
    pub breaker: Duration,
    /// Cap on uploads, bytes per second (`None`: no cap).
    pub push_max_bytes_per_sec: Option<u64>,
}

impl CacheSettings {
    /// The hosts exempt from the internal-address rule, for the cache's
    /// requests only.
    pub fn internal_hosts(&self) -> Vec<String> {
        match &self.allow_internal {
            AllowInternal::Own(true) => vec![self.registry.host()],
            AllowInternal::Hosts(hosts) => hosts.clone(),
            AllowInternal::Own(false) | AllowInternal::None => Vec::new(),
        }
    }
}

/// How the registry wants requests authorised, as learnt from its last
/// `401`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scheme {
    /// Nothing asked yet: anonymous.
    Anonymous,
    /// HTTP basic.
    Basic,
    /// Tokens from this realm and service.
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

/// What [`Cache::probe`] found.
#[derive(Debug)]
pub enum Probe {
    /// The registry has the blob: fetch it.
    Hit,
    /// It does not (`404`).
    Miss,
    /// The cache is not asked: the breaker is open.
    Skipped,
    /// The registry could not be asked (the breaker is now open).
    Failed(AttemptError),
}

/// An OCI registry used as a cache. Cheap to share (`Arc`).
pub struct Cache {
    settings: CacheSettings,
    credentials: Source,
    client: Client,
    tokens: Tokens,
    scheme: Mutex<Scheme>,
    /// One token fetch at a time: files asked for together share it.
    fetching: tokio::sync::Mutex<()>,
    breaker: Breaker,
    pushes: push::Queue,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("registry", &self.settings.registry.address())
            .finish_non_exhaustive()
    }
}

/// Where the credentials come from.
#[derive(Debug)]
enum Source {
    /// Given (none: anonymous).
    Given(Credentials),
    /// From a credential helper, when first needed.
    Helper(Box<helper::Lazy>),
}

/// No credentials.
static ANONYMOUS: Credentials = Credentials {
    login: None,
    identity: None,
};

/// The SHA-256 of no bytes.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// The scope of reading the repository.
fn pull_scope(registry: &Registry) -> String {
    format!("repository:{}:pull", registry.repository())
}

/// The scope of reading and writing it.
fn push_scope(registry: &Registry) -> String {
    format!("repository:{}:pull,push", registry.repository())
}

impl Cache {
    /// Sets up the cache: reads its password, and sends its requests with
    /// `pool`, resolving with `resolver` (whose guard lets the hosts of
    /// [`CacheSettings::internal_hosts`] through) under `policy`.
    pub(crate) fn new(
        settings: CacheSettings,
        pool: Arc<Pool>,
        resolver: GuardedResolver,
        policy: Arc<RwLock<Policy>>,
    ) -> Result<Cache> {
        let mut credentials = match (&settings.username, &settings.password) {
            (Some(user), Some(source)) => Source::Given(Credentials {
                login: Some((user.clone(), source.read().map_err(Error::Config)?)),
                identity: None,
            }),
            _ => Source::Given(Credentials::default()),
        };
        if let Some(path) = &settings.docker_config {
            credentials = match docker::read(path, &settings.registry).map_err(Error::Config)? {
                docker::Source::File(found) => Source::Given(found),
                // Looked for on the PATH the cache is set up with; a
                // failure waits the breaker's while before another run.
                docker::Source::Helper(h) => Source::Helper(Box::new(helper::Lazy::new(
                    h,
                    std::env::var_os("PATH"),
                    helper::HELPER_TIMEOUT,
                    settings.breaker,
                ))),
            };
        }
        let client = Client {
            pool,
            resolver,
            policy,
            timeout: settings.timeout,
        };
        Ok(Cache {
            breaker: Breaker::new(settings.breaker),
            pushes: push::Queue::new(settings.push_max_bytes_per_sec),
            settings,
            credentials,
            client,
            tokens: Tokens::default(),
            scheme: Mutex::new(Scheme::Anonymous),
            fetching: tokio::sync::Mutex::new(()),
        })
    }

    /// The credentials as they are now: a helper's only once it gave
    /// them.
    fn credentials_now(&self) -> &Credentials {
        match &self.credentials {
            Source::Given(given) => given,
            Source::Helper(lazy) => lazy.ready().unwrap_or(&ANONYMOUS),
        }
    }

    /// The credentials, the helper run for them when it has not given
    /// them yet.
    async fn credentials(&self) -> std::result::Result<&Credentials, AttemptError> {
        match &self.credentials {
            Source::Given(given) => Ok(given),
            Source::Helper(lazy) => lazy.get().await.map_err(|why| refused(&why)),
        }
    }

    /// The settings it was made with.
    pub fn settings(&self) -> &CacheSettings {
        &self.settings
    }

    /// The address of the blob of `sha256`.
    pub fn blob_url(&self, sha256: &str) -> Url {
        self.settings.registry.blob(sha256)
    }

    /// Whether the cache may be asked now (its breaker is closed).
    pub fn available(&self) -> bool {
        self.breaker.allows()
    }

    /// The `Authorization` of a request to `url`: only for the registry
    /// itself (same scheme, host and port), never for a redirect target
    /// such as its blob storage.
    pub(crate) fn authorization_for(&self, url: &Url) -> Option<reqwest::header::HeaderValue> {
        if !self.settings.registry.same_origin(url) {
            return None;
        }
        self.authorization(&pull_scope(&self.settings.registry))
    }

    /// The `Authorization` for `scope` as the registry last asked.
    fn authorization(&self, scope: &str) -> Option<reqwest::header::HeaderValue> {
        let scheme = self
            .scheme
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match scheme {
            Scheme::Anonymous => None,
            Scheme::Basic => self.credentials_now().basic(),
            Scheme::Bearer { .. } => self.tokens.header(scope),
        }
    }

    /// A failure of the cache: it is left alone for the breaker's while;
    /// the first failure is a warning.
    pub(crate) fn failed(&self, why: &dyn std::fmt::Display) {
        if self.breaker.trip() {
            tracing::warn!(
                "cache {}: {why}; files come from their own addresses for the next {:.0}s",
                self.settings.registry.host(),
                self.settings.breaker.as_secs_f64()
            );
        }
    }

    /// The cache served a file: it is asked again for every file.
    pub(crate) fn succeeded(&self) {
        self.breaker.reset();
    }

    /// Asks whether the registry has the blob of `sha256` (`HEAD`, with the
    /// credentials it asks for), within the cache's timeout. A failure
    /// opens the breaker.
    pub async fn probe(&self, sha256: &str) -> Probe {
        if !self.breaker.allows() {
            return Probe::Skipped;
        }
        let url = self.blob_url(sha256);
        let scope = pull_scope(&self.settings.registry);
        let status = match self.authed(Method::HEAD, &url, &scope).await {
            Ok(response) => response.status().as_u16(),
            Err(e) => {
                self.failed(&e);
                return Probe::Failed(e);
            }
        };
        match status {
            200 | 301 | 302 | 303 | 307 | 308 => Probe::Hit,
            404 => Probe::Miss,
            status => {
                let e = http(status);
                self.failed(&e);
                Probe::Failed(e)
            }
        }
    }

    /// Sends a bodiless request to the registry with the credentials it
    /// asks for: on a `401`, the challenge is answered (basic, or a token
    /// for `scope` from its realm) and the request sent once more.
    async fn authed(
        &self,
        method: Method,
        url: &Url,
        scope: &str,
    ) -> std::result::Result<reqwest::Response, AttemptError> {
        let sent = self.authorization(scope);
        let response = self.send_authed(method.clone(), url, scope, None).await?;
        if response.status().as_u16() != 401 || !self.answer(&response, scope, sent).await? {
            return self.refusal(response);
        }
        let response = self.send_authed(method, url, scope, None).await?;
        self.refusal(response)
    }

    /// A `401` to a request that carried the user name and password: the
    /// credentials are wrong, said with the registry and the user (never
    /// the password).
    fn refusal(
        &self,
        response: reqwest::Response,
    ) -> std::result::Result<reqwest::Response, AttemptError> {
        let basic = *self.scheme.lock().unwrap_or_else(|p| p.into_inner()) == Scheme::Basic;
        match (&self.credentials_now().login, response.status().as_u16()) {
            (Some((user, _)), 401) if basic => Err(refused(&format!(
                "the registry {} refused the user name {user:?} and its password (HTTP 401)",
                self.settings.registry.host()
            ))),
            _ => Ok(response),
        }
    }

    /// One request to the registry with the current `Authorization`.
    async fn send_authed(
        &self,
        method: Method,
        url: &Url,
        scope: &str,
        extra: Option<HeaderMap>,
    ) -> std::result::Result<reqwest::Response, AttemptError> {
        let mut headers = extra.unwrap_or_default();
        if self.settings.registry.same_origin(url) {
            if let Some(value) = self.authorization(scope) {
                headers.insert(AUTHORIZATION, value);
            }
        }
        self.client.send(method, url, headers, None, None).await
    }

    /// Learns what a `401` asks for and gets it ready: true when the
    /// request is worth sending again.
    async fn answer(
        &self,
        response: &reqwest::Response,
        scope: &str,
        sent: Option<reqwest::header::HeaderValue>,
    ) -> std::result::Result<bool, AttemptError> {
        let challenge = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(auth::parse_challenge);
        let before = self
            .scheme
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match challenge {
            Some(Challenge::Basic) => {
                if self.credentials().await?.login.is_none() {
                    return Err(refused(
                        "the registry asks for a user name and password ([cache] username and password_env)",
                    ));
                }
                *self.scheme.lock().unwrap_or_else(|p| p.into_inner()) = Scheme::Basic;
                Ok(before != Scheme::Basic)
            }
            Some(Challenge::Bearer { realm, service, .. }) => {
                // A token for what this request needs (reading, or
                // reading and writing the repository), unless another
                // request got a new one meanwhile.
                let _one = self.fetching.lock().await;
                let now = self.tokens.header(scope);
                if now.is_none() || now == sent {
                    self.tokens.forget(scope);
                    let credentials = self.credentials().await?;
                    self.fetch_token(credentials, &realm, service.as_deref(), scope)
                        .await?;
                }
                *self.scheme.lock().unwrap_or_else(|p| p.into_inner()) = Scheme::Bearer {
                    realm,
                    service: service.clone(),
                };
                Ok(true)
            }
            None => Err(refused(
                "the registry refused the request (401) without a challenge this program answers",
            )),
        }
    }

    /// Fetches a token for `scope` (scopes apart by spaces, each sent as a
    /// `scope` of its own) from `realm` (with `credentials`: the identity
    /// token, else the user name and password, when there are any) and
    /// keeps it. The realm is checked by
    /// the same rules as the registry; the credentials go only there.
    async fn fetch_token(
        &self,
        credentials: &Credentials,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> std::result::Result<(), AttemptError> {
        let mut url = Url::parse(realm).map_err(|_| AttemptError::Network {
            reason: "the registry's token realm is not an address".into(),
        })?;
        if url.scheme() != "https" {
            return Err(AttemptError::Scheme {
                scheme: url.scheme().to_string(),
            });
        }
        let mut headers = HeaderMap::new();
        let response = if let Some(identity) = &credentials.identity {
            // A refresh token (Docker's `identitytoken`): the OAuth 2 form
            // the token service takes it in, sent in the body.
            let form = {
                let mut form = url::form_urlencoded::Serializer::new(String::new());
                form.append_pair("grant_type", "refresh_token");
                if let Some(service) = service {
                    form.append_pair("service", service);
                }
                for one in scope.split(' ') {
                    form.append_pair("scope", one);
                }
                form.append_pair("client_id", "gem-resources");
                form.append_pair("refresh_token", identity.expose());
                form.finish()
            };
            headers.insert(
                reqwest::header::CONTENT_TYPE,
                reqwest::header::HeaderValue::from_static("application/x-www-form-urlencoded"),
            );
            let body = reqwest::Body::from(form);
            self.client
                .send(Method::POST, &url, headers, Some(body), None)
                .await?
        } else {
            {
                let mut query = url.query_pairs_mut();
                if let Some(service) = service {
                    query.append_pair("service", service);
                }
                for one in scope.split(' ') {
                    query.append_pair("scope", one);
                }
            }
            if let Some(basic) = credentials.basic() {
                headers.insert(AUTHORIZATION, basic);
            }
            self.client
                .send(Method::GET, &url, headers, None, None)
                .await?
        };
        let status = response.status().as_u16();
        if status != 200 {
            let why = if matches!(status, 401 | 403) {
                format!(
                    "the token service {} refused the credentials ({status})",
                    url.host_str().unwrap_or_default()
                )
            } else {
                format!(
                    "the token service {} answered {status}",
                    url.host_str().unwrap_or_default()
                )
            };
            return Err(refused(&why));
        }
        let body = self.client.body(response, 64 << 10).await?;
        let (token, lasts) = auth::read_token(&body).map_err(|why| refused(&why))?;
        self.tokens.keep(scope, token, lasts);
        Ok(())
    }
}

/// An HTTP failure of the registry.
fn http(status: u16) -> AttemptError {
    AttemptError::Http {
        status,
        retry_after: None,
        body: None,
    }
}

/// A refusal in words (credentials, a token service).
fn refused(why: &str) -> AttemptError {
    AttemptError::Network {
        reason: why.to_string(),
    }
}
