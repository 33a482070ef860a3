//! A proxy's answer to `CONNECT` → `headers::parse_connect_status`, the
//! parser the tunnel runs on it. No panic, and an accepted answer is an
//! `HTTP/1.x` status line whose code is exactly three digits.
#![no_main]

use gem_resources::headers::parse_connect_status;
use gem_resources_fuzz::metered;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(status) = metered("CONNECT answer", data.len(), || parse_connect_status(data)) else {
        return;
    };
    assert!((100..=999).contains(&status), "{status}");
    let line = data.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = std::str::from_utf8(line).expect("an accepted line is text");
    assert!(line.starts_with("HTTP/1."), "{line:?}");
    let code = line.split(' ').nth(1).expect("a second field");
    assert_eq!(code, format!("{status:03}"), "{line:?}");
});
