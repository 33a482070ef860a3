//! A soak of the local API with many clients at once: a real `serve` keeps
//! a gems folder installed (the origin serves its files, some slowly, so
//! downloads are in flight), while Node clients
//! (`tests/support/api_soak_client.mjs`), command lines and in-process
//! `api::Client`s call it for 25 seconds, flip a blocklist of the origin's
//! host, and leave in the middle of calls, and `serve` is killed (SIGKILL)
//! and started again at random and stopped once with SIGTERM. Every random
//! choice comes from one printed seed (`API_SOAK_SEED` replays it).
//!
//! Checked:
//! 1. every path handed out, to any client, is the declared file (size,
//!    SHA-256), read-only and never replaced (read when it is handed out,
//!    and once more at the end);
//! 2. after a burst of clients, the last `serve` gives its descriptors back
//!    (to within a few of its count right after it started): a client that
//!    goes away, dropped or killed, leaves nothing open (see
//!    `Soak::last_serve`);
//! 3. `serve`'s memory stays under a fixed bound;
//! 4. a final policy (allow all) is seen alike, within a second, by the
//!    service, the store's record and fresh processes, and every required
//!    file then downloads;
//! 5. every client process exits within its bound, and every call of an
//!    in-process client is answered within its bound;
//! 6. under attack (`api_soak/attacks.rs`: batches never read, a flood of
//!    subscriptions, an `autofill` left in the middle, policy changes sent
//!    in one write), a new client gets in within a second, an abandoned
//!    `autofill` stops reading, and one connection's changes apply in the
//!    order sent; the memory bound (3.) holds through them;
//! 7. a `path` asked again right after one was left in the middle is
//!    never failed as cancelled.
//!
//! `API_SOAK_NO_ATTACKS=1` leaves the attacks out (to compare);
//! `API_SOAK_DEBUG=1` prints each error an in-process client got.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gem_resources::api::{discovery, Client};
use gem_resources::{Error, Mode, Policy, Store};
use serde_json::{json, Value};

use crate::support::api::{open_descriptors, rss_bytes, service_file, signal};
use crate::support::*;

// The seeded generator of the soak of `serve` (`tests/it/soak.rs`).
#[path = "../support/soak/world.rs"]
#[allow(dead_code, clippy::duplicate_mod)]
mod world;
use world::Rng;

mod attacks;

/// How long the faults last.
const CHAOS: Duration = Duration::from_secs(25);
/// Node client processes running at once during the faults.
const NODE_CLIENTS: usize = 10;
/// Command-line loops during the faults.
const CLI_LOOPS: usize = 5;
/// In-process `api::Client` tasks during the faults.
const RUST_CLIENTS: usize = 3;
/// The burst of clients on the last `serve`.
const BURST: Duration = Duration::from_secs(6);
/// The host the clients block and unblock.
const BLOCKED_HOST: &str = "cdn.test";
/// How long a client process may run past its own life (a `path` it asked
/// for last may wait for a slow download).
const CLIENT_GRACE: Duration = Duration::from_secs(30);
/// How long one command line may run.
const CLI_BOUND: Duration = Duration::from_secs(30);
/// How long a call of an in-process client may wait for its answer.
const CALL_BOUND: Duration = Duration::from_secs(30);
/// How long `serve` may take to stop on SIGTERM.
const STOP_BOUND: Duration = Duration::from_secs(20);
/// How long after the final policy every required file must be present.
const SETTLE: Duration = Duration::from_secs(60);
/// How long the service and the store's record may take to agree on the
/// final policy.
const AGREE: Duration = Duration::from_secs(1);
/// Peak resident memory allowed to `serve`.
const RSS_BOUND: u64 = 300 << 20;
/// Descriptors the last `serve` may hold after the burst beyond its count
/// right after it started.
const FD_MARGIN: usize = 8;
/// How long the descriptors may take to come back after the burst.
const FD_SETTLE: Duration = Duration::from_secs(20);

/// The bytes the origin serves: (size, slow). A slow file comes at about
/// 160 KiB/s, so its download is in flight for seconds.
const BODIES: &[(usize, bool)] = &[
    (900 << 10, true),
    (64 << 10, false),
    (700 << 10, true),
    (8 << 10, false),
    (1200 << 10, true),
    (300 << 10, false),
    (1 << 20, true),
    (200 << 10, true),
    (1, false),
    (32 << 10, false),
    (512 << 10, true),
    (16 << 10, false),
];

/// The gems: (gem, id, index in `BODIES`, required, url host, mirrored on
/// mirror.test). `beta/b2` declares the bytes of `alpha/a2`: one file for
/// two gems, required by one and lazy in the other. `delta` is installed
/// last, while the origin's host is blocked.
const DECLARED: &[(&str, &str, usize, bool, &str, bool)] = &[
    ("alpha", "a0", 0, true, "cdn.test", false),
    ("alpha", "a1", 1, true, "cdn.test", false),
    ("alpha", "a2", 2, false, "cdn.test", false),
    ("alpha", "a3", 3, false, "cdn.test", false),
    ("beta", "b0", 4, true, "cdn.test", true),
    ("beta", "b1", 5, false, "cdn.test", false),
    ("beta", "b2", 2, true, "other.test", false),
    ("gamma", "c0", 6, false, "cdn.test", false),
    ("gamma", "c1", 7, true, "cdn.test", false),
    ("gamma", "c2", 8, false, "cdn.test", false),
    ("gamma", "c3", 9, true, "mirror.test", false),
    ("delta", "d0", 10, true, "cdn.test", false),
    ("delta", "d1", 11, true, "cdn.test", false),
];

/// The gems of the gems folder from the start, which the clients use.
const GEMS: &[&str] = &["alpha", "beta", "gamma"];

/// The gem installed after the faults, while the origin's host is blocked.
const LATE_GEM: &str = "delta";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn ms(n: usize) -> Duration {
    Duration::from_millis(n as u64)
}

/// The last `n` lines of the file `path`.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A file as a client was handed it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct FileId {
    dev: u64,
    ino: u64,
}

/// Checks that `path` is the declared file: a regular, read-only file of
/// `size` bytes whose SHA-256 is `sha`, read through one handle.
fn verify(path: &Path, sha: &str, size: u64) -> Result<FileId, String> {
    let link = std::fs::symlink_metadata(path).map_err(|e| format!("cannot stat: {e}"))?;
    if !link.is_file() {
        return Err("not a regular file".into());
    }
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    let id = FileId {
        dev: meta.dev(),
        ino: meta.ino(),
    };
    if id.ino != link.ino() {
        return Err("replaced while it was opened".into());
    }
    if meta.permissions().mode() & 0o222 != 0 {
        return Err(format!("writable (mode {:o})", meta.permissions().mode()));
    }
    if meta.len() != size {
        return Err(format!("{} bytes, declared {size}", meta.len()));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    let got = sha256_hex(&bytes);
    if got != sha {
        return Err(format!("SHA-256 {got}, declared {sha}"));
    }
    Ok(id)
}

/// What every client reports to: the declared files, the paths handed out,
/// the counts and the violations.
struct Shared {
    start: Instant,
    /// (gem, id) → (SHA-256, size).
    declared: HashMap<(String, String), (String, u64)>,
    /// Every path handed out: the file it was, and what it must hold.
    seen: Mutex<BTreeMap<PathBuf, (FileId, String, u64)>>,
    counts: Mutex<BTreeMap<String, u64>>,
    violations: Mutex<Vec<String>>,
}

impl Shared {
    fn count(&self, key: &str) {
        self.add(key, 1);
    }

    fn add(&self, key: &str, n: u64) {
        *lock(&self.counts).entry(key.to_string()).or_default() += n;
    }

    fn counted(&self, key: &str) -> u64 {
        lock(&self.counts).get(key).copied().unwrap_or(0)
    }

    /// The sum of the counts whose key starts with `prefix` and ends with
    /// `suffix`.
    fn sum(&self, prefix: &str, suffix: &str) -> u64 {
        lock(&self.counts)
            .iter()
            .filter(|(k, _)| k.starts_with(prefix) && k.ends_with(suffix))
            .map(|(_, v)| v)
            .sum()
    }

    fn violation(&self, text: String) {
        let at = self.start.elapsed().as_secs_f64();
        eprintln!("[{at:7.2}] VIOLATION: {text}");
        lock(&self.violations).push(format!("[{at:7.2}] {text}"));
    }

    /// Checks the path `who` was handed for `gem`'s resource `id`.
    fn path_returned(&self, who: &str, gem: &str, id: &str, path: &Path) {
        self.count(&format!("paths returned ({who})"));
        let key = (gem.to_string(), id.to_string());
        let Some((sha, size)) = self.declared.get(&key).cloned() else {
            self.violation(format!(
                "{who}: a path for {gem}/{id}, which no gem declares"
            ));
            return;
        };
        match verify(path, &sha, size) {
            Ok(file) => {
                let before = lock(&self.seen).insert(path.to_path_buf(), (file, sha, size));
                if let Some((old, _, _)) = before.filter(|(old, _, _)| *old != file) {
                    self.violation(format!(
                        "{who}: {} for {gem}/{id} was replaced (inode {} then {})",
                        path.display(),
                        old.ino,
                        file.ino
                    ));
                }
            }
            Err(why) => self.violation(format!(
                "{who}: the path of {gem}/{id}, {}: {why}",
                path.display()
            )),
        }
    }

    /// Every (gem, id) of the gems the clients use.
    fn resources(&self) -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = self
            .declared
            .keys()
            .filter(|(gem, _)| GEMS.contains(&gem.as_str()))
            .cloned()
            .collect();
        all.sort();
        all
    }
}

/// Where the origin serves `gem`'s resource `id`: its url's path, its
/// mirror's.
fn routes(gem: &str, id: &str) -> [String; 2] {
    [
        format!("/soak/{gem}-{id}.bin"),
        format!("/mirror/{gem}-{id}.bin"),
    ]
}

/// Serves the files and writes the gems folder; what every client checks
/// against, the gems folder, and the manifest's resources of [`LATE_GEM`].
fn declare(env: &Env, rng: &mut Rng) -> (Arc<Shared>, PathBuf, Value) {
    let bodies: Vec<Vec<u8>> = BODIES
        .iter()
        .map(|&(len, _)| {
            let mut gen = Rng::new(rng.next());
            let mut body = Vec::with_capacity(len + 8);
            while body.len() < len {
                body.extend_from_slice(&gen.next().to_le_bytes());
            }
            body.truncate(len);
            body
        })
        .collect();
    let mut declared = HashMap::new();
    let mut manifests: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for &(gem, id, b, required, host, mirrored) in DECLARED {
        let (body, slow) = (&bodies[b], BODIES[b].1);
        let serving = Behaviour::Ranged {
            body: body.clone(),
            etag: format!("\"b{b}\""),
            ignore_range: false,
            cut_at: None,
            hold: false,
            pace: slow.then_some((16 << 10, Duration::from_millis(100))),
        };
        let [path, mirror] = routes(gem, id);
        env.origin.route(&path, serving.clone());
        env.origin.route(&mirror, serving);
        let mut entry = entry(id, &env.url(host, &path), body);
        entry["required"] = json!(required);
        if mirrored {
            entry["mirrors"] = json!([env.url("mirror.test", &mirror).as_str()]);
        }
        manifests.entry(gem).or_default().push(entry);
        declared.insert(
            (gem.to_string(), id.to_string()),
            (sha256_hex(body), body.len() as u64),
        );
    }
    let late = json!(manifests.remove(LATE_GEM).unwrap_or_default());
    let mut gems = PathBuf::new();
    for (gem, resources) in manifests {
        gems = write_gem_folder(env, gem, json!(resources));
    }
    let shared = Arc::new(Shared {
        start: Instant::now(),
        declared,
        seen: Mutex::default(),
        counts: Mutex::default(),
        violations: Mutex::default(),
    });
    (shared, gems, late)
}

/// One start of `serve`.
struct Serve {
    child: Spawned,
    pid: u32,
    incarnation: usize,
    log: PathBuf,
}

/// `serve`'s starts, stops and figures.
#[derive(Default)]
struct Serves {
    current: Option<Serve>,
    starts: usize,
    kills: usize,
    terms: usize,
    peak_rss: u64,
    peak_fds: usize,
}

impl Serves {
    fn start(&mut self, env: &Env, gems: &Path) {
        let log = env.dir.path().join(format!("serve-{}.log", self.starts));
        let child = spawn_serve(env, gems, "0.5", &log);
        self.current = Some(Serve {
            pid: child.0.id(),
            child,
            incarnation: self.starts,
            log,
        });
        self.starts += 1;
    }

    fn pid(&self) -> u32 {
        self.current.as_ref().map_or(0, |s| s.pid)
    }

    /// Whether the current `serve` has published its `service.json`.
    fn listening(&self, store: &Store) -> bool {
        discovery::read(store).is_some_and(|f| f.pid == self.pid())
    }

    /// Waits (at most 15 s) until the current `serve` listens.
    async fn until_listening(&self, store: &Store, shared: &Shared) -> bool {
        let end = Instant::now() + Duration::from_secs(15);
        while Instant::now() < end {
            if self.listening(store) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shared.violation(format!("serve {} did not listen within 15 s", self.pid()));
        false
    }

    /// Samples the current `serve`'s memory and descriptors: (RSS, fds).
    fn sample(&mut self) -> (u64, usize) {
        let pid = self.pid();
        let (rss, fds) = (rss_bytes(pid), open_descriptors(pid));
        self.peak_rss = self.peak_rss.max(rss);
        self.peak_fds = self.peak_fds.max(fds);
        (rss, fds)
    }

    /// A `serve` that exited without being told to is a violation; another
    /// one is started.
    fn check_alive(&mut self, env: &Env, gems: &Path, shared: &Shared) {
        let Some(serve) = self.current.as_mut() else {
            return;
        };
        if let Ok(Some(status)) = serve.child.0.try_wait() {
            shared.violation(format!(
                "serve {} (start {}) exited on its own with {status}; its log ends:\n{}",
                serve.pid,
                serve.incarnation,
                tail(&serve.log, 20)
            ));
            self.start(env, gems);
        }
    }

    fn kill(&mut self) {
        if let Some(mut serve) = self.current.take() {
            let _ = serve.child.0.kill();
            let _ = serve.child.0.wait();
            self.kills += 1;
        }
    }

    /// SIGTERM, and a clean exit within [`STOP_BOUND`].
    async fn terminate(&mut self, shared: &Shared) {
        let Some(mut serve) = self.current.take() else {
            return;
        };
        self.terms += 1;
        signal(&serve.child, libc::SIGTERM);
        let asked = Instant::now();
        loop {
            match serve.child.0.try_wait() {
                Ok(Some(status)) if status.success() => return,
                Ok(Some(status)) => {
                    shared.violation(format!(
                        "serve {} stopped on SIGTERM with {status}; its log ends:\n{}",
                        serve.pid,
                        tail(&serve.log, 20)
                    ));
                    return;
                }
                Ok(None) if asked.elapsed() < STOP_BOUND => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                _ => {
                    shared.violation(format!(
                        "serve {} did not stop within {STOP_BOUND:?} of SIGTERM; its log ends:\n{}",
                        serve.pid,
                        tail(&serve.log, 20)
                    ));
                    return;
                }
            }
        }
    }
}

/// What a Node client's lines said about its end.
#[derive(Default)]
struct NodeEnd {
    leave: Option<String>,
    done: bool,
}

/// A running Node client process.
struct NodeClient {
    n: usize,
    child: Spawned,
    started: Instant,
    bound: Duration,
    err: PathBuf,
    reader: Option<std::thread::JoinHandle<NodeEnd>>,
}

/// The Node client processes.
struct Nodes {
    script: PathBuf,
    dir: PathBuf,
    store: PathBuf,
    running: Vec<NodeClient>,
    started: usize,
    ends: BTreeMap<&'static str, u64>,
}

impl Nodes {
    fn new(env: &Env) -> Nodes {
        Nodes {
            script: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/api_soak_client.mjs"),
            dir: env.dir.path().to_path_buf(),
            store: env.store_dir(),
            running: Vec::new(),
            started: 0,
            ends: BTreeMap::new(),
        }
    }

    /// Starts one client that runs for `life`.
    fn spawn(&mut self, shared: &Arc<Shared>, seed: u32, life: Duration) {
        let n = self.started;
        self.started += 1;
        let resources: Vec<[String; 2]> = shared
            .resources()
            .into_iter()
            .map(|(gem, id)| [gem, id])
            .collect();
        let settings = json!({
            "store": self.store, "seed": seed, "lifeMs": life.as_millis() as u64,
            "resources": resources, "gems": GEMS, "blockHost": BLOCKED_HOST,
            "leave": 0.04, "policy": 0.05,
        });
        let err = self.dir.join(format!("node-{n}.err"));
        let child = Command::new("node")
            .arg(&self.script)
            .arg(settings.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .expect("node starts");
        let mut child = Spawned(child);
        let out = child.0.stdout.take().unwrap();
        let reading = Arc::clone(shared);
        let reader = std::thread::spawn(move || read_node_lines(out, &reading, n));
        self.running.push(NodeClient {
            n,
            child,
            started: Instant::now(),
            bound: life + CLIENT_GRACE,
            err,
            reader: Some(reader),
        });
    }

    /// Reaps the clients that exited, checking how; kills one past its
    /// bound (a violation).
    fn poll(&mut self, shared: &Shared) {
        let mut i = 0;
        while i < self.running.len() {
            let client = &mut self.running[i];
            let status = match client.child.0.try_wait() {
                Ok(Some(status)) => Some(status),
                Ok(None) if client.started.elapsed() > client.bound => {
                    let _ = client.child.0.kill();
                    let _ = client.child.0.wait();
                    None
                }
                Ok(None) => {
                    i += 1;
                    continue;
                }
                Err(e) => panic!("node client {}: {e}", client.n),
            };
            let client = self.running.swap_remove(i);
            self.ended(client, status, shared);
        }
    }

    fn ended(&mut self, mut client: NodeClient, status: Option<ExitStatus>, shared: &Shared) {
        let end = client
            .reader
            .take()
            .and_then(|r| r.join().ok())
            .unwrap_or_default();
        let Some(status) = status else {
            shared.violation(format!(
                "node client {} still ran {:.1?} after it started (its bound), killed; stderr:\n{}",
                client.n,
                client.bound,
                tail(&client.err, 10)
            ));
            *self.ends.entry("hung").or_default() += 1;
            return;
        };
        let how = match (status.code(), status.signal(), end.leave.as_deref()) {
            (Some(0), _, _) if end.done => "ran its course",
            (Some(3), _, Some("exit")) => "exited mid-call",
            (_, Some(libc::SIGKILL), Some("kill")) => "killed itself mid-call",
            _ => {
                shared.violation(format!(
                    "node client {} ended with {status} (done: {}, left: {:?}); stderr:\n{}",
                    client.n,
                    end.done,
                    end.leave,
                    tail(&client.err, 10)
                ));
                "unexpectedly"
            }
        };
        *self.ends.entry(how).or_default() += 1;
    }

    /// Waits until every client exited (each within its bound), `serve`
    /// watched meanwhile.
    async fn drain(&mut self, soak: &mut Soak) {
        while !self.running.is_empty() {
            self.poll(&soak.shared);
            soak.watch_serve();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Reads a Node client's lines as they come, checking each path at once.
fn read_node_lines(out: std::process::ChildStdout, shared: &Shared, n: usize) -> NodeEnd {
    let mut end = NodeEnd::default();
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        let Ok(doc) = serde_json::from_str::<Value>(&line) else {
            shared.violation(format!(
                "node client {n} wrote a line that is not JSON: {line}"
            ));
            continue;
        };
        let text = |key: &str| doc[key].as_str().unwrap_or_default().to_string();
        let kind = text("kind");
        match (kind.as_str(), doc["ok"].as_bool()) {
            ("leave", _) => {
                shared.count(&format!("node: left mid-call ({})", text("how")));
                end.leave = Some(text("how"));
            }
            ("done", _) => end.done = true,
            ("subscription", _) => {
                shared.count("node: subscriptions ended");
                shared.add("node: events received", doc["events"].as_u64().unwrap_or(0));
            }
            (kind, Some(false)) => shared.count(&format!("node: {kind} {}", text("code"))),
            (kind, _) => {
                shared.count(&format!("node: {kind} ok"));
                if kind == "path" {
                    shared.path_returned(
                        "node",
                        &text("gem"),
                        &text("id"),
                        Path::new(&text("path")),
                    );
                }
            }
        }
    }
    end
}

/// One loop of command lines until `until`: `--json path GEM ID` and
/// `--json status`, now and then killed in the middle.
fn cli_loop(
    shared: Arc<Shared>,
    config: PathBuf,
    dir: PathBuf,
    k: usize,
    seed: u64,
    until: Instant,
) {
    let mut rng = Rng::new(seed);
    let resources = shared.resources();
    let (out, err) = (
        dir.join(format!("cli-{k}.out")),
        dir.join(format!("cli-{k}.err")),
    );
    while Instant::now() < until {
        let (gem, id) = rng.pick(&resources).clone();
        let method = if rng.chance(0.65) { "path" } else { "status" };
        let mut args = vec!["--json", method];
        if method == "path" {
            args.extend([gem.as_str(), id.as_str()]);
        }
        let kill_after = rng.chance(0.1).then(|| ms(50 + rng.below(600)));
        let child = Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .arg("--config")
            .arg(&config)
            .args(&args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .expect("the command line starts");
        let mut child = Spawned(child);
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                break Some(status);
            }
            if kill_after.is_some_and(|after| started.elapsed() >= after) {
                let _ = child.0.kill();
                let _ = child.0.wait();
                shared.count(&format!("cli: {method} killed mid-call"));
                break None;
            }
            if started.elapsed() > CLI_BOUND {
                let _ = child.0.kill();
                let _ = child.0.wait();
                shared.violation(format!(
                    "cli: `{}` still ran after {CLI_BOUND:?}, killed; stderr:\n{}",
                    args.join(" "),
                    tail(&err, 10)
                ));
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if let Some(status) = status {
            cli_result(&shared, &args, &gem, &id, status, &out, &err);
        }
        std::thread::sleep(ms(rng.below(250)));
    }
}

/// Checks what one command line printed and how it exited.
fn cli_result(
    shared: &Shared,
    args: &[&str],
    gem: &str,
    id: &str,
    status: ExitStatus,
    out: &Path,
    err: &Path,
) {
    let method = args[1];
    let printed = std::fs::read_to_string(out).unwrap_or_default();
    let doc: Option<Value> = printed
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .and_then(|l| serde_json::from_str(l).ok());
    match (status.code(), doc) {
        (Some(0), Some(doc)) if doc["ok"] == json!(true) => {
            shared.count(&format!("cli: {method} ok"));
            if method == "path" {
                let path = doc["path"].as_str().unwrap_or_default();
                shared.path_returned("cli", gem, id, Path::new(path));
            }
        }
        (Some(1), Some(doc)) if doc["ok"] == json!(false) => {
            let code = doc["code"].as_str().unwrap_or("no code");
            shared.count(&format!("cli: {method} {code}"));
        }
        (code, _) => shared.violation(format!(
            "cli: `{}` exited with {code:?} and printed {printed:?}; stderr:\n{}",
            args.join(" "),
            tail(err, 10)
        )),
    }
}

/// A call of an in-process client, bounded: `None` (a violation) when it
/// is not answered within [`CALL_BOUND`].
async fn bounded<T>(
    shared: &Shared,
    what: &str,
    call: impl std::future::Future<Output = gem_resources::Result<T>>,
) -> Option<gem_resources::Result<T>> {
    match tokio::time::timeout(CALL_BOUND, call).await {
        Ok(outcome) => Some(outcome),
        Err(_) => {
            shared.violation(format!(
                "rust client: {what} not answered within {CALL_BOUND:?}"
            ));
            None
        }
    }
}

/// Counts `outcome` of the call `what`; whether the connection lives on.
fn tally<T>(shared: &Shared, what: &str, outcome: &gem_resources::Result<T>) -> bool {
    match outcome {
        Ok(_) => {
            shared.count(&format!("rust: {what} ok"));
            true
        }
        Err(e) => {
            shared.count(&format!("rust: {what} {}", e.code().as_str()));
            if std::env::var_os("API_SOAK_DEBUG").is_some() {
                eprintln!("rust: {what}: {e}");
            }
            !matches!(e, Error::Service { .. })
        }
    }
}

/// The blocklist of the origin's host, on or off.
fn flipped(rng: &mut Rng) -> Policy {
    let hosts: Vec<String> = if rng.chance(0.5) {
        vec![BLOCKED_HOST.to_string()]
    } else {
        Vec::new()
    };
    Policy::new(Mode::Blocklist, &hosts).unwrap()
}

/// One in-process `api::Client` after another until `until`: `path`,
/// `status` and `set_policy`, sometimes given up in the middle.
async fn rust_client(shared: Arc<Shared>, store: Store, seed: u64, until: Instant) {
    let mut rng = Rng::new(seed);
    let resources = shared.resources();
    // The file of a `path` just left in the middle: asked again at once.
    let mut left: Option<(String, String)> = None;
    while Instant::now() < until {
        let Some(client) = bounded(&shared, "connect", async {
            Ok::<_, Error>(Client::for_store(&store).await)
        })
        .await
        .and_then(Result::ok)
        .flatten() else {
            shared.count("rust: connect none");
            tokio::time::sleep(ms(100 + rng.below(300))).await;
            continue;
        };
        shared.count("rust: connect ok");
        if let Some((gem, id)) = left.take() {
            // Retry right after Cancel: never handed the cancelled job.
            if let Some(outcome) = bounded(&shared, "path", client.path(&gem, &id)).await {
                shared.count("rust: path right after leaving one");
                match &outcome {
                    Err(e) if e.code() == gem_resources::ErrorCode::Cancelled => {
                        shared.violation(format!(
                            "a path of {gem}/{id} right after one was left failed as cancelled: {e}"
                        ));
                    }
                    Ok(path) => shared.path_returned("rust", &gem, &id, path),
                    Err(_) => {}
                }
            }
        }
        for _ in 0..1 + rng.below(8) {
            if Instant::now() >= until {
                break;
            }
            let alive = match rng.below(100) {
                0..=59 => {
                    let (gem, id) = rng.pick(&resources).clone();
                    let give_up = rng.chance(0.08).then(|| ms(rng.below(300)));
                    let call = client.path(&gem, &id);
                    let outcome = match give_up {
                        Some(after) => match tokio::time::timeout(after, call).await {
                            Ok(outcome) => Some(outcome),
                            Err(_) => {
                                shared.count("rust: left mid-call");
                                left = Some((gem.clone(), id.clone()));
                                break;
                            }
                        },
                        None => bounded(&shared, "path", call).await,
                    };
                    let Some(outcome) = outcome else { break };
                    if let Ok(path) = &outcome {
                        let (checker, path) = (Arc::clone(&shared), path.clone());
                        tokio::task::spawn_blocking(move || {
                            checker.path_returned("rust", &gem, &id, &path)
                        })
                        .await
                        .unwrap();
                    }
                    tally(&shared, "path", &outcome)
                }
                60..=84 => match bounded(&shared, "status", client.status(None)).await {
                    Some(outcome) => tally(&shared, "status", &outcome),
                    None => false,
                },
                _ => {
                    let policy = flipped(&mut rng);
                    match bounded(&shared, "set_policy", client.set_policy(&policy)).await {
                        Some(outcome) => tally(&shared, "set_policy", &outcome),
                        None => false,
                    }
                }
            };
            if !alive {
                break;
            }
            tokio::time::sleep(ms(rng.below(150))).await;
        }
    }
}

/// Clients of every kind, started together until one instant.
struct Clients {
    cli: Vec<std::thread::JoinHandle<()>>,
    rust: Vec<tokio::task::JoinHandle<()>>,
}

impl Clients {
    fn finished(&self) -> bool {
        self.cli.iter().all(|h| h.is_finished()) && self.rust.iter().all(|h| h.is_finished())
    }
}

/// The whole run.
struct Soak {
    env: Env,
    shared: Arc<Shared>,
    gems: PathBuf,
    /// The resources of [`LATE_GEM`]'s manifest.
    late: Value,
    store: Store,
    rng: Rng,
    serves: Serves,
    node: bool,
    figures: Vec<String>,
}

impl Soak {
    /// `serve` exited on its own: a violation, and a new one.
    fn watch_serve(&mut self) {
        self.serves.check_alive(&self.env, &self.gems, &self.shared);
        self.serves.sample();
    }

    fn start_clients(&mut self, cli: usize, rust: usize, until: Instant) -> Clients {
        let config = self.env.dir.path().join("config.toml");
        let dir = self.env.dir.path().to_path_buf();
        let cli = (0..cli)
            .map(|k| {
                let (shared, config, dir) = (Arc::clone(&self.shared), config.clone(), dir.clone());
                let seed = self.rng.next();
                std::thread::spawn(move || cli_loop(shared, config, dir, k, seed, until))
            })
            .collect();
        let rust = (0..rust)
            .map(|_| {
                let shared = Arc::clone(&self.shared);
                let store = Store::open(&self.env.store_dir()).unwrap();
                tokio::spawn(rust_client(shared, store, self.rng.next(), until))
            })
            .collect();
        Clients { cli, rust }
    }

    /// Keeps `target` Node clients running until `until`, each living a
    /// few seconds.
    fn top_up(&mut self, nodes: &mut Nodes, target: usize, until: Instant, life: (usize, usize)) {
        if !self.node {
            return;
        }
        while nodes.running.len() < target {
            let left = until.saturating_duration_since(Instant::now());
            if left < Duration::from_secs(1) {
                return;
            }
            let life = ms(life.0 + self.rng.below(life.1 - life.0)).min(left);
            nodes.spawn(&self.shared, self.rng.next() as u32, life);
        }
    }

    /// Waits for every client to end, `serve` watched meanwhile.
    async fn drain(&mut self, nodes: &mut Nodes, clients: Clients) {
        let began = Instant::now();
        while !clients.finished() && began.elapsed() < CLI_BOUND + CALL_BOUND {
            nodes.poll(&self.shared);
            self.watch_serve();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !clients.finished() {
            self.shared
                .violation("a command-line loop or an in-process client did not end".into());
        }
        nodes.drain(self).await;
    }

    /// Waits (at most 15 s) until the first scan of the gems folder
    /// installed every gem.
    async fn until_installed(&self) {
        let end = Instant::now() + Duration::from_secs(15);
        while Instant::now() < end {
            if let Some(client) = Client::for_store(&self.store).await {
                if client
                    .status(None)
                    .await
                    .is_ok_and(|s| s.gems.len() == GEMS.len())
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.shared
            .violation("the gems were not installed within 15 s".into());
    }

    /// The faults: every kind of client at once while `serve` is killed
    /// and started again, and stopped once with SIGTERM.
    async fn chaos(&mut self, nodes: &mut Nodes) {
        let began = Instant::now();
        let until = began + CHAOS;
        let clients = self.start_clients(CLI_LOOPS, RUST_CLIENTS, until);
        let attack_until = if std::env::var_os("API_SOAK_NO_ATTACKS").is_some() {
            Instant::now()
        } else {
            until
        };
        let attacker = tokio::spawn(attacks::attacker(
            Arc::clone(&self.shared),
            self.store.clone(),
            self.env.origin.handle(),
            self.rng.next(),
            attack_until,
        ));
        let sigterm = self.rng.below(2);
        let mut restarts = 0;
        let mut next = began + ms(6000 + self.rng.below(4000));
        while Instant::now() < until {
            self.top_up(nodes, NODE_CLIENTS, until, (3000, 8000));
            nodes.poll(&self.shared);
            self.watch_serve();
            if Instant::now() >= next && self.serves.listening(&self.store) {
                if restarts == sigterm {
                    self.serves.terminate(&self.shared).await;
                } else {
                    self.serves.kill();
                }
                self.serves.start(&self.env, &self.gems);
                restarts += 1;
                next = Instant::now() + ms(6000 + self.rng.below(4000));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.drain(nodes, clients).await;
        if tokio::time::timeout(CALL_BOUND, attacker).await.is_err() {
            self.shared.violation("the attacker did not end".into());
        }
        self.figures.push(format!(
            "attacks              {} unread batches, {} subscription floods, {} abandoned autofills, {} pipelined policies; a new client got in within {} ms at worst ({} probes)",
            self.shared.counted("attack: unread batches"),
            self.shared.counted("attack: subscription flood"),
            self.shared.counted("attack: abandoned autofill"),
            self.shared.counted("attack: pipelined policies"),
            self.shared.counted("attack: slowest get-in (ms)"),
            self.shared.counted("attack: get-in probes"),
        ));
        self.figures.push(format!(
            "chaos                {:.1} s of faults, clients drained {:.1} s later",
            CHAOS.as_secs_f64(),
            began.elapsed().as_secs_f64() - CHAOS.as_secs_f64()
        ));
    }

    /// Blocks the origin's host and installs [`LATE_GEM`], whose required
    /// files then fail; then allows every host through a client: the
    /// service, the store's record and fresh processes must agree, and
    /// every required file download.
    async fn final_policy(&mut self) {
        if !self.serves.until_listening(&self.store, &self.shared).await {
            return;
        }
        let Some(client) = Client::for_store(&self.store).await else {
            self.shared
                .violation("no client could reach the service for the final policy".into());
            return;
        };
        let blocked = self.fail_late_gem(&client).await;
        let set = Instant::now();
        let change = match client.set_policy(&Policy::allow_all()).await {
            Ok(change) => change,
            Err(e) => {
                self.shared
                    .violation(format!("the final policy could not be set: {e}"));
                return;
            }
        };
        let record = self.store.root().join("policy.json");
        let agreed = loop {
            let service = client
                .policy()
                .await
                .map(|p| (p.mode(), p.hosts().to_vec()));
            let stored: Option<Value> = std::fs::read(&record)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            let in_record = stored
                .as_ref()
                .is_some_and(|r| r["mode"] == json!("blocklist") && r["hosts"] == json!([]));
            if in_record && matches!(&service, Ok((Mode::Blocklist, hosts)) if hosts.is_empty()) {
                break set.elapsed();
            }
            if set.elapsed() > AGREE {
                self.shared.violation(format!(
                    "{AGREE:?} after the final policy the service says {service:?} and the record {stored:?}"
                ));
                break set.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let views = self.fresh_views().await;
        self.figures.push(format!(
            "final policy         {blocked}; then allow all ({} stopped, {} queued again): \
             service and record agreed in {:.3} s; {views}",
            change.stopped,
            change.queued,
            agreed.as_secs_f64()
        ));
        self.settle(&client).await;
    }

    /// Blocks the origin's host and installs [`LATE_GEM`] (a scan of the
    /// gems folder), then waits (at most 15 s) until each of its required
    /// files has failed; says how they failed.
    async fn fail_late_gem(&mut self, client: &Client) -> String {
        let block = Policy::new(Mode::Blocklist, &[BLOCKED_HOST.to_string()]).unwrap();
        if let Err(e) = client.set_policy(&block).await {
            self.shared
                .violation(format!("the origin's host could not be blocked: {e}"));
        }
        write_gem_folder(&self.env, LATE_GEM, self.late.clone());
        let began = Instant::now();
        loop {
            self.watch_serve();
            let status = client
                .call::<Value>("status", json!({ "gem": LATE_GEM }))
                .await;
            let rows = status.as_ref().map(required_rows).unwrap_or_default();
            if !rows.is_empty() && rows.iter().all(|(_, _, r)| r["state"] == json!("failed")) {
                let causes: Vec<&str> = rows
                    .iter()
                    .map(|(_, _, r)| r["primary_cause"].as_str().unwrap_or("none"))
                    .collect();
                return format!(
                    "{LATE_GEM} installed under a block of {BLOCKED_HOST}: {} required files failed ({causes:?}) in {:.1} s",
                    rows.len(),
                    began.elapsed().as_secs_f64()
                );
            }
            if began.elapsed() > Duration::from_secs(15) {
                let states: Vec<String> = rows
                    .iter()
                    .map(|(_, id, r)| format!("{id} {}", r["state"]))
                    .collect();
                self.shared.violation(format!(
                    "15 s after {LATE_GEM} was installed under a block of its host, its required files are {states:?} ({status:?})"
                ));
                return format!("{LATE_GEM} installed under a block, its files not failed");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What processes started after the final policy see: an in-process
    /// command line (the store's record) and a Node client (the service).
    async fn fresh_views(&mut self) -> String {
        let url = self.env.url(BLOCKED_HOST, "/soak/alpha-a0.bin");
        let out = self
            .env
            .run(&["--json", "--no-service", "check-url", url.as_str()])
            .await;
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if doc["allowed"] != json!(true) {
            self.shared.violation(format!(
                "after the final policy, `--no-service check-url {url}` says {doc} ({})",
                stderr(&out)
            ));
        }
        if !self.node {
            return "a fresh command line agrees".into();
        }
        let settings = json!({ "store": self.env.store_dir(), "view": true });
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/api_soak_client.mjs");
        let out = tokio::task::spawn_blocking(move || {
            Command::new("node")
                .arg(script)
                .arg(settings.to_string())
                .stdin(Stdio::null())
                .output()
        })
        .await
        .unwrap()
        .expect("node starts");
        let view: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if view["mode"] != json!("blocklist") || view["hosts"] != json!([]) {
            self.shared.violation(format!(
                "after the final policy, a fresh Node client sees {view} ({})",
                stderr(&out)
            ));
        }
        "a fresh command line and a fresh Node client agree".into()
    }

    /// Waits until every required file is present (at most [`SETTLE`]),
    /// with the same `serve`.
    async fn settle(&mut self, client: &Client) {
        let began = Instant::now();
        let mut pending: Vec<String>;
        loop {
            self.watch_serve();
            let status = bounded(
                &self.shared,
                "status",
                client.call::<Value>("status", json!({})),
            )
            .await;
            let Some(Ok(status)) = status else {
                self.shared
                    .violation(format!("status failed while settling: {status:?}"));
                return;
            };
            let rows = required_rows(&status);
            pending = rows
                .iter()
                .filter(|(_, _, row)| row["state"] != json!("present"))
                .map(|(gem, _, row)| {
                    format!(
                        "{gem}/{} {} {} {}",
                        row["id"].as_str().unwrap_or_default(),
                        row["state"],
                        row["code"],
                        row["message"]
                    )
                })
                .collect();
            if pending.is_empty() {
                for (gem, id, row) in &rows {
                    let path = row["path"].as_str().unwrap_or_default();
                    self.shared
                        .path_returned("settled", gem, id, Path::new(path));
                }
                break;
            }
            if began.elapsed() > SETTLE {
                self.shared.violation(format!(
                    "{SETTLE:?} after every host was allowed, required files are not present: {pending:#?}"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.figures.push(format!(
            "required files       all present {:.1} s after the final policy (bound {:.0} s)",
            began.elapsed().as_secs_f64(),
            SETTLE.as_secs_f64()
        ));
    }

    /// The last `serve`: its descriptors right after it started, a burst
    /// of clients, then its descriptors once they all left.
    async fn last_serve(&mut self, nodes: &mut Nodes) {
        self.serves.terminate(&self.shared).await;
        self.serves.start(&self.env, &self.gems);
        if !self.serves.until_listening(&self.store, &self.shared).await {
            return;
        }
        let pid = self.serves.pid();
        // One call of each kind first, so that what a service opens once
        // (the runtime's, the resolver's) is in the count.
        if let Some(client) = Client::for_store(&self.store).await {
            let _ = client.status(None).await;
            if let Ok(path) = client.path("alpha", "a1").await {
                self.shared.path_returned("rust", "alpha", "a1", &path);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let baseline = open_descriptors(pid);
        let ours = unix_sockets(std::process::id());
        let (mut burst_rss, mut burst_fds) = (0, 0);
        let until = Instant::now() + BURST;
        let clients = self.start_clients(3, 2, until);
        while Instant::now() < until {
            self.top_up(nodes, 6, until, (2000, 5000));
            nodes.poll(&self.shared);
            self.watch_serve();
            let (rss, fds) = self.serves.sample();
            (burst_rss, burst_fds) = (burst_rss.max(rss), burst_fds.max(fds));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.drain(nodes, clients).await;
        let settling = Instant::now();
        let mut after = open_descriptors(pid);
        while after > baseline + FD_MARGIN && settling.elapsed() < FD_SETTLE {
            tokio::time::sleep(Duration::from_millis(100)).await;
            after = open_descriptors(pid);
        }
        if self.serves.pid() != pid {
            self.shared
                .violation("the last serve did not live through the burst".into());
        } else if after > baseline + FD_MARGIN {
            // A leak shows on both sides: the in-process clients ran in
            // this process, so the Unix sockets it still holds are their
            // connections.
            let kept = unix_sockets(std::process::id()).saturating_sub(ours);
            self.shared.violation(format!(
                "the last serve holds {after} descriptors {FD_SETTLE:?} after the burst, \
                 {baseline} right after it started: {:?}; this process, whose in-process \
                 api::Client tasks all ended (each client dropped), holds {kept} more Unix \
                 sockets than before the burst",
                descriptor_kinds(pid)
            ));
        }
        if burst_rss > RSS_BOUND {
            self.shared.violation(format!(
                "the last serve's RSS reached {} MiB in the burst (bound {} MiB)",
                burst_rss >> 20,
                RSS_BOUND >> 20
            ));
        }
        self.figures.push(format!(
            "last serve           descriptors {baseline} after start, {burst_fds} at the burst's peak, \
             {after} {:.1} s after it (margin {FD_MARGIN}); RSS peak {} MiB in the burst",
            settling.elapsed().as_secs_f64(),
            burst_rss >> 20
        ));
        self.serves.terminate(&self.shared).await;
    }
}

/// The required resources of a `status` answer: (gem, id, row).
fn required_rows(status: &Value) -> Vec<(String, String, Value)> {
    let mut rows = Vec::new();
    for gem in status["gems"].as_array().into_iter().flatten() {
        let name = gem["gem"].as_str().unwrap_or_default();
        for row in gem["resources"].as_array().into_iter().flatten() {
            if row["required"] == json!(true) {
                let id = row["id"].as_str().unwrap_or_default();
                rows.push((name.to_string(), id.to_string(), row.clone()));
            }
        }
    }
    rows
}

/// What the descriptors of `pid` are, counted by kind (a socket by its
/// family, and for TCP its state and remote port).
fn descriptor_kinds(pid: u32) -> BTreeMap<String, usize> {
    let mut sockets: HashMap<String, String> = HashMap::new();
    for (table, family) in [
        ("unix", "unix"),
        ("tcp", "tcp"),
        ("tcp6", "tcp6"),
        ("udp", "udp"),
    ] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (inode, what) = if family == "unix" {
                (fields.get(6), family.to_string())
            } else {
                let remote = fields
                    .get(2)
                    .and_then(|r| r.rsplit(':').next())
                    .unwrap_or("?");
                let port = u16::from_str_radix(remote, 16).unwrap_or(0);
                let state = fields.get(3).copied().unwrap_or("?");
                (
                    fields.get(9),
                    format!("{family} to port {port}, state {state}"),
                )
            };
            if let Some(inode) = inode {
                sockets.insert(inode.to_string(), what);
            }
        }
    }
    let mut kinds = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let target = std::fs::read_link(entry.path())
            .map(|t| t.display().to_string())
            .unwrap_or_default();
        let kind = if let Some(inode) = target.strip_prefix("socket:[") {
            let inode = inode.trim_end_matches(']');
            format!(
                "socket ({})",
                sockets.get(inode).map_or("?", String::as_str)
            )
        } else {
            match target.split_once(':') {
                Some((kind, _)) if !target.starts_with('/') => kind.to_string(),
                _ => target,
            }
        };
        *kinds.entry(kind).or_default() += 1;
    }
    kinds
}

/// How many Unix sockets process `pid` holds.
fn unix_sockets(pid: u32) -> usize {
    descriptor_kinds(pid)
        .get("socket (unix)")
        .copied()
        .unwrap_or(0)
}

fn node_available() -> bool {
    if Command::new("node").arg("--version").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "node is not installed: the soak's Node clients cannot run (apt-get install nodejs)"
    );
    eprintln!("SKIPPED the soak's Node clients: node is not installed (apt-get install nodejs)");
    false
}

/// The figures of a run, for people.
fn summary(soak: &Soak, nodes: &Nodes, seed: u64, took: Duration) -> String {
    let s = &soak.shared;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "api soak summary (seed {seed}), {:.1} s in all",
        took.as_secs_f64()
    );
    for line in &soak.figures {
        let _ = writeln!(t, "  {line}");
    }
    let _ = writeln!(
        t,
        "  processes            {} Node clients ({:?}), {} command lines, {} in-process connections",
        nodes.started,
        nodes.ends,
        s.sum("cli: ", ""),
        s.counted("rust: connect ok")
    );
    let _ = writeln!(
        t,
        "  calls                path {} (node {}, cli {}, rust {}), status {}, set_policy {}",
        s.sum("node: path", "") + s.sum("cli: path", "") + s.sum("rust: path", ""),
        s.sum("node: path", ""),
        s.sum("cli: path", ""),
        s.sum("rust: path", ""),
        s.sum("node: status", "") + s.sum("cli: status", "") + s.sum("rust: status", ""),
        s.sum("node: policy", "") + s.sum("rust: set_policy", ""),
    );
    let seen = lock(&s.seen).len();
    let _ = writeln!(
        t,
        "  paths returned       {} (node {}, cli {}, rust {}), {seen} distinct files, each read and verified",
        s.sum("paths returned (", ")") - s.counted("paths returned (settled)"),
        s.counted("paths returned (node)"),
        s.counted("paths returned (cli)"),
        s.counted("paths returned (rust)")
    );
    let _ = writeln!(
        t,
        "  policy flips         {} (node {}, rust {})",
        s.counted("node: policy ok") + s.counted("rust: set_policy ok"),
        s.counted("node: policy ok"),
        s.counted("rust: set_policy ok")
    );
    let _ = writeln!(
        t,
        "  serve                {} starts: {} SIGKILL, {} SIGTERM; peak RSS {} MiB (bound {} MiB), peak descriptors {}",
        soak.serves.starts,
        soak.serves.kills,
        soak.serves.terms,
        soak.serves.peak_rss >> 20,
        RSS_BOUND >> 20,
        soak.serves.peak_fds
    );
    let (mut requests, mut resuming) = (0, 0);
    for &(gem, id, ..) in DECLARED {
        for path in routes(gem, id) {
            requests += soak.env.origin.hits(&path);
            let ranges = soak.env.origin.ranges(&path);
            resuming += ranges.iter().filter(|r| !r.starts_with("bytes=0-")).count();
        }
    }
    let _ = writeln!(
        t,
        "  origin               {requests} requests, {resuming} of them resuming a download (a range past 0)"
    );
    let _ = writeln!(t, "  outcomes             {:?}", lock(&s.counts));
    let violations = lock(&s.violations);
    let _ = writeln!(t, "  violations           {}", violations.len());
    for v in violations.iter().take(40) {
        let _ = writeln!(t, "    {v}");
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_clients_of_the_local_api_through_restarts_break_no_invariant() {
    let seed = world::seed_from("API_SOAK_SEED");
    println!("api soak seed {seed} (API_SOAK_SEED={seed} replays it)");
    let began = Instant::now();
    let env = Env::new().await;
    let mut rng = Rng::new(seed);
    let (shared, gems, late) = declare(&env, &mut rng);
    let mut serves = Serves::default();
    serves.start(&env, &gems);
    service_file(&env.store_dir(), serves.pid()).await;
    let store = Store::open(&env.store_dir()).unwrap();
    let mut soak = Soak {
        node: node_available(),
        env,
        shared,
        gems,
        late,
        store,
        rng,
        serves,
        figures: Vec::new(),
    };
    let mut nodes = Nodes::new(&soak.env);
    soak.until_installed().await;
    soak.chaos(&mut nodes).await;
    soak.final_policy().await;
    soak.last_serve(&mut nodes).await;

    // Every file handed out is still the one it was.
    let seen: Vec<_> = lock(&soak.shared.seen).clone().into_iter().collect();
    for (path, (file, sha, size)) in seen {
        match verify(&path, &sha, size) {
            Ok(now) if now == file => {}
            Ok(now) => soak.shared.violation(format!(
                "{} was replaced (inode {} then {})",
                path.display(),
                file.ino,
                now.ino
            )),
            Err(why) => soak
                .shared
                .violation(format!("at the end, {}: {why}", path.display())),
        }
    }
    if soak.serves.peak_rss > RSS_BOUND {
        soak.shared.violation(format!(
            "serve's RSS reached {} MiB (bound {} MiB)",
            soak.serves.peak_rss >> 20,
            RSS_BOUND >> 20
        ));
    }
    let text = summary(&soak, &nodes, seed, began.elapsed());
    println!("{text}");
    let violations = lock(&soak.shared.violations).len();
    assert_eq!(
        violations, 0,
        "api soak seed {seed}: {violations} violation(s)\n{text}"
    );
}
