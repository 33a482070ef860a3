//! The server side of the local API: accepts clients on the store's
//! socket and answers their requests with the service's own calls.
//!
//! Each connection has a reader (bounded lines), a writer fed by a bounded
//! queue, and one task per request in flight. Events reach a subscriber
//! through that queue without waiting: a client whose queue is full loses
//! its subscription (a `lagged` notification says so), so a slow or stuck
//! client never holds up a download or another client.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::api::discovery::{self, ServiceLock};
use crate::api::protocol::{
    self, answer, notification, AutofillParams, Changed, GemParams, Hello, InstallParams,
    PathResult, PolicyBody, Request, ResourceParams, RpcError, ServiceInfo, StatusResult,
    Subscribed, UninstallResult, UnsubscribeParams,
};
use crate::error::{Error, Result};
use crate::net::policy::Policy;
use crate::platform::local_socket::{self, Duplex, Listener};
use crate::service::Resources;

/// A running local API; [`ApiServer::stop`] ends it.
#[derive(Debug)]
pub struct ApiServer {
    socket: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    /// The socket (or named pipe) clients connect to.
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// Stops accepting, closes every connection, removes the socket and
    /// `service.json`, and releases the store.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

impl Resources {
    /// Accepts API clients on the store's default socket (see
    /// `PROTOCOL.md` and [`crate::api::discovery`]) until
    /// [`ApiServer::stop`]. Fails with `E_RESOURCE_BUSY` when another
    /// service already listens on the store.
    pub fn listen(&self) -> Result<ApiServer> {
        self.check_live()?;
        let store_dir = self.store_dir();
        // Held before a folder is made for the socket: a second service
        // makes none.
        let lock = discovery::hold(self.store(), &store_dir)?;
        let place = discovery::default_place(self.store())?;
        self.listen_at(place, lock, store_dir)
    }

    /// [`Resources::listen`] on another socket path (`service.json` names
    /// it, so clients that start from the store still find it). The
    /// socket's folder must be the user's own and closed to others, or no
    /// client connects.
    pub fn listen_on(&self, socket: &Path) -> Result<ApiServer> {
        self.check_live()?;
        let store_dir = self.store_dir();
        let lock = discovery::hold(self.store(), &store_dir)?;
        let place = local_socket::Place {
            path: socket.to_path_buf(),
            own_folder: None,
        };
        self.listen_at(place, lock, store_dir)
    }

    fn store_dir(&self) -> std::path::PathBuf {
        self.store()
            .root()
            .parent()
            .unwrap_or(self.store().root())
            .to_path_buf()
    }

    fn listen_at(
        &self,
        place: local_socket::Place,
        lock: ServiceLock,
        store_dir: std::path::PathBuf,
    ) -> Result<ApiServer> {
        discovery::clear_left_over(self.store(), &lock);
        let _runtime = self.handle().enter();
        let listener = Listener::bind(&place).map_err(|e| {
            if let Some(folder) = &place.own_folder {
                let _ = std::fs::remove_dir(folder);
            }
            Error::io("cannot listen on", &place.path, e)
        })?;
        let name = listener.name();
        let secret = discovery::random_hex()?;
        discovery::publish(self.store(), &lock, &name, &secret)?;
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            service: self.clone(),
            store_dir,
            socket: name.clone(),
            secret,
            connections: Arc::new(Semaphore::new(protocol::MAX_CONNECTIONS)),
            stop: stop.clone(),
        });
        let task = self.handle().spawn(accept_loop(listener, shared, lock));
        Ok(ApiServer {
            socket: name,
            stop,
            task,
        })
    }
}

/// What every connection shares.
struct Shared {
    service: Resources,
    store_dir: std::path::PathBuf,
    socket: String,
    /// What `hello` proves it holds (`service.json`'s `secret`).
    secret: String,
    connections: Arc<Semaphore>,
    stop: CancellationToken,
}

async fn accept_loop(listener: Listener, shared: Arc<Shared>, lock: ServiceLock) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shared.stop.cancelled() => break,
        };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!("the local API could not accept a client: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if !local_socket::peer_is_me(&stream) {
            tracing::warn!("the local API refused a client of another user");
            continue;
        }
        let Ok(permit) = shared.connections.clone().try_acquire_owned() else {
            tracing::warn!(
                "the local API refused a client: {} connections are open",
                protocol::MAX_CONNECTIONS
            );
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            serve_connection(stream.into_duplex(), shared).await;
            drop(permit);
        });
    }
    // The socket goes with the listener, then service.json with the lock.
    drop(listener);
    drop(lock);
}

/// One client's connection.
struct Connection {
    out: mpsc::Sender<String>,
    subscriptions: Mutex<HashMap<u64, CancellationToken>>,
    next_subscription: AtomicU64,
    in_flight: Arc<Semaphore>,
    closed: CancellationToken,
}

impl Connection {
    async fn send(&self, message: &Value) {
        let _ = self.out.send(line(message)).await;
    }
}

fn line(message: &Value) -> String {
    let mut text = message.to_string();
    text.push('\n');
    text
}

async fn serve_connection(stream: Box<dyn Duplex>, shared: Arc<Shared>) {
    let (read, mut write) = tokio::io::split(stream);
    let (out, mut queue) = mpsc::channel::<String>(protocol::CONNECTION_QUEUE);
    let conn = Arc::new(Connection {
        out,
        subscriptions: Mutex::default(),
        next_subscription: AtomicU64::new(1),
        in_flight: Arc::new(Semaphore::new(protocol::MAX_IN_FLIGHT)),
        closed: CancellationToken::new(),
    });
    let closed = conn.closed.clone();
    let writer = tokio::spawn(async move {
        while let Some(text) = queue.recv().await {
            if write.write_all(text.as_bytes()).await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
        closed.cancel();
    });
    let mut reader = BufReader::new(read);
    loop {
        let next = tokio::select! {
            next = read_line(&mut reader, protocol::MAX_LINE) => next,
            () = shared.stop.cancelled() => break,
            () = conn.closed.cancelled() => break,
        };
        match next {
            Ok(Some(bytes)) => handle_line(&bytes, &conn, &shared).await,
            Ok(None) => break,
            Err(LineError::TooLong) => {
                let error = RpcError::usage(
                    protocol::PARSE_ERROR,
                    format!("a request line is longer than {} bytes", protocol::MAX_LINE),
                );
                conn.send(&answer(Value::Null, Err(error))).await;
                break;
            }
            Err(LineError::Io) => break,
        }
    }
    for (_, token) in conn
        .subscriptions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
    {
        token.cancel();
    }
    conn.closed.cancel();
    drop(conn);
    let _ = writer.await;
}

enum LineError {
    TooLong,
    Io,
}

/// The next line (without its `\n`), at most `max` bytes; `None` at the end.
async fn read_line(
    reader: &mut (impl AsyncBufRead + Unpin),
    max: usize,
) -> std::result::Result<Option<Vec<u8>>, LineError> {
    let mut line = Vec::new();
    loop {
        let buf = reader.fill_buf().await.map_err(|_| LineError::Io)?;
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(at) => {
                if line.len() + at > max {
                    return Err(LineError::TooLong);
                }
                line.extend_from_slice(&buf[..at]);
                reader.consume(at + 1);
                return Ok(Some(line));
            }
            None => {
                let n = buf.len();
                if line.len() + n > max {
                    return Err(LineError::TooLong);
                }
                line.extend_from_slice(buf);
                reader.consume(n);
            }
        }
    }
}

async fn handle_line(bytes: &[u8], conn: &Arc<Connection>, shared: &Arc<Shared>) {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim_end_matches('\r');
    if text.trim().is_empty() {
        return;
    }
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let error = RpcError::usage(protocol::PARSE_ERROR, format!("not JSON: {e}"));
            conn.send(&answer(Value::Null, Err(error))).await;
            return;
        }
    };
    let id = value.get("id").cloned();
    let request: Request = match serde_json::from_value::<Request>(value) {
        Ok(r) if r.jsonrpc == "2.0" => r,
        _ => {
            let error = RpcError::usage(
                protocol::INVALID_REQUEST,
                "not a JSON-RPC 2.0 request (jsonrpc, method, id, params)",
            );
            conn.send(&answer(id.unwrap_or(Value::Null), Err(error)))
                .await;
            return;
        }
    };
    // One task per request: a long `path` never holds up a `hello`.
    let Ok(permit) = conn.in_flight.clone().acquire_owned().await else {
        return;
    };
    let (conn, shared) = (conn.clone(), shared.clone());
    tokio::spawn(async move {
        let id = request.id.clone();
        let outcome = dispatch(request, &conn, &shared).await;
        if let (Some(id), Some(outcome)) = (id, outcome) {
            conn.send(&answer(id, outcome)).await;
        }
        drop(permit);
    });
}

fn params<T: DeserializeOwned + Default>(
    params: Option<Value>,
) -> std::result::Result<T, RpcError> {
    match params {
        None | Some(Value::Null) => Ok(T::default()),
        Some(v) => serde_json::from_value(v).map_err(bad_params),
    }
}

fn required<T: DeserializeOwned>(params: Option<Value>) -> std::result::Result<T, RpcError> {
    serde_json::from_value(params.unwrap_or(Value::Null)).map_err(bad_params)
}

fn bad_params(e: serde_json::Error) -> RpcError {
    RpcError::usage(protocol::INVALID_PARAMS, format!("invalid params: {e}"))
}

fn ok<T: Serialize>(result: Result<T>) -> std::result::Result<Value, RpcError> {
    match result {
        Ok(value) => serde_json::to_value(value)
            .map_err(|e| RpcError::of(&Error::Invalid(format!("cannot write the answer: {e}")))),
        Err(e) => Err(RpcError::of(&e)),
    }
}

/// Runs one request; `None` when it answered by itself (`subscribe`).
async fn dispatch(
    request: Request,
    conn: &Arc<Connection>,
    shared: &Arc<Shared>,
) -> Option<std::result::Result<Value, RpcError>> {
    let service = &shared.service;
    let p = request.params;
    let outcome = match request.method.as_str() {
        "hello" => match params::<HelloParams>(p) {
            Ok(HelloParams { nonce }) => hello(shared, nonce),
            Err(e) => Err(e),
        },
        "status" => match params::<GemParams>(p) {
            Ok(GemParams { gem }) => ok(status(shared, gem).await),
            Err(e) => Err(e),
        },
        "path" => match required::<ResourceParams>(p) {
            Ok(r) => ok(service.path(&r.gem, &r.id).await.map(|path| PathResult {
                gem: r.gem,
                resource: r.id,
                path,
            })),
            Err(e) => Err(e),
        },
        "install" => match required::<InstallParams>(p) {
            Ok(InstallParams {
                gem,
                manifest,
                installed_by,
            }) => ok(install(service, &gem, &manifest, installed_by.as_deref()).await),
            Err(e) => Err(e),
        },
        "uninstall" => match required::<ResourceGem>(p) {
            Ok(ResourceGem { gem }) => ok(uninstall(service, &gem).await),
            Err(e) => Err(e),
        },
        "download_now" | "cancel" | "retry" => match required::<ResourceParams>(p) {
            Ok(r) => {
                let changed = match request.method.as_str() {
                    "download_now" => service.download_now(&r.gem, &r.id),
                    "cancel" => service.cancel(&r.gem, &r.id).await,
                    _ => service.retry(&r.gem, &r.id).await,
                };
                ok(changed.map(|changed| Changed { changed }))
            }
            Err(e) => Err(e),
        },
        "autofill" => match params::<AutofillParams>(p) {
            Ok(a) => autofill(service, a).await,
            Err(e) => Err(e),
        },
        "policy" => ok(Ok(PolicyBody::from(&service.policy()))),
        "set_policy" => match required::<PolicyBody>(p) {
            Ok(body) => ok(Policy::new(body.mode, &body.hosts)
                .map_err(Error::from)
                .and_then(|policy| service.set_policy_counted(policy))),
            Err(e) => Err(e),
        },
        "subscribe" => match params::<GemParams>(p) {
            Ok(GemParams { gem }) => return subscribe(request.id, gem, conn, shared).await,
            Err(e) => Err(e),
        },
        "unsubscribe" => match params::<UnsubscribeParams>(p) {
            Ok(u) => {
                let mut subs = conn.subscriptions.lock().unwrap_or_else(|p| p.into_inner());
                let ended: Vec<u64> = match u.subscription {
                    Some(n) => vec![n],
                    None => subs.keys().copied().collect(),
                };
                for n in ended {
                    if let Some(token) = subs.remove(&n) {
                        token.cancel();
                    }
                }
                Ok(json!({}))
            }
            Err(e) => Err(e),
        },
        other => Err(RpcError::usage(
            protocol::METHOD_NOT_FOUND,
            format!("no method {other:?} (see PROTOCOL.md)"),
        )),
    };
    Some(outcome)
}

/// `hello`'s answer; with a `nonce`, the proof that this service holds the
/// store's secret.
fn hello(shared: &Shared, nonce: Option<String>) -> std::result::Result<Value, RpcError> {
    if nonce
        .as_ref()
        .is_some_and(|n| n.chars().count() > discovery::MAX_NONCE_CHARS)
    {
        return Err(RpcError::usage(
            protocol::INVALID_PARAMS,
            format!(
                "params.nonce: longer than {} characters",
                discovery::MAX_NONCE_CHARS
            ),
        ));
    }
    ok(Ok(Hello {
        protocol: protocol::PROTOCOL,
        version: env!("CARGO_PKG_VERSION").to_string(),
        store: shared.store_dir.clone(),
        pid: std::process::id(),
        proof: nonce.map(|n| discovery::proof(&shared.secret, &n)),
    }))
}

#[derive(serde::Deserialize, Default)]
struct HelloParams {
    #[serde(default)]
    nonce: Option<String>,
}

#[derive(serde::Deserialize)]
struct ResourceGem {
    gem: String,
}

async fn status(shared: &Shared, gem: Option<String>) -> Result<StatusResult> {
    let service = shared.service.clone();
    let info = ServiceInfo {
        socket: shared.socket.clone(),
        pid: std::process::id(),
    };
    let work = move || {
        let mut result = crate::api::status_of(&service, gem.as_deref())?;
        result.service = Some(info);
        Ok(result)
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => Err(Error::Invalid(format!("status stopped: {e}"))),
    }
}

async fn install(
    service: &Resources,
    gem: &str,
    manifest: &Value,
    by: Option<&str>,
) -> Result<crate::InstallReport> {
    let by = match by {
        None | Some("api") => crate::InstalledBy::Api,
        Some("cli") => crate::InstalledBy::Cli,
        Some(other) => {
            return Err(Error::Invalid(format!(
                "params.installed_by: {:?} is not one of \"api\" or \"cli\"",
                other.chars().take(64).collect::<String>()
            )))
        }
    };
    let bytes = serde_json::to_vec(manifest)
        .map_err(|e| Error::Invalid(format!("the manifest cannot be read: {e}")))?;
    let manifest = crate::manifest::parse_manifest(&bytes)?;
    service.install_by(gem, &manifest, by).await
}

async fn uninstall(service: &Resources, gem: &str) -> Result<UninstallResult> {
    Ok(match service.uninstall_if_installed(gem).await? {
        Some(report) => UninstallResult {
            gem: report.gem,
            installed: true,
            deleted: report.deleted,
            kept: report.kept,
        },
        None => UninstallResult {
            gem: gem.to_string(),
            installed: false,
            ..UninstallResult::default()
        },
    })
}

async fn autofill(
    service: &Resources,
    params: AutofillParams,
) -> std::result::Result<Value, RpcError> {
    match (params.url, params.manifest) {
        (Some(url), None) => {
            let url = url::Url::parse(&url)
                .map_err(|e| Error::Usage(format!("not a valid URL: {url:?}: {e}")));
            match url {
                Ok(url) => ok(service.autofill(&url).await),
                Err(e) => Err(RpcError::of(&e)),
            }
        }
        (None, Some(manifest)) => {
            let bytes = serde_json::to_vec_pretty(&manifest).unwrap_or_default();
            ok(service
                .autofill_manifest_with(&bytes, params.all, params.url_only)
                .await)
        }
        _ => Err(RpcError::usage(
            protocol::INVALID_PARAMS,
            "autofill takes {\"url\": …} or {\"manifest\": {…}, \"all\"?: bool, \"url_only\"?: bool}",
        )),
    }
}

async fn subscribe(
    id: Option<Value>,
    gem: Option<String>,
    conn: &Arc<Connection>,
    shared: &Arc<Shared>,
) -> Option<std::result::Result<Value, RpcError>> {
    let full = conn
        .subscriptions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .len()
        >= protocol::MAX_SUBSCRIPTIONS;
    if full {
        return Some(Err(RpcError::usage(
            protocol::INVALID_REQUEST,
            format!(
                "a connection holds at most {} subscriptions",
                protocol::MAX_SUBSCRIPTIONS
            ),
        )));
    }
    // A gem that is not installed (yet) has no rows; its events come once
    // it is, so a page may subscribe before the install.
    let (events, status) = match shared.service.subscribe_with_status(gem.as_deref()) {
        Ok(pair) => pair,
        Err(crate::Error::NotFound(_)) if gem.is_some() => (shared.service.subscribe(), Vec::new()),
        Err(e) => return Some(Err(RpcError::of(&e))),
    };
    let number = conn.next_subscription.fetch_add(1, Ordering::Relaxed);
    let token = CancellationToken::new();
    conn.subscriptions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(number, token.clone());
    // The answer goes out before the first event.
    if let Some(id) = id {
        let result = ok(Ok(Subscribed {
            subscription: number,
            status,
        }));
        conn.send(&answer(id, result)).await;
    }
    tokio::spawn(forward(events, gem, number, conn.clone(), token));
    None
}

/// Sends a subscription's events until it ends, the service closes, or
/// the client falls behind (`lagged`).
async fn forward(
    mut events: broadcast::Receiver<crate::Event>,
    gem: Option<String>,
    number: u64,
    conn: Arc<Connection>,
    token: CancellationToken,
) {
    let lagged = |missed: u64| {
        line(&notification(
            "lagged",
            json!({ "subscription": number, "missed": missed }),
        ))
    };
    loop {
        let next = tokio::select! {
            next = events.recv() => next,
            () = token.cancelled() => return,
            () = conn.closed.cancelled() => return,
        };
        let event = match next {
            Ok(event) => event,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                send_or_close(&conn, lagged(missed)).await;
                break;
            }
            Err(broadcast::error::RecvError::Closed) => break,
        };
        let Ok(mut params) = serde_json::to_value(&event) else {
            continue;
        };
        if let (Some(want), Some(of)) = (&gem, params.get("gem").and_then(Value::as_str)) {
            if want != of {
                continue;
            }
        }
        // Which subscription it is for, when a connection holds several.
        if let Some(fields) = params.as_object_mut() {
            fields.insert("subscription".into(), json!(number));
        }
        let message = line(&notification("event", params));
        if let Err(mpsc::error::TrySendError::Full(_)) = conn.out.try_send(message) {
            // The client does not read: it gets a lagged (once there is
            // room) and subscribes again.
            send_or_close(&conn, lagged(1)).await;
            break;
        }
    }
    conn.subscriptions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&number);
}

/// Queues `message`, waiting for room, unless the connection closes first.
async fn send_or_close(conn: &Connection, message: String) {
    tokio::select! {
        _ = conn.out.send(message) => {}
        () = conn.closed.cancelled() => {}
    }
}
