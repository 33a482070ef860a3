//! A response head and its streaming body, whichever path produced it: the
//! HTTP client directly, or a tunnel through a proxy ([`crate::net::tunnel`]).
//! The transfer loop in [`crate::transfer::fetch`] reads both the same way.

use std::net::IpAddr;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

/// A response whose body is read chunk by chunk.
#[derive(Debug)]
pub(crate) enum Response {
    /// From the HTTP client, connected directly.
    Direct(reqwest::Response),
    /// Over a tunnel through a proxy.
    Proxied(http::Response<Incoming>),
}

/// The address a tunnelled response's connection was asked to reach (the
/// vetted `CONNECT` target), kept in its extensions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dialled(pub(crate) IpAddr);

/// A body that broke off, with its cause chain intact for classification.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// From the HTTP client.
    #[error(transparent)]
    Direct(#[from] reqwest::Error),
    /// From the tunnelled connection.
    #[error(transparent)]
    Proxied(#[from] hyper::Error),
}

impl Response {
    /// The status code.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Response::Direct(r) => r.status(),
            Response::Proxied(r) => r.status(),
        }
    }

    /// The headers.
    pub(crate) fn headers(&self) -> &HeaderMap {
        match self {
            Response::Direct(r) => r.headers(),
            Response::Proxied(r) => r.headers(),
        }
    }

    /// The address the response's connection dialled, when known: the
    /// peer of a direct connection, the `CONNECT` target of a tunnel (not
    /// known when the proxy resolves names).
    pub(crate) fn dialled(&self) -> Option<IpAddr> {
        match self {
            Response::Direct(r) => r.remote_addr().map(|a| a.ip().to_canonical()),
            Response::Proxied(r) => r.extensions().get::<Dialled>().map(|d| d.0),
        }
    }

    /// The body's length when the server announced it.
    pub(crate) fn content_length(&self) -> Option<u64> {
        match self {
            Response::Direct(r) => r.content_length(),
            Response::Proxied(r) => hyper::body::Body::size_hint(r.body()).exact(),
        }
    }

    /// The next piece of the body, `None` at its end.
    pub(crate) async fn chunk(&mut self) -> Result<Option<Bytes>, BodyError> {
        match self {
            Response::Direct(r) => Ok(r.chunk().await?),
            Response::Proxied(r) => loop {
                match r.body_mut().frame().await {
                    None => return Ok(None),
                    Some(frame) => {
                        // Trailers carry no body bytes: skip them.
                        if let Ok(data) = frame?.into_data() {
                            return Ok(Some(data));
                        }
                    }
                }
            },
        }
    }

    /// The whole body as text when it is short: at most `most` bytes,
    /// arriving within `within`, sent without a content coding. `None`
    /// for anything longer, slower, encoded or broken off.
    pub(crate) async fn short_text(
        &mut self,
        most: usize,
        within: std::time::Duration,
    ) -> Option<String> {
        let encoded = self
            .headers()
            .get(http::header::CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        if encoded || self.content_length().is_some_and(|n| n > most as u64) {
            return None;
        }
        let read = async {
            let mut bytes = Vec::new();
            while let Some(chunk) = self.chunk().await.ok()? {
                bytes.extend_from_slice(&chunk);
                if bytes.len() > most {
                    return None;
                }
            }
            Some(bytes)
        };
        let bytes = tokio::time::timeout(within, read).await.ok()??;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }
}
