//! Shared test fixtures: an in-process HTTPS origin and a configuration
//! that trusts it through the explicit `[dev]` settings.

// Each test module uses part of this.
#![allow(dead_code)]

pub mod origin;
pub mod proxy;

use std::path::{Path, PathBuf};
use std::process::Output;

use gem_resources::Config;
use sha2::{Digest, Sha256};
use tempfile::TempDir;
use url::Url;

#[allow(unused_imports)]
pub use origin::{Behaviour, Gate, Origin};

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
    pub fn write_config_full(&self, network: &str, extra: &str) -> PathBuf {
        let path = self.dir.path().join("config.toml");
        let text = format!(
            "store = \"store\"\n[network]\nconnect_timeout_secs = 5\nstall_timeout_secs = 1\nretries = 0\n{network}\n{}\n{extra}\n",
            Env::dev_section()
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

    /// The store folder the configuration names.
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// Writes a manifest file holding `resources` and returns its path.
    pub fn write_manifest(&self, name: &str, resources: serde_json::Value) -> PathBuf {
        let path = self.dir.path().join(name);
        let doc = serde_json::json!({ "id": "sample", "name": "Sample", "resources": resources });
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

/// Runs the binary with exactly `args`.
pub async fn run_bin(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .args(&args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
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
