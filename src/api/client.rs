//! A Rust client of the local API, which the command line uses when a
//! service listens on its store, and a second instance of an app uses to
//! share the first one's service.
//!
//! [`Client::for_store`] talks only to the store's own service: it checks
//! the socket and the process at the other end before it sends a byte, then
//! has the service prove with `hello` that it holds the secret of the
//! store's `service.json` (see [`crate::api::discovery`]). Connecting and
//! `hello` are bounded by [`CONNECT_TIMEOUT`], and every call that does not
//! wait for a download by [`ANSWER_TIMEOUT`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, WriteHalf};
use tokio::sync::{mpsc, oneshot};

use crate::api::discovery::{self, ServiceFile};
use crate::api::protocol::{
    Hello, PathResult, PolicyBody, RpcError, StatusResult, Subscribed, UninstallResult, PROTOCOL,
};
use crate::error::{Error, Result};
use crate::net::policy::Policy;
use crate::platform::local_socket::{self, Duplex};
use crate::service::{InstallReport, PolicyChange};
use crate::store::Store;

/// How long connecting to a service and its `hello` may take together.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a call waits for its answer, except those that wait for a
/// download or a transfer (`path`, `autofill`), which wait as long as it
/// runs.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The answer timeout of `method`: none for a call that waits for a
/// download or a transfer.
fn answer_timeout(method: &str) -> Option<Duration> {
    match method {
        "path" | "autofill" => None,
        _ => Some(ANSWER_TIMEOUT),
    }
}

type Pending = Arc<Mutex<Calls>>;

/// The calls waiting for their answers, and whether the connection's
/// reader ended: a call sent after that would wait for ever, and fails at
/// once instead.
#[derive(Default)]
struct Calls {
    waiting: HashMap<u64, oneshot::Sender<std::result::Result<Value, RpcError>>>,
    ended: bool,
}

/// Where the answer to one call comes.
type Answer = oneshot::Receiver<std::result::Result<Value, RpcError>>;

/// A connection to a service's local API.
pub struct Client {
    socket: String,
    writer: tokio::sync::Mutex<WriteHalf<Box<dyn Duplex>>>,
    pending: Pending,
    next_id: AtomicU64,
    notifications: Mutex<Option<mpsc::UnboundedReceiver<Value>>>,
    /// Reads the answers and notifications; holds the socket's read half.
    reader: tokio::task::AbortHandle,
    /// Cancelled once the connection has closed (its reader ended).
    closed: tokio_util::sync::CancellationToken,
}

/// How a call ended, as [`Client::request`] tells it: answered, or cut
/// off by the connection's end.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The service answered: its result, or its error as it sent it.
    Answered(std::result::Result<Value, RpcError>),
    /// The connection was lost before the answer came (or before the
    /// request could be sent): the service went away, or closed it.
    Lost(String),
}

/// A dropped client closes its connection: the reader holds the socket's
/// other half, and would keep it open (here and in the service) until the
/// service closed it.
impl Drop for Client {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the service listening on `store`, when one does and it
    /// proves it is the store's own (`None` when none does, or it refuses
    /// or fails the checks: a warning says why).
    ///
    /// `store` is the store of the configuration the service runs with:
    /// `Store::open(&config.store_dir())` (the configured `store`, or the
    /// default one; it makes the folder when missing). A process that runs
    /// the service already has it, [`Resources::store`](crate::Resources::store).
    ///
    /// ```no_run
    /// # async fn run(config: gem_resources::Config) -> gem_resources::Result<()> {
    /// use gem_resources::{api::Client, Store};
    ///
    /// let store = Store::open(&config.store_dir())?;
    /// if let Some(client) = Client::for_store(&store).await {
    ///     let status = client.status(None).await?;
    /// #   let _ = status;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn for_store(store: &Store) -> Option<Client> {
        match Client::for_store_checked(store).await {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!("not using the service: {e}");
                None
            }
        }
    }

    /// [`Client::for_store`], saying why a service that `service.json`
    /// names was not used (`E_RESOURCE_SERVICE`); `Ok(None)` when no
    /// service listens.
    pub async fn for_store_checked(store: &Store) -> Result<Option<Client>> {
        let Some(file) = discovery::live(store) else {
            return Ok(None);
        };
        Client::connect_to(&file).await.map(Some)
    }

    /// Connects to the service `file` describes (a store's
    /// `service.json`) and checks it: the socket and its folder are the
    /// user's own, the process at the other end is the user's and the one
    /// the file names, and its `hello` proves it holds the file's secret.
    /// Nothing but `hello` is sent before.
    pub async fn connect_to(file: &ServiceFile) -> Result<Client> {
        let socket = file.socket.as_str();
        let fail = |reason: String| Error::Service {
            socket: socket.to_string(),
            reason,
        };
        if file.secret.is_empty() {
            return Err(fail(
                "its service.json holds no secret (a service of an earlier version): not trusted; restart it".into(),
            ));
        }
        let connect = async {
            let client = Client::open(socket, Some(file.pid)).await?;
            let nonce = discovery::random_hex()?;
            let hello: Hello = client
                .call_within("hello", json!({ "nonce": nonce }), None)
                .await?;
            let proved = hello
                .proof
                .as_deref()
                .is_some_and(|p| discovery::proves(&file.secret, &nonce, p));
            if !proved {
                return Err(fail(
                    "it did not prove that it holds the store's secret (service.json): not the store's service, nothing sent".into(),
                ));
            }
            if hello.pid != file.pid {
                return Err(fail(format!(
                    "it is process {}, not the service {} that service.json names",
                    hello.pid, file.pid
                )));
            }
            if hello.protocol != PROTOCOL {
                return Err(fail(format!(
                    "it speaks protocol {}, this client {PROTOCOL}",
                    hello.protocol
                )));
            }
            Ok(client)
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(outcome) => outcome,
            Err(_) => Err(fail(format!(
                "no answer to hello within {} s",
                CONNECT_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Connects to the socket (or named pipe) `socket`, named by the
    /// caller rather than by a store's `service.json`: the socket, its
    /// folder and the process at the other end must be the user's own
    /// (where the platform says), but no secret is checked. It says `hello`
    /// at once (the service closes a connection silent for 10 s).
    pub async fn connect(socket: &str) -> Result<Client> {
        // `hello` at once: a connection that says nothing for 10 s is
        // closed by the service.
        let connect = async {
            let client = Client::open(socket, None).await?;
            client
                .call_within::<Hello>("hello", json!({}), None)
                .await?;
            Ok(client)
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Error::Service {
                socket: socket.to_string(),
                reason: format!("cannot connect within {} s", CONNECT_TIMEOUT.as_secs()),
            }),
        }
    }

    async fn open(socket: &str, pid: Option<u32>) -> Result<Client> {
        let stream = local_socket::connect(socket, pid)
            .await
            .map_err(|e| Error::Service {
                socket: socket.to_string(),
                reason: format!("cannot connect: {e}"),
            })?;
        let (read, write) = tokio::io::split(stream);
        let pending: Pending = Arc::default();
        let (events, notifications) = mpsc::unbounded_channel();
        let closed = tokio_util::sync::CancellationToken::new();
        let reading = read_loop(BufReader::new(read), pending.clone(), events);
        let done = closed.clone();
        let reader = tokio::spawn(async move {
            reading.await;
            done.cancel();
        })
        .abort_handle();
        Ok(Client {
            socket: socket.to_string(),
            writer: tokio::sync::Mutex::new(write),
            pending,
            next_id: AtomicU64::new(1),
            notifications: Mutex::new(Some(notifications)),
            reader,
            closed,
        })
    }

    /// The socket it is connected to.
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// Resolves once the connection has closed: the service went away
    /// (it stopped, or its process ended however it ended) or closed it.
    pub async fn closed(&self) {
        self.closed.cancelled().await;
    }

    /// Whether the connection has closed ([`Client::closed`]).
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Sends `method` and waits for its answer as the service sent it
    /// ([`Reply::Answered`]) or for the connection's end
    /// ([`Reply::Lost`]); `Err` only when no answer came within the
    /// method's [`ANSWER_TIMEOUT`] while the connection stayed open.
    pub(crate) async fn request(&self, method: &str, params: Value) -> Result<Reply> {
        let (id, rx) = match self.send(method, params).await {
            Ok(sent) => sent,
            Err(e) => return Ok(Reply::Lost(e.to_string())),
        };
        let limit = answer_timeout(method);
        let answered = match limit {
            None => Ok(rx.await),
            Some(limit) => tokio::time::timeout(limit, rx).await,
        };
        match answered {
            Ok(Ok(outcome)) => Ok(Reply::Answered(outcome)),
            Ok(Err(_)) => Ok(Reply::Lost(format!(
                "the connection closed before {method} was answered"
            ))),
            Err(_) => {
                self.pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .waiting
                    .remove(&id);
                Err(Error::Service {
                    socket: self.socket.clone(),
                    reason: format!(
                        "no answer to {method} within {} s",
                        limit.map_or(0, |l| l.as_secs())
                    ),
                })
            }
        }
    }

    /// Calls `method` with `params` and reads its result as `T`; the
    /// service's errors come back as [`Error::Remote`]. A call that does
    /// not wait for a download fails after [`ANSWER_TIMEOUT`] without an
    /// answer (`E_RESOURCE_SERVICE`).
    pub async fn call<T: DeserializeOwned>(&self, method: &str, params: Value) -> Result<T> {
        self.call_within(method, params, answer_timeout(method))
            .await
    }

    /// [`Client::call`] waiting at most `limit` for the answer (for ever
    /// with `None`).
    pub async fn call_within<T: DeserializeOwned>(
        &self,
        method: &str,
        params: Value,
        limit: Option<Duration>,
    ) -> Result<T> {
        let (id, rx) = self.send(method, params).await?;
        let answered = match limit {
            None => Ok(rx.await),
            Some(limit) => tokio::time::timeout(limit, rx).await,
        };
        self.answer(method, id, answered, limit, false)
    }

    /// [`Client::call`] of a call that waits for a transfer (`path`,
    /// `autofill`), which `cancel` cancels: the service is then sent
    /// `$/cancelRequest`, and its answer to the call comes back as the
    /// result: [`Error::Remote`] with `E_RESOURCE_CANCELLED`, whose
    /// `download` says whether the download goes on (`continues`) or
    /// stopped (`stopped`, its bytes kept). The service has
    /// [`CONNECT_TIMEOUT`] to answer once cancelled.
    pub async fn call_until<T: DeserializeOwned>(
        &self,
        method: &str,
        params: Value,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<T> {
        let (id, mut rx) = self.send(method, params).await?;
        let answered = tokio::select! {
            answered = &mut rx => Ok(answered),
            () = cancel.cancelled() => {
                let request = json!({ "jsonrpc": "2.0", "method": "$/cancelRequest", "params": { "id": id } });
                let _ = self.write_line(&request).await;
                tokio::time::timeout(CONNECT_TIMEOUT, rx).await
            }
        };
        self.answer(
            method,
            id,
            answered,
            Some(CONNECT_TIMEOUT),
            cancel.is_cancelled(),
        )
    }

    /// Sends a request for `method`; its id and where its answer comes.
    async fn send(&self, method: &str, params: Value) -> Result<(u64, Answer)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut calls = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            // The reader saw the connection's end: nothing would ever
            // answer (the service stopped as the call was being sent).
            if calls.ended {
                return Err(Error::Service {
                    socket: self.socket.clone(),
                    reason: format!("the connection closed before {method} was sent"),
                });
            }
            calls.waiting.insert(id, tx);
        }
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        self.write_line(&request)
            .await
            .map_err(|e| Error::Service {
                socket: self.socket.clone(),
                reason: format!("cannot send {method}: {e}"),
            })?;
        Ok((id, rx))
    }

    async fn write_line(&self, message: &Value) -> std::io::Result<()> {
        let mut text = message.to_string();
        text.push('\n');
        let mut writer = self.writer.lock().await;
        writer.write_all(text.as_bytes()).await
    }

    /// The answer to call `id` of `method`, as `T`; `cancelled_here`: this
    /// client cancelled it (`$/cancelRequest`).
    fn answer<T: DeserializeOwned>(
        &self,
        method: &str,
        id: u64,
        answered: std::result::Result<
            std::result::Result<std::result::Result<Value, RpcError>, oneshot::error::RecvError>,
            tokio::time::error::Elapsed,
        >,
        limit: Option<Duration>,
        cancelled_here: bool,
    ) -> Result<T> {
        let lost = |reason: String| Error::Service {
            socket: self.socket.clone(),
            reason,
        };
        let value = match answered {
            Ok(Ok(Ok(value))) => value,
            // A call this client did not cancel, cancelled by the service:
            // it is stopping and closing its connections.
            Ok(Ok(Err(error)))
                if error.code == crate::api::protocol::REQUEST_CANCELLED && !cancelled_here =>
            {
                return Err(lost(format!(
                    "the service stopped before {method} was answered (the bytes it had are kept for the next try)"
                )))
            }
            Ok(Ok(Err(error))) => return Err(error.into_error()),
            Ok(Err(_)) => {
                return Err(lost(format!(
                    "the connection closed before {method} was answered"
                )))
            }
            Err(_) => {
                self.pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .waiting
                    .remove(&id);
                return Err(lost(format!(
                    "no answer to {method} within {} s",
                    limit.map_or(0, |l| l.as_secs())
                )));
            }
        };
        serde_json::from_value(value)
            .map_err(|e| lost(format!("cannot read the answer to {method}: {e}")))
    }

    /// `hello`: the service's protocol, version, store and process.
    pub async fn hello(&self) -> Result<Hello> {
        self.call("hello", json!({})).await
    }

    /// Every installed gem's status (or `gem`'s), as `status --json`.
    pub async fn status(&self, gem: Option<&str>) -> Result<StatusResult> {
        self.call("status", json!({ "gem": gem })).await
    }

    /// The local path of `gem`'s resource `id`, downloaded first by the
    /// service when missing (waits as long as the download runs).
    pub async fn path(&self, gem: &str, id: &str) -> Result<std::path::PathBuf> {
        let result: PathResult = self.call("path", json!({ "gem": gem, "id": id })).await?;
        Ok(result.path)
    }

    /// [`Client::path`] that `cancel` cancels (see [`Client::call_until`]).
    pub async fn path_until(
        &self,
        gem: &str,
        id: &str,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<std::path::PathBuf> {
        let params = json!({ "gem": gem, "id": id });
        let result: PathResult = self.call_until("path", params, cancel).await?;
        Ok(result.path)
    }

    /// Installs (or upgrades) `gem` from the manifest file `manifest`,
    /// recorded as installed through the API; required files then
    /// download in the service.
    pub async fn install(&self, gem: &str, manifest: &Path) -> Result<InstallReport> {
        let bytes = std::fs::read(manifest)
            .map_err(|e| Error::io("cannot read the manifest", manifest, e))?;
        let manifest: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Invalid(format!("{}: not JSON: {e}", manifest.display())))?;
        self.call("install", json!({ "gem": gem, "manifest": manifest }))
            .await
    }

    /// Uninstalls `gem`.
    pub async fn uninstall(&self, gem: &str) -> Result<UninstallResult> {
        self.call("uninstall", json!({ "gem": gem })).await
    }

    /// The service's network policy.
    pub async fn policy(&self) -> Result<Policy> {
        let body: PolicyBody = self.call("policy", json!({})).await?;
        Ok(Policy::new(body.mode, &body.hosts)?)
    }

    /// Sets the network policy of every process on the store.
    pub async fn set_policy(&self, policy: &Policy) -> Result<PolicyChange> {
        self.call("set_policy", json!(PolicyBody::from(policy)))
            .await
    }

    /// Subscribes to events (of `gem`, or all): the starting status, and
    /// the notifications (`{"method": "event" | "lagged", "params": …}`)
    /// as they come. Only the first subscription of a client gets the
    /// receiver.
    pub async fn subscribe(
        &self,
        gem: Option<&str>,
    ) -> Result<(Subscribed, mpsc::UnboundedReceiver<Value>)> {
        let receiver = self
            .notifications
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| Error::Usage("this client already subscribed".into()))?;
        let subscribed = self.call("subscribe", json!({ "gem": gem })).await?;
        Ok((subscribed, receiver))
    }
}

async fn read_loop(
    mut reader: BufReader<tokio::io::ReadHalf<Box<dyn Duplex>>>,
    pending: Pending,
    events: mpsc::UnboundedSender<Value>,
) {
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Ok(value) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        match value.get("id").and_then(Value::as_u64) {
            Some(id) => {
                let waiter = pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .waiting
                    .remove(&id);
                if let Some(waiter) = waiter {
                    let outcome =
                        match value.get("error") {
                            Some(error) => Err(serde_json::from_value(error.clone())
                                .unwrap_or_else(|_| RpcError {
                                    code: crate::api::protocol::SERVICE_ERROR,
                                    message: error.to_string(),
                                    data: None,
                                })),
                            None => Ok(value.get("result").cloned().unwrap_or(Value::Null)),
                        };
                    let _ = waiter.send(outcome);
                }
            }
            None if value.get("method").is_some() => {
                let _ = events.send(value);
            }
            None => {}
        }
    }
    // Pending calls fail: their senders are dropped; later ones fail as
    // they are sent.
    let mut calls = pending.lock().unwrap_or_else(|p| p.into_inner());
    calls.ended = true;
    calls.waiting.clear();
}
