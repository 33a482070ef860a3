//! Config text → `Config::parse`. An accepted configuration gives a policy,
//! timeouts and limits that can be used without a panic; a refused one gives
//! a message.
#![no_main]

use gem_resources::Config;
use gem_resources_fuzz::metered;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match metered("Config::parse", text.len(), || Config::parse(text)) {
        Ok(config) => {
            assert!(
                config.policy().is_ok(),
                "accepted hosts must build a policy"
            );
            let connect = config.connect_timeout();
            let stall = config.stall_timeout();
            assert!(!connect.is_zero() && !stall.is_zero());
            let retry = config.retry_policy();
            let _ = retry.backoff.saturating_mul(1 << retry.retries.min(16));
            assert!(config.service.max_concurrent_downloads >= 1);
            assert!(config.service.max_per_host >= 1);
            let policy = config.policy().unwrap();
            for host in ["cdn.example.com", "8.8.8.8", "[2606:4700::1111]", ""] {
                let _ = policy.permits(host);
            }
        }
        Err(message) => assert!(!message.to_string().is_empty()),
    }
});
