//! A job's transfer progress, turned into events for each waiter.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::service::events::Event;
use crate::service::limiter::Permit;
use crate::service::scheduler::job::{Job, Retry};
use crate::service::scheduler::Scheduler;
use crate::transfer::meter::Meter;
use crate::transfer::slots::Handover;

/// How often progress events are published per download at most (the last
/// one, at the declared size, aside): the cadence the events module
/// documents.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Turns a job's transfer progress into events (throttled), one for each
/// waiter.
pub(super) struct JobProgress<'a> {
    pub(super) job: &'a Job,
    pub(super) scheduler: &'a Scheduler,
    /// The job's download slot, handed over once its bytes are in.
    pub(super) slot: Handover<Permit>,
    pub(super) sha256: &'a str,
    pub(super) size: u64,
    /// When the last progress event went out (at first: when the job took
    /// its slot).
    pub(super) last: Instant,
    /// The bytes the last progress event of the current try said.
    pub(super) last_bytes: Option<u64>,
    /// This try's figures: its rate and time left.
    pub(super) meter: Meter,
}

impl JobProgress<'_> {
    /// `Started`, unless it went out already.
    fn start(&self) {
        self.scheduler.start(self.job, self.sha256, self.size);
    }
}

impl crate::transfer::fetch::Reporter for JobProgress<'_> {
    /// The slot goes to the next download while this file is made durable
    /// and named (see `transfer::slots`).
    fn transferred(&mut self) {
        self.slot.transferred();
    }

    /// `Started` goes out with the job's first connection, or with a
    /// retry or fallback that comes first: a try refused before connecting
    /// (policy, address rule) announces nothing by itself.
    fn connected(&mut self) {
        self.start();
    }

    fn trying(&mut self, address: &url::Url) {
        // A new try reaches the size afresh.
        self.last_bytes = None;
        // Its own try: no longer waiting for another download.
        *self
            .job
            .waiting_on
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        *self.job.address.lock().unwrap_or_else(|p| p.into_inner()) = address.to_string();
    }

    fn retrying(&mut self, wait: Duration, attempt: u32, of: u32, reason: &str) {
        self.start();
        *self.job.retry.lock().unwrap_or_else(|p| p.into_inner()) = Some(Retry {
            attempt,
            of,
            reason: reason.to_string(),
        });
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let address = self.job.address();
        self.scheduler.each(self.job, |w, at| Event::Retrying {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: self.sha256.to_string(),
            address: address.clone(),
            attempt,
            of,
            wait_ms,
            reason: reason.to_string(),
        });
    }

    fn waiting(&mut self) {
        self.waiting_on(None);
    }

    fn waiting_on(&mut self, on: Option<&str>) {
        let on = on.map(str::to_string);
        *self
            .job
            .waiting_on
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(on.clone());
        self.scheduler.each(self.job, |w, at| Event::Waiting {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: self.sha256.to_string(),
            on: on.clone(),
        });
    }

    fn fell_back(&mut self, failed: &crate::error::Attempt, next: &url::Url) {
        // An address that failed before any connection (refused, not
        // permitted) has not announced the download yet.
        self.start();
        let reason = failed.error.to_string();
        let hop = failed
            .hop
            .as_ref()
            .filter(|hop| *hop != &failed.address)
            .map(|hop| hop.to_string());
        self.scheduler.each(self.job, |w, at| Event::FellBack {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: self.sha256.to_string(),
            from: failed.address.to_string(),
            hop: hop.clone(),
            to: next.to_string(),
            code: failed.code(),
            reason: reason.clone(),
        });
    }

    fn resumed(&mut self, offset: u64) {
        self.start();
        self.job.bytes.store(offset, Ordering::Relaxed);
        self.meter.resumed(Instant::now(), offset);
        let address = self.job.address();
        self.scheduler.each(self.job, |w, at| Event::Resumed {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: self.sha256.to_string(),
            offset,
            size: self.size,
            address: address.clone(),
        });
    }

    /// At most one `Progress` per [`PROGRESS_EVERY`], and the one that
    /// reaches the declared size (once).
    fn bytes(&mut self, bytes: u64) {
        let now = Instant::now();
        if self.last_bytes != Some(bytes) {
            // Bytes flow again: no longer between two tries.
            self.job
                .retry
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
        }
        self.meter.update(now, bytes);
        let rate = self.meter.rate(now);
        self.job.bytes.store(bytes, Ordering::Relaxed);
        self.job.rate.store(rate as u64, Ordering::Relaxed);
        let last = bytes == self.size && self.last_bytes != Some(bytes);
        if self.last.elapsed() < PROGRESS_EVERY && !last {
            return;
        }
        self.start();
        self.last = Instant::now();
        self.last_bytes = Some(bytes);
        let address = self.job.address();
        let eta_secs = self.meter.time_left(now, self.size).map(|d| d.as_secs());
        self.scheduler.each(self.job, |w, at| Event::Progress {
            at,
            gem: w.gem.clone(),
            resource: w.resource.clone(),
            sha256: self.sha256.to_string(),
            bytes,
            size: self.size,
            address: address.clone(),
            bytes_per_sec: rate as u64,
            eta_secs,
        });
    }
}
