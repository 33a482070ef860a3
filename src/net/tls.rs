//! TLS trust when `[dev] extra_root_certs` is set.
//!
//! Production uses the HTTP client's own setup: the platform's roots. With
//! extra roots (development and tests only), certificates are verified
//! against the platform roots plus the extra ones, and one more case is
//! accepted: a server presenting exactly one of the extra certificates as its
//! own. That is how a self-signed development certificate looks, and the
//! usual tools make those with `CA:TRUE` (`openssl req -x509`, Go's
//! `httptest`), which WebPKI refuses as an end-entity certificate
//! (`CaUsedAsEndEntity`) although curl and browsers with the certificate
//! imported accept it. The host name must still match the certificate.

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::pem::PemObject;

use crate::error::{Error, Result};

/// Reads every certificate of a PEM file.
pub(crate) fn read_pem_certs(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).map_err(|e| Error::io("cannot read certificate", path, e))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Config(format!("{}: not a PEM certificate: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "{}: no certificate in file",
            path.display()
        )));
    }
    Ok(certs)
}

/// A client configuration trusting the platform roots plus `extra`.
pub(crate) fn client_config(extra: Vec<CertificateDer<'static>>) -> Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let inner =
        rustls_platform_verifier::Verifier::new_with_extra_roots(extra.clone(), provider.clone())
            .map_err(|e| Error::Config(format!("cannot set up certificate verification: {e}")))?;
    let verifier = ExtraRootsVerifier {
        inner: Arc::new(inner),
        pinned: extra,
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("cannot set up TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The platform verifier, plus acceptance of an extra certificate presented
/// as the server's own.
struct ExtraRootsVerifier {
    /// Platform roots plus the extra ones.
    inner: Arc<dyn ServerCertVerifier>,
    /// The extra certificates, compared byte for byte.
    pinned: Vec<CertificateDer<'static>>,
}

impl fmt::Debug for ExtraRootsVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtraRootsVerifier")
            .field("pinned", &self.pinned.len())
            .finish()
    }
}

impl ServerCertVerifier for ExtraRootsVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let verdict = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match verdict {
            Err(e)
                if self
                    .pinned
                    .iter()
                    .any(|c| c.as_ref() == end_entity.as_ref()) =>
            {
                let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| e.clone())?;
                cert.verify_is_valid_for_subject_name(server_name)
                    .map_err(|_| {
                        rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
                    })?;
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
