//! The writer of a file fetched in ranged parts: one thread that writes
//! each batch at its offset and keeps one SHA-256 over the whole file.
//!
//! The hash follows the contiguous prefix: a batch that continues it is
//! hashed from memory as it is written; one that arrives ahead of it is
//! written and remembered as a written range, and read back (from the page
//! cache) once the prefix reaches it. Verification so needs no second pass
//! over the file, and memory stays bounded whatever its size: the channel's
//! batches, one read-back buffer and a list of written ranges (merged, so
//! about one per part).
//!
//! What is written is recorded as durable (flushed, then recorded next to
//! the partial file): the hashed prefix and the ranges written ahead of it.
//! After a crash the next run starts the writer with the kept prefix and
//! ranges: the prefix is hashed again first, the ranges are remembered as
//! written ahead (read back and hashed when the prefix reaches them, like
//! any other), and only the missing ranges are asked for. Nothing kept is
//! trusted without being hashed in order with the rest.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use crate::store::partial::Checkpointer;
use crate::transfer::sink::{Finished, Records, Written, CHECKPOINT_BYTES, REHASH_BUFFER};
use crate::transfer::write_back::{WriteBack, WRITE_BACK_BYTES};

/// Batches in flight between all the parts and the writer thread.
pub(super) const SCATTER_CHUNKS: usize = 16;

enum Msg {
    /// Chunks that follow each other in the file, from this offset.
    At(u64, Vec<Bytes>),
    /// Flush and record the contiguous prefix, if it grew.
    Checkpoint,
    /// The transfer ends early: flush and record the prefix, then answer.
    Close(oneshot::Sender<()>),
    /// Flush, and answer with the length of the prefix and its digest.
    Finish(oneshot::Sender<io::Result<Finished>>),
}

/// The sending side of the writer thread; cloned for every part.
#[derive(Clone)]
pub(super) struct Scatter {
    tx: mpsc::Sender<Msg>,
    /// The writer's own error once it stopped on one, so that every part
    /// reports what stopped it (a full disk is `E_RESOURCE_DISK_SPACE`),
    /// not only that it stopped.
    failure: Arc<OnceLock<Failure>>,
}

/// What of an [`io::Error`] a part needs to report it again.
#[derive(Debug)]
struct Failure {
    kind: io::ErrorKind,
    raw: Option<i32>,
    text: String,
}

impl Failure {
    fn of(e: &io::Error) -> Failure {
        Failure {
            kind: e.kind(),
            raw: e.raw_os_error(),
            text: e.to_string(),
        }
    }

    fn error(&self) -> io::Error {
        match self.raw {
            Some(raw) => io::Error::from_raw_os_error(raw),
            None => io::Error::new(self.kind, self.text.clone()),
        }
    }
}

/// Waits for the writer's end.
pub(super) struct ScatterThread {
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
}

/// Starts the writer over `file`, whose kept bytes are `kept` (its prefix
/// is hashed again first, its ranges when the prefix reaches them); the
/// record names the address and validator.
pub(super) fn start(
    file: File,
    kept: Written,
    hashed: Option<Sha256>,
    checkpoints: Checkpointer,
) -> io::Result<(Scatter, ScatterThread)> {
    let (tx, mut rx) = mpsc::channel(SCATTER_CHUNKS);
    let failure = Arc::new(OnceLock::new());
    let failed = Arc::clone(&failure);
    let thread = std::thread::Builder::new()
        .name("gem-resources-writer".into())
        .spawn(move || {
            let result = run(file, kept, hashed, checkpoints, &mut rx);
            if let Err(e) = &result {
                let _ = failed.set(Failure::of(e));
            }
            // Only now do the parts' sends fail: the error is there to read.
            drop(rx);
            result
        })?;
    Ok((
        Scatter { tx, failure },
        ScatterThread {
            thread: Some(thread),
        },
    ))
}

impl Scatter {
    /// Hands over chunks that start at `offset`.
    pub(super) async fn write_at(&self, offset: u64, batch: Vec<Bytes>) -> io::Result<()> {
        self.send(Msg::At(offset, batch)).await
    }

    /// Asks for the prefix to be recorded (without waiting).
    pub(super) async fn checkpoint(&self) -> io::Result<()> {
        self.send(Msg::Checkpoint).await
    }

    /// Ends early: waits until the prefix is flushed and recorded.
    pub(super) async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(Msg::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Flushes everything; the prefix's length and digest.
    pub(super) async fn finish(&self) -> io::Result<Finished> {
        let (tx, rx) = oneshot::channel();
        self.send(Msg::Finish(tx)).await?;
        rx.await.unwrap_or_else(|_| Err(self.stopped()))
    }

    async fn send(&self, msg: Msg) -> io::Result<()> {
        self.tx.send(msg).await.map_err(|_| self.stopped())
    }

    /// Why the writer stopped: its own error when it had one.
    fn stopped(&self) -> io::Error {
        self.failure
            .get()
            .map_or_else(|| io::Error::other("the writer stopped"), Failure::error)
    }
}

impl ScatterThread {
    /// The writer's own error, once every sender is gone.
    pub(super) async fn join(mut self) -> io::Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || {
            thread
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the writer panicked")))
        })
        .await
        .map_err(io::Error::other)?
    }
}

/// The writer thread's state.
struct Writer {
    file: File,
    hasher: Sha256,
    /// Bytes hashed: the contiguous prefix written.
    hashed: u64,
    /// Ranges written ahead of the prefix: start → end.
    ahead: BTreeMap<u64, u64>,
    /// Each part's run of writes: where it ends → where its bytes not yet
    /// handed to the kernel's write-back start.
    runs: HashMap<u64, u64>,
    /// Asks for each run's windows to be written back.
    write_back: WriteBack,
    /// The records of the durable prefix and ranges.
    records: Records,
    /// Bytes written in all (kept ones included): the prefix and `ahead`.
    written: u64,
    buf: Vec<u8>,
}

fn run(
    file: File,
    kept: Written,
    hashed: Option<Sha256>,
    mut checkpoints: Checkpointer,
    rx: &mut mpsc::Receiver<Msg>,
) -> io::Result<()> {
    let total = kept.bytes();
    if total == 0 {
        // Nothing kept: any earlier record no longer holds, and this one is
        // there to be rewritten should the disk fill before a checkpoint.
        checkpoints.reserve()?;
    }
    // A prefix whose hash is handed over must be in the file as it was
    // written: never filled in by the cut below.
    if hashed.is_some() && file.metadata()?.len() < kept.prefix {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the partial file is shorter than what was written",
        ));
    }
    // Bytes past the trusted ones are not trusted: cut them.
    let end = kept.ranges.last().map_or(kept.prefix, |r| r[1]);
    file.set_len(end)?;
    let mut w = Writer {
        file,
        hasher: Sha256::new(),
        hashed: 0,
        ahead: BTreeMap::new(),
        runs: HashMap::new(),
        write_back: WriteBack::new(),
        records: Records::new(checkpoints, total),
        written: total,
        buf: vec![0u8; REHASH_BUFFER],
    };
    match hashed {
        // The prefix was hashed as it was written (one stream before the
        // parts, `carry`): it is not read back.
        Some(hasher) => {
            w.hasher = hasher;
            w.hashed = kept.prefix;
        }
        None => {
            w.ahead.insert(0, kept.prefix);
        }
    }
    for [s, e] in kept.ranges {
        w.remember(s, e);
    }
    w.catch_up()?;
    while let Some(msg) = rx.blocking_recv() {
        match msg {
            Msg::At(at, batch) => {
                if let Err(e) = w.write(at, &batch) {
                    // A full disk: what is written before this batch stays
                    // durable and recorded, for a resume once there is room.
                    if let Err(k) = w.keep() {
                        tracing::warn!("cannot keep the partial download: {k}");
                    }
                    return Err(e);
                }
            }
            Msg::Checkpoint => {
                let written = w.written_now();
                w.records.checkpoint_written(&w.file, written);
            }
            Msg::Close(reply) => {
                if let Err(e) = w.keep() {
                    tracing::warn!("cannot keep the partial download: {e}");
                }
                let _ = reply.send(());
                return Ok(());
            }
            Msg::Finish(reply) => {
                let _ = reply.send(w.finish());
                return Ok(());
            }
        }
    }
    w.keep()
}

impl Writer {
    fn write(&mut self, at: u64, batch: &[Bytes]) -> io::Result<()> {
        self.file.seek(SeekFrom::Start(at))?;
        let mut end = at;
        for chunk in batch {
            self.file.write_all(chunk)?;
            end += chunk.len() as u64;
        }
        self.write_back(at, end);
        self.written += end - at;
        if at == self.hashed {
            for chunk in batch {
                self.hasher.update(chunk);
            }
            self.hashed = end;
        } else {
            self.remember(at, end);
        }
        self.catch_up()?;
        if self.written - self.records.requested() >= CHECKPOINT_BYTES {
            let written = self.written_now();
            self.records.checkpoint_written(&self.file, written);
        }
        Ok(())
    }

    /// What is written now: the hashed prefix and the ranges ahead of it.
    fn written_now(&self) -> Written {
        Written {
            prefix: self.hashed,
            ranges: self.ahead.iter().map(|(&s, &e)| [s, e]).collect(),
        }
    }

    /// Starts the kernel's write-back of a part's run once it holds
    /// [`WRITE_BACK_BYTES`], as a single stream does, so the final flush has
    /// little left to do.
    fn write_back(&mut self, at: u64, end: u64) {
        let from = self.runs.remove(&at).unwrap_or(at);
        if end - from >= WRITE_BACK_BYTES {
            self.write_back.start(&self.file, from, end - from);
            self.runs.insert(end, end);
        } else {
            self.runs.insert(end, from);
        }
    }

    /// Notes `[start, end)` as written ahead of the prefix, merged with its
    /// neighbours.
    fn remember(&mut self, mut start: u64, mut end: u64) {
        if let Some((&s, &e)) = self.ahead.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
            }
        }
        while let Some((&s, &e)) = self.ahead.range(start..).next() {
            if s > end {
                break;
            }
            self.ahead.remove(&s);
            end = end.max(e);
        }
        self.ahead.insert(start, end);
    }

    /// Hashes the ranges written ahead that the prefix has reached, reading
    /// them back.
    fn catch_up(&mut self) -> io::Result<()> {
        while let Some((&s, &e)) = self.ahead.first_key_value() {
            if s > self.hashed {
                break;
            }
            self.ahead.remove(&s);
            if e <= self.hashed {
                continue;
            }
            self.file.seek(SeekFrom::Start(self.hashed))?;
            let mut left = e - self.hashed;
            while left > 0 {
                let want = left.min(self.buf.len() as u64) as usize;
                let n = self.file.read(&mut self.buf[..want])?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the partial file is shorter than what was written",
                    ));
                }
                self.hasher.update(&self.buf[..n]);
                left -= n as u64;
            }
            self.hashed = e;
        }
        Ok(())
    }

    /// Stopped early: keeps the prefix and the ranges for resume when they
    /// can be resumed.
    fn keep(&mut self) -> io::Result<()> {
        let written = self.written_now();
        self.records.keep_written(&self.file, written)
    }

    fn finish(&mut self) -> io::Result<Finished> {
        // No record may be written after this: the file is about to leave.
        self.records.stop()?;
        if !self.ahead.is_empty() {
            return Err(io::Error::other("a gap is left between the parts"));
        }
        // Not flushed here: a verified file is flushed as it is published
        // (`Store::publish`), one that failed its check never is.
        let digest = std::mem::take(&mut self.hasher).finalize();
        Ok(Finished {
            len: self.hashed,
            sha256: hex::encode(digest),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::partial::PartialPaths;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parts_written_out_of_order_hash_as_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let body: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let paths = PartialPaths::new(dir.path(), &"a".repeat(64), body.len() as u64);
        let file = paths.open_data().unwrap();
        let checkpoints = Checkpointer::new(&paths, "https://cdn.test/a", Some("\"v\"".into()));
        let (scatter, thread) = start(file, Written::default(), None, checkpoints).unwrap();
        // Three parts, the last first, each in two batches.
        for (s, e) in [
            (2_000_000, 3_000_000),
            (1_000_000, 2_000_000),
            (0, 1_000_000),
        ] {
            let mid = (s + e) / 2;
            for (a, b) in [(s, mid), (mid, e)] {
                let batch = vec![Bytes::copy_from_slice(&body[a..b])];
                scatter.write_at(a as u64, batch).await.unwrap();
            }
        }
        let finished = scatter.finish().await.unwrap();
        drop(scatter);
        thread.join().await.unwrap();
        assert_eq!(finished.len, body.len() as u64);
        assert_eq!(finished.sha256, hex::encode(Sha256::digest(&body)));
        assert_eq!(std::fs::read(&paths.data).unwrap(), body);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handed_hash_of_the_prefix_is_continued_and_a_short_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let body: Vec<u8> = (0..2_000_000u32).map(|i| (i * 13 % 251) as u8).collect();
        let (cut, size) = (700_000, body.len() as u64);
        let paths = PartialPaths::new(dir.path(), &"c".repeat(64), size);
        std::fs::write(&paths.data, &body[..cut]).unwrap();
        let file = paths.open_data().unwrap();
        let checkpoints = Checkpointer::new(&paths, "https://cdn.test/c", Some("\"v\"".into()));
        let mut hasher = Sha256::new();
        hasher.update(&body[..cut]);
        let prefix = Written::prefix(cut as u64);
        let (scatter, thread) = start(file, prefix, Some(hasher), checkpoints).unwrap();
        let rest = vec![Bytes::copy_from_slice(&body[cut..])];
        scatter.write_at(cut as u64, rest).await.unwrap();
        let finished = scatter.finish().await.unwrap();
        drop(scatter);
        thread.join().await.unwrap();
        assert_eq!(finished.len, size);
        assert_eq!(finished.sha256, hex::encode(Sha256::digest(&body)));
        assert_eq!(std::fs::read(&paths.data).unwrap(), body);
        // Shorter than the prefix the hash stands for: refused, not filled
        // in with zeros that the hash would vouch for.
        let short = PartialPaths::new(dir.path(), &"d".repeat(64), size);
        std::fs::write(&short.data, &body[..100]).unwrap();
        let file = short.open_data().unwrap();
        let checkpoints = Checkpointer::new(&short, "https://cdn.test/d", Some("\"v\"".into()));
        let prefix = Written::prefix(cut as u64);
        let (scatter, thread) = start(file, prefix, Some(Sha256::new()), checkpoints).unwrap();
        assert!(scatter.finish().await.is_err());
        drop(scatter);
        assert!(thread.join().await.is_err());
        assert_eq!(std::fs::metadata(&short.data).unwrap().len(), 100);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kept_ranges_are_read_back_and_recorded_with_the_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let body: Vec<u8> = (0..3_000_000u32).map(|i| (i * 11 % 253) as u8).collect();
        let paths = PartialPaths::new(dir.path(), &"b".repeat(64), body.len() as u64);
        // Kept: the first 500,000 bytes and [2,000,000, 2,500,000).
        let mut kept = body.clone();
        kept[500_000..2_000_000].fill(0);
        kept.truncate(2_600_000);
        std::fs::write(&paths.data, &kept).unwrap();
        let file = paths.open_data().unwrap();
        let checkpoints = Checkpointer::new(&paths, "https://cdn.test/b", Some("\"v\"".into()));
        let written = Written {
            prefix: 500_000,
            ranges: vec![[2_000_000, 2_500_000]],
        };
        let (scatter, thread) = start(file, written, None, checkpoints).unwrap();
        for (a, b) in [(2_500_000, 3_000_000), (1_000_000, 2_000_000)] {
            let batch = vec![Bytes::copy_from_slice(&body[a..b])];
            scatter.write_at(a as u64, batch).await.unwrap();
        }
        scatter.close().await;
        drop(scatter);
        thread.join().await.unwrap();
        let (meta, _) = paths.kept().unwrap();
        assert_eq!(meta.durable, 500_000);
        assert_eq!(meta.ranges, vec![[1_000_000, 3_000_000]]);
        // The missing range, and the whole file hashes right.
        let file = paths.open_data().unwrap();
        let checkpoints = Checkpointer::new(&paths, "https://cdn.test/b", Some("\"v\"".into()));
        let written = Written {
            prefix: meta.durable,
            ranges: meta.ranges,
        };
        let (scatter, thread) = start(file, written, None, checkpoints).unwrap();
        let batch = vec![Bytes::copy_from_slice(&body[500_000..1_000_000])];
        scatter.write_at(500_000, batch).await.unwrap();
        let finished = scatter.finish().await.unwrap();
        drop(scatter);
        thread.join().await.unwrap();
        assert_eq!(finished.sha256, hex::encode(Sha256::digest(&body)));
    }
}
