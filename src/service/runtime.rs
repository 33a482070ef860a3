//! Where a call's work runs: on the service's runtime, and its file work
//! on that runtime's blocking threads.

use std::future::Future;
use std::path::Path;

use tokio::runtime::Handle;

use crate::error::{Error, Result};
use crate::service::Resources;

impl Resources {
    /// Runs `work` on the service's runtime and waits for it from any
    /// executor; `E_RESOURCE_SHUTDOWN` once the service is shut down.
    pub(crate) async fn on_runtime<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.live()?;
        match self.inner.scheduler.handle().spawn(work).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime itself is shutting down.
            Err(_) => Err(Error::Shutdown),
        }
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
