//! Filling the cache: a file verified from its own addresses is uploaded
//! afterwards, in the background, one at a time, at a bounded rate
//! (`HEAD` first; then `POST /v2/<name>/blobs/uploads/` and a monolithic
//! `PUT <location>?digest=sha256:<hex>`). An upload never delays or fails
//! a download: a full queue drops the offer, a failure is logged and
//! opens the breaker. Also what `cache check` and `cache push` do.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{
    HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, LOCATION,
};
use reqwest::Method;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use crate::cache::{http, push_scope, refused, Cache};
use crate::error::AttemptError;
use crate::net::throttle::Throttle;

/// Offers waiting at most; more are dropped (the next download of the file
/// elsewhere offers it again).
const QUEUE: usize = 1024;
/// Bytes read and sent at a time.
const CHUNK: usize = 256 << 10;

/// One file to upload.
struct Offer {
    sha256: String,
    size: u64,
    path: PathBuf,
}

/// The uploads waiting, and the cap they share.
pub(crate) struct Queue {
    sender: Mutex<Option<mpsc::Sender<Offer>>>,
    throttle: Throttle,
}

impl Queue {
    /// An empty queue; its worker starts with the first offer.
    pub(crate) fn new(bytes_per_sec: Option<u64>) -> Queue {
        Queue {
            sender: Mutex::new(None),
            throttle: Throttle::new(bytes_per_sec),
        }
    }
}

/// What an upload found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// The registry had the blob already.
    Present,
    /// The blob was uploaded.
    Uploaded,
    /// The blob was mounted from another repository (`[cache] mount_from`):
    /// no bytes sent.
    Mounted,
}

/// What `cache check` found: whether the registry answers, lets this
/// configuration read, and lets it write. `Err` holds the reason.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// The registry and repository.
    pub address: String,
    /// It answered `/v2/`.
    pub reach: std::result::Result<(), String>,
    /// A blob could be asked for.
    pub read: std::result::Result<(), String>,
    /// An upload could be started (and was cancelled).
    pub write: std::result::Result<(), String>,
}

impl Cache {
    /// Offers a verified file for upload (with `[cache] push`): queued for
    /// the background worker, never waited for. Does nothing without
    /// `push`, outside a Tokio runtime, or when the queue is full.
    pub fn offer(self: &Arc<Self>, sha256: &str, size: u64, path: &Path) {
        if !self.settings.push {
            return;
        }
        let offer = Offer {
            sha256: sha256.to_string(),
            size,
            path: path.to_path_buf(),
        };
        let mut sender = self.pushes.sender.lock().unwrap_or_else(|p| p.into_inner());
        if sender.as_ref().is_none_or(|s| s.is_closed()) {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            let (tx, rx) = mpsc::channel(QUEUE);
            runtime.spawn(worker(Arc::downgrade(self), rx));
            *sender = Some(tx);
        }
        if let Some(tx) = sender.as_ref() {
            if tx.try_send(offer).is_err() {
                tracing::debug!(sha256, "the cache's upload queue is full: not offered");
            }
        }
    }

    /// Uploads the file at `path` (`size` bytes of `sha256`) unless the
    /// registry has it.
    pub async fn push_file(
        &self,
        sha256: &str,
        size: u64,
        path: &Path,
    ) -> std::result::Result<Pushed, AttemptError> {
        let registry = &self.settings.registry;
        let scope = push_scope(registry);
        let head = self
            .authed(Method::HEAD, &registry.blob(sha256), &scope)
            .await?;
        match head.status().as_u16() {
            200 | 307 => return Ok(Pushed::Present),
            404 => {}
            status => return Err(http(status)),
        }
        let location = match self.mount(sha256, &scope).await? {
            Ok(pushed) => return Ok(pushed),
            Err(Some(location)) => location,
            Err(None) => self.start_upload(&scope).await?,
        };
        let target = registry
            .upload_target(&location, sha256)
            .map_err(|why| refused(&why))?;
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_LENGTH, HeaderValue::from(size));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        if let Some(value) = self.authorization(&scope) {
            headers.insert(AUTHORIZATION, value);
        }
        let body = self.file_body(path).await?;
        // The body goes out at the cap: its time is added to the wait.
        let rate = self
            .settings
            .push_max_bytes_per_sec
            .unwrap_or(u64::MAX)
            .max(1);
        let body_time = Duration::from_secs(size / rate + 60);
        let response = self
            .client
            .send(Method::PUT, &target, headers, Some(body), Some(body_time))
            .await?;
        match response.status().as_u16() {
            201 | 204 => Ok(Pushed::Uploaded),
            status => Err(http(status)),
        }
    }

    /// Mounts the blob from the first repository of `[cache] mount_from`
    /// that has it: `Ok(Mounted)` (`201`); else `Err` with the `Location` of
    /// the upload the registry started instead (`202`), or `None` (any
    /// other answer: an upload of its own follows).
    async fn mount(
        &self,
        sha256: &str,
        scope: &str,
    ) -> std::result::Result<std::result::Result<Pushed, Option<String>>, AttemptError> {
        let count = self.settings.mount_from.len();
        for (index, from) in self.settings.mount_from.iter().enumerate() {
            let url = self.settings.registry.mount(sha256, from);
            // A token for a mount also reads the other repository.
            let both = format!("{scope} repository:{from}:pull");
            let response = self.authed(Method::POST, &url, &both).await?;
            match response.status().as_u16() {
                201 => return Ok(Ok(Pushed::Mounted)),
                // Not there: the registry started an upload instead, kept
                // for the last repository, cancelled before the next.
                202 if index + 1 == count => return Ok(Err(location(&response))),
                202 => {
                    if let Some(location) = location(&response) {
                        self.cancel_upload(&location, &both).await;
                    }
                }
                _ => {}
            }
        }
        Ok(Err(None))
    }

    /// Cancels the upload at `location` (best effort: the registry drops
    /// an abandoned one by itself in time).
    async fn cancel_upload(&self, location: &str, scope: &str) {
        if let Ok(target) = self.settings.registry.base_join(location) {
            let mut headers = HeaderMap::new();
            if let Some(value) = self.authorization(scope) {
                headers.insert(AUTHORIZATION, value);
            }
            let _ = self
                .client
                .send(Method::DELETE, &target, headers, None, None)
                .await;
        }
    }

    /// `POST /v2/<name>/blobs/uploads/`: the `Location` to send the blob to.
    async fn start_upload(&self, scope: &str) -> std::result::Result<String, AttemptError> {
        let response = self
            .authed(Method::POST, &self.settings.registry.uploads(), scope)
            .await?;
        let status = response.status().as_u16();
        if status != 202 {
            return Err(http(status));
        }
        location(&response)
            .ok_or_else(|| refused("the registry started an upload without a Location"))
    }

    /// The file's bytes as a streamed body, read a chunk at a time under
    /// the upload cap.
    async fn file_body(&self, path: &Path) -> std::result::Result<reqwest::Body, AttemptError> {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| AttemptError::Network {
                reason: format!("cannot read {}: {e}", path.display()),
            })?;
        let throttle = self.pushes.throttle.clone();
        let stream =
            futures_util::stream::unfold((file, throttle), |(mut file, throttle)| async move {
                let mut buf = vec![0u8; CHUNK];
                match file.read(&mut buf).await {
                    Ok(0) => None,
                    Ok(n) => {
                        buf.truncate(n);
                        throttle.take(n).await;
                        Some((Ok::<_, std::io::Error>(buf), (file, throttle)))
                    }
                    Err(e) => Some((Err(e), (file, throttle))),
                }
            });
        Ok(reqwest::Body::wrap_stream(stream))
    }

    /// Whether the configuration reaches the registry, can read, and can
    /// write (an upload started, then cancelled), with the reason when not.
    /// Never opens the breaker.
    pub async fn check(&self) -> CheckReport {
        let registry = &self.settings.registry;
        let mut report = CheckReport {
            address: registry.address(),
            reach: Ok(()),
            read: Ok(()),
            write: Ok(()),
        };
        let not_reached = || Err("not tried: the registry cannot be reached".to_string());
        match self
            .client
            .send(
                Method::GET,
                &registry.api_root(),
                HeaderMap::new(),
                None,
                None,
            )
            .await
        {
            Ok(r) if matches!(r.status().as_u16(), 200 | 401) => {}
            Ok(r) => {
                report.reach = Err(format!(
                    "{} is not a registry: /v2/ answered {}",
                    registry.host(),
                    http(r.status().as_u16())
                ))
            }
            Err(e) => report.reach = Err(e.to_string()),
        }
        if report.reach.is_err() {
            report.read = not_reached();
            report.write = not_reached();
            return report;
        }
        // The SHA-256 of no bytes: a blob a registry may or may not have.
        let probe = registry.blob(crate::cache::EMPTY_SHA256);
        let scope = crate::cache::pull_scope(registry);
        report.read = match self.authed(Method::HEAD, &probe, &scope).await {
            Ok(r) if matches!(r.status().as_u16(), 200 | 404 | 307) => Ok(()),
            Ok(r) => Err(format!("refused: {}", http(r.status().as_u16()))),
            Err(e) => Err(e.to_string()),
        };
        report.write = match self.start_upload(&push_scope(registry)).await {
            Ok(location) => {
                // Nothing is left behind: the upload is cancelled.
                self.cancel_upload(&location, &push_scope(registry)).await;
                Ok(())
            }
            Err(AttemptError::Http { status, .. }) => Err(format!("refused: {}", http(status))),
            Err(e) => Err(e.to_string()),
        };
        report
    }
}

/// The `Location` of an answer that started an upload.
fn location(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Uploads the offers one at a time while the cache lives; a failure is
/// logged and opens the breaker (the next offers wait for it to close).
async fn worker(cache: std::sync::Weak<Cache>, mut offers: mpsc::Receiver<Offer>) {
    while let Some(offer) = offers.recv().await {
        let Some(cache) = cache.upgrade() else {
            return;
        };
        if !cache.available() {
            tracing::debug!(sha256 = %offer.sha256, "the cache is left alone for now: not uploaded");
            continue;
        }
        match cache
            .push_file(&offer.sha256, offer.size, &offer.path)
            .await
        {
            Ok(Pushed::Present) => {
                tracing::debug!(sha256 = %offer.sha256, "the cache has the file already");
            }
            Ok(Pushed::Uploaded) => {
                tracing::info!(sha256 = %offer.sha256, "uploaded to the cache");
            }
            Ok(Pushed::Mounted) => {
                tracing::info!(sha256 = %offer.sha256, "mounted in the cache from another repository");
            }
            Err(e) => cache.failed(&format_args!("cannot upload {}: {e}", offer.sha256)),
        }
    }
}
