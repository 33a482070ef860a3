//! `serve` says at start what it runs with.

use crate::support::*;

#[tokio::test]
async fn serve_logs_its_configuration_at_start() {
    let env = Env::new().await;
    env.write_config_full(
        "mode = \"blocklist\"\nhosts = [\"evil.test\", \"blocked.test\"]\nmax_bytes_per_sec = 2097152",
        "[service]\nmax_concurrent_downloads = 3\nmax_per_host = 2",
    );
    let gems = env.dir.path().join("gems");
    std::fs::create_dir_all(&gems).unwrap();
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_logged(&env, &["serve", "--gems", gems.to_str().unwrap()], &log);
    wait_until("the start line", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("serving: "))
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text.lines().find(|l| l.contains("serving: ")).unwrap();
    for part in [
        format!(
            "configuration {}",
            env.dir.path().join("config.toml").display()
        ),
        format!("store {}", env.store_dir().display()),
        format!("gems {}", gems.display()),
        "policy blocklist (2 host(s))".to_string(),
        "bandwidth cap 2.0 MiB/s".to_string(),
        "at most 3 download(s) at once, 2 per host".to_string(),
    ] {
        assert!(line.contains(&part), "{part:?} missing: {line}");
    }
}
