//! An in-process HTTPS origin for the gem-resources tests and the offline demo.
//!
//! [`Origin::start`] binds an ephemeral port on 127.0.0.1, makes a throwaway CA
//! and a leaf certificate signed by it, and answers HTTP/1.1 over TLS with a
//! hand-written responder so that each route can misbehave in one exact way
//! (wrong lengths, stalls, resets, redirects, gates, slow bodies).
//!
//! The file is self-contained: it is included as `mod origin;` from
//! `tests/support/mod.rs` and through `#[path = ...]` from examples.

// Each test binary and example uses only part of this module.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// DNS names the leaf certificate is valid for.
const DNS_NAMES: &[&str] = &[
    "localhost",
    "origin.test",
    "mirror.test",
    "cdn.test",
    "other.test",
    "blocked.test",
    "evil.test",
    "*.origin.test",
];

/// IP addresses the leaf certificate is valid for.
const IP_NAMES: &[&str] = &["127.0.0.1", "::1"];

/// Largest request head accepted; a longer one gets 400.
const MAX_HEAD: usize = 16 * 1024;

/// Size of each body write.
const WRITE_CHUNK: usize = 64 * 1024;

/// How long a finished connection waits for the client to close before
/// dropping the socket (so that unread client bytes never turn the close into
/// a reset that could discard the tail of a response).
const LINGER: Duration = Duration::from_secs(2);

/// Pause between the last byte sent and the reset in [`Behaviour::Reset`].
const RESET_PAUSE: Duration = Duration::from_millis(20);

/// What a GET of one path returns.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// 200, correct Content-Length, body.
    Body(Vec<u8>),
    /// 200, body streamed with no Content-Length, connection closed at the end
    /// (close-delimited).
    BodyNoLength(Vec<u8>),
    /// 200 with `Content-Length: content_length` but sends `body` (shorter or
    /// longer) then closes.
    WrongLength {
        /// The bytes actually sent.
        body: Vec<u8>,
        /// The length announced in Content-Length.
        content_length: u64,
    },
    /// 200 with the full Content-Length, sends the first `sent` bytes of body,
    /// then holds the connection open, sending nothing more, until the origin
    /// is dropped.
    Stall {
        /// The whole body, whose length is announced.
        body: Vec<u8>,
        /// How many bytes of it are sent before stalling.
        sent: usize,
    },
    /// 200 with the full Content-Length, sends the first `sent` bytes, then
    /// resets the TCP connection (SO_LINGER 0 and close), so the client sees a
    /// reset or an unexpected EOF. A client that is not reading may get fewer
    /// than `sent` bytes before the error, since a reset discards what the
    /// kernel had not yet delivered.
    Reset {
        /// The whole body, whose length is announced.
        body: Vec<u8>,
        /// How many bytes of it are sent before the reset.
        sent: usize,
    },
    /// Any status code with a short text body (none for 1xx, 204 and 304).
    Status(u16),
    /// `status` with `Location: location` sent verbatim, and an empty body.
    Redirect {
        /// The status code, e.g. 301, 302, 303, 307 or 308.
        status: u16,
        /// The Location header value, relative or absolute.
        location: String,
    },
    /// Like [`Behaviour::Body`] but answers only once `gate` is open (the
    /// request is counted first).
    Gated {
        /// The body sent once the gate opens.
        body: Vec<u8>,
        /// The latch the response waits on.
        gate: Gate,
    },
    /// A server that supports resuming: every response carries `ETag:
    /// etag`; a `Range: bytes=N-` whose `If-Range` equals `etag` gets `206`
    /// with the rest (unless `ignore_range`, which always answers `200`
    /// whole). With `cut_at`, the response resets the connection once the
    /// body has reached that absolute offset.
    Ranged {
        /// The whole body.
        body: Vec<u8>,
        /// The entity tag, quotes included (`"v1"`).
        etag: String,
        /// Answer every request `200` with the whole body.
        ignore_range: bool,
        /// Reset the connection after this offset of the body.
        cut_at: Option<usize>,
        /// At `cut_at`, hold the connection open instead of resetting it.
        hold: bool,
        /// Send the body in pieces of this many bytes with this pause
        /// between them.
        pace: Option<(usize, Duration)>,
    },
    /// `status` with a `Retry-After: value` header.
    RetryAfter {
        /// The status code (429 or 503).
        status: u16,
        /// The header value, sent verbatim.
        value: String,
    },
    /// The n-th request of the path gets the n-th behaviour; the last one
    /// answers every later request.
    Sequence(Vec<Behaviour>),
    /// A resumable server that drips: like [`Behaviour::Ranged`] (`ETag`,
    /// `206` for a matching `Range` and `If-Range`), but each response
    /// sends only `per_try` bytes of what it announced, then holds the
    /// connection open, silent.
    Drip {
        /// The whole body.
        body: Vec<u8>,
        /// The entity tag, quotes included.
        etag: String,
        /// Bytes sent per response.
        per_try: usize,
    },
    /// `head` sent verbatim (status line and headers, without the blank
    /// line that ends them), then `body`, then the connection closes.
    Raw {
        /// The head, lines separated by `\r\n`.
        head: String,
        /// The bytes after it.
        body: Vec<u8>,
    },
    /// A server of ranged parts: every response carries `ETag: etag`; a
    /// `Range: bytes=S-` or `bytes=S-E` whose `If-Range` (if any) equals
    /// the current tag gets `206` with exactly those bytes, anything else
    /// `200` whole. Each response is paced (`piece` bytes, then `pause`),
    /// so one connection has a known top speed; `fault` makes it misbehave.
    Parts {
        /// The whole body.
        body: Arc<Vec<u8>>,
        /// The entity tag, quotes included.
        etag: String,
        /// Bytes per piece and the pause after each.
        pace: (usize, Duration),
        /// How it misbehaves.
        fault: PartsFault,
    },
    /// Body sent in `chunk`-byte pieces with `delay` between them, correct
    /// Content-Length.
    Slow {
        /// The whole body.
        body: Vec<u8>,
        /// Bytes per piece (0 is taken as 1).
        chunk: usize,
        /// Pause between pieces.
        delay: Duration,
    },
}

/// How a [`Behaviour::Parts`] route misbehaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartsFault {
    /// Not at all.
    None,
    /// No `ETag` (and no other validator): ranges are answered, but nothing
    /// holds them to one version of the file.
    NoValidator,
    /// The first response's head is sent this late (a far server).
    LateFirstHead(Duration),
    /// Every response's head is sent this late (a far server, whichever
    /// request comes first).
    LateHeads(Duration),
    /// A `206` that does not start at 0 names a start one byte later in its
    /// `Content-Range` than the bytes it sends.
    WrongContentRange,
    /// From the `n`-th request on (counting from 0), the tag is another
    /// (`If-Range` with the old one gets `200` whole).
    EtagChangesAt(usize),
    /// The byte at this offset is sent with its bits flipped, in every
    /// response that covers it.
    Corrupt(usize),
    /// The first response is paced to this many bytes, then this pause,
    /// instead (one slow connection among fast ones).
    SlowFirst(usize, Duration),
    /// The first `count` responses whose bytes include offset `at` are
    /// paced to `piece` bytes, then `pause` (a slow connection whose hedge
    /// is slow too).
    SlowCovering {
        /// The offset.
        at: usize,
        /// How many responses covering it are slow.
        count: usize,
        /// Bytes per piece of a slow response.
        piece: usize,
        /// The pause after each.
        pause: Duration,
    },
}

impl Behaviour {
    /// [`Behaviour::Parts`] serving `body` with `etag`, paced to `piece`
    /// bytes per `pause` on each connection.
    pub fn parts(body: &[u8], etag: &str, piece: usize, pause: Duration) -> Behaviour {
        Behaviour::Parts {
            body: Arc::new(body.to_vec()),
            etag: etag.to_string(),
            pace: (piece, pause),
            fault: PartsFault::None,
        }
    }

    /// [`Behaviour::Ranged`] serving `body` whole, resumable, with `etag`.
    pub fn ranged(body: &[u8], etag: &str) -> Behaviour {
        Behaviour::Ranged {
            body: body.to_vec(),
            etag: etag.to_string(),
            ignore_range: false,
            cut_at: None,
            hold: false,
            pace: None,
        }
    }

    /// [`Behaviour::Ranged`] that resets the connection at `cut`.
    pub fn ranged_cut(body: &[u8], etag: &str, cut: usize) -> Behaviour {
        Behaviour::Ranged {
            body: body.to_vec(),
            etag: etag.to_string(),
            ignore_range: false,
            cut_at: Some(cut),
            hold: false,
            pace: None,
        }
    }

    /// [`Behaviour::Ranged`] that sends up to `cut`, then holds the
    /// connection open, silent.
    pub fn ranged_held(body: &[u8], etag: &str, cut: usize) -> Behaviour {
        Behaviour::Ranged {
            body: body.to_vec(),
            etag: etag.to_string(),
            ignore_range: false,
            cut_at: Some(cut),
            hold: true,
            pace: None,
        }
    }
}

/// A latch shared between a test and the origin: [`Gate::open`] releases every
/// waiting and future request. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Gate {
    open: Arc<watch::Sender<bool>>,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Opens the gate for good, releasing every waiting and future request.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Whether the gate has been opened.
    pub fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// Waits until the gate is open; returns at once if it already is.
    pub async fn wait(&self) {
        let mut rx = self.open.subscribe();
        // The sender lives in `self`, so this cannot fail while we wait.
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// State shared by the origin handle and its connection tasks.
#[derive(Default)]
struct Shared {
    /// Routes by path; `Arc` so that serving a large body never copies it.
    routes: Mutex<HashMap<String, Arc<Behaviour>>>,
    hits: Mutex<HashMap<String, usize>>,
    total: AtomicUsize,
    last_headers: Mutex<HashMap<String, Vec<(String, String)>>>,
    /// Body bytes written per path.
    served: Mutex<HashMap<String, u64>>,
    /// TCP connections accepted.
    connections: AtomicUsize,
    /// While set, TLS handshakes wait for this gate.
    hold_handshakes: Mutex<Option<Gate>>,
    /// TLS handshakes completed, and how many of them resumed a session.
    handshakes: AtomicUsize,
    resumed: AtomicUsize,
    /// Whether `Body`, `Slow` and `Parts` answers keep their connection
    /// open for the next request (see [`Origin::keep_alive`]).
    keep_alive: std::sync::atomic::AtomicBool,
    /// Responses of a [`PartsFault::SlowCovering`] route that covered its
    /// offset.
    covering: AtomicUsize,
    /// Every `Range` header asked for, per path, in arrival order.
    ranges: Mutex<HashMap<String, Vec<String>>>,
    /// The connections (numbered from 0 as accepted) that carried a
    /// request, per path.
    carried: Mutex<HashMap<String, std::collections::BTreeSet<usize>>>,
    /// Called with every well-formed request head (see [`Origin::observe`]).
    observer: Mutex<Option<Observer>>,
    /// Called when a ranged answer ends (see [`Origin::log_answers`]).
    logger: Mutex<Option<Logger>>,
}

/// What [`Origin::log_answers`] is told of an answer of a
/// [`Behaviour::Parts`] route when it ends.
#[derive(Debug)]
pub struct Answered<'a> {
    /// `GET` or `HEAD`.
    pub method: &'a str,
    /// The request target.
    pub target: &'a str,
    /// The `Range` header asked for, if any.
    pub range: Option<&'a str>,
    /// 200 or 206.
    pub status: u16,
    /// Body bytes sent.
    pub sent: u64,
    /// Body bytes the answer announced.
    pub announced: u64,
}

/// A hook called when an answer ends (see [`Origin::log_answers`]).
pub type Logger = Arc<dyn Fn(&Answered) + Send + Sync>;

/// Calls the logger when dropped: an answer cut by the client is logged
/// too, with what was sent.
struct AnswerLog<'a> {
    logger: Option<Logger>,
    answered: Answered<'a>,
}

impl Drop for AnswerLog<'_> {
    fn drop(&mut self) {
        if let Some(logger) = &self.logger {
            logger(&self.answered);
        }
    }
}

/// A hook called with the target and headers of every request head.
pub type Observer = Arc<dyn Fn(&str, &[(String, String)]) + Send + Sync>;

/// Connection tasks, and whether the origin has been dropped.
#[derive(Default)]
struct Tasks {
    set: JoinSet<()>,
    closed: bool,
}

/// An HTTPS origin on 127.0.0.1 with its own CA. Dropping it stops the
/// accept loop and every connection.
pub struct Origin {
    addr: SocketAddr,
    ca_pem: String,
    shared: Arc<Shared>,
    tasks: Arc<Mutex<Tasks>>,
    accept: JoinHandle<()>,
}

impl Origin {
    /// Binds 127.0.0.1 on an ephemeral port, makes a throwaway CA and a leaf
    /// certificate signed by it for localhost, origin.test, mirror.test,
    /// cdn.test, other.test, blocked.test, evil.test, *.origin.test,
    /// 127.0.0.1 and ::1, and serves HTTP/1.1 over TLS 1.2 and 1.3.
    ///
    /// Must be called inside a tokio runtime. Panics on setup failure.
    pub async fn start() -> Origin {
        Origin::start_with(make_certificates()).await
    }

    /// Like [`Origin::start`], but the server presents one self-signed
    /// certificate marked `CA:TRUE` (what `openssl req -x509` or Go's
    /// `httptest` make) instead of a leaf signed by a separate CA;
    /// [`Origin::ca_pem`] is that certificate.
    pub async fn start_self_signed() -> Origin {
        Origin::start_with(make_self_signed()).await
    }

    /// Like [`Origin::start`], but the server presents one self-signed leaf
    /// for origin.test (not a CA) that `customize` shaped first (its key
    /// usage, extended key usage); [`Origin::ca_pem`] is that certificate.
    pub async fn start_self_signed_leaf(customize: impl FnOnce(&mut CertificateParams)) -> Origin {
        let key = KeyPair::generate().expect("origin: key");
        let mut params =
            CertificateParams::new(vec!["origin.test".to_string()]).expect("origin: params");
        customize(&mut params);
        let cert = params.self_signed(&key).expect("origin: self-signed cert");
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Origin::start_with((cert.pem(), vec![cert.der().clone()], der)).await
    }

    /// Like [`Origin::start`], but the server presents the certificate and
    /// uses the private key of `pem` (both in one PEM text);
    /// [`Origin::ca_pem`] is that certificate.
    pub async fn start_with_pem(pem: &str) -> Origin {
        use rustls_pki_types::pem::PemObject;
        let cert = CertificateDer::from_pem_slice(pem.as_bytes()).expect("origin: certificate");
        let key = PrivateKeyDer::from_pem_slice(pem.as_bytes()).expect("origin: key");
        let cert_pem = pem[..pem.find("-----END CERTIFICATE-----").expect("origin: PEM") + 25]
            .to_string()
            + "\n";
        Origin::start_with((cert_pem, vec![cert], key)).await
    }

    /// [`Origin::start_with_pem`] on 127.0.0.1:`port` (0: any free port).
    pub async fn start_with_pem_at(pem: &str, port: u16) -> std::io::Result<Origin> {
        use rustls_pki_types::pem::PemObject;
        let invalid =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let cert = CertificateDer::from_pem_slice(pem.as_bytes())
            .map_err(|_| invalid("no certificate in the PEM"))?;
        let key = PrivateKeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|_| invalid("no private key in the PEM"))?;
        let end = pem
            .find("-----END CERTIFICATE-----")
            .ok_or_else(|| invalid("no certificate in the PEM"))?;
        let cert_pem = pem[..end + 25].to_string() + "\n";
        Origin::start_on((cert_pem, vec![cert], key), port).await
    }

    async fn start_with(
        certs: (String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
    ) -> Origin {
        Origin::start_on(certs, 0)
            .await
            .expect("origin: bind 127.0.0.1:0")
    }

    async fn start_on(
        certs: (String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
        port: u16,
    ) -> std::io::Result<Origin> {
        let (ca_pem, chain, key) = certs;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("origin: TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("origin: server certificate");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));

        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?;
        let addr = listener.local_addr()?;

        let shared = Arc::new(Shared::default());
        let tasks = Arc::new(Mutex::new(Tasks::default()));
        let accept = tokio::spawn(accept_loop(
            listener,
            acceptor,
            Arc::clone(&shared),
            Arc::clone(&tasks),
        ));
        Ok(Origin {
            addr,
            ca_pem,
            shared,
            tasks,
            accept,
        })
    }

    /// The port the origin listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address the origin listens on (127.0.0.1 and an ephemeral port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA certificate, PEM, for clients to trust.
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    /// `https://{host}:{port}{path}`.
    pub fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.port())
    }

    /// Sets (or replaces) what a GET of `path` returns. Unknown paths get 404.
    ///
    /// A request whose target has a query string is looked up first by its
    /// whole target, then by the part before `?`.
    pub fn route(&self, path: &str, behaviour: Behaviour) {
        self.handle().route(path, behaviour);
    }

    /// A handle on the origin's routes and counters for a task of its own
    /// (`'static`); it does not keep the origin serving.
    pub fn handle(&self) -> OriginHandle {
        OriginHandle {
            port: self.port(),
            shared: self.shared.clone(),
        }
    }

    /// Calls `logger` each time an answer of a [`Behaviour::Parts`] route
    /// ends, cut short or not: the method, target, range, status and bytes
    /// sent (a request log).
    pub fn log_answers(&self, logger: Logger) {
        *lock(&self.shared.logger) = Some(logger);
    }

    /// How many requests for `path` arrived (counted when the request head is
    /// read, before responding).
    pub fn hits(&self, path: &str) -> usize {
        lock(&self.shared.hits).get(path).copied().unwrap_or(0)
    }

    /// How many body bytes were written for `path`, over every response.
    pub fn served(&self, path: &str) -> u64 {
        self.handle().served(path)
    }

    /// How many TCP connections were accepted (before their TLS handshake).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// How many TLS handshakes completed.
    pub fn handshakes(&self) -> usize {
        self.shared.handshakes.load(Ordering::SeqCst)
    }

    /// How many completed TLS handshakes resumed an earlier session.
    pub fn resumed_handshakes(&self) -> usize {
        self.shared.resumed.load(Ordering::SeqCst)
    }

    /// From now on, `Body`, `Slow` and `Parts` answers leave out
    /// `Connection: close` and the connection waits for the next request
    /// (every other answer still closes it).
    pub fn keep_alive(&self) {
        self.shared.keep_alive.store(true, Ordering::SeqCst);
    }

    /// Holds every TLS handshake from now on (the TCP connection is
    /// accepted and counted) until `gate` opens.
    pub fn hold_handshakes(&self, gate: &Gate) {
        *lock(&self.shared.hold_handshakes) = Some(gate.clone());
    }

    /// How many connections carried a request for `path` (a connection
    /// opened and left idle is not counted).
    pub fn connections_for(&self, path: &str) -> usize {
        lock(&self.shared.carried).get(path).map_or(0, |c| c.len())
    }

    /// The `Range` headers of the requests for `path`, in arrival order
    /// (requests without one are not listed).
    pub fn ranges(&self, path: &str) -> Vec<String> {
        lock(&self.shared.ranges)
            .get(path)
            .cloned()
            .unwrap_or_default()
    }

    /// Calls `observer` with the target and the headers (names lower-cased,
    /// the Host header included) of every well-formed request head from now
    /// on, before it is answered.
    pub fn observe(&self, observer: Observer) {
        *lock(&self.shared.observer) = Some(observer);
    }

    /// How many well-formed request heads arrived, for any path.
    pub fn total_hits(&self) -> usize {
        self.shared.total.load(Ordering::SeqCst)
    }

    /// The headers of the last request for `path`, in the order sent, names
    /// lower-cased and values trimmed (the Host header included).
    pub fn last_headers(&self, path: &str) -> Option<Vec<(String, String)>> {
        lock(&self.shared.last_headers).get(path).cloned()
    }
}

/// [`Origin::handle`]: its routes and counters, cloned freely.
#[derive(Clone)]
pub struct OriginHandle {
    port: u16,
    shared: Arc<Shared>,
}

impl OriginHandle {
    /// As [`Origin::url`].
    pub fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.port)
    }

    /// As [`Origin::route`].
    pub fn route(&self, path: &str, behaviour: Behaviour) {
        lock(&self.shared.routes).insert(path.to_owned(), Arc::new(behaviour));
    }

    /// As [`Origin::served`].
    pub fn served(&self, path: &str) -> u64 {
        lock(&self.shared.served).get(path).copied().unwrap_or(0)
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.accept.abort();
        let mut tasks = lock(&self.tasks);
        tasks.closed = true;
        tasks.set.abort_all();
    }
}

/// Locks a mutex, ignoring poisoning (a panicking test must not hide others).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes the CA and the leaf; returns the CA PEM, the leaf chain and its key.
fn make_certificates() -> (String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let ca_key = KeyPair::generate().expect("origin: CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("origin: CA params");
    let mut ca_name = DistinguishedName::new();
    ca_name.push(DnType::CommonName, "gem-resources test CA");
    ca_params.distinguished_name = ca_name;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).expect("origin: CA cert");
    let issuer = Issuer::new(ca_params, ca_key);

    let names: Vec<String> = DNS_NAMES
        .iter()
        .chain(IP_NAMES)
        .map(|s| s.to_string())
        .collect();
    let leaf_key = KeyPair::generate().expect("origin: leaf key");
    let mut leaf_params = CertificateParams::new(names).expect("origin: leaf params");
    let mut leaf_name = DistinguishedName::new();
    leaf_name.push(DnType::CommonName, "origin.test");
    leaf_params.distinguished_name = leaf_name;
    leaf_params.is_ca = IsCa::ExplicitNoCa;
    leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf_params.use_authority_key_identifier_extension = true;
    let leaf_cert = leaf_params
        .signed_by(&leaf_key, &issuer)
        .expect("origin: leaf cert");

    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    (ca_cert.pem(), vec![leaf_cert.der().clone()], key)
}

/// One self-signed certificate, `CA:TRUE`, for every test name.
/// A self-signed certificate (`CA:TRUE`, for the origin's names) and its
/// private key in one PEM text, as [`Origin::start_with_pem`] takes it.
pub fn self_signed_pem() -> String {
    let names: Vec<String> = DNS_NAMES
        .iter()
        .chain(IP_NAMES)
        .map(|s| s.to_string())
        .collect();
    let key = KeyPair::generate().expect("origin: key");
    let mut params = CertificateParams::new(names).expect("origin: params");
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "origin.test");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).expect("origin: self-signed cert");
    format!("{}{}", cert.pem(), key.serialize_pem())
}

fn make_self_signed() -> (String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let names: Vec<String> = DNS_NAMES
        .iter()
        .chain(IP_NAMES)
        .map(|s| s.to_string())
        .collect();
    let key = KeyPair::generate().expect("origin: key");
    let mut params = CertificateParams::new(names).expect("origin: params");
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "origin.test");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).expect("origin: self-signed cert");
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    (cert.pem(), vec![cert.der().clone()], der)
}

/// Accepts connections until the origin is dropped, each on its own task.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    tasks: Arc<Mutex<Tasks>>,
) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(_) => {
                // Out of descriptors or a connection gone before accept:
                // back off a little and keep serving.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let mut guard = lock(&tasks);
        if guard.closed {
            return;
        }
        while guard.set.try_join_next().is_some() {}
        guard
            .set
            .spawn(connection(tcp, acceptor.clone(), Arc::clone(&shared)));
    }
}

/// Serves one request on one connection, then closes it.
async fn connection(tcp: TcpStream, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let _ = tcp.set_nodelay(true);
    let number = shared.connections.fetch_add(1, Ordering::SeqCst);
    let hold = lock(&shared.hold_handshakes).clone();
    if let Some(gate) = hold {
        gate.wait().await;
    }
    // A failed handshake or a vanished client just ends the connection.
    let Ok(mut tls) = acceptor.accept(tcp).await else {
        return;
    };
    shared.handshakes.fetch_add(1, Ordering::SeqCst);
    if tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
        shared.resumed.fetch_add(1, Ordering::SeqCst);
    }
    while let Ok(true) = serve(&mut tls, &shared, number).await {}
}

/// The parsed request head.
struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
}

/// Reads the request head: `Ok(None)` if the client left before sending one.
async fn read_head(tls: &mut TlsStream<TcpStream>) -> std::io::Result<Option<Result<Request, ()>>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = find_head_end(&buf) {
            return Ok(Some(parse_head(&buf[..end])));
        }
        if buf.len() >= MAX_HEAD {
            return Ok(Some(Err(())));
        }
        let n = tls.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The index just past the blank line ending the head, within [`MAX_HEAD`].
fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .filter(|&end| end <= MAX_HEAD)
}

/// Parses a request head; `Err` for anything that is not HTTP/1.x.
fn parse_head(head: &[u8]) -> Result<Request, ()> {
    let text = std::str::from_utf8(head).map_err(|_| ())?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().ok_or(())?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(());
    };
    let method_ok = !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase());
    if !method_ok || !target.starts_with('/') || !version.starts_with("HTTP/1.") {
        return Err(());
    }
    let mut headers = Vec::new();
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(())?;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(());
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(Request {
        method: method.to_owned(),
        target: target.to_owned(),
        headers,
    })
}

/// Reads one request, records it and answers it. `Ok(true)`: the
/// connection stays open for the next request.
async fn serve(
    tls: &mut TlsStream<TcpStream>,
    shared: &Shared,
    connection: usize,
) -> std::io::Result<bool> {
    let request = match read_head(tls).await? {
        None => return Ok(false),
        Some(Ok(request)) => request,
        Some(Err(())) => {
            write_status(tls, 400, false).await?;
            return close(tls).await.map(|()| false);
        }
    };

    let (key, behaviour) = {
        let routes = lock(&shared.routes);
        let bare = request.target.split('?').next().unwrap_or_default();
        match routes.get(&request.target) {
            Some(b) => (request.target.clone(), Some(Arc::clone(b))),
            None => (bare.to_owned(), routes.get(bare).cloned()),
        }
    };
    let nth = {
        let mut hits = lock(&shared.hits);
        let n = hits.entry(key.clone()).or_default();
        *n += 1;
        *n - 1
    };
    lock(&shared.last_headers).insert(key.clone(), request.headers.clone());
    lock(&shared.carried)
        .entry(key.clone())
        .or_default()
        .insert(connection);
    if let Some((_, range)) = request.headers.iter().find(|(n, _)| n == "range") {
        lock(&shared.ranges)
            .entry(key.clone())
            .or_default()
            .push(range.clone());
    }
    let observer = lock(&shared.observer).clone();
    if let Some(observer) = observer {
        observer(&request.target, &request.headers);
    }
    shared.total.fetch_add(1, Ordering::SeqCst);

    let head_only = request.method == "HEAD";
    if request.method != "GET" && !head_only {
        write_status(tls, 405, false).await?;
        return close(tls).await.map(|()| false);
    }
    let Some(behaviour) = behaviour else {
        write_status(tls, 404, head_only).await?;
        return close(tls).await.map(|()| false);
    };

    let mut behaviour: &Behaviour = &behaviour;
    while let Behaviour::Sequence(list) = behaviour {
        match list.get(nth).or(list.last()) {
            Some(next) => behaviour = next,
            None => {
                write_status(tls, 404, head_only).await?;
                return close(tls).await.map(|()| false);
            }
        }
    }
    let keep = shared.keep_alive.load(Ordering::SeqCst)
        && matches!(
            behaviour,
            Behaviour::Body(_) | Behaviour::Slow { .. } | Behaviour::Parts { .. }
        );
    match behaviour {
        Behaviour::Parts {
            body,
            etag,
            pace,
            fault,
        } => {
            let key = key.clone();
            let route = (body, etag, *pace, fault);
            return serve_parts(tls, shared, &request, &key, nth, route, keep).await;
        }
        Behaviour::Ranged {
            body,
            etag,
            ignore_range,
            cut_at,
            hold,
            pace,
        } => {
            let header = |name: &str| {
                request
                    .headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
            };
            let start = header("range")
                .and_then(|r| {
                    r.strip_prefix("bytes=")?
                        .strip_suffix('-')?
                        .parse::<usize>()
                        .ok()
                })
                .filter(|_| !*ignore_range)
                .filter(|_| header("if-range").is_none_or(|v| &v == etag))
                .filter(|n| *n < body.len())
                .unwrap_or(0);
            let status = if start > 0 {
                format!(
                    "206 Partial Content\r\nContent-Range: bytes {start}-{}/{}",
                    body.len() - 1,
                    body.len()
                )
            } else {
                "200 OK".to_string()
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nETag: {etag}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len() - start
            );
            tls.write_all(head.as_bytes()).await?;
            let end = cut_at.map_or(body.len(), |c| c.clamp(start, body.len()));
            if !head_only {
                let (piece, pause) = pace.unwrap_or((WRITE_CHUNK, Duration::ZERO));
                for part in body[start..end].chunks(piece.max(1)) {
                    write_body(tls, part).await?;
                    *lock(&shared.served).entry(key.clone()).or_default() += part.len() as u64;
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
            }
            if end < body.len() && *hold {
                std::future::pending::<()>().await;
            }
            if end < body.len() {
                tokio::time::sleep(RESET_PAUSE).await;
                tls.get_ref().0.set_zero_linger()?;
                return Ok(false);
            }
        }
        Behaviour::Drip {
            body,
            etag,
            per_try,
        } => {
            let start = range_start(&request.headers, etag, body.len());
            let status = if start > 0 {
                format!(
                    "206 Partial Content\r\nContent-Range: bytes {start}-{}/{}",
                    body.len() - 1,
                    body.len()
                )
            } else {
                "200 OK".to_string()
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nETag: {etag}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len() - start
            );
            tls.write_all(head.as_bytes()).await?;
            let end = (start + per_try).min(body.len());
            if !head_only {
                write_body(tls, &body[start..end]).await?;
                *lock(&shared.served).entry(key.clone()).or_default() += (end - start) as u64;
            }
            if end < body.len() {
                std::future::pending::<()>().await;
            }
        }
        Behaviour::Raw { head, body } => {
            tls.write_all(format!("{head}\r\n\r\n").as_bytes()).await?;
            if !head_only {
                write_body(tls, body).await?;
            }
        }
        Behaviour::RetryAfter { status, value } => {
            let head = format!(
                "HTTP/1.1 {status} {}\r\nRetry-After: {value}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                reason(*status)
            );
            tls.write_all(head.as_bytes()).await?;
            tls.flush().await?;
        }
        Behaviour::Sequence(_) => write_status(tls, 500, head_only).await?,
        Behaviour::Body(body) => {
            write_head(tls, Some(body.len() as u64), keep).await?;
            if !head_only {
                write_body(tls, body).await?;
            }
        }
        Behaviour::BodyNoLength(body) => {
            write_ok_head(tls, None).await?;
            if !head_only {
                write_body(tls, body).await?;
            }
        }
        Behaviour::WrongLength {
            body,
            content_length,
        } => {
            write_ok_head(tls, Some(*content_length)).await?;
            if !head_only {
                write_body(tls, body).await?;
            }
        }
        Behaviour::Stall { body, sent } => {
            write_ok_head(tls, Some(body.len() as u64)).await?;
            if !head_only {
                write_body(tls, &body[..(*sent).min(body.len())]).await?;
                // Hold the connection until the origin is dropped, which
                // aborts this task.
                std::future::pending::<()>().await;
            }
        }
        Behaviour::Reset { body, sent } => {
            write_ok_head(tls, Some(body.len() as u64)).await?;
            if !head_only {
                write_body(tls, &body[..(*sent).min(body.len())]).await?;
            }
            // Let loopback deliver what was sent, then SO_LINGER 0 so that
            // dropping the socket sends RST instead of FIN.
            tokio::time::sleep(RESET_PAUSE).await;
            tls.get_ref().0.set_zero_linger()?;
            return Ok(false);
        }
        Behaviour::Status(status) => write_status(tls, *status, head_only).await?,
        Behaviour::Redirect { status, location } => {
            let head = format!(
                "HTTP/1.1 {status} {}\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                reason(*status)
            );
            tls.write_all(head.as_bytes()).await?;
            tls.flush().await?;
        }
        Behaviour::Gated { body, gate } => {
            gate.wait().await;
            write_ok_head(tls, Some(body.len() as u64)).await?;
            if !head_only {
                write_body(tls, body).await?;
            }
        }
        Behaviour::Slow { body, chunk, delay } => {
            write_head(tls, Some(body.len() as u64), keep).await?;
            if !head_only {
                let mut pieces = body.chunks((*chunk).max(1)).peekable();
                while let Some(piece) = pieces.next() {
                    write_body(tls, piece).await?;
                    if pieces.peek().is_some() {
                        tokio::time::sleep(*delay).await;
                    }
                }
            }
        }
    }
    if keep {
        return Ok(true);
    }
    close(tls).await.map(|()| false)
}

/// Answers one request of a [`Behaviour::Parts`] route.
async fn serve_parts(
    tls: &mut TlsStream<TcpStream>,
    shared: &Shared,
    request: &Request,
    key: &str,
    nth: usize,
    route: (&Arc<Vec<u8>>, &String, (usize, Duration), &PartsFault),
    keep: bool,
) -> std::io::Result<bool> {
    let (body, etag, pace, fault) = route;
    let etag = match fault {
        PartsFault::EtagChangesAt(n) if nth >= *n => {
            format!("{}-changed\"", etag.trim_end_matches('"'))
        }
        _ => etag.clone(),
    };
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let len = body.len();
    let range = header("range")
        .filter(|_| header("if-range").is_none_or(|v| v == etag))
        .and_then(|r| {
            let (s, e) = r.strip_prefix("bytes=")?.split_once('-')?;
            if s.is_empty() {
                // A suffix: the last `e` bytes.
                let n: usize = e.parse().ok()?;
                return (n > 0 && len > 0).then(|| (len - n.min(len), len - 1));
            }
            let s: usize = s.parse().ok()?;
            let e: usize = if e.is_empty() {
                len - 1
            } else {
                e.parse().ok()?
            };
            (s <= e && e < len).then_some((s, e))
        });
    let (start, end, status) = match range {
        Some((s, e)) => {
            let named = if *fault == PartsFault::WrongContentRange && s > 0 {
                s + 1
            } else {
                s
            };
            let status = format!("206 Partial Content\r\nContent-Range: bytes {named}-{e}/{len}");
            (s, e + 1, status)
        }
        None => (0, len, "200 OK".to_string()),
    };
    let (piece, pause) = match fault {
        PartsFault::SlowFirst(piece, pause) if nth == 0 => (*piece, *pause),
        PartsFault::SlowCovering {
            at,
            count,
            piece,
            pause,
        } if (start..end).contains(at)
            && shared.covering.fetch_add(1, Ordering::SeqCst) < *count =>
        {
            (*piece, *pause)
        }
        _ => pace,
    };
    let close_header = if keep { "" } else { "Connection: close\r\n" };
    let etag_header = if *fault == PartsFault::NoValidator {
        String::new()
    } else {
        format!("ETag: {etag}\r\n")
    };
    let head = format!(
        "HTTP/1.1 {status}\r\n{etag_header}Content-Length: {}\r\n{close_header}\r\n",
        end - start
    );
    match fault {
        PartsFault::LateFirstHead(late) if nth == 0 => tokio::time::sleep(*late).await,
        PartsFault::LateHeads(late) => tokio::time::sleep(*late).await,
        _ => {}
    }
    let mut log = AnswerLog {
        logger: lock(&shared.logger).clone(),
        answered: Answered {
            method: &request.method,
            target: &request.target,
            range: request
                .headers
                .iter()
                .find(|(n, _)| n == "range")
                .map(|(_, v)| v.as_str()),
            status: if range.is_some() { 206 } else { 200 },
            sent: 0,
            announced: (end - start) as u64,
        },
    };
    tls.write_all(head.as_bytes()).await?;
    let mut at = start;
    while at < end {
        let stop = (at + piece.max(1)).min(end);
        let mut part = body[at..stop].to_vec();
        if let PartsFault::Corrupt(bad) = fault {
            if (at..stop).contains(bad) {
                part[bad - at] ^= 0xff;
            }
        }
        write_body(tls, &part).await?;
        *lock(&shared.served).entry(key.to_string()).or_default() += part.len() as u64;
        log.answered.sent += part.len() as u64;
        at = stop;
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    if keep {
        return Ok(true);
    }
    close(tls).await.map(|()| false)
}

/// Where a resumable response starts: the `Range: bytes=N-` asked for when
/// its `If-Range` (if any) is `etag` and `N` is inside the body, else 0.
fn range_start(headers: &[(String, String)], etag: &str, len: usize) -> usize {
    let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    header("range")
        .and_then(|r| {
            r.strip_prefix("bytes=")?
                .strip_suffix('-')?
                .parse::<usize>()
                .ok()
        })
        .filter(|_| header("if-range").is_none_or(|v| v == etag))
        .filter(|n| *n < len)
        .unwrap_or(0)
}

/// Writes a 200 head for an octet-stream body, with or without a length.
async fn write_ok_head(
    tls: &mut TlsStream<TcpStream>,
    content_length: Option<u64>,
) -> std::io::Result<()> {
    write_head(tls, content_length, false).await
}

/// [`write_ok_head`], without `Connection: close` when `keep`.
async fn write_head(
    tls: &mut TlsStream<TcpStream>,
    content_length: Option<u64>,
    keep: bool,
) -> std::io::Result<()> {
    let length = content_length
        .map(|n| format!("Content-Length: {n}\r\n"))
        .unwrap_or_default();
    let close = if keep { "" } else { "Connection: close\r\n" };
    let head =
        format!("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n{length}{close}\r\n");
    tls.write_all(head.as_bytes()).await?;
    tls.flush().await
}

/// Writes a status with a short text body (none where HTTP forbids one).
async fn write_status(
    tls: &mut TlsStream<TcpStream>,
    status: u16,
    head_only: bool,
) -> std::io::Result<()> {
    let no_body = (100..200).contains(&status) || status == 204 || status == 304;
    let mut response = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    let text = format!("{status} {}\n", reason(status));
    if !no_body {
        response.push_str("Content-Type: text/plain; charset=utf-8\r\n");
        response.push_str(&format!("Content-Length: {}\r\n", text.len()));
    }
    response.push_str("Connection: close\r\n\r\n");
    if !no_body && !head_only {
        response.push_str(&text);
    }
    tls.write_all(response.as_bytes()).await?;
    tls.flush().await
}

/// Writes body bytes in [`WRITE_CHUNK`] pieces, flushing each.
async fn write_body(tls: &mut TlsStream<TcpStream>, body: &[u8]) -> std::io::Result<()> {
    for piece in body.chunks(WRITE_CHUNK) {
        tls.write_all(piece).await?;
        tls.flush().await?;
    }
    Ok(())
}

/// Sends close_notify and FIN, then waits briefly for the client to close so
/// that the response is never cut short by a reset.
async fn close(tls: &mut TlsStream<TcpStream>) -> std::io::Result<()> {
    tls.shutdown().await?;
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(LINGER, async {
        while let Ok(n) = tls.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
    Ok(())
}

/// The reason phrase for a status code.
fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        410 => "Gone",
        416 => "Range Not Satisfiable",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}
