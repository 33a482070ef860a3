//! The soak's actions: faults on routes, gems, policy edits, processes,
//! restarts and the disk.

use std::fs::OpenOptions;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::world::{self, FAULTS};
use super::{checks, lock, Job, Restart, Soak};

/// Hosts the policy blocks and unblocks (one at a time).
const POLICY_HOSTS: &[&str] = &["cdn.test", "mirror.test", "other.test"];

/// Gems of the gems folder.
const GEMS: &[&str] = &["g0", "g1", "g2", "g3", "g4", "g5"];

/// How long `serve` may take to apply a block after SIGHUP, and after a
/// file change alone (stable for a second over two looks, 0.5 s apart).
const SIGHUP_GRACE: Duration = Duration::from_secs(6);
const FILE_GRACE: Duration = Duration::from_secs(10);

impl Soak {
    /// Writes `config.toml` (atomically) with the current blocklist.
    pub(super) fn write_config(&mut self) {
        let hosts: Vec<String> = self.blocked.keys().map(|h| format!("\"{h}\"")).collect();
        let text = format!(
            "store = \"{}\"\n\
             [network]\nmode = \"blocklist\"\nhosts = [{}]\n\
             connect_timeout_secs = 3\nstall_timeout_secs = 3\nretries = 2\n\
             retry_backoff_secs = 0.2\nretry_after_max_secs = 3\n\
             [service]\nmax_concurrent_downloads = 4\nmax_per_host = 3\n\
             retry_failed_after = \"5s\"\n\
             [dev]\nextra_root_certs = [\"ca.pem\"]\n\
             resolve = {{ \"cdn.test\" = [\"127.0.0.1\"], \"mirror.test\" = [\"127.0.0.1\"], \
             \"other.test\" = [\"127.0.0.1\"], \"intranet.test\" = [\"127.0.0.2\"] }}\n\
             allow_addresses = [\"127.0.0.1/32\"]\n",
            self.store_dir().display(),
            hosts.join(", ")
        );
        if let Err(e) = world::write_atomic(&self.s.dir.join("config.toml"), &text) {
            self.violation(format!("soak could not write config.toml: {e}"));
        }
    }

    fn command(
        &self,
        args: &[&str],
        out: &std::path::Path,
    ) -> std::io::Result<std::process::Child> {
        let log = |name: &str| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.s.dir.join(name))
        };
        Command::new(&self.s.bin)
            .arg("--config")
            .arg(self.s.dir.join("config.toml"))
            .args(args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(out)?)
            .stderr(log("processes.log")?)
            .spawn()
    }

    pub(super) fn spawn_serve(&mut self) {
        let gems = self.s.dir.join("gems").display().to_string();
        let out = self.s.dir.join(format!("serve-{}.out", self.incarnation));
        let args = ["serve", "--gems", &gems, "--interval", "0.5"];
        match self.command(&args, &out) {
            Ok(child) => {
                self.event(format!("serve started (pid {})", child.id()));
                self.serve = Some(child);
                self.serve_since = Instant::now();
            }
            Err(e) => self.violation(format!("could not start serve: {e}")),
        }
    }

    /// A `serve` that exited without being told to is a violation; it is
    /// started again.
    pub(super) fn poll_serve(&mut self) {
        let exited = match self.serve.as_mut().map(|c| c.try_wait()) {
            Some(Ok(Some(status))) => Some(status.to_string()),
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        };
        if let Some(status) = exited {
            self.violation(format!("serve exited on its own: {status}"));
            self.incarnation += 1;
            self.spawn_serve();
        }
        let seen: Vec<(f64, String)> = std::mem::take(&mut lock(&self.net).violations);
        for (_, text) in seen {
            self.violation(text);
        }
    }

    /// Reaps finished `path` and `verify` processes and checks what they
    /// did; one running longer than `limit` is killed and is a violation.
    pub(super) fn poll_jobs(&mut self, limit: Duration) {
        let mut jobs = std::mem::take(&mut self.jobs);
        jobs.retain_mut(|job| match job.child.try_wait() {
            Ok(Some(status)) => {
                self.job_done(job, status.code());
                false
            }
            Ok(None) if job.started.elapsed() > limit => {
                let _ = job.child.kill();
                let _ = job.child.wait();
                self.violation(format!("{} hung for {limit:?}", job.kind));
                false
            }
            Ok(None) => true,
            Err(e) => {
                self.violation(format!("{}: {e}", job.kind));
                false
            }
        });
        self.jobs = jobs;
        self.release_block_waits();
    }

    fn job_done(&mut self, job: &Job, code: Option<i32>) {
        match code {
            Some(0) => {}
            // The operation failed (faults, a full disk, a gem not yet
            // installed or just removed): allowed.
            Some(1) => return,
            other => {
                self.violation(format!("{} exited with {other:?}", job.kind));
                return;
            }
        }
        let Some(sha) = &job.sha else {
            return;
        };
        let printed = std::fs::read_to_string(&job.out).unwrap_or_default();
        let path = std::path::Path::new(printed.trim());
        match std::fs::read(path) {
            Ok(bytes) => {
                if hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)) != *sha {
                    self.violation(format!("path printed {} with other bytes", path.display()));
                }
            }
            // Deleted since by an upgrade or uninstall.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => self.violation(format!("path printed {}: {e}", path.display())),
        }
    }

    /// Gives one to three routes a new behaviour (a third of them good).
    pub(super) fn refault(&mut self) {
        for _ in 0..1 + self.rng.below(3) {
            let idx = self.rng.below(self.catalog.len());
            let routes = self.catalog[idx].routes();
            let (_, path) = self.rng.pick(&routes).clone();
            if self.rng.chance(0.33) {
                self.origin.route(&path, self.catalog[idx].good());
                *self.faults.entry("good").or_default() += 1;
                self.event(format!("route {path}: good"));
            } else {
                self.set_fault(idx, &path);
            }
        }
    }

    /// Gives the route `path` of resource `idx` a random behaviour.
    pub(super) fn set_fault(&mut self, idx: usize, path: &str) {
        let fault = *self.rng.pick(FAULTS);
        self.nth += 1;
        let (port, nth) = (self.origin.port(), self.nth);
        let behaviour = world::behaviour(
            fault,
            &self.catalog[idx],
            &mut self.rng,
            &self.refused_addr,
            port,
            nth,
        );
        self.origin.route(path, behaviour);
        *self.faults.entry(fault).or_default() += 1;
        self.event(format!("route {path}: {fault}"));
    }

    /// Installs, upgrades or uninstalls a gem by changing the gems folder.
    pub(super) fn change_gem(&mut self) {
        let name = self.rng.pick(GEMS).to_string();
        let folder = self.s.dir.join("gems").join(&name);
        if self.gems.contains_key(&name) && self.rng.chance(0.5) {
            let _ = std::fs::remove_dir_all(&folder);
            self.gems.remove(&name);
            self.count("uninstall");
            self.event(format!("gem {name}: removed"));
            return;
        }
        let gem = world::random_gem(&mut self.rng, self.catalog.len());
        let text = world::manifest(&gem, &self.catalog, self.origin.port());
        let kind = if self.gems.contains_key(&name) {
            "upgrade"
        } else {
            "install"
        };
        let written = std::fs::create_dir_all(&folder)
            .and_then(|()| world::write_atomic(&folder.join("notochord.json"), &text));
        if let Err(e) = written {
            self.violation(format!("soak could not write gem {name}: {e}"));
            return;
        }
        self.count(kind);
        self.event(format!("gem {name}: {kind} {gem:?}"));
        self.gems.insert(name, gem);
    }

    pub(super) fn count(&mut self, kind: &'static str) {
        *self.actions.entry(kind).or_default() += 1;
    }

    /// Blocks a host, or unblocks the blocked one, by rewriting the
    /// configuration file, with or without SIGHUP. A block is checked from
    /// a grace period after the change, and only once every `path` process
    /// that read the policy before it has exited.
    pub(super) fn change_policy(&mut self) {
        // Before its handlers are in place, SIGHUP would end `serve`.
        let young = self.serve_since.elapsed() < Duration::from_secs(3);
        let sighup = self.rng.chance(0.5) && !young;
        let grace = if sighup { SIGHUP_GRACE } else { FILE_GRACE };
        if let Some(host) = self.blocked.keys().next().cloned() {
            // Unblock only once the block has been checked for a while.
            let checked = lock(&self.net).blocked.get(&host).copied();
            if checked.is_none_or(|at| Instant::now() < at + Duration::from_secs(4)) {
                return;
            }
            self.blocked.remove(&host);
            self.write_config();
            lock(&self.net).blocked.remove(&host);
            self.count("unblock");
            self.event(format!("policy: unblock {host} (sighup {sighup})"));
        } else {
            let host = self.rng.pick(POLICY_HOSTS).to_string();
            self.blocked.insert(host.clone(), Instant::now());
            self.write_config();
            self.block_waits = self
                .jobs
                .iter()
                .filter(|j| j.kind == "path")
                .map(|j| j.child.id())
                .collect();
            let from = if self.block_waits.is_empty() {
                Instant::now() + grace
            } else {
                // Checked once the older `path` processes are gone.
                Instant::now() + Duration::from_secs(86_400)
            };
            self.block_grace = grace;
            lock(&self.net).blocked.insert(host.clone(), from);
            self.count("block");
            self.event(format!("policy: block {host} (sighup {sighup})"));
        }
        if sighup {
            self.signal(libc::SIGHUP);
        }
    }

    /// Starts checking a block once the `path` processes older than it
    /// have exited.
    fn release_block_waits(&mut self) {
        if self.block_waits.is_empty() {
            return;
        }
        let alive = self
            .jobs
            .iter()
            .any(|j| self.block_waits.contains(&j.child.id()));
        if alive {
            return;
        }
        self.block_waits.clear();
        let from = Instant::now() + self.block_grace;
        for at in lock(&self.net).blocked.values_mut() {
            *at = from;
        }
    }

    /// Sends `signal` to `serve`, once it has run for three seconds (its
    /// handlers are in place by then).
    pub(super) fn signal(&mut self, signal: i32) {
        let age = self.serve_since.elapsed();
        if let Some(left) = Duration::from_secs(3).checked_sub(age) {
            std::thread::sleep(left);
        }
        if let Some(child) = &self.serve {
            let pid = child.id() as libc::pid_t;
            // SAFETY: kill(2) with our own child's pid and a valid signal
            // number has no memory effects.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// Three `path` processes at once for one resource of an installed gem.
    pub(super) fn path_burst(&mut self) {
        if self.jobs.len() >= 6 || self.gems.is_empty() {
            return;
        }
        // A file not stored yet when there is one: that makes requests.
        let present = self.blobs.check(&self.store_root(), &self.sizes).1;
        let mut choices: Vec<(String, usize)> = Vec::new();
        for (gem, resources) in &self.gems {
            for &(idx, _) in resources {
                choices.push((gem.clone(), idx));
            }
        }
        let missing: Vec<(String, usize)> = choices
            .iter()
            .filter(|(_, idx)| !present.contains(&self.catalog[*idx].sha256))
            .cloned()
            .collect();
        let (gem, idx) = if missing.is_empty() {
            self.rng.pick(&choices).clone()
        } else {
            self.rng.pick(&missing).clone()
        };
        let id = format!("r{idx:02}");
        self.count("path");
        self.event(format!("path {gem} {id} x3"));
        for n in 0..3 {
            self.nth += 1;
            let out = self.s.dir.join(format!("path-{}-{n}.out", self.nth % 64));
            match self.command(&["path", &gem, &id], &out) {
                Ok(child) => self.jobs.push(Job {
                    kind: "path",
                    child,
                    started: Instant::now(),
                    out,
                    sha: Some(self.catalog[idx].sha256.clone()),
                }),
                Err(e) => self.violation(format!("could not start path: {e}")),
            }
        }
    }

    pub(super) fn run_verify(&mut self) {
        if self.jobs.iter().any(|j| j.kind == "verify") {
            return;
        }
        let out = self.s.dir.join("verify.out");
        match self.command(&["verify"], &out) {
            Ok(child) => {
                self.count("verify");
                self.event("verify".into());
                self.jobs.push(Job {
                    kind: "verify",
                    child,
                    started: Instant::now(),
                    out,
                    sha: None,
                })
            }
            Err(e) => self.violation(format!("could not start verify: {e}")),
        }
    }

    /// `kill -9` and a new `serve`; notes how many partial files with
    /// flushed bytes were kept, to see them resumed.
    pub(super) fn restart(&mut self, why: &str) {
        if let Some(mut child) = self.serve.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let kept = checks::kept_partials(&self.store_root()).len();
        self.restarts.push(Restart {
            at: self.now(),
            kept,
        });
        self.event(format!("{why}: serve killed, {kept} partial file(s) kept"));
        self.incarnation += 1;
        self.spawn_serve();
    }

    /// Fills the store's file system to 3 MiB short of full, or frees it.
    pub(super) fn disk(&mut self) {
        let Some(disk) = self.s.disk.clone() else {
            return;
        };
        if let Some(filler) = self.filler.take() {
            let _ = std::fs::remove_file(&filler);
            self.count("disk-free");
            self.event("disk: freed".into());
            return;
        }
        let Ok(stat) = rustix::fs::statvfs(&disk) else {
            return;
        };
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        let fill = free.saturating_sub(3 << 20);
        let filler = disk.join("filler");
        let written = std::fs::File::create(&filler).and_then(|mut f| {
            let chunk = vec![0u8; 1 << 20];
            let mut left = fill;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                std::io::Write::write_all(&mut f, &chunk[..n])?;
                left -= n as u64;
            }
            Ok(())
        });
        if let Err(e) = written {
            self.event(format!("disk: filling stopped early: {e}"));
        }
        self.filler = Some(filler);
        self.count("disk-fill");
        self.event(format!("disk: filled {fill} of {free} free bytes"));
    }
}
