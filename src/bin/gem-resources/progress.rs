//! Progress bars on a terminal; nothing otherwise.
//!
//! Every bar lives in one [`MultiProgress`], and every line the program
//! writes to stderr (messages and log lines) goes through it, so a line
//! printed while bars are drawn appears above them instead of leaving a
//! frozen copy of a bar behind. A bar is cleared when its transfer ends,
//! however it ends ([`Bar`] clears itself when dropped), and [`clear_all`]
//! clears whatever is left on Ctrl-C.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};

/// The bars on screen, created at the first bar.
static BARS: OnceLock<MultiProgress> = OnceLock::new();

/// Every bar that was drawn and not yet cleared, for [`clear_all`].
static LIVE: Mutex<Vec<(u64, ProgressBar)>> = Mutex::new(Vec::new());

/// Identifies bars in [`LIVE`].
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn multi() -> &'static MultiProgress {
    BARS.get_or_init(|| {
        MultiProgress::with_draw_target(ProgressDrawTarget::term_like_with_hz(
            Box::new(Stderr::default()),
            20,
        ))
    })
}

/// Columns left free at the right of every bar line. indicatif pads each
/// line to the terminal's width and leaves the cursor in the last column;
/// the `^C` a terminal echoes at Ctrl-C would then wrap onto a new line,
/// and clearing the bars would clear that line instead of the bar above it,
/// leaving a frozen bar on screen.
const RIGHT_MARGIN: u16 = 3;

/// stderr as indicatif's terminal, a few columns narrower than it is.
///
/// indicatif writes the bars of one frame as "line, padding to the width,
/// line, padding, …" with no newline between them: it counts on the terminal
/// wrapping after the padding. With the narrower width nothing wraps, so the
/// next line is put on a row of its own here: a line written after a padding
/// starts with a newline. Any cursor movement starts a new frame.
#[derive(Debug, Default)]
struct Stderr {
    /// The last write was a line, so the next one is its padding.
    padding_next: AtomicBool,
    /// The last write was a padding: the row is full.
    row_full: AtomicBool,
}

impl Stderr {
    fn write(&self, text: &str) -> std::io::Result<()> {
        use std::io::Write;
        std::io::stderr().lock().write_all(text.as_bytes())
    }

    fn escape(&self, n: usize, code: char) -> std::io::Result<()> {
        self.moved();
        if n == 0 {
            return Ok(());
        }
        self.write(&format!("\x1b[{n}{code}"))
    }

    /// The cursor moved: what comes next starts a new frame.
    fn moved(&self) {
        self.padding_next.store(false, Ordering::Relaxed);
        self.row_full.store(false, Ordering::Relaxed);
    }

    /// What to write for indicatif's `write_str(s)`.
    fn text_for<'a>(&self, s: &'a str) -> std::borrow::Cow<'a, str> {
        if s == "\r" {
            self.moved();
            return s.into();
        }
        if self.padding_next.swap(false, Ordering::Relaxed) {
            self.row_full.store(true, Ordering::Relaxed);
            return s.into();
        }
        self.padding_next.store(true, Ordering::Relaxed);
        if self.row_full.swap(false, Ordering::Relaxed) {
            format!("\r\n{s}").into()
        } else {
            s.into()
        }
    }
}

impl TermLike for Stderr {
    fn width(&self) -> u16 {
        terminal_width().saturating_sub(RIGHT_MARGIN).max(20)
    }

    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.escape(n, 'A')
    }

    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.escape(n, 'B')
    }

    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.escape(n, 'C')
    }

    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.escape(n, 'D')
    }

    fn height(&self) -> u16 {
        crate::platform::terminal_size().0
    }

    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.moved();
        self.write(&format!("{s}\n"))
    }

    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.write(&self.text_for(s))
    }

    fn clear_line(&self) -> std::io::Result<()> {
        self.moved();
        self.write("\r\x1b[2K")
    }

    fn flush(&self) -> std::io::Result<()> {
        use std::io::Write;
        std::io::stderr().flush()
    }
}

/// The width of the terminal on stderr (80 when it cannot be told).
fn terminal_width() -> u16 {
    crate::platform::terminal_size().1
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
        bar.set_style(style(size.is_some()));
        bar.set_prefix(crate::text::field(label).into_owned());
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        LIVE.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, bar.clone()));
        Bar {
            bar: Some((id, bar)),
        }
    }

    /// Whether the bar is drawn (stderr is a terminal, JSON is off).
    pub fn is_drawn(&self) -> bool {
        self.bar.is_some()
    }

    /// Bytes received so far.
    pub fn set(&self, bytes: u64) {
        if let Some((_, bar)) = &self.bar {
            bar.set_position(bytes);
        }
    }

    /// The whole size became known (a `Content-Length`): the bar shows
    /// the total and the time left.
    pub fn set_length(&self, total: u64) {
        if let Some((_, bar)) = &self.bar {
            if bar.length() != Some(total) {
                bar.set_length(total);
                bar.set_style(style(true));
            }
        }
    }

    /// The transfer continues kept bytes: the bar starts at `offset`, and
    /// its rate and time left count only the bytes of this run.
    pub fn resumed_at(&self, offset: u64) {
        if let Some((_, bar)) = &self.bar {
            bar.set_position(offset);
            bar.reset_eta();
        }
    }

    /// What the transfer is waiting for, after the figures ("retrying in
    /// 2 s (attempt 2 of 4): connection refused"); empty when it is
    /// receiving.
    pub fn set_note(&self, note: &str) {
        if let Some((_, bar)) = &self.bar {
            bar.set_message(crate::text::field(note).into_owned());
        }
    }

    /// Removes the bar from the screen.
    pub fn finish(&mut self) {
        if let Some((id, bar)) = self.bar.take() {
            bar.finish_and_clear();
            LIVE.lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(live, _)| *live != id);
        }
    }
}

/// The look of a bar whose total is known (`sized`) or not.
fn style(sized: bool) -> ProgressStyle {
    let template = if sized {
        TEMPLATE_SIZED
    } else {
        "{prefix:24!} {spinner} {bytes} {bytes_per_sec} {msg}"
    };
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// The template of a bar whose total is known.
const TEMPLATE_SIZED: &str =
    "{prefix:24!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta} {msg}";

/// Writes one `--json` event line on stderr (no bars are drawn with
/// `--json`).
fn json_event(event: &serde_json::Value) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{event}");
}

/// What a bar says while another download of the same file holds it.
pub const WAITING: &str = "waiting for another process downloading this file";

/// [`WAITING`], naming the gem whose download it is when known.
pub fn waiting_note(gem: Option<&str>) -> String {
    match gem {
        // Gem ids are letters, digits and `@/._-` only.
        Some(gem) => format!("waiting for gem {gem}'s download of the same file"),
        None => WAITING.to_string(),
    }
}

/// The wording of a retry, as a bar and `--json` say it.
pub fn retry_note(wait: std::time::Duration, attempt: u32, of: u32, reason: &str) -> String {
    let secs = wait.as_secs_f64();
    let wait = if secs >= 1.0 {
        format!("{} s", secs.round())
    } else {
        format!("{secs:.1} s")
    };
    format!("retrying in {wait} (attempt {attempt} of {of}): {reason}")
}

/// The warning of a fallback to the next address: which resource, which
/// address failed and why, and which is tried next.
pub fn fallback_warning(resource: &str, from: &str, code: &str, reason: &str, to: &str) -> String {
    format!("warning: {resource}: {from} failed ({code}: {reason}); trying the next address, {to}")
}

/// A transfer's [`Reporter`](gem_resources::Reporter) drawing on a bar;
/// with `--json`, each retry is also an event line on stderr.
pub struct Reporting<'a> {
    /// The bar drawn on.
    pub bar: &'a Bar,
    /// The resource (or file) being read, for events.
    pub resource: &'a str,
    /// `--json` is on.
    pub json: bool,
    /// A note is on the bar (cleared by the next bytes).
    pub noted: bool,
}

impl<'a> Reporting<'a> {
    /// Reports on `bar` for `resource`.
    pub fn new(bar: &'a Bar, resource: &'a str, json: bool) -> Self {
        Reporting {
            bar,
            resource,
            json,
            noted: false,
        }
    }
}

impl gem_resources::Reporter for Reporting<'_> {
    fn bytes(&mut self, total: u64) {
        self.bar.set(total);
        if std::mem::take(&mut self.noted) {
            self.bar.set_note("");
        }
    }

    fn length(&mut self, total: u64) {
        self.bar.set_length(total);
    }

    fn resumed(&mut self, offset: u64) {
        self.bar.resumed_at(offset);
    }

    fn waiting(&mut self) {
        self.waiting_on(None);
    }

    fn waiting_on(&mut self, gem: Option<&str>) {
        if self.json {
            let mut event = serde_json::json!({ "event": "waiting", "resource": self.resource });
            if let Some(gem) = gem {
                event["on"] = serde_json::json!(gem);
            }
            json_event(&event);
        } else {
            self.bar.set_note(&waiting_note(gem));
            self.noted = true;
        }
    }

    fn fell_back(&mut self, failed: &gem_resources::error::Attempt, next: &url::Url) {
        let (from, code, reason) = (
            failed.address.as_str(),
            failed.code(),
            failed.error.to_string(),
        );
        if self.json {
            let event = serde_json::json!({
                "event": "fell_back",
                "resource": self.resource,
                "from": from,
                "to": next.as_str(),
                "code": code,
                "reason": reason,
            });
            json_event(&event);
        } else {
            let line = fallback_warning(self.resource, from, code.as_str(), &reason, next.as_str());
            crate::errln!("{line}");
        }
    }

    fn retrying(&mut self, wait: std::time::Duration, attempt: u32, of: u32, reason: &str) {
        if self.json {
            let event = serde_json::json!({
                "event": "retrying",
                "resource": self.resource,
                "wait_secs": wait.as_secs_f64(),
                "attempt": attempt,
                "of": of,
                "reason": reason,
            });
            json_event(&event);
        } else if self.bar.is_drawn() {
            self.bar.set_note(&retry_note(wait, attempt, of, reason));
            self.noted = true;
        } else {
            // No bar to carry it (stderr is not a terminal): a line of its
            // own, as `path` and `install` print it.
            let note = retry_note(wait, attempt, of, reason);
            crate::errln!("{}: {note}", self.resource);
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What one frame of `lines` becomes, as indicatif writes it.
    fn frame(screen: &Stderr, lines: &[&str]) -> String {
        let mut out = screen.text_for("\r").into_owned();
        for line in lines {
            out.push_str(&screen.text_for(line));
            out.push_str(&screen.text_for("  "));
        }
        out
    }

    /// A terminal that keeps what is drawn on it.
    #[derive(Debug, Clone, Default)]
    struct Screen(std::sync::Arc<Mutex<String>>);

    impl TermLike for Screen {
        fn width(&self) -> u16 {
            160
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.write_str(s)
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            self.0.lock().unwrap().clear();
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A bar of unknown size drawn on a [`Screen`], as autofill starts it.
    fn drawn_bar(screen: &Screen) -> Bar {
        let target = ProgressDrawTarget::term_like_with_hz(Box::new(screen.clone()), 250);
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(style(false));
        bar.set_prefix("ocr-v3.onnx");
        Bar {
            bar: Some((0, bar)),
        }
    }

    /// What is on the screen after the next draw.
    fn drawn(screen: &Screen, bar: &Bar) -> String {
        if let Some((_, b)) = &bar.bar {
            b.tick();
        }
        screen.0.lock().unwrap().trim_end().to_string()
    }

    #[test]
    fn an_announced_length_gives_the_total_and_the_time_left() {
        use gem_resources::Reporter;
        let screen = Screen::default();
        let bar = drawn_bar(&screen);
        let mut reporting = Reporting::new(&bar, "ocr-v3.onnx", false);
        reporting.bytes(512);
        let unknown = drawn(&screen, &bar);
        assert!(
            unknown.contains("512 B") && !unknown.contains('['),
            "{unknown}"
        );
        reporting.length(2048);
        reporting.bytes(1024);
        let known = drawn(&screen, &bar);
        assert!(
            known.contains("[") && known.contains("1.00 KiB/2.00 KiB"),
            "{known}"
        );
        // The time left is the last figure: seconds (or more) remaining.
        assert!(known.trim_end().ends_with('s'), "{known}");
    }

    #[test]
    fn after_a_resume_the_rate_counts_only_this_runs_bytes() {
        use gem_resources::Reporter;
        let screen = Screen::default();
        let bar = drawn_bar(&screen);
        let mut reporting = Reporting::new(&bar, "big.bin", false);
        reporting.length(2 << 30);
        // 1 GiB kept: received in no time, were it counted.
        reporting.resumed(1 << 30);
        reporting.bytes(1 << 30);
        let shown = drawn(&screen, &bar);
        assert!(shown.contains("1.00 GiB/2.00 GiB"), "{shown}");
        assert!(
            !shown.contains("GiB/s") && !shown.contains("TiB/s"),
            "the kept bytes counted in the rate: {shown}"
        );
    }

    #[test]
    fn a_retry_is_on_the_bar_until_bytes_arrive() {
        use gem_resources::Reporter;
        let screen = Screen::default();
        let bar = drawn_bar(&screen);
        let mut reporting = Reporting::new(&bar, "ocr-v3.onnx", false);
        reporting.bytes(10);
        let wait = std::time::Duration::from_secs(2);
        reporting.retrying(wait, 3, 6, "connection refused");
        let shown = drawn(&screen, &bar);
        assert!(
            shown.ends_with("retrying in 2 s (attempt 3 of 6): connection refused"),
            "{shown}"
        );
        reporting.bytes(20);
        let shown = drawn(&screen, &bar);
        assert!(!shown.contains("retrying"), "{shown}");
    }

    #[test]
    fn a_retry_says_when_which_try_and_why() {
        let note = retry_note(
            std::time::Duration::from_millis(2_200),
            3,
            6,
            "connection refused",
        );
        assert_eq!(note, "retrying in 2 s (attempt 3 of 6): connection refused");
        let note = retry_note(std::time::Duration::from_millis(300), 2, 4, "HTTP 503");
        assert_eq!(note, "retrying in 0.3 s (attempt 2 of 4): HTTP 503");
    }

    #[test]
    fn each_bar_of_a_frame_gets_a_row_of_its_own() {
        let screen = Stderr::default();
        assert_eq!(frame(&screen, &["a", "b", "c"]), "\ra  \r\nb  \r\nc  ");
        // The next frame starts after a cursor movement, on the first row.
        screen.moved();
        assert_eq!(frame(&screen, &["d"]), "\rd  ");
        // A line as wide as the terminal has an empty padding.
        screen.moved();
        let mut out = screen.text_for("\r").into_owned();
        for part in ["wide", "", "next", "  "] {
            out.push_str(&screen.text_for(part));
        }
        assert_eq!(out, "\rwide\r\nnext  ");
    }
}
