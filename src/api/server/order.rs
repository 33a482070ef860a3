//! The order of calls on a connection: calls that change the store apply
//! one after the other, in the order they were read; reads run side by
//! side.

use tokio::sync::oneshot;

/// Methods that change the store: each waits for the previous one of its
/// connection to be applied before it starts.
pub(super) const CHANGING: [&str; 6] = [
    "set_policy",
    "install",
    "uninstall",
    "cancel",
    "retry",
    "download_now",
];

/// Whether `value` (one request, not a batch) calls a method that changes
/// the store.
pub(super) fn changes(value: &serde_json::Value) -> bool {
    value
        .get("method")
        .and_then(serde_json::Value::as_str)
        .is_some_and(|m| CHANGING.contains(&m))
}

/// A changing call's place in its connection's line: it starts once the
/// one before has ended, and its end lets the next one start.
pub(super) struct Turn {
    before: Option<oneshot::Receiver<()>>,
    /// Dropped when the call has been applied (or abandoned).
    _done: oneshot::Sender<()>,
}

impl Turn {
    /// Waits until the changing call before this one has ended.
    pub(super) async fn wait(&mut self) {
        if let Some(before) = self.before.take() {
            // Its sender is dropped when that call ends: either outcome
            // means it has.
            let _ = before.await;
        }
    }
}

/// Hands out the turns of one connection, in the order its lines are read.
#[derive(Default)]
pub(super) struct Line {
    last: std::sync::Mutex<Option<oneshot::Receiver<()>>>,
}

impl Line {
    /// The next turn: after every turn handed out before.
    pub(super) fn next(&self) -> Turn {
        let (done, after) = oneshot::channel();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let before = last.replace(after);
        Turn {
            before,
            _done: done,
        }
    }
}
