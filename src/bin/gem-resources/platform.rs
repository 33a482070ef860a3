//! The binary's calls that differ between operating systems: the
//! terminal's size, the signals that stop or reload it, and the
//! allocator's tuning. (The library's are in its own platform layer.)
//!
//! | call | Unix | Windows |
//! | --- | --- | --- |
//! | [`terminal_size`] | the terminal on stderr | the console on stderr |
//! | [`stdout_columns`] | the terminal on stdout, if it is one | the console on stdout |
//! | [`stop_signal`] | SIGINT or SIGTERM | Ctrl-C or Ctrl-Break; console close, log-off, shutdown |
//! | [`hangup_signal`] | SIGHUP | none (the configuration file is watched) |
//! | [`keep_freed_memory`] | glibc's `mallopt` on Linux | nothing |
//! | [`permission_bits`] | the mode's `0o777` (no setuid, setgid, sticky) | as they are (the read-only attribute) |
//! | [`shell_word`] | a POSIX shell's word: single quotes unless plain | cmd's and PowerShell's: double quotes unless plain (`\` is plain) |

use std::future::Future;
use std::pin::Pin;

/// Rows and columns of the terminal on stderr (24 × 80 when they cannot be
/// told).
pub fn terminal_size() -> (u16, u16) {
    console::Term::stderr()
        .size_checked()
        .filter(|&(rows, cols)| rows > 0 && cols > 0)
        .unwrap_or((24, 80))
}

/// Columns of the terminal on stdout; `None` when stdout is not a
/// terminal (a pipe or a file: tables keep their whole width there).
pub fn stdout_columns() -> Option<u16> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    console::Term::stdout()
        .size_checked()
        .map(|(_, cols)| cols)
        .filter(|&cols| cols > 0)
}

/// Which request stopped the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGINT; Ctrl-C or Ctrl-Break on Windows: the user, at the terminal.
    Interrupt,
    /// SIGTERM; on Windows the console closing, a log-off or the system
    /// shutting down: a service manager or the system.
    Terminate,
}

/// Registers the stop signals now (so that Ctrl-C no longer kills the
/// process outright) and returns a future that resolves at the first of
/// them, saying which: SIGINT or SIGTERM; on Windows Ctrl-C, Ctrl-Break,
/// the console's close, a log-off or a shutdown.
pub fn stop_signal() -> Pin<Box<dyn Future<Output = Stop> + Send>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            return Box::pin(async move {
                tokio::select! {
                    _ = int.recv() => Stop::Interrupt,
                    _ = term.recv() => Stop::Terminate,
                }
            });
        }
    }
    #[cfg(windows)]
    {
        use tokio::signal::windows::{ctrl_break, ctrl_c, ctrl_close, ctrl_logoff, ctrl_shutdown};
        if let (Ok(mut c), Ok(mut brk)) = (ctrl_c(), ctrl_break()) {
            // Close, log-off and shutdown are only delivered to some
            // processes (a console's, a service's): each is optional.
            let (close, logoff, shutdown) =
                (ctrl_close().ok(), ctrl_logoff().ok(), ctrl_shutdown().ok());
            return Box::pin(async move {
                let ended = async move {
                    let (mut close, mut logoff, mut shutdown) = (close, logoff, shutdown);
                    tokio::select! {
                        Some(_) = async { close.as_mut()?.recv().await } => {}
                        Some(_) = async { logoff.as_mut()?.recv().await } => {}
                        Some(_) = async { shutdown.as_mut()?.recv().await } => {}
                        else => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    _ = c.recv() => Stop::Interrupt,
                    _ = brk.recv() => Stop::Interrupt,
                    () = ended => Stop::Terminate,
                }
            });
        }
    }
    Box::pin(async {
        let _ = tokio::signal::ctrl_c().await;
        Stop::Interrupt
    })
}

/// SIGHUP, as a stream of wake-ups; never fires where there is none.
pub fn hangup_signal() -> tokio::sync::mpsc::Receiver<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::hangup()) {
            Ok(mut hup) => {
                tokio::spawn(async move {
                    while hup.recv().await.is_some() {
                        let _ = tx.try_send(());
                    }
                });
            }
            Err(e) => tracing::warn!("cannot listen for SIGHUP: {e}"),
        }
    }
    #[cfg(not(unix))]
    std::mem::forget(tx);
    rx
}

/// Tells the C allocator to keep freed memory for reuse rather than hand it
/// back to the system at once. A transfer's buffers are freed on its writer
/// thread as fast as they are filled on the network side; given back, each
/// one is faulted in again on the next read (30,000 page faults for 1 GiB
/// instead of 2,000, and about 5% of the CPU time). Memory in use stays
/// bounded by the transfers' channels; only its return to the system waits.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's thresholds; it is called
    // before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 8 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

/// `permissions` without what a copy must not carry over: on Unix only the
/// read, write and execute bits stay (never setuid, setgid or sticky).
pub fn permission_bits(permissions: std::fs::Permissions) -> std::fs::Permissions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::Permissions::from_mode(permissions.mode() & 0o777)
    }
    #[cfg(not(unix))]
    permissions
}

/// `word` as the user's shell reads it back in a command we suggest: as it
/// is when it has only characters no shell treats specially, else quoted
/// (single quotes for a POSIX shell; double quotes for cmd and PowerShell,
/// where a path's `\` is an ordinary character).
pub fn shell_word(word: &str) -> String {
    #[cfg(windows)]
    let (plain_chars, quoted) = ("-_./+=:,@\\", format!("\"{word}\""));
    #[cfg(not(windows))]
    let (plain_chars, quoted) = ("-_./+=:,@%", format!("'{}'", word.replace('\'', "'\\''")));
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || plain_chars.contains(c));
    if plain {
        word.to_string()
    } else {
        quoted
    }
}
