//! Where a transfer's bytes go: a writer thread that hashes and writes.
//!
//! The network side (TLS decryption, on the async runtime) hands each chunk
//! over a bounded channel to one writer per transfer, which updates the
//! SHA-256 and writes with plain `std::fs` calls. It holds one of the
//! runtime's blocking threads for the whole transfer (no write is a trip of
//! its own, and the thread stays for the next transfer: none is made per
//! file). Decryption and hashing so run on different cores, and the bounded
//! channel keeps memory constant: a slow disk slows the reads instead of
//! filling memory.
//!
//! Durability is spread over the transfer instead of piling up at the end:
//! every [`WRITE_BACK_BYTES`] the thread asks the kernel to start writing the
//! last window back (`sync_file_range`, from a thread beside it:
//! [`crate::transfer::write_back`]), and every [`CHECKPOINT_BYTES`] or
//! [`CHECKPOINT_EVERY`] it flushes the file (`fdatasync`) and records the
//! flushed length next to the partial file ([`crate::store::partial`]). After a
//! crash only that flushed prefix is trusted. When the transfer ends early
//! (an error, a cancellation, the sender dropped), the thread flushes once
//! more and records the length, so an interruption keeps every byte.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use crate::store::partial::{Checkpointer, PartialPaths};
use crate::transfer::write_back::{WriteBack, WRITE_BACK_BYTES};

/// Batches in flight between the network and the writer thread (each about
/// [`BATCH_BYTES`]), which bounds the memory of one transfer.
const CHANNEL_CHUNKS: usize = 8;

/// Flush and record the durable length at least every this many bytes.
/// Each flush waits for the disk, so on a fast link they are rare: the
/// early write-back already keeps the disk busy.
pub const CHECKPOINT_BYTES: u64 = 512 << 20;

/// ... and at least this often (the network side asks), so a slow link or
/// a silent server loses at most this much progress to a crash.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

/// Chunks are handed over in batches of about this many bytes: one wake-up
/// of the writer per batch instead of one per TLS record.
pub(super) const BATCH_BYTES: usize = 256 << 10;

/// Buffer for re-reading a kept prefix to rebuild the hash.
pub(super) const REHASH_BUFFER: usize = 1 << 20;

enum Msg {
    Data(Vec<Bytes>),
    /// Flush and record what arrived so far, if anything new did (the
    /// network side asks every [`CHECKPOINT_EVERY`], so bytes that arrived
    /// just before a long silence are recorded too).
    Checkpoint,
    /// The transfer ends early: flush and record what is kept, then answer.
    Close(oneshot::Sender<()>),
    /// Flush, and answer with the length and digest.
    Finish(oneshot::Sender<io::Result<Finished>>),
    /// The parts take over: flush and record what is kept, then answer
    /// with its length and the hash so far.
    Hand(oneshot::Sender<io::Result<(u64, Sha256)>>),
}

/// The bytes a finished transfer wrote.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Bytes in the file (kept prefix included).
    pub len: u64,
    /// Their SHA-256, lowercase hex.
    pub sha256: String,
}

/// The sending side of one transfer's writer thread.
///
/// The thread starts with the first full batch. A transfer that ends before
/// one (a small file, or a failure before the body) is written, hashed and
/// flushed in one task on the runtime's blocking threads instead, which costs
/// no thread of its own.
pub(crate) struct Sink {
    /// Where the bytes go, until the writer thread starts.
    unstarted: Option<Option<Target>>,
    tx: Option<mpsc::Sender<Msg>>,
    /// Receives the writer's first error, if it fails before `finish`.
    failed: Option<oneshot::Receiver<io::Error>>,
    /// Chunks not handed over yet.
    batch: Vec<Bytes>,
    /// Their bytes.
    batch_len: usize,
}

/// What the writer thread writes into.
pub(crate) struct Target {
    /// The partial file, opened where it is first written: a small body is
    /// then opened, written and hashed in one short step
    /// ([`crate::store::quick_step`]), a large one on its writer thread.
    pub paths: PartialPaths,
    /// Bytes already in it that the transfer continues (hashed again first).
    pub offset: u64,
    /// Records flushed lengths next to the file.
    pub checkpoints: Checkpointer,
}

/// What a response body is read into ([`Sink`], or one ranged part).
pub(crate) trait BodySink: Send {
    /// Takes one chunk; `false` when no more bytes are wanted (a part that
    /// reached its end).
    fn write(&mut self, chunk: Bytes)
        -> impl std::future::Future<Output = io::Result<bool>> + Send;
    /// Asks for what arrived so far to be flushed and recorded.
    fn checkpoint(&mut self) -> impl std::future::Future<Output = io::Result<()>> + Send;
    /// Whether the sink wants no more bytes, as its last checkpoint found
    /// (a first connection found slow while silent, `carry`).
    fn stopped(&self) -> bool {
        false
    }
}

impl BodySink for Sink {
    async fn write(&mut self, chunk: Bytes) -> io::Result<bool> {
        Sink::write(self, chunk).await.map(|()| true)
    }

    async fn checkpoint(&mut self) -> io::Result<()> {
        Sink::checkpoint(self).await
    }
}

impl Sink {
    /// A sink that only hashes (auto-fill): nothing is written.
    pub(crate) fn hash_only() -> Sink {
        Sink::spawn(None)
    }

    /// A sink writing into `target` after its first `offset` bytes.
    pub(crate) fn to_file(target: Target) -> Sink {
        Sink::spawn(Some(target))
    }

    fn spawn(target: Option<Target>) -> Sink {
        Sink {
            unstarted: Some(target),
            tx: None,
            failed: None,
            batch: Vec::new(),
            batch_len: 0,
        }
    }

    /// Starts the writer thread, if it has not started.
    fn start(&mut self) {
        let Some(target) = self.unstarted.take() else {
            return;
        };
        let (tx, mut rx) = mpsc::channel(CHANNEL_CHUNKS);
        let (fail_tx, fail_rx) = oneshot::channel();
        let work = move || {
            if let Err(e) = run(target, std::iter::from_fn(move || rx.blocking_recv())) {
                let _ = fail_tx.send(e);
            }
        };
        // On one of the runtime's blocking threads, which stay for the next
        // transfer: a thread made for each file costs its creation, its
        // stack and its end every time (200 files, 200 threads). Outside a
        // runtime, a thread of its own.
        let spawned = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                drop(runtime.spawn_blocking(work));
                Ok(())
            }
            Err(_) => std::thread::Builder::new()
                .name("gem-resources-writer".into())
                .spawn(work)
                .map(drop),
        };
        match spawned {
            Ok(_) => {
                self.tx = Some(tx);
                self.failed = Some(fail_rx);
            }
            Err(e) => {
                // No thread: every call reports this error.
                let (fail_tx, fail_rx) = oneshot::channel();
                let _ = fail_tx.send(e);
                self.failed = Some(fail_rx);
            }
        }
    }

    /// Runs the whole transfer's writing at once, when the writer thread
    /// never started: the gathered chunks, then `last`. A new body that
    /// ends verified there is a short step ([`crate::store::quick_step`]:
    /// a write, no flush); one that ends otherwise may flush what it keeps,
    /// and a resumed one hashes its kept prefix again: on a blocking thread.
    async fn run_unstarted(&mut self, target: Option<Target>, last: Msg) -> io::Result<()> {
        let batch = std::mem::take(&mut self.batch);
        self.batch_len = 0;
        // A resumed body hashes its kept prefix again first: that may be
        // the whole file but its last bytes, never a short step.
        let short = matches!(last, Msg::Finish(_))
            && target
                .as_ref()
                .is_none_or(|t| t.offset < BATCH_BYTES as u64);
        let root = target
            .as_ref()
            .map(|t| t.paths.folder().path().to_path_buf())
            .unwrap_or_default();
        let work = move || run(target, [Msg::Data(batch), last].into_iter());
        if !short {
            return tokio::task::spawn_blocking(work)
                .await
                .map_err(io::Error::other)?;
        }
        crate::store::quick_step(&root, move || Ok(work()))
            .await
            .map_err(io::Error::other)?
    }

    /// Hands one chunk to the writer, waiting while it is behind.
    pub(crate) async fn write(&mut self, chunk: Bytes) -> io::Result<()> {
        self.batch_len += chunk.len();
        self.batch.push(chunk);
        if self.batch_len >= BATCH_BYTES {
            self.flush_batch().await?;
        }
        Ok(())
    }

    /// Hands the chunks gathered so far to the writer.
    async fn flush_batch(&mut self) -> io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.batch_len = 0;
        let batch = std::mem::take(&mut self.batch);
        self.send(Msg::Data(batch)).await
    }

    /// Asks the writer to record what arrived so far (without waiting).
    pub(crate) async fn checkpoint(&mut self) -> io::Result<()> {
        self.flush_batch().await?;
        self.send(Msg::Checkpoint).await
    }

    /// Ends the transfer early: waits until the kept bytes are flushed and
    /// recorded. Errors are logged, not returned: the transfer is failing
    /// for another reason already.
    pub(crate) async fn close(mut self) {
        if let Some(target) = self.unstarted.take() {
            let (tx, _rx) = oneshot::channel();
            if let Err(e) = self.run_unstarted(target, Msg::Close(tx)).await {
                tracing::warn!("cannot keep the partial download: {e}");
            }
            return;
        }
        let _ = self.flush_batch().await;
        let (tx, rx) = oneshot::channel();
        if self.send(Msg::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Ends the transfer (every batch written, no record written after)
    /// and returns the length and digest; the file is flushed as it is
    /// published.
    pub(crate) async fn finish(self) -> io::Result<Finished> {
        self.last(Msg::Finish).await
    }

    /// Ends the stream for the parts to go on (see `carry`): waits until
    /// what is kept is flushed and recorded, and returns its length and the
    /// SHA-256 of it so far, so that it is not read back.
    pub(crate) async fn hand_over(self) -> io::Result<(u64, Sha256)> {
        self.last(Msg::Hand).await
    }

    /// Sends the writer its last message (every gathered batch before it)
    /// and waits for its answer.
    async fn last<T>(
        mut self,
        msg: impl FnOnce(oneshot::Sender<io::Result<T>>) -> Msg,
    ) -> io::Result<T> {
        if let Some(target) = self.unstarted.take() {
            let (tx, mut rx) = oneshot::channel();
            self.run_unstarted(target, msg(tx)).await?;
            return rx
                .try_recv()
                .unwrap_or_else(|_| Err(io::Error::other("the writer stopped")));
        }
        self.flush_batch().await?;
        let (tx, rx) = oneshot::channel();
        self.send(msg(tx)).await?;
        match rx.await {
            Ok(result) => result,
            Err(_) => Err(self.error().await),
        }
    }

    async fn send(&mut self, msg: Msg) -> io::Result<()> {
        self.start();
        let sent = match &self.tx {
            Some(tx) => tx.send(msg).await.is_ok(),
            None => false,
        };
        if sent {
            Ok(())
        } else {
            Err(self.error().await)
        }
    }

    /// The writer's error, once it has stopped.
    async fn error(&mut self) -> io::Error {
        self.tx = None;
        match self.failed.take() {
            Some(rx) => rx
                .await
                .unwrap_or_else(|_| io::Error::other("the writer thread stopped")),
            None => io::Error::other("the writer thread stopped"),
        }
    }
}

/// The writer: `msgs` until one ends it (on the writer thread, each
/// waited for on its channel).
fn run(target: Option<Target>, msgs: impl Iterator<Item = Msg>) -> io::Result<()> {
    let mut writer = match target {
        Some(t) => Some(Writer::open(t)?),
        None => None,
    };
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    if let Some(w) = &mut writer {
        len = w.rehash_prefix(&mut hasher)?;
    }
    for msg in msgs {
        match msg {
            Msg::Data(batch) => {
                for chunk in batch {
                    hasher.update(&chunk);
                    let before = len;
                    len += chunk.len() as u64;
                    if let Some(w) = &mut writer {
                        if let Err(e) = w.write(&chunk, len) {
                            // A full disk: the bytes before this chunk stay
                            // durable and recorded, for a resume.
                            if let Some(w) = writer.take() {
                                if let Err(k) = w.keep(before) {
                                    tracing::warn!("cannot keep the partial download: {k}");
                                }
                            }
                            return Err(e);
                        }
                    }
                }
            }
            Msg::Checkpoint => {
                if let Some(w) = &mut writer {
                    w.records.checkpoint(&w.file, len);
                }
            }
            Msg::Close(reply) => {
                if let Some(w) = writer.take() {
                    if let Err(e) = w.keep(len) {
                        tracing::warn!("cannot keep the partial download: {e}");
                    }
                }
                let _ = reply.send(());
                return Ok(());
            }
            Msg::Hand(reply) => {
                let kept = match writer.take() {
                    Some(w) => w.keep(len),
                    None => Ok(()),
                };
                let _ = reply.send(kept.map(|()| (len, std::mem::take(&mut hasher))));
                return Ok(());
            }
            Msg::Finish(reply) => {
                let flushed = match writer.take() {
                    Some(w) => w.flush_all(),
                    None => Ok(()),
                };
                let digest = std::mem::take(&mut hasher).finalize();
                let _ = reply.send(flushed.map(|()| Finished {
                    len,
                    sha256: hex::encode(digest),
                }));
                return Ok(());
            }
        }
    }
    // The transfer ended without finishing: keep what arrived.
    if let Some(w) = writer {
        w.keep(len)?;
    }
    Ok(())
}

/// File side of the writer thread.
struct Writer {
    file: File,
    /// The partial file's records of its durable length.
    records: Records,
    /// Where the next write-back window starts.
    written_back: u64,
    /// Asks for each window to be written back.
    write_back: WriteBack,
    /// The prefix to hash again before anything else.
    offset: u64,
}

impl Writer {
    fn open(t: Target) -> io::Result<Writer> {
        let Target {
            paths,
            offset,
            mut checkpoints,
        } = t;
        let mut file = paths.open_data()?;
        if offset == 0 {
            // A fresh start: the record of earlier bytes (maybe from another
            // address) no longer describes the file.
            checkpoints.record(0)?;
        }
        file.set_len(offset)?;
        file.seek(io::SeekFrom::Start(offset))?;
        Ok(Writer {
            file,
            records: Records::new(checkpoints, offset),
            written_back: offset,
            write_back: WriteBack::new(),
            offset,
        })
    }

    /// Hashes the kept prefix and returns its length.
    fn rehash_prefix(&mut self, hasher: &mut Sha256) -> io::Result<u64> {
        if self.offset == 0 {
            return Ok(0);
        }
        self.file.seek(io::SeekFrom::Start(0))?;
        let mut buf = vec![0u8; REHASH_BUFFER];
        let mut left = self.offset;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let n = self.file.read(&mut buf[..want])?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the kept partial file is shorter than recorded",
                ));
            }
            hasher.update(&buf[..n]);
            left -= n as u64;
        }
        self.file.seek(io::SeekFrom::Start(self.offset))?;
        Ok(self.offset)
    }

    fn write(&mut self, chunk: &[u8], len: u64) -> io::Result<()> {
        self.file.write_all(chunk)?;
        if len - self.written_back >= WRITE_BACK_BYTES {
            self.write_back
                .start(&self.file, self.written_back, len - self.written_back);
            self.written_back = len;
        }
        if len - self.records.requested() >= CHECKPOINT_BYTES {
            self.records.checkpoint(&self.file, len);
        }
        Ok(())
    }

    /// The transfer stopped early: keeps the bytes for resume when they
    /// can be resumed (waiting until they are flushed and recorded),
    /// removes them otherwise.
    fn keep(mut self, len: u64) -> io::Result<()> {
        self.records.keep(&self.file, len)
    }

    /// The end of the transfer: no record may be written after this, the
    /// file is about to be checked and leave. It is not flushed here: a
    /// verified file is flushed as it is published (`Store::publish`), once
    /// its transfer gave its slot back; one that failed its check never is.
    fn flush_all(mut self) -> io::Result<()> {
        self.records.stop().map(drop)
    }
}

/// The records of a partial file's durable length, kept beside its writer
/// (one stream's or the parts'): a [`Syncer`] thread is started at the
/// first checkpoint worth one, so a small file never starts it, and bytes
/// that can never be resumed are not worth a flush.
pub(super) struct Records {
    /// Flushes and records checkpoints beside the writer, once started.
    syncer: Option<Syncer>,
    /// The records' writer until the syncer takes it.
    checkpoints: Option<Checkpointer>,
    /// Durable bytes (prefix and ranges) at the last checkpoint asked for.
    requested: u64,
}

/// Bytes written before a flush: a prefix, and for parts the ranges beyond
/// it (`[start, end)`, sorted and apart).
#[derive(Debug, Clone, Default)]
pub(super) struct Written {
    /// Bytes from the start.
    pub prefix: u64,
    /// Ranges beyond the prefix.
    pub ranges: Vec<[u64; 2]>,
}

impl Written {
    /// A prefix alone.
    pub(super) fn prefix(len: u64) -> Written {
        Written {
            prefix: len,
            ranges: Vec::new(),
        }
    }

    /// The bytes in all.
    pub(super) fn bytes(&self) -> u64 {
        self.ranges
            .iter()
            .fold(self.prefix, |n, [s, e]| n.saturating_add(e - s))
    }
}

impl Records {
    /// Records of a file of which `offset` bytes are already recorded.
    pub(super) fn new(checkpoints: Checkpointer, offset: u64) -> Records {
        Records {
            syncer: None,
            checkpoints: Some(checkpoints),
            requested: offset,
        }
    }

    /// The durable bytes at the last checkpoint asked for.
    pub(super) fn requested(&self) -> u64 {
        self.requested
    }

    /// Asks for the first `len` bytes of `file` to be flushed and recorded,
    /// without waiting.
    pub(super) fn checkpoint(&mut self, file: &File, len: u64) {
        self.checkpoint_written(file, Written::prefix(len));
    }

    /// Asks for the bytes `written` into `file` to be flushed and
    /// recorded, without waiting.
    pub(super) fn checkpoint_written(&mut self, file: &File, written: Written) {
        let len = written.bytes();
        if len == self.requested {
            return;
        }
        if self.syncer.is_none() {
            let Some(checkpoints) = self.checkpoints.take_if(|c| c.resumable()) else {
                return;
            };
            match file
                .try_clone()
                .and_then(|file| Syncer::spawn(file, checkpoints))
            {
                Ok(syncer) => self.syncer = Some(syncer),
                Err(e) => {
                    tracing::warn!("cannot record the partial download's progress: {e}");
                    return;
                }
            }
        }
        if let Some(syncer) = &self.syncer {
            syncer.request(written);
            self.requested = len;
        }
    }

    /// The records' writer, once every checkpoint asked for is recorded.
    pub(super) fn stop(&mut self) -> io::Result<Option<Checkpointer>> {
        match self.syncer.take() {
            Some(syncer) => syncer.finish().map(Some),
            None => Ok(self.checkpoints.take()),
        }
    }

    /// The transfer stopped early with `len` bytes of `file` in order:
    /// keeps them for resume when they can be resumed (waiting until they
    /// are flushed and recorded), removes them otherwise.
    pub(super) fn keep(&mut self, file: &File, len: u64) -> io::Result<()> {
        self.keep_written(file, Written::prefix(len))
    }

    /// [`Records::keep`] of the bytes `written` (a prefix and ranges).
    pub(super) fn keep_written(&mut self, file: &File, written: Written) -> io::Result<()> {
        self.checkpoint_written(file, written);
        match self.stop()? {
            Some(checkpoints) if !checkpoints.resumable() => checkpoints.discard(),
            _ => {}
        }
        Ok(())
    }
}

/// A thread that flushes the partial file (`fdatasync`) and then records
/// what was written before the flush, so the writer never waits for the
/// disk before the end. Requests that pile up while a flush runs are merged
/// into one (the last: what was written only grows).
pub(super) struct Syncer {
    tx: std::sync::mpsc::Sender<Written>,
    thread: std::thread::JoinHandle<io::Result<Checkpointer>>,
}

impl Syncer {
    pub(super) fn spawn(file: File, mut checkpoints: Checkpointer) -> io::Result<Syncer> {
        let (tx, rx) = std::sync::mpsc::channel::<Written>();
        let thread = std::thread::Builder::new()
            .name("gem-resources-sync".into())
            .spawn(move || {
                while let Ok(mut written) = rx.recv() {
                    while let Ok(later) = rx.try_recv() {
                        written = later;
                    }
                    if checkpoints.resumable() {
                        file.sync_data()?;
                        checkpoints.record_ranges(written.prefix, written.ranges)?;
                    }
                }
                Ok(checkpoints)
            })?;
        Ok(Syncer { tx, thread })
    }

    pub(super) fn request(&self, written: Written) {
        let _ = self.tx.send(written);
    }

    /// Waits for the requests made so far and returns the records' writer.
    pub(super) fn finish(self) -> io::Result<Checkpointer> {
        drop(self.tx);
        self.thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the sync thread panicked")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::partial::PartialPaths;

    const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn to_file(dir: &std::path::Path, validator: Option<&str>) -> (Sink, PartialPaths) {
        let paths = PartialPaths::new(dir, SHA, 1 << 20);
        // Made, as a download's preparation makes it.
        drop(paths.open_data().unwrap());
        let checkpoints =
            Checkpointer::new(&paths, "https://cdn.test/a", validator.map(str::to_string));
        let target = Target {
            paths: paths.clone(),
            offset: 0,
            checkpoints,
        };
        (Sink::to_file(target), paths)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_small_transfer_is_written_hashed_and_flushed_without_a_thread_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let (mut sink, paths) = to_file(dir.path(), Some("\"v1\""));
        sink.write(Bytes::from_static(b"hello ")).await.unwrap();
        sink.write(Bytes::from_static(b"world")).await.unwrap();
        assert!(sink.tx.is_none(), "no writer thread for a small body");
        let finished = sink.finish().await.unwrap();
        assert_eq!(finished.len, 11);
        assert_eq!(finished.sha256, hex::encode(Sha256::digest(b"hello world")));
        assert_eq!(std::fs::read(&paths.data).unwrap(), b"hello world");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_small_transfer_cut_short_keeps_and_records_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (mut sink, paths) = to_file(dir.path(), Some("\"v1\""));
        sink.write(Bytes::from(vec![7u8; 1000])).await.unwrap();
        sink.close().await;
        let (meta, kept) = paths.kept().expect("the bytes are kept for a resume");
        assert_eq!(kept, 1000);
        assert_eq!(meta.validator.as_deref(), Some("\"v1\""));
        assert_eq!(std::fs::read(&paths.data).unwrap(), vec![7u8; 1000]);
        // Without a validator nothing can be resumed: nothing is kept.
        let (mut sink, paths) = to_file(dir.path(), None);
        sink.write(Bytes::from(vec![7u8; 1000])).await.unwrap();
        sink.close().await;
        assert!(paths.kept().is_none());
        assert!(!paths.data.exists());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_large_transfer_gets_its_writer_thread_at_the_first_full_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (mut sink, paths) = to_file(dir.path(), None);
        let chunk = Bytes::from(vec![1u8; 64 << 10]);
        let mut hasher = Sha256::new();
        for _ in 0..(BATCH_BYTES / chunk.len() + 4) {
            hasher.update(&chunk);
            sink.write(chunk.clone()).await.unwrap();
        }
        assert!(sink.tx.is_some(), "the writer thread runs");
        let finished = sink.finish().await.unwrap();
        assert_eq!(finished.sha256, hex::encode(hasher.finalize()));
        assert_eq!(std::fs::metadata(&paths.data).unwrap().len(), finished.len);
    }
}
