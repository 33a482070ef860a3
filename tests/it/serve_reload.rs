//! `serve` follows its configuration: on SIGHUP and when the file changes,
//! keeping the running configuration on an invalid edit.

use std::process::Command;

use serde_json::json;

use crate::support::*;

fn log(env: &Env) -> String {
    std::fs::read_to_string(env.dir.path().join("serve.log")).unwrap_or_default()
}

fn allow(host: &str) -> String {
    format!("mode = \"allowlist\"\nhosts = [\"{host}\"]")
}

/// Starts `serve` with an allowlist that refuses the gem's only host and
/// waits until the refusal is recorded.
async fn refused_gem(env: &Env, interval: &str) -> (Spawned, Vec<u8>) {
    env.write_config(&allow("other.test"));
    let body = bytes(20_000, 130);
    let url = env.serve("/p.bin", &body);
    let gems = write_gem_folder(env, "g", json!([required_entry("p", &url, &body)]));
    let serve = spawn_serve(env, &gems, interval, &env.dir.path().join("serve.log"));
    wait_until("the policy refusal is logged", || {
        log(env).contains("E_RESOURCE_POLICY")
    })
    .await;
    assert_eq!(env.origin.hits("/p.bin"), 0);
    (serve, body)
}

#[tokio::test]
async fn serve_applies_a_changed_config_file() {
    let env = Env::new().await;
    let (mut serve, body) = refused_gem(&env, "0.05").await;
    env.write_config(&allow("origin.test"));
    wait_until("the file is downloaded", || {
        !stored_files(&env, &body).is_empty()
    })
    .await;
    assert!(
        log(&env).contains("network policy reloaded"),
        "{}",
        log(&env)
    );
    assert!(serve.0.try_wait().unwrap().is_none());
}

#[tokio::test]
async fn serve_reloads_on_sighup() {
    let env = Env::new().await;
    // Scans (and file checks) only every 10 minutes: only SIGHUP can reload.
    let (mut serve, body) = refused_gem(&env, "600").await;
    env.write_config(&allow("origin.test"));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        stored_files(&env, &body).is_empty(),
        "no reload without SIGHUP"
    );
    let status = Command::new("kill")
        .args(["-HUP", &serve.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_until("the file is downloaded", || {
        !stored_files(&env, &body).is_empty()
    })
    .await;
    assert!(
        serve.0.try_wait().unwrap().is_none(),
        "SIGHUP must not stop serve"
    );
}

#[tokio::test]
async fn serve_keeps_its_configuration_on_an_invalid_edit() {
    let env = Env::new().await;
    let (mut serve, body) = refused_gem(&env, "0.05").await;
    let path = env.dir.path().join("config.toml");
    std::fs::write(&path, "[network]\nmode = \"sometimes\"\n").unwrap();
    wait_until("the rejection is logged", || {
        log(&env).contains("configuration rejected")
    })
    .await;
    assert!(
        serve.0.try_wait().unwrap().is_none(),
        "a bad edit stopped serve"
    );
    assert_eq!(
        env.origin.hits("/p.bin"),
        0,
        "the running policy still holds"
    );
    // A store change needs a restart; the policy in the same edit applies.
    env.write_config_full(&allow("origin.test"), "");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("store = \"store\"", "store = \"elsewhere\"");
    std::fs::write(&path, text).unwrap();
    wait_until("the file is downloaded", || {
        !stored_files(&env, &body).is_empty()
    })
    .await;
    assert!(log(&env).contains("store changed"), "{}", log(&env));
    assert!(serve.0.try_wait().unwrap().is_none());
}
