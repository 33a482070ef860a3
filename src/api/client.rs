//! A Rust client of the local API, which the command line uses when a
//! service listens on its store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, WriteHalf};
use tokio::sync::{mpsc, oneshot};

use crate::api::discovery;
use crate::api::protocol::{RpcError, Subscribed};
use crate::error::{Error, Result};
use crate::platform::local_socket::{self, Duplex};
use crate::store::Store;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<std::result::Result<Value, RpcError>>>>>;

/// A connection to a service's local API.
pub struct Client {
    socket: String,
    writer: tokio::sync::Mutex<WriteHalf<Box<dyn Duplex>>>,
    pending: Pending,
    next_id: AtomicU64,
    notifications: Mutex<Option<mpsc::UnboundedReceiver<Value>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the service listening on `store`, when one does
    /// (`None` when none does, or its socket refuses).
    pub async fn for_store(store: &Store) -> Option<Client> {
        let file = discovery::live(store)?;
        Client::connect(&file.socket).await.ok()
    }

    /// Connects to the socket (or named pipe) `socket`.
    pub async fn connect(socket: &str) -> Result<Client> {
        let stream = local_socket::connect(socket)
            .await
            .map_err(|e| Error::Service {
                socket: socket.to_string(),
                reason: format!("cannot connect: {e}"),
            })?;
        let (read, write) = tokio::io::split(stream);
        let pending: Pending = Arc::default();
        let (events, notifications) = mpsc::unbounded_channel();
        tokio::spawn(read_loop(BufReader::new(read), pending.clone(), events));
        Ok(Client {
            socket: socket.to_string(),
            writer: tokio::sync::Mutex::new(write),
            pending,
            next_id: AtomicU64::new(1),
            notifications: Mutex::new(Some(notifications)),
        })
    }

    /// The socket it is connected to.
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// Calls `method` with `params` and reads its result as `T`; the
    /// service's errors come back as [`Error::Remote`].
    pub async fn call<T: DeserializeOwned>(&self, method: &str, params: Value) -> Result<T> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let mut text = request.to_string();
        text.push('\n');
        let lost = |reason: String| Error::Service {
            socket: self.socket.clone(),
            reason,
        };
        {
            let mut writer = self.writer.lock().await;
            writer
                .write_all(text.as_bytes())
                .await
                .map_err(|e| lost(format!("cannot send {method}: {e}")))?;
        }
        let value = match rx.await {
            Ok(Ok(value)) => value,
            Ok(Err(error)) => return Err(error.into_error()),
            Err(_) => {
                return Err(lost(format!(
                    "the connection closed before {method} was answered"
                )))
            }
        };
        serde_json::from_value(value)
            .map_err(|e| lost(format!("cannot read the answer to {method}: {e}")))
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
    // Pending calls fail: their senders are dropped.
    pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
}
