//! Parsers for the response headers a server controls (Content-Range,
//! Retry-After, ETag, Last-Modified, Location) and for a proxy's answer to
//! `CONNECT`.
//!
//! A server is as untrusted as a manifest: every parser here takes the raw
//! header bytes, accepts only what RFC 9110 allows (optional whitespace
//! around the value, nothing else), never panics and never overflows. Values
//! that are not understood give `None` (or an `Err` reason for `Location`),
//! so a caller falls back to the safe behaviour (no resume, default backoff,
//! no redirect) instead of guessing.

use std::time::{Duration, SystemTime};

use url::Url;

/// The longest wait a `Retry-After` value can ask for: one day. Longer
/// values (and absurd ones such as 10^30 seconds) are capped to it.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest entity tag, quotes included, kept as an `If-Range` validator.
const MAX_ETAG_BYTES: usize = 256;
/// How much of a server's text an error message repeats.
const MAX_SHOWN_CHARS: usize = 256;

/// A satisfied byte range as a `206 Partial Content` response states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    /// First byte position.
    pub start: u64,
    /// Last byte position, inclusive (`start <= end`).
    pub end: u64,
    /// Complete length of the representation (`end < total`), or `None` for
    /// `*` (unknown).
    pub total: Option<u64>,
}

/// Strips the optional whitespace (SP / HTAB) a field value may carry at
/// either end (RFC 9110 section 5.5).
fn trim_ows(value: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !is_ows(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    &value[start..end]
}

/// `1*DIGIT` as a `u64`; `None` for anything else or on overflow (`str::parse`
/// alone would also accept a leading `+`).
fn digits(text: &[u8]) -> Option<u64> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    text.iter().try_fold(0u64, |acc, &d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// `bytes START-END/TOTAL` or `bytes START-END/*`; `None` for anything else
/// (including `bytes */N`, `END < START`, `TOTAL <= END`, overflow, junk, or
/// whitespace other than optional whitespace around the value and the single
/// space after the unit).
pub fn parse_content_range(value: &[u8]) -> Option<ContentRange> {
    let value = trim_ows(value);
    let unit_end = value.iter().position(|&b| b == b' ')?;
    let (unit, rest) = value.split_at(unit_end);
    if !unit.eq_ignore_ascii_case(b"bytes") {
        return None;
    }
    // Exactly one SP separates the unit from the range.
    let rest = &rest[1..];
    let slash = rest.iter().position(|&b| b == b'/')?;
    let (range, total) = (&rest[..slash], &rest[slash + 1..]);
    let dash = range.iter().position(|&b| b == b'-')?;
    let start = digits(&range[..dash])?;
    let end = digits(&range[dash + 1..])?;
    let total = match total {
        b"*" => None,
        text => Some(digits(text)?),
    };
    if end < start || total.is_some_and(|total| total <= end) {
        return None;
    }
    Some(ContentRange { start, end, total })
}

/// `Retry-After` as a wait from `now`: delta-seconds or an HTTP-date
/// (IMF-fixdate, RFC 850 or asctime form). A date in the past gives
/// `Duration::ZERO`; waits are capped at one day; `None` when unparsable.
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let value = trim_ows(value);
    if !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
        // Too many digits for u64 is an absurd wait, not a malformed one.
        let seconds = digits(value).unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER));
    }
    let date = http_date(value)?;
    let wait = date.duration_since(now).unwrap_or(Duration::ZERO);
    Some(wait.min(MAX_RETRY_AFTER))
}

/// An HTTP-date in any of its three forms.
fn http_date(value: &[u8]) -> Option<SystemTime> {
    let text = std::str::from_utf8(value).ok()?;
    httpdate::parse_http_date(text).ok()
}

/// A *strong* entity tag usable in `If-Range` (`"abc"`, not `W/"abc"`),
/// returned verbatim with its quotes; `None` for a weak or malformed tag, one
/// with non-ASCII bytes, or one longer than 256 bytes.
pub fn parse_strong_etag(value: &[u8]) -> Option<String> {
    let value = trim_ows(value);
    if value.len() < 2 || value.len() > MAX_ETAG_BYTES {
        return None;
    }
    let inner = value.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    // etagc = %x21 / %x23-7E (obs-text is refused: the tag is echoed back).
    if !inner
        .iter()
        .all(|&b| b == 0x21 || (0x23..=0x7e).contains(&b))
    {
        return None;
    }
    std::str::from_utf8(value).ok().map(str::to_string)
}

/// A `Last-Modified` value usable as an `If-Range` validator: a valid
/// HTTP-date, returned verbatim (optional whitespace trimmed); `None`
/// otherwise.
pub fn parse_last_modified(value: &[u8]) -> Option<String> {
    let value = trim_ows(value);
    http_date(value)?;
    std::str::from_utf8(value).ok().map(str::to_string)
}

/// Resolves a `Location` header value against the current URL. The error is
/// a short reason: the value is not text, is empty, or cannot be parsed (the
/// server's text is shown escaped and cut to 256 characters).
pub fn join_location(base: &Url, value: &[u8]) -> Result<Url, String> {
    let value = trim_ows(value);
    // Visible ASCII and inner spaces only, as a header value must be text.
    if !value
        .iter()
        .all(|&b| b == b' ' || b == b'\t' || (0x21..0x7f).contains(&b))
    {
        return Err("Location is not text".to_string());
    }
    let text = std::str::from_utf8(value).map_err(|_| "Location is not text".to_string())?;
    if text.is_empty() {
        return Err("Location is empty".to_string());
    }
    base.join(text)
        .map_err(|e| format!("invalid Location {}: {e}", quoted(text)))
}

/// The status of a proxy's answer to `CONNECT`: the code of its first
/// line, `HTTP/1.x NNN [reason]`; `None` for anything else (not HTTP/1.x,
/// not three ASCII digits, not text).
pub fn parse_connect_status(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut parts = line.split(' ');
    let version = parts.next()?;
    let status = parts.next()?;
    if !version.starts_with("HTTP/1.")
        || status.len() != 3
        || !status.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    status.parse().ok()
}

/// `text` quoted and escaped, cut to at most [`MAX_SHOWN_CHARS`] characters
/// of escaped text (never inside an escape), with `…` and the whole
/// length in characters when cut. The cut comes after escaping, since
/// escaping can double the length.
fn quoted(text: &str) -> String {
    let mut out = String::from("\"");
    let mut shown = 0;
    for c in text.chars() {
        let piece: String = c.escape_debug().collect();
        shown += piece.chars().count();
        if shown > MAX_SHOWN_CHARS {
            out.push_str(&format!("…\" ({} characters)", text.chars().count()));
            return out;
        }
        out.push_str(&piece);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: u64, end: u64, total: Option<u64>) -> Option<ContentRange> {
        Some(ContentRange { start, end, total })
    }

    #[test]
    fn content_range_accepts_the_rfc_forms() {
        let cases: &[(&str, Option<ContentRange>)] = &[
            ("bytes 0-499/1234", range(0, 499, Some(1234))),
            ("bytes 500-999/1000", range(500, 999, Some(1000))),
            ("bytes 0-0/1", range(0, 0, Some(1))),
            ("bytes 42-1233/*", range(42, 1233, None)),
            ("Bytes 1-2/3", range(1, 2, Some(3))),
            (" \tbytes 1-2/3\t ", range(1, 2, Some(3))),
            (
                "bytes 0-18446744073709551614/18446744073709551615",
                range(0, u64::MAX - 1, Some(u64::MAX)),
            ),
            ("bytes 007-8/9", range(7, 8, Some(9))),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_content_range(text.as_bytes()), *expected, "{text:?}");
        }
    }

    #[test]
    fn content_range_refuses_everything_else() {
        for text in [
            "",
            "bytes",
            "bytes */1234",
            "bytes 5-4/10",
            "bytes 0-10/10",
            "bytes 0-10/5",
            "bytes 0-18446744073709551616/*",
            "bytes 0-1/18446744073709551616",
            "bytes +0-1/2",
            "bytes 0-+1/2",
            "bytes 0-1/+2",
            "bytes -1-2/3",
            "bytes 0 -1/2",
            "bytes 0- 1/2",
            "bytes 0-1 /2",
            "bytes 0-1/ 2",
            "bytes  0-1/2",
            "bytes\t0-1/2",
            "bytes 0-1/2/3",
            "bytes 0-1-2/3",
            "bytes 0-1",
            "bytes 0/2",
            "items 0-1/2",
            "bytes=0-1/2",
            "bytes 0-1/2x",
            "bytes 0x0-1/2",
            "bytes 0-1/**",
            "bytes ０-1/2",
        ] {
            assert_eq!(parse_content_range(text.as_bytes()), None, "{text:?}");
        }
        assert_eq!(parse_content_range(b"bytes 0-1/2\xff"), None);
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn retry_after_seconds() {
        let now = at(1_000_000);
        let secs = |text: &str| parse_retry_after(text.as_bytes(), now);
        assert_eq!(secs("0"), Some(Duration::ZERO));
        assert_eq!(secs("120"), Some(Duration::from_secs(120)));
        assert_eq!(secs(" 120\t"), Some(Duration::from_secs(120)));
        assert_eq!(secs("86400"), Some(MAX_RETRY_AFTER));
        assert_eq!(secs("86401"), Some(MAX_RETRY_AFTER));
        assert_eq!(secs("18446744073709551615"), Some(MAX_RETRY_AFTER));
        assert_eq!(secs(&"9".repeat(400)), Some(MAX_RETRY_AFTER));
        for bad in ["", " ", "-1", "+1", "1.5", "1e3", "12 0", "soon", "٣"] {
            assert_eq!(secs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_dates_in_all_three_forms() {
        // 784111777 is Sun, 06 Nov 1994 08:49:37 GMT.
        let date = 784_111_777;
        for text in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            let before = parse_retry_after(text.as_bytes(), at(date - 90));
            assert_eq!(before, Some(Duration::from_secs(90)), "{text:?}");
            let after = parse_retry_after(text.as_bytes(), at(date + 90));
            assert_eq!(after, Some(Duration::ZERO), "{text:?}");
        }
        let far = parse_retry_after(b"Fri, 31 Dec 9999 23:59:59 GMT", at(0));
        assert_eq!(far, Some(MAX_RETRY_AFTER));
        for bad in ["Sun, 06 Nov 1994 08:49:37", "Sun, 32 Nov 1994 08:49:37 GMT"] {
            assert_eq!(parse_retry_after(bad.as_bytes(), at(0)), None, "{bad:?}");
        }
        assert_eq!(parse_retry_after(b"\xffSun", at(0)), None);
    }

    #[test]
    fn strong_etags_only() {
        let tag = |text: &[u8]| parse_strong_etag(text);
        assert_eq!(tag(b"\"abc\""), Some("\"abc\"".to_string()));
        assert_eq!(tag(b" \"abc\" "), Some("\"abc\"".to_string()));
        assert_eq!(tag(b"\"\""), Some("\"\"".to_string()));
        assert_eq!(tag(b"\"a!#~\""), Some("\"a!#~\"".to_string()));
        let longest = format!("\"{}\"", "x".repeat(MAX_ETAG_BYTES - 2));
        assert_eq!(tag(longest.as_bytes()), Some(longest.clone()));
        let too_long = format!("\"{}\"", "x".repeat(MAX_ETAG_BYTES - 1));
        assert_eq!(tag(too_long.as_bytes()), None);
        for bad in [
            &b"W/\"abc\""[..],
            b"w/\"abc\"",
            b"abc",
            b"\"abc",
            b"abc\"",
            b"\"",
            b"",
            b"\"a\"b\"",
            b"\"a b\"",
            b"\"a\tb\"",
            b"\"a\xffb\"",
            b"\"a\"\"",
            b"\"abc\", \"def\"",
        ] {
            assert_eq!(tag(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn last_modified_is_a_valid_http_date_kept_verbatim() {
        assert_eq!(
            parse_last_modified(b" Sun, 06 Nov 1994 08:49:37 GMT "),
            Some("Sun, 06 Nov 1994 08:49:37 GMT".to_string())
        );
        assert_eq!(
            parse_last_modified(b"Sun Nov  6 08:49:37 1994"),
            Some("Sun Nov  6 08:49:37 1994".to_string())
        );
        for bad in [&b""[..], b"yesterday", b"1994-11-06T08:49:37Z", b"\xff"] {
            assert_eq!(parse_last_modified(bad), None);
        }
    }

    #[test]
    fn connect_answers_need_an_http_1_line_and_three_digits() {
        let status = |text: &[u8]| parse_connect_status(text);
        assert_eq!(
            status(b"HTTP/1.1 200 Connection established\r\n\r\n"),
            Some(200)
        );
        assert_eq!(status(b"HTTP/1.0 407\r\n\r\n"), Some(407));
        for bad in [
            &b"HTTP/1.1 +20 x\r\n\r\n"[..],
            b"HTTP/1.1 20 x\r\n\r\n",
            b"HTTP/1.1 2000 x\r\n\r\n",
            b"HTTP/2 200\r\n\r\n",
            b"SSH-2.0-OpenSSH\r\n\r\n",
            b"HTTP/1.1 \xff00\r\n\r\n",
            b"",
        ] {
            assert_eq!(status(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn location_joins_against_the_current_url() {
        let base = Url::parse("https://cdn.example.com/a/b/file.bin?x=1").unwrap();
        let join = |text: &[u8]| join_location(&base, text).map(String::from);
        assert_eq!(
            join(b"https://mirror.example.org/f").as_deref(),
            Ok("https://mirror.example.org/f")
        );
        assert_eq!(
            join(b"/root.bin").as_deref(),
            Ok("https://cdn.example.com/root.bin")
        );
        assert_eq!(
            join(b" other.bin\t").as_deref(),
            Ok("https://cdn.example.com/a/b/other.bin")
        );
        assert_eq!(
            join(b"//other.example/x").as_deref(),
            Ok("https://other.example/x")
        );
        assert_eq!(join(b"").unwrap_err(), "Location is empty");
        assert_eq!(join(b"  ").unwrap_err(), "Location is empty");
        assert_eq!(join(b"/caf\xc3\xa9").unwrap_err(), "Location is not text");
        assert_eq!(join(b"/a\x00b").unwrap_err(), "Location is not text");
        let err = join(b"https://[::1/").unwrap_err();
        assert!(
            err.starts_with("invalid Location \"https://[::1/\": "),
            "{err}"
        );
        let long = format!("https://[{}", "a".repeat(5000));
        let err = join(long.as_bytes()).unwrap_err();
        assert!(err.len() < 400, "{}", err.len());
        assert!(err.contains("…\" (5009 characters)"), "{err}");
        // Escaping doubles backslashes; the cut comes after it, between escapes.
        let escaped = format!("https://[{}", "\\".repeat(5000));
        let err = join(escaped.as_bytes()).unwrap_err();
        let shown = err.split('"').nth(1).unwrap();
        assert_eq!(shown.chars().count(), MAX_SHOWN_CHARS, "{err}");
        assert!(shown.ends_with("\\\\…"), "{err}");
    }
}
