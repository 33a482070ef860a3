//! The local API's socket: a Unix domain socket on Linux and macOS, a named
//! pipe on Windows, behind one small interface ([`Listener`], [`connect`],
//! [`peer_is_me`], [`choose_path`]).
//!
//! A client checks its peer before it sends a byte: on Unix the socket file
//! and its folder must be the user's own and closed to everyone else, and
//! the process at the other end (`SO_PEERCRED`, `getpeereid`) the user's,
//! and the one `service.json` names where the platform says which process
//! it is. A name another user could take first is never predictable: a
//! socket outside the store lives in a folder with a random name (a
//! named pipe has a random suffix), made anew by each service.

use std::io;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncWrite};

/// A connected byte stream, either side.
pub(crate) trait Duplex: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Duplex for T {}

/// Random bytes in a socket folder's or pipe's name: nobody can take the
/// name before the service, or guess it.
const RANDOM_NAME_BYTES: usize = 12;

/// A random name part, hex.
fn random_part() -> io::Result<String> {
    let mut bytes = [0u8; RANDOM_NAME_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| io::Error::other(format!("no random bytes: {e}")))?;
    Ok(hex::encode(bytes))
}

/// Where a service listens: the socket (or pipe), and the folder made for
/// it alone, removed with it.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    /// The socket path, or the pipe name.
    pub(crate) path: PathBuf,
    /// A folder made for this socket alone: removed when the listener is.
    pub(crate) own_folder: Option<PathBuf>,
}

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

    /// The process at the other end of an accepted client
    /// (`SO_PEERCRED` on Linux, `LOCAL_PEERPID` on macOS), when the
    /// platform says.
    pub(crate) fn peer_pid(client: &Accepted) -> Option<u32> {
        let pid = client.0.peer_cred().ok()?.pid()?;
        u32::try_from(pid).ok()
    }

    /// A listening socket; its file (and a folder made for it) is removed
    /// when dropped.
    pub(crate) struct Listener {
        inner: UnixListener,
        path: PathBuf,
        own_folder: Option<PathBuf>,
    }

    impl Listener {
        /// Listens at `place`, replacing a socket left there by a service
        /// that is gone (the caller holds the store's service lock).
        pub(crate) fn bind(place: &Place) -> io::Result<Listener> {
            let path = place.path.as_path();
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
                own_folder: place.own_folder.clone(),
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
            if let Some(folder) = &self.own_folder {
                let _ = std::fs::remove_dir(folder);
            }
        }
    }

    fn me() -> u32 {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() }
    }

    fn refused(why: String) -> io::Error {
        io::Error::new(io::ErrorKind::PermissionDenied, why)
    }

    /// Refuses a socket that is not the user's own, in a folder that is
    /// not the user's own or is open to others.
    fn check_socket_file(path: &Path) -> io::Result<()> {
        let meta = std::fs::symlink_metadata(path)?;
        if !meta.file_type().is_socket() {
            return Err(refused(format!("{} is not a socket", path.display())));
        }
        if meta.uid() != me() {
            return Err(refused(format!(
                "the socket {} belongs to user {}, not to this user",
                path.display(),
                meta.uid()
            )));
        }
        let folder = path.parent().unwrap_or(Path::new("/"));
        let folder_meta = std::fs::symlink_metadata(folder)?;
        if !folder_meta.is_dir() || folder_meta.uid() != me() || folder_meta.mode() & 0o077 != 0 {
            return Err(refused(format!(
                "the socket's folder {} is not this user's own, or is open to others",
                folder.display()
            )));
        }
        Ok(())
    }

    /// Connects to the socket `name` after checking that the socket and
    /// its folder are the user's own; then checks that the process at the
    /// other end is the user's and, with `pid`, is that process (where the
    /// platform says which process it is). Nothing is sent.
    pub(crate) async fn connect(name: &str, pid: Option<u32>) -> io::Result<Box<dyn Duplex>> {
        let path = Path::new(name);
        check_socket_file(path)?;
        let stream = UnixStream::connect(path).await?;
        let cred = stream.peer_cred()?;
        if cred.uid() != me() {
            return Err(refused(format!(
                "the process listening on {name} runs as user {}, not as this user",
                cred.uid()
            )));
        }
        if let (Some(want), Some(peer)) = (pid, cred.pid()) {
            if peer >= 0 && peer as u32 != want {
                return Err(refused(format!(
                    "the process listening on {name} is {peer}, not the service {want} that service.json names"
                )));
            }
        }
        Ok(Box::new(stream))
    }

    /// `inside` when it fits a socket address; else `api.sock` in a folder
    /// made anew with a random name, `0700`, in the runtime folder
    /// (`$XDG_RUNTIME_DIR`, else the temporary folder): nobody can compute
    /// the name before, and a name taken by someone else is passed over.
    pub(crate) fn choose_path(inside: &Path, _key: &str) -> crate::Result<Place> {
        if inside.as_os_str().len() <= MAX_SOCKET_PATH {
            return Ok(Place {
                path: inside.to_path_buf(),
                own_folder: None,
            });
        }
        // "gem-resources-" + 24 hex + "/api.sock"
        let room = MAX_SOCKET_PATH - 48;
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|d| d.is_absolute() && d.as_os_str().len() <= room)
            .unwrap_or_else(std::env::temp_dir);
        let folder = fresh_folder(&base).map_err(|e| crate::Error::io("cannot use", &base, e))?;
        Ok(Place {
            path: folder.join("api.sock"),
            own_folder: Some(folder),
        })
    }

    /// A folder made now in `base` with a random name, `0700`, checked to
    /// be the user's own; a name that exists is passed over.
    fn fresh_folder(base: &Path) -> io::Result<PathBuf> {
        for _ in 0..16 {
            let dir = base.join(format!("gem-resources-{}", random_part()?));
            match super::super::private_dir_builder().create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
            let meta = std::fs::symlink_metadata(&dir)?;
            if !meta.is_dir() || meta.uid() != me() || meta.mode() & 0o077 != 0 {
                continue;
            }
            return Ok(dir);
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free folder name for the socket after 16 tries",
        ))
    }

    /// Removes what a service that is gone left at `place` (a socket, and
    /// the folder made for it), when both are the user's own.
    pub(crate) fn remove_left_over(socket: &Path) {
        if check_socket_file(socket).is_err() {
            return;
        }
        let _ = std::fs::remove_file(socket);
        if let Some(folder) = socket.parent() {
            let made_for_it = folder
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("gem-resources-"));
            if made_for_it {
                let _ = std::fs::remove_dir(folder);
            }
        }
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

    /// The process at the other end of an accepted client
    /// (`GetNamedPipeClientProcessId`).
    pub(crate) fn peer_pid(client: &Accepted) -> Option<u32> {
        use std::os::windows::io::AsRawHandle;
        let mut pid = 0u32;
        // SAFETY: the handle is the connected pipe's, open while `client`
        // lives, and `pid` is a valid place for the answer.
        let done = unsafe {
            windows_sys::Win32::System::Pipes::GetNamedPipeClientProcessId(
                client.0.as_raw_handle() as _,
                &mut pid,
            )
        };
        (done != 0).then_some(pid)
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
        /// Creates the pipe `place` (`\\.\pipe\…`); fails when it exists.
        pub(crate) fn bind(place: &Place) -> io::Result<Listener> {
            let name = place.path.display().to_string();
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
    /// is busy. The pipe's security descriptor admits this user alone; which
    /// process serves it is proved by `hello` (the service's secret), so
    /// `_pid` is not checked here.
    pub(crate) async fn connect(name: &str, _pid: Option<u32>) -> io::Result<Box<dyn Duplex>> {
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

    /// `\\.\pipe\gem-resources-<key>-<random>`: a name nobody can take
    /// first (the pipe namespace is every user's).
    pub(crate) fn choose_path(inside: &Path, key: &str) -> crate::Result<Place> {
        let random = random_part().map_err(|e| crate::Error::io("cannot name", inside, e))?;
        Ok(Place {
            path: PathBuf::from(format!(r"\\.\pipe\gem-resources-{key}-{random}")),
            own_folder: None,
        })
    }

    /// Nothing to remove: a pipe goes with its last handle.
    pub(crate) fn remove_left_over(_socket: &Path) {}

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
