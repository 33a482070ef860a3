//! Rendering: text for people, JSON for scripts, logs on stderr.

use std::fmt;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use gem_resources::error::ErrorCode;
use gem_resources::Error;
use serde_json::{json, Value};

use crate::text::{escape_except, for_terminal};

/// Logs go to stderr, filtered by `RUST_LOG` (default: `default`), in
/// colour only when stderr is a terminal and `NO_COLOR` is not set. With
/// `plain` (a one-shot command, no `RUST_LOG`, no `-v`), a warning reads as
/// the command's own do, `warning: …`, without a time or a module; a
/// service's log, and any asked-for log, keep both.
pub fn init_logging(default: &str, plain: bool) {
    let asked = std::env::var_os("RUST_LOG").is_some();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour_on_stderr())
        .with_writer(|| LogWriter);
    let _ = if plain && !asked {
        builder.event_format(Plain).try_init()
    } else {
        builder.try_init()
    };
}

/// `warning: message key=value …`: a log line as a command's own line.
struct Plain;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Plain
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warning",
            tracing::Level::INFO => "note",
            _ => "debug",
        };
        write!(writer, "{level}: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Whether stderr may carry colour: a terminal, and no `NO_COLOR`
/// (<https://no-color.org>: set to anything but the empty string).
pub fn colour_on_stderr() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

/// Writes log lines to stderr above any progress bars, with text from
/// manifests and servers escaped ([`for_terminal`]). The formatter already
/// escapes ESC in what it is given, so with colour on its own colour codes
/// are the only ESC left and are kept.
struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let keep: &[char] = if colour_on_stderr() {
            &['\n', '\t', '\u{1b}']
        } else {
            &['\n', '\t']
        };
        let safe = escape_except(&text, keep);
        crate::progress::suspend(|| std::io::stderr().lock().write_all(safe.as_bytes()))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// An error for people, as the command line prints it: `CODE: message`
/// (the library's `Display` is the message alone). A rejected manifest is
/// one `E_PERM_INVALID: path: message` line per problem.
pub fn error_text(e: &Error) -> String {
    match e {
        Error::Manifest(m) => m.to_string(),
        _ => failure_text(e.code(), &e.to_string()),
    }
}

/// The manifest file this command read, as a shell word, once known.
static MANIFEST_FILE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Says which manifest file this command reads (`install FILE`): a
/// failure's advice that names the manifest's file names this one.
pub fn manifest_file(path: &std::path::Path) {
    let _ = MANIFEST_FILE.set(crate::platform::shell_word(&path.display().to_string()));
}

/// `message` with the manifest's file named where the library's advice
/// leaves its place ([`gem_resources::error::MANIFEST_FILE`]), when known.
pub fn with_manifest_file(message: &str) -> std::borrow::Cow<'_, str> {
    use gem_resources::error::MANIFEST_FILE as PLACE;
    match MANIFEST_FILE.get() {
        Some(file) if message.contains(PLACE) => message.replace(PLACE, file).into(),
        _ => message.into(),
    }
}

/// A failure reported with its code apart (an `Event::Failed`, a failure
/// record), as the command line prints it: `CODE: message`, the manifest's
/// file named in its advice when known.
pub fn failure_text(code: ErrorCode, message: &str) -> String {
    format!("{code}: {}", with_manifest_file(message))
}

/// An error as JSON: code, primary cause, message and what else it knows
/// (the attempts, …): the API's error data.
pub fn error_json(e: &Error) -> Value {
    json!(gem_resources::error::data::ErrorData::of(e))
}

/// The line `import` prints for one file: `FILE: imported GEM/ID, …`,
/// `FILE: already present (GEM/ID, …)` or `FILE: matches no declared resource`.
pub fn import_line(file: &std::path::Path, outcome: &gem_resources::ImportOutcome) -> String {
    use gem_resources::ImportOutcome;
    let what = match outcome {
        ImportOutcome::Imported { resources, .. } => format!("imported {}", resources.join(", ")),
        ImportOutcome::AlreadyPresent { resources, .. } => {
            format!("already present ({})", resources.join(", "))
        }
        ImportOutcome::NoMatch { .. } => "matches no declared resource".to_string(),
        _ => "imported".to_string(),
    };
    format!("{}: {what}", file.display())
}

/// Prints a JSON value on stdout, one line, its strings exactly as they
/// are (JSON escapes what it must; nothing else is escaped).
/// Prints a command's `--json` document with `"ok"` saying whether the
/// command succeeded (kept when the document says it already).
pub fn print_doc(mut value: Value, ok: bool) {
    if let Some(fields) = value.as_object_mut() {
        fields.entry("ok").or_insert(Value::Bool(ok));
    }
    print_json(&value);
}

/// Says that a command failed with `e`: its `--json` document, or
/// `CODE: message` on stderr; exit status 1.
pub fn fail(e: &Error, json: bool) -> std::process::ExitCode {
    if json {
        print_doc(error_json(e), false);
    } else {
        crate::errln!("{}", error_text(e));
    }
    std::process::ExitCode::from(1)
}

/// Prints one JSON line on stdout.
pub fn print_json(value: &Value) {
    write_out_exact(format_args!("{value}"));
}

/// Set once stdout turned out closed (`gem-resources status | head -1`).
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes one line to stdout. A closed stdout is not an error: the rest of
/// the output is dropped quietly and the command ends with its normal exit
/// status, as `cat` or `ls` do. (SIGPIPE stays ignored, Rust's default, so a
/// server resetting a connection can never kill the process.)
pub fn write_out(args: fmt::Arguments<'_>) {
    write_out_exact(format_args!("{}", for_terminal(&args.to_string())));
}

/// [`write_out`] without the escaping: for JSON, whose text is exact.
pub fn write_out_exact(args: fmt::Arguments<'_>) {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
        }
    }
}

/// Writes one line to stderr (above any progress bars), ignoring a closed
/// stderr.
pub fn write_err(args: fmt::Arguments<'_>) {
    write_err_exact(format_args!("{}", for_terminal(&args.to_string())));
}

/// [`write_err`] without the escaping: for JSON lines, whose text is exact.
pub fn write_err_exact(args: fmt::Arguments<'_>) {
    let line = format!("{args}\n");
    crate::progress::suspend(|| {
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    });
}

/// `println!` that never panics on a closed stdout.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => { $crate::render::write_out(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics on a closed stderr.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => { $crate::render::write_err(format_args!($($arg)*)) };
}

pub use crate::text::bytes;

/// The `status` line about files no installed gem declares, when there
/// are any: `not declared by any gem: 2 files, 1.2 GiB (run `gem-resources gc`)`.
pub fn undeclared_line(files: usize, bytes: u64) -> Option<String> {
    (files > 0).then(|| {
        format!(
            "not declared by any gem: {}, {} (run `gem-resources gc`)",
            file_count(files),
            self::bytes(bytes)
        )
    })
}

/// `1 file`, `3 files`.
pub fn file_count(n: usize) -> String {
    format!("{n} file{}", if n == 1 { "" } else { "s" })
}

/// Seconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (the
/// library's RFC 3339 text, spelled for people).
pub fn utc(secs: u64) -> String {
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    let text = gem_resources::time::to_rfc3339(when);
    format!("{} UTC", text.trim_end_matches('Z').replacen('T', " ", 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_printed_with_its_code_in_front() {
        let e = Error::NotFound("gem \"g\" is not installed".to_string());
        assert_eq!(
            error_text(&e),
            "E_RESOURCE_NOT_FOUND: gem \"g\" is not installed"
        );
        let m = gem_resources::parse_manifest(br#"{"resources": 3}"#).unwrap_err();
        assert_eq!(
            error_text(&Error::from(m)),
            "E_PERM_INVALID: manifest.resources: must be an array, got number"
        );
        assert_eq!(
            failure_text(ErrorCode::Http, "x: HTTP status 404"),
            "E_RESOURCE_HTTP: x: HTTP status 404"
        );
    }

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_796_000_000), "2026-11-30 00:53:20 UTC");
    }

    #[test]
    fn bytes_are_human_readable() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(412_000_000), "392.9 MiB");
    }
}
