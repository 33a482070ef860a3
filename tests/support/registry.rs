//! An in-process OCI registry for the `[cache]` tests: the blob and upload
//! endpoints of the distribution API over HTTPS on a loopback address of
//! its own (127.0.0.2, …, so that only `[cache] allow_internal` lets the
//! client reach it), with anonymous, basic or bearer-token access (its own
//! token service at `/token`), and faults on demand: a registry that
//! hangs, serves other bytes, redirects blobs to another host, or refuses
//! uploads. Every request is recorded with its `Authorization` header.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The names the registry's certificate is for.
pub const REGISTRY_NAMES: &[&str] = &["registry.test", "blobs.test", "auth.test"];

/// How the registry lets clients in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Anyone.
    Anonymous,
    /// HTTP basic with this user and password.
    Basic(String, String),
    /// Tokens from `/token` (which takes this user and password by basic
    /// auth), each valid for `token`.
    Bearer {
        user: String,
        password: String,
        token: String,
    },
}

/// Faults on demand.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Accept connections and never answer (not even TLS).
    pub hang: bool,
    /// Serve blobs with other bytes of the same length.
    pub wrong_bytes: bool,
    /// Answer blob GETs with `307` to this address prefix
    /// (`https://blobs.test:PORT/storage/`), the digest's hex appended.
    pub redirect_to: Option<String>,
    /// Answer every upload with `500`.
    pub refuse_uploads: bool,
}

/// One request, as the registry saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub authorization: Option<String>,
}

#[derive(Default)]
struct State {
    blobs: HashMap<String, Vec<u8>>,
    seen: Vec<Seen>,
    faults: Faults,
    uploads: usize,
}

/// The registry. Dropping it stops it.
pub struct Registry {
    addr: SocketAddr,
    ca_pem: String,
    access: Access,
    state: Arc<Mutex<State>>,
    connections: Arc<AtomicUsize>,
    tokens_issued: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    /// Starts a registry on `ip` (a loopback address) and a free port.
    pub async fn start(ip: &str, access: Access) -> Registry {
        let (ca_pem, chain, key) = certificates();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let ip: IpAddr = ip.parse().unwrap();
        let listener = TcpListener::bind((ip, 0)).await.expect("registry: bind");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let connections = Arc::new(AtomicUsize::new(0));
        let tokens_issued = Arc::new(AtomicUsize::new(0));
        let shared = Shared {
            access: access.clone(),
            state: state.clone(),
            tokens_issued: tokens_issued.clone(),
            port: addr.port(),
        };
        let accept = tokio::spawn(accept_loop(
            listener,
            acceptor,
            Arc::new(shared),
            connections.clone(),
        ));
        Registry {
            addr,
            ca_pem,
            access,
            state,
            connections,
            tokens_issued,
            accept,
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The CA to trust, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// `https://{host}:{port}/{repository}`, the `[cache] oci` value.
    pub fn oci(&self, host: &str, repository: &str) -> String {
        format!("https://{host}:{}/{repository}", self.port())
    }

    /// Puts `bytes` in as a blob.
    pub fn put_blob(&self, bytes: &[u8]) {
        let sha = hex::encode(Sha256::digest(bytes));
        lock(&self.state).blobs.insert(sha, bytes.to_vec());
    }

    /// Whether it holds the blob of `sha256`.
    pub fn has_blob(&self, sha256: &str) -> bool {
        lock(&self.state).blobs.contains_key(sha256)
    }

    /// Sets the faults.
    pub fn set_faults(&self, faults: Faults) {
        lock(&self.state).faults = faults;
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.state).seen.clone()
    }

    /// `METHOD target` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.seen()
            .iter()
            .map(|s| format!("{} {}", s.method, s.target))
            .collect()
    }

    /// TCP connections accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Tokens the token service handed out.
    pub fn tokens_issued(&self) -> usize {
        self.tokens_issued.load(Ordering::SeqCst)
    }
}

struct Shared {
    access: Access,
    state: Arc<Mutex<State>>,
    tokens_issued: Arc<AtomicUsize>,
    port: u16,
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    connections: Arc<AtomicUsize>,
) {
    let mut held = Vec::new();
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        connections.fetch_add(1, Ordering::SeqCst);
        if lock(&shared.state).faults.hang {
            // Never answered; kept open until the registry stops.
            held.push(tcp);
            continue;
        }
        let (acceptor, shared) = (acceptor.clone(), shared.clone());
        tokio::spawn(async move {
            if let Ok(mut tls) = acceptor.accept(tcp).await {
                let _ = serve(&mut tls, &shared).await;
                let _ = tls.shutdown().await;
            }
        });
    }
}

struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn read_request(tls: &mut TlsStream<TcpStream>) -> std::io::Result<Option<Request>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tls.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let method = first.next().unwrap_or_default().to_string();
    let target = first.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[end..].to_vec();
    while body.len() < length {
        let n = tls.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(Some(Request {
        method,
        target,
        headers,
        body,
    }))
}

/// An answer: status, headers, body (sent for every method but HEAD).
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    length: Option<usize>,
}

fn answer(status: u16) -> Answer {
    Answer {
        status,
        headers: Vec::new(),
        body: Vec::new(),
        length: None,
    }
}

async fn serve(tls: &mut TlsStream<TcpStream>, shared: &Shared) -> std::io::Result<()> {
    let Some(request) = read_request(tls).await? else {
        return Ok(());
    };
    lock(&shared.state).seen.push(Seen {
        method: request.method.clone(),
        target: request.target.clone(),
        authorization: request.header("authorization").map(str::to_string),
    });
    let reply = route(&request, shared);
    let reason = match reply.status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        307 => "Temporary Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        _ => "Error",
    };
    let length = reply.length.unwrap_or(reply.body.len());
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Length: {length}\r\nConnection: close\r\n",
        reply.status
    );
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    tls.write_all(head.as_bytes()).await?;
    if request.method != "HEAD" {
        tls.write_all(&reply.body).await?;
    }
    tls.flush().await
}

/// Whether the request may go on; else the `401` to send.
fn authorised(request: &Request, shared: &Shared, scope: &str) -> Result<(), Answer> {
    let given = request.header("authorization");
    let basic = |user: &str, password: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    };
    match &shared.access {
        Access::Anonymous => Ok(()),
        Access::Basic(user, password) if given == Some(basic(user, password).as_str()) => Ok(()),
        Access::Basic(..) => {
            let mut a = answer(401);
            a.headers
                .push(("WWW-Authenticate".into(), "Basic realm=\"test\"".into()));
            Err(a)
        }
        Access::Bearer { token, .. } if given == Some(format!("Bearer {token}").as_str()) => Ok(()),
        Access::Bearer { .. } => {
            let mut a = answer(401);
            a.headers.push((
                "WWW-Authenticate".into(),
                format!(
                    "Bearer realm=\"https://registry.test:{}/token\",service=\"test-registry\",scope=\"{scope}\"",
                    shared.port
                ),
            ));
            a.headers
                .push(("Content-Type".into(), "application/json".into()));
            a.body = br#"{"errors":[{"code":"UNAUTHORIZED"}]}"#.to_vec();
            Err(a)
        }
    }
}

fn route(request: &Request, shared: &Shared) -> Answer {
    let path = request.target.split('?').next().unwrap_or_default();
    let query = request.target.split_once('?').map(|(_, q)| q).unwrap_or("");
    if path == "/token" {
        return token(request, shared);
    }
    if let Some(hex) = path.strip_prefix("/storage/") {
        // Blob storage: no credentials asked (a presigned address).
        let state = lock(&shared.state);
        return match state.blobs.get(hex) {
            Some(bytes) => Answer {
                body: bytes.clone(),
                ..answer(200)
            },
            None => answer(404),
        };
    }
    if path == "/v2/" {
        return match authorised(request, shared, "") {
            Ok(()) => answer(200),
            Err(a) => a,
        };
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return answer(404);
    };
    if let Some((repo, digest)) = rest.split_once("/blobs/sha256:") {
        if let Err(a) = authorised(request, shared, &format!("repository:{repo}:pull")) {
            return a;
        }
        let state = lock(&shared.state);
        let Some(bytes) = state.blobs.get(digest) else {
            return answer(404);
        };
        if let (Some(prefix), "GET") = (&state.faults.redirect_to, request.method.as_str()) {
            let mut a = answer(307);
            a.headers
                .push(("Location".into(), format!("{prefix}{digest}")));
            return a;
        }
        let mut body = bytes.clone();
        if state.faults.wrong_bytes {
            for b in &mut body {
                *b = b.wrapping_add(1);
            }
        }
        let mut a = answer(200);
        a.headers
            .push(("Docker-Content-Digest".into(), format!("sha256:{digest}")));
        a.length = Some(body.len());
        a.body = body;
        return a;
    }
    if let Some((repo, upload)) = rest.split_once("/blobs/uploads/") {
        if let Err(a) = authorised(request, shared, &format!("repository:{repo}:pull,push")) {
            return a;
        }
        let mut state = lock(&shared.state);
        if state.faults.refuse_uploads {
            return answer(500);
        }
        return match (request.method.as_str(), upload) {
            ("POST", "") => {
                state.uploads += 1;
                let mut a = answer(202);
                a.headers.push((
                    "Location".into(),
                    format!("/v2/{repo}/blobs/uploads/u{}?_state=s", state.uploads),
                ));
                a
            }
            ("PUT", _) => {
                let digest = query
                    .split('&')
                    .find_map(|p| p.strip_prefix("digest="))
                    .map(|d| d.replace("%3A", ":").replace("%3a", ":"));
                let hex = hex::encode(Sha256::digest(&request.body));
                if digest.as_deref() != Some(format!("sha256:{hex}").as_str()) {
                    return answer(400);
                }
                state.blobs.insert(hex, request.body.clone());
                answer(201)
            }
            ("DELETE", _) => answer(204),
            _ => answer(404),
        };
    }
    answer(404)
}

/// `/token?service=…&scope=…`: a token for whoever gives the user and
/// password (or anyone, when the registry has none); a `POST` of the
/// OAuth 2 form takes the password as its refresh token.
fn token(request: &Request, shared: &Shared) -> Answer {
    let Access::Bearer {
        user,
        password,
        token,
    } = &shared.access
    else {
        return answer(404);
    };
    if request.method == "POST" {
        // OAuth 2: a refresh token (Docker's identitytoken) in the form.
        let form: Vec<(String, String)> = url::form_urlencoded::parse(&request.body)
            .into_owned()
            .collect();
        let field = |k: &str| form.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        if field("grant_type") != Some("refresh_token") || field("refresh_token") != Some(password)
        {
            return answer(401);
        }
        shared.tokens_issued.fetch_add(1, Ordering::SeqCst);
        let mut a = answer(200);
        a.headers
            .push(("Content-Type".into(), "application/json".into()));
        a.body = format!(r#"{{"access_token":"{token}","expires_in":300}}"#).into_bytes();
        return a;
    }
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    );
    if request.header("authorization") != Some(expected.as_str()) {
        return answer(401);
    }
    shared.tokens_issued.fetch_add(1, Ordering::SeqCst);
    let mut a = answer(200);
    a.headers
        .push(("Content-Type".into(), "application/json".into()));
    a.body = format!(r#"{{"token":"{token}","expires_in":300}}"#).into_bytes();
    a
}

/// A throwaway CA and a leaf for [`REGISTRY_NAMES`].
fn certificates() -> (String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "gem-resources test registry CA");
    ca.distinguished_name = name;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let names: Vec<String> = REGISTRY_NAMES.iter().map(|s| s.to_string()).collect();
    let mut leaf = CertificateParams::new(names).unwrap();
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    (ca_cert.pem(), vec![leaf_cert.der().clone()], key)
}

/// A throwaway CA (PEM) and a leaf for [`REGISTRY_NAMES`] with its key
/// (PEM), for a registry run as a separate program.
pub fn certificate_files() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let names: Vec<String> = REGISTRY_NAMES.iter().map(|s| s.to_string()).collect();
    let mut leaf = CertificateParams::new(names).unwrap();
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    (ca_cert.pem(), leaf_cert.pem(), leaf_key.serialize_pem())
}
