//! The engine end to end, through the library and the binary.

use gem_resources::{download, Fetcher, Store};

use crate::support::*;
#[tokio::test]
async fn a_declared_file_is_downloaded_verified_and_named_after_its_url() {
    let env = Env::new().await;
    let body = bytes(300_000, 7);
    let url = env.serve("/models/ocr-v3.onnx", &body);
    let manifest = gem_resources::parse_manifest(
        serde_json::to_vec(&serde_json::json!({ "resources": [entry("ocr", &url, &body)] }))
            .unwrap()
            .as_slice(),
    )
    .unwrap();
    let config = env.config();
    let fetcher = Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    let path = download(
        &fetcher,
        &store,
        &manifest.resources[0],
        no_retry(),
        &mut |_| {},
    )
    .await
    .unwrap();
    assert!(path.ends_with("ocr-v3.onnx"), "{}", path.display());
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert_eq!(env.origin.hits("/models/ocr-v3.onnx"), 1);
}

#[tokio::test]
async fn autofill_through_the_binary_reports_size_and_digest() {
    let env = Env::new().await;
    let body = bytes(1000, 1);
    let url = env.serve("/a.bin", &body);
    let out = env.run(&["--json", "autofill", url.as_str()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["size"], 1000);
    assert_eq!(v["sha256"], sha256_hex(&body));
}
