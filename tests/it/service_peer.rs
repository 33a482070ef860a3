//! Who a client talks to: a socket outside the store that nobody can name
//! or take first, and clients that send nothing to a service that is not
//! the store's own (the socket's owner, the process at the other end, and
//! `hello`'s proof of the store's secret).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gem_resources::api::discovery::{self, ServiceFile};
use gem_resources::api::Client;
use gem_resources::{ErrorCode, Store};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::support::api::{exits, service_file, signal};
use crate::support::{Env, Spawned};

/// A store path too long for a socket address inside it.
fn long_store(env: &Env) -> PathBuf {
    let store = env.dir.path().join("s".repeat(60)).join("t".repeat(60));
    let config = env.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "store = \"store\"",
        &format!("store = \"{}\"", store.display()),
    );
    std::fs::write(&config, text).unwrap();
    store
}

/// `serve` with `tmp` as its temporary folder and no runtime folder.
fn serve_in(env: &Env, tmp: &Path) -> Spawned {
    let gems = env.dir.path().join("gems");
    std::fs::create_dir_all(&gems).unwrap();
    let log = std::fs::File::create(env.dir.path().join("serve.log")).unwrap();
    Spawned(
        std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .arg("--config")
            .arg(env.dir.path().join("config.toml"))
            .args(["serve", "--gems", gems.to_str().unwrap()])
            .env("TMPDIR", tmp)
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// The folder made for a socket: `gem-resources-` and 24 hex digits,
/// `0700`, this user's.
fn check_own_folder(socket: &Path, tmp: &Path) -> PathBuf {
    let folder = socket.parent().unwrap().to_path_buf();
    assert_eq!(folder.parent().unwrap(), tmp, "{}", socket.display());
    let name = folder.file_name().unwrap().to_str().unwrap();
    let random = name.strip_prefix("gem-resources-").unwrap_or_default();
    assert!(
        random.len() == 24 && random.chars().all(|c| c.is_ascii_hexdigit()),
        "{name}"
    );
    let meta = std::fs::symlink_metadata(&folder).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o700);
    // SAFETY: geteuid cannot fail.
    assert_eq!(meta.uid(), unsafe { libc::geteuid() });
    folder
}

#[tokio::test]
async fn a_socket_outside_the_store_lives_in_a_folder_nobody_can_name_or_take_first() {
    let env = Env::new().await;
    let store = long_store(&env);
    let tmp = env.dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    // The names earlier versions used, taken first by someone else: never
    // in the way.
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    for squatted in [format!("gem-resources-{uid}"), "gem-resources".into()] {
        let dir = tmp.join(squatted);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        if uid == 0 {
            // Another user's (nobody's), as a squatter's would be.
            let path = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
            // SAFETY: a valid path; chown of a folder this test made.
            assert_eq!(unsafe { libc::chown(path.as_ptr(), 65534, 65534) }, 0);
        }
    }

    let mut first = serve_in(&env, &tmp);
    let file = service_file(&store, first.0.id()).await;
    let first_folder = check_own_folder(Path::new(&file.socket), &tmp);
    assert_eq!(file.secret.len(), 64, "a secret of 32 random bytes, hex");
    let mode = std::fs::metadata(store.join("store-v1/service.json"))
        .unwrap()
        .mode();
    assert_eq!(
        mode & 0o077,
        0,
        "service.json is readable by its user alone"
    );
    // The command line finds it and uses it.
    let out = env.run(&["--json", "status"]).await;
    assert_eq!(out.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["service"]["socket"], json!(file.socket), "{doc}");
    // Stopped: the socket and its folder are gone.
    signal(&first, libc::SIGTERM);
    exits(&mut first).await;
    assert!(!first_folder.exists());

    // Each start makes a new name; one killed leaves a folder that the
    // next start removes.
    let mut second = serve_in(&env, &tmp);
    let file = service_file(&store, second.0.id()).await;
    let second_folder = check_own_folder(Path::new(&file.socket), &tmp);
    assert_ne!(second_folder, first_folder);
    signal(&second, libc::SIGKILL);
    exits(&mut second).await;
    assert!(second_folder.exists());
    let mut third = serve_in(&env, &tmp);
    let file = service_file(&store, third.0.id()).await;
    let third_folder = check_own_folder(Path::new(&file.socket), &tmp);
    assert_ne!(third_folder, second_folder);
    assert!(
        !second_folder.exists(),
        "the killed service's folder is removed"
    );
    signal(&third, libc::SIGTERM);
    exits(&mut third).await;
}

/// A fake service: records every byte it is sent, and answers `hello`
/// with `answer(nonce)` as its `proof` and `pid`.
struct Impostor {
    socket: PathBuf,
    received: Arc<Mutex<Vec<u8>>>,
    connections: Arc<Mutex<usize>>,
    _dir: tempfile::TempDir,
}

impl Impostor {
    fn start(pid: u32, proof: impl Fn(&str) -> String + Send + Sync + 'static) -> Impostor {
        let (dir, socket, listener) = crate::support::private_socket("grimp");
        let received = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(Mutex::new(0));
        let (seen, count) = (received.clone(), connections.clone());
        let proof = Arc::new(proof);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                *count.lock().unwrap() += 1;
                let (seen, proof) = (seen.clone(), proof.clone());
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut lines = BufReader::new(read);
                    let mut line = String::new();
                    while lines.read_line(&mut line).await.unwrap_or(0) > 0 {
                        seen.lock().unwrap().extend_from_slice(line.as_bytes());
                        let request: Value = serde_json::from_str(&line).unwrap_or_default();
                        let nonce = request["params"]["nonce"].as_str().unwrap_or_default();
                        let answer = json!({ "jsonrpc": "2.0", "id": request["id"], "result": {
                            "protocol": 1, "version": "0.2.0", "store": "/", "pid": pid,
                            "proof": proof(nonce),
                        }});
                        let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
                        line.clear();
                    }
                    let mut rest = Vec::new();
                    let _ = lines.read_to_end(&mut rest).await;
                    seen.lock().unwrap().extend_from_slice(&rest);
                });
            }
        });
        Impostor {
            socket,
            received,
            connections,
            _dir: dir,
        }
    }

    fn file(&self, pid: u32, secret: &str) -> ServiceFile {
        serde_json::from_value(json!({
            "protocol": 1, "socket": self.socket.to_str().unwrap(), "pid": pid,
            "version": "0.2.0", "secret": secret,
        }))
        .unwrap()
    }

    fn lines(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.received.lock().unwrap())
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn refused(outcome: gem_resources::Result<Client>, says: &str) {
    let e = outcome.expect_err("the client must refuse");
    assert_eq!(e.code(), ErrorCode::Service, "{e}");
    assert!(e.to_string().contains(says), "{e}");
}

#[tokio::test]
async fn a_client_sends_nothing_but_hello_to_a_service_that_cannot_prove_the_stores_secret() {
    let me = std::process::id();
    let secret = "s".repeat(64);
    let impostor = Impostor::start(me, |_| "00".repeat(32));
    refused(
        Client::connect_to(&impostor.file(me, &secret)).await,
        "did not prove",
    );
    let lines = impostor.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["method"], "hello");
    assert_eq!(lines[0]["params"]["nonce"].as_str().unwrap().len(), 64);

    // A file of an earlier version, with no secret: nothing is sent.
    let quiet = Impostor::start(me, |_| String::new());
    refused(Client::connect_to(&quiet.file(me, "")).await, "no secret");
    assert!(quiet.lines().is_empty());

    // Told the secret, the same server is trusted: the check is the proof.
    let known = secret.clone();
    let honest = Impostor::start(me, move |nonce| discovery::proof(&known, nonce));
    let client = Client::connect_to(&honest.file(me, &secret)).await.unwrap();
    assert_eq!(client.hello().await.unwrap().pid, me);
}

#[tokio::test]
async fn a_client_sends_nothing_to_a_process_other_than_the_one_service_json_names() {
    let me = std::process::id();
    let secret = "k".repeat(64);
    let known = secret.clone();
    // It even knows the secret: the process at the other end is not the
    // one named, so not a byte is sent.
    let impostor = Impostor::start(me, move |nonce| discovery::proof(&known, nonce));
    refused(
        Client::connect_to(&impostor.file(1, &secret)).await,
        "not the service 1",
    );
    // It did connect (to ask the kernel who listens), and sent nothing.
    for _ in 0..200 {
        if *impostor.connections.lock().unwrap() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(*impostor.connections.lock().unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(impostor.lines().is_empty());
}

#[tokio::test]
async fn a_client_sends_nothing_to_a_socket_in_a_folder_open_to_others_or_of_another_user() {
    let me = std::process::id();
    let secret = "k".repeat(64);
    let known = secret.clone();
    let impostor = Impostor::start(me, move |nonce| discovery::proof(&known, nonce));
    let folder = impostor.socket.parent().unwrap().to_path_buf();
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
    refused(
        Client::connect_to(&impostor.file(me, &secret)).await,
        "open to others",
    );
    refused(
        Client::connect(impostor.socket.to_str().unwrap()).await,
        "open to others",
    );
    assert_eq!(*impostor.connections.lock().unwrap(), 0);
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o700)).unwrap();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED the other user's socket: needs root (CI runs as root)");
        return;
    }
    // Another user's socket and folder (uid 65534, nobody).
    let path = std::ffi::CString::new(impostor.socket.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; chown of a file this test made.
    assert_eq!(unsafe { libc::chown(path.as_ptr(), 65534, 65534) }, 0);
    refused(
        Client::connect_to(&impostor.file(me, &secret)).await,
        "belongs to user 65534",
    );
    let folder_c = std::ffi::CString::new(folder.to_str().unwrap()).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::chown(folder_c.as_ptr(), 65534, 65534) }, 0);
    assert_eq!(unsafe { libc::chown(path.as_ptr(), 0, 0) }, 0);
    refused(
        Client::connect_to(&impostor.file(me, &secret)).await,
        "not this user's own",
    );
    assert_eq!(*impostor.connections.lock().unwrap(), 0);
}

#[tokio::test]
async fn the_cli_works_in_process_and_says_why_when_the_service_fails_its_checks() {
    let env = Env::new().await;
    let store = Store::open(&env.store_dir()).unwrap();
    let me = std::process::id();
    let impostor = Impostor::start(me, |_| "00".repeat(32));
    // A service.json naming the impostor, with the store's lock held (as
    // by a live service): the CLI asks the impostor for proof, gets none,
    // and reads the store itself.
    let lock = discovery::hold(&store, &env.store_dir()).unwrap();
    let file = impostor.file(me, &"z".repeat(64));
    std::fs::write(
        store.root().join("service.json"),
        serde_json::to_vec(&file).unwrap(),
    )
    .unwrap();
    let out = env.run(&["--json", "status"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("did not prove"), "{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], json!(true), "{doc}");
    let lines = impostor.lines();
    assert!(lines.iter().all(|l| l["method"] == "hello"), "{lines:?}");
    drop(lock);
}
