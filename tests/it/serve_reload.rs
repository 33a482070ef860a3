//! `serve` follows its configuration: on SIGHUP and when the file changes,
//! keeping the running configuration on an invalid edit.

#[cfg(unix)]
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
    refused_gem_logged(env, interval, false).await
}

/// [`refused_gem`], with debug logs when `debug`.
async fn refused_gem_logged(env: &Env, interval: &str, debug: bool) -> (Spawned, Vec<u8>) {
    env.write_config(&allow("other.test"));
    let body = bytes(20_000, 130);
    let url = env.serve("/p.bin", &body);
    let gems = write_gem_folder(env, "g", json!([required_entry("p", &url, &body)]));
    let log_path = env.dir.path().join("serve.log");
    let args = [
        "serve",
        "--gems",
        gems.to_str().unwrap(),
        "--interval",
        interval,
    ];
    let serve = if debug {
        spawn_logged(env, &args, &log_path)
    } else {
        spawn_quiet(env, &args, &log_path)
    };
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

#[cfg(unix)] // SIGHUP, SIGTERM by `kill`; `mkfifo`
#[tokio::test]
async fn serve_reloads_on_sighup() {
    let env = Env::new().await;
    // Scans (and file checks) only every 10 minutes: only SIGHUP can reload.
    let (mut serve, body) = refused_gem_logged(&env, "600", true).await;
    let looks = || lines_with(&env, "looked at the configuration file");
    // The start's look may be logged just after the refusal: wait for it.
    wait_until("the look at start", || looks() >= 1).await;
    assert_eq!(looks(), 1, "{}", log(&env));
    env.write_config(&allow("origin.test"));
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
    // No reload without SIGHUP: the file was looked at only at the start
    // and at the signal, and the one reload is the signal's.
    let text = log(&env);
    assert_eq!(looks(), 2, "{text}");
    let reloads: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("network policy reloaded"))
        .collect();
    assert_eq!(reloads.len(), 1, "{text}");
    assert!(reloads[0].contains("forced=true"), "{text}");
    assert!(!text.contains("changed; it applies"), "{text}");
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

/// How many log lines contain `needle`.
fn lines_with(env: &Env, needle: &str) -> usize {
    log(env).lines().filter(|l| l.contains(needle)).count()
}

#[tokio::test]
async fn serve_applies_a_rewritten_config_only_once_it_stopped_changing() {
    let env = Env::new().await;
    let (mut serve, _body) = refused_gem(&env, "0.05").await;
    let path = env.dir.path().join("config.toml");
    let changed = "changed; it applies once unchanged";
    // `cat > config.toml`: truncated first (valid TOML: no policy at all),
    // then half written (still no [network]), then whole.
    std::fs::File::create(&path).unwrap();
    wait_until("the empty file is seen", || lines_with(&env, changed) == 1).await;
    std::fs::write(&path, "store = \"store\"\n").unwrap();
    wait_until("the half-written file is seen", || {
        lines_with(&env, changed) == 2
    })
    .await;
    env.write_config(
        r#"mode = "allowlist"
hosts = ["other.test", "cdn.test"]"#,
    );
    wait_until("the whole file is applied", || {
        lines_with(&env, "network policy reloaded") > 0
    })
    .await;
    let text = log(&env);
    assert_eq!(lines_with(&env, "network policy reloaded"), 1, "{text}");
    assert!(text.contains("hosts=2"), "{text}");
    assert_eq!(
        env.origin.hits("/p.bin"),
        0,
        "the blocked host got a request while the file was being written"
    );
    assert!(serve.0.try_wait().unwrap().is_none());
}

#[tokio::test]
async fn serve_says_so_when_a_reload_drops_the_network_section() {
    let env = Env::new().await;
    let (mut serve, body) = refused_gem(&env, "0.05").await;
    // The same file without its [network] section: the default policy
    // (a blocklist of nothing) lets the host through.
    let path = env.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let dev = &text[text.find("[dev]").unwrap()..];
    std::fs::write(&path, format!("store = \"store\"\n{dev}")).unwrap();
    wait_until("the file is downloaded", || {
        !stored_files(&env, &body).is_empty()
    })
    .await;
    let text = log(&env);
    let warning = text
        .lines()
        .position(|l| l.contains("has no [network] section any more"));
    let reload = text
        .lines()
        .position(|l| l.contains("network policy reloaded"));
    assert!(warning.is_some() && warning < reload, "{text}");
    assert!(serve.0.try_wait().unwrap().is_none());
}

#[cfg(unix)] // SIGHUP, SIGTERM by `kill`; `mkfifo`
#[tokio::test]
async fn serve_refuses_a_fifo_config_without_blocking_and_still_stops_on_sigterm() {
    let env = Env::new().await;
    let (mut serve, _body) = refused_gem(&env, "0.05").await;
    let path = env.dir.path().join("config.toml");
    std::fs::remove_file(&path).unwrap();
    let made = Command::new("mkfifo").arg(&path).status().unwrap();
    assert!(made.success());
    wait_until("the FIFO is refused", || {
        log(&env)
            .lines()
            .any(|l| l.contains("configuration rejected") && l.contains("not a regular file"))
    })
    .await;
    assert_eq!(env.origin.hits("/p.bin"), 0);
    let status = Command::new("kill")
        .args(["-TERM", &serve.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = wait_output(&mut serve).await;
    assert_eq!(exit.code(), Some(0), "{}", log(&env));
}
