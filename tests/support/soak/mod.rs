//! A chaos soak of `gem-resources serve`: a local HTTPS origin whose routes
//! misbehave at random, gems coming and going, policy edits, concurrent
//! `path` and `verify` processes, `kill -9` and restarts, and a full disk,
//! with the invariants checked throughout and at the end.
//!
//! Used by `examples/soak.rs` (`scripts/soak.sh`) and by the 60-second test
//! in `tests/it/soak.rs`. Every random choice comes from one printed seed.
//! Only loopback is ever used: the "private" address redirects point at is
//! a name that `[dev] resolve` maps to 127.0.0.2, outside `allow_addresses`,
//! where a listener counts any connection (there must be none).

// The example uses all of this, the test binary part of it.
#![allow(dead_code)]

mod actions;
pub mod checks;
mod settle;
pub mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::origin::{Behaviour, Origin};
use checks::{Blobs, Sample};
use world::{Gem, Res, Rng};

/// What one soak run does.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `gem-resources` binary.
    pub bin: PathBuf,
    /// An empty work folder (config, gems, logs; the store unless `disk`).
    pub dir: PathBuf,
    /// The seed of every random choice.
    pub seed: u64,
    /// Seconds of faults.
    pub chaos_secs: f64,
    /// Bound on the time to converge once the faults stop.
    pub settle_secs: f64,
    /// How many resources the origin serves.
    pub resources: usize,
    /// Largest resource, bytes.
    pub max_size: usize,
    /// Mean seconds between two `kill -9` restarts of `serve`.
    pub restart_mean_secs: f64,
    /// A small mounted file system for the store, to fill and free.
    pub disk: Option<PathBuf>,
    /// Print events as they happen.
    pub verbose: bool,
}

/// Connections and requests as the origin saw them.
#[derive(Default)]
struct Net {
    /// Blocked hosts and the instant from which no request may reach them.
    blocked: BTreeMap<String, Instant>,
    requests: u64,
    by_host: BTreeMap<String, u64>,
    /// Requests asking for a range past 0, by time since the start.
    ranges: Vec<f64>,
    violations: Vec<(f64, String)>,
}

/// A `path` or `verify` process the soak started.
struct Job {
    kind: &'static str,
    child: Child,
    started: Instant,
    out: PathBuf,
    /// For `path`: the SHA-256 the printed file must hold.
    sha: Option<String>,
}

/// A `kill -9` and restart of `serve`.
struct Restart {
    at: f64,
    kept: usize,
}

/// A running soak.
pub struct Soak {
    s: Settings,
    rng: Rng,
    start: Instant,
    origin: Origin,
    catalog: Vec<Res>,
    sizes: BTreeMap<String, u64>,
    gems: BTreeMap<String, Gem>,
    net: Arc<Mutex<Net>>,
    refused: Arc<AtomicUsize>,
    refused_addr: String,
    serve: Option<Child>,
    incarnation: usize,
    jobs: Vec<Job>,
    faults: BTreeMap<&'static str, u64>,
    actions: BTreeMap<&'static str, u64>,
    events: Vec<(f64, String)>,
    violations: Vec<(f64, String)>,
    samples: Vec<Sample>,
    blobs: Blobs,
    restarts: Vec<Restart>,
    blocked: BTreeMap<String, Instant>,
    filler: Option<PathBuf>,
    nth: u64,
    max_tmp: (usize, u64),
    max_failures: (usize, u64),
    missing_before_restart: usize,
    settle_took: f64,
    /// Seconds to converge again after the final restart.
    restart_took: f64,
    serve_since: Instant,
    /// The last sample of `serve` before the final restart.
    last_long: Option<Sample>,
    /// Connections to the refused address already reported.
    refused_seen: usize,
    /// `path` processes started before the current block.
    block_waits: Vec<u32>,
    /// The grace period of the current block.
    block_grace: Duration,
}

/// What a run found.
pub struct Summary {
    /// The report, for people.
    pub text: String,
    /// Every invariant violation (must be none).
    pub violations: Vec<String>,
}

/// Runs a whole soak: faults, then settling, then the final checks.
pub async fn run(s: Settings) -> Summary {
    let mut soak = Soak::start(s).await;
    soak.chaos().await;
    soak.settle().await;
    soak.finish()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Soak {
    async fn start(s: Settings) -> Soak {
        let mut rng = Rng::new(s.seed);
        let origin = Origin::start().await;
        let catalog = world::catalog(&mut rng, s.resources, s.max_size);
        for r in &catalog {
            for (_, path) in r.routes() {
                origin.route(&path, r.good());
            }
        }
        let sizes = catalog
            .iter()
            .map(|r| (r.sha256.clone(), r.body.len() as u64))
            .collect();
        let refused = Arc::new(AtomicUsize::new(0));
        let refused_addr = refused_listener(Arc::clone(&refused)).await;
        let start = Instant::now();
        let net = Arc::new(Mutex::new(Net::default()));
        origin.observe(observer(Arc::clone(&net), start));
        std::fs::write(s.dir.join("ca.pem"), origin.ca_pem()).expect("soak: write ca.pem");
        std::fs::create_dir_all(s.dir.join("gems")).expect("soak: gems folder");
        let mut soak = Soak {
            s,
            rng,
            start,
            origin,
            catalog,
            sizes,
            gems: BTreeMap::new(),
            net,
            refused,
            refused_addr,
            serve: None,
            incarnation: 0,
            jobs: Vec::new(),
            faults: BTreeMap::new(),
            actions: BTreeMap::new(),
            events: Vec::new(),
            violations: Vec::new(),
            samples: Vec::new(),
            blobs: Blobs::default(),
            restarts: Vec::new(),
            blocked: BTreeMap::new(),
            filler: None,
            nth: 0,
            max_tmp: (0, 0),
            max_failures: (0, 0),
            missing_before_restart: 0,
            settle_took: 0.0,
            restart_took: 0.0,
            serve_since: start,
            last_long: None,
            refused_seen: 0,
            block_waits: Vec::new(),
            block_grace: Duration::ZERO,
        };
        let total: usize = soak.catalog.iter().map(|r| r.body.len()).sum();
        soak.event(format!(
            "seed {}: {} resources, {total} bytes, origin port {}, refused address {}",
            soak.s.seed,
            soak.catalog.len(),
            soak.origin.port(),
            soak.refused_addr
        ));
        soak.write_config();
        for r in 0..soak.catalog.len() {
            for (_, path) in soak.catalog[r].routes() {
                if soak.rng.chance(0.5) {
                    soak.set_fault(r, &path);
                }
            }
        }
        soak.spawn_serve();
        soak
    }

    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn event(&mut self, text: String) {
        let t = self.now();
        if self.s.verbose {
            println!("[{t:8.2}] {text}");
        }
        self.events.push((t, text));
    }

    fn violation(&mut self, text: String) {
        let t = self.now();
        self.event(format!("VIOLATION: {text}"));
        self.violations.push((t, text));
    }

    fn store_root(&self) -> PathBuf {
        self.store_dir().join("store-v1")
    }

    fn store_dir(&self) -> PathBuf {
        match &self.s.disk {
            Some(disk) => disk.join("store"),
            None => self.s.dir.join("store"),
        }
    }

    /// The faults phase: one random action every few hundred milliseconds,
    /// the invariants checked every two seconds.
    async fn chaos(&mut self) {
        let mut next_check = 0.0;
        while self.now() < self.s.chaos_secs {
            let pause = 100 + self.rng.below(500) as u64;
            tokio::time::sleep(Duration::from_millis(pause)).await;
            self.poll_serve();
            self.poll_jobs(Duration::from_secs(200));
            match self.rng.below(100) {
                0..=39 => self.refault(),
                40..=59 => self.change_gem(),
                60..=65 => self.change_policy(),
                66..=75 => self.path_burst(),
                76..=78 => self.run_verify(),
                79..=81 => self.disk(),
                _ => {}
            }
            if self
                .rng
                .chance(pause as f64 / 1000.0 / self.s.restart_mean_secs)
            {
                self.restart("kill -9");
            }
            if self.now() >= next_check {
                next_check = self.now() + 2.0;
                self.check_store();
                self.sample();
            }
        }
    }

    /// Checks the verified files and the bounds on `tmp/` and `failures/`.
    fn check_store(&mut self) {
        let refused = self.refused.load(Ordering::SeqCst);
        if refused > self.refused_seen {
            self.violation(format!(
                "{} connection(s) reached the refused address",
                refused - self.refused_seen
            ));
            self.refused_seen = refused;
        }
        let root = self.store_root();
        let (bad, _) = self.blobs.check(&root, &self.sizes);
        for b in bad {
            self.violation(format!("final path: {b}"));
        }
        let total: u64 = self.sizes.values().sum();
        let tmp = checks::usage(&root.join("tmp"));
        let failures = checks::usage(&root.join("failures"));
        self.max_tmp = (self.max_tmp.0.max(tmp.0), self.max_tmp.1.max(tmp.1));
        self.max_failures = (
            self.max_failures.0.max(failures.0),
            self.max_failures.1.max(failures.1),
        );
        if tmp.1 > 2 * total + (4 << 20) || tmp.0 > 4 * self.catalog.len() + 16 {
            self.violation(format!("tmp/ unbounded: {} files, {} bytes", tmp.0, tmp.1));
        }
        if failures.1 > 4 << 20 || failures.0 > 64 {
            self.violation(format!(
                "failures/ unbounded: {} files, {} bytes",
                failures.0, failures.1
            ));
        }
    }

    fn sample(&mut self) {
        let Some(pid) = self.serve.as_ref().map(Child::id) else {
            return;
        };
        if let Some(s) = checks::sample(pid, self.now(), self.incarnation) {
            self.samples.push(s);
        }
    }

    /// The shas installed gems declare: (required, every one).
    fn declared(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let mut required = BTreeSet::new();
        let mut all = BTreeSet::new();
        for gem in self.gems.values() {
            for &(idx, req) in gem {
                let sha = self.catalog[idx].sha256.clone();
                if req {
                    required.insert(sha.clone());
                }
                all.insert(sha);
            }
        }
        (required, all)
    }
}

/// Records every request: its host, ranges asked for, and a violation for
/// a request reaching a host while it is blocked.
fn observer(net: Arc<Mutex<Net>>, start: Instant) -> super::origin::Observer {
    Arc::new(move |target: &str, headers: &[(String, String)]| {
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let host = header("host")
            .map(|h| h.rsplit_once(':').map_or(h, |(name, _)| name))
            .unwrap_or_default()
            .to_ascii_lowercase();
        let at = start.elapsed().as_secs_f64();
        let mut net = lock(&net);
        net.requests += 1;
        *net.by_host.entry(host.clone()).or_default() += 1;
        let ranged = header("range")
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.trim_end_matches('-').parse::<u64>().ok())
            .is_some_and(|n| n > 0);
        if ranged {
            net.ranges.push(at);
        }
        if let Some(since) = net.blocked.get(&host) {
            if Instant::now() >= *since {
                let text = format!("request for {target} reached blocked host {host}");
                net.violations.push((at, text));
            }
        }
    })
}

/// Listens on 127.0.0.2 (loopback, but not exempt): counts every
/// connection, answers none. Returns `host:port` for redirects.
async fn refused_listener(count: Arc<AtomicUsize>) -> String {
    let listener = tokio::net::TcpListener::bind(("127.0.0.2", 0))
        .await
        .expect("soak: bind 127.0.0.2");
    let port = listener.local_addr().expect("soak: address").port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            drop(tcp);
        }
    });
    format!("intranet.test:{port}")
}
