//! One response body read into its sink, chunk by chunk, under the
//! cancellation, the live policy, checkpoints, the stall timer, the size
//! limit, the progress floor and the bandwidth cap; and the final size and
//! SHA-256 check.

use tokio::sync::watch;
use tokio::time::Instant;
use url::Url;

use crate::error::AttemptError;
use crate::net::response::{BodyError, Response};
use crate::store::partial::{Checkpointer, PartialPaths};
use crate::transfer::fetch::{Expected, Fetcher, Reporter, TransferError};
use crate::transfer::sink::{BodySink, Finished, Sink, Target};

impl Fetcher {
    /// Reads the body into its sink until it ends (`Ok(None)`) or the try
    /// fails (`Ok(Some(failure))`, the sink still to be closed): the
    /// cancellation, the live policy, checkpoints, the stall timer, the
    /// size limit, the progress floor and the bandwidth cap. `Err` is a
    /// local failure.
    pub(super) async fn receive<C: std::future::Future<Output = ()>, S: BodySink>(
        &self,
        body: Body<'_, S>,
        mut cancelled: std::pin::Pin<&mut C>,
        policy: &mut watch::Receiver<u64>,
        reporter: &mut dyn Reporter,
        fail: &(dyn Fn(&Url, AttemptError) -> TransferError + Sync),
    ) -> Result<Option<TransferError>, TransferError> {
        let Body {
            hop,
            response,
            sink,
            sink_path,
            mut received,
            expected,
            limit,
        } = body;
        let mut window = (Instant::now(), received);
        let mut checkpoints = tokio::time::interval(crate::transfer::sink::CHECKPOINT_EVERY);
        checkpoints.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        checkpoints.reset();
        // The stall timer runs from the last byte, whatever else wakes the
        // loop.
        let mut stall_at = Instant::now() + self.stall;
        loop {
            let next = tokio::select! {
                biased;
                () = cancelled.as_mut() => return Ok(Some(TransferError::Cancelled)),
                Ok(()) = policy.changed() => {
                    match self.check_live(hop, response.dialled()) {
                        Ok(()) => continue,
                        Err(e) => return Ok(Some(fail(hop, e))),
                    }
                }
                _ = checkpoints.tick() => {
                    sink.checkpoint().await.map_err(|e| local_write(sink_path, e))?;
                    if sink.stopped() {
                        return Ok(None);
                    }
                    continue;
                }
                next = tokio::time::timeout_at(stall_at, response.chunk()) => next,
            };
            let chunk = match next {
                Err(_) => {
                    let reason = format!(
                        "stalled: no data for {}s after {}",
                        self.stall.as_secs_f64(),
                        crate::error::byte_count(received)
                    );
                    return Ok(Some(fail(hop, AttemptError::Network { reason })));
                }
                Ok(Err(e)) => {
                    return Ok(Some(fail(hop, body_error(&e, received, expected, limit))))
                }
                Ok(Ok(None)) => return Ok(None),
                Ok(Ok(Some(chunk))) => chunk,
            };
            stall_at = Instant::now() + self.stall;
            let len = chunk.len();
            received += len as u64;
            if received > limit {
                let detail = format!("received more than {}", crate::error::byte_count(limit));
                return Ok(Some(fail(hop, size_error(expected, limit, detail))));
            }
            let more = sink
                .write(chunk)
                .await
                .map_err(|e| local_write(sink_path, e))?;
            reporter.bytes(received);
            if let Err(reason) = self.check_progress(&mut window, received) {
                return Ok(Some(fail(hop, AttemptError::Network { reason })));
            }
            if self.throttle.is_limited() {
                tokio::select! {
                    () = self.throttle.take(len) => {}
                    () = cancelled.as_mut() => return Ok(Some(TransferError::Cancelled)),
                }
            }
            if !more {
                return Ok(None);
            }
        }
    }

    /// The minimum-progress rule: fewer than `network.min_bytes_per_min`
    /// bytes in a window of [`PROGRESS_WINDOW`] abandons the transfer, so a
    /// server dripping a byte just under the stall timeout cannot hold a
    /// download slot forever. A transfer that keeps moving faster than the
    /// floor is never cut, however long it takes.
    fn check_progress(&self, window: &mut (Instant, u64), received: u64) -> Result<(), String> {
        let (since, at_start) = *window;
        if since.elapsed() < self.progress_window {
            return Ok(());
        }
        let moved = received - at_start;
        if self.min_per_minute > 0 && moved < self.min_per_minute {
            return Err(format!(
                "too slow: {moved} bytes in the last minute (minimum {} bytes per minute)",
                self.min_per_minute
            ));
        }
        *window = (Instant::now(), received);
        Ok(())
    }
}

/// One response body being read into its sink ([`Fetcher::receive`]).
pub(super) struct Body<'a, S> {
    /// The hop that answered.
    pub hop: &'a Url,
    /// Its response.
    pub response: &'a mut Response,
    /// Where the bytes go.
    pub sink: &'a mut S,
    /// The partial file, for error messages (empty when discarding).
    pub sink_path: &'a std::path::Path,
    /// Where the body starts in the file (the resumed offset, or a part's
    /// start).
    pub received: u64,
    /// What the bytes must be.
    pub expected: Option<Expected<'a>>,
    /// The byte the body must not run past (the file's size, or a part's
    /// end).
    pub limit: u64,
}

/// Why a response's announced length cannot be the rest of the file
/// after `offset`, if it cannot.
pub(super) fn announced_mismatch(
    response: &Response,
    expected: Option<Expected<'_>>,
    limit: u64,
    offset: u64,
) -> Option<String> {
    let announced = response.content_length()?;
    let rest = limit - offset;
    let exact = expected.is_some() || offset > 0;
    if announced <= rest && !(exact && announced != rest) {
        return None;
    }
    let detail = format!(
        "the server announced {}",
        crate::error::byte_count(announced)
    );
    Some(match offset {
        0 => detail,
        _ => format!("{detail} for the rest after byte {offset}"),
    })
}

/// A sink writing to the partial file from `offset`, its records naming
/// `address` and `validator`. The file is opened where it is first written
/// (see [`Target::paths`]), not in a trip of its own.
pub(super) fn partial_sink(
    paths: &PartialPaths,
    address: &Url,
    offset: u64,
    validator: Option<String>,
) -> Sink {
    Sink::to_file(Target {
        paths: paths.clone(),
        offset,
        checkpoints: Checkpointer::new(paths, address.as_str(), validator),
    })
}

/// A write of the partial file at `path` failed: `E_RESOURCE_DISK_SPACE`
/// (with what was still needed and what is free) when the disk is full,
/// `E_RESOURCE_IO` otherwise.
pub(super) fn local_write(path: &std::path::Path, e: std::io::Error) -> TransferError {
    TransferError::Local(crate::store::partial_write_failed(
        "cannot write download",
        path,
        e,
    ))
}

/// The final check of a finished file: its size, then its SHA-256.
pub(super) fn check_finished(
    finished: &Finished,
    expected: Option<Expected<'_>>,
    limit: u64,
) -> Result<(), AttemptError> {
    let Some(e) = expected else {
        return Ok(());
    };
    if finished.len != e.size {
        let detail = format!("received only {}", crate::error::byte_count(finished.len));
        return Err(size_error(expected, limit, detail));
    }
    if finished.sha256 != e.sha256 {
        return Err(AttemptError::Sha256 {
            expected: e.sha256.to_string(),
            actual: finished.sha256.clone(),
        });
    }
    Ok(())
}

pub(super) fn size_error(
    expected: Option<Expected<'_>>,
    limit: u64,
    detail: String,
) -> AttemptError {
    match expected {
        Some(e) => AttemptError::Size {
            expected: e.size,
            detail,
        },
        None => AttemptError::Size {
            expected: limit,
            detail: format!("{detail} (auto-fill limit)"),
        },
    }
}

/// A body that broke off. A reset or timeout is the network's fault, and
/// so is a TLS stream that ends without `close_notify` (the TLS layer's
/// `UnexpectedEof`): the connection was cut under it, as a proxy shows an
/// origin's reset (it can only close its side of the tunnel). A connection
/// the server closed properly (TLS `close_notify`) before the announced
/// length (HTTP's own `UnexpectedEof`, "end of file before message length
/// reached") is the server sending too few bytes.
pub(super) fn body_error(
    e: &BodyError,
    received: u64,
    expected: Option<Expected<'_>>,
    limit: u64,
) -> AttemptError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            let cut = match io.kind() {
                ConnectionReset | ConnectionAborted | BrokenPipe | TimedOut => true,
                UnexpectedEof => without_close_notify(io),
                _ => false,
            };
            if cut {
                let why = crate::net::reason::network_reason(e, "");
                return AttemptError::Network {
                    reason: format!("{why} after {}", crate::error::byte_count(received)),
                };
            }
        }
        source = s.source();
    }
    let detail = format!(
        "the connection closed after {} ({})",
        crate::error::byte_count(received),
        crate::net::reason::network_reason(e, "")
    );
    size_error(expected, limit, detail)
}

/// Whether an `UnexpectedEof` is the TLS layer's: the peer closed the
/// connection without `close_notify` (rustls says so in its message; the
/// HTTP layer's short body says "end of file before message length
/// reached").
fn without_close_notify(io: &std::io::Error) -> bool {
    io.get_ref()
        .is_some_and(|inner| inner.to_string().contains("close_notify"))
}

/// A failure of the try of `address`, at `hop` when a redirect led there.
pub(super) fn attempt_error(address: &Url, hop: &Url, error: AttemptError) -> TransferError {
    TransferError::Attempt(crate::error::Attempt {
        address: address.clone(),
        hop: (hop != address).then(|| hop.clone()),
        error,
    })
}

/// Resolves once `cancel` is cancelled; never without one.
pub(super) async fn until_cancelled(cancel: Option<&tokio_util::sync::CancellationToken>) {
    match cancel {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::time::Duration;

    fn fetcher(min_per_minute: u64) -> Fetcher {
        let mut config = Config::default();
        config.network.min_bytes_per_min = min_per_minute;
        Fetcher::new(&config).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_transfer_below_the_progress_floor_is_abandoned_after_a_minute() {
        let f = fetcher(64 << 10);
        let mut window = (Instant::now(), 0);
        // A byte every 29 seconds stays under any stall timeout of 30 s...
        let mut received = 0;
        for _ in 0..2 {
            tokio::time::advance(Duration::from_secs(29)).await;
            received += 1;
            assert!(f.check_progress(&mut window, received).is_ok());
        }
        tokio::time::advance(Duration::from_secs(29)).await;
        received += 1;
        // ...but not the floor, once a minute has passed.
        let reason = f.check_progress(&mut window, received).unwrap_err();
        assert!(reason.contains("too slow"), "{reason}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_but_steady_transfer_is_never_cut() {
        let f = fetcher(64 << 10);
        let mut window = (Instant::now(), 0);
        let mut received = 0;
        // 2 KiB a second (120 KiB a minute) for an hour.
        for _ in 0..3600 {
            tokio::time::advance(Duration::from_secs(1)).await;
            received += 2048;
            assert!(f.check_progress(&mut window, received).is_ok());
        }
    }

    #[test]
    fn only_the_tls_layers_early_end_is_a_cut_connection() {
        let tls = std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "peer closed connection without sending TLS close_notify",
        );
        assert!(without_close_notify(&tls));
        let http = std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "end of file before message length reached",
        );
        assert!(!without_close_notify(&http));
        assert!(!without_close_notify(
            &std::io::ErrorKind::UnexpectedEof.into()
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_floor_disables_the_rule() {
        let f = fetcher(0);
        let mut window = (Instant::now(), 0);
        tokio::time::advance(Duration::from_secs(600)).await;
        assert!(f.check_progress(&mut window, 1).is_ok());
    }
}
