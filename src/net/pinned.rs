//! What a chain to a root would still check of a `[dev]` pinned
//! certificate (one of `extra_root_certs` presented as the server's own).
//!
//! Only the chain is relaxed for it: the certificate's own signature
//! algorithm must be one the TLS provider accepts (no SHA-1, no MD5) and,
//! when it is self-signed, its signature must verify; an extended key
//! usage, when present, must include `serverAuth`; a key usage, when
//! present, must allow `digitalSignature` (every TLS 1.2 and 1.3 handshake
//! rustls speaks is signed). Validity and the host name are checked by the
//! caller as for any certificate.

use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::{CertificateError, Error};

use super::der::{der_item, TAG_SEQUENCE, TAG_VERSION};

const TAG_BIT_STRING: u8 = 0x03;
const TAG_OCTET_STRING: u8 = 0x04;
const TAG_OID: u8 = 0x06;
const TAG_BOOLEAN: u8 = 0x01;
const TAG_EXTENSIONS: u8 = 0xa3;

/// `2.5.29.15`, keyUsage.
const KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x0f];
/// `2.5.29.37`, extKeyUsage.
const EXT_KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x25];
/// `1.3.6.1.5.5.7.3.1`, id-kp-serverAuth.
const SERVER_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01];
/// The first bit of keyUsage: digitalSignature.
const DIGITAL_SIGNATURE: u8 = 0x80;

/// The parts of a certificate these checks read.
struct Parts<'a> {
    /// `tbsCertificate` with its header: what the signature covers.
    signed: &'a [u8],
    /// The contents of `signatureAlgorithm`.
    algorithm: &'a [u8],
    /// The signature's bytes.
    signature: &'a [u8],
    issuer: &'a [u8],
    subject: &'a [u8],
    /// Each extension's id and value (the contents of its OCTET STRING).
    extensions: Vec<(&'a [u8], &'a [u8])>,
}

/// `Ok` when the pinned certificate `der` passes what its chain would
/// check of it, else the error a chain's verification would give.
pub(crate) fn check(der: &[u8], algorithms: &WebPkiSupportedAlgorithms) -> Result<(), Error> {
    let bad = || Error::InvalidCertificate(CertificateError::BadEncoding);
    let parts = parts(der).ok_or_else(bad)?;
    let algorithm = algorithms
        .all
        .iter()
        .find(|a| a.signature_alg_id().as_ref() == parts.algorithm)
        .ok_or_else(|| {
            Error::InvalidCertificate(CertificateError::UnsupportedSignatureAlgorithmContext {
                signature_algorithm_id: parts.algorithm.to_vec(),
                supported_algorithms: algorithms
                    .all
                    .iter()
                    .map(|a| a.signature_alg_id())
                    .collect(),
            })
        })?;
    if parts.issuer == parts.subject {
        let cert = rustls::pki_types::CertificateDer::from(der);
        let cert = webpki::EndEntityCert::try_from(&cert).map_err(|_| bad())?;
        cert.verify_signature(*algorithm, parts.signed, parts.signature)
            .map_err(|_| Error::InvalidCertificate(CertificateError::BadSignature))?;
    }
    for (id, value) in &parts.extensions {
        if *id == EXT_KEY_USAGE && !allows_server_auth(value).ok_or_else(bad)? {
            return Err(Error::InvalidCertificate(CertificateError::InvalidPurpose));
        }
        if *id == KEY_USAGE && !allows_signing(value).ok_or_else(bad)? {
            return Err(Error::InvalidCertificate(CertificateError::Other(
                rustls::OtherError(std::sync::Arc::new(KeyUsageRefused)),
            )));
        }
    }
    Ok(())
}

/// Whether `der` is a certificate naming itself as its issuer (a
/// self-signed one, as `openssl req -x509` makes them).
pub(crate) fn is_self_signed(der: &[u8]) -> bool {
    parts(der).is_some_and(|p| p.issuer == p.subject)
}

/// A self-signed server certificate that no trust store holds: neither the
/// platform's nor `[dev] extra_root_certs`.
#[derive(Debug)]
pub(crate) struct SelfSignedUntrusted;

impl std::fmt::Display for SelfSignedUntrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("it is a self-signed certificate not in any trust store")
    }
}

impl std::error::Error for SelfSignedUntrusted {}

/// A key usage without `digitalSignature`.
#[derive(Debug)]
pub(crate) struct KeyUsageRefused;

impl std::fmt::Display for KeyUsageRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("its key usage does not allow signing (no digitalSignature)")
    }
}

impl std::error::Error for KeyUsageRefused {}

/// Any DER item at the start of `input`: its tag, contents and what follows.
fn any_item(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *input.first()?;
    let (contents, rest) = der_item(input, tag)?;
    Some((tag, contents, rest))
}

/// `Certificate` → `tbsCertificate` (`[0] version`, `serialNumber`,
/// `signature`, `issuer`, `validity`, `subject`, `subjectPublicKeyInfo`,
/// then optional unique ids and `[3] extensions`), `signatureAlgorithm`,
/// `signatureValue`.
fn parts(der: &[u8]) -> Option<Parts<'_>> {
    let (cert, _) = der_item(der, TAG_SEQUENCE)?;
    let (mut tbs, after_tbs) = der_item(cert, TAG_SEQUENCE)?;
    let signed = &cert[..cert.len() - after_tbs.len()];
    let (algorithm, rest) = der_item(after_tbs, TAG_SEQUENCE)?;
    let (bits, _) = der_item(rest, TAG_BIT_STRING)?;
    let (&0, signature) = bits.split_first()? else {
        return None;
    };
    if tbs.first() == Some(&TAG_VERSION) {
        tbs = der_item(tbs, TAG_VERSION)?.1;
    }
    // serialNumber, signature.
    let (_, _, rest) = any_item(tbs)?;
    let (_, _, rest) = any_item(rest)?;
    let (issuer, rest) = der_item(rest, TAG_SEQUENCE)?;
    let (_, rest) = der_item(rest, TAG_SEQUENCE)?;
    let (subject, rest) = der_item(rest, TAG_SEQUENCE)?;
    let (_, mut rest) = der_item(rest, TAG_SEQUENCE)?;
    let mut extensions = Vec::new();
    while !rest.is_empty() {
        let (tag, contents, after) = any_item(rest)?;
        if tag == TAG_EXTENSIONS {
            let (mut list, _) = der_item(contents, TAG_SEQUENCE)?;
            while !list.is_empty() {
                let (extension, after) = der_item(list, TAG_SEQUENCE)?;
                let (id, mut value) = der_item(extension, TAG_OID)?;
                if value.first() == Some(&TAG_BOOLEAN) {
                    value = der_item(value, TAG_BOOLEAN)?.1;
                }
                extensions.push((id, der_item(value, TAG_OCTET_STRING)?.0));
                list = after;
            }
        }
        rest = after;
    }
    Some(Parts {
        signed,
        algorithm,
        signature,
        issuer,
        subject,
        extensions,
    })
}

/// Whether an extKeyUsage value lists `serverAuth`.
fn allows_server_auth(value: &[u8]) -> Option<bool> {
    let (mut list, _) = der_item(value, TAG_SEQUENCE)?;
    while !list.is_empty() {
        let (purpose, after) = der_item(list, TAG_OID)?;
        if purpose == SERVER_AUTH {
            return Some(true);
        }
        list = after;
    }
    Some(false)
}

/// Whether a keyUsage value has its `digitalSignature` bit.
fn allows_signing(value: &[u8]) -> Option<bool> {
    let (bits, _) = der_item(value, TAG_BIT_STRING)?;
    Some(bits.get(1).is_some_and(|b| b & DIGITAL_SIGNATURE != 0))
}
