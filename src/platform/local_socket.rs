//! The local API's socket: a Unix domain socket on Linux and macOS, a named
//! pipe on Windows, behind one small interface ([`Listener`], [`connect`],
//! [`peer_is_me`], [`choose_path`]).

use std::io;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncWrite};

/// A connected byte stream, either side.
pub(crate) trait Duplex: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Duplex for T {}

/// Longest socket path used as is; `sun_path` holds 104 bytes on macOS and
/// 108 on Linux, its terminating zero included.
#[cfg_attr(not(unix), allow(dead_code))]
const MAX_SOCKET_PATH: usize = 100;

#[cfg(unix)]
pub(crate) use unix::*;
#[cfg(windows)]
pub(crate) use windows::*;

#[cfg(unix)]
mod unix {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    use tokio::net::{UnixListener, UnixStream};

    /// An accepted client.
    pub(crate) struct Accepted(UnixStream);

    impl Accepted {
        /// The stream.
        pub(crate) fn into_duplex(self) -> Box<dyn Duplex> {
            Box::new(self.0)
        }
    }

    /// Whether the client runs as this process's user.
    pub(crate) fn peer_is_me(client: &Accepted) -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        client.0.peer_cred().is_ok_and(|cred| cred.uid() == me)
    }

    /// A listening socket; its file is removed when dropped.
    pub(crate) struct Listener {
        inner: UnixListener,
        path: PathBuf,
    }

    impl Listener {
        /// Listens on `path`, replacing a socket left there by a service
        /// that is gone (the caller holds the store's service lock).
        pub(crate) fn bind(path: &Path) -> io::Result<Listener> {
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                if !meta.file_type().is_socket() {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        "something other than a socket is in the way",
                    ));
                }
                std::fs::remove_file(path)?;
            }
            let inner = UnixListener::bind(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            Ok(Listener {
                inner,
                path: path.to_path_buf(),
            })
        }

        /// The name clients connect to.
        pub(crate) fn name(&self) -> String {
            self.path.display().to_string()
        }

        /// The next client.
        pub(crate) async fn accept(&self) -> io::Result<Accepted> {
            Ok(Accepted(self.inner.accept().await?.0))
        }
    }

    impl Drop for Listener {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Connects to the socket `name`.
    pub(crate) async fn connect(name: &str) -> io::Result<Box<dyn Duplex>> {
        Ok(Box::new(UnixStream::connect(name).await?))
    }

    /// `inside` when it fits a socket address; else
    /// `<runtime dir>/gem-resources/<key>.sock` (`$XDG_RUNTIME_DIR`, else
    /// `<temp>/gem-resources-<uid>/<key>.sock`), in a folder of the user's
    /// own that nobody else may enter.
    pub(crate) fn choose_path(inside: &Path, key: &str) -> crate::Result<PathBuf> {
        if inside.as_os_str().len() <= MAX_SOCKET_PATH {
            return Ok(inside.to_path_buf());
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        let runtime = std::env::var_os("XDG_RUNTIME_DIR")
            .map(|d| PathBuf::from(d).join("gem-resources"))
            .filter(|d| d.is_absolute() && d.as_os_str().len() + key.len() + 6 <= MAX_SOCKET_PATH);
        let dir =
            runtime.unwrap_or_else(|| std::env::temp_dir().join(format!("gem-resources-{uid}")));
        private_folder(&dir).map_err(|e| crate::Error::io("cannot use", &dir, e))?;
        Ok(dir.join(format!("{key}.sock")))
    }

    /// Creates `dir` (`0700`) or checks that it is the user's own and
    /// closed to everyone else: a folder another user made first is
    /// refused, never used.
    fn private_folder(dir: &Path) -> io::Result<()> {
        match super::super::private_dir_builder().create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let meta = std::fs::symlink_metadata(dir)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "belongs to another user or is open to others: the service does not trust it",
            ));
        }
        Ok(())
    }
}

#[cfg(windows)]
mod windows {
    use super::*;
    use tokio::net::windows::named_pipe::{ClientOptions, NamedPipeServer, ServerOptions};
    use tokio::sync::Mutex;

    /// An accepted client.
    pub(crate) struct Accepted(NamedPipeServer);

    impl Accepted {
        /// The stream.
        pub(crate) fn into_duplex(self) -> Box<dyn Duplex> {
            Box::new(self.0)
        }
    }

    /// The pipe admits only this user (its security descriptor) and no
    /// remote client: every client that connected is this user.
    pub(crate) fn peer_is_me(_client: &Accepted) -> bool {
        true
    }

    /// A named pipe accepting clients, one instance at a time.
    pub(crate) struct Listener {
        name: String,
        next: Mutex<NamedPipeServer>,
    }

    fn options(first: bool) -> ServerOptions {
        let mut options = ServerOptions::new();
        options
            .first_pipe_instance(first)
            .reject_remote_clients(true);
        options
    }

    impl Listener {
        /// Creates the pipe `path` (`\\.\pipe\…`); fails when it exists.
        pub(crate) fn bind(path: &Path) -> io::Result<Listener> {
            let name = path.display().to_string();
            let first = security::create(&options(true), &name)?;
            Ok(Listener {
                name,
                next: Mutex::new(first),
            })
        }

        /// The name clients connect to.
        pub(crate) fn name(&self) -> String {
            self.name.clone()
        }

        /// The next client.
        pub(crate) async fn accept(&self) -> io::Result<Accepted> {
            let mut next = self.next.lock().await;
            next.connect().await?;
            let fresh = security::create(&options(false), &self.name)?;
            Ok(Accepted(std::mem::replace(&mut *next, fresh)))
        }
    }

    /// Connects to the pipe `name`, waiting a little while every instance
    /// is busy.
    pub(crate) async fn connect(name: &str) -> io::Result<Box<dyn Duplex>> {
        const ERROR_PIPE_BUSY: i32 = 231;
        for _ in 0..50 {
            match ClientOptions::new().open(name) {
                Ok(client) => return Ok(Box::new(client)),
                Err(e) if e.raw_os_error() == Some(ERROR_PIPE_BUSY) => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "every pipe instance is busy",
        ))
    }

    /// `\\.\pipe\gem-resources-<key>`.
    pub(crate) fn choose_path(_inside: &Path, key: &str) -> crate::Result<PathBuf> {
        Ok(PathBuf::from(format!(r"\\.\pipe\gem-resources-{key}")))
    }

    mod security {
        //! A pipe whose security descriptor grants access to this user
        //! alone (its owner), and to no one else.
        use std::io;

        use tokio::net::windows::named_pipe::{NamedPipeServer, ServerOptions};
        use windows_sys::Win32::Foundation::LocalFree;
        use windows_sys::Win32::Security::Authorization::{
            ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
        };
        use windows_sys::Win32::Security::{PSECURITY_DESCRIPTOR, SECURITY_ATTRIBUTES};

        /// Protected DACL: full access for the owner (the creator) only.
        const SDDL: &str = "D:P(A;;GA;;;OW)";

        pub(super) fn create(options: &ServerOptions, name: &str) -> io::Result<NamedPipeServer> {
            let sddl: Vec<u16> = SDDL.encode_utf16().chain(Some(0)).collect();
            let mut descriptor: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
            // SAFETY: `sddl` is a NUL-terminated UTF-16 string; on success
            // the descriptor is ours to free with LocalFree.
            let ok = unsafe {
                ConvertStringSecurityDescriptorToSecurityDescriptorW(
                    sddl.as_ptr(),
                    SDDL_REVISION_1,
                    &mut descriptor,
                    std::ptr::null_mut(),
                )
            };
            if ok == 0 {
                return Err(io::Error::last_os_error());
            }
            let mut attributes = SECURITY_ATTRIBUTES {
                nLength: std::mem::size_of::<SECURITY_ATTRIBUTES>() as u32,
                lpSecurityDescriptor: descriptor,
                bInheritHandle: 0,
            };
            // SAFETY: `attributes` points to a valid descriptor for the
            // duration of the call.
            let server = unsafe {
                options.create_with_security_attributes_raw(
                    name,
                    (&mut attributes as *mut SECURITY_ATTRIBUTES).cast(),
                )
            };
            // SAFETY: allocated by the conversion above, freed once.
            unsafe { LocalFree(descriptor) };
            server
        }
    }
}
