//! The bars' unit tests.

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
    let meter = Arc::new(Mutex::new(Meter::new(Instant::now())));
    bar.set_style(style(false, false, &meter, None));
    bar.set_prefix("ocr-v3.onnx");
    Bar {
        bar: Some((0, bar)),
        meter,
        label: "ocr-v3.onnx".into(),
        size: Mutex::new(None),
        last_line: None,
        noted: AtomicBool::new(false),
        resumed_from: AtomicU64::new(0),
        retry: Arc::default(),
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
    // The time left is the last figure: `--` for the first seconds of a
    // run, whatever the rate says.
    assert!(known.trim_end().ends_with("--"), "{known}");
    // Past them, seconds (or more) remaining.
    let earlier = Instant::now() - LEFT_SETTLES_AFTER - Duration::from_secs(1);
    bar.meter().resumed(earlier, 0);
    reporting.bytes(1024);
    let known = drawn(&screen, &bar);
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
    assert!(shown.contains("resuming at 1.0 GiB"), "{shown}");
    // Once this run's bytes flow (and the note was up long enough to
    // be read), the figures are back.
    std::thread::sleep(RESUME_NOTE_MIN + Duration::from_millis(100));
    reporting.bytes((1 << 30) + 1024);
    let shown = drawn(&screen, &bar);
    assert!(shown.contains("1.00 GiB/2.00 GiB"), "{shown}");
    assert!(!shown.contains("resuming"), "{shown}");
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
    let wait = std::time::Duration::from_millis(2_400);
    reporting.retrying(wait, 3, 6, "connection refused");
    let shown = drawn(&screen, &bar);
    assert!(
        shown.ends_with("  retrying in 2 s (attempt 3 of 6): connection refused"),
        "{shown}"
    );
    // The bar keeps its figures above it.
    assert!(shown.contains("10 B"), "{shown}");
    // The countdown moves.
    std::thread::sleep(Duration::from_millis(1_000));
    let shown = drawn(&screen, &bar);
    assert!(
        shown.contains("retrying in 1 s (attempt 3 of 6)"),
        "{shown}"
    );
    reporting.bytes(20);
    let shown = drawn(&screen, &bar);
    assert!(!shown.contains("retry"), "{shown}");
}

#[test]
fn a_long_note_is_cut_between_words() {
    let text = "retrying in 2 s (attempt 3 of 6): connection refused";
    assert_eq!(fit_words(text, 80), text);
    assert_eq!(
        fit_words(text, 47),
        "retrying in 2 s (attempt 3 of 6): connection…"
    );
    assert_eq!(fit_words("abcdefghij", 5), "abcd…");
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
