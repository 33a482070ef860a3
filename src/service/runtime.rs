//! Where a call's work runs: on the service's runtime, and its file work
//! on that runtime's blocking threads.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::Handle;
use tokio::task::{JoinError, JoinHandle};

use crate::error::{Error, Result};
use crate::service::Resources;

/// A call's work running on the service's runtime, stopped when the call
/// is: dropping it (the caller's future dropped, its call cancelled, its
/// client gone) aborts the work at its next await, and work that has not
/// begun yet (waiting for a slot, a connection to its host) never begins.
/// Made by [`Resources::on_runtime`].
#[must_use = "the work stops when this is dropped"]
pub(crate) struct CallWork<T> {
    task: JoinHandle<Result<T>>,
}

impl<T> Drop for CallWork<T> {
    fn drop(&mut self) {
        // Nothing once the work has ended.
        self.task.abort();
    }
}

impl<T> Future for CallWork<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        Pin::new(&mut self.task).poll(cx).map(joined)
    }
}

/// The outcome of a call's task: its own, the panic it raised, or
/// `E_RESOURCE_SHUTDOWN` when the runtime itself went away.
fn joined<T>(outcome: std::result::Result<Result<T>, JoinError>) -> Result<T> {
    match outcome {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Aborted (only by dropping its `CallWork`, which then waits for
        // nothing), or the runtime itself is shutting down.
        Err(_) => Err(Error::Shutdown),
    }
}

impl Resources {
    /// Runs a call's `work` on the service's runtime and waits for it from
    /// any executor; `E_RESOURCE_SHUTDOWN` once the service is shut down.
    ///
    /// The one way a call that reads (a `path` that downloads, `autofill`,
    /// `verify`) runs its work: the work stops when the caller stops
    /// waiting for it ([`CallWork`]), so that nothing runs on for a call
    /// that was cancelled or whose client left. Calls that change the
    /// store use [`Resources::on_runtime_to_end`] instead.
    pub(crate) async fn on_runtime<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.live()?;
        CallWork {
            task: self.inner.scheduler.handle().spawn(work),
        }
        .await
    }

    /// [`Resources::on_runtime`] for a call that changes the store
    /// (install, uninstall, a retry's failure record, start's cleaning,
    /// an import): once begun, its work runs to the end even when the
    /// caller stops waiting. Stopped halfway, it would leave a change half
    /// made: a registration written whose dropped files were never
    /// deleted, its `Installed` event without the downloads it queues, a
    /// file removed without its `Deleted` event; and a caller that gives
    /// up on an install has not asked to undo it. A call not yet begun
    /// when the service shuts down is refused (`E_RESOURCE_SHUTDOWN`).
    pub(crate) async fn on_runtime_to_end<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.live()?;
        joined(self.inner.scheduler.handle().spawn(work).await)
    }

    /// Runs blocking file work (writes, fsyncs, deletions, copies) on the
    /// service runtime's blocking threads, from any executor: a slow disk
    /// then holds up only the call that waits for it, never the transfers
    /// running on the runtime's workers.
    pub(super) async fn on_blocking<T: Send + 'static>(
        &self,
        path: &Path,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        match self.handle().spawn_blocking(work).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::io(
                "the file work stopped:",
                path,
                std::io::Error::other(e),
            )),
        }
    }

    /// The runtime the service runs on.
    pub(crate) fn handle(&self) -> &Handle {
        self.inner.scheduler.handle()
    }
}
