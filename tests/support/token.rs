//! A token service for the real distribution registry's bearer flow
//! (`auth: token:` in its configuration): `GET /token?service=…&scope=…`
//! with one user's basic credentials gets a JWT signed (ES256) by a key
//! whose self-signed certificate is the registry's `rootcertbundle`, named
//! in the token's header by its key ID as the registry computes it (the
//! base32 of the first 30 bytes of the SHA-256 of the key's
//! SubjectPublicKeyInfo, in groups of four). HTTPS on 127.0.0.2 and a free
//! port, as `auth.test`.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::Engine;
use rcgen::{CertificateParams, KeyPair, PublicKeyData, SigningKey};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// The `service` and `issuer` the registry is configured with.
pub const SERVICE: &str = "test-registry";
pub const ISSUER: &str = "test-issuer";

/// The service; dropping it stops it.
pub struct TokenService {
    pub port: u16,
    /// The signing key's certificate, PEM: the registry's rootcertbundle.
    pub bundle: String,
    issued: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

impl Drop for TokenService {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

struct Signer {
    key: KeyPair,
    kid: String,
    user: String,
    password: String,
}

impl TokenService {
    /// Starts it with the TLS certificate and key (PEM) of `auth.test`,
    /// handing tokens to `user` with `password`.
    pub async fn start(cert_pem: &str, key_pem: &str, user: &str, password: &str) -> TokenService {
        let chain = vec![CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap()];
        let tls_key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, tls_key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["token-signer".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let signer = Arc::new(Signer {
            kid: key_id(key.der_bytes()),
            key,
            user: user.into(),
            password: password.into(),
        });
        let listener = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let issued = Arc::new(AtomicUsize::new(0));
        let counter = issued.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, signer, counter) =
                    (acceptor.clone(), signer.clone(), counter.clone());
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let mut head = Vec::new();
                        let mut buf = [0u8; 4096];
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match tls.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        let reply = answer(&String::from_utf8_lossy(&head), &signer, &counter);
                        let _ = tls.write_all(reply.as_bytes()).await;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        TokenService {
            port,
            bundle: cert.pem(),
            issued,
            accept,
        }
    }

    /// `https://auth.test:PORT/token`.
    pub fn realm(&self) -> String {
        format!("https://auth.test:{}/token", self.port)
    }

    /// Tokens handed out.
    pub fn issued(&self) -> usize {
        self.issued.load(Ordering::SeqCst)
    }
}

/// The whole HTTP answer to a request head.
fn answer(head: &str, signer: &Signer, counter: &AtomicUsize) -> String {
    let reply = |status: &str, body: &str| {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let target = head.split_whitespace().nth(1).unwrap_or_default();
    let Some(query) = target.strip_prefix("/token?") else {
        return reply("404 Not Found", "{}");
    };
    let expected = format!(
        "basic {}",
        base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", signer.user, signer.password))
    );
    let authorised = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("authorization:")
            && l[14..].trim().eq_ignore_ascii_case(&expected)
    });
    if !authorised {
        return reply("401 Unauthorized", r#"{"details":"wrong credentials"}"#);
    }
    let scopes: Vec<String> = url::form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == "scope")
        .map(|(_, v)| v.into_owned())
        .collect();
    let n = counter.fetch_add(1, Ordering::SeqCst);
    let token = jwt(signer, &scopes, n);
    reply(
        "200 OK",
        &format!(r#"{{"token":"{token}","access_token":"{token}","expires_in":300}}"#),
    )
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A JWT granting `scopes` (`repository:<name>:<actions>`).
fn jwt(signer: &Signer, scopes: &[String], n: usize) -> String {
    let access: Vec<serde_json::Value> = scopes
        .iter()
        .filter_map(|s| {
            let mut parts = s.splitn(3, ':');
            let (kind, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
            Some(serde_json::json!({
                "type": kind,
                "name": name,
                "actions": actions.split(',').collect::<Vec<_>>(),
            }))
        })
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = serde_json::json!({ "typ": "JWT", "alg": "ES256", "kid": signer.kid });
    let claims = serde_json::json!({
        "iss": ISSUER,
        "sub": signer.user,
        "aud": SERVICE,
        "exp": now + 300,
        "nbf": now - 10,
        "iat": now - 10,
        "jti": format!("t{n}"),
        "access": access,
    });
    let input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let der = signer.key.sign(input.as_bytes()).unwrap();
    format!("{input}.{}", b64(&fixed_signature(&der)))
}

/// An ASN.1 ECDSA signature (`SEQUENCE { r, s }`) as JWS wants it: `r`
/// and `s`, 32 bytes each.
fn fixed_signature(der: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    let mut at = 2;
    for _ in 0..2 {
        assert_eq!(der[at], 0x02);
        let len = der[at + 1] as usize;
        let mut int = &der[at + 2..at + 2 + len];
        while int.len() > 32 && int[0] == 0 {
            int = &int[1..];
        }
        out.extend(std::iter::repeat_n(0u8, 32 - int.len()));
        out.extend_from_slice(int);
        at += 2 + len;
    }
    out
}

/// The key ID the registry gives a P-256 public key (`point`, uncompressed).
fn key_id(point: &[u8]) -> String {
    // SubjectPublicKeyInfo: id-ecPublicKey, prime256v1, the point.
    let mut spki = vec![
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
        0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ];
    spki.extend_from_slice(point);
    let hash = Sha256::digest(&spki);
    let text = base32(&hash[..30]);
    text.as_bytes()
        .chunks(4)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join(":")
}

/// RFC 4648 base32, without padding (30 bytes make 48 characters).
fn base32(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    let (mut buffer, mut bits) = (0u32, 0);
    for &b in bytes {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            out.push(ALPHABET[((buffer >> (bits - 5)) & 31) as usize] as char);
            bits -= 5;
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buffer << (5 - bits)) & 31) as usize] as char);
    }
    out
}
