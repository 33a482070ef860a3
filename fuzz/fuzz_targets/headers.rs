//! Header values → the `headers` parsers. No panic, no overflow, and every
//! accepted value keeps its invariants: `start <= end < total`, a capped
//! `Retry-After`, a quoted strong tag of at most 256 bytes, a verbatim date,
//! and a joined `Location` that parses again to itself.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use gem_resources::headers::{
    join_location, parse_content_range, parse_last_modified, parse_retry_after, parse_strong_etag,
};
use gem_resources_fuzz::metered;
use libfuzzer_sys::fuzz_target;
use url::Url;

fn base() -> &'static Url {
    static BASE: OnceLock<Url> = OnceLock::new();
    BASE.get_or_init(|| Url::parse("https://cdn.example.com/models/a/ocr-v3.onnx?x=1").unwrap())
}

fuzz_target!(|data: &[u8]| {
    let n = data.len();
    if let Some(range) = metered("Content-Range", n, || parse_content_range(data)) {
        assert!(range.start <= range.end, "{range:?}");
        if let Some(total) = range.total {
            assert!(range.end < total, "{range:?}");
        }
        let text = String::from_utf8_lossy(data);
        assert!(text
            .trim_matches([' ', '\t'])
            .to_ascii_lowercase()
            .starts_with("bytes "));
    }

    for now in [SystemTime::UNIX_EPOCH, SystemTime::now()] {
        if let Some(wait) = metered("Retry-After", n, || parse_retry_after(data, now)) {
            assert!(wait <= Duration::from_secs(24 * 60 * 60), "{wait:?}");
        }
    }

    if let Some(tag) = metered("ETag", n, || parse_strong_etag(data)) {
        assert!(tag.len() >= 2 && tag.len() <= 256, "{tag:?}");
        assert!(tag.starts_with('"') && tag.ends_with('"'), "{tag:?}");
        assert!(!tag[1..tag.len() - 1].contains(['"', ' ', '\t']), "{tag:?}");
        assert!(tag.bytes().all(|b| b.is_ascii_graphic()), "{tag:?}");
        assert_eq!(
            parse_strong_etag(tag.as_bytes()).as_deref(),
            Some(tag.as_str())
        );
    }

    if let Some(date) = metered("Last-Modified", n, || parse_last_modified(data)) {
        assert!(
            !date.starts_with([' ', '\t']) && !date.ends_with([' ', '\t']),
            "{date:?}"
        );
        assert_eq!(
            parse_last_modified(date.as_bytes()).as_deref(),
            Some(date.as_str())
        );
    }

    match metered("Location", n, || join_location(base(), data)) {
        // Only `https` hops are followed (check_hop refuses other schemes);
        // the URL parser does not re-read every `file:` URL to itself.
        Ok(url) if url.scheme() == "https" => {
            let again = Url::parse(url.as_str()).expect("a joined URL parses again");
            assert_eq!(again, url);
        }
        Ok(_) => {}
        Err(reason) => assert!(reason.chars().count() <= 400, "{} chars", reason.len()),
    }
});
