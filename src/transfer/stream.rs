//! One try of one address: the response head accepted, then its body as
//! one stream into the sink, or, for a large file whose server answers
//! ranges exactly, in parts.

use tokio_util::sync::CancellationToken;
use url::Url;

use crate::error::{Attempt, AttemptError};
use crate::net::response::Response;
use crate::store::partial::PartialPaths;
use crate::transfer::body::{
    announced_mismatch, attempt_error, check_finished, local_write, partial_sink, size_error,
    until_cancelled, Body,
};
use crate::transfer::exchange::{validator, Ask, HeadError};
use crate::transfer::fetch::{
    Control, Expected, Fetcher, Output, Reporter, Resume, Transfer, TransferError,
};
use crate::transfer::parts::{first_share_end, FirstPart, PARTS_MIN_BYTES};
use crate::transfer::sink::Sink;

/// One try of one address, as [`Fetcher::transfer`] runs it.
pub(super) struct Try<'a> {
    /// The address (url or mirror).
    pub address: &'a Url,
    /// What the bytes must be.
    pub expected: Option<Expected<'a>>,
    /// The most bytes the file may have.
    pub limit: u64,
    /// The partial file, unless the bytes are only hashed.
    pub paths: Option<&'a PartialPaths>,
    /// Kept bytes of this address to continue.
    pub resume: Option<Resume>,
    /// Whether the file may be fetched in parts.
    pub parts: bool,
    /// Other sources the parts may come from at once.
    pub also: &'a [Url],
}

impl Fetcher {
    /// Fetches one address (following redirects) into `output`, counting
    /// and hashing as bytes arrive. With `expected`, the size and digest
    /// must match; without, at most `max` bytes are read.
    ///
    /// A large file whose server answers the first request's `Range`
    /// exactly is fetched in parts ([`crate::transfer::parts`]); when a
    /// part is refused, the file is fetched once more as one stream, from
    /// the end of the prefix kept from this address (from zero when there
    /// is none, or the server ignores that range).
    pub(crate) async fn transfer(
        &self,
        address: &Url,
        expected: Option<Expected<'_>>,
        max: u64,
        output: Output<'_>,
        control: Control<'_>,
    ) -> Result<Transfer, TransferError> {
        let Control { cancel, reporter } = control;
        let (paths, resume, also) = match output {
            Output::Discard => (None, None, &[][..]),
            Output::Partial {
                paths,
                resume,
                also,
            } => (Some(paths), resume, also),
        };
        let limit = expected.map_or(max, |e| e.size);
        let parts = paths.is_some() && self.parts_for(expected);
        let first = Try {
            address,
            expected,
            limit,
            paths,
            resume,
            parts,
            also,
        };
        if let Some(done) = self.transfer_once(first, cancel, &mut *reporter).await? {
            return Ok(done);
        }
        // The prefix kept before the first gap came from this address
        // under its validator: one stream continues from it (as `curl -C -`
        // would), and starts over only if the server ignores that range.
        let mut resume = None;
        if let Some(paths) = paths {
            let paths = paths.clone();
            let from = address.to_string();
            resume = tokio::task::spawn_blocking(move || {
                let prefix = paths.kept().and_then(|(meta, _)| {
                    let validator = meta.validator.filter(|_| meta.address == from)?;
                    (meta.durable > 0).then_some(Resume {
                        offset: meta.durable,
                        validator,
                        ranges: Vec::new(),
                    })
                });
                if prefix.is_none() {
                    paths.remove();
                }
                prefix
            })
            .await
            .ok()
            .flatten();
        }
        if let Some(prefix) = &resume {
            tracing::debug!(%address, offset = prefix.offset, "one stream continues from the prefix kept");
        }
        let again = Try {
            address,
            expected,
            limit,
            paths,
            resume,
            parts: false,
            also: &[],
        };
        let done = self.transfer_once(again, cancel, reporter).await?;
        done.ok_or_else(|| {
            TransferError::Attempt(Attempt {
                address: address.clone(),
                hop: None,
                error: AttemptError::Network {
                    reason: "the server refused a ranged part".into(),
                },
            })
        })
    }

    /// One try: the response head, then the body as one stream or in
    /// parts. `Ok(None)`: a part was refused, fetch again as one stream.
    async fn transfer_once(
        &self,
        t: Try<'_>,
        cancel: Option<&CancellationToken>,
        reporter: &mut dyn Reporter,
    ) -> Result<Option<Transfer>, TransferError> {
        let Try {
            address,
            expected,
            limit,
            paths,
            mut resume,
            mut parts,
            also,
        } = t;
        let fail = |hop: &Url, error: AttemptError| attempt_error(address, hop, error);
        let cancelled = until_cancelled(cancel);
        tokio::pin!(cancelled);
        // Taken before the first hop is checked: a change from here on is
        // seen, whatever the transfer is waiting for.
        let mut policy_changes = self.policy_version.subscribe();
        let mut ask = first_ask(resume.as_ref(), parts.then_some(self.parts), limit);
        let (hop, mut response, offset, host_permit, answered) = loop {
            let head = tokio::select! {
                head = self.response_head(address, ask.as_ref(), limit, &mut policy_changes, &mut *reporter) => head,
                () = &mut cancelled => return Err(TransferError::Cancelled),
            };
            match head {
                Ok(head) => break head,
                Err(HeadError::Attempt(hop, error)) => return Err(fail(&hop, error)),
                Err(HeadError::RangeRefused(hop, why)) => {
                    tracing::debug!(%hop, "range refused: {why}");
                    resume = after_refused_range(ask.as_ref(), resume, paths).await;
                    // One stream from what is kept, if anything is.
                    parts = false;
                    ask = first_ask(resume.as_ref(), None, limit);
                }
            }
        };
        let (end, ranges) = extent(&response, ask.as_ref(), resume.as_ref(), limit);
        if let Some(detail) = announced_mismatch(&response, expected, end, offset) {
            return Err(fail(&hop, size_error(expected, limit, detail)));
        }
        let present = ranges.iter().fold(offset, |n, [s, e]| n + (e - s));
        if present > 0 {
            reporter.resumed(present);
        }
        if let (None, Some(announced)) = (expected, response.content_length()) {
            reporter.length(offset.saturating_add(announced));
        }
        let kept_validator = match (offset, &resume) {
            (1.., Some(r)) => Some(r.validator.clone()),
            _ => validator(&response),
        };
        if let (true, Some(paths), Some(e), Some(v)) = (parts, paths, expected, &kept_validator) {
            let large = limit - offset >= PARTS_MIN_BYTES || end < limit;
            if response.status().as_u16() == 206 && large {
                let far = self.is_far(answered);
                let first = FirstPart {
                    hop,
                    response,
                    permit: host_permit,
                    answered,
                    offset,
                    end,
                    ranges,
                    validator: v.clone(),
                    policy: policy_changes.clone(),
                    also: also.to_vec(),
                    handed: None,
                };
                // A near server, one source and nothing kept beyond the
                // prefix: one stream that carries on while it is fast.
                if !far && also.is_empty() && first.ranges.is_empty() {
                    return self
                        .carry_on(address, e, paths, first, cancel, reporter)
                        .await;
                }
                return self.parts(address, e, paths, first, cancel, reporter).await;
            }
        }
        if response.status().as_u16() == 206 && end < limit {
            // Ranges, but none to fetch in parts (no validator to hold them
            // to one file): one stream of the whole file instead.
            tracing::debug!(%hop, "ranges without a validator: fetching as one stream");
            return Ok(None);
        }
        let mut sink = match paths {
            None => Sink::hash_only(),
            Some(paths) => partial_sink(paths, address, offset, kept_validator),
        };
        let sink_path = paths.map(|p| p.data.clone()).unwrap_or_default();
        let body = Body {
            hop: &hop,
            response: &mut response,
            sink: &mut sink,
            sink_path: &sink_path,
            received: offset,
            expected,
            limit,
        };
        // Every way out before `finish` closes the sink first, so the kept
        // bytes are flushed and recorded before anyone looks at them.
        let failure = self
            .receive(
                body,
                cancelled.as_mut(),
                &mut policy_changes,
                reporter,
                &fail,
            )
            .await?;
        if let Some(failure) = failure {
            sink.close().await;
            return Err(failure);
        }
        let finished = sink
            .finish()
            .await
            .map_err(|e| local_write(&sink_path, e))?;
        check_finished(&finished, expected, limit).map_err(|e| fail(&hop, e))?;
        Ok(Some(Transfer {
            size: finished.len,
            sha256: finished.sha256,
            final_url: hop,
        }))
    }
}

/// What the first request of a try asks for: the rest after kept bytes,
/// or, for a fresh file of `limit` bytes that may come in up to `parts`
/// parts, its first share as a range (the probe of whether its server
/// answers ranges exactly, and a request that is not cut short when the
/// file is split); nothing otherwise.
fn first_ask(resume: Option<&Resume>, parts: Option<usize>, limit: u64) -> Option<Ask> {
    match (resume, parts) {
        (Some(r), parts) => Some(Ask::resume(r, parts.is_some())),
        (None, Some(parts)) => Some(Ask {
            start: 0,
            end: Some(first_share_end(limit, parts) - 1),
            validator: None,
        }),
        (None, None) => None,
    }
}

/// What a try continues from once the server refused the range `ask`
/// asked for: after a closed range, the prefix kept (some servers answer
/// only `bytes=S-`), continued as one stream as `curl -C -` would, before
/// anything is thrown away; otherwise nothing (the kept bytes are removed,
/// and the file starts afresh).
async fn after_refused_range(
    ask: Option<&Ask>,
    resume: Option<Resume>,
    paths: Option<&PartialPaths>,
) -> Option<Resume> {
    let closed = ask.is_some_and(|a| a.end.is_some());
    if let Some(kept) = resume.filter(|r| closed && r.offset > 0) {
        tracing::debug!(
            offset = kept.offset,
            "continuing the prefix kept as one stream"
        );
        return Some(Resume {
            ranges: Vec::new(),
            ..kept
        });
    }
    tracing::debug!("starting from zero");
    if let Some(paths) = paths {
        let paths = paths.clone();
        let _ = tokio::task::spawn_blocking(move || paths.remove()).await;
    }
    None
}

/// Where an accepted response's body ends (a `206` ends where it was asked
/// to: a kept range may follow), and the kept ranges of `resume` beyond it
/// (none when the body runs to the end of the file).
fn extent(
    response: &Response,
    ask: Option<&Ask>,
    resume: Option<&Resume>,
    limit: u64,
) -> (u64, Vec<[u64; 2]>) {
    let end = match (response.status().as_u16(), ask.and_then(|a| a.end)) {
        (206, Some(last)) => last + 1,
        _ => limit,
    };
    let ranges = match (end < limit, resume) {
        (true, Some(r)) => r.ranges.clone(),
        _ => Vec::new(),
    };
    (end, ranges)
}
