//! A large file in ranged parts over several connections.
//!
//! A file of at least [`PARTS_MIN_BYTES`] asks for its first share as a
//! range (`Range: bytes=0-E`, an eighth with 8 parts; a resumed one the rest
//! after kept bytes, with `If-Range`). When the server answers with a `206`
//! whose `Content-Range` is exactly that range and a validator (a strong
//! `ETag`, else `Last-Modified`), the file may be split: that first
//! response is read as one stream while its rate is measured, and only
//! when it is below [`SPLIT_BELOW_BYTES_PER_SEC`] (a connection capped by
//! its server, or a slow link) while the writer did not hold it back (a
//! connection that waits for the disk or the hash already brings the file
//! at this machine's pace, `window`), or when it came [`FAR_ANSWER`] or more
//! after its request (a far server), do up to `network.connections_per_file`
//! parts (at most `service.max_per_host`) take over equal ranges of the
//! rest, each asked for exactly, with `Range` and `If-Range` (the first
//! connection keeps the share it asked for, so its request is not cut
//! short either). A first connection that is not split asks for the rest
//! on the same connection when its share is done. A
//! connection faster than that is left alone: past it, more connections add
//! work (decryption, a read-back of the bytes written ahead of the hashed
//! prefix) on the same cores instead of speed. A part that finishes takes
//! over the upper half of the largest range still to come (work stealing,
//! down to [`MIN_PART_BYTES`]), leaving its connection what it has on the
//! way (its rate over a request-to-answer time): a request cut short wastes
//! those bytes, up to a window. Near the end, when nothing is left worth
//! splitting, an idle part hedges: when a range's connection would need
//! more than twice what the idle one would for the rest of it (a new
//! request counted, at the slowest request-to-answer time the parts have
//! seen), the idle one asks for that rest once more. Both read the same
//! range and a byte is written once, by whichever connection brings it
//! first; the one left behind stops, at once once the range is done (not
//! at its next chunk, which a slow connection may send a second later),
//! so the file is finished when its last byte is written. A range whose hedge is
//! slow too is hedged again (at most three times). Hedges ask for
//! at most an eighth of the file again, so the origin sends at most about a quarter
//! more than the file. One slow connection so does not set the finishing
//! time.
//!
//! Every part is one exchange like a single stream's: each hop checked
//! (scheme, policy, address, via the proxy when there is one), its host's
//! connection slot taken, the live policy watched, the stall timer and the
//! progress floor per connection, the bandwidth cap shared by all. A part's
//! `206` must be exactly the bytes asked for, with the same validator;
//! anything else (a `200`, another range or total, another validator) is
//! refused: every part stops and the file is fetched once more as one
//! stream. Any other failure of one part stops every part, and the try
//! fails as a single stream's would.
//!
//! The parts write at their offsets through one writer thread
//! (`scatter`) that keeps one SHA-256 over the whole file;
//! memory stays bounded: with 8 parts, at most 16 batches of 256 KiB in
//! the channel, a batch being gathered per part and a 1 MiB read-back
//! buffer, about 7.5 MiB besides the connections' own buffers. Progress is
//! one stream per file: the bytes of all parts together.

mod hedge;
mod map;
mod run;
mod steal;
mod window;
mod worker;

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::net::hosts::HostPermit;
use crate::net::response::Response;
use crate::store::partial::{Checkpointer, PartialPaths};
use crate::transfer::body::{check_finished, local_write};
use crate::transfer::fetch::{Expected, Fetcher, Reporter, Transfer, TransferError};
use crate::transfer::scatter;
use crate::transfer::sink::Written;

pub use crate::transfer::fetch::{FAR_ANSWER, SPLIT_BELOW_BYTES_PER_SEC};
pub(super) use map::first_share_end;
pub use map::MIN_PART_BYTES;
pub(super) use window::Window;
pub use window::RATE_WINDOW;
pub(super) use worker::Quiet;

use map::{first_slots, missing, share_first};
use run::{lock, Phase, Progress, Run, Stop};

/// Files smaller than this are one request each.
pub const PARTS_MIN_BYTES: u64 = 8 << 20;

/// The accepted answer to the first request, which becomes the first part.
pub(super) struct FirstPart {
    /// The hop that answered.
    pub hop: Url,
    /// Its `206`, from `offset` to `end`.
    pub response: Response,
    /// Its host's connection slot.
    pub permit: HostPermit,
    /// How long it took to answer once its slot was free.
    pub answered: Duration,
    /// Where its body starts (the kept prefix before it).
    pub offset: u64,
    /// Where its body ends: at most the first kept range after `offset`
    /// (a fresh file asks for its first share only, [`first_share_end`]).
    pub end: u64,
    /// The kept ranges beyond the prefix (`[start, end)`, sorted, apart):
    /// only the ranges between them are asked for.
    pub ranges: Vec<[u64; 2]>,
    /// The validator every part must match.
    pub validator: String,
    /// The policy changes, as seen since before the first hop was checked.
    pub policy: watch::Receiver<u64>,
    /// Other sources of the same bytes the parts may come from
    /// (`network.spread_over_mirrors`).
    pub also: Vec<Url>,
    /// `Some`: read as one stream until its connection was found slow
    /// (`carry`), with the SHA-256 of the bytes before `offset` so far.
    /// The file is split at once, and that prefix is not read back.
    pub handed: Option<sha2::Sha256>,
}

impl Fetcher {
    /// Whether a server that answered the first request after `answered`
    /// is far: its file's parts open at once.
    pub(super) fn is_far(&self, answered: Duration) -> bool {
        self.split_below > 0 && answered >= self.far_answer
    }

    /// Whether a file of `expected` is fetched in parts when its server
    /// answers ranges.
    pub(super) fn parts_for(&self, expected: Option<Expected<'_>>) -> bool {
        self.parts > 1 && expected.is_some_and(|e| e.size >= PARTS_MIN_BYTES)
    }

    /// Fetches the file in parts, `first` being the accepted answer to the
    /// first request. `Ok(None)`: a part was refused.
    pub(super) async fn parts(
        &self,
        address: &Url,
        expected: Expected<'_>,
        paths: &PartialPaths,
        first: FirstPart,
        cancel: Option<&CancellationToken>,
        reporter: &mut dyn Reporter,
    ) -> Result<Option<Transfer>, TransferError> {
        let FirstPart {
            hop,
            response,
            permit,
            answered,
            offset,
            end,
            ranges,
            validator,
            policy,
            also,
            handed,
        } = first;
        let mut sources = vec![address.clone()];
        sources.extend(also);
        let mut validators = vec![None; sources.len()];
        validators[0] = Some(validator.clone());
        let opening = paths.clone();
        let file = tokio::task::spawn_blocking(move || opening.open_data())
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            .map_err(|e| local_write(&paths.data, e))?;
        let checkpoints = Checkpointer::new(paths, address.as_str(), Some(validator.clone()));
        let gaps = missing(offset, expected.size, &ranges);
        let within =
            |&(start, gap_end): &(u64, u64)| start == offset && offset < end && end <= gap_end;
        if !gaps.first().is_some_and(within) {
            return Err(local_write(
                &paths.data,
                std::io::Error::other("the first part is not the first missing range"),
            ));
        }
        let kept = Written {
            prefix: offset,
            ranges,
        };
        let present = kept.bytes();
        let slow = handed.is_some();
        let (scatter, thread) = scatter::start(file, kept, handed, checkpoints)
            .map_err(|e| local_write(&paths.data, e))?;
        let mut slots = first_slots(&gaps, self.parts);
        // Parts from several sources were asked for, the server is far, or
        // the stream before was found slow: they start at once.
        let far = self.is_far(answered);
        let spread = sources.len() > 1 || far || slow;
        if spread {
            share_first(&mut slots, end);
        }
        if slow {
            tracing::debug!(%address, parts = slots.len(), from = offset, "a slow connection: fetching the rest in parts");
        } else if far {
            tracing::debug!(%address, parts = slots.len(), answered_ms = answered.as_millis(), "a far server: fetching in parts at once");
        } else {
            tracing::debug!(%address, parts = slots.len(), "ranges answered: parts when slow");
        }
        let count = slots.len();
        let run = Run {
            address,
            expected,
            sources,
            validators: Mutex::new(validators),
            slots: Mutex::new(slots),
            first_asked: std::sync::atomic::AtomicU64::new(end),
            pending: Mutex::new(gaps.into_iter().skip(1).collect()),
            hedge_left: Mutex::new(expected.size / 8),
            progress: Mutex::new(Progress {
                reporter,
                total: present,
            }),
            scatter,
            sink_path: paths.data.clone(),
            stop: cancel.map_or_else(CancellationToken::new, CancellationToken::child_token),
            policy,
            failure: Mutex::new(None),
            window: Mutex::new((!spread).then(Window::new)),
            split_below: self.split_below,
            phase: watch::channel(if spread { Phase::Split } else { Phase::Probing }).0,
            moved: tokio::sync::Notify::new(),
            setup: Mutex::new(None),
        };
        let mut first = Some((hop.clone(), response, permit, end));
        // Polled only when woken: the parts waiting for a split cost the
        // first connection nothing.
        let mut workers: futures_util::stream::FuturesUnordered<_> = (0..count)
            .map(|i| self.worker(&run, i, if i == 0 { first.take() } else { None }))
            .collect();
        while futures_util::StreamExt::next(&mut workers).await.is_some() {}
        drop(workers);
        let failure = lock(&run.failure).take();
        let outcome = match failure {
            None => self.finish_parts(&run, &hop).await,
            Some(stop) => {
                run.scatter.close().await;
                match stop {
                    Stop::Refused(why) => {
                        tracing::info!(%address, "{why}: fetching as one stream");
                        Ok(None)
                    }
                    Stop::Failed(e) => Err(*e),
                }
            }
        };
        drop(run);
        if let Err(e) = thread.join().await {
            tracing::warn!("the writer of {} failed: {e}", paths.data.display());
        }
        outcome
    }

    /// Every part ended: the whole file's size and SHA-256.
    async fn finish_parts(
        &self,
        run: &Run<'_>,
        hop: &Url,
    ) -> Result<Option<Transfer>, TransferError> {
        let finished = run
            .scatter
            .finish()
            .await
            .map_err(|e| local_write(&run.sink_path, e))?;
        let expected = Some(run.expected);
        check_finished(&finished, expected, run.expected.size).map_err(|e| run.attempt(hop, e))?;
        Ok(Some(Transfer {
            size: finished.len,
            sha256: finished.sha256,
            final_url: hop.clone(),
        }))
    }
}
