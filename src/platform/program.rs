//! Another program, run once for an answer: found on a search path given
//! by the caller (the value of `PATH`), handed its input on stdin, its
//! stdout read within a deadline, its stderr discarded.
//!
//! | OS | found as | run |
//! | --- | --- | --- |
//! | Unix | `<dir>/<name>`, a regular file with an execute bit | as is |
//! | Windows | `<dir>\<name>.exe` | without a console window of its own (`CREATE_NO_WINDOW`) |
//!
//! Only absolute folders of the search path are looked in: a relative
//! entry (`.`, or an empty one) would make the current folder decide which
//! program runs. A program still running at the deadline is killed.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What a run gave.
#[derive(Debug)]
pub(crate) struct Ran {
    /// How it ended; `None`: it was still running at the deadline and was
    /// killed.
    pub(crate) status: Option<ExitStatus>,
    /// Its stdout, at most the bytes asked for (`None`: it wrote more).
    pub(crate) stdout: Option<Vec<u8>>,
}

/// The program `name` in the first absolute folder of `search` (a
/// `PATH` value) that has it, with the platform's suffix for programs.
pub(crate) fn find_on_path(search: &OsStr, name: &str) -> Option<PathBuf> {
    let file = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    std::env::split_paths(search)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(&file))
        .find(|path| runnable(path))
}

/// Whether `path` is a file this user may run.
fn runnable(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        meta.is_file() && meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        meta.is_file()
    }
}

/// Runs `program` with `args`, writes `input` to its stdin and closes it,
/// and reads its stdout (at most `max_out` bytes) until it exits or
/// `timeout` passes, when it is killed. Its stderr goes nowhere. Fails
/// only when it cannot be started.
pub(crate) fn run(
    program: &Path,
    args: &[&str],
    input: &[u8],
    timeout: Duration,
    max_out: u64,
) -> io::Result<Ran> {
    let deadline = Instant::now() + timeout;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    #[cfg(windows)]
    {
        use std::os::windows::process::CommandExt;
        const CREATE_NO_WINDOW: u32 = 0x0800_0000;
        command.creation_flags(CREATE_NO_WINDOW);
    }
    let mut child = command.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        // A few bytes fit in the pipe's buffer: this never waits. A
        // program that exited without reading them is seen below.
        let _ = stdin.write_all(input);
    }
    // Read on a thread of its own, so the deadline holds however the
    // program writes (or does not).
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let read = stdout.take(max_out + 1).read_to_end(&mut bytes);
            let _ = tx.send(
                read.ok()
                    .filter(|_| bytes.len() as u64 <= max_out)
                    .map(|_| bytes),
            );
        });
    }
    let stdout = rx
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .ok()
        .flatten();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Ran {
                status: Some(status),
                stdout,
            });
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Ran {
                status: None,
                stdout: None,
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn a_program_is_found_only_where_it_may_run_in_an_absolute_folder() {
        let first = tempfile::tempdir().unwrap();
        let second = tempfile::tempdir().unwrap();
        let path = script(second.path(), "tool", "true");
        // Not runnable in the first folder: the second's is found.
        std::fs::write(first.path().join("tool"), "#!/bin/sh\n").unwrap();
        let search = std::env::join_paths([first.path(), second.path()]).unwrap();
        assert_eq!(find_on_path(&search, "tool"), Some(path));
        assert_eq!(find_on_path(&search, "other"), None);
        // A relative entry is never looked in.
        let search = std::env::join_paths([Path::new("."), Path::new("")]).unwrap();
        assert_eq!(find_on_path(&search, "tool"), None);
    }

    #[test]
    fn a_run_gives_the_answer_and_a_late_program_is_killed_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let echo = script(dir.path(), "echo-in", "cat; echo oops >&2; exit 3");
        let ran = run(&echo, &[], b"hello", Duration::from_secs(10), 100).unwrap();
        assert_eq!(ran.status.unwrap().code(), Some(3));
        assert_eq!(ran.stdout.as_deref(), Some(&b"hello"[..]));
        // More than asked for: no answer.
        let ran = run(&echo, &[], b"hello", Duration::from_secs(10), 4).unwrap();
        assert_eq!(ran.stdout, None);
        let slow = script(dir.path(), "slow", "exec sleep 30");
        let started = Instant::now();
        let ran = run(&slow, &[], b"", Duration::from_millis(200), 100).unwrap();
        assert!(ran.status.is_none());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(run(
            &dir.path().join("none"),
            &[],
            b"",
            Duration::from_secs(1),
            1
        )
        .is_err());
    }
}
