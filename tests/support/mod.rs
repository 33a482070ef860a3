//! Shared test fixtures: an in-process HTTPS origin and a configuration
//! that trusts it through the explicit `[dev]` settings.

// Each test module uses part of this.
#![allow(dead_code)]

#[cfg(unix)]
pub mod api;
pub mod files;
pub mod origin;
pub mod proxy;
pub mod registry;
pub mod token;

use std::path::{Path, PathBuf};
use std::process::Output;

use gem_resources::Config;
use sha2::{Digest, Sha256};
use tempfile::TempDir;
use url::Url;

#[allow(unused_imports)]
pub use origin::{Behaviour, Gate, Origin, PartsFault};

/// Names the test configuration maps to 127.0.0.1.
pub const TEST_HOSTS: &[&str] = &[
    "origin.test",
    "mirror.test",
    "cdn.test",
    "other.test",
    "blocked.test",
    "evil.test",
    "a.origin.test",
    "b.origin.test",
];

/// An origin, a scratch folder and a configuration that reaches the origin.
pub struct Env {
    /// The HTTPS origin.
    pub origin: Origin,
    /// Scratch folder (config, CA, store, manifests).
    pub dir: TempDir,
}

impl Env {
    /// Starts an origin and writes `ca.pem` and `config.toml` into a new
    /// scratch folder.
    pub async fn new() -> Env {
        let origin = Origin::start().await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), origin.ca_pem()).unwrap();
        let env = Env { origin, dir };
        env.write_config("");
        env
    }

    /// The `[dev]` section that lets the tests reach the origin.
    pub fn dev_section() -> String {
        let resolve: Vec<String> = TEST_HOSTS
            .iter()
            .map(|h| format!("\"{h}\" = [\"127.0.0.1\"]"))
            .collect();
        format!(
            "[dev]\nextra_root_certs = [\"ca.pem\"]\nresolve = {{ {} }}\nallow_addresses = [\"127.0.0.1/32\"]\n",
            resolve.join(", ")
        )
    }

    /// Writes `config.toml` with the test defaults, `network` lines added to
    /// `[network]`, and returns its path.
    pub fn write_config(&self, network: &str) -> PathBuf {
        self.write_config_full(network, "")
    }

    /// Like [`Env::write_config`], with extra top-level sections appended.
    ///
    /// The stall timeout is 30 seconds, so that a loaded machine never
    /// fails a test by stalling; a stall test sets its own
    /// `stall_timeout_secs` in `network`. No retries, unless `network`
    /// sets `retries`.
    pub fn write_config_full(&self, network: &str, extra: &str) -> PathBuf {
        let path = self.dir.path().join("config.toml");
        let stall = if network.contains("stall_timeout_secs") {
            ""
        } else {
            "stall_timeout_secs = 30\n"
        };
        // No retries unless the test asks for some.
        let retries = if network.contains("retries =") {
            ""
        } else {
            "retries = 0\n"
        };
        let text = format!(
            "store = \"store\"\n[network]\nconnect_timeout_secs = 5\n{stall}{retries}{network}\n{}\n{extra}\n",
            Env::dev_section()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Writes `config.toml` for the `[cache]` tests: the test defaults,
    /// `registry.test`, `auth.test` and `blobs.test` resolving to
    /// 127.0.0.2, 127.0.0.2 and 127.0.0.3 (which no `[dev]` range
    /// exempts: only `[cache] allow_internal` does), `registry_ca` trusted
    /// besides the origin's CA, and `cache` as the `[cache]` section.
    pub fn write_cache_config(&self, registry_ca: &str, cache: &str) -> PathBuf {
        std::fs::write(self.dir.path().join("registry-ca.pem"), registry_ca).unwrap();
        let mut resolve: Vec<String> = TEST_HOSTS
            .iter()
            .map(|h| format!("\"{h}\" = [\"127.0.0.1\"]"))
            .collect();
        resolve.push("\"registry.test\" = [\"127.0.0.2\"]".into());
        resolve.push("\"auth.test\" = [\"127.0.0.2\"]".into());
        resolve.push("\"blobs.test\" = [\"127.0.0.3\"]".into());
        let path = self.dir.path().join("config.toml");
        let text = format!(
            "store = \"store\"\n[network]\nconnect_timeout_secs = 5\nstall_timeout_secs = 30\nretries = 0\n[cache]\n{cache}\n[dev]\nextra_root_certs = [\"ca.pem\", \"registry-ca.pem\"]\nresolve = {{ {} }}\nallow_addresses = [\"127.0.0.1/32\"]\n",
            resolve.join(", ")
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The configuration as the binary would load it.
    pub fn config(&self) -> Config {
        Config::load(&self.dir.path().join("config.toml")).unwrap()
    }

    /// `https://{host}:{port}{path}`.
    pub fn url(&self, host: &str, path: &str) -> Url {
        Url::parse(&self.origin.url(host, path)).unwrap()
    }

    /// Serves `body` at `path` and returns its URL on origin.test.
    pub fn serve(&self, path: &str, body: &[u8]) -> Url {
        self.origin.route(path, Behaviour::Body(body.to_vec()));
        self.url("origin.test", path)
    }

    /// Serves `body` at `path` once `gate` opens (the request is counted
    /// first): a download held in flight for as long as a test needs.
    pub fn serve_gated(&self, path: &str, body: &[u8]) -> (Url, Gate) {
        let gate = Gate::new();
        self.origin.route(
            path,
            Behaviour::Gated {
                body: body.to_vec(),
                gate: gate.clone(),
            },
        );
        (self.url("origin.test", path), gate)
    }

    /// Serves `body` at `path` as a resumable server (`ETag: "v1"`) that
    /// holds each response silent once `cut` bytes of the body are out
    /// ([`Behaviour::ranged_held`]): a download to interrupt with bytes kept.
    pub fn serve_held(&self, path: &str, body: &[u8], cut: usize) -> Url {
        self.origin
            .route(path, Behaviour::ranged_held(body, "\"v1\"", cut));
        self.url("origin.test", path)
    }

    /// Serves `body` at `path` on `evil.test`, dripping 2 KB a second
    /// (above the default `network.min_bytes_per_min`): a download that
    /// would take minutes, as a hostile gem's address would send it.
    pub fn serve_drip(&self, path: &str, body: &[u8]) -> Url {
        self.origin.route(
            path,
            Behaviour::Slow {
                body: body.to_vec(),
                chunk: 2000,
                delay: std::time::Duration::from_secs(1),
            },
        );
        self.url("evil.test", path)
    }

    /// A service on this environment's configuration and store, on the
    /// current runtime: one per call, as separate processes would have.
    pub fn resources(&self) -> gem_resources::Resources {
        gem_resources::Resources::open_at(&self.config(), &self.store_dir())
            .expect("the service opens on the test store")
    }

    /// Installs `gem` declaring `resources` on `service`, then asks for
    /// its resource `id` in a task of its own, and returns that task once
    /// the origin has seen `first` requested: a download in flight.
    pub async fn downloading(
        &self,
        service: &gem_resources::Resources,
        gem: &str,
        resources: serde_json::Value,
        id: &str,
        first: &str,
    ) -> tokio::task::JoinHandle<gem_resources::Result<PathBuf>> {
        service
            .install(gem, &manifest(resources))
            .await
            .expect("the gem installs");
        let task = {
            let (s, gem, id) = (service.clone(), gem.to_string(), id.to_string());
            tokio::spawn(async move { s.path(&gem, &id).await })
        };
        let first = first.to_string();
        wait_until("the first request", || self.origin.hits(&first) >= 1).await;
        task
    }

    /// The store folder the configuration names.
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// Writes a manifest file holding `resources` and returns its path.
    pub fn write_manifest(&self, name: &str, resources: serde_json::Value) -> PathBuf {
        let path = self.dir.path().join(name);
        let doc = serde_json::json!({ "name": "Sample", "resources": resources });
        std::fs::write(&path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
        path
    }

    /// Runs the binary with this configuration and `args`, off the async
    /// runtime so the origin keeps serving.
    pub async fn run(&self, args: &[&str]) -> Output {
        let config = self.dir.path().join("config.toml");
        let mut all: Vec<String> = vec!["--config".into(), config.display().to_string()];
        all.extend(args.iter().map(|s| s.to_string()));
        run_bin(all).await
    }
}

/// Runs the binary with exactly `args` and these environment variables.
pub async fn run_bin_env(args: Vec<String>, vars: &[(&str, &str)]) -> Output {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .args(&args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .envs(vars)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// Runs the binary with exactly `args`.
pub async fn run_bin(args: Vec<String>) -> Output {
    run_bin_env(args, &[]).await
}

/// Lowercase hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Deterministic test bytes.
pub fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A resource entry for a manifest.
pub fn entry(id: &str, url: &Url, body: &[u8]) -> serde_json::Value {
    serde_json::json!({ "id": id, "url": url.as_str(), "sha256": sha256_hex(body), "size": body.len() })
}

/// stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Deletes the stored (read-only) `file`, as a user's cleanup would:
/// Windows refuses to delete a read-only file, so it is made writable first.
pub fn remove_stored(file: &Path) {
    let mut perms = std::fs::metadata(file).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(file, perms).unwrap();
    std::fs::remove_file(file).unwrap();
}

/// Makes the stored (read-only) `file` writable and flips one of its
/// bytes, as a hand edit or a failing disk would.
pub fn corrupt(file: &Path) {
    let mut perms = std::fs::metadata(file).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(file, perms).unwrap();
    let mut bytes = std::fs::read(file).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(file, bytes).unwrap();
}

/// A validated manifest holding `resources`.
pub fn manifest(resources: serde_json::Value) -> gem_resources::Manifest {
    let doc = serde_json::json!({ "resources": resources });
    gem_resources::parse_manifest(&serde_json::to_vec(&doc).unwrap()).unwrap()
}

/// A required resource entry for a manifest.
pub fn required_entry(id: &str, url: &Url, body: &[u8]) -> serde_json::Value {
    let mut e = entry(id, url, body);
    e["required"] = serde_json::Value::Bool(true);
    e
}

/// Writes `config.toml` like [`Env::write_config_full`], but with a stall
/// timeout long enough that a held (stalled or gated) download stays in
/// flight for as long as a test needs it.
pub fn write_patient_config(env: &Env, extra: &str) -> PathBuf {
    let path = env.dir.path().join("config.toml");
    let text = format!(
        "store = \"store\"\n[network]\nconnect_timeout_secs = 5\nstall_timeout_secs = 60\nretries = 0\n\n{}\n{extra}\n",
        Env::dev_section()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `<store>/store-v1`.
pub fn store_root(env: &Env) -> PathBuf {
    env.store_dir().join("store-v1")
}

/// Every file in the store's temporary area.
pub fn tmp_files(env: &Env) -> Vec<PathBuf> {
    files_under(&store_root(env).join("tmp"))
}

/// The `.partial` files in the store's temporary area.
pub fn partial_files(env: &Env) -> Vec<PathBuf> {
    tmp_files(env)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".partial"))
        .collect()
}

/// The verified files stored for the bytes `body`.
pub fn stored_files(env: &Env, body: &[u8]) -> Vec<PathBuf> {
    files_under(&store_root(env).join("blobs").join(sha256_hex(body)))
}

/// Polls `cond` every few milliseconds until it holds; panics naming `what`
/// after 10 seconds.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Runs `fut`, panicking naming `what` if it takes more than 10 seconds.
pub async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(10), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Every event `events` receives until one matches `end`, that one
/// included (10 s at most; a lag is skipped over).
pub async fn events_until(
    events: &mut tokio::sync::broadcast::Receiver<gem_resources::Event>,
    end: impl Fn(&gem_resources::Event) -> bool,
) -> Vec<gem_resources::Event> {
    use tokio::sync::broadcast::error::RecvError;
    within("the event", async {
        let mut seen = Vec::new();
        loop {
            match events.recv().await {
                Ok(e) => {
                    let done = end(&e);
                    seen.push(e);
                    if done {
                        return seen;
                    }
                }
                Err(RecvError::Lagged(_)) => {}
                Err(e) => panic!("{e}: {seen:?}"),
            }
        }
    })
    .await
}

/// Routes `path` to `len` generated bytes that stall after `sent` of them
/// (the connection stays open), and returns the bytes and their URL on
/// origin.test.
pub fn stalled_route(env: &Env, path: &str, len: usize, sent: usize, seed: u8) -> (Vec<u8>, Url) {
    let body = bytes(len, seed);
    env.origin.route(
        path,
        Behaviour::Stall {
            body: body.clone(),
            sent,
        },
    );
    (body, env.url("origin.test", path))
}

/// Writes `<scratch>/gems/<gem>/notochord.json` declaring `resources` and
/// returns the gems folder (for `serve --gems`).
pub fn write_gem_folder(env: &Env, gem: &str, resources: serde_json::Value) -> PathBuf {
    let gems = env.dir.path().join("gems");
    std::fs::create_dir_all(gems.join(gem)).unwrap();
    let doc = serde_json::json!({ "resources": resources });
    std::fs::write(gems.join(gem).join("notochord.json"), doc.to_string()).unwrap();
    gems
}

/// Waits for `scans` more scans of `serve --gems gems` (its log `log`):
/// each round rewrites the gem `tick`'s manifest in `gems` and waits for
/// the scan that installs it to say so.
pub async fn scans_later(gems: &Path, log: &Path, scans: usize) {
    let ticks = || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches("installed gem=\"tick\"")
            .count()
    };
    for round in 0..scans {
        let lines = ticks();
        let tick = gems.join("tick");
        std::fs::create_dir_all(&tick).unwrap();
        // Other bytes each round (JSON allows trailing white space).
        let doc = format!("{{\"resources\": []}}{}", " ".repeat(round + 1));
        std::fs::write(tick.join("notochord.json"), doc).unwrap();
        wait_until("a later scan", || ticks() > lines).await;
    }
}

/// Log lines of the library, captured on the current thread for as long as
/// the guard lives (debug level). Tests on tokio's default current-thread
/// runtime see every task's lines.
pub struct Logs {
    buffer: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Logs {
    /// Starts capturing.
    pub fn capture() -> Logs {
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let writer = {
            let buffer = buffer.clone();
            move || LogWriter(buffer.clone())
        };
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("gem_resources=debug")
            .with_ansi(false)
            .with_writer(writer)
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        tracing::callsite::rebuild_interest_cache();
        Logs {
            buffer,
            _guard: guard,
        }
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buffer.lock().unwrap()).into_owned()
    }

    /// How many captured lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        // A test on another thread may have cached a callsite's interest
        // while no capture was in place.
        tracing::callsite::rebuild_interest_cache();
        self.text().lines().filter(|l| l.contains(needle)).count()
    }
}

struct LogWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The line the library logs (at debug level) when a download waits for
/// another task or process downloading the same file.
pub const WAITING_FOR_LOCK: &str = "waiting for another download of the same file";

/// The line the library logs (at debug level) when a transfer waits for a
/// connection slot of the host it is about to connect to.
pub const WAITING_FOR_HOST: &str = "waiting for a connection slot of the host";

/// The line the library logs (at debug level) when a lookup joins a
/// download already scheduled.
pub const JOINING: &str = "joining the download in progress";

/// A child process killed (if still running) when dropped, so a failing
/// test leaves no process behind.
pub struct Spawned(pub std::process::Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts the binary with the env's configuration and `args`, its default
/// log level, stderr going to `log`.
pub fn spawn_quiet(env: &Env, args: &[&str], log: &Path) -> Spawned {
    let log = std::fs::File::create(log).unwrap();
    Spawned(
        std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .arg("--config")
            .arg(env.dir.path().join("config.toml"))
            .args(args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// Starts `serve` on `gems`, scanning every `interval` seconds, stderr
/// going to `log`.
pub fn spawn_serve(env: &Env, gems: &Path, interval: &str, log: &Path) -> Spawned {
    let gems = gems.to_str().unwrap();
    spawn_quiet(env, &["serve", "--gems", gems, "--interval", interval], log)
}

/// Starts the binary with the env's configuration and `args`, debug logs
/// (stderr) going to `log`.
pub fn spawn_logged(env: &Env, args: &[&str], log: &Path) -> Spawned {
    let log = std::fs::File::create(log).unwrap();
    Spawned(
        std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .arg("--config")
            .arg(env.dir.path().join("config.toml"))
            .args(args)
            .env("RUST_LOG", "gem_resources=debug")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// Waits (polling) for `child` to exit, at most 10 seconds, and returns its
/// output (stdout as captured; stderr went to its log).
pub async fn wait_output(child: &mut Spawned) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the process did not exit in time"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Everything `child` wrote to stdout (call after it exited).
pub fn child_stdout(child: &mut Spawned) -> String {
    let mut text = String::new();
    if let Some(mut out) = child.0.stdout.take() {
        std::io::Read::read_to_string(&mut out, &mut text).unwrap();
    }
    text
}

/// A resource declaring `body` at `url`, then `mirrors`.
pub fn resource(id: &str, url: &Url, mirrors: &[Url], body: &[u8]) -> gem_resources::Resource {
    gem_resources::Resource {
        id: id.to_string(),
        url: url.clone(),
        mirrors: mirrors.to_vec(),
        sha256: sha256_hex(body),
        size: body.len() as u64,
        required: false,
        description: None,
    }
}

/// No retries: one try per address.
pub fn no_retry() -> gem_resources::RetryPolicy {
    gem_resources::RetryPolicy {
        retries: 0,
        backoff: std::time::Duration::ZERO,
        ..gem_resources::RetryPolicy::default()
    }
}

/// Downloads `r` into the env's store with the library, as `fetch` does.
pub async fn fetch_with(
    env: &Env,
    r: &gem_resources::Resource,
    retry: gem_resources::RetryPolicy,
) -> gem_resources::Result<PathBuf> {
    let config = env.config();
    let fetcher = gem_resources::Fetcher::new(&config).unwrap();
    let store = gem_resources::Store::open(&config.store_dir()).unwrap();
    gem_resources::download(&fetcher, &store, r, retry, &mut |_| {}).await
}

/// What the binary showed on a terminal `cols` columns wide (a
/// pseudo-terminal made by `script`), stdout and stderr together, and its
/// exit status.
#[cfg(unix)]
pub async fn run_in_terminal(env: &Env, args: &[&str], cols: u16) -> (Option<i32>, String) {
    let config = env.dir.path().join("config.toml");
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let mut command = format!(
        "stty cols {cols} rows 24; exec {} --config {}",
        quote(env!("CARGO_BIN_EXE_gem-resources")),
        quote(&config.display().to_string())
    );
    for arg in args {
        command.push(' ');
        command.push_str(&quote(arg));
    }
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("script")
            .args(["-qefc", &command, "/dev/null"])
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .env("TERM", "xterm")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The rows a terminal shows of `output` (escape sequences dropped, each
/// redraw after a carriage return a row of its own).
pub fn terminal_rows(output: &str) -> Vec<String> {
    let mut rows = Vec::new();
    let mut row = String::new();
    let mut chars = output.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                // CSI: ESC [ parameters final-byte.
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for p in chars.by_ref() {
                        if ('@'..='~').contains(&p) {
                            break;
                        }
                    }
                }
                if !row.trim().is_empty() {
                    rows.push(std::mem::take(&mut row));
                }
                row.clear();
            }
            '\r' | '\n' => {
                if !row.trim().is_empty() {
                    rows.push(std::mem::take(&mut row));
                }
                row.clear();
            }
            c => row.push(c),
        }
    }
    if !row.trim().is_empty() {
        rows.push(row);
    }
    rows
}

/// The rates (`2.35 MiB/s`) the rows show, in bytes per second.
pub fn shown_rates(rows: &[String]) -> Vec<f64> {
    let mut rates = Vec::new();
    for row in rows {
        let words: Vec<&str> = row.split_whitespace().collect();
        for pair in words.windows(2) {
            let unit = match pair[1] {
                "B/s" => 1.0,
                "KiB/s" => 1024.0,
                "MiB/s" => 1024.0 * 1024.0,
                "GiB/s" => 1024.0 * 1024.0 * 1024.0,
                _ => continue,
            };
            if let Ok(n) = pair[0].parse::<f64>() {
                rates.push(n * unit);
            }
        }
    }
    rates
}

/// A second real user (`gr-second-user`, created when missing) as
/// `(uid, gid)`, for the cases where another local user is the attacker.
/// `None`, after a loud `SKIPPED` line naming `test`, when the tests do not
/// run as root or the user cannot be made.
#[cfg(unix)]
pub fn second_user(test: &str) -> Option<(u32, u32)> {
    const NAME: &str = "gr-second-user";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED {test}: needs root to act as a second user");
        return None;
    }
    let id = |flag: &str| -> Option<u32> {
        let out = std::process::Command::new("id")
            .args([flag, NAME])
            .output()
            .ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    if id("-u").is_none() {
        let _ = std::process::Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                NAME,
            ])
            .status();
    }
    let user = id("-u").zip(id("-g"));
    if user.is_none() {
        eprintln!("SKIPPED {test}: cannot create the user {NAME}");
    }
    user
}

/// A command running `program` as `user` (from [`second_user`]), no
/// supplementary groups.
#[cfg(unix)]
pub fn as_user(user: (u32, u32), program: &str) -> std::process::Command {
    let mut command = std::process::Command::new("setpriv");
    command
        .arg(format!("--reuid={}", user.0))
        .arg(format!("--regid={}", user.1))
        .arg("--clear-groups")
        .arg(program);
    command
}

/// A folder in the system's temporary folder that every user may write
/// in, without the sticky bit: another user can rename and replace the
/// entries there.
#[cfg(unix)]
pub fn shared_folder() -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// A stand-in service's socket: a listener on `api.sock` in a new folder
/// only this user may enter (as the service's own). Keep the folder while
/// the socket is used.
#[cfg(unix)]
pub fn private_socket(prefix: &str) -> (TempDir, PathBuf, tokio::net::UnixListener) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .unwrap();
    let socket = dir.path().join("api.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    (dir, socket, listener)
}
