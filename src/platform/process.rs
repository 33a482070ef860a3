//! Whether another process still runs: what `serve --parent-pid` watches.
//!
//! | OS | how |
//! | --- | --- |
//! | Linux | a pidfd (`pidfd_open`, Linux 5.3+), readable once the process has ended, zombie or not; `kill(pid, 0)` where there is none |
//! | macOS, the BSDs | `kill(pid, 0)`: `ESRCH` once the process is gone |
//! | Unix, the watched process being our parent | also `getppid()`: it changes the moment the parent ends (we are adopted), whatever reuses its pid |
//! | Windows | a handle to the process (`OpenProcess(SYNCHRONIZE)`), signalled when it ends (`WaitForSingleObject`, no wait) |
//!
//! The handle and the pidfd name the very process watched, so a pid used
//! again by a new process is never taken for it. `kill(pid, 0)` asks by
//! number: when the process ends and another takes its pid between two
//! looks (which are 250 ms apart), the new one is taken for it. Where
//! that matters, watch the parent (which `getppid` settles) or a process
//! on Linux or Windows.

use std::io;

/// A process being watched, from [`ProcessWatch::open`].
#[derive(Debug)]
pub(crate) struct ProcessWatch {
    imp: Imp,
}

impl ProcessWatch {
    /// Starts watching process `pid`; `Ok(None)` when no such process
    /// runs now. Pid 0 (and, on Unix, a pid too large for `pid_t`) is
    /// refused: it names no one process.
    pub(crate) fn open(pid: u32) -> io::Result<Option<ProcessWatch>> {
        if pid == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "process id 0 names no process",
            ));
        }
        Ok(Imp::open(pid)?.map(|imp| ProcessWatch { imp }))
    }

    /// Whether the process has ended (never blocks).
    pub(crate) fn ended(&self) -> bool {
        self.imp.ended()
    }
}

#[cfg(unix)]
#[derive(Debug)]
struct Imp {
    pid: libc::pid_t,
    /// Whether `pid` was our parent when the watch began.
    parent: bool,
    /// Linux: a pidfd of the process.
    #[cfg(target_os = "linux")]
    pidfd: Option<std::os::fd::OwnedFd>,
}

#[cfg(unix)]
impl Imp {
    fn open(pid: u32) -> io::Result<Option<Imp>> {
        let pid = libc::pid_t::try_from(pid).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a process id on this system",
            )
        })?;
        if !alive(pid) {
            return Ok(None);
        }
        // SAFETY: getppid has no preconditions and cannot fail.
        let parent = unsafe { libc::getppid() } == pid;
        Ok(Some(Imp {
            pid,
            parent,
            #[cfg(target_os = "linux")]
            pidfd: pidfd_open(pid),
        }))
    }

    fn ended(&self) -> bool {
        // SAFETY: as above.
        if self.parent && unsafe { libc::getppid() } != self.pid {
            return true;
        }
        #[cfg(target_os = "linux")]
        if let Some(fd) = &self.pidfd {
            use std::os::fd::AsRawFd;
            let mut poll = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, no wait.
            let ready = unsafe { libc::poll(&mut poll, 1, 0) };
            return ready > 0;
        }
        !alive(self.pid)
    }
}

/// Whether a process `pid` exists (`kill(pid, 0)`; `EPERM`: it exists,
/// and is another user's).
#[cfg(unix)]
fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// A pidfd of `pid`, when the kernel has `pidfd_open`.
#[cfg(target_os = "linux")]
fn pidfd_open(pid: libc::pid_t) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags (none), and returns a new
    // descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: a descriptor just returned, owned by nobody else.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

#[cfg(windows)]
#[derive(Debug)]
struct Imp {
    handle: windows_sys::Win32::Foundation::HANDLE,
}

// SAFETY: a process handle may be used and closed from any thread.
#[cfg(windows)]
unsafe impl Send for Imp {}
// SAFETY: `ended` only waits on the handle with no timeout, which any
// thread may do at once.
#[cfg(windows)]
unsafe impl Sync for Imp {}

#[cfg(windows)]
impl Imp {
    fn open(pid: u32) -> io::Result<Option<Imp>> {
        use windows_sys::Win32::Foundation::ERROR_INVALID_PARAMETER;
        use windows_sys::Win32::System::Threading::{OpenProcess, PROCESS_SYNCHRONIZE};
        // SAFETY: OpenProcess returns a new handle, or null.
        let handle = unsafe { OpenProcess(PROCESS_SYNCHRONIZE, 0, pid) };
        if handle.is_null() {
            let e = io::Error::last_os_error();
            // No such process.
            if e.raw_os_error() == Some(ERROR_INVALID_PARAMETER as i32) {
                return Ok(None);
            }
            return Err(e);
        }
        let imp = Imp { handle };
        Ok((!imp.ended()).then_some(imp))
    }

    fn ended(&self) -> bool {
        use windows_sys::Win32::Foundation::WAIT_OBJECT_0;
        use windows_sys::Win32::System::Threading::WaitForSingleObject;
        // SAFETY: the handle is open until drop; no wait.
        unsafe { WaitForSingleObject(self.handle, 0) == WAIT_OBJECT_0 }
    }
}

#[cfg(windows)]
impl Drop for Imp {
    fn drop(&mut self) {
        // SAFETY: the handle was opened by `open` and is closed once.
        unsafe {
            windows_sys::Win32::Foundation::CloseHandle(self.handle);
        }
    }
}

#[cfg(not(any(unix, windows)))]
#[derive(Debug)]
struct Imp;

#[cfg(not(any(unix, windows)))]
impl Imp {
    fn open(_pid: u32) -> io::Result<Option<Imp>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "watching a process is not supported on this system",
        ))
    }

    fn ended(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_watched_until_it_ends() {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .arg("--list")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let watch = ProcessWatch::open(child.id()).unwrap();
        child.wait().unwrap();
        // Ended and reaped: gone, or (open raced the end) seen as ended.
        if let Some(watch) = watch {
            assert!(watch.ended());
        }
        assert!(ProcessWatch::open(child.id()).unwrap().is_none());
        let me = ProcessWatch::open(std::process::id()).unwrap().unwrap();
        assert!(!me.ended());
        assert!(ProcessWatch::open(0).is_err());
    }
}
