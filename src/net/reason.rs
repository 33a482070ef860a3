//! Short reasons for network failures, in words a person can act on:
//! `connection refused`, `TLS: certificate not valid for cdn.test`,
//! `connection reset`. The HTTP client's whole error chain (which repeats
//! the URL) is logged at debug level only.

use std::error::Error as StdError;
use std::io;

use crate::error::AttemptError;

/// A failure to connect or to read as an attempt's error: a certificate
/// that failed verification is [`AttemptError::Certificate`] (the same
/// address would present it again), anything else
/// [`AttemptError::Network`]; both with [`network_reason`]'s words.
pub(crate) fn network_failure(e: &(dyn StdError + 'static), host: &str) -> AttemptError {
    let reason = network_reason(e, host);
    if matches!(tls_in_chain(e), Some(rustls::Error::InvalidCertificate(_))) {
        AttemptError::Certificate { reason }
    } else {
        AttemptError::Network { reason }
    }
}

/// The TLS error in `e`'s chain, if any.
fn tls_in_chain<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut source: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(tls) = s.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(tls) = s.downcast_ref::<io::Error>().and_then(tls_inside) {
            return Some(tls);
        }
        source = s.source();
    }
    None
}

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
            if let Some(tls) = tls_inside(io) {
                return tls_reason(tls, host);
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

/// The TLS error an I/O error carries, through any I/O errors wrapping it
/// (a connector wraps the TLS stream's own `io::Error`).
fn tls_inside(io: &io::Error) -> Option<&rustls::Error> {
    let mut inner = io.get_ref()?;
    for _ in 0..8 {
        if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        inner = inner.downcast_ref::<io::Error>()?.get_ref()?;
    }
    None
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

/// Where to trust a private certificate authority, for development.
const EXTRA_ROOTS_HINT: &str =
    "for a test or development server, add its CA certificate to `[dev] extra_root_certs`";

/// A TLS failure in words: what is wrong with the server's certificate (or
/// the handshake), and for an unknown authority where to trust one.
fn tls_reason(e: &rustls::Error, host: &str) -> String {
    match e {
        rustls::Error::InvalidCertificate(c) => {
            format!(
                "TLS: the server's certificate is not trusted: {}",
                certificate_reason(c, host)
            )
        }
        rustls::Error::AlertReceived(alert) => {
            format!("TLS: the server ended the handshake ({alert:?} alert)")
        }
        rustls::Error::NoCertificatesPresented => "TLS: the server presented no certificate".into(),
        rustls::Error::PeerIncompatible(_) => {
            "TLS: the server supports no TLS version or cipher this program accepts".into()
        }
        rustls::Error::InvalidMessage(_) | rustls::Error::PeerMisbehaved(_) => {
            "TLS: the server broke the TLS protocol (is it an HTTPS server?)".into()
        }
        other => format!("TLS: {other}"),
    }
}

/// What is wrong with a certificate, in words.
fn certificate_reason(c: &rustls::CertificateError, host: &str) -> String {
    use rustls::CertificateError as C;
    match c {
        C::NotValidForName | C::NotValidForNameContext { .. } => {
            format!("it is not valid for {host}")
        }
        C::Expired | C::ExpiredContext { .. } => "it has expired".into(),
        C::NotValidYet | C::NotValidYetContext { .. } => "it is not valid yet".into(),
        C::Revoked => "it was revoked".into(),
        C::UnknownIssuer => format!("it was issued by an unknown certificate authority ({EXTRA_ROOTS_HINT})"),
        C::BadSignature => format!(
            "its signature does not verify against the certificate authority it names ({EXTRA_ROOTS_HINT})"
        ),
        C::BadEncoding => "it cannot be read".into(),
        C::InvalidPurpose | C::InvalidPurposeContext { .. } => "it is not meant for a server".into(),
        C::UnsupportedSignatureAlgorithmContext { .. }
        | C::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => WEAK_SIGNATURE.into(),
        C::Other(other) => match other.0.downcast_ref::<webpki::Error>() {
            Some(e) => webpki_reason(e),
            None if other.0.is::<super::pinned::SelfSignedUntrusted>() => format!(
                "{other} (for a test or development server, add that certificate to `[dev] extra_root_certs`)"
            ),
            None => other.to_string(),
        },
        #[allow(deprecated)]
        C::UnsupportedSignatureAlgorithm => WEAK_SIGNATURE.into(),
        other => in_words(&format!("{other:?}")),
    }
}

/// A certificate signed with an algorithm that is refused.
const WEAK_SIGNATURE: &str =
    "it is signed with an algorithm this program does not accept (such as SHA-1 or MD5)";

/// What a certificate error of the WebPKI verifier (the platform's, on
/// Linux) means, in words. The variants without context are still made
/// by some verifiers, so they are read too.
#[allow(deprecated)]
fn webpki_reason(e: &webpki::Error) -> String {
    use webpki::Error as W;
    match e {
        W::CaUsedAsEndEntity => format!(
            "it is a CA certificate used as a server certificate (the server must present a certificate issued by that CA; {EXTRA_ROOTS_HINT})"
        ),
        W::EndEntityUsedAsCa => "a server certificate was used as a certificate authority".into(),
        W::UnknownIssuer => {
            format!("it was issued by an unknown certificate authority ({EXTRA_ROOTS_HINT})")
        }
        W::UnsupportedSignatureAlgorithm
        | W::UnsupportedSignatureAlgorithmContext(_)
        | W::UnsupportedSignatureAlgorithmForPublicKey
        | W::UnsupportedSignatureAlgorithmForPublicKeyContext(_) => WEAK_SIGNATURE.into(),
        W::InvalidSignatureForPublicKey => {
            "its signature does not verify against the key that should have made it".into()
        }
        W::CertExpired { .. } => "it has expired".into(),
        W::CertNotValidYet { .. } => "it is not valid yet".into(),
        W::RequiredEkuNotFound | W::RequiredEkuNotFoundContext(_) => {
            "it is not meant for a server".into()
        }
        other => in_words(&format!("{other:?}")),
    }
}

/// A Rust variant's name as words: `MalformedExtensions { .. }`
/// → `malformed extensions`; what follows the name (its
/// fields) is left out.
fn in_words(debug: &str) -> String {
    let name: String = debug
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let mut words = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            words.push(' ');
        }
        words.push(c.to_ascii_lowercase());
    }
    if words.is_empty() {
        "it was refused".into()
    } else {
        words
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
        assert!(matches!(
            network_failure(&refused, "x"),
            AttemptError::Network { .. }
        ));
        let tls = io::Error::other(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName,
        ));
        assert_eq!(
            network_reason(&tls, "cdn.test"),
            "TLS: the server's certificate is not trusted: it is not valid for cdn.test"
        );
        assert!(matches!(
            network_failure(&tls, "cdn.test"),
            AttemptError::Certificate { .. }
        ));
        // As a connector wraps it.
        let wrapped = io::Error::other(io::Error::new(io::ErrorKind::InvalidData, tls));
        assert_eq!(
            network_reason(&wrapped, "cdn.test"),
            "TLS: the server's certificate is not trusted: it is not valid for cdn.test"
        );
    }

    #[test]
    fn certificate_failures_are_said_in_words_with_the_setting_to_use() {
        use rustls::{CertificateError as C, OtherError};
        let reason = |c: C| tls_reason(&rustls::Error::InvalidCertificate(c), "cdn.test");
        let ca = C::Other(OtherError(std::sync::Arc::new(
            webpki::Error::CaUsedAsEndEntity,
        )));
        let shown = reason(ca);
        assert!(
            shown.starts_with("TLS: the server's certificate is not trusted: it is a CA certificate used as a server certificate"),
            "{shown}"
        );
        assert!(!shown.contains("CaUsedAsEndEntity"), "{shown}");
        for c in [
            C::UnknownIssuer,
            C::Other(OtherError(std::sync::Arc::new(
                webpki::Error::UnknownIssuer,
            ))),
        ] {
            let shown = reason(c);
            assert!(shown.contains("unknown certificate authority"), "{shown}");
            assert!(shown.contains("`[dev] extra_root_certs`"), "{shown}");
        }
        assert_eq!(
            reason(C::Expired),
            "TLS: the server's certificate is not trusted: it has expired"
        );
    }

    #[test]
    #[allow(deprecated)]
    fn refused_signature_algorithms_and_other_failures_read_as_words() {
        use rustls::{CertificateError as C, OtherError};
        let reason = |c: C| tls_reason(&rustls::Error::InvalidCertificate(c), "cdn.test");
        let sha1 = C::UnsupportedSignatureAlgorithmContext {
            signature_algorithm_id: vec![6, 9, 42, 134, 72],
            supported_algorithms: vec![],
        };
        let webpki_sha1 = C::Other(OtherError(std::sync::Arc::new(
            webpki::Error::UnsupportedSignatureAlgorithm,
        )));
        for c in [sha1, webpki_sha1] {
            let shown = reason(c);
            assert!(shown.ends_with(WEAK_SIGNATURE), "{shown}");
        }
        let other = C::Other(OtherError(std::sync::Arc::new(
            webpki::Error::MalformedExtensions,
        )));
        assert_eq!(
            reason(other),
            "TLS: the server's certificate is not trusted: malformed extensions"
        );
        assert_eq!(
            in_words("ApplicationVerificationFailure"),
            "application verification failure"
        );
        assert_eq!(in_words("Foo { a: [1, 2] }"), "foo");
    }
}
