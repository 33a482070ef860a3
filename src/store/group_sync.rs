//! Fsyncs of one folder shared between callers.

use std::sync::Mutex;

/// Fsyncs of one folder shared between callers ("group commit"): a caller
/// that arrives while an fsync runs waits for the next one, which covers
/// every entry created before it started. Many downloads finishing together
/// make one fsync of `blobs/`, not one each.
#[derive(Debug, Default)]
pub(super) struct GroupSync {
    state: Mutex<GroupState>,
    done: std::sync::Condvar,
}

#[derive(Debug, Default)]
struct GroupState {
    /// Requests so far.
    requested: u64,
    /// Requests covered by a finished fsync.
    synced: u64,
    /// Whether an fsync runs now.
    running: bool,
}

impl GroupSync {
    /// Returns once an fsync of `dir` that started after this call has
    /// finished.
    pub(super) fn sync(&self, dir: &super::folder::Folder) {
        self.run(|| dir.sync());
    }

    /// [`GroupSync::sync`] with `flush` standing for the fsync.
    fn run(&self, flush: impl Fn()) {
        let lock = || self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut state = lock();
        state.requested += 1;
        let mine = state.requested;
        while state.synced < mine {
            if state.running {
                state = self.done.wait(state).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            state.running = true;
            let target = state.requested;
            drop(state);
            flush();
            state = lock();
            state.synced = target;
            state.running = false;
            self.done.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn callers_arriving_together_share_fsyncs_and_each_is_covered() {
        let group = Arc::new(GroupSync::default());
        let flushes = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (group, flushes) = (group.clone(), flushes.clone());
                std::thread::spawn(move || {
                    group.run(|| {
                        flushes.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    })
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let n = flushes.load(Ordering::SeqCst);
        assert!((1..8).contains(&n), "{n} fsyncs for 8 callers");
        // A caller after all of them gets an fsync of its own.
        group.run(|| {
            flushes.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(flushes.load(Ordering::SeqCst), n + 1);
    }
}
