//! Parsers for the response headers a server controls (Content-Range,
//! Retry-After, ETag, Last-Modified).

use std::time::{Duration, SystemTime};

/// A `Content-Range: bytes START-END/TOTAL` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive).
    pub end: u64,
    /// Complete length, when the server knows it.
    pub total: Option<u64>,
}

/// Longest wait a `Retry-After` can express here (a year).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(365 * 86_400);

/// `bytes START-END/TOTAL` or `bytes START-END/*`; `None` for anything else.
pub fn parse_content_range(value: &[u8]) -> Option<ContentRange> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let rest = text.strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let start = digits(start)?;
    let end = digits(end)?;
    let total = match total {
        "*" => None,
        t => Some(digits(t)?),
    };
    let valid = start <= end && total.is_none_or(|t| end < t);
    valid.then_some(ContentRange { start, end, total })
}

/// Delta-seconds or an HTTP date; a date in the past is zero.
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if let Some(secs) = digits(text) {
        return Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
    }
    let when = httpdate::parse_http_date(text).ok()?;
    Some(
        when.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

/// A strong entity tag (`"abc"`, not `W/"abc"`), verbatim.
pub fn parse_strong_etag(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    let ok = text.len() <= 256
        && inner
            .bytes()
            .all(|b| b == 0x21 || (0x23..=0x7e).contains(&b) || b >= 0x80);
    (ok && text.is_ascii()).then(|| text.to_string())
}

/// A `Last-Modified` value that is a valid HTTP date, verbatim.
pub fn parse_last_modified(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?.trim();
    httpdate::parse_http_date(text).ok()?;
    Some(text.to_string())
}

fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges() {
        assert_eq!(
            parse_content_range(b"bytes 10-19/20"),
            Some(ContentRange {
                start: 10,
                end: 19,
                total: Some(20)
            })
        );
        assert_eq!(parse_content_range(b"bytes 10-19/*").unwrap().total, None);
        for bad in [
            &b"bytes */20"[..],
            b"bytes 20-10/30",
            b"bytes 10-20/20",
            b"bytes -1-2/3",
            b"items 1-2/3",
            b"bytes 1-2/99999999999999999999",
        ] {
            assert_eq!(parse_content_range(bad), None);
        }
    }

    #[test]
    fn retry_after_values() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(parse_retry_after(b"7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after(b"Wed, 21 Oct 2015 07:28:10 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after(b"Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after(b"soon", now), None);
        assert_eq!(parse_retry_after(b"-3", now), None);
    }

    #[test]
    fn validators() {
        assert_eq!(parse_strong_etag(b"\"abc\""), Some("\"abc\"".into()));
        assert_eq!(parse_strong_etag(b"W/\"abc\""), None);
        assert_eq!(parse_strong_etag(b"abc"), None);
        assert!(parse_last_modified(b"Wed, 21 Oct 2015 07:28:00 GMT").is_some());
        assert!(parse_last_modified(b"yesterday").is_none());
    }
}
