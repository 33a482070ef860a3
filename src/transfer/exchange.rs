//! The exchange of one hop: the host slot, the request (direct or through
//! the proxy) with its headers, the response head under the live policy,
//! and the redirects followed by hand until a body can be read.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use reqwest::header::{
    ACCEPT_ENCODING, CONTENT_RANGE, ETAG, IF_RANGE, LAST_MODIFIED, LOCATION, RANGE, RETRY_AFTER,
    USER_AGENT,
};
use tokio::sync::watch;
use url::{Host, Url};

use crate::error::AttemptError;
use crate::net::connecting::{mark_answered, Connecting, CONNECTING};
use crate::net::guard::Blocked;
use crate::net::headers;
use crate::net::hosts::HostPermit;
use crate::net::proxy::ProxyUrl;
use crate::net::resolve::LookupRefused;
use crate::net::response::{Dialled, Response};
use crate::transfer::fetch::{Fetcher, Reporter, Resume, MAX_REDIRECTS};

/// The bytes one request asks for: from `start` to `end` (inclusive; to
/// the end of the file when `None`), under `If-Range: validator` when
/// there is one. Without a validator only a fresh request asks (the probe
/// of whether the server answers ranges exactly).
#[derive(Debug, Clone)]
pub(super) struct Ask {
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive.
    pub end: Option<u64>,
    /// Sent as `If-Range`.
    pub validator: Option<String>,
}

impl Ask {
    /// The rest of the file after the kept prefix of `resume`; with
    /// `parts`, only up to its first kept range.
    pub(super) fn resume(resume: &Resume, parts: bool) -> Ask {
        let end = match (parts, resume.ranges.first()) {
            (true, Some([start, _])) => Some(start - 1),
            _ => None,
        };
        Ask {
            start: resume.offset,
            end,
            validator: Some(resume.validator.clone()),
        }
    }
}

impl Fetcher {
    /// Sends the request (with `Range` and `If-Range` when resuming) and
    /// follows redirects until a response whose body can be read: a `200`,
    /// or a `206` that continues exactly the kept bytes. Returns the final
    /// hop, the response, the offset its body starts at, its host's slot and
    /// how long the final hop took to answer once its slot was free (the
    /// connection's set-up included).
    ///
    /// Every wait (the host slot, the connection, the head) watches
    /// `policy` and stops when the hop is no longer permitted; the hop is
    /// checked again right before its request is sent.
    pub(super) async fn response_head(
        &self,
        address: &Url,
        ask: Option<&Ask>,
        limit: u64,
        policy: &mut watch::Receiver<u64>,
        reporter: &mut dyn Reporter,
    ) -> Result<(Url, Response, u64, HostPermit, Duration), HeadError> {
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
            let asked = tokio::time::Instant::now();
            let response = self
                .live(&hop, policy, Some(&mut *reporter), self.send(&hop, ask))
                .await
                .and_then(|sent| sent)
                .and_then(|response| {
                    let dialled = response.dialled();
                    self.check_live(&hop, dialled).map(|()| response)
                })
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
            let mut response = response;
            let offset = match head_offset(&hop, &response, ask, limit) {
                Ok(offset) => offset,
                Err(e) => return Err(with_short_body(*e, &mut response).await),
            };
            return Ok((hop, response, offset, permit, asked.elapsed()));
        }
    }

    /// Runs `wait` for `hop` while watching the policy: a change that no
    /// longer permits the hop stops the wait with the policy failure. With
    /// a `reporter`, a connection made while waiting is reported, and so is
    /// an answer on a connection kept open from an earlier request.
    pub(super) async fn live<T>(
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
                out = &mut wait => {
                    // A request that went on a connection kept open from an
                    // earlier one is reported once it is answered.
                    if let Some(r) = reporter.take() {
                        if connected.notified().now_or_never().is_some() {
                            r.connected();
                        }
                    }
                    return Ok(out);
                }
            }
        }
    }

    /// Sends the request for one hop, directly or through the proxy, and
    /// waits for the response head.
    async fn send(&self, url: &Url, ask: Option<&Ask>) -> Result<Response, AttemptError> {
        let wait = self.connect + self.stall;
        let proxy = self.proxy.proxy_for_url(url).cloned();
        let sent = async {
            match &proxy {
                None => self.send_direct(url, ask).await.map(Response::Direct),
                Some(proxy) => self.send_proxied(proxy, url, ask).await,
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
        ask: Option<&Ask>,
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
        request.headers_mut().extend(request_headers(ask));
        if let Some(value) = self
            .authorize
            .as_ref()
            .and_then(|c| c.authorization_for(url))
        {
            request
                .headers_mut()
                .insert(reqwest::header::AUTHORIZATION, value);
        }
        let check = || self.check_policy(url);
        let mut response = self
            .tunnels
            .send(proxy, &target, url, request, &check)
            .await?;
        if let Ok(dialled) = target.parse::<std::net::SocketAddr>() {
            let ip = dialled.ip().to_canonical();
            response.extensions_mut().insert(Dialled(ip));
        }
        Ok(Response::Proxied(response))
    }

    async fn send_direct(
        &self,
        url: &Url,
        ask: Option<&Ask>,
    ) -> Result<reqwest::Response, AttemptError> {
        // The name is resolved again for every request, so a connection
        // kept open to an address it no longer resolves to is not reused.
        let answers = match url.host() {
            Some(Host::Domain(name)) => Some(self.resolver.lookup(name).await?),
            _ => None,
        };
        let authority = authority(url);
        let lease = self.pool.client(&authority, answers.as_deref())?;
        let mut headers = request_headers(ask);
        // A cache's fetcher: the registry's own hops only, never a
        // redirect target such as its blob storage.
        if let Some(value) = self
            .authorize
            .as_ref()
            .and_then(|c| c.authorization_for(url))
        {
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let response = lease
            .client
            .get(url.clone())
            .headers(headers)
            .send()
            .await
            .map_err(|e| request_error(&e))?;
        mark_answered();
        if let Some(peer) = response.remote_addr() {
            self.pool.record(&authority, lease.generation, peer.ip());
        }
        Ok(response)
    }
}

/// The host and port a request goes to, as connections are kept by.
fn authority(url: &Url) -> String {
    let port = url.port_or_known_default().unwrap_or(443);
    match url.host() {
        Some(Host::Ipv6(ip)) => format!("[{ip}]:{port}"),
        Some(host) => format!("{host}:{port}"),
        None => String::new(),
    }
}

/// The headers of every request, direct or through a proxy: no
/// compression, and `Range` (with `If-Range` when there is a validator)
/// when asking for part of the file.
fn request_headers(ask: Option<&Ask>) -> reqwest::header::HeaderMap {
    use reqwest::header::HeaderValue;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(USER_AGENT, HeaderValue::from_static(user_agent()));
    headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    if let Some(a) = ask {
        let range = match a.end {
            Some(end) => format!("bytes={}-{end}", a.start),
            None => format!("bytes={}-", a.start),
        };
        // The validator was checked when it was kept (visible ASCII).
        let validator = a.validator.as_deref().map(HeaderValue::from_str);
        match (HeaderValue::from_str(&range), validator) {
            (Ok(range), Some(Ok(validator))) => {
                headers.insert(RANGE, range);
                headers.insert(IF_RANGE, validator);
            }
            (Ok(range), None) => {
                headers.insert(RANGE, range);
            }
            _ => {}
        }
    }
    headers
}

/// Where the body of an accepted response head starts: 0 for a `200`, the
/// asked start for a `206` that is exactly the bytes asked for (its
/// start, end and total checked); anything else is refused.
fn head_offset(
    hop: &Url,
    response: &Response,
    ask: Option<&Ask>,
    limit: u64,
) -> Result<u64, Box<HeadError>> {
    let status = response.status().as_u16();
    match (status, ask) {
        // The whole file, unchanged (its validator the one asked about),
        // for a closed range after a kept prefix: the server does not
        // answer that form of range, which is not the file starting over.
        (200, Some(a))
            if a.start > 0
                && a.end.is_some()
                && a.validator.is_some()
                && validator(response) == a.validator =>
        {
            let why = "200 (the whole file) to a closed range".to_string();
            Err(Box::new(HeadError::RangeRefused(hop.clone(), why)))
        }
        (200, _) => Ok(0),
        (206, Some(a)) => {
            let range = response
                .headers()
                .get(CONTENT_RANGE)
                .and_then(|v| headers::parse_content_range(v.as_bytes()));
            let last = a.end.or_else(|| limit.checked_sub(1));
            match range {
                Some(cr)
                    if cr.start == a.start && cr.total == Some(limit) && Some(cr.end) == last =>
                {
                    Ok(a.start)
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
                    body: None,
                },
            )))
        }
    }
}

/// A refusal (`401`, `403`) with what its body says, when that is a short
/// plain text or JSON: a gated file or an expired signature is then
/// readable in the warning and the error, not only its status.
async fn with_short_body(error: HeadError, response: &mut Response) -> HeadError {
    match error {
        HeadError::Attempt(
            hop,
            AttemptError::Http {
                status: status @ (401 | 403),
                retry_after,
                body: None,
            },
        ) => {
            let body = if is_short_text(response) {
                response
                    .short_text(SHORT_BODY_BYTES, SHORT_BODY_WAIT)
                    .await
                    .and_then(|text| readable(&text))
                    .filter(|text| !only_restates(text, status))
            } else {
                None
            };
            HeadError::Attempt(
                hop,
                AttemptError::Http {
                    status,
                    retry_after,
                    body,
                },
            )
        }
        other => other,
    }
}

/// Whether `text` says no more than the status line (`403 Forbidden`,
/// `Forbidden`).
fn only_restates(text: &str, status: u16) -> bool {
    let reason = reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or_default();
    let text = text.trim_end_matches('.');
    text.eq_ignore_ascii_case(reason)
        || text.eq_ignore_ascii_case(&format!("{status} {reason}"))
        || text == status.to_string()
}

/// The most of a refusal's body that is read.
const SHORT_BODY_BYTES: usize = 4096;
/// How long a refusal's body may take.
const SHORT_BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// The most of it that is shown.
const SHORT_BODY_CHARS: usize = 200;

/// Whether the body is plain text or JSON (`application/json`,
/// `application/problem+json`, …), never a page of HTML.
fn is_short_text(response: &Response) -> bool {
    let Some(kind) = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let kind = kind.split(';').next().unwrap_or_default().trim();
    let kind = kind.to_ascii_lowercase();
    kind == "text/plain" || kind == "application/json" || kind.ends_with("+json")
}

/// `text` on one line: control and format characters (escapes,
/// bidirectional overrides, zero-width characters) made spaces, runs of
/// white space one space, cut to [`SHORT_BODY_CHARS`]; `None` when
/// nothing is left.
fn readable(text: &str) -> Option<String> {
    let clean: String = text
        .chars()
        .map(|c| {
            if c.is_control() || crate::manifest::is_format(c) {
                ' '
            } else {
                c
            }
        })
        .collect();
    let clean = clean.split_whitespace().collect::<Vec<_>>().join(" ");
    if clean.is_empty() {
        return None;
    }
    Some(if clean.chars().count() > SHORT_BODY_CHARS {
        let cut: String = clean.chars().take(SHORT_BODY_CHARS - 1).collect();
        format!("{cut}…")
    } else {
        clean
    })
}

/// The `User-Agent` of every request.
fn user_agent() -> &'static str {
    concat!("gem-resources/", env!("CARGO_PKG_VERSION"))
}

/// Why no readable response head came.
pub(super) enum HeadError {
    /// The hop failed.
    Attempt(Url, AttemptError),
    /// The server does not continue the kept bytes as asked.
    RangeRefused(Url, String),
}

/// The validator a response gives its bytes: a strong `ETag`, else
/// `Last-Modified`.
pub(super) fn validator(response: &Response) -> Option<String> {
    let h = response.headers();
    h.get(ETAG)
        .and_then(|v| headers::parse_strong_etag(v.as_bytes()))
        .or_else(|| {
            h.get(LAST_MODIFIED)
                .and_then(|v| headers::parse_last_modified(v.as_bytes()))
        })
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
        body: None,
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
    crate::net::reason::network_failure(e, host)
}

#[cfg(test)]
mod tests {
    use super::{only_restates, readable};

    #[test]
    fn a_refusals_body_is_shown_on_one_line_without_control_or_format_characters() {
        assert_eq!(
            readable("{\n  \"error\": \"Access to model x is restricted\"\n}\n").as_deref(),
            Some("{ \"error\": \"Access to model x is restricted\" }")
        );
        assert_eq!(
            readable("expired\u{1b}[31m\u{202e}txt.exe\u{200b}!").as_deref(),
            Some("expired [31m txt.exe !")
        );
        assert_eq!(readable(" \n\t\u{200b}"), None);
        let long = readable(&"a".repeat(500)).unwrap();
        assert_eq!(long.chars().count(), 200);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn a_body_that_only_restates_the_status_is_not_shown() {
        assert!(only_restates("403 Forbidden", 403));
        assert!(only_restates("Unauthorized.", 401));
        assert!(!only_restates("Signature expired", 403));
    }
}
