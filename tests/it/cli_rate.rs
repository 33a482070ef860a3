//! `--limit-rate RATE` caps one command's bandwidth, over the configuration.

use std::time::Instant;

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn limit_rate_caps_one_command_over_the_configuration() {
    let env = Env::new().await;
    env.write_config("max_bytes_per_sec = 100000000");
    let body = bytes(600 * 1024, 61);
    let url = env.serve("/capped.bin", &body);
    let manifest = env.write_manifest("m.json", json!([entry("capped", &url, &body)]));
    let start = Instant::now();
    let out = env
        .run(&["--limit-rate", "200k", "fetch", manifest.to_str().unwrap()])
        .await;
    let elapsed = start.elapsed().as_secs_f64();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // One second's worth goes at once, the other 400 KiB at 200 KiB/s.
    assert!(elapsed >= 1.7, "took {elapsed:.2} s");

    let out = env.run(&["--limit-rate", "fast", "status"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--limit-rate"), "{}", stderr(&out));
}

#[tokio::test]
async fn limit_rate_0_is_no_cap_as_curl_reads_it() {
    let env = Env::new().await;
    // A configured cap that would take about 6 s for this file.
    env.write_config("max_bytes_per_sec = 102400");
    let body = bytes(700 * 1024, 62);
    let url = env.serve("/uncapped.bin", &body);
    let manifest = env.write_manifest("m.json", json!([entry("u", &url, &body)]));
    let start = Instant::now();
    let out = env
        .run(&["--limit-rate", "0", "fetch", manifest.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let elapsed = start.elapsed().as_secs_f64();
    assert!(
        elapsed < 4.0,
        "the configured cap still applied: {elapsed:.2} s"
    );
}
