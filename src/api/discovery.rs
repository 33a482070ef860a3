//! Where a store's service listens, and who holds the store.
//!
//! - `<store>/store-v1/service.json` names the socket and the process
//!   while a service listens; it is written atomically once the socket is
//!   bound and removed when the service stops.
//! - `<store>/store-v1/run/service.lock` is held by the listening service
//!   for as long as it runs: a second service on the store is refused, and
//!   a `service.json` whose lock is free is stale (its process was killed).
//! - The socket is `<store>/store-v1/run/api.sock` (the folder is `0700`)
//!   when that path fits a socket address; otherwise `api.sock` in a
//!   folder made anew with a random name in the user's runtime folder (the
//!   platform layer decides; on Windows it is a named pipe with a random
//!   suffix). Nobody can take the name first or compute it.
//!
//! **How a client knows its service.** `service.json` (`0600`, in the
//! user's own `0700` folder) holds a random `secret` made anew by each
//! service. A client checks the socket and the process at the other end
//! before it sends a byte (see `platform::local_socket`), then sends
//! `hello` with a random `nonce`; the service answers with
//! [`proof`]`(secret, nonce)`, and its `pid`, which must be the one
//! `service.json` names. A service that cannot prove it holds the secret
//! gets nothing more: no manifest, no policy, no question.

use std::path::{Path, PathBuf};

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::api::protocol::{ServiceInfo, PROTOCOL};
use crate::error::{Error, Result};
use crate::store::atomic::Durability;
use crate::store::{lockfile, trust, Store};

/// The discovery file's name in `<store>/store-v1`.
pub const SERVICE_FILE: &str = "service.json";

/// What `service.json` holds.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceFile {
    /// The protocol the service speaks.
    pub protocol: u32,
    /// Its socket (or named pipe).
    pub socket: String,
    /// Its process.
    pub pid: u32,
    /// Its crate version.
    pub version: String,
    /// The secret with which its `hello` proves it is the store's service
    /// (hex; empty in files of earlier versions, whose service no client
    /// trusts).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
}

impl std::fmt::Debug for ServiceFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceFile")
            .field("protocol", &self.protocol)
            .field("socket", &self.socket)
            .field("pid", &self.pid)
            .field("version", &self.version)
            .field("secret", &"…")
            .finish()
    }
}

/// Bytes of randomness in a secret and a nonce.
const RANDOM_BYTES: usize = 32;

/// Longest `nonce` a service answers to.
pub const MAX_NONCE_CHARS: usize = 256;

/// Random bytes, hex: a service's secret, a client's nonce.
pub fn random_hex() -> Result<String> {
    let mut bytes = [0u8; RANDOM_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::Invalid(format!("the system gave no random bytes: {e}")))?;
    Ok(hex::encode(bytes))
}

/// What a service answers to `hello` with `nonce`: HMAC-SHA256 keyed with
/// its secret (the text of `service.json`'s `secret`) of
/// `"gem-resources hello\n"` followed by the nonce, hex.
pub fn proof(secret: &str, nonce: &str) -> String {
    hex::encode(hello_mac(secret, nonce).finalize().into_bytes())
}

/// Whether `answer` is [`proof`]`(secret, nonce)`, compared in constant
/// time; never for an empty secret.
pub fn proves(secret: &str, nonce: &str, answer: &str) -> bool {
    let Ok(answer) = hex::decode(answer) else {
        return false;
    };
    !secret.is_empty() && hello_mac(secret, nonce).verify_slice(&answer).is_ok()
}

fn hello_mac(secret: &str, nonce: &str) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(b"gem-resources hello\n");
    mac.update(nonce.as_bytes());
    mac
}

/// `<store>/store-v1/run`: the service's own folder, `0700`.
pub fn run_dir(store: &Store) -> PathBuf {
    store.root().join("run")
}

/// A 16-hex-digit name for the store, the same in every process.
pub fn store_key(store: &Store) -> String {
    let digest = Sha256::digest(store.root().as_os_str().as_encoded_bytes());
    hex::encode(&digest[..8])
}

/// The socket a service on `store` listens on by default (see the module's
/// documentation), and the folder made for it, if one was.
pub(crate) fn default_place(store: &Store) -> Result<crate::platform::local_socket::Place> {
    let inside = run_dir(store).join("api.sock");
    crate::platform::local_socket::choose_path(&inside, &store_key(store))
}

/// Holds the store for one service; released when dropped (its
/// `service.json` removed first).
#[derive(Debug)]
pub struct ServiceLock {
    _file: lockfile::Held,
    /// The store held: `service.json` is removed through its folder's
    /// handle.
    store: Store,
}

impl Drop for ServiceLock {
    fn drop(&mut self) {
        let _ = self.store.root_folder().remove_file(SERVICE_FILE);
    }
}

/// `run/`, created when missing, checked and opened through the handle of
/// `store-v1/` the store holds.
fn open_run(store: &Store) -> Result<crate::store::folder::Folder> {
    let run = run_dir(store);
    let root = store.root_folder();
    root.create_sub("run")
        .map_err(|e| Error::io("cannot create", &run, e))?;
    let folder = root
        .open_sub("run")
        .map_err(|e| Error::io("cannot open", &run, e))?;
    let meta = folder
        .metadata()
        .map_err(|e| Error::io("cannot read", &run, e))?;
    trust::check_folder_meta(&run, &meta)?;
    Ok(folder)
}

/// How long [`hold`] tries again before it says the store is busy: a
/// client asking [`live`] holds the lock for a moment as it looks.
const HOLD_PATIENCE: std::time::Duration = std::time::Duration::from_millis(100);

/// Takes the store for a service, or says which process holds it.
///
/// A lock found held is tried again for 100 ms: a client that
/// checks whether a service listens ([`live`]) takes the free lock for the
/// moment of its look, and a service starting then must not be refused.
pub fn hold(store: &Store, store_dir: &Path) -> Result<ServiceLock> {
    let run = open_run(store)?;
    let until = std::time::Instant::now() + HOLD_PATIENCE;
    loop {
        if let Some(file) = lockfile::try_lock_in(&run, "service.lock")? {
            return Ok(ServiceLock {
                _file: file,
                store: store.clone(),
            });
        }
        if std::time::Instant::now() >= until {
            let holder = read(store);
            return Err(Error::Busy {
                store: store_dir.to_path_buf(),
                pid: holder.as_ref().map_or(0, |f| f.pid),
                socket: holder.map(|f| f.socket),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Removes what a service killed on `store` left behind: the socket (and
/// the folder made for it) that a stale `service.json` names. Call with
/// the store held ([`hold`]), before listening.
pub fn clear_left_over(store: &Store, _lock: &ServiceLock) {
    if let Some(old) = read(store) {
        crate::platform::local_socket::remove_left_over(Path::new(&old.socket));
    }
}

/// Writes `service.json` for the holder of `lock`, with the secret its
/// `hello` proves.
pub fn publish(store: &Store, _lock: &ServiceLock, socket: &str, secret: &str) -> Result<()> {
    let file = ServiceFile {
        protocol: PROTOCOL,
        socket: socket.to_string(),
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        secret: secret.to_string(),
    };
    let bytes = serde_json::to_vec_pretty(&file)
        .map_err(|e| Error::Invalid(format!("cannot write {SERVICE_FILE}: {e}")))?;
    store
        .root_folder()
        .replace(SERVICE_FILE, ".service.", &bytes, Durability::Hint)
        .map_err(|e| Error::io(e.step, &e.path, e.error))
}

/// What `service.json` says, whether or not its service still runs.
pub fn read(store: &Store) -> Option<ServiceFile> {
    let bytes = store.root_folder().read_own(SERVICE_FILE, 64 * 1024).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The service listening on `store` now: its `service.json`, when the
/// lock says its process still holds the store.
pub fn live(store: &Store) -> Option<ServiceFile> {
    let file = read(store)?;
    if file.protocol != PROTOCOL {
        return None;
    }
    let run = store.root_folder().open_sub("run").ok()?;
    match lockfile::try_lock_in(&run, "service.lock") {
        // Free: nobody listens (a killed service left the file).
        Ok(Some(_released_on_drop)) => None,
        Ok(None) => Some(file),
        Err(_) => None,
    }
}

/// [`live`] as the status rows carry it.
pub fn info(store: &Store) -> Option<ServiceInfo> {
    live(store).map(|f| ServiceInfo {
        socket: f.socket,
        pid: f.pid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_starting_while_a_client_looks_is_not_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let run = open_run(&store).unwrap();
        // A client's look: the free lock held for a moment.
        let look = lockfile::try_lock_in(&run, "service.lock")
            .unwrap()
            .unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(look);
        });
        let held = hold(&store, dir.path());
        release.join().unwrap();
        let held = held.unwrap();
        // A service that keeps it is still reported.
        let e = hold(&store, dir.path()).unwrap_err();
        assert!(matches!(e, Error::Busy { .. }), "{e}");
        drop(held);
        hold(&store, dir.path()).unwrap();
    }
}
