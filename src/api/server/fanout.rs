//! The service's events, each written as JSON once for every subscriber:
//! one task reads them from the service and hands each subscription the
//! same text, which it only prefixes with its number.

use std::sync::Arc;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::service::Resources;

/// One event as every subscriber gets it.
pub(super) enum Item {
    /// An event: its gem, if any, and its JSON object without the opening
    /// brace (`"at":…,"event":…}`).
    Event { gem: Option<String>, rest: String },
    /// The reader fell behind the service by this many events: every
    /// subscription is told, as when it falls behind itself.
    Lagged(u64),
}

/// Starts the task that reads the service's events until `stop` or the
/// service's shutdown; a weak sender, from which each subscription takes a
/// receiver while the task runs (its end closes them all). Each receiver
/// buffers as many events as a subscriber of the service does.
pub(super) fn start(
    service: &Resources,
    stop: CancellationToken,
) -> broadcast::WeakSender<Arc<Item>> {
    let (out, _) = broadcast::channel(service.event_buffer());
    let mut events = service.subscribe();
    let sender = out.downgrade();
    service.handle().spawn(async move {
        loop {
            let next = tokio::select! {
                next = events.recv() => next,
                () = stop.cancelled() => break,
            };
            let item = match next {
                Ok(event) => match of(&event) {
                    Some(item) => item,
                    None => continue,
                },
                Err(broadcast::error::RecvError::Lagged(missed)) => Item::Lagged(missed),
                Err(broadcast::error::RecvError::Closed) => break,
            };
            // No subscriber is not an error.
            let _ = out.send(Arc::new(item));
        }
        // Dropping the last sender closes every subscription's receiver.
    });
    sender
}

/// An event as [`Item::Event`]; `None` if it cannot be written.
fn of(event: &crate::Event) -> Option<Item> {
    let value = serde_json::to_value(event).ok()?;
    let gem = value
        .get("gem")
        .and_then(|g| g.as_str())
        .map(str::to_string);
    let text = value.to_string();
    let rest = text.strip_prefix('{')?.to_string();
    // An object with no field at all has nothing to follow a comma.
    (rest != "}").then_some(Item::Event { gem, rest })
}

/// The `event` notification of subscription `number` for an event whose
/// JSON object, without its opening brace, is `rest`; one line.
pub(super) fn line(number: u64, rest: &str) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"method\":\"event\",\"params\":{{\"subscription\":{number},{rest}}}\n")
}
