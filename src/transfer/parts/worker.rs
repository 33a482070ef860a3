//! One part's connection: its requests, one after another (its own
//! range, then ranges taken over or hedged), and its bytes into the part
//! map and the file ([`PartSink`]).

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;
use url::Url;

use crate::error::AttemptError;
use crate::net::hosts::HostPermit;
use crate::net::response::Response;
use crate::transfer::body::{local_write, size_error, Body};
use crate::transfer::exchange::{validator, Ask, HeadError};
use crate::transfer::fetch::{Fetcher, Reporter, TransferError};
use crate::transfer::sink::{BodySink, BATCH_BYTES};

use super::map::{take, Take, Task};
use super::run::{lock, Run, Stop};
use super::steal::{idle, Look};

impl Fetcher {
    /// One connection's work: its range (the first's, or one taken over
    /// once the file is split), then ranges taken over from the others,
    /// until nothing is worth taking.
    pub(super) async fn worker(&self, run: &Run<'_>, i: usize, first: Option<First>) {
        let task = match i {
            0 => Some(run.own(0)),
            _ => run.opened(i).await,
        };
        if let Some(task) = task {
            self.work(run, i, task, first).await;
        }
        if i == 0 {
            run.first_done();
        }
    }

    async fn work(&self, run: &Run<'_>, i: usize, mut task: Task, mut first: Option<First>) {
        let mut policy = run.policy.clone();
        let started = Instant::now();
        loop {
            let result = match first.take() {
                // Its body may run past its range (the range was cut when
                // the file was split): the sink stops at the range's end,
                // and only more than it asked for is a size error.
                Some((hop, response, _permit, asked)) => match run.claim(task) {
                    Some((start, _)) => {
                        let body = (run.address, &hop, response, start, asked);
                        self.part_body(run, i, task, body, started, &mut policy)
                            .await
                    }
                    None => Ok(Ended::default()),
                },
                None => self.part(run, i, task, &mut policy).await,
            };
            let rate = match result {
                // Its request is done and its range goes on: it asks for
                // the rest.
                Ok(Ended { more: true, .. }) => continue,
                Ok(ended) => ended.rate,
                Err(stop) => {
                    run.fail(stop);
                    return;
                }
            };
            let next = idle(&run.stop, &run.moved, || match run.steal(i, rate) {
                Some(next) => Look::Take(next),
                None if run.unfinished() => Look::Wait,
                None => Look::Done,
            });
            match next.await {
                Some(next) => task = next,
                None => return,
            }
        }
    }

    /// Asks for the range of `task` (part `i`'s connection) and reads it.
    async fn part(
        &self,
        run: &Run<'_>,
        i: usize,
        task: Task,
        policy: &mut watch::Receiver<u64>,
    ) -> Result<Ended, Stop> {
        let started = Instant::now();
        let Some((start, end)) = run.claim(task) else {
            return Ok(Ended::default());
        };
        if i == 0 {
            run.first_asked
                .store(end, std::sync::atomic::Ordering::Relaxed);
        }
        let (k, source, known) = run.source(i);
        let ask = Ask {
            start,
            end: Some(end - 1),
            validator: known,
        };
        let mut quiet = Quiet;
        let head = tokio::select! {
            biased;
            () = run.stop.cancelled() => return Err(Stop::Failed(Box::new(TransferError::Cancelled))),
            head = self.response_head(source, Some(&ask), run.expected.size, policy, &mut quiet) => head,
        };
        let (hop, response, _, _permit, answered) = match head {
            Ok(head) => head,
            Err(HeadError::Attempt(hop, e)) => {
                return Err(Stop::failed(run.attempt_of(source, &hop, e)))
            }
            Err(HeadError::RangeRefused(hop, why)) => {
                return Err(Stop::Refused(format!("{hop} refused a part: {why}")))
            }
        };
        run.note_setup(answered);
        let status = response.status().as_u16();
        if status != 206 {
            return Err(Stop::Refused(format!(
                "{hop} answered {status} to a ranged part"
            )));
        }
        if !run.same_validator(k, validator(&response)) {
            return Err(Stop::Refused(format!("{hop} changed the file's validator")));
        }
        if response.content_length().is_some_and(|n| n != end - start) {
            return Err(Stop::Refused(format!(
                "{hop} announced another length for a part"
            )));
        }
        let body = (source, &hop, response, start, end);
        self.part_body(run, i, task, body, started, policy).await
    }

    /// Reads one part's body (from `start` up to `limit`, what it asked
    /// for) into its task's range, stopping where the range ends now, or
    /// when another connection of the range is ahead of it.
    async fn part_body(
        &self,
        run: &Run<'_>,
        i: usize,
        task: Task,
        body: (&Url, &Url, Response, u64, u64),
        started: Instant,
        policy: &mut watch::Receiver<u64>,
    ) -> Result<Ended, Stop> {
        let (source, hop, mut response, start, limit) = body;
        let mut sink = PartSink {
            run,
            i,
            task,
            pos: start,
            wrote: 0,
            behind: false,
            batch: Vec::new(),
            at: start,
            len: 0,
            held: Duration::ZERO,
        };
        let fail = |hop: &Url, e: AttemptError| run.attempt_of(source, hop, e);
        let body = Body {
            hop,
            response: &mut response,
            sink: &mut sink,
            sink_path: &run.sink_path,
            received: start,
            expected: Some(run.expected),
            limit,
        };
        // The run's stop, or this range done by another connection (a
        // hedge that was faster): the connection ends at once.
        let stopped = async {
            tokio::select! {
                () = run.stop.cancelled() => {}
                () = run.until_superseded(task) => {}
            }
        };
        tokio::pin!(stopped);
        let outcome = self
            .receive(body, stopped.as_mut(), policy, &mut Quiet, &fail)
            .await;
        let outcome = match outcome {
            Ok(Some(TransferError::Cancelled)) if !run.stop.is_cancelled() => {
                // Nothing left for it: what it wrote stands.
                sink.behind = true;
                Ok(None)
            }
            other => other,
        };
        let flushed = sink
            .flush()
            .await
            .map_err(|e| local_write(&run.sink_path, e));
        let rate =
            (sink.wrote > 0).then(|| sink.wrote as f64 / started.elapsed().as_secs_f64().max(1e-3));
        let ended = |more| Ok(Ended { rate, more });
        match (outcome, flushed) {
            (Err(e), _) | (Ok(_), Err(e)) => Err(Stop::failed(e)),
            (Ok(Some(failure)), _) => Err(Stop::failed(failure)),
            (Ok(None), _) if sink.behind => ended(false),
            (Ok(None), _) => match run.claim(task) {
                None => ended(false),
                // All it asked for came, and its range goes on.
                Some((next, _)) if next >= limit => ended(true),
                Some((next, _)) => {
                    let detail = format!("a part's connection closed after byte {next}");
                    let error = size_error(Some(run.expected), run.expected.size, detail);
                    Err(Stop::failed(run.attempt_of(source, hop, error)))
                }
            },
        }
    }
}

/// The accepted answer to the first request as its part reads it: the hop,
/// the response, its host's slot and where the bytes it asked for end.
pub(super) type First = (Url, Response, HostPermit, u64);

/// How a part's request ended.
#[derive(Debug, Default)]
struct Ended {
    /// The rate it wrote at, when it wrote.
    rate: Option<f64>,
    /// It brought all it asked for and its range goes on past that (the
    /// first request asked for its share only): the part asks for the rest.
    more: bool,
}

/// A part's reporter: the file's progress comes from [`PartSink`] (or
/// from the stream that carries on, `carry`).
pub(in crate::transfer) struct Quiet;

impl Reporter for Quiet {
    fn bytes(&mut self, _total: u64) {}
}

/// One connection's bytes into its task's range of the file.
struct PartSink<'r, 'a> {
    run: &'r Run<'a>,
    i: usize,
    task: Task,
    /// Where the connection's next byte belongs in the file.
    pos: u64,
    /// Bytes it wrote (not those another connection of the range brought
    /// first).
    wrote: u64,
    /// It fell behind another connection of its range and stopped.
    behind: bool,
    /// Chunks gathered, from `at`.
    batch: Vec<Bytes>,
    at: u64,
    /// Their bytes.
    len: u64,
    /// How long its batches waited for the writer since it was last
    /// measured.
    held: Duration,
}

impl PartSink<'_, '_> {
    async fn flush(&mut self) -> std::io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        let at = self.at;
        self.at += std::mem::take(&mut self.len);
        // The time the writer keeps the connection waiting: the pace of
        // the disk or the hash, not the connection's.
        let asked = Instant::now();
        let written = self.run.scatter.write_at(at, batch).await;
        self.held += asked.elapsed();
        written
    }
}

impl BodySink for PartSink<'_, '_> {
    async fn write(&mut self, chunk: Bytes) -> std::io::Result<bool> {
        let from = self.pos;
        self.pos += chunk.len() as u64;
        let (taken, more) = {
            let mut slots = lock(&self.run.slots);
            let Some(s) = slots.get_mut(self.task.slot) else {
                return Ok(false);
            };
            let taken = take(s, self.task, from, chunk.len() as u64, self.wrote);
            let more = s.next < s.end;
            (taken, more)
        };
        if !more && matches!(taken, Take::Write(..)) {
            // This chunk finished the range: another connection reading it
            // stops now.
            self.run.moved.notify_waiters();
        }
        let (lo, hi) = match taken {
            Take::Write(lo, hi) => (lo, hi),
            Take::Skip => return Ok(true),
            Take::Done => {
                self.flush().await?;
                return Ok(false);
            }
            Take::Behind => {
                self.behind = true;
                self.flush().await?;
                return Ok(false);
            }
        };
        if self.i == 0 {
            self.run.measure(hi - lo, std::mem::take(&mut self.held));
        }
        if !self.batch.is_empty() && self.at + self.len != lo {
            // Another connection wrote in between: a batch is contiguous.
            self.flush().await?;
        }
        if self.batch.is_empty() {
            self.at = lo;
        }
        self.batch
            .push(chunk.slice((lo - from) as usize..(hi - from) as usize));
        self.len += hi - lo;
        self.wrote += hi - lo;
        {
            let mut progress = lock(&self.run.progress);
            progress.total += hi - lo;
            let total = progress.total;
            progress.reporter.bytes(total);
        }
        if self.len >= BATCH_BYTES as u64 || !more {
            self.flush().await?;
        }
        Ok(more)
    }

    async fn checkpoint(&mut self) -> std::io::Result<()> {
        if self.i == 0 {
            // A silent first connection is slow too.
            self.run.measure(0, std::mem::take(&mut self.held));
        }
        self.flush().await?;
        self.run.scatter.checkpoint().await
    }
}
