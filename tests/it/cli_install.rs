//! What `install` says about the gem it registers.

use serde_json::{json, Value};

use crate::support::*;

#[tokio::test]
async fn a_different_declared_gem_id_is_warned_about() {
    let env = Env::new().await;
    let body = bytes(100, 51);
    let url = env.serve("/a.bin", &body);
    // The manifest declares "sample".
    let manifest = env.write_manifest("m.json", json!([entry("a", &url, &body)]));
    let m = manifest.to_str().unwrap();
    let out = env.run(&["install", "other", m]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("warning: the manifest declares the gem id sample, installing it as other"),
        "{}",
        stderr(&out)
    );
    let out = env.run(&["install", "sample", m]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}

#[tokio::test]
async fn an_unchanged_reinstall_is_no_upgrade() {
    let env = Env::new().await;
    let body = bytes(100, 52);
    let url = env.serve("/a.bin", &body);
    let manifest = env.write_manifest("m.json", json!([entry("a", &url, &body)]));
    let m = manifest.to_str().unwrap();
    let report = |out: &std::process::Output| -> Value {
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["report"].clone()
    };
    let first = env.run(&["--json", "install", "sample", m]).await;
    assert_eq!(report(&first)["upgrade"], false, "{}", stdout(&first));
    let again = env.run(&["--json", "install", "sample", m]).await;
    let again = report(&again);
    assert_eq!(again["unchanged"], true, "{again}");
    assert_eq!(again["upgrade"], false, "{again}");
    let manifest = env.write_manifest("m.json", json!([entry("b", &url, &body)]));
    let changed = env
        .run(&["--json", "install", "sample", manifest.to_str().unwrap()])
        .await;
    assert_eq!(report(&changed)["upgrade"], true, "{}", stdout(&changed));
}
