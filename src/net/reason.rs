//! Short reasons for network failures, in words a person can act on:
//! `connection refused`, `TLS: certificate not valid for cdn.test`,
//! `connection reset`. The HTTP client's whole error chain (which repeats
//! the URL) is logged at debug level only.

use std::error::Error as StdError;
use std::io;

/// The reason for a failure to connect or to read, from an error chain.
pub(crate) fn network_reason(e: &(dyn StdError + 'static), host: &str) -> String {
    tracing::debug!(host, "network failure: {}", chain(e));
    let mut source: Option<&(dyn StdError + 'static)> = Some(e);
    let mut innermost = e.to_string();
    while let Some(s) = source {
        if let Some(tls) = s.downcast_ref::<rustls::Error>() {
            return tls_reason(tls, host);
        }
        if let Some(io) = s.downcast_ref::<io::Error>() {
            if let Some(inner) = io.get_ref() {
                if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                    return tls_reason(tls, host);
                }
            }
            if let Some(reason) = io_reason(io.kind()) {
                return reason.to_string();
            }
        }
        if let Some(hyper) = s.downcast_ref::<hyper::Error>() {
            if hyper.is_incomplete_message() {
                return "the server closed the connection before the response was complete".into();
            }
        }
        innermost = s.to_string();
        source = s.source();
    }
    innermost
}

fn io_reason(kind: io::ErrorKind) -> Option<&'static str> {
    use io::ErrorKind::*;
    Some(match kind {
        ConnectionRefused => "connection refused",
        ConnectionReset => "connection reset",
        ConnectionAborted => "connection aborted",
        BrokenPipe => "connection broken",
        TimedOut => "timed out",
        HostUnreachable => "host unreachable",
        NetworkUnreachable => "network unreachable",
        NetworkDown => "network down",
        AddrNotAvailable => "address not available",
        UnexpectedEof => "the connection closed early",
        _ => return None,
    })
}

fn tls_reason(e: &rustls::Error, host: &str) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => {
            format!("TLS: certificate not valid for {host}")
        }
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "TLS: certificate expired".into()
        }
        rustls::Error::InvalidCertificate(C::UnknownIssuer) => {
            "TLS: certificate issued by an unknown authority".into()
        }
        other => format!("TLS: {other}"),
    }
}

/// The error and its causes on one line, without repeats.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_short() {
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(network_reason(&refused, "x"), "connection refused");
        let tls = io::Error::other(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName,
        ));
        assert_eq!(
            network_reason(&tls, "cdn.test"),
            "TLS: certificate not valid for cdn.test"
        );
    }
}
