//! What `install` says about the gem it registers.

use serde_json::{json, Value};

use crate::support::*;

#[tokio::test]
async fn the_gem_id_comes_from_the_manifest_and_a_different_one_needs_as() {
    let env = Env::new().await;
    let body = bytes(100, 51);
    let url = env.serve("/a.bin", &body);
    let manifest = env.dir.path().join("m.json");
    let doc = json!({ "id": "sample", "resources": [entry("a", &url, &body)] });
    std::fs::write(&manifest, doc.to_string()).unwrap();
    let m = manifest.to_str().unwrap();
    // A typo of the gem id would make a second gem: refused, naming both.
    let out = env.run(&["install", "other", m]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("declares the gem id sample, not other") && err.contains("--as other"),
        "{err}"
    );
    assert!(!env.store_dir().join("store-v1/gems/other.json").exists());
    // The manifest alone: its own id.
    let out = env.run(&["install", m]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.store_dir().join("store-v1/gems/sample.json").exists());
    // --as says another id is meant.
    let out = env.run(&["install", "--as", "other", m]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("installing sample as other"),
        "{}",
        stderr(&out)
    );
    assert!(env.store_dir().join("store-v1/gems/other.json").exists());
    // The same id given: no word about it.
    let out = env.run(&["install", "sample", m]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("note"), "{}", stderr(&out));
    // A manifest without an id needs one given.
    let bare = env.write_manifest("bare.json", json!([entry("a", &url, &body)]));
    let out = env.run(&["install", bare.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("declares no gem id"),
        "{}",
        stderr(&out)
    );
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
