//! Where a transfer's bytes go: a thread of its own that hashes and writes.
//!
//! The network side (TLS decryption, on the async runtime) hands each chunk
//! over a bounded channel to one writer thread per transfer, which updates
//! the SHA-256 and writes with plain `std::fs` calls. Decryption and hashing
//! so run on different cores, no write goes through the runtime's blocking
//! pool, and the bounded channel keeps memory constant: a slow disk slows
//! the reads instead of filling memory.
//!
//! Durability is spread over the transfer instead of piling up at the end:
//! every [`WRITE_BACK_BYTES`] the thread asks the kernel to start writing the
//! last window back (`sync_file_range`), and every [`CHECKPOINT_BYTES`] or
//! [`CHECKPOINT_EVERY`] it flushes the file (`fdatasync`) and records the
//! flushed length next to the partial file ([`crate::partial`]). After a
//! crash only that flushed prefix is trusted. When the transfer ends early
//! (an error, a cancellation, the sender dropped), the thread flushes once
//! more and records the length, so an interruption keeps every byte.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use crate::partial::Checkpointer;

/// Batches in flight between the network and the writer thread (each about
/// [`BATCH_BYTES`]), which bounds the memory of one transfer.
const CHANNEL_CHUNKS: usize = 8;

/// Start the kernel's write-back of every window of this many bytes as soon
/// as it is written, so the final flush has little left to do.
pub const WRITE_BACK_BYTES: u64 = 8 << 20;

/// Flush and record the durable length at least every this many bytes.
/// Each flush waits for the disk, so on a fast link they are rare: the
/// early write-back already keeps the disk busy.
pub const CHECKPOINT_BYTES: u64 = 512 << 20;

/// ... and at least this often (the network side asks), so a slow link or
/// a silent server loses at most this much progress to a crash.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

/// Chunks are handed over in batches of about this many bytes: one wake-up
/// of the writer per batch instead of one per TLS record.
const BATCH_BYTES: usize = 256 << 10;

/// Buffer for re-reading a kept prefix to rebuild the hash.
const REHASH_BUFFER: usize = 1 << 20;

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
pub(crate) struct Sink {
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
    /// The open partial file, positioned nowhere in particular.
    pub file: File,
    /// Bytes already in it that the transfer continues (hashed again first).
    pub offset: u64,
    /// Records flushed lengths next to the file.
    pub checkpoints: Checkpointer,
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
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let (fail_tx, fail_rx) = oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("gem-resources-writer".into())
            .spawn(move || {
                if let Err(e) = run(target, rx) {
                    let _ = fail_tx.send(e);
                }
            });
        match spawned {
            Ok(_) => Sink {
                tx: Some(tx),
                failed: Some(fail_rx),
                batch: Vec::new(),
                batch_len: 0,
            },
            Err(e) => {
                // No thread: every call reports this error.
                let (fail_tx, fail_rx) = oneshot::channel();
                let _ = fail_tx.send(e);
                Sink {
                    tx: None,
                    failed: Some(fail_rx),
                    batch: Vec::new(),
                    batch_len: 0,
                }
            }
        }
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
        let _ = self.flush_batch().await;
        let (tx, rx) = oneshot::channel();
        if self.send(Msg::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Flushes everything and returns the length and digest.
    pub(crate) async fn finish(mut self) -> io::Result<Finished> {
        self.flush_batch().await?;
        let (tx, rx) = oneshot::channel();
        self.send(Msg::Finish(tx)).await?;
        match rx.await {
            Ok(result) => result,
            Err(_) => Err(self.error().await),
        }
    }

    async fn send(&mut self, msg: Msg) -> io::Result<()> {
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

/// The writer thread.
fn run(target: Option<Target>, mut rx: mpsc::Receiver<Msg>) -> io::Result<()> {
    let mut writer = match target {
        Some(t) => Some(Writer::open(t)?),
        None => None,
    };
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    if let Some(w) = &mut writer {
        len = w.rehash_prefix(&mut hasher)?;
    }
    while let Some(msg) = rx.blocking_recv() {
        match msg {
            Msg::Data(batch) => {
                for chunk in batch {
                    hasher.update(&chunk);
                    len += chunk.len() as u64;
                    if let Some(w) = &mut writer {
                        w.write(&chunk, len)?;
                    }
                }
            }
            Msg::Checkpoint => {
                if let Some(w) = &mut writer {
                    w.checkpoint(len);
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
    /// Flushes and records checkpoints beside the writer; started at the
    /// first checkpoint, so a small file never starts it.
    syncer: Option<Syncer>,
    /// The records' writer until the syncer takes it.
    checkpoints: Option<Checkpointer>,
    /// Where the next write-back window starts.
    written_back: u64,
    /// Length at the last checkpoint asked for.
    requested: u64,
    /// The prefix to hash again before anything else.
    offset: u64,
}

impl Writer {
    fn open(t: Target) -> io::Result<Writer> {
        let Target {
            mut file,
            offset,
            mut checkpoints,
        } = t;
        if offset == 0 {
            // A fresh start: the record of earlier bytes (maybe from another
            // address) no longer describes the file.
            checkpoints.record(0)?;
        }
        file.set_len(offset)?;
        file.seek(io::SeekFrom::Start(offset))?;
        Ok(Writer {
            file,
            syncer: None,
            checkpoints: Some(checkpoints),
            written_back: offset,
            requested: offset,
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
            start_write_back(&self.file, self.written_back, len - self.written_back);
            self.written_back = len;
        }
        if len - self.requested >= CHECKPOINT_BYTES {
            self.checkpoint(len);
        }
        Ok(())
    }

    /// Asks for `len` bytes to be flushed and recorded, without waiting.
    /// Bytes that can never be resumed are not worth a flush.
    fn checkpoint(&mut self, len: u64) {
        if len == self.requested {
            return;
        }
        if self.syncer.is_none() {
            let Some(checkpoints) = self.checkpoints.take_if(|c| c.resumable()) else {
                return;
            };
            match self
                .file
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
            syncer.request(len);
            self.requested = len;
        }
    }

    /// The records' writer, once every checkpoint asked for is recorded.
    fn stop_syncer(&mut self) -> io::Result<Option<Checkpointer>> {
        match self.syncer.take() {
            Some(syncer) => syncer.finish().map(Some),
            None => Ok(self.checkpoints.take()),
        }
    }

    /// The transfer stopped early: keeps the bytes for resume when they
    /// can be resumed (waiting until they are flushed and recorded),
    /// removes them otherwise.
    fn keep(mut self, len: u64) -> io::Result<()> {
        self.checkpoint(len);
        match self.stop_syncer()? {
            Some(checkpoints) if !checkpoints.resumable() => checkpoints.discard(),
            _ => {}
        }
        Ok(())
    }

    /// The final flush before the file is verified and published.
    fn flush_all(mut self) -> io::Result<()> {
        // No record may be written after this: the file is about to leave.
        self.stop_syncer()?;
        self.file.sync_all()
    }
}

/// A thread that flushes the partial file (`fdatasync`) and then records
/// the flushed length, so the writer never waits for the disk before the
/// end. Requests that pile up while a flush runs are merged into one.
struct Syncer {
    tx: std::sync::mpsc::Sender<u64>,
    thread: std::thread::JoinHandle<io::Result<Checkpointer>>,
}

impl Syncer {
    fn spawn(file: File, mut checkpoints: Checkpointer) -> io::Result<Syncer> {
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let thread = std::thread::Builder::new()
            .name("gem-resources-sync".into())
            .spawn(move || {
                while let Ok(mut len) = rx.recv() {
                    while let Ok(later) = rx.try_recv() {
                        len = later;
                    }
                    if checkpoints.resumable() {
                        file.sync_data()?;
                        checkpoints.record(len)?;
                    }
                }
                Ok(checkpoints)
            })?;
        Ok(Syncer { tx, thread })
    }

    fn request(&self, len: u64) {
        let _ = self.tx.send(len);
    }

    /// Waits for the requests made so far and returns the records' writer.
    fn finish(self) -> io::Result<Checkpointer> {
        drop(self.tx);
        self.thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the sync thread panicked")))
    }
}

/// Asks the kernel to start writing `[from, from + len)` back to disk now,
/// without waiting. Only an optimisation: errors are ignored (the final
/// flush reports real ones).
fn start_write_back(file: &File, from: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(from), Ok(len)) = (i64::try_from(from), i64::try_from(len)) else {
            return;
        };
        // SAFETY: the descriptor is open for the whole call; the call only
        // schedules write-back of the file's own pages.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), from, len, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, from, len);
}
