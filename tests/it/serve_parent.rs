//! `serve` started by an app: it stops as on SIGTERM when the app ends
//! (`--parent-pid`, even killed with SIGKILL; `--exit-with-stdin`), keeps
//! only what the API installs when no gems folder is given, and its
//! `E_RESOURCE_BUSY` document names the holder.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::api::{exits, service_file, Line};
use crate::support::*;

/// Reads `stdout` line by line on a thread of its own: each line, then
/// `None` at its end (every writer gone).
fn lines(stdout: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<Option<String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            match line {
                Ok(line) => {
                    let _ = tx.send(Some(line));
                }
                Err(_) => break,
            }
        }
        let _ = tx.send(None);
    });
    rx
}

/// The next line of `rx` (at most 10 s).
fn next_line(rx: &std::sync::mpsc::Receiver<Option<String>>) -> Option<String> {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("serve said nothing within 10 s")
}

/// `serve --json` with the env's configuration and `args`, stdout piped,
/// stdin `stdin`, stderr (info logs) going to `log`.
fn spawn_serve_json(env: &Env, args: &[&str], stdin: Stdio, log: &std::path::Path) -> Spawned {
    Spawned(
        Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .arg("--config")
            .arg(env.dir.path().join("config.toml"))
            .args(["serve", "--json"])
            .args(args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// A process that runs until killed: the "app" a test names as the parent.
fn app() -> Spawned {
    Spawned(Command::new("sleep").arg("60").spawn().unwrap())
}

#[tokio::test]
async fn serve_stops_when_the_process_it_names_ends_and_answers_the_api_without_gems() {
    let env = Env::new().await;
    let mut parent = app();
    let log = env.dir.path().join("serve.log");
    let pid = parent.0.id().to_string();
    let mut serve = spawn_serve_json(&env, &["--parent-pid", &pid], Stdio::null(), &log);
    let out = lines(serve.0.stdout.take().unwrap());
    let first: Value = serde_json::from_str(&next_line(&out).unwrap()).unwrap();
    assert_eq!(first["event"], "listening", "{first}");
    // No gems folder: the API installs, and the file is served.
    let body = bytes(5_000, 11);
    let url = env.serve("/api.bin", &body);
    let mut client = Line::connect(first["socket"].as_str().unwrap()).await;
    let manifest = json!({ "resources": [entry("m", &url, &body)] });
    client
        .result("install", json!({ "gem": "g", "manifest": manifest }))
        .await;
    let path = client
        .result("path", json!({ "gem": "g", "id": "m" }))
        .await;
    assert_eq!(std::fs::read(path["path"].as_str().unwrap()).unwrap(), body);
    // The app ends: the service stops, as on SIGTERM, saying why.
    parent.0.kill().unwrap();
    parent.0.wait().unwrap();
    let status = within("serve stops", async {
        exits(&mut serve).await;
        serve.0.wait().unwrap()
    })
    .await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!("stopping: parent process {pid} ended")),
        "{said}"
    );
    assert!(!store_root(&env).join("service.json").exists());
}

#[tokio::test]
async fn serve_refuses_to_start_for_a_parent_that_is_not_running() {
    let env = Env::new().await;
    let mut gone = app();
    gone.0.kill().unwrap();
    gone.0.wait().unwrap();
    let pid = gone.0.id().to_string();
    let out = env.run(&["serve", "--json", "--parent-pid", &pid]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let doc: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(doc["code"], "E_RESOURCE_USAGE", "{doc}");
    assert!(
        doc["message"].as_str().unwrap().contains("is not running"),
        "{doc}"
    );
    assert!(!env.store_dir().exists(), "no store is opened for it");
}

#[tokio::test]
async fn serve_stops_when_its_standard_input_closes() {
    let env = Env::new().await;
    let log = env.dir.path().join("serve.log");
    let mut serve = spawn_serve_json(&env, &["--exit-with-stdin"], Stdio::piped(), &log);
    let out = lines(serve.0.stdout.take().unwrap());
    let first: Value = serde_json::from_str(&next_line(&out).unwrap()).unwrap();
    assert_eq!(first["event"], "listening", "{first}");
    // Bytes on the pipe change nothing; its end stops the service.
    let mut stdin = serve.0.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, b"anything\n").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(serve.0.try_wait().unwrap().is_none(), "serve stopped early");
    drop(stdin);
    let status = within("serve stops", async {
        exits(&mut serve).await;
        serve.0.wait().unwrap()
    })
    .await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{said}");
    assert!(said.contains("stopping: standard input closed"), "{said}");
}

#[tokio::test]
async fn a_second_serve_json_names_the_holder_pid_and_socket() {
    let env = Env::new().await;
    let log = env.dir.path().join("serve.log");
    let serve = spawn_serve_json(&env, &[], Stdio::null(), &log);
    let held = service_file(&env.store_dir(), serve.0.id()).await;
    let out = env.run(&["serve", "--json"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    let doc: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(doc["code"], "E_RESOURCE_BUSY", "{doc}");
    assert_eq!(doc["pid"], json!(serve.0.id()), "{doc}");
    assert_eq!(doc["socket"], json!(held.socket), "{doc}");
}

/// The app is a shell that started `serve` naming itself (`$$`), and is
/// killed with SIGKILL while a download runs: `serve` stops as on
/// SIGTERM, keeping the bytes it received, and removes `service.json`.
#[tokio::test]
async fn serve_stops_when_the_shell_that_started_it_is_killed() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(2_000_000, 12);
    let cut = body.len() / 2;
    let url = env.serve_held("/held.bin", &body, cut);
    let log = env.dir.path().join("serve.log");
    let config = env.dir.path().join("config.toml");
    let mut shell = Spawned(
        Command::new("sh")
            .arg("-c")
            .arg(r#""$0" --config "$1" serve --json --parent-pid $$ & wait"#)
            .arg(env!("CARGO_BIN_EXE_gem-resources"))
            .arg(&config)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let out = lines(shell.0.stdout.take().unwrap());
    let first: Value = serde_json::from_str(&next_line(&out).unwrap()).unwrap();
    assert_eq!(first["event"], "listening", "{first}");
    let manifest = env.write_manifest("m.json", json!([required_entry("big", &url, &body)]));
    let installed = env
        .run(&["install", "--no-wait", "g", manifest.to_str().unwrap()])
        .await;
    assert!(installed.status.success(), "{installed:?}");
    wait_until("bytes in the partial file", || {
        partial_files(&env)
            .iter()
            .any(|p| p.metadata().is_ok_and(|m| m.len() > 0))
    })
    .await;
    shell.0.kill().unwrap();
    shell.0.wait().unwrap();
    let killed = Instant::now();
    // Every line up to the end of stdout: serve's last writer is gone.
    let mut docs = Vec::new();
    while let Some(line) = next_line(&out) {
        docs.push(line);
    }
    let took = killed.elapsed();
    let said = std::fs::read_to_string(&log).unwrap();
    // About 0.3 s here; the bound only tells "stopped" from "runs on".
    assert!(took < Duration::from_secs(5), "{took:?}\n{said}");
    assert!(said.contains("stopping: parent process"), "{said}");
    let last: Value = serde_json::from_str(docs.last().unwrap()).unwrap();
    assert_eq!(last["interrupted"], true, "{last}");
    assert!(
        last["files"][0]["kept_bytes"].as_u64().unwrap() > 0,
        "{last}"
    );
    let store = gem_resources::Store::open(&env.store_dir()).unwrap();
    let kept = store.partial_len(&sha256_hex(&body));
    assert!(kept.is_some_and(|n| n > 0), "{kept:?}");
    assert!(!store_root(&env).join("service.json").exists());
}
