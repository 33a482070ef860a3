//! Progress bars on a terminal; nothing otherwise.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar for one download, drawn only when stderr is a terminal
/// and JSON output is off.
pub struct Bar {
    bar: Option<ProgressBar>,
}

impl Bar {
    /// A bar for `label` of `size` bytes.
    pub fn new(label: &str, size: u64, json: bool) -> Bar {
        if json || !std::io::stderr().is_terminal() {
            return Bar { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(size), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{msg:20!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(label.to_string());
        Bar { bar: Some(bar) }
    }

    /// Bytes received so far.
    pub fn set(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(bytes);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
