//! The five-minute recipe's origin (`examples/serve_folder.rs`) as an author
//! uses it: a fixed port, a capped rate, its certificate kept and reused,
//! a request log; killed and started again under a download, which then
//! resumes with a range. Runs the example's binary, which `cargo test`
//! builds with the tests.

#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// The example's binary beside this test's build of the CLI.
fn example() -> Option<PathBuf> {
    let bin = Path::new(env!("CARGO_BIN_EXE_gem-resources"));
    let path = bin.parent()?.join("examples").join("serve_folder");
    path.exists().then_some(path)
}

/// A port free now.
fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts the example on `folder`, waits for its last line on stdout, and
/// returns it with its log file.
fn start(folder: &Path, args: &[&str], log: &Path) -> (Spawned, String) {
    let mut child = Command::new(example().unwrap())
        .arg(folder)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !text.contains("# Serving") {
        assert!(
            Instant::now() < deadline,
            "the example did not start: {text}"
        );
        if out.read_line(&mut text).unwrap() == 0 {
            panic!(
                "the example ended: {text}\n{}",
                std::fs::read_to_string(log).unwrap()
            );
        }
    }
    (Spawned(child), text)
}

#[tokio::test]
async fn a_restarted_origin_keeps_its_port_and_certificate_and_the_download_resumes_with_a_range() {
    let Some(_) = example() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "the serve_folder example is not built (cargo test builds it)"
        );
        eprintln!("SKIPPED: the serve_folder example is not built (run `cargo test`, or `cargo build --example serve_folder`)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("files");
    std::fs::create_dir(&folder).unwrap();
    let body = bytes(3 << 20, 71);
    std::fs::write(folder.join("model.bin"), &body).unwrap();
    let port = free_port().to_string();
    let (log1, log2) = (
        dir.path().join("origin1.log"),
        dir.path().join("origin2.log"),
    );
    let (mut first, said) = start(&folder, &["--port", &port, "--rate", "512k"], &log1);
    assert!(
        said.contains(&format!(
            "127.0.0.1:{port}, 512.0 KiB/s (524288 bytes/s) per connection"
        )),
        "{said}"
    );
    let state = folder.join(".serve-folder");
    let pem = std::fs::read(state.join("server.pem")).unwrap();
    let config = state.join("dev.toml");
    let manifest = state.join("notochord.json");
    assert!(std::fs::read_to_string(&manifest)
        .unwrap()
        .contains(&sha256_hex(&body)));
    assert!(!std::fs::read_to_string(&manifest)
        .unwrap()
        .contains(".serve-folder"));
    let store = dir.path().join("store");
    let args = |store: &Path| -> Vec<String> {
        [
            "--config",
            config.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
            "fetch",
            manifest.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    // At 512 KiB/s the 3 MiB take 6 s: stopped after about one.
    let fetch = Command::new(env!("CARGO_BIN_EXE_gem-resources"))
        .args(args(&store))
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(fetch.id() as i32, libc::SIGINT) };
    let stopped = fetch.wait_with_output().unwrap();
    assert_eq!(stopped.status.code(), Some(130), "{}", stderr(&stopped));
    assert!(stderr(&stopped).contains("kept"), "{}", stderr(&stopped));
    // The answers cut by the stop are logged once the origin sees it.
    wait_until("the first answers in the request log", || {
        std::fs::read_to_string(&log1)
            .unwrap()
            .lines()
            .any(|l| l.starts_with("GET /model.bin range=") && l.contains("(cut short)"))
    })
    .await;
    let _ = first.0.kill();
    let _ = first.0.wait();

    // Started again: the same port and certificate, so the same
    // configuration works, and the download continues with a range.
    let (_second, said) = start(&folder, &["--port", &port], &log2);
    assert!(said.contains(&format!("127.0.0.1:{port} until")), "{said}");
    assert_eq!(std::fs::read(state.join("server.pem")).unwrap(), pem);
    let out = run_bin_env(args(&store), &[]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let logged = std::fs::read_to_string(&log2).unwrap();
    // Only what was missing crossed again, in ranges.
    let answers: Vec<&str> = logged
        .lines()
        .filter(|l| l.starts_with("GET /model.bin"))
        .collect();
    assert!(
        !answers.is_empty(),
        "no request after the restart: {logged}"
    );
    let mut sent = 0u64;
    for answer in &answers {
        assert!(
            answer.contains("range=bytes=") && answer.contains(" 206 sent "),
            "{answer}"
        );
        sent += answer
            .split(" sent ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap();
    }
    assert!(
        sent < body.len() as u64,
        "{sent} bytes sent again: {logged}"
    );
}

#[tokio::test]
async fn a_rate_is_read_as_the_cli_reads_it_and_the_folder_is_named_plainly() {
    let Some(example) = example() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "the serve_folder example is not built (cargo test builds it)"
        );
        eprintln!("SKIPPED: the serve_folder example is not built");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("my-files");
    std::fs::create_dir(&folder).unwrap();
    std::fs::create_dir(dir.path().join("p")).unwrap();
    std::fs::write(folder.join("model.bin"), bytes(1000, 72)).unwrap();
    // `2m` as curl and `--limit-rate` read it, through a path with `..`.
    let roundabout = dir.path().join("p").join("..").join("my-files");
    let log = dir.path().join("origin.log");
    let (_origin, said) = start(&roundabout, &["--rate", "2m"], &log);
    assert!(
        said.contains(", 2.0 MiB/s (2097152 bytes/s) per connection"),
        "{said}"
    );
    assert!(!said.contains(".."), "a path not normalised: {said}");
    let plain = std::fs::canonicalize(&folder).unwrap();
    let written = plain.join(".serve-folder").join("notochord.json");
    assert!(said.contains(&written.display().to_string()), "{said}");
    // A rate it cannot read is named, beside the usage line.
    let out = Command::new(example)
        .arg(&folder)
        .args(["--rate", "fast"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rate: not a rate: \"fast\""), "{err}");
}
