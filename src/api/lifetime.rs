//! What ends a service besides a stop request: the process that started
//! it ending (the rule of LSP's `processId`), for `serve --parent-pid`
//! and for an app that runs the service on behalf of another process.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::platform::process::ProcessWatch;

/// How often [`Parent::ended`] looks at the process.
pub const PARENT_POLL: Duration = Duration::from_millis(250);

/// A process whose end ends the service ([`Parent::watch`]).
///
/// On Linux (a pidfd) and Windows (a process handle) the very process is
/// watched. On macOS and the BSDs it is asked by number (`kill(pid, 0)`)
/// every [`PARENT_POLL`], unless it is this process's parent, whose end
/// `getppid()` tells at once: a process that ends and whose pid another
/// takes between two looks is then missed. Name the direct parent where
/// you can.
#[derive(Debug)]
pub struct Parent {
    pid: u32,
    watch: ProcessWatch,
}

impl Parent {
    /// Starts watching process `pid`. `E_RESOURCE_USAGE` when no such
    /// process runs (a service is not started for a parent already gone).
    pub fn watch(pid: u32) -> Result<Parent> {
        match ProcessWatch::open(pid) {
            Ok(Some(watch)) => Ok(Parent { pid, watch }),
            Ok(None) => Err(Error::Usage(format!("process {pid} is not running"))),
            Err(e) => Err(Error::Usage(format!("cannot watch process {pid}: {e}"))),
        }
    }

    /// The process watched.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether it has ended (never waits).
    pub fn has_ended(&self) -> bool {
        self.watch.ended()
    }

    /// Resolves once it has ended, at most [`PARENT_POLL`] later.
    pub async fn ended(&self) {
        while !self.watch.ended() {
            tokio::time::sleep(PARENT_POLL).await;
        }
    }
}
