//! Requests through an HTTP proxy, with the address rule kept on this side.
//!
//! The client's own proxy support would send `CONNECT <name>:<port>` and let
//! the proxy resolve the name wherever it likes, out of the guard's reach.
//! So the tunnel is built here:
//! 1. the fetcher resolves and vets the hop's address (or takes the vetted
//!    IP literal) and passes it in as the `CONNECT` target;
//! 2. TCP to the configured proxy (TLS first for an `https://` proxy). The
//!    proxy's own address is exempt from the local-address rule: it is the
//!    one address the user named;
//! 3. `CONNECT <ip>:<port>`, with `Proxy-Authorization` from the proxy URL;
//! 4. inside the tunnel, TLS with the same trust as a direct connection,
//!    SNI and certificate verification for the host *name*;
//! 5. HTTP/1.1 over it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use url::{Host, Url};

use crate::error::AttemptError;
use crate::net::proxy::ProxyUrl;

/// Largest proxy answer head to `CONNECT` read before giving up.
const MAX_CONNECT_HEAD: usize = 8 * 1024;

/// A byte stream: plain TCP, or TLS to an `https://` proxy.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Opens tunnels through proxies and sends one request over each.
#[derive(Clone)]
pub(crate) struct Tunnels {
    /// TLS trust, for the origin inside the tunnel and for an `https://`
    /// proxy: the same as a direct connection's.
    tls: TlsConnector,
    /// Longest wait for the TCP connection to the proxy.
    connect_timeout: Duration,
}

impl Tunnels {
    /// Tunnels trusting what `tls` trusts.
    pub(crate) fn new(tls: Arc<ClientConfig>, connect_timeout: Duration) -> Tunnels {
        Tunnels {
            tls: TlsConnector::from(tls),
            connect_timeout,
        }
    }

    /// Sends `request` for `url` through `proxy`, tunnelling to `target`
    /// (`ip:port`, or `name:port` when the proxy resolves names). `check`
    /// (the live policy) runs again after each step of the connection and
    /// right before the request is written; its failure stops the request.
    pub(crate) async fn send(
        &self,
        proxy: &ProxyUrl,
        target: &str,
        url: &Url,
        request: http::Request<Empty<Bytes>>,
        check: &(dyn Fn() -> Result<(), AttemptError> + Sync),
    ) -> Result<http::Response<Incoming>, AttemptError> {
        let stream = self.open(proxy, target).await?;
        check()?;
        let host = server_name(url)?;
        let network = |what: &str, e: &dyn std::fmt::Display| AttemptError::Network {
            reason: format!("{what} {target} through the proxy {proxy}: {e}"),
        };
        let name = url.host_str().unwrap_or_default().to_string();
        let tls = self.tls.connect(host, stream).await.map_err(|e| {
            match crate::net::reason::network_failure(&e, &name) {
                AttemptError::Certificate { reason } => AttemptError::Certificate {
                    reason: format!(
                        "TLS handshake with {target} through the proxy {proxy}: {reason}"
                    ),
                },
                other => network("TLS handshake with", &other),
            }
        })?;
        crate::net::connecting::mark_connected()?;
        check()?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| network("HTTP handshake with", &e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("proxied connection ended: {e}");
            }
        });
        check()?;
        sender
            .send_request(request)
            .await
            .map_err(|e| network("request to", &crate::net::reason::chain(&e)))
    }

    /// A stream through `proxy` to `target`, once the proxy agreed.
    async fn open(&self, proxy: &ProxyUrl, target: &str) -> Result<Box<dyn Stream>, AttemptError> {
        let unreachable = |e: &dyn std::fmt::Display| AttemptError::Proxy {
            status: None,
            reason: format!("cannot reach the proxy {proxy}: {e}"),
        };
        let connect = TcpStream::connect((proxy.host.as_str(), proxy.port));
        let tcp = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) => return Err(unreachable(&e)),
            Err(_) => {
                let secs = self.connect_timeout.as_secs_f64();
                return Err(unreachable(&format!("no connection within {secs}s")));
            }
        };
        let _ = tcp.set_nodelay(true);
        let mut stream: Box<dyn Stream> = if proxy.tls {
            let name = ServerName::try_from(proxy.host.clone())
                .map_err(|e| unreachable(&format!("invalid host name: {e}")))?;
            let tls =
                self.tls.connect(name, tcp).await.map_err(|e| {
                    unreachable(&crate::net::reason::network_reason(&e, &proxy.host))
                })?;
            Box::new(tls)
        } else {
            Box::new(tcp)
        };
        let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = &proxy.authorization {
            head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
        }
        head.push_str("\r\n");
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(|e| unreachable(&e))?;
        let status = read_connect_answer(&mut stream)
            .await
            .map_err(|e| unreachable(&e))?;
        if (200..300).contains(&status) {
            return Ok(stream);
        }
        Err(refusal(proxy, target, status))
    }
}

/// The name inside the tunnel: SNI and certificate check are for the URL's
/// host, whatever address the tunnel goes to.
fn server_name(url: &Url) -> Result<ServerName<'static>, AttemptError> {
    let invalid = |e: &dyn std::fmt::Display| AttemptError::Network {
        reason: format!("invalid host name for TLS: {e}"),
    };
    match url.host() {
        Some(Host::Domain(d)) => {
            ServerName::try_from(crate::net::guard::normalise_host(d)).map_err(|e| invalid(&e))
        }
        Some(Host::Ipv4(ip)) => Ok(ServerName::IpAddress(std::net::IpAddr::V4(ip).into())),
        Some(Host::Ipv6(ip)) => Ok(ServerName::IpAddress(std::net::IpAddr::V6(ip).into())),
        None => Err(invalid(&"address has no host")),
    }
}

/// Why the proxy would not open the tunnel, in words a person can act on.
fn refusal(proxy: &ProxyUrl, target: &str, status: u16) -> AttemptError {
    let reason = match status {
        407 if proxy.has_credentials() => format!(
            "the proxy {proxy} refused the credentials in its URL (407 Proxy Authentication Required)"
        ),
        407 => format!(
            "the proxy {proxy} requires authentication (407 Proxy Authentication Required); put user:password@ in the proxy URL"
        ),
        403 => format!("the proxy {proxy} refused to connect to {target} (403 Forbidden)"),
        other => {
            let words = http::StatusCode::from_u16(other)
                .ok()
                .and_then(|s| s.canonical_reason())
                .map(|r| format!(" {r}"))
                .unwrap_or_default();
            format!("the proxy {proxy} did not open a tunnel to {target} ({other}{words})")
        }
    };
    AttemptError::Proxy {
        status: Some(status),
        reason,
    }
}

/// Reads the proxy's answer head to `CONNECT` and returns its status.
///
/// Reads one byte at a time so nothing past the head (the origin's TLS
/// bytes) is consumed; the head is short and read once per connection.
async fn read_connect_answer(stream: &mut Box<dyn Stream>) -> Result<u16, String> {
    let mut head = Vec::with_capacity(256);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_CONNECT_HEAD {
            return Err(format!(
                "answer to CONNECT longer than {MAX_CONNECT_HEAD} bytes"
            ));
        }
        let mut byte = [0u8; 1];
        match stream.read(&mut byte).await {
            Ok(0) => return Err("the proxy closed the connection without answering".into()),
            Ok(_) => head.push(byte[0]),
            Err(e) => return Err(e.to_string()),
        }
    }
    parse_status(&head).ok_or_else(|| "the proxy's answer is not HTTP".into())
}

use crate::net::headers::parse_connect_status as parse_status;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(
            parse_status(b"HTTP/1.1 200 Connection established\r\n\r\n"),
            Some(200)
        );
        assert_eq!(
            parse_status(b"HTTP/1.0 407 Auth\r\nX: y\r\n\r\n"),
            Some(407)
        );
        assert_eq!(parse_status(b"HTTP/1.1 200\r\n\r\n"), Some(200));
        assert_eq!(parse_status(b"SSH-2.0-OpenSSH\r\n\r\n"), None);
        assert_eq!(parse_status(b"HTTP/1.1 20 x\r\n\r\n"), None);
    }

    #[test]
    fn refusals_name_the_proxy_without_credentials() {
        let p = ProxyUrl::parse("http://user:hunter2@proxy.corp:3128").unwrap();
        for status in [403, 407, 502] {
            let text = refusal(&p, "192.0.2.1:443", status).to_string();
            assert!(text.contains("http://proxy.corp:3128"), "{text}");
            assert!(
                !text.contains("hunter2") && !text.contains("user"),
                "{text}"
            );
        }
        assert!(refusal(&p, "x:1", 407)
            .to_string()
            .contains("refused the credentials"));
        let anonymous = ProxyUrl::parse("http://proxy.corp:3128").unwrap();
        assert!(refusal(&anonymous, "x:1", 407)
            .to_string()
            .contains("requires authentication"));
        assert!(refusal(&p, "192.0.2.1:443", 403)
            .to_string()
            .contains("refused to connect to 192.0.2.1:443"));
    }
}
