//! TLS trust when `[dev] extra_root_certs` or `extra_root_pems` is set.
//!
//! Production uses the HTTP client's own setup: the platform's roots. With
//! extra roots (development and tests only), certificates are verified
//! against the platform roots plus the extra ones, and one more case is
//! accepted: a server presenting exactly one of the extra certificates as its
//! own. That is how a self-signed development certificate looks, and the
//! usual tools make those with `CA:TRUE` (`openssl req -x509`, Go's
//! `httptest`), which WebPKI refuses as an end-entity certificate
//! (`CaUsedAsEndEntity`) although curl and browsers with the certificate
//! imported accept it. The host name must still match the certificate, and
//! the certificate passes every check its chain would make of it
//! (`pinned`): only the chain to a root is relaxed.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::pem::PemObject;

use super::der::{der_item, TAG_INTEGER, TAG_SEQUENCE, TAG_VERSION};
use crate::error::{Error, Result};

/// The certificates of `[dev] extra_root_certs` (files) and
/// `extra_root_pems` (text), in that order.
pub(crate) fn extra_roots(
    files: &[std::path::PathBuf],
    pems: &[String],
) -> Result<Vec<CertificateDer<'static>>> {
    let mut certs = Vec::new();
    for path in files {
        certs.extend(read_pem_certs(path)?);
    }
    for (index, pem) in pems.iter().enumerate() {
        let source = format!("dev.extra_root_pems[{index}]");
        certs.extend(parse_pem_certs(pem.as_bytes(), &source, "extra_root_pems")?);
    }
    Ok(certs)
}

/// Reads every certificate of a PEM file.
pub(crate) fn read_pem_certs(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).map_err(|e| {
        Error::Config(format!(
            "[dev] extra_root_certs: cannot read the certificate file {}: {e}",
            path.display()
        ))
    })?;
    parse_pem_certs(&pem, &path.display().to_string(), "extra_root_certs")
}

/// Every certificate of PEM text from `source` (a file, or the entry of
/// `[dev] key`), each valid now.
fn parse_pem_certs(pem: &[u8], source: &str, key: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Config(format!("{source}: not a PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Config(format!("{source}: no certificate in it")));
    }
    let now = SystemTime::now();
    for (index, cert) in certs.iter().enumerate() {
        let which = format!("certificate {} of {}", index + 1, certs.len());
        let problem = match validity(cert) {
            None => format!("{which} is not a readable X.509 certificate"),
            Some(period) => match period.judge(now) {
                Ok(()) => continue,
                Err(e) => format!("{which} {e}"),
            },
        };
        return Err(Error::Config(format!(
            "{source}: {problem}; a certificate in [dev] {key} must be valid now \
             (make a new one, or remove it from the list)"
        )));
    }
    Ok(certs)
}

/// When a certificate may be used: its `notBefore` and `notAfter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Validity {
    not_before: SystemTime,
    not_after: SystemTime,
}

impl Validity {
    /// `Ok` when `now` lies in the period, else what is wrong with it.
    fn judge(&self, now: SystemTime) -> std::result::Result<(), String> {
        if now > self.not_after {
            Err(format!(
                "expired on {} (not after)",
                crate::time::to_rfc3339(self.not_after)
            ))
        } else if now < self.not_before {
            Err(format!(
                "is not valid before {} (not before)",
                crate::time::to_rfc3339(self.not_before)
            ))
        } else {
            Ok(())
        }
    }
}

/// The validity period of a DER certificate: `Certificate` →
/// `tbsCertificate` → (`[0] version`), `serialNumber`, `signature`,
/// `issuer`, `validity`. `None` when the bytes are not shaped so.
fn validity(der: &[u8]) -> Option<Validity> {
    let (cert, _) = der_item(der, TAG_SEQUENCE)?;
    let (mut tbs, _) = der_item(cert, TAG_SEQUENCE)?;
    if tbs.first() == Some(&TAG_VERSION) {
        tbs = der_item(tbs, TAG_VERSION)?.1;
    }
    let after_serial = der_item(tbs, TAG_INTEGER)?.1;
    let after_signature = der_item(after_serial, TAG_SEQUENCE)?.1;
    let after_issuer = der_item(after_signature, TAG_SEQUENCE)?.1;
    let (period, _) = der_item(after_issuer, TAG_SEQUENCE)?;
    let (not_before, rest) = der_time(period)?;
    let (not_after, _) = der_time(rest)?;
    Some(Validity {
        not_before,
        not_after,
    })
}

const TAG_UTC_TIME: u8 = 0x17;
const TAG_GENERALIZED_TIME: u8 = 0x18;

/// A `UTCTime` (`YYMMDDHHMMSSZ`, years 1950–2049) or `GeneralizedTime`
/// (`YYYYMMDDHHMMSSZ`) at the start of `input`, and what follows it. An
/// instant before 1970 reads as 1970-01-01.
fn der_time(input: &[u8]) -> Option<(SystemTime, &[u8])> {
    let tag = *input.first()?;
    let (text, rest) = der_item(input, tag)?;
    let digits = text.strip_suffix(b"Z")?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let full = match (tag, digits.len()) {
        (TAG_UTC_TIME, 12) => {
            let century: &[u8] = if digits[0] >= b'5' { b"19" } else { b"20" };
            [century, digits].concat()
        }
        (TAG_GENERALIZED_TIME, 14) => digits.to_vec(),
        _ => return None,
    };
    // All ASCII digits: every byte is a character boundary.
    let text = String::from_utf8(full).ok()?;
    if text.as_str() < "1970" {
        return Some((UNIX_EPOCH, rest));
    }
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &text[0..4],
        &text[4..6],
        &text[6..8],
        &text[8..10],
        &text[10..12],
        &text[12..14]
    );
    Some((crate::time::from_rfc3339(&rfc3339)?, rest))
}

/// A client configuration trusting the platform roots plus `extra`.
pub(crate) fn client_config(extra: Vec<CertificateDer<'static>>) -> Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = ExtraRootsVerifier::new(extra, provider.clone());
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
    inner: PlatformVerifier,
    /// The extra certificates, compared byte for byte.
    pinned: Vec<CertificateDer<'static>>,
    /// The signature algorithms of the provider: a handshake's signatures
    /// are checked with them (as the platform verifiers do), and so is the
    /// chain of a pinned certificate.
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl ExtraRootsVerifier {
    fn new(
        extra: Vec<CertificateDer<'static>>,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> ExtraRootsVerifier {
        ExtraRootsVerifier {
            algorithms: provider.signature_verification_algorithms,
            inner: PlatformVerifier::start(extra.clone(), provider),
            pinned: extra,
        }
    }
}

/// What the platform verifier was made into, or why it could not be.
type Made = std::result::Result<Arc<dyn ServerCertVerifier>, String>;

/// The platform's verifier, made on a thread of its own from the moment
/// the configuration is: on Linux it reads the platform's roots (a bundle
/// and a folder of about 150 files, 5 to 10 ms before the first connection
/// could start), which so overlaps the rest of the start-up and the first
/// connection; the first certificate to check waits for what is left. A
/// verifier that cannot be made fails every certificate with the reason.
struct PlatformVerifier {
    made: Arc<std::sync::OnceLock<Made>>,
    extra: Vec<CertificateDer<'static>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl PlatformVerifier {
    fn start(
        extra: Vec<CertificateDer<'static>>,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> PlatformVerifier {
        let verifier = PlatformVerifier {
            made: Arc::new(std::sync::OnceLock::new()),
            extra,
            provider,
        };
        let (made, extra, provider) = (
            Arc::clone(&verifier.made),
            verifier.extra.clone(),
            verifier.provider.clone(),
        );
        // Without the thread, the first certificate to check makes it.
        let _ = std::thread::Builder::new()
            .name("gem-resources-roots".into())
            .spawn(move || {
                made.get_or_init(|| platform_verifier(&extra, &provider));
            });
        verifier
    }

    /// The verifier, once made (made here when its thread has not begun).
    fn get(&self) -> std::result::Result<&Arc<dyn ServerCertVerifier>, rustls::Error> {
        self.made
            .get_or_init(|| platform_verifier(&self.extra, &self.provider))
            .as_ref()
            .map_err(|e| rustls::Error::General(e.clone()))
    }
}

/// The platform's verifier with the `extra` roots, or with them alone where
/// the platform cannot take them ([`extra_roots_only`]).
fn platform_verifier(
    extra: &[CertificateDer<'static>],
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> Made {
    // Without extra roots (production), the platform's verifier alone:
    // on Windows that asks for no chain engine of our own.
    let platform = if extra.is_empty() {
        rustls_platform_verifier::Verifier::new(provider.clone())
    } else {
        rustls_platform_verifier::Verifier::new_with_extra_roots(extra.to_vec(), provider.clone())
    };
    match platform {
        Ok(verifier) => Ok(Arc::new(verifier)),
        Err(e) if extra.is_empty() => Err(format!(
            "cannot set up the platform's certificate verification: {e}"
        )),
        Err(e) => {
            // Said once per process, however many clients are built.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "the platform's certificate verification cannot be set up ({e}): \
                     only the certificates of [dev] extra_root_certs are trusted"
                );
            });
            extra_roots_only(extra, provider.clone()).map_err(|e| e.to_string())
        }
    }
}

/// A verifier trusting the `extra` roots alone: used with `[dev]
/// extra_root_certs` only, and only where the platform's verifier cannot
/// be set up with them (Wine's `CertCreateCertificateChainEngine` refuses
/// the configuration of Windows 8 and later, which carries
/// `dwExclusiveFlags`, with "Invalid parameter"). It trusts less than the
/// platform roots plus the extra ones, never more; production, without
/// extra roots, never comes here.
fn extra_roots_only(
    extra: &[CertificateDer<'static>],
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>> {
    let refused = |e: &dyn fmt::Display| {
        Error::Config(format!("cannot set up certificate verification: {e}"))
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in extra {
        roots.add(cert.clone()).map_err(|e| refused(&e))?;
    }
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| refused(&e))?;
    Ok(verifier)
}

/// Whether `c` says that no chain reaches a trusted root: an unknown
/// issuer, or (WebPKI's first finding for a self-signed `CA:TRUE`
/// certificate) a CA certificate presented as the server's.
fn no_chain_to_a_root(c: &rustls::CertificateError) -> bool {
    use rustls::CertificateError as C;
    match c {
        C::UnknownIssuer => true,
        C::Other(other) => matches!(
            other.0.downcast_ref::<webpki::Error>(),
            Some(webpki::Error::CaUsedAsEndEntity | webpki::Error::UnknownIssuer)
        ),
        _ => false,
    }
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
        let pinned = self
            .pinned
            .iter()
            .any(|c| c.as_ref() == end_entity.as_ref());
        if pinned {
            // Whether or not a chain reaches it (a self-signed leaf is its
            // own root), a pinned certificate passes what its chain checks
            // of it, key usage included; only the chain is relaxed.
            super::pinned::check(end_entity, &self.algorithms)?;
        }
        let verdict = self.inner.get()?.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match verdict {
            Err(e) if pinned => {
                let at = UNIX_EPOCH + Duration::from_secs(now.as_secs());
                match validity(end_entity) {
                    Some(period) if period.judge(at).is_ok() => {}
                    Some(period) if at > period.not_after => {
                        return Err(rustls::Error::InvalidCertificate(
                            rustls::CertificateError::Expired,
                        ))
                    }
                    Some(_) => {
                        return Err(rustls::Error::InvalidCertificate(
                            rustls::CertificateError::NotValidYet,
                        ))
                    }
                    None => return Err(e),
                }
                let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| e.clone())?;
                cert.verify_is_valid_for_subject_name(server_name)
                    .map_err(|_| {
                        rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
                    })?;
                Ok(ServerCertVerified::assertion())
            }
            // A self-signed certificate that no trust store holds is
            // called that, rather than by the check it failed first.
            Err(rustls::Error::InvalidCertificate(c))
                if no_chain_to_a_root(&c)
                    && intermediates.is_empty()
                    && super::pinned::is_self_signed(end_entity) =>
            {
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::Other(rustls::OtherError(Arc::new(
                        super::pinned::SelfSignedUntrusted,
                    ))),
                ))
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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate valid from `from` to `until` (years,
    /// January 1st), as PEM.
    fn pem(from: i32, until: i32) -> String {
        let mut params = rcgen::CertificateParams::new(vec!["origin.test".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(until, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    fn year(y: i64) -> SystemTime {
        let secs = crate::time::from_rfc3339(&format!("{y:04}-01-01T00:00:00Z")).unwrap();
        secs
    }

    fn der(pem_text: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem_text.as_bytes()).unwrap()
    }

    #[test]
    fn validity_reads_utc_and_generalized_times() {
        // rcgen writes UTCTime before 2050 and GeneralizedTime from 2050 on.
        for (from, until) in [(2001, 2030), (2020, 2051), (1960, 2040)] {
            let period = validity(&der(&pem(from, until))).unwrap();
            let not_before = if from < 1970 {
                UNIX_EPOCH
            } else {
                year(from.into())
            };
            assert_eq!(period.not_before, not_before, "{from}");
            assert_eq!(period.not_after, year(until.into()), "{until}");
        }
    }

    #[test]
    fn validity_refuses_bytes_that_are_not_a_certificate() {
        let good = der(&pem(2001, 2030));
        assert!(validity(&[]).is_none());
        assert!(validity(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
        for cut in [1, 10, 100, good.len() / 2] {
            assert!(validity(&good[..cut]).is_none(), "{cut}");
        }
    }

    #[test]
    fn judge_names_the_date_that_is_wrong() {
        let period = validity(&der(&pem(2001, 2030))).unwrap();
        assert_eq!(period.judge(year(2010)), Ok(()));
        assert_eq!(
            period.judge(year(2031)),
            Err("expired on 2030-01-01T00:00:00Z (not after)".to_string())
        );
        assert_eq!(
            period.judge(year(2000)),
            Err("is not valid before 2001-01-01T00:00:00Z (not before)".to_string())
        );
    }

    #[test]
    fn the_platform_verifier_is_made_by_whoever_needs_it_first_and_its_failure_is_every_checks() {
        crate::install_crypto_provider();
        let cert = der(&pem(2001, 2030));
        let name = ServerName::try_from("origin.test").unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let with = |made: std::sync::OnceLock<Made>, extra: Vec<CertificateDer<'static>>| {
            ExtraRootsVerifier {
                inner: PlatformVerifier {
                    made: Arc::new(made),
                    extra: extra.clone(),
                    provider: provider.clone(),
                },
                pinned: extra,
                algorithms: provider.signature_verification_algorithms,
            }
        };
        // Its thread never ran: the first check makes it.
        let unmade = with(std::sync::OnceLock::new(), vec![cert.clone()]);
        assert!(unmade
            .verify_server_cert(&cert, &[], &name, &[], UnixTime::now())
            .is_ok());
        assert!(unmade.inner.made.get().is_some_and(Result::is_ok));
        // It could not be made: every certificate fails with the reason,
        // while the handshake's own schemes need no verifier.
        let failed = with(
            std::sync::OnceLock::from(Err("no CA certificates".to_string())),
            Vec::new(),
        );
        assert_eq!(
            failed
                .verify_server_cert(&cert, &[], &name, &[], UnixTime::now())
                .unwrap_err(),
            rustls::Error::General("no CA certificates".into())
        );
        assert!(!failed.supported_verify_schemes().is_empty());
    }

    #[test]
    fn a_pinned_certificate_is_accepted_only_while_it_is_valid() {
        crate::install_crypto_provider();
        let cert = der(&pem(2001, 2030));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = ExtraRootsVerifier::new(vec![cert.clone()], provider);
        let name = ServerName::try_from("origin.test").unwrap();
        let at = |y: i64| {
            let secs = year(y).duration_since(UNIX_EPOCH).unwrap();
            UnixTime::since_unix_epoch(secs)
        };
        let verdict = |y| verifier.verify_server_cert(&cert, &[], &name, &[], at(y));
        assert!(verdict(2010).is_ok(), "{:?}", verdict(2010));
        assert_eq!(
            verdict(2031).unwrap_err(),
            rustls::Error::InvalidCertificate(rustls::CertificateError::Expired)
        );
        assert_eq!(
            verdict(2000).unwrap_err(),
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidYet)
        );
    }

    #[test]
    fn the_extra_roots_alone_trust_what_they_signed_and_nothing_else() {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let issue = |ca_name: &str| {
            let mut ca_params = rcgen::CertificateParams::new(vec![]).unwrap();
            ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            ca_params
                .distinguished_name
                .push(rcgen::DnType::CommonName, ca_name);
            let ca_key = rcgen::KeyPair::generate().unwrap();
            let ca = ca_params.self_signed(&ca_key).unwrap();
            let issuer = rcgen::Issuer::new(ca_params, ca_key);
            let leaf_params =
                rcgen::CertificateParams::new(vec!["origin.test".to_string()]).unwrap();
            let leaf_key = rcgen::KeyPair::generate().unwrap();
            let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
            (ca.der().clone(), leaf.der().clone())
        };
        let (ca, leaf) = issue("extra root");
        let (_, stranger) = issue("another root");
        let verifier = extra_roots_only(&[ca], provider).unwrap();
        let name = ServerName::try_from("origin.test").unwrap();
        let now = UnixTime::now();
        assert!(verifier
            .verify_server_cert(&leaf, &[], &name, &[], now)
            .is_ok());
        assert!(verifier
            .verify_server_cert(&stranger, &[], &name, &[], now)
            .is_err());
        let other_name = ServerName::try_from("other.test").unwrap();
        assert!(verifier
            .verify_server_cert(&leaf, &[], &other_name, &[], now)
            .is_err());
    }

    #[test]
    fn a_pem_file_with_an_expired_or_future_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, pem(2001, 2100)).unwrap();
        assert_eq!(read_pem_certs(&path).unwrap().len(), 1);
        for (text, said) in [
            (
                pem(2001, 2100) + &pem(2001, 2002),
                "certificate 2 of 2 expired on 2002-01-01T00:00:00Z",
            ),
            (
                pem(2200, 2300),
                "certificate 1 of 1 is not valid before 2200-01-01T00:00:00Z",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = read_pem_certs(&path).unwrap_err();
            assert_eq!(e.code(), crate::ErrorCode::Config);
            let e = e.to_string();
            assert!(e.contains(&format!("{}: {said}", path.display())), "{e}");
            assert!(e.contains("make a new one"), "{e}");
        }
    }
}
