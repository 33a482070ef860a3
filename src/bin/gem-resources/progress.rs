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

use std::sync::Arc;
use std::time::{Duration, Instant};

use gem_resources::transfer::meter::Meter;
use gem_resources::transfer::slots::Handover;
use indicatif::{
    MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle, TermLike,
};
use tokio::sync::OwnedSemaphorePermit;

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
/// and JSON output is off. Its rate, time left and stall come from one
/// [`Meter`]: this run's bytes over a sliding window, falling while
/// nothing arrives (`stalled for 12 s`, time left `--`).
///
/// Without a terminal (and without `--json`) a long transfer prints a
/// line of its figures at most every [`LINE_EVERY`], as aria2's summaries.
pub struct Bar {
    bar: Option<(u64, ProgressBar)>,
    meter: Arc<Mutex<Meter>>,
    /// The label and size, for the lines printed without a terminal.
    label: String,
    size: Mutex<Option<u64>>,
    /// Lines without a terminal: when the last one was printed (`None`:
    /// none are, with `--json` or a bar).
    last_line: Option<Mutex<Instant>>,
    /// Whether a note is shown now (the bar is then narrower, never gone).
    noted: AtomicBool,
    /// Where this run resumed (0: from the start).
    resumed_from: AtomicU64,
    /// The retry being waited for, said on a row of its own under the bar.
    retry: Arc<Mutex<Option<Retry>>>,
}

/// A retry a bar counts down to.
#[derive(Debug, Clone)]
struct Retry {
    /// When the next attempt starts.
    at: Instant,
    attempt: u32,
    of: u32,
    reason: String,
}

impl Retry {
    /// `retrying in 2 s (attempt 3 of 6): connection refused`, counted
    /// down to `now`.
    fn text(&self, now: Instant) -> String {
        let wait = self.at.saturating_duration_since(now);
        retry_note(wait, self.attempt, self.of, &self.reason)
    }
}

/// `--quiet`: no bars and no progress lines.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Sets `--quiet` (once, at start).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `--quiet` is on: only errors are said.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// The shortest time between two progress lines without a terminal.
pub const LINE_EVERY: Duration = Duration::from_secs(10);

/// How a bar announces a resume, and for how long.
const RESUMING: &str = "resuming at";
const RESUME_NOTE_FOR: Duration = Duration::from_secs(3);
/// The shortest a resume is announced, even once bytes flow: long enough
/// to be read.
const RESUME_NOTE_MIN: Duration = Duration::from_secs(1);

impl Bar {
    /// A bar for `label` of `size` bytes (`None`: unknown size).
    pub fn new(label: &str, size: Option<u64>, json: bool) -> Bar {
        let meter = Arc::new(Mutex::new(Meter::new(Instant::now())));
        let mut this = Bar {
            bar: None,
            meter: meter.clone(),
            label: crate::text::field(label).into_owned(),
            size: Mutex::new(size),
            last_line: None,
            noted: AtomicBool::new(false),
            resumed_from: AtomicU64::new(0),
            retry: Arc::default(),
        };
        if json || QUIET.load(Ordering::Relaxed) {
            return this;
        }
        if !std::io::stderr().is_terminal() {
            this.last_line = Some(Mutex::new(Instant::now()));
            return this;
        }
        let bar = multi().add(ProgressBar::new(size.unwrap_or(0)));
        bar.set_style(style(size.is_some(), false, &meter, None));
        bar.set_prefix(this.label.clone());
        // Redrawn while nothing arrives, so a stall shows.
        bar.enable_steady_tick(Duration::from_millis(500));
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        LIVE.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, bar.clone()));
        this.bar = Some((id, bar));
        this
    }

    /// Whether the bar is drawn (stderr is a terminal, JSON is off).
    pub fn is_drawn(&self) -> bool {
        self.bar.is_some()
    }

    fn meter(&self) -> std::sync::MutexGuard<'_, Meter> {
        self.meter.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes received so far.
    pub fn set(&self, bytes: u64) {
        let now = Instant::now();
        self.meter().update(now, bytes);
        if let Some((_, bar)) = &self.bar {
            bar.set_position(bytes);
            // A resume is announced until this run's bytes flow (or a
            // few seconds), then the bar has its room again.
            let resumed = self.meter().started();
            let shown_for = now.saturating_duration_since(resumed);
            let flowing = bytes > self.resumed_from.load(Ordering::Relaxed);
            if ((flowing && shown_for > RESUME_NOTE_MIN) || shown_for > RESUME_NOTE_FOR)
                && bar.message().starts_with(RESUMING)
            {
                self.set_note("");
            }
        }
        if let Some(last) = &self.last_line {
            let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
            if now.saturating_duration_since(*last) >= LINE_EVERY {
                *last = now;
                crate::errln!("{}: {}", self.label, self.figures(now));
            }
        }
    }

    /// The figures as one line says them: `12.3 MiB of 40.0 MiB (31 %),
    /// 2.35 MiB/s, 12 s left`.
    pub fn figures(&self, now: Instant) -> String {
        let size = *self.size.lock().unwrap_or_else(|p| p.into_inner());
        let meter = self.meter();
        let bytes = meter.bytes();
        let mut text = crate::text::bytes(bytes);
        if let Some(size) = size.filter(|s| *s > 0) {
            let percent = bytes.saturating_mul(100) / size;
            text.push_str(&format!(" of {} ({percent} %)", crate::text::bytes(size)));
        }
        text.push_str(&format!(", {}", rate_text(meter.rate(now))));
        text.push_str(&format!(", {}", left_text(&meter, now, size)));
        text
    }

    /// The whole size became known (a `Content-Length`): the bar shows
    /// the total and the time left.
    pub fn set_length(&self, total: u64) {
        *self.size.lock().unwrap_or_else(|p| p.into_inner()) = Some(total);
        if let Some((_, bar)) = &self.bar {
            if bar.length() != Some(total) {
                bar.set_length(total);
                self.restyle(bar);
            }
        }
    }

    /// The transfer continues kept bytes: the bar starts at `offset`, says
    /// so, and its rate and time left count only the bytes of this run.
    pub fn resumed_at(&self, offset: u64) {
        self.meter().resumed(Instant::now(), offset);
        self.resumed_from.store(offset, Ordering::Relaxed);
        if let Some((_, bar)) = &self.bar {
            bar.set_position(offset);
        }
        self.set_note(&format!("{RESUMING} {}", crate::text::bytes(offset)));
    }

    /// What the transfer is waiting for, after the figures ("retrying in
    /// 2 s (attempt 2 of 4): connection refused"); empty when it is
    /// receiving.
    ///
    /// The note takes the room the figures after the bytes leave, cut to
    /// the terminal's width: the bar narrows to a fixed width meanwhile,
    /// and never disappears.
    ///
    /// A note ends a retry's countdown ([`Bar::set_retry`]).
    pub fn set_note(&self, note: &str) {
        if let Some((_, bar)) = &self.bar {
            let noted = !note.is_empty();
            let retried = self.retry().take().is_some();
            if self.noted.swap(noted, Ordering::Relaxed) != noted || retried {
                self.restyle(bar);
            }
            bar.set_message(crate::text::field(note).into_owned());
        }
    }

    /// The transfer waits `wait` before its attempt `attempt` of `of`,
    /// after `reason`: a row under the bar counts down to it in the words
    /// of a retry line (`retrying in 2 s (attempt 3 of 6): connection
    /// refused`), cut between words to the terminal's width. The bar keeps
    /// its figures, and the next note or bytes end the countdown.
    pub fn set_retry(&self, wait: Duration, attempt: u32, of: u32, reason: &str) {
        if let Some((_, bar)) = &self.bar {
            *self.retry() = Some(Retry {
                at: Instant::now() + wait,
                attempt,
                of,
                reason: crate::text::field(reason).into_owned(),
            });
            self.noted.store(false, Ordering::Relaxed);
            bar.set_message(String::new());
            self.restyle(bar);
        }
    }

    fn retry(&self) -> std::sync::MutexGuard<'_, Option<Retry>> {
        self.retry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives `bar` the look its state asks for.
    fn restyle(&self, bar: &ProgressBar) {
        let retrying = self.retry().is_some();
        let noted = self.noted.load(Ordering::Relaxed);
        let retry = retrying.then_some(&self.retry);
        bar.set_style(style(bar.length().is_some(), noted, &self.meter, retry));
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

/// `2.35 MiB/s`.
fn rate_text(rate: f64) -> String {
    format!("{}/s", crate::text::bytes(rate.max(0.0) as u64))
}

/// Widths the figures of a bar are padded to, so that the bar's width
/// does not jitter as they change length (`1023.9 KiB/s`, `5m 10s`); the
/// bytes are padded by the templates.
const RATE_WIDTH: usize = 12;
const LEFT_WIDTH: usize = 7;

/// How long after a start or a resume the time left reads `--`: the
/// rate of the first seconds (a connection's slow start, a cap's first
/// burst) would give a figure many times off, as the gem page's rule.
pub const LEFT_SETTLES_AFTER: Duration = Duration::from_secs(5);

/// The time left as a bar says it: `12s`, `5m 10s`, `2h 5m`; `stalled for
/// 12 s` while nothing arrives; `--` when it cannot be told, and for the
/// first [`LEFT_SETTLES_AFTER`] of a run.
fn left_text(meter: &Meter, now: Instant, size: Option<u64>) -> String {
    if let Some(idle) = meter.stalled_for(now) {
        return format!("stalled for {} s", idle.as_secs());
    }
    if now.saturating_duration_since(meter.started()) < LEFT_SETTLES_AFTER {
        return "--".to_string();
    }
    match size.and_then(|total| meter.time_left(now, total)) {
        Some(left) => {
            // Rounded up: `0s` only once nothing is left.
            let secs = left.as_secs_f64().ceil() as u64;
            match secs {
                0..=59 => format!("{secs}s"),
                60..=3599 => format!("{}m {}s", secs / 60, secs % 60),
                _ => format!("{}h {}m", secs / 3600, secs % 3600 / 60),
            }
        }
        None => "--".to_string(),
    }
}

/// The look of a bar whose total is known (`sized`) or not, with a note
/// (`noted`) or not, with a row counting down to a `retry` or not; its
/// rate and time left read `meter`.
fn style(
    sized: bool,
    noted: bool,
    meter: &Arc<Mutex<Meter>>,
    retry: Option<&Arc<Mutex<Option<Retry>>>>,
) -> ProgressStyle {
    let template = match (sized, noted) {
        (true, false) => TEMPLATE_SIZED,
        (true, true) => TEMPLATE_SIZED_NOTE,
        (false, _) => "{prefix:20!} {spinner} {bytes:>10} {rate} {wide_msg}",
    };
    let template = match retry {
        Some(_) => format!("{template}\n{RETRY_INDENT}{{retry}}"),
        None => template.to_string(),
    };
    let for_retry = retry.cloned().unwrap_or_default();
    let (for_rate, for_left) = (meter.clone(), meter.clone());
    ProgressStyle::with_template(&template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key(
            "rate",
            move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                let meter = for_rate.lock().unwrap_or_else(|p| p.into_inner());
                let text = rate_text(meter.rate(Instant::now()));
                let _ = write!(w, "{text:>RATE_WIDTH$}");
            },
        )
        .with_key(
            "left",
            move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let meter = for_left.lock().unwrap_or_else(|p| p.into_inner());
                let text = left_text(&meter, Instant::now(), state.len());
                let _ = write!(w, "{text:>LEFT_WIDTH$}");
            },
        )
        .with_key(
            "retry",
            move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                let retry = for_retry.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(retry) = &*retry {
                    let room = usize::from(terminal_width().saturating_sub(RIGHT_MARGIN))
                        .saturating_sub(RETRY_INDENT.len());
                    let _ = write!(w, "{}", fit_words(&retry.text(Instant::now()), room));
                }
            },
        )
        .progress_chars("=> ")
}

/// Where a retry's row starts, under the bar's label.
const RETRY_INDENT: &str = "  ";

/// `text` cut to `room` columns between two words, with `…` where it was
/// cut (a word longer than the room is cut where the room ends).
pub fn fit_words(text: &str, room: usize) -> String {
    if text.chars().count() <= room {
        return text.to_string();
    }
    let keep = room.saturating_sub(1);
    let head: String = text.chars().take(keep).collect();
    // The next character is within a word: go back to the last space.
    let cut = match head.rfind(' ') {
        Some(space) if space > 0 => head[..space].trim_end().to_string(),
        _ => head,
    };
    format!("{cut}…")
}

/// The template of a bar whose total is known: the bar takes the width
/// the terminal leaves after the figures, each padded to a fixed width.
const TEMPLATE_SIZED: &str = "{prefix:20!} [{wide_bar}] {bytes:>10}/{total_bytes:10} {rate} {left}";

/// [`TEMPLATE_SIZED`] with a note (`connecting to HOST`, `resuming at
/// …`): a bar of 10 columns and the percentage, and the note in the
/// room left (41 columns at 80), cut to fit.
const TEMPLATE_SIZED_NOTE: &str = "{prefix:20!} [{bar:10}] {percent:>3}% {wide_msg}";

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

/// What failed of an address (a fallback's `from`, with the redirect
/// target `hop` where it failed when that is not the address itself).
pub struct Failed<'a> {
    /// The address, as declared.
    pub from: &'a str,
    /// The redirect target where it failed, if not `from`.
    pub hop: Option<&'a str>,
    /// The failure's code.
    pub code: &'a str,
    /// Why.
    pub reason: &'a str,
}

/// The warning of a fallback to the next address: which resource, which
/// address failed (and at which redirect target) and why, and which is
/// tried next.
pub fn fallback_warning(resource: &str, failed: &Failed<'_>, to: &str) -> String {
    let Failed {
        from,
        hop,
        code,
        reason,
    } = failed;
    let at = match hop {
        Some(hop) if hop != from => {
            format!(" at its redirect to {}", crate::text::elide_query(hop))
        }
        _ => String::new(),
    };
    format!(
        "warning: {resource}: {from} failed{at} ({code}: {reason}); trying the next address, {to}"
    )
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
    /// When the last `--json` progress event went out.
    last_event: Option<Instant>,
    /// The address being tried.
    address: Option<String>,
    /// The download's slot, given back once its bytes are in.
    pub slot: Option<Handover<OwnedSemaphorePermit>>,
}

impl<'a> Reporting<'a> {
    /// Reports on `bar` for `resource`.
    pub fn new(bar: &'a Bar, resource: &'a str, json: bool) -> Self {
        Reporting {
            bar,
            resource,
            json,
            noted: false,
            last_event: None,
            address: None,
            slot: None,
        }
    }
}

impl gem_resources::Reporter for Reporting<'_> {
    fn transferred(&mut self) {
        if let Some(slot) = &mut self.slot {
            slot.transferred();
        }
    }

    fn bytes(&mut self, total: u64) {
        self.bar.set(total);
        if std::mem::take(&mut self.noted) {
            self.bar.set_note("");
        }
        if self.json {
            // The service's progress events, as `fetch --json` gives them
            // too: at most one every 250 ms, and the last.
            let now = Instant::now();
            let size = *self.bar.size.lock().unwrap_or_else(|p| p.into_inner());
            let due = self
                .last_event
                .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_millis(250));
            if due || size == Some(total) {
                self.last_event = Some(now);
                let rate = self.bar.meter().rate(now);
                let event = serde_json::json!({
                    "event": "progress",
                    "at": gem_resources::time::to_rfc3339_millis(std::time::SystemTime::now()),
                    "resource": self.resource,
                    "bytes": total,
                    "size": size,
                    "bytes_per_sec": rate as u64,
                    "address": self.address,
                });
                json_event(&event);
            }
        }
    }

    fn connected(&mut self) {
        self.bar.set_note("connected, waiting for the response");
        self.noted = true;
    }

    fn trying(&mut self, address: &url::Url) {
        self.address = Some(address.to_string());
        self.bar.set_note(&format!(
            "connecting to {}",
            address.host_str().unwrap_or_default()
        ));
        self.noted = true;
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
        let hop = failed
            .hop
            .as_ref()
            .map(url::Url::as_str)
            .filter(|hop| *hop != from);
        if self.json {
            let event = serde_json::json!({
                "event": "fell_back",
                "resource": self.resource,
                "from": from,
                "hop": hop,
                "to": next.as_str(),
                "code": code,
                "reason": reason,
            });
            json_event(&event);
        } else if !quiet() {
            let failed = Failed {
                from,
                hop,
                code: code.as_str(),
                reason: &reason,
            };
            let line = fallback_warning(self.resource, &failed, next.as_str());
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
            self.bar.set_retry(wait, attempt, of, reason);
            self.noted = true;
        } else if !quiet() {
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
#[path = "progress_tests.rs"]
mod tests;
