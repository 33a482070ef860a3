//! Follows the service's events while a command runs: progress bars on a
//! terminal, JSON lines with `--json`, short log lines otherwise.

use std::collections::{HashMap, HashSet};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use gem_resources::{Event, Resources};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use serde_json::json;

use crate::progress::Bar;
use crate::render::{self, print_json};

/// Where JSON event lines go: stdout when events are the command's output
/// (`serve`), stderr when stdout carries the command's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Events are the output.
    Stdout,
    /// Events are a side channel.
    Stderr,
}

/// Shortest time between two progress lines of one transfer in JSON output.
const PROGRESS_LINE_EVERY: Duration = Duration::from_millis(250);

/// A running event follower.
pub struct Watcher {
    task: JoinHandle<()>,
    stop: CancellationToken,
}

/// What a follower shows.
#[derive(Debug, Clone, Copy)]
pub struct Show {
    /// JSON lines instead of bars and text.
    pub json: bool,
    /// Where JSON lines go.
    pub output: Output,
    /// Whether a failed download gets a text line. Off for a command whose
    /// own result reports the failure (`path`), so it is printed once.
    pub failures: bool,
}

/// Bars and JSON-line throttling of the transfers being followed.
#[derive(Default)]
struct Transfers {
    bars: HashMap<String, Bar>,
    last_line: HashMap<String, Instant>,
    /// Transfers whose bar carries a note (a retry), cleared by the next
    /// bytes.
    noted: HashSet<String>,
}

/// Whether bars are drawn (stderr is a terminal and JSON is off): a note
/// then goes on the bar rather than on a line of its own.
fn bars_drawn(json: bool) -> bool {
    !json && std::io::stderr().is_terminal()
}

/// Starts following `service`'s events.
pub fn spawn(service: &Resources, json: bool, output: Output) -> Watcher {
    spawn_with(
        service,
        Show {
            json,
            output,
            failures: true,
        },
    )
}

/// Starts following `service`'s events, showing what `show` says.
pub fn spawn_with(service: &Resources, show: Show) -> Watcher {
    let mut events = service.subscribe();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        let mut bars = Transfers::default();
        loop {
            let event = tokio::select! {
                biased;
                e = events.recv() => e,
                () = token.cancelled() => break,
            };
            let event = match event {
                Ok(e) => e,
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => break,
            };
            follow(&mut bars, &event, show);
        }
        // Events already sent before the stop are still shown.
        while let Ok(event) = events.try_recv() {
            follow(&mut bars, &event, show);
        }
        // Dropping the bars clears them.
    });
    Watcher { task, stop }
}

/// Follows the events a service sends through its local API (the
/// notifications of a subscription), as [`spawn_with`] follows those of a
/// service in this process.
pub fn spawn_remote(
    notifications: tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
    show: Show,
) -> Watcher {
    spawn_remote_for(notifications, show, None)
}

/// [`spawn_remote`], showing only the events of the resource `only` (its
/// id) when given: `path` shows its own file, not the gem's others.
pub fn spawn_remote_for(
    mut notifications: tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
    show: Show,
    only: Option<String>,
) -> Watcher {
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        let mut bars = Transfers::default();
        let mut show_one = |message: serde_json::Value| {
            if message.get("method").and_then(|m| m.as_str()) != Some("event") {
                return;
            }
            let mut params = message.get("params").cloned().unwrap_or_default();
            if let Some(only) = &only {
                if params.get("resource").and_then(|r| r.as_str()) != Some(only.as_str()) {
                    return;
                }
            }
            if let Some(fields) = params.as_object_mut() {
                fields.remove("subscription");
            }
            if let Ok(event) = serde_json::from_value::<Event>(params) {
                follow(&mut bars, &event, show);
            }
        };
        loop {
            let message = tokio::select! {
                biased;
                m = notifications.recv() => m,
                () = token.cancelled() => break,
            };
            match message {
                Some(m) => show_one(m),
                None => break,
            }
        }
        while let Ok(message) = notifications.try_recv() {
            show_one(message);
        }
    });
    Watcher { task, stop }
}

fn follow(transfers: &mut Transfers, event: &Event, show: Show) {
    let json = show.json;
    match event {
        Event::Started {
            gem,
            resource,
            size,
            ..
        } => {
            let key = format!("{gem}/{resource}");
            let bar = Bar::new(&key, Some(*size), json);
            bar.set_note("connected, waiting for the response");
            transfers.noted.insert(key.clone());
            transfers.bars.insert(key, bar);
        }
        Event::Resumed {
            gem,
            resource,
            offset,
            ..
        } => {
            let key = format!("{gem}/{resource}");
            if let Some(bar) = transfers.bars.get(&key) {
                // The rate counts this run's bytes only; the bar says so.
                bar.resumed_at(*offset);
                transfers.noted.remove(&key);
            }
        }
        Event::Progress {
            gem,
            resource,
            bytes,
            size,
            ..
        } => {
            let key = format!("{gem}/{resource}");
            if let Some(bar) = transfers.bars.get(&key) {
                bar.set(*bytes);
                if transfers.noted.remove(&key) {
                    bar.set_note("");
                }
            }
            // At most one JSON line per transfer every 250 ms, and the last.
            let now = Instant::now();
            let due = transfers
                .last_line
                .get(&key)
                .is_none_or(|t| now.duration_since(*t) >= PROGRESS_LINE_EVERY);
            if !(due || bytes == size) {
                return;
            }
            transfers.last_line.insert(key, now);
        }
        Event::Verified { gem, resource, .. }
        | Event::Failed { gem, resource, .. }
        | Event::Cancelled { gem, resource, .. } => {
            let key = format!("{gem}/{resource}");
            // Dropping the bar clears it.
            transfers.bars.remove(&key);
            transfers.last_line.remove(&key);
            transfers.noted.remove(&key);
        }
        Event::Retrying {
            gem,
            resource,
            attempt,
            of,
            wait_ms,
            reason,
            ..
        } if bars_drawn(json) => {
            let key = format!("{gem}/{resource}");
            if let Some(bar) = transfers.bars.get(&key) {
                let wait = Duration::from_millis(*wait_ms);
                bar.set_retry(wait, *attempt, *of, reason);
                transfers.noted.insert(key);
                // On the bar, not on a line of its own.
                return;
            }
        }
        _ => {}
    }
    if !json && !show.failures && matches!(event, Event::Failed { .. }) {
        return;
    }
    if json
        || !matches!(
            event,
            Event::Progress { .. } | Event::Queued { .. } | Event::Started { .. }
        )
    {
        print_event(event, json, show.output);
    }
}

impl Watcher {
    /// Stops following, after showing what was already sent.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Renders one event: a JSON line, or a log line on stderr.
pub fn print_event(event: &Event, json: bool, output: Output) {
    if !json && crate::progress::quiet() && !matches!(event, Event::Failed { .. }) {
        return;
    }
    if json {
        match output {
            Output::Stdout => print_json(&json!(event)),
            Output::Stderr => render::write_err_exact(format_args!("{}", json!(event))),
        }
        return;
    }
    match event {
        Event::Verified {
            gem,
            resource,
            path,
            ..
        } => {
            crate::errln!("verified {gem}/{resource}: {}", path.display())
        }
        Event::Failed { code, message, .. } => {
            crate::errln!("{}", render::failure_text(*code, message))
        }
        Event::Deleted {
            sha256,
            gem,
            resource,
            ..
        } => match (gem, resource) {
            (Some(gem), Some(resource)) => crate::errln!(
                "deleted {gem}/{resource} ({}…)",
                sha256.get(..12).unwrap_or(sha256)
            ),
            _ => crate::errln!(
                "deleted {}… (declared by no installed gem)",
                sha256.get(..12).unwrap_or(sha256)
            ),
        },
        Event::Retrying {
            gem,
            resource,
            attempt,
            of,
            wait_ms,
            reason,
            ..
        } => {
            let wait = Duration::from_millis(*wait_ms);
            let note = crate::progress::retry_note(wait, *attempt, *of, reason);
            crate::errln!("{gem}/{resource}: {note}");
        }
        Event::Waiting {
            gem, resource, on, ..
        } => {
            let note = crate::progress::waiting_note(on.as_deref());
            crate::errln!("{gem}/{resource}: {note}")
        }
        Event::FellBack {
            gem,
            resource,
            from,
            hop,
            to,
            code,
            reason,
            ..
        } => {
            let label = format!("{gem}/{resource}");
            let failed = crate::progress::Failed {
                from,
                hop: hop.as_deref(),
                code: code.as_str(),
                reason,
            };
            let line = crate::progress::fallback_warning(&label, &failed, to);
            crate::errln!("{line}");
        }
        _ => {}
    }
}
