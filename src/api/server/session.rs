//! One connection's session: it reads the client's lines within their
//! limits and hands each request to [`dispatch`](super::dispatch) or a
//! batch to [`batch`](super::batch).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::batch::answer_batch;
use super::connection::{write_queue, Connection, Queued};
use super::dispatch::dispatch_call;
use super::order::{self, Turn};
use super::peers::PeerId;
use super::request::{request_of, valid_id};
use super::{Activity, Shared};
use crate::api::protocol::{self, answer, RpcError};
use crate::platform::local_socket::Duplex;

pub(super) async fn serve_connection(stream: Box<dyn Duplex>, peer: PeerId, shared: Arc<Shared>) {
    let (read, write) = tokio::io::split(stream);
    let (out, queue) = mpsc::channel::<Queued>(protocol::CONNECTION_QUEUE);
    let activity = Arc::new(Activity {
        last: Mutex::new(Instant::now()),
        busy: AtomicUsize::new(0),
        subscribed: AtomicUsize::new(0),
        peer,
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
        seat: shared.peers.seat(peer),
        greeted: AtomicBool::new(false),
        changes: order::Line::default(),
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

pub(super) enum LineError {
    TooLong,
    /// A partial line held longer than [`protocol::LINE_DEADLINE`].
    Late,
    /// Nothing at all within the first deadline.
    Silent,
    Io,
}

/// What bounds the reading of one line.
pub(super) struct LineLimits<'a> {
    /// Its most bytes.
    max: usize,
    /// The bytes all connections' lines may hold.
    budget: &'a Arc<Semaphore>,
    /// How long to wait for its first byte (for ever with `None`).
    silent_for: Option<std::time::Duration>,
}

/// A request line (without its `\n`), and its share of the bytes all
/// request lines may hold, released when the request is answered.
pub(super) struct RequestLine {
    bytes: Vec<u8>,
    _share: Option<OwnedSemaphorePermit>,
}

/// The next line, at most `limits.max` bytes, taking its bytes from the
/// budget as they arrive; `None` at the end. Once its first byte arrived
/// it must end within [`protocol::LINE_DEADLINE`].
pub(super) async fn read_line(
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

pub(super) async fn handle_line(
    request_line: RequestLine,
    conn: &Arc<Connection>,
    shared: &Arc<Shared>,
) {
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
    if !conn.greeted.load(Ordering::SeqCst) {
        if value.get("method").and_then(Value::as_str) != Some("hello") {
            return refuse_before_hello(&value, conn).await;
        }
        conn.greeted.store(true, Ordering::SeqCst);
    }
    // A batch counts as its number of requests, against the connection
    // and against its process, from now until its answer is written.
    let count = match &value {
        Value::Array(batch) => batch.len().clamp(1, protocol::MAX_IN_FLIGHT),
        _ => 1,
    } as u32;
    // A client that left gets nothing more built for it.
    let mine = tokio::select! {
        permit = conn.in_flight.clone().acquire_many_owned(count) => permit.ok(),
        () = conn.closed.cancelled() => None,
    };
    let Some(mine) = mine.filter(|_| !conn.closed.is_cancelled()) else {
        return;
    };
    let mut held = vec![mine];
    // `hello` is never kept waiting by the process's other connections.
    if value.get("method").and_then(Value::as_str) != Some("hello") {
        let peer = tokio::select! {
            permit = conn.seat.peer.clone().acquire_many_owned(count) => permit.ok(),
            () = conn.closed.cancelled() => None,
        };
        let Some(peer) = peer else {
            return;
        };
        held.push(peer);
    }
    // Calls that change the store take their turns now, in the order read.
    let turns: Vec<Option<Turn>> = match &value {
        Value::Array(batch) => batch
            .iter()
            .map(|item| order::changes(item).then(|| conn.changes.next()))
            .collect(),
        single => vec![order::changes(single).then(|| conn.changes.next())],
    };
    // One task per request (or batch): a long `path` never holds up a
    // `hello`.
    let working = conn.activity.working();
    let (conn, shared) = (conn.clone(), shared.clone());
    tokio::spawn(async move {
        match value {
            Value::Array(batch) => answer_batch(batch, turns, held, &conn, &shared).await,
            single => {
                let turn = turns.into_iter().next().flatten();
                let answered = match request_of(single) {
                    Ok(request) => {
                        let id = request.id.clone();
                        let outcome = dispatch_call(request, turn, &conn, &shared).await;
                        id.zip(outcome).map(|(id, outcome)| answer(id, outcome))
                    }
                    Err((id, error)) => Some(answer(id, Err(error))),
                };
                if let Some(message) = answered {
                    conn.send_answer(&message, held).await;
                }
            }
        }
        // The request's bytes count until its answer is queued.
        drop(share);
        drop(working);
    });
}

/// The answer to a first call other than `hello` (nothing to a
/// notification).
async fn refuse_before_hello(value: &Value, conn: &Connection) {
    let id = match value {
        Value::Array(_) => Some(Value::Null),
        one => one.get("id").cloned().filter(valid_id),
    };
    if let Some(id) = id {
        let error = RpcError::usage(
            protocol::INVALID_REQUEST,
            "hello must be a connection's first call: send {\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"hello\"} alone, then the others (see PROTOCOL.md)",
        );
        conn.send(&answer(id, Err(error))).await;
    }
}
