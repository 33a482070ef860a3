//! A large file from a near server, read as one stream that carries on
//! while it is fast.
//!
//! A file that may come in parts asks for its first share as a range
//! (`parts`). When its server is near (it answered within
//! [`crate::transfer::fetch::FAR_ANSWER`]), it is the only source and
//! nothing is kept beyond the prefix, that first response is read into the
//! plain streaming sink ([`Sink`]) while its rate is measured by the rule
//! that splits a file ([`Window`]). Its share done and the rate kept, the
//! rest is asked for on the same connection, exactly (`Range` to the end,
//! `If-Range`), and read into the same sink. A fast connection so costs
//! what one stream costs: no writer of parts, no bookkeeping of ranges.
//!
//! Once the rate falls below the threshold (or the connection is silent at
//! a checkpoint) while the writer did not hold the stream back (one that
//! waits for the disk or the hash runs at this machine's pace, which more
//! connections would not raise), the stream stops where it is: its bytes are flushed and
//! recorded, and the parts take over from there at once, their first
//! connection reading on from the same response, so no byte is asked for
//! twice ([`FirstPart::handed`]): the hash of the bytes before is handed
//! over too, so they are not read back. A rest that is not answered exactly (no
//! `206`, another validator or length) ends the try as a refused part
//! does: one stream continues from the prefix kept.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::error::AttemptError;
use crate::store::partial::PartialPaths;
use crate::transfer::body::{
    attempt_error, check_finished, local_write, partial_sink, until_cancelled, Body,
};
use crate::transfer::exchange::{validator, Ask, HeadError};
use crate::transfer::fetch::{Expected, Fetcher, Reporter, Transfer, TransferError};
use crate::transfer::parts::{FirstPart, Quiet, Window};
use crate::transfer::sink::{BodySink, Sink};

/// The streaming sink ([`Sink`]), and the first connection's rate measured
/// as its bytes go in.
struct Probe<S = Sink> {
    sink: S,
    window: Window,
    split_below: u64,
    /// The file's next byte: where the body being read is.
    at: u64,
    /// The connection was found slow: the parts take over.
    slow: bool,
}

impl<S> Probe<S> {
    /// Counts `bytes` more, brought while the stream waited `held` for the
    /// writer; whether the connection is now found slow.
    fn measure(&mut self, bytes: u64, held: Duration) -> bool {
        if !self.slow {
            if let Some(rate) = self.window.slow(bytes, held, self.split_below) {
                tracing::debug!(rate, at = self.at, "a slow connection: the parts take over");
                self.slow = true;
            }
        }
        self.slow
    }
}

impl<S: BodySink> BodySink for Probe<S> {
    async fn write(&mut self, chunk: Bytes) -> std::io::Result<bool> {
        let bytes = chunk.len() as u64;
        // The time the writer keeps the stream waiting (its channel full):
        // the pace of the disk or the hash, not the connection's.
        let asked = Instant::now();
        let more = BodySink::write(&mut self.sink, chunk).await?;
        self.at += bytes;
        Ok(!self.measure(bytes, asked.elapsed()) && more)
    }

    async fn checkpoint(&mut self) -> std::io::Result<()> {
        let asked = Instant::now();
        BodySink::checkpoint(&mut self.sink).await?;
        // A silent connection is slow too.
        self.measure(0, asked.elapsed());
        Ok(())
    }

    fn stopped(&self) -> bool {
        self.slow
    }
}

impl Fetcher {
    /// Reads the file from `first` (the accepted answer to its first
    /// request) as one stream while it is fast, handing it to the parts
    /// once it is not. `Ok(None)`: the rest was refused, fetch again as one
    /// stream from the prefix kept.
    pub(super) async fn carry_on(
        &self,
        address: &Url,
        expected: Expected<'_>,
        paths: &PartialPaths,
        first: FirstPart,
        cancel: Option<&CancellationToken>,
        reporter: &mut dyn Reporter,
    ) -> Result<Option<Transfer>, TransferError> {
        let FirstPart {
            mut hop,
            mut response,
            mut permit,
            mut answered,
            offset,
            mut end,
            validator: kept,
            mut policy,
            ..
        } = first;
        let mut probe = Probe {
            sink: partial_sink(paths, address, offset, Some(kept.clone())),
            window: Window::new(),
            split_below: self.split_below,
            at: offset,
            slow: false,
        };
        tracing::debug!(%address, from = offset, "a near server: one stream while it is fast");
        let fail = |hop: &Url, error: AttemptError| attempt_error(address, hop, error);
        let cancelled = until_cancelled(cancel);
        tokio::pin!(cancelled);
        loop {
            let received = probe.at;
            let body = Body {
                hop: &hop,
                response: &mut response,
                sink: &mut probe,
                sink_path: &paths.data,
                received,
                expected: Some(expected),
                limit: end,
            };
            let failure = self
                .receive(body, cancelled.as_mut(), &mut policy, reporter, &fail)
                .await
                .unwrap_or_else(Some);
            if let Some(failure) = failure {
                probe.sink.close().await;
                return Err(failure);
            }
            // Found slow on the last byte of a request: the parts take over
            // with the next one's answer (its first chunk stops the stream).
            if probe.slow && probe.at < end {
                // What arrived is flushed and recorded, its hash handed to
                // the parts, which go on from where the body is.
                let (at, hashed) = probe
                    .sink
                    .hand_over()
                    .await
                    .map_err(|e| local_write(&paths.data, e))?;
                if at != probe.at {
                    return Err(local_write(
                        &paths.data,
                        std::io::Error::other("the stream kept another length than it read"),
                    ));
                }
                let first = FirstPart {
                    hop,
                    response,
                    permit,
                    answered,
                    offset: probe.at,
                    end,
                    ranges: Vec::new(),
                    validator: kept,
                    policy,
                    also: Vec::new(),
                    handed: Some(hashed),
                };
                return self
                    .parts(address, expected, paths, first, cancel, reporter)
                    .await;
            }
            if probe.at >= expected.size {
                break;
            }
            // The share is done: the rest, on the same connection (its slot
            // given back first, as a part's).
            drop(permit);
            // Read to its end: its connection goes back to the client's
            // pool, for the rest.
            drop(response);
            let ask = Ask {
                start: probe.at,
                end: Some(expected.size - 1),
                validator: Some(kept.clone()),
            };
            let head = tokio::select! {
                head = self.rest(address, &ask, expected.size, &mut policy) => head,
                () = &mut cancelled => {
                    probe.sink.close().await;
                    return Err(TransferError::Cancelled);
                }
            };
            match head {
                Ok(next) => {
                    (hop, response, permit, answered) = next;
                    end = expected.size;
                }
                Err(Rest::Failed(e)) => {
                    probe.sink.close().await;
                    return Err(*e);
                }
                Err(Rest::Refused(why)) => {
                    tracing::info!(%address, "{why}: fetching as one stream");
                    probe.sink.close().await;
                    return Ok(None);
                }
            }
        }
        let finished = probe
            .sink
            .finish()
            .await
            .map_err(|e| local_write(&paths.data, e))?;
        check_finished(&finished, Some(expected), expected.size).map_err(|e| fail(&hop, e))?;
        Ok(Some(Transfer {
            size: finished.len,
            sha256: finished.sha256,
            final_url: hop,
        }))
    }

    /// Asks for the rest of the file from `ask.start` on the connection the
    /// first share came on, and accepts only exactly that range under the
    /// same validator.
    async fn rest(
        &self,
        address: &Url,
        ask: &Ask,
        size: u64,
        policy: &mut tokio::sync::watch::Receiver<u64>,
    ) -> Result<
        (
            Url,
            crate::net::response::Response,
            crate::net::hosts::HostPermit,
            std::time::Duration,
        ),
        Rest,
    > {
        let head = self
            .response_head(address, Some(ask), size, policy, &mut Quiet)
            .await;
        let (hop, response, _, permit, answered) = match head {
            Ok(head) => head,
            Err(HeadError::Attempt(hop, e)) => {
                return Err(Rest::Failed(Box::new(attempt_error(address, &hop, e))))
            }
            Err(HeadError::RangeRefused(hop, why)) => {
                return Err(Rest::Refused(format!("{hop} refused the rest: {why}")))
            }
        };
        let status = response.status().as_u16();
        if status != 206 {
            return Err(Rest::Refused(format!(
                "{hop} answered {status} to the rest"
            )));
        }
        if validator(&response).as_deref() != ask.validator.as_deref() {
            return Err(Rest::Refused(format!("{hop} changed the file's validator")));
        }
        if response
            .content_length()
            .is_some_and(|n| n != size - ask.start)
        {
            return Err(Rest::Refused(format!(
                "{hop} announced another length for the rest"
            )));
        }
        Ok((hop, response, permit, answered))
    }
}

/// Why the rest was not accepted.
enum Rest {
    /// The try failed.
    Failed(Box<TransferError>),
    /// Not answered exactly: fetch again as one stream.
    Refused(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A piece of 64 KiB.
    static PIECE: [u8; 64 << 10] = [0; 64 << 10];

    /// A writer that keeps the stream waiting `takes` for each piece (a
    /// slow disk, a hash on a busy core).
    struct Writer {
        takes: Duration,
    }

    impl BodySink for Writer {
        async fn write(&mut self, _chunk: Bytes) -> std::io::Result<bool> {
            tokio::time::sleep(self.takes).await;
            Ok(true)
        }

        async fn checkpoint(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Pieces that arrive `apart` after the writer took the last one, into
    /// a writer that takes `takes` for each, for a second; whether the
    /// stream was handed to the parts.
    async fn handed(apart: Duration, takes: Duration) -> bool {
        let mut probe = Probe {
            sink: Writer { takes },
            window: Window::new(),
            split_below: 64 << 20,
            at: 0,
            slow: false,
        };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(apart).await;
            if !probe.write(Bytes::from_static(&PIECE)).await.unwrap() {
                return true;
            }
        }
        false
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_held_back_by_its_writer_is_not_handed_to_the_parts() {
        // 64 KiB every 10 ms (6.5 MB/s, far below 64 MiB/s) either way:
        // the connection brings a piece every 10 ms itself...
        assert!(handed(Duration::from_millis(10), Duration::ZERO).await);
        // ...or every 6 ms, and the writer keeps it 4 ms for each (the disk
        // or the hash sets the pace: more connections would not help).
        assert!(!handed(Duration::from_millis(6), Duration::from_millis(4)).await);
    }
}
