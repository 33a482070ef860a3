//! The server side of the local API: accepts clients on the store's
//! socket and answers their requests with the service's own calls.
//!
//! Each connection has a reader (bounded lines), a writer fed by a bounded
//! queue, and one task per request in flight. Events reach a subscriber
//! through that queue without waiting: a client whose queue is full loses
//! its subscription (a `lagged` notification says so), so a slow or stuck
//! client never holds up a download or another client.
//!
//! No client can exhaust the service for the others: every limit is
//! counted in bytes and time as well as in messages (see the constants of
//! [`protocol`]). Connections are capped below the process's limit of open
//! files, and at the cap the one idle the longest makes room; a partial
//! line has [`protocol::LINE_DEADLINE`], a silent new connection
//! [`protocol::FIRST_LINE_DEADLINE`], and a client that does not read
//! [`protocol::WRITE_DEADLINE`]; request lines of all connections together
//! hold at most [`protocol::REQUEST_BYTES`], and a connection's queue at
//! most [`protocol::CONNECTION_QUEUE_BYTES`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{broadcast, mpsc, OwnedSemaphorePermit, Semaphore};
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
        let cap = connection_cap(crate::platform::raise_open_files_limit());
        let shared = Arc::new(Shared {
            service: self.clone(),
            store_dir,
            socket: name.clone(),
            secret,
            connections: Arc::new(Semaphore::new(cap)),
            cap,
            request_bytes: Arc::new(Semaphore::new(protocol::REQUEST_BYTES)),
            open: Mutex::default(),
            next_connection: AtomicU64::new(1),
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
    /// One permit per open connection.
    connections: Arc<Semaphore>,
    /// How many connections may be open at once.
    cap: usize,
    /// The bytes of request lines all connections may hold at once.
    request_bytes: Arc<Semaphore>,
    /// Every open connection, to find the one idle the longest.
    open: Mutex<HashMap<u64, Arc<Activity>>>,
    next_connection: AtomicU64,
    stop: CancellationToken,
}

/// The cap of connections for a process that may open `limit` files.
fn connection_cap(limit: Option<u64>) -> usize {
    match limit {
        Some(limit) => {
            let room = limit.saturating_sub(protocol::RESERVED_DESCRIPTORS);
            usize::try_from(room)
                .unwrap_or(usize::MAX)
                .clamp(16, protocol::MAX_CONNECTIONS)
        }
        None => protocol::MAX_CONNECTIONS,
    }
}

/// What a connection is doing, for the choice of which to close at the
/// cap.
struct Activity {
    /// When it last read a request or finished one.
    last: Mutex<Instant>,
    /// Requests in flight and subscriptions held.
    busy: AtomicUsize,
    /// Closes it.
    close: CancellationToken,
}

impl Activity {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Counts one piece of work until the guard is dropped.
    fn working(self: &Arc<Self>) -> Working {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Working(self.clone())
    }
}

/// A request in flight or a subscription held.
struct Working(Arc<Activity>);

impl Drop for Working {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
        self.0.touch();
    }
}

impl Shared {
    /// Closes the connection idle the longest (nothing in flight, no
    /// subscription); false when every connection is working.
    fn close_idlest(&self) -> bool {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let idlest = open
            .values()
            .filter(|a| a.busy.load(Ordering::SeqCst) == 0 && !a.close.is_cancelled())
            .min_by_key(|a| *a.last.lock().unwrap_or_else(|p| p.into_inner()));
        match idlest {
            Some(activity) => {
                activity.close.cancel();
                true
            }
            None => false,
        }
    }

    /// A permit for one more connection: at the cap, the connection idle
    /// the longest is closed to make room; `None` when none is idle.
    async fn admit(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.connections.clone().try_acquire_owned() {
            return Some(permit);
        }
        if !self.close_idlest() {
            return None;
        }
        let wait = self.connections.clone().acquire_owned();
        match tokio::time::timeout(std::time::Duration::from_secs(1), wait).await {
            Ok(Ok(permit)) => Some(permit),
            _ => None,
        }
    }
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
        let Some(permit) = shared.admit().await else {
            tracing::warn!(
                "the local API refused a client: {} connections are open, none of them idle",
                shared.cap
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
    out: mpsc::Sender<Queued>,
    /// The bytes that may wait in `out` ([`protocol::CONNECTION_QUEUE_BYTES`]).
    out_bytes: Arc<Semaphore>,
    subscriptions: Mutex<HashMap<u64, CancellationToken>>,
    next_subscription: AtomicU64,
    in_flight: Arc<Semaphore>,
    closed: CancellationToken,
    activity: Arc<Activity>,
    /// The calls in flight that `$/cancelRequest` (or the connection's
    /// end) can cancel, by their id's JSON text.
    calls: Mutex<HashMap<String, (u64, CancellationToken)>>,
    next_call: AtomicU64,
}

/// A line waiting to be written, and its share of the queue's bytes.
type Queued = (String, OwnedSemaphorePermit);

impl Connection {
    /// The client is gone: its subscriptions end, and the calls in flight,
    /// which nobody is left to read, are cancelled.
    fn end(&self) {
        for (_, token) in self
            .subscriptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            token.cancel();
        }
        for (_, (_, token)) in self.calls.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            token.cancel();
        }
    }

    /// Queues `message`, waiting for room (in messages and in bytes), unless
    /// the connection closes first.
    async fn send(&self, message: &Value) {
        self.send_line(line(message)).await;
    }

    async fn send_line(&self, text: String) {
        let wait = self
            .out_bytes
            .clone()
            .acquire_many_owned(queue_share(&text));
        let permit = tokio::select! {
            permit = wait => permit.ok(),
            () = self.closed.cancelled() => None,
        };
        let Some(permit) = permit else {
            return;
        };
        tokio::select! {
            _ = self.out.send((text, permit)) => {}
            () = self.closed.cancelled() => {}
        }
    }

    /// Queues `text` only if there is room now.
    fn try_send_line(&self, text: String) -> bool {
        let Ok(permit) = self
            .out_bytes
            .clone()
            .try_acquire_many_owned(queue_share(&text))
        else {
            return false;
        };
        self.out.try_send((text, permit)).is_ok()
    }
}

/// The queue bytes a line takes (a line longer than the whole queue takes
/// all of it).
fn queue_share(text: &str) -> u32 {
    text.len().clamp(1, protocol::CONNECTION_QUEUE_BYTES) as u32
}

fn line(message: &Value) -> String {
    let mut text = message.to_string();
    text.push('\n');
    text
}

async fn serve_connection(stream: Box<dyn Duplex>, shared: Arc<Shared>) {
    let (read, write) = tokio::io::split(stream);
    let (out, queue) = mpsc::channel::<Queued>(protocol::CONNECTION_QUEUE);
    let activity = Arc::new(Activity {
        last: Mutex::new(Instant::now()),
        busy: AtomicUsize::new(0),
        close: CancellationToken::new(),
    });
    let number = shared.next_connection.fetch_add(1, Ordering::Relaxed);
    shared
        .open
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(number, activity.clone());
    let conn = Arc::new(Connection {
        out,
        out_bytes: Arc::new(Semaphore::new(protocol::CONNECTION_QUEUE_BYTES)),
        subscriptions: Mutex::default(),
        next_subscription: AtomicU64::new(1),
        in_flight: Arc::new(Semaphore::new(protocol::MAX_IN_FLIGHT)),
        closed: activity.close.clone(),
        activity,
        calls: Mutex::default(),
        next_call: AtomicU64::new(1),
    });
    let writer = tokio::spawn(write_queue(write, queue, conn.closed.clone()));
    let mut reader = BufReader::new(read);
    let mut spoke = false;
    loop {
        let limits = LineLimits {
            max: protocol::MAX_LINE,
            budget: &shared.request_bytes,
            silent_for: (!spoke).then_some(protocol::FIRST_LINE_DEADLINE),
        };
        let next = tokio::select! {
            next = read_line(&mut reader, limits) => next,
            () = shared.stop.cancelled() => break,
            () = conn.closed.cancelled() => break,
        };
        match next {
            Ok(Some(request)) => {
                spoke = true;
                conn.activity.touch();
                handle_line(request, &conn, &shared).await;
            }
            Ok(None) => break,
            Err(LineError::TooLong) => {
                let error = RpcError::usage(
                    protocol::PARSE_ERROR,
                    format!("a request line is longer than {} bytes", protocol::MAX_LINE),
                );
                conn.send(&answer(Value::Null, Err(error))).await;
                break;
            }
            Err(LineError::Late) => {
                let error = RpcError::usage(
                    protocol::PARSE_ERROR,
                    format!(
                        "a request line did not end within {} s",
                        protocol::LINE_DEADLINE.as_secs()
                    ),
                );
                conn.send(&answer(Value::Null, Err(error))).await;
                break;
            }
            Err(LineError::Silent | LineError::Io) => break,
        }
    }
    conn.end();
    shared
        .open
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&number);
    // Answers already queued (a parse error) go out before the close.
    drop(conn);
    let _ = writer.await;
}

/// Writes the connection's queue until it ends or `closed` fires; a client
/// that does not read for [`protocol::WRITE_DEADLINE`] is gone.
async fn write_queue(
    mut write: tokio::io::WriteHalf<Box<dyn Duplex>>,
    mut queue: mpsc::Receiver<Queued>,
    closed: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            next = queue.recv() => next,
            () = closed.cancelled() => None,
        };
        let Some((text, _share)) = next else {
            break;
        };
        let wrote =
            tokio::time::timeout(protocol::WRITE_DEADLINE, write.write_all(text.as_bytes())).await;
        if !matches!(wrote, Ok(Ok(()))) {
            break;
        }
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), write.shutdown()).await;
    closed.cancel();
}

enum LineError {
    TooLong,
    /// A partial line held longer than [`protocol::LINE_DEADLINE`].
    Late,
    /// Nothing at all within the first deadline.
    Silent,
    Io,
}

/// What bounds the reading of one line.
struct LineLimits<'a> {
    /// Its most bytes.
    max: usize,
    /// The bytes all connections' lines may hold.
    budget: &'a Arc<Semaphore>,
    /// How long to wait for its first byte (for ever with `None`).
    silent_for: Option<std::time::Duration>,
}

/// A request line (without its `\n`), and its share of the bytes all
/// request lines may hold, released when the request is answered.
struct RequestLine {
    bytes: Vec<u8>,
    _share: Option<OwnedSemaphorePermit>,
}

/// The next line, at most `limits.max` bytes, taking its bytes from the
/// budget as they arrive; `None` at the end. Once its first byte arrived
/// it must end within [`protocol::LINE_DEADLINE`].
async fn read_line(
    reader: &mut (impl AsyncBufRead + Unpin),
    limits: LineLimits<'_>,
) -> std::result::Result<Option<RequestLine>, LineError> {
    let mut line = Vec::new();
    let mut share: Option<OwnedSemaphorePermit> = None;
    let mut begun = false;
    let mut deadline: Option<tokio::time::Instant> =
        limits.silent_for.map(|d| tokio::time::Instant::now() + d);
    loop {
        let buf = match deadline {
            Some(at) => match tokio::time::timeout_at(at, reader.fill_buf()).await {
                Ok(read) => read.map_err(|_| LineError::Io)?,
                Err(_) if begun => return Err(LineError::Late),
                Err(_) => return Err(LineError::Silent),
            },
            None => reader.fill_buf().await.map_err(|_| LineError::Io)?,
        };
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some(RequestLine {
                bytes: line,
                _share: share,
            }));
        }
        let (take, ends) = match buf.iter().position(|&b| b == b'\n') {
            Some(at) => (at, true),
            None => (buf.len(), false),
        };
        if line.len() + take > limits.max {
            return Err(LineError::TooLong);
        }
        // The line has begun: it must end in time.
        if !begun {
            begun = true;
            deadline = Some(tokio::time::Instant::now() + protocol::LINE_DEADLINE);
        }
        let at = deadline.unwrap_or_else(|| tokio::time::Instant::now() + protocol::LINE_DEADLINE);
        if take > 0 {
            let wait = limits.budget.clone().acquire_many_owned(take as u32);
            let more = match tokio::time::timeout_at(at, wait).await {
                Ok(Ok(permit)) => permit,
                Ok(Err(_)) => return Err(LineError::Io),
                Err(_) => return Err(LineError::Late),
            };
            match share.as_mut() {
                Some(held) => held.merge(more),
                None => share = Some(more),
            }
        }
        // `fill_buf` again: the budget's wait borrowed nothing of it.
        let buf = reader.fill_buf().await.map_err(|_| LineError::Io)?;
        line.extend_from_slice(&buf[..take]);
        reader.consume(if ends { take + 1 } else { take });
        if ends {
            return Ok(Some(RequestLine {
                bytes: line,
                _share: share,
            }));
        }
    }
}

async fn handle_line(request_line: RequestLine, conn: &Arc<Connection>, shared: &Arc<Shared>) {
    let RequestLine {
        bytes,
        _share: share,
    } = request_line;
    let text = String::from_utf8_lossy(&bytes);
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
    drop(bytes);
    // One task per request (or batch): a long `path` never holds up a
    // `hello`.
    let Ok(permit) = conn.in_flight.clone().acquire_owned().await else {
        return;
    };
    let working = conn.activity.working();
    let (conn, shared) = (conn.clone(), shared.clone());
    tokio::spawn(async move {
        match value {
            Value::Array(batch) => answer_batch(batch, &conn, &shared).await,
            single => {
                let answered = match request_of(single) {
                    Ok(request) => {
                        let id = request.id.clone();
                        let outcome = dispatch_call(request, &conn, &shared).await;
                        id.zip(outcome).map(|(id, outcome)| answer(id, outcome))
                    }
                    Err((id, error)) => Some(answer(id, Err(error))),
                };
                if let Some(message) = answered {
                    conn.send(&message).await;
                }
            }
        }
        // The request's bytes count until its answer is queued.
        drop(share);
        drop(working);
        drop(permit);
    });
}

/// Requests one batch may hold.
const MAX_BATCH: usize = protocol::MAX_IN_FLIGHT;

/// A batch (JSON-RPC 2.0, section 6): its requests run at once and their
/// answers go out together, as one array, once all are done; notifications
/// get none, and a batch of notifications gets nothing. An empty batch, or
/// one of more than [`MAX_BATCH`], gets one `-32600`.
async fn answer_batch(batch: Vec<Value>, conn: &Arc<Connection>, shared: &Arc<Shared>) {
    if batch.is_empty() || batch.len() > MAX_BATCH {
        let error = RpcError::usage(
            protocol::INVALID_REQUEST,
            format!("a batch holds 1 to {MAX_BATCH} requests"),
        );
        conn.send(&answer(Value::Null, Err(error))).await;
        return;
    }
    let answers = batch.into_iter().map(|item| async move {
        match request_of(item) {
            Ok(request) if request.method == "subscribe" => request.id.map(|id| {
                let error = RpcError::usage(
                    protocol::INVALID_REQUEST,
                    "subscribe cannot be part of a batch: send it alone",
                );
                answer(id, Err(error))
            }),
            Ok(request) => {
                let id = request.id.clone();
                let outcome = dispatch_call(request, conn, shared).await;
                id.zip(outcome).map(|(id, outcome)| answer(id, outcome))
            }
            Err((id, error)) => Some(answer(id, Err(error))),
        }
    });
    let answers: Vec<Value> = futures_util::future::join_all(answers)
        .await
        .into_iter()
        .flatten()
        .collect();
    if !answers.is_empty() {
        conn.send(&Value::Array(answers)).await;
    }
}

/// The request in `value`, or the id and error to answer it with.
fn request_of(value: Value) -> std::result::Result<Request, (Value, RpcError)> {
    let id = value.get("id").cloned();
    if let Some(bad) = id.as_ref().filter(|id| !valid_id(id)) {
        let what = match bad {
            Value::String(_) => format!("longer than {} characters", protocol::MAX_ID_CHARS),
            _ => "neither a string nor a number".to_string(),
        };
        let error = RpcError::usage(
            protocol::INVALID_REQUEST,
            format!(
                "the request's id is {what}: an id is a string of at most {} characters, a number or null",
                protocol::MAX_ID_CHARS
            ),
        );
        return Err((Value::Null, error));
    }
    match serde_json::from_value::<Request>(value) {
        Ok(r) if r.jsonrpc == "2.0" => Ok(r),
        _ => Err((
            id.unwrap_or(Value::Null),
            RpcError::usage(
                protocol::INVALID_REQUEST,
                "not a JSON-RPC 2.0 request (jsonrpc, method, id, params)",
            ),
        )),
    }
}

/// Whether `id` is one a request may carry: a string of at most
/// [`protocol::MAX_ID_CHARS`] characters, a number, or `null`.
fn valid_id(id: &Value) -> bool {
    match id {
        Value::Null | Value::Number(_) => true,
        Value::String(s) => s.chars().count() <= protocol::MAX_ID_CHARS,
        _ => false,
    }
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

/// Methods that wait for a transfer: `$/cancelRequest` cancels them.
const CANCELLABLE: [&str; 2] = ["path", "autofill"];

/// [`dispatch`], with a call that waits for a transfer registered under its
/// id, so that `$/cancelRequest` (or the connection's end) cancels it.
async fn dispatch_call(
    request: Request,
    conn: &Arc<Connection>,
    shared: &Arc<Shared>,
) -> Option<std::result::Result<Value, RpcError>> {
    let key = request
        .id
        .as_ref()
        .filter(|_| CANCELLABLE.contains(&request.method.as_str()))
        .map(Value::to_string);
    let Some(key) = key else {
        return dispatch(request, conn, shared, &CancellationToken::new()).await;
    };
    let token = conn.closed.child_token();
    let serial = conn.next_call.fetch_add(1, Ordering::Relaxed);
    // Two calls under one id: the id names the later one.
    conn.calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key.clone(), (serial, token.clone()));
    let outcome = dispatch(request, conn, shared, &token).await;
    let mut calls = conn.calls.lock().unwrap_or_else(|p| p.into_inner());
    if calls.get(&key).is_some_and(|(s, _)| *s == serial) {
        calls.remove(&key);
    }
    outcome
}

/// Sends the events of `gem`'s resource `id` to the connection as
/// `$/progress` notifications under `token` (LSP's work-done progress),
/// until the returned token is cancelled (the call ended), then those
/// already published; the task ends once they are queued. Best effort: a
/// client that does not read them loses them, never the answer.
fn report_progress(
    service: &Resources,
    conn: &Arc<Connection>,
    token: Value,
    gem: &str,
    id: &str,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let done = conn.closed.child_token();
    let mut events = service.subscribe();
    let (conn, gem, id, stop) = (conn.clone(), gem.to_string(), id.to_string(), done.clone());
    let send = move |event: crate::Event| {
        let Ok(value) = serde_json::to_value(&event) else {
            return;
        };
        let mine = value.get("gem").and_then(Value::as_str) == Some(gem.as_str())
            && value.get("resource").and_then(Value::as_str) == Some(id.as_str());
        if mine {
            let params = json!({ "token": token, "value": value });
            conn.try_send_line(line(&notification("$/progress", params)));
        }
    };
    let sent = tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                () = stop.cancelled() => break,
            };
            match event {
                Ok(event) => send(event),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
        // The call ended: what was published before goes out.
        while let Ok(event) = events.try_recv() {
            send(event);
        }
    });
    (done, sent)
}

/// `$/cancelRequest {"id": …}`: cancels that call of this connection
/// when it is still waiting; whether there was one.
fn cancel_request(
    conn: &Connection,
    params: Option<Value>,
) -> std::result::Result<Value, RpcError> {
    let Some(id) = params
        .as_ref()
        .and_then(|p| p.get("id"))
        .filter(|id| valid_id(id))
    else {
        return Err(RpcError::usage(
            protocol::INVALID_PARAMS,
            "$/cancelRequest takes {\"id\": the id of a call of this connection}",
        ));
    };
    let token = conn
        .calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id.to_string())
        .map(|(_, token)| token.clone());
    let found = token.is_some();
    if let Some(token) = token {
        token.cancel();
    }
    Ok(json!({ "cancelled": found }))
}

/// Runs one request; `None` when it answered by itself (`subscribe`).
async fn dispatch(
    request: Request,
    conn: &Arc<Connection>,
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
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
            Ok(r)
                if r.progress
                    .as_ref()
                    .is_some_and(|t| !valid_id(t) || t.is_null()) =>
            {
                Err(RpcError::usage(
                    protocol::INVALID_PARAMS,
                    format!(
                        "params.progress: a token is a string of at most {} characters or a number",
                        protocol::MAX_ID_CHARS
                    ),
                ))
            }
            Ok(r) => {
                // The call's own events, from before it starts until it ends.
                let reporting = r
                    .progress
                    .clone()
                    .map(|token| report_progress(service, conn, token, &r.gem, &r.id));
                let outcome = service.path_until(&r.gem, &r.id, Some(cancel)).await;
                if let Some((stop, sent)) = reporting {
                    // Its last events (`verified`, `failed`) go out first.
                    stop.cancel();
                    let _ = sent.await;
                }
                ok(outcome.map(|path| PathResult {
                    gem: r.gem,
                    resource: r.id,
                    path,
                }))
            }
            Err(e) => Err(e),
        },
        "$/cancelRequest" => cancel_request(conn, p),
        "install" => match required::<InstallParams>(p) {
            Ok(InstallParams {
                gem,
                manifest,
                installed_by,
                take_over,
            }) => ok(install(service, &gem, &manifest, installed_by.as_deref(), take_over).await),
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
            Ok(a) => tokio::select! {
                outcome = autofill(service, a) => outcome,
                () = cancel.cancelled() => Err(RpcError {
                    code: protocol::REQUEST_CANCELLED,
                    message: "the call was cancelled; nothing was kept".into(),
                    data: Some(crate::api::protocol::ErrorData {
                        code: crate::ErrorCode::Cancelled,
                        primary_cause: crate::ErrorCode::Cancelled,
                        message: "the call was cancelled; nothing was kept".into(),
                        details: serde_json::Map::new(),
                    }),
                }),
            },
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
    take_over: bool,
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
    if take_over {
        service.install_taking_over(gem, &manifest, by).await
    } else {
        service.install_by(gem, &manifest, by).await
    }
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
    let working = conn.activity.working();
    let conn = conn.clone();
    tokio::spawn(async move {
        forward(events, gem, number, conn, token).await;
        drop(working);
    });
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
        if !conn.try_send_line(message) {
            if conn.closed.is_cancelled() {
                break;
            }
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
    conn.send_line(message).await;
}
