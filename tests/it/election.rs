//! One service per store among an app's instances, as real processes: the
//! app of `examples/app_instance.rs` (built into this test binary, which
//! runs itself again as each instance). The instance that runs the
//! service quits, or is killed with SIGKILL, while another's `path` waits
//! for a slow file: the other takes over, and its `path` resolves with the
//! verified file, the rest asked with a range. Three instances started
//! together: exactly one serves, and all get a role; killed, the one that
//! serves is followed by exactly one of the other two.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::*;

#[allow(dead_code)]
#[path = "../../examples/app_instance.rs"]
mod app;

/// Set in an instance's environment: its arguments (JSON).
const INSTANCE_ARGS: &str = "GEM_RESOURCES_TEST_APP_INSTANCE";

/// Not a test of its own: the app instance that the tests below start,
/// this binary run again with [`INSTANCE_ARGS`]; nothing otherwise.
#[test]
fn app_instance_process() {
    let Ok(args) = std::env::var(INSTANCE_ARGS) else {
        return;
    };
    let args: Vec<String> = serde_json::from_str(&args).unwrap();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let code = match runtime.block_on(app::run(&args)) {
        Ok(()) => 0,
        Err(e) => {
            println!("app: error {}: {e}", e.code());
            1
        }
    };
    drop(runtime);
    std::process::exit(code);
}

/// An instance of the app, with what it says on stdout (its `app: `
/// lines, without the prefix).
struct Instance {
    child: Spawned,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Instance {
    fn start(env: &Env, name: &str, args: &[&str]) -> Instance {
        let mut all = vec![env.dir.path().join("config.toml").display().to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        let log = std::fs::File::create(env.dir.path().join(format!("{name}.log"))).unwrap();
        let mut child = Spawned(
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "election::app_instance_process",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(INSTANCE_ARGS, serde_json::to_string(&all).unwrap())
                .env("RUST_LOG", "gem_resources=debug")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let out = child.0.stdout.take().unwrap();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                // The test harness may print on the same line first.
                if let Some((_, said)) = line.split_once("app: ") {
                    let _ = tx.send(said.to_string());
                }
            }
        });
        Instance { child, lines }
    }

    /// Its next line (at most 30 s; the origin runs on the test's
    /// runtime, which must not be blocked meanwhile).
    async fn next(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(30), self.lines.recv())
            .await
            .ok()
            .flatten()
            .expect("the instance said nothing within 30 s")
    }

    /// Its lines until one that starts with `prefix` (that one included).
    async fn until(&mut self, prefix: &str) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let line = self.next().await;
            let done = line.starts_with(prefix) || line.starts_with("error ");
            seen.push(line);
            if done {
                return seen;
            }
        }
    }

    /// Quits it as its user does: its standard input closes. Returns when
    /// it began to quit.
    fn quit(&mut self) -> Instant {
        let began = Instant::now();
        drop(self.child.0.stdin.take());
        began
    }

    /// `kill -9`. Returns when it was killed.
    fn kill(&mut self) -> Instant {
        self.child.0.kill().unwrap();
        let killed = Instant::now();
        self.child.0.wait().unwrap();
        killed
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// The bytes the partial file of the download in flight holds durably
/// (its record's `durable`), 0 while there is none.
fn durable_bytes(env: &Env) -> u64 {
    partial_files(env)
        .iter()
        .filter_map(|p| std::fs::read(PathBuf::from(format!("{}.json", p.display()))).ok())
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .filter_map(|r| r["durable"].as_u64())
        .max()
        .unwrap_or(0)
}

/// The pid of the service `status --json` names.
async fn service_pid(env: &Env) -> u64 {
    let status = env.run(&["--json", "status"]).await;
    let doc: serde_json::Value = serde_json::from_str(stdout(&status).trim()).unwrap();
    doc["service"]["pid"].as_u64().unwrap_or(0)
}

/// A serves; B waits on a `path` of a slow file through it, some of its
/// bytes kept durably; A quits (or is killed); B takes over and its
/// `path` resolves with the file, the rest asked with a range. Returns
/// the time from A's end to B's path.
async fn takeover(kill: bool) -> Duration {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(2_000_000, 21);
    let url = env.serve_held("/big.bin", &body, body.len() / 2);
    let mut a = Instance::start(&env, "a", &[]);
    assert_eq!(a.next().await, "role service");
    let manifest = env.write_manifest("m.json", json!([entry("big", &url, &body)]));
    let out = env.run(&["install", "g", manifest.to_str().unwrap()]).await;
    assert!(out.status.success(), "{out:?}");
    let mut b = Instance::start(&env, "b", &["g", "big"]);
    assert_eq!(b.next().await, "role client");
    // Bytes on disk, recorded as durable (a checkpoint, every 2 s).
    let deadline = Instant::now() + Duration::from_secs(20);
    while durable_bytes(&env) == 0 {
        assert!(Instant::now() < deadline, "no durable bytes within 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The rest is sent once asked again.
    env.origin
        .route("/big.bin", Behaviour::ranged(&body, "\"v1\""));
    let gone = if kill { a.kill() } else { a.quit() };
    let said = b.until("path ").await;
    let took = gone.elapsed();
    let path = said
        .last()
        .unwrap()
        .strip_prefix("path ")
        .unwrap_or_else(|| {
            panic!(
                "{said:?}\n{}",
                std::fs::read_to_string(env.dir.path().join("b.log")).unwrap_or_default()
            )
        });
    assert!(said.contains(&"role service".to_string()), "{said:?}");
    assert_eq!(std::fs::read(Path::new(path)).unwrap(), body);
    let ranges = env.origin.ranges("/big.bin");
    assert!(
        ranges
            .iter()
            .any(|r| r.starts_with("bytes=") && !r.starts_with("bytes=0-")),
        "the rest was not asked with a range: {ranges:?}"
    );
    assert_eq!(service_pid(&env).await, u64::from(b.pid()));
    if !kill {
        assert_eq!(a.next().await, "left");
    }
    took
}

#[tokio::test]
async fn a_waiting_path_resolves_with_the_file_after_the_serving_instance_quits() {
    let took = takeover(false).await;
    eprintln!("takeover after a quit: the waiting path resolved {took:?} after the quit");
}

#[tokio::test]
async fn a_waiting_path_resolves_with_the_file_after_the_serving_instance_is_killed() {
    let took = takeover(true).await;
    eprintln!("takeover after kill -9: the waiting path resolved {took:?} after the kill");
}

#[tokio::test]
async fn of_instances_racing_exactly_one_serves_and_every_one_gets_a_role() {
    let env = Env::new().await;
    let mut all: Vec<Instance> = ["a", "b", "c"]
        .iter()
        .map(|name| Instance::start(&env, name, &[]))
        .collect();
    let mut roles = Vec::new();
    for instance in &mut all {
        roles.push(instance.next().await);
    }
    let serving: Vec<usize> = (0..3).filter(|&i| roles[i] == "role service").collect();
    assert_eq!(serving.len(), 1, "{roles:?}");
    assert_eq!(
        roles.iter().filter(|r| *r == "role client").count(),
        2,
        "{roles:?}"
    );
    assert_eq!(service_pid(&env).await, u64::from(all[serving[0]].pid()));

    // The one that serves is killed: exactly one of the other two serves.
    let mut first = all.remove(serving[0]);
    first.kill();
    let mut roles = Vec::new();
    for instance in &mut all {
        roles.push(instance.until("role ").await.pop().unwrap());
    }
    let serving: Vec<usize> = (0..2).filter(|&i| roles[i] == "role service").collect();
    assert_eq!(serving.len(), 1, "{roles:?}");
    assert!(roles.contains(&"role client".to_string()), "{roles:?}");
    assert_eq!(service_pid(&env).await, u64::from(all[serving[0]].pid()));
    for instance in &mut all {
        instance.quit();
    }
}
