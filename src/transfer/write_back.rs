//! The kernel's write-back of a file being written, started from a thread
//! of its own.
//!
//! A writer asks for each window of [`WRITE_BACK_BYTES`] it wrote to be
//! written back at once (`sync_file_range`), so the flush as the file is
//! published has little left to do. That call waits when the disk's queue
//! is full: on a 64 MiB download on loopback, up to 17 ms in all, during
//! which a writer making the call itself would neither hash nor write, and
//! the connection would wait for it. Here the calls are made by a thread
//! beside the writer (one of the runtime's blocking threads, started at the
//! first window, so a small file never starts it); requests that pile up
//! while one call waits are made in one call when they meet.

use std::fs::File;
use std::sync::mpsc;

/// Start the kernel's write-back of every window of this many bytes as soon
/// as it is written, so the final flush has little left to do: at most this
/// much not yet on its way to the disk when the last byte arrives. A 64 MiB
/// file on loopback is verified and durable sooner with 2 MiB than with
/// 8 MiB windows (BENCHMARKS.md); a file below it is left to the flush as
/// it is published.
pub const WRITE_BACK_BYTES: u64 = 2 << 20;

/// Asks for ranges of one file to be written back, from a thread of its own.
pub(super) struct WriteBack {
    /// The thread's requests, once it started.
    tx: Option<mpsc::Sender<(u64, u64)>>,
    /// It could not start: nothing more is asked.
    failed: bool,
}

impl WriteBack {
    /// Nothing asked yet (no thread).
    pub(super) fn new() -> WriteBack {
        WriteBack {
            tx: None,
            failed: false,
        }
    }

    /// Asks for `[from, from + len)` of `file` to be written back, without
    /// waiting. Only an optimisation: where it cannot be done, nothing is.
    pub(super) fn start(&mut self, file: &File, from: u64, len: u64) {
        if !crate::platform::WRITES_BACK || self.failed || len == 0 {
            return;
        }
        if self.tx.is_none() {
            match file.try_clone() {
                Ok(file) => self.tx = Some(spawn(file)),
                Err(e) => {
                    tracing::debug!("no early write-back: {e}");
                    self.failed = true;
                    return;
                }
            }
        }
        if let Some(tx) = &self.tx {
            if tx.send((from, len)).is_err() {
                self.tx = None;
                self.failed = true;
            }
        }
    }
}

/// The thread: each request, those that meet made one.
fn spawn(file: File) -> mpsc::Sender<(u64, u64)> {
    let (tx, rx) = mpsc::channel::<(u64, u64)>();
    let work = move || {
        while let Ok((mut from, mut len)) = rx.recv() {
            while let Ok((next, more)) = rx.try_recv() {
                if next == from + len {
                    len += more;
                } else {
                    crate::platform::start_write_back(&file, from, len);
                    (from, len) = (next, more);
                }
            }
            crate::platform::start_write_back(&file, from, len);
        }
    };
    // On one of the runtime's blocking threads, which stay for the next
    // file; outside a runtime, a thread of its own.
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(work)),
        Err(_) => {
            let spawned = std::thread::Builder::new()
                .name("gem-resources-write-back".into())
                .spawn(work);
            if let Err(e) = spawned {
                // The receiver is gone with the closure: the first send
                // fails and nothing more is asked.
                tracing::debug!("no early write-back: {e}");
            }
        }
    }
    tx
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn ranges_asked_for_are_written_back_beside_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = File::create(dir.path().join("f")).unwrap();
        let mut back = WriteBack::new();
        file.write_all(&[1u8; 4096]).unwrap();
        back.start(&file, 0, 4096);
        back.start(&file, 4096, 0);
        assert_eq!(back.tx.is_some(), crate::platform::WRITES_BACK);
        assert!(!back.failed);
        drop(back);
        file.sync_all().unwrap();
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), [1u8; 4096]);
    }
}
