//! Follows the service's events while a command runs: progress bars on a
//! terminal, JSON lines with `--json`, short log lines otherwise.

use std::collections::HashMap;

use gem_resources::{Event, Resources};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::progress::Bar;
use crate::service_commands::print_event;

/// Where JSON event lines go: stdout when events are the command's output
/// (`serve`), stderr when stdout carries the command's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Events are the output.
    Stdout,
    /// Events are a side channel.
    Stderr,
}

/// A running event follower.
pub struct Watcher {
    task: JoinHandle<()>,
    stop: CancellationToken,
}

/// Starts following `service`'s events.
pub fn spawn(service: &Resources, json: bool, output: Output) -> Watcher {
    let mut events = service.subscribe();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        let mut bars: HashMap<String, Bar> = HashMap::new();
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
            follow(&mut bars, &event, json, output);
        }
        // Events already sent before the stop are still shown.
        while let Ok(event) = events.try_recv() {
            follow(&mut bars, &event, json, output);
        }
        for bar in bars.values() {
            bar.finish();
        }
    });
    Watcher { task, stop }
}

fn follow(bars: &mut HashMap<String, Bar>, event: &Event, json: bool, output: Output) {
    match event {
        Event::Started {
            gem,
            resource,
            size,
        } => {
            bars.insert(
                format!("{gem}/{resource}"),
                Bar::new(&format!("{gem}/{resource}"), *size, json),
            );
        }
        Event::Progress {
            gem,
            resource,
            bytes,
            ..
        } => {
            if let Some(bar) = bars.get(&format!("{gem}/{resource}")) {
                bar.set(*bytes);
            }
        }
        Event::Verified { gem, resource, .. } | Event::Failed { gem, resource, .. } => {
            if let Some(bar) = bars.remove(&format!("{gem}/{resource}")) {
                bar.finish();
            }
        }
        _ => {}
    }
    if json
        || !matches!(
            event,
            Event::Progress { .. } | Event::Queued { .. } | Event::Started { .. }
        )
    {
        print_event(event, json, output);
    }
}

impl Watcher {
    /// Stops following, after showing what was already sent.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}
