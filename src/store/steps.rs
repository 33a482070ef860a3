//! Where a short file-system step runs: on the caller's thread while the
//! disk has been quick, else on the runtime's blocking threads.
//!
//! A download's small steps (taking its partial file, writing a body that
//! came in one piece, giving a verified file its folder) take a few system
//! calls and no flush: tens of microseconds on a quick disk. A trip to the
//! blocking threads costs more than that (a thread woken to run the step,
//! the task's worker woken for its result); a thousand tiny files pay it
//! several times each. So while every step of the last [`SLOW_FOR`] took
//! less than [`QUICK`], a step runs where it is called. A slower one sends
//! the steps of the next [`SLOW_FOR`] back to the blocking threads, where a
//! slow disk holds up no transfer on the runtime's workers: only the step
//! that found the disk slow ran on a worker. Steps that flush
//! (`store::publish`), or that may link, copy or hash a file, always run
//! on the blocking threads: their callers say which steps are short.
//!
//! Only on a multi-threaded runtime: with one thread, a step on it would
//! hold up every other task.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use tokio::runtime::{Handle, RuntimeFlavor};

use crate::error::Result;

/// A step that took at least this long found the disk slow. Well above
/// what such a step takes on a quick disk (tens of microseconds) and what
/// a busy machine's scheduler adds to it (a time slice, a few
/// milliseconds), so that only the disk sends the steps away.
pub(crate) const QUICK: Duration = Duration::from_millis(10);

/// How long after a slow step the steps run on the blocking threads.
pub(crate) const SLOW_FOR: Duration = Duration::from_secs(2);

/// This process's steps (one disk or several: a slow one sends them all to
/// the blocking threads for a while).
static STEPS: LazyLock<Steps> = LazyLock::new(Steps::new);

/// Runs `work`, a short step on `path` without a flush, where
/// [`Steps::run`] says.
pub(crate) async fn quick_step<T: Send + 'static>(
    path: &Path,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    STEPS.run(path, work).await
}

/// What the steps of a process have shown of its disk.
#[derive(Debug)]
pub(crate) struct Steps {
    /// A step that took this long found the disk slow.
    quick: Duration,
    /// How long after a slow step the steps run on the blocking threads.
    slow_for: Duration,
    epoch: Instant,
    /// Nanoseconds after `epoch` until which steps run on the blocking
    /// threads.
    slow_until: AtomicU64,
}

impl Steps {
    /// No step seen yet: the disk is taken as quick.
    pub(crate) fn new() -> Steps {
        Steps::with(QUICK, SLOW_FOR)
    }

    /// [`Steps::new`] with other bounds than [`QUICK`] and [`SLOW_FOR`].
    pub(crate) fn with(quick: Duration, slow_for: Duration) -> Steps {
        Steps {
            quick,
            slow_for,
            epoch: Instant::now(),
            slow_until: AtomicU64::new(0),
        }
    }

    /// Runs `work` on the caller's thread when the runtime has several
    /// threads and no step was slow lately, else on the blocking threads;
    /// either way, how long it took is remembered.
    pub(crate) async fn run<T: Send + 'static>(
        &'static self,
        path: &Path,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        if self.here() {
            return self.timed(work);
        }
        super::off_runtime(path, move || self.timed(work)).await
    }

    /// Whether a step runs where it is called.
    fn here(&self) -> bool {
        let several =
            Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
        several && self.nanos(Instant::now()) >= self.slow_until.load(Ordering::Relaxed)
    }

    /// Runs `work` and remembers a slow disk.
    fn timed<T>(&self, work: impl FnOnce() -> Result<T>) -> Result<T> {
        let start = Instant::now();
        let out = work();
        let end = Instant::now();
        if end.duration_since(start) >= self.quick {
            let until = self.nanos(end).saturating_add(nanos(self.slow_for));
            self.slow_until.fetch_max(until, Ordering::Relaxed);
        }
        out
    }

    fn nanos(&self, at: Instant) -> u64 {
        nanos(at.duration_since(self.epoch))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::ThreadId;

    /// Runs a step on `steps` from a task and tells whether it ran on that
    /// task's thread.
    async fn ran_here(steps: &'static Steps, pause: Duration) -> bool {
        let caller = std::thread::current().id();
        let ran: ThreadId = steps
            .run(Path::new("."), move || {
                std::thread::sleep(pause);
                Ok(std::thread::current().id())
            })
            .await
            .unwrap();
        ran == caller
    }

    /// Bounds far from what a busy test machine's scheduling adds to a
    /// step that does nothing.
    const TEST_QUICK: Duration = Duration::from_millis(100);
    const SLOW: Duration = Duration::from_millis(250);

    fn fresh(slow_for: Duration) -> &'static Steps {
        Box::leak(Box::new(Steps::with(TEST_QUICK, slow_for)))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn quick_steps_run_where_they_are_called_until_one_is_slow() {
        let steps = fresh(Duration::from_secs(60));
        assert!(ran_here(steps, Duration::ZERO).await);
        assert!(ran_here(steps, Duration::ZERO).await);
        // This one finds the disk slow (it ran on the worker) ...
        assert!(ran_here(steps, SLOW).await);
        // ... and the next ones go to the blocking threads.
        assert!(!ran_here(steps, Duration::ZERO).await);
        assert!(!ran_here(steps, Duration::ZERO).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_steps_come_back_once_the_disk_was_quick_for_a_while() {
        let slow_for = Duration::from_secs(2);
        let steps = fresh(slow_for);
        assert!(ran_here(steps, SLOW).await);
        // A slow step off the runtime pushes the quick ones further off:
        // past the first slow step's `slow_for` (by a quarter of a second),
        // within the second's (by a second).
        tokio::time::sleep(slow_for / 2).await;
        assert!(!ran_here(steps, SLOW).await);
        tokio::time::sleep(slow_for / 2).await;
        assert!(!ran_here(steps, Duration::ZERO).await);
        // Quick for `slow_for` since the last slow step: here again.
        tokio::time::sleep(slow_for).await;
        assert!(ran_here(steps, Duration::ZERO).await);
    }

    #[tokio::test]
    async fn with_one_thread_every_step_goes_to_the_blocking_threads() {
        let steps = fresh(Duration::from_secs(60));
        assert!(!ran_here(steps, Duration::ZERO).await);
    }
}
