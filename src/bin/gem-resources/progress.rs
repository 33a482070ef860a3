//! Progress bars on a terminal; nothing otherwise.
//!
//! Every bar lives in one [`MultiProgress`], and every line the program
//! writes to stderr (messages and log lines) goes through it, so a line
//! printed while bars are drawn appears above them instead of leaving a
//! frozen copy of a bar behind. A bar is cleared when its transfer ends,
//! however it ends ([`Bar`] clears itself when dropped), and [`clear_all`]
//! clears whatever is left on Ctrl-C.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bars on screen, created at the first bar.
static BARS: OnceLock<MultiProgress> = OnceLock::new();

/// Every bar that was drawn and not yet cleared, for [`clear_all`].
static LIVE: Mutex<Vec<(u64, ProgressBar)>> = Mutex::new(Vec::new());

/// Identifies bars in [`LIVE`].
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn multi() -> &'static MultiProgress {
    BARS.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
}

/// Runs `write` with the bars hidden, so that what it writes to stderr
/// stays on screen above them.
pub fn suspend<R>(write: impl FnOnce() -> R) -> R {
    match BARS.get() {
        Some(bars) => bars.suspend(write),
        None => write(),
    }
}

/// Clears every bar still on screen (on Ctrl-C, before the last message).
pub fn clear_all() {
    let live = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|p| p.into_inner()));
    for (_, bar) in live {
        bar.finish_and_clear();
    }
    if let Some(bars) = BARS.get() {
        let _ = bars.clear();
    }
}

/// A progress bar for one transfer, drawn only when stderr is a terminal
/// and JSON output is off.
pub struct Bar {
    bar: Option<(u64, ProgressBar)>,
}

impl Bar {
    /// A bar for `label` of `size` bytes (`None`: unknown size).
    pub fn new(label: &str, size: Option<u64>, json: bool) -> Bar {
        if json || !std::io::stderr().is_terminal() {
            return Bar { bar: None };
        }
        let bar = multi().add(ProgressBar::new(size.unwrap_or(0)));
        let template = match size {
            Some(_) => "{msg:24!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
            None => "{msg:24!} {spinner} {bytes} {bytes_per_sec}",
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(label.to_string());
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        LIVE.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, bar.clone()));
        Bar {
            bar: Some((id, bar)),
        }
    }

    /// Bytes received so far.
    pub fn set(&self, bytes: u64) {
        if let Some((_, bar)) = &self.bar {
            bar.set_position(bytes);
        }
    }

    /// Removes the bar from the screen.
    pub fn finish(&mut self) {
        if let Some((id, bar)) = self.bar.take() {
            bar.finish_and_clear();
            if let Some(bars) = BARS.get() {
                bars.remove(&bar);
            }
            LIVE.lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(live, _)| *live != id);
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.finish();
    }
}
