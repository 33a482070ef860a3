//! One client's connection: its lines, its queue and its limits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::order;
use super::peers::Seat;
use super::Activity;
use crate::api::protocol;
use crate::platform::local_socket::Duplex;

/// One client's connection.
pub(super) struct Connection {
    pub(super) out: mpsc::Sender<Queued>,
    /// The bytes that may wait in `out` ([`protocol::CONNECTION_QUEUE_BYTES`]).
    pub(super) out_bytes: Arc<Semaphore>,
    pub(super) subscriptions: Mutex<HashMap<u64, CancellationToken>>,
    pub(super) next_subscription: AtomicU64,
    pub(super) in_flight: Arc<Semaphore>,
    pub(super) closed: CancellationToken,
    pub(super) activity: Arc<Activity>,
    /// The calls in flight that `$/cancelRequest` (or the connection's
    /// end) can cancel, by their id's JSON text.
    pub(super) calls: Mutex<HashMap<String, (u64, CancellationToken)>>,
    pub(super) next_call: AtomicU64,
    /// Its place among its process's connections (the process's requests
    /// in flight).
    pub(super) seat: Seat,
    /// Whether its first call, `hello`, was read.
    pub(super) greeted: AtomicBool,
    /// The turns of its calls that change the store.
    pub(super) changes: order::Line,
}

/// A line waiting to be written, its share of the queue's bytes, and the
/// permits of the requests it answers: all are released once it is
/// written to the socket.
pub(super) type Queued = (String, OwnedSemaphorePermit, Held);

/// The permits of the requests an answer is for (the connection's and its
/// process's requests in flight).
pub(super) type Held = Vec<OwnedSemaphorePermit>;

impl Connection {
    /// The client is gone: its subscriptions end, and the calls in flight,
    /// which nobody is left to read, are cancelled.
    pub(super) fn end(&self) {
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
    pub(super) async fn send(&self, message: &Value) {
        self.send_line(line(message)).await;
    }

    /// [`Connection::send`] of the answer to requests whose permits are
    /// `held`: they are released once it is written.
    pub(super) async fn send_answer(&self, message: &Value, held: Held) {
        self.send_line_holding(line(message), held).await;
    }

    pub(super) async fn send_line(&self, text: String) {
        self.send_line_holding(text, Vec::new()).await;
    }

    async fn send_line_holding(&self, text: String, held: Held) {
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
            _ = self.out.send((text, permit, held)) => {}
            () = self.closed.cancelled() => {}
        }
    }

    /// Queues `text` only if there is room now.
    pub(super) fn try_send_line(&self, text: String) -> bool {
        let Ok(permit) = self
            .out_bytes
            .clone()
            .try_acquire_many_owned(queue_share(&text))
        else {
            return false;
        };
        self.out.try_send((text, permit, Vec::new())).is_ok()
    }
}

/// The queue bytes a line takes (a line longer than the whole queue takes
/// all of it).
pub(super) fn queue_share(text: &str) -> u32 {
    text.len().clamp(1, protocol::CONNECTION_QUEUE_BYTES) as u32
}

pub(super) fn line(message: &Value) -> String {
    let mut text = message.to_string();
    text.push('\n');
    text
}

/// Writes the connection's queue until it ends or `closed` fires; a client
/// that does not read for [`protocol::WRITE_DEADLINE`] is gone.
pub(super) async fn write_queue(
    mut write: tokio::io::WriteHalf<Box<dyn Duplex>>,
    mut queue: mpsc::Receiver<Queued>,
    closed: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            next = queue.recv() => next,
            () = closed.cancelled() => None,
        };
        let Some((text, _share, _held)) = next else {
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
