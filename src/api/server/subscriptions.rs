//! `subscribe`: the events forwarded to a connection until it ends or
//! falls behind.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::connection::{line, Connection};
use super::fanout::{self, Item};
use super::request::ok;
use super::Shared;
use crate::api::protocol::{self, answer, notification, RpcError, Subscribed};

pub(super) async fn subscribe(
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
    // The events first, then the status: nothing falls between (an event
    // may repeat what the status shows). Once the service has shut down,
    // the subscription ends at once.
    let events = match shared.events.upgrade() {
        Some(sender) => sender.subscribe(),
        None => broadcast::channel(1).1,
    };
    let status = match shared.service.status(gem.as_deref()) {
        Ok(status) => status,
        Err(crate::Error::NotFound(_)) if gem.is_some() => Vec::new(),
        Err(e) => return Some(Err(RpcError::of(&e))),
    };
    let number = conn.next_subscription.fetch_add(1, Ordering::Relaxed);
    let token = CancellationToken::new();
    conn.subscriptions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(number, token.clone());
    // Counted against the process and the service: the oldest past either
    // cap ends with `lagged`.
    let evict = CancellationToken::new();
    let ticket = shared.peers.subscribe(conn.activity.peer, evict.clone());
    // The answer goes out before the first event.
    if let Some(id) = id {
        let result = ok(Ok(Subscribed {
            subscription: number,
            status,
        }));
        conn.send(&answer(id, result)).await;
    }
    let working = conn.activity.subscribed();
    let conn = conn.clone();
    tokio::spawn(async move {
        forward(events, gem, number, conn, token, evict).await;
        drop(ticket);
        drop(working);
    });
    None
}

/// Sends a subscription's events until it ends, the service closes, or
/// the client falls behind (`lagged`).
pub(super) async fn forward(
    mut events: broadcast::Receiver<Arc<Item>>,
    gem: Option<String>,
    number: u64,
    conn: Arc<Connection>,
    token: CancellationToken,
    evict: CancellationToken,
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
            () = evict.cancelled() => {
                // A newer subscription took its place: the client is told,
                // as when it falls behind.
                send_or_close(&conn, lagged(0)).await;
                break;
            }
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
        let (of, rest) = match event.as_ref() {
            Item::Event { gem, rest } => (gem, rest),
            Item::Lagged(missed) => {
                send_or_close(&conn, lagged(*missed)).await;
                break;
            }
        };
        if let (Some(want), Some(of)) = (&gem, of) {
            if want != of {
                continue;
            }
        }
        // Which subscription it is for, when a connection holds several.
        let message = fanout::line(number, rest);
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
pub(super) async fn send_or_close(conn: &Connection, message: String) {
    conn.send_line(message).await;
}
