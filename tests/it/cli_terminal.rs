//! What the binary prints for a person: text from manifests, servers and
//! records never reaches the terminal raw; active `[dev]` settings are
//! said on every run; a manifest or configuration that is not a regular
//! file is refused at once.

#[cfg(unix)]
use std::process::Command;

use serde_json::json;

use crate::support::*;

/// Characters that must never reach a terminal raw.
const RAW: [char; 6] = [
    '\u{1b}', '\u{7}', '\u{202e}', '\u{2066}', '\u{200b}', '\u{9b}',
];

fn assert_no_raw(text: &str) {
    for c in RAW {
        assert!(!text.contains(c), "raw {c:?} in {text:?}");
    }
}

#[tokio::test]
async fn status_escapes_text_from_the_manifest_the_server_and_earlier_records() {
    let env = Env::new().await;
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let url = env.url("origin.test", "/gone.bin");
    let body = bytes(100, 140);
    let id = "model\u{202e}txt.exe\u{200b}";
    // Bidirectional controls are refused in a description; a zero-width
    // space is not, and must still be shown escaped.
    let description = "safe\u{200b}text";
    let mut resource = required_entry(id, &url, &body);
    resource["description"] = json!(description);
    let manifest = env.write_manifest("m.json", json!([resource]));
    let out = env.run(&["install", "g", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // A failure record written earlier, holding a server's text with
    // terminal sequences: retitle, clear the screen, a C1 CSI, reverse.
    let log = store_root(&env).join("failures/g.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("HTTP status 404"), "{text}");
    let hostile = "\\u001b]0;owned\\u0007\\u001b[2J\\u009b31m gone \\u202e";
    std::fs::write(&log, text.replace("HTTP status 404", hostile)).unwrap();

    let out = env.run(&["status"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let shown = stdout(&out);
    assert_no_raw(&shown);
    assert!(shown.contains("model\\u{202e}txt.exe\\u{200b}"), "{shown}");
    assert!(shown.contains("safe\\u{200b}text"), "{shown}");
    assert!(
        shown.contains("\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{9b}31m gone \\u{202e}"),
        "{shown}"
    );
    assert_no_raw(&stderr(&out));

    // JSON keeps the exact text.
    let out = env.run(&["--json", "status"]).await;
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &value["gems"][0]["resources"][0];
    assert_eq!(r["id"], id);
    assert_eq!(r["description"], description);
    let all = value.to_string();
    assert!(all.contains("\u{202e}"), "{all}");
    assert!(all.contains("\\u001b]0;owned\\u0007"), "{all}");
}

#[tokio::test]
async fn active_dev_settings_are_said_on_every_run() {
    let env = Env::new().await;
    let warning = "warning: [dev] settings are active: extra_root_certs, resolve, allow_addresses (for development and tests only)";
    let url = env.url("origin.test", "/x.bin");
    for args in [vec!["status"], vec!["check-url", url.as_str()]] {
        for _ in 0..2 {
            let out = env.run(&args).await;
            let err = stderr(&out);
            assert_eq!(err.matches(warning).count(), 1, "{args:?}: {err}");
        }
    }
    // serve's start line.
    let gems = env.dir.path().join("gems");
    std::fs::create_dir_all(&gems).unwrap();
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_serve(&env, &gems, "0.05", &log);
    wait_until("serve started", || {
        std::fs::read_to_string(&log).is_ok_and(|t| {
            t.lines().any(|l| {
                l.contains("started")
                    && l.contains(
                        "[dev] settings are active: extra_root_certs, resolve, allow_addresses",
                    )
            })
        })
    })
    .await;
    // Without [dev], nothing is said.
    let plain = env.dir.path().join("plain.toml");
    std::fs::write(&plain, "store = \"store\"\n").unwrap();
    let out = run_bin(vec![
        "--config".into(),
        plain.display().to_string(),
        "status".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!stderr(&out).contains("[dev]"), "{}", stderr(&out));
}

#[cfg(unix)] // FIFOs by `mkfifo`
fn fifo(env: &Env, name: &str) -> std::path::PathBuf {
    let path = env.dir.path().join(name);
    let made = Command::new("mkfifo").arg(&path).status().unwrap();
    assert!(made.success());
    path
}

#[cfg(unix)] // FIFOs by `mkfifo`
/// Runs the binary with exactly `args`; a run that has not ended within
/// 10 seconds is killed and fails the test (a read that waits on a FIFO
/// would hang forever).
async fn run_bounded(env: &Env, args: &[&str]) -> (std::process::ExitStatus, String) {
    let log = env.dir.path().join("bounded.log");
    let mut child = Spawned(
        Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .args(args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let status = wait_output(&mut child).await;
    (status, std::fs::read_to_string(&log).unwrap())
}

#[cfg(unix)] // FIFOs by `mkfifo`
#[tokio::test]
async fn a_fifo_manifest_or_configuration_fails_at_once_with_a_clear_error() {
    let env = Env::new().await;
    let manifest = fifo(&env, "m.json");
    let m = manifest.to_str().unwrap();
    let config = env.dir.path().join("config.toml");
    let c = config.to_str().unwrap();
    for args in [
        vec!["--config", c, "check", m],
        vec!["--config", c, "fetch", m],
        vec!["--config", c, "install", "g", m],
    ] {
        let (status, err) = run_bounded(&env, &args).await;
        assert_eq!(status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("cannot read manifest") && err.contains("not a regular file"),
            "{args:?}: {err}"
        );
    }
    let config = fifo(&env, "config-fifo.toml");
    let (status, err) = run_bounded(&env, &["--config", config.to_str().unwrap(), "status"]).await;
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("E_RESOURCE_CONFIG: ")
            && err.contains("cannot read the configuration file")
            && err.contains("not a regular file"),
        "{err}"
    );
}
