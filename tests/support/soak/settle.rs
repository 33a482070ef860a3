//! The end of a soak: the faults stop, the service must converge, and the
//! summary is written.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{checks, lock, Soak, Summary};

/// Seconds after a restart within which a ranged request counts as the
/// resume of the kept bytes.
const RESUME_WINDOW: f64 = 20.0;

impl Soak {
    /// Stops every fault and waits, at most `settle_secs`, until every
    /// required file of every installed gem is present and nothing of an
    /// uninstalled one is left, with the same `serve` running (its periodic
    /// retry, `service.retry_failed_after`, tries failed files again); then
    /// restarts it, as an app start would, and checks that the store stays
    /// converged (or converges again) within the same bound.
    pub(super) async fn settle(&mut self) {
        self.event("faults stop".into());
        for r in &self.catalog {
            for (_, path) in r.routes() {
                self.origin.route(&path, r.good());
            }
        }
        if let Some(filler) = self.filler.take() {
            let _ = std::fs::remove_file(filler);
        }
        while !self.jobs.is_empty() {
            self.poll_jobs(Duration::from_secs(200));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !self.blocked.is_empty() {
            self.blocked.clear();
            self.write_config();
            lock(&self.net).blocked.clear();
            self.signal(libc::SIGHUP);
            self.event("policy: unblock all (sighup)".into());
        }
        let began = self.now();
        self.missing_before_restart = usize::MAX;
        self.settle_took = self.converge(began, "with serve running unchanged").await;
        if self.missing_before_restart == usize::MAX {
            // Converged within 10 s.
            self.missing_before_restart = 0;
        }
        self.last_long = self.samples.last().copied();
        self.restart("app restart");
        let again = self.now();
        self.restart_took = self.converge(again, "after the final restart").await;
    }

    /// Waits until nothing is pending, at most `settle_secs` after `began`
    /// (a violation otherwise), sampling `serve`; returns how long it took.
    /// Notes how many files were pending 10 s after `began`.
    async fn converge(&mut self, began: f64, how: &str) -> f64 {
        let mut next_sample = 0.0;
        loop {
            self.poll_serve();
            if self.now() >= next_sample {
                next_sample = self.now() + 2.0;
                self.sample();
            }
            let pending = self.pending();
            if self.now() - began >= 10.0 && self.missing_before_restart == usize::MAX {
                self.missing_before_restart = pending.len();
                self.event(format!("{} file(s) pending 10 s {how}", pending.len()));
            }
            if pending.is_empty() {
                break;
            }
            if self.now() - began > self.s.settle_secs {
                self.violation(format!(
                    "not converged {:.0} s after the faults stopped, {how}: {pending:?}",
                    self.s.settle_secs
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let took = self.now() - began;
        self.event(format!("converged {how} in {took:.1} s"));
        took
    }

    /// What keeps the store from its final state: a missing required file,
    /// or a verified or partial file no installed gem declares.
    fn pending(&mut self) -> Vec<String> {
        let root = self.store_root();
        let (bad, present) = self.blobs.check(&root, &self.sizes);
        for b in bad {
            self.violation(format!("final path: {b}"));
        }
        let (required, declared) = self.declared();
        let mut out: Vec<String> = required
            .difference(&present)
            .map(|sha| format!("missing {}", &sha[..12]))
            .collect();
        out.extend(
            present
                .difference(&declared)
                .map(|sha| format!("left over {}", &sha[..12])),
        );
        out.extend(
            checks::partial_shas(&root)
                .difference(&declared)
                .map(|sha| format!("partial left over {}", &sha[..12])),
        );
        out
    }

    /// The final checks, the summary, and the event log around the first
    /// violation.
    pub(super) fn finish(mut self) -> Summary {
        self.check_store();
        self.sample();
        for t in checks::trends(&self.samples, 30.0, 120.0) {
            self.violation(t);
        }
        let ranges = lock(&self.net).ranges.clone();
        let eligible: Vec<f64> = self
            .restarts
            .iter()
            .filter(|r| r.kept > 0)
            .map(|r| r.at)
            .collect();
        let resumed = eligible
            .iter()
            .filter(|&&at| ranges.iter().any(|&t| t >= at && t <= at + RESUME_WINDOW))
            .count();
        if eligible.len() >= 2 && resumed == 0 {
            self.violation(format!(
                "no restart resumed kept bytes ({} restarts kept some)",
                eligible.len()
            ));
        }
        self.stop_serve();
        let _ = std::fs::write(
            self.s.dir.join("events.log"),
            self.events
                .iter()
                .map(|(t, e)| format!("[{t:8.2}] {e}\n"))
                .collect::<String>(),
        );
        let mut text = self.report(eligible.len(), resumed);
        if let Some(&(at, _)) = self.violations.first() {
            let _ = writeln!(
                text,
                "\nseed {} — events around the first violation:",
                self.s.seed
            );
            for (t, e) in self
                .events
                .iter()
                .filter(|(t, _)| (t - at).abs() <= 10.0)
                .take(80)
            {
                let _ = writeln!(text, "[{t:8.2}] {e}");
            }
        }
        Summary {
            text,
            violations: self.violations.into_iter().map(|(_, v)| v).collect(),
        }
    }

    /// SIGTERM, and a clean exit expected within 20 seconds.
    fn stop_serve(&mut self) {
        self.signal(libc::SIGTERM);
        let Some(mut child) = self.serve.take() else {
            return;
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return,
                Ok(Some(status)) => {
                    self.violation(format!("serve stopped on SIGTERM with {status}"));
                    return;
                }
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    self.violation("serve did not stop on SIGTERM within 20 s".into());
                    return;
                }
            }
        }
    }

    fn report(&self, eligible: usize, resumed: usize) -> String {
        let net = lock(&self.net);
        let mut t = String::new();
        let _ = writeln!(t, "soak summary (seed {})", self.s.seed);
        let _ = writeln!(
            t,
            "  minutes of faults   {:.1} (then {:.1} s to converge with serve running, \
             {:.1} s after a restart; bound {:.0} s each)",
            self.s.chaos_secs / 60.0,
            self.settle_took,
            self.restart_took,
            self.s.settle_secs
        );
        let faults: u64 = self
            .faults
            .iter()
            .filter(|(k, _)| **k != "good")
            .map(|(_, v)| v)
            .sum();
        let _ = writeln!(t, "  faults injected     {faults}: {:?}", self.faults);
        let _ = writeln!(t, "  actions             {:?}", self.actions);
        let _ = writeln!(
            t,
            "  requests            {} {:?}",
            net.requests, net.by_host
        );
        let _ = writeln!(t, "  downloads verified  {}", self.blobs.verified());
        let _ = writeln!(
            t,
            "  restarts            {} (kill -9; {eligible} with kept bytes, {resumed} resumed them)",
            self.restarts.len()
        );
        let _ = writeln!(
            t,
            "  refused address     {} connection(s)",
            self.refused.load(Ordering::SeqCst)
        );
        let _ = writeln!(
            t,
            "  pending 10 s after the faults stopped, serve running: {} file(s)",
            self.missing_before_restart
        );
        let _ = writeln!(
            t,
            "  tmp/ peak           {} files, {} bytes; failures/ peak {} files, {} bytes",
            self.max_tmp.0, self.max_tmp.1, self.max_failures.0, self.max_failures.1
        );
        let peak = |f: fn(&checks::Sample) -> u64| self.samples.iter().map(f).max().unwrap_or(0);
        let last = self.last_long.as_ref();
        let _ = writeln!(
            t,
            "  serve RSS           peak {} KiB, final {} KiB (final: before the last restart)",
            peak(|s| s.rss_kib),
            last.map_or(0, |s| s.rss_kib)
        );
        let _ = writeln!(
            t,
            "  serve fds/threads   peak {}/{}, final {}/{} ({} samples)",
            peak(|s| s.fds),
            peak(|s| s.threads),
            last.map_or(0, |s| s.fds),
            last.map_or(0, |s| s.threads),
            self.samples.len()
        );
        let _ = writeln!(t, "  violations          {}", self.violations.len());
        for (at, v) in self.violations.iter().take(40) {
            let _ = writeln!(t, "    [{at:8.2}] {v}");
        }
        if self.violations.len() > 40 {
            let _ = writeln!(t, "    … and {} more", self.violations.len() - 40);
        }
        t
    }
}
