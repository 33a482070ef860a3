//! What the binary says while it waits or changes course: another process
//! holding the same file, and a fallback to the next address.

use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::support::*;

#[tokio::test]
async fn a_fallback_to_the_mirror_is_a_warning_naming_resource_address_and_reason() {
    let env = Env::new().await;
    let body = bytes(10_000, 31);
    let url = env.serve("/bad.bin", &bytes(10_000, 32));
    let mirror = env.serve("/good.bin", &body);
    let mut resource = entry("ocr-model", &url, &body);
    resource["mirrors"] = json!([mirror.as_str()]);
    let manifest = env.write_manifest("m.json", json!([resource]));
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let warning = stderr(&out)
        .lines()
        .find(|l| l.contains("WARN"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no warning: {}", stderr(&out)));
    for part in [
        "ocr-model",
        url.as_str(),
        "SHA-256 mismatch",
        "trying the next address",
    ] {
        assert!(warning.contains(part), "{part:?} missing: {warning}");
    }
    // The last address failing is an error, not a warning about a next one.
    let only = entry("solo", &url, &bytes(10_000, 34));
    let manifest = env.write_manifest("solo.json", json!([only]));
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(!stderr(&out).contains("WARN"), "{}", stderr(&out));
}

#[tokio::test]
async fn waiting_for_another_process_downloading_the_same_file_is_said() {
    let env = Env::new().await;
    let body = bytes(50_000, 33);
    let gate = Gate::new();
    env.origin.route(
        "/held.bin",
        Behaviour::Gated {
            body: body.clone(),
            gate: gate.clone(),
        },
    );
    let url = env.url("origin.test", "/held.bin");
    let manifest = env.write_manifest("m.json", json!([entry("held", &url, &body)]));
    let config = env.dir.path().join("config.toml");
    let spawn = |json: bool, err: std::fs::File| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gem-resources"));
        command.arg("--config").arg(&config);
        if json {
            command.arg("--json");
        }
        command
            .arg("fetch")
            .arg(&manifest)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap()
    };
    let first_err = env.dir.path().join("first.err");
    let second_err = env.dir.path().join("second.err");
    let mut first = spawn(false, std::fs::File::create(&first_err).unwrap());
    wait_until("the first download to reach the origin", || {
        env.origin.hits("/held.bin") == 1
    })
    .await;
    let mut second = spawn(true, std::fs::File::create(&second_err).unwrap());
    wait_until("the second to say it waits", || {
        std::fs::read_to_string(&second_err).is_ok_and(|t| t.contains("waiting"))
    })
    .await;
    gate.open();
    let (a, b) =
        tokio::task::spawn_blocking(move || (first.wait().unwrap(), second.wait().unwrap()))
            .await
            .unwrap();
    assert!(a.success() && b.success(), "{a:?} {b:?}");
    let text = std::fs::read_to_string(&second_err).unwrap();
    let event: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(event, json!({ "event": "waiting", "resource": "held" }));
    assert_eq!(
        env.origin.hits("/held.bin"),
        1,
        "the second used the first's file"
    );
}
