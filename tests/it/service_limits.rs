//! One client cannot exhaust the service for every app: connections are
//! capped below the limit of open files (the one idle the longest makes
//! room), a partial line and a silent connection are closed in time,
//! request bytes are bounded across connections, ids are bounded, a client
//! that never reads is closed, and the command line does not wait for a
//! service that does not answer.

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::support::api::{open_descriptors, rss_bytes, service_file, Line, Listening};
use crate::support::origin::{Behaviour, Gate};
use crate::support::*;

/// `serve` on `env`'s store and its gems folder, scanning every 0.2 s,
/// with at most `nofile` open files (soft and hard).
pub(crate) fn serve_limited(env: &Env, nofile: u64) -> Spawned {
    let gems = env.dir.path().join("gems");
    std::fs::create_dir_all(&gems).unwrap();
    let log = std::fs::File::create(env.dir.path().join("serve.log")).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"));
    command
        .arg("--config")
        .arg(env.dir.path().join("config.toml"))
        .args([
            "serve",
            "--gems",
            gems.to_str().unwrap(),
            "--interval",
            "0.2",
        ])
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs here.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: nofile as libc::rlim_t,
                rlim_max: nofile as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Spawned(command.spawn().unwrap())
}

/// [`serve_limited`], once it listens: the process, its pid and socket.
pub(crate) async fn listening_limited(env: &Env, nofile: u64) -> (Spawned, u32, String) {
    let serve = serve_limited(env, nofile);
    let pid = serve.0.id();
    let socket = service_file(&env.store_dir(), pid).await.socket;
    (serve, pid, socket)
}

/// A raw connection that said `hello` and was answered.
pub(crate) async fn said_hello(socket: &str) -> UnixStream {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    stream
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hello\"}\n")
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
        .await
        .expect("hello answered")
        .unwrap();
    assert!(n > 0, "hello answered");
    stream
}

/// Whether the server closed `stream` (reads to the end within `wait`).
pub(crate) async fn closed_within(stream: &mut UnixStream, wait: Duration) -> bool {
    let mut buf = vec![0u8; 64 * 1024];
    let end = Instant::now() + wait;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

fn log_of(env: &Env) -> String {
    std::fs::read_to_string(env.dir.path().join("serve.log")).unwrap_or_default()
}

#[tokio::test]
async fn idle_connections_past_the_cap_make_room_and_the_service_keeps_scanning() {
    let env = Env::new().await;
    // 600 open files: a cap of 88 connections (600 less 512 kept for the
    // store and the downloads).
    let (mut serve, pid, socket) = listening_limited(&env, 600).await;
    let baseline = open_descriptors(pid);
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(said_hello(&socket).await);
    }
    assert!(
        open_descriptors(pid) < 600 - 256,
        "connections stay below the limit: {} open",
        open_descriptors(pid)
    );
    // A new client is answered, the command line goes through the
    // service, and a folder scan still installs a gem.
    let mut fresh = Line::connect(&socket).await;
    assert_eq!(fresh.result("hello", json!({})).await["pid"], json!(pid));
    let body = bytes(10_000, 7);
    let url = env.serve("/late.bin", &body);
    write_gem_folder(&env, "late", json!([entry("late", &url, &body)]));
    let out = env.run(&["--json", "status"]).await;
    assert_eq!(out.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["service"]["pid"], json!(pid), "{doc}");
    wait_until("the scan installs the gem", || {
        std::fs::read_dir(env.store_dir().join("store-v1/gems"))
            .map(|d| d.count() > 0)
            .unwrap_or(false)
    })
    .await;
    let mut closed = 0;
    for stream in &mut idle {
        if closed_within(stream, Duration::from_millis(20)).await {
            closed += 1;
        }
    }
    eprintln!("300 idle connections at a cap of 88: {closed} closed to make room");
    assert!(
        closed >= 300 - 88,
        "the idlest made room: {closed} of 300 closed"
    );
    let log = log_of(&env);
    assert!(!log.contains("Too many open files"), "{log}");
    // Nothing leaks once the clients are gone.
    drop(idle);
    drop(fresh);
    wait_until("the descriptors are given back", || {
        open_descriptors(pid) <= baseline + 4
    })
    .await;
    signal_and_wait(&mut serve).await;
}

/// A new client's `hello` sent on a raw connection: the answer (`None`
/// when the service closed the connection) and how long it took.
pub(crate) async fn hello_answer(socket: &str) -> (Option<Value>, Duration) {
    let started = Instant::now();
    let mut stream = UnixStream::connect(socket).await.unwrap();
    // A connection refused at once may fail this write: it reads nothing.
    let _ = stream
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hello\"}\n")
        .await;
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(stream);
    let read = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::AsyncBufReadExt::read_line(&mut reader, &mut line),
    )
    .await
    .expect("the service did not answer within 20 s");
    let answer = match read {
        Ok(n) if n > 0 => Some(serde_json::from_str(&line).unwrap()),
        _ => None,
    };
    (answer, started.elapsed())
}

/// `serve` at a cap of 88 connections (600 open files), each with a call
/// in flight: a `path` waiting for one download, which the origin holds
/// until the gate returned opens. The connections are returned.
async fn every_connection_busy(env: &Env) -> (Spawned, String, Gate, Vec<Line>) {
    let body = bytes(10_000, 3);
    let gate = Gate::new();
    env.origin.route(
        "/held.bin",
        Behaviour::Gated {
            body: body.clone(),
            gate: gate.clone(),
        },
    );
    let url = env.url("origin.test", "/held.bin");
    let (serve, _pid, socket) = listening_limited(env, 600).await;
    let mut admin = Line::connect(&socket).await;
    let manifest = json!({ "resources": [entry("held", &url, &body)] });
    admin
        .result("install", json!({ "gem": "g", "manifest": manifest }))
        .await;
    // A `path`, then a `status` whose answer says the `path` was read and
    // is in flight.
    let path = b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"path\",\"params\":{\"gem\":\"g\",\"id\":\"held\"}}\n";
    let mut busy = vec![admin];
    for _ in 1..88 {
        busy.push(Line::connect(&socket).await);
    }
    for line in &mut busy {
        line.send_raw(path).await;
        line.result("status", json!({})).await;
    }
    wait_until("the download reaches the origin", || {
        env.origin.hits("/held.bin") > 0
    })
    .await;
    (serve, socket, gate, busy)
}

#[tokio::test]
async fn at_the_cap_a_new_client_gets_in_once_a_call_in_flight_is_answered() {
    let env = Env::new().await;
    let (mut serve, socket, gate, mut busy) = every_connection_busy(&env).await;
    // Room comes once the download ends and the calls are answered.
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        gate.open();
    });
    let (answer, took) = hello_answer(&socket).await;
    eprintln!("a new client at a cap of 88 busy connections: answered in {took:?}");
    let answer = answer.expect("a new client was closed while every call was in flight");
    assert!(answer.get("result").is_some(), "{answer}");
    release.await.unwrap();
    for line in &mut busy[1..] {
        if let Some(answer) = line.recv().await {
            assert!(answer["result"]["path"].is_string(), "{answer}");
        }
    }
    signal_and_wait(&mut serve).await;
}

#[tokio::test]
async fn clients_that_keep_every_connection_busy_hold_up_one_newcomer_not_each() {
    let env = Env::new().await;
    let (mut serve, socket, gate, mut busy) = every_connection_busy(&env).await;
    // The first newcomer waits for room, in vain.
    let (first, waited) = hello_answer(&socket).await;
    assert!(first.is_none(), "after {waited:?}: {first:?}");
    assert!(waited >= Duration::from_secs(3), "refused after {waited:?}");
    // The next ones are refused at once: the accept loop is not held 4 s
    // for each.
    for _ in 0..3 {
        let (next, took) = hello_answer(&socket).await;
        assert!(next.is_none(), "{next:?}");
        assert!(took < Duration::from_secs(2), "refused after {took:?}");
    }
    // Once the calls are answered, their connections make room again.
    gate.open();
    for line in &mut busy {
        let answer = line.recv().await.expect("a busy connection was closed");
        assert!(answer["result"]["path"].is_string(), "{answer}");
    }
    let (answer, _) = hello_answer(&socket).await;
    assert!(answer.is_some_and(|a| a.get("result").is_some()));
    signal_and_wait(&mut serve).await;
}

pub(crate) async fn signal_and_wait(serve: &mut Spawned) {
    crate::support::api::signal(serve, libc::SIGTERM);
    crate::support::api::exits(serve).await;
}

#[tokio::test]
async fn a_partial_line_and_a_silent_connection_are_closed_in_time() {
    let env = Env::new().await;
    let api = Listening::start(&env);
    let socket = api.socket();
    let started = Instant::now();
    let mut partial = UnixStream::connect(&socket).await.unwrap();
    partial.write_all(b"{\"jsonrpc\":\"2.0\",").await.unwrap();
    let mut silent = UnixStream::connect(&socket).await.unwrap();
    let mut talking = Line::connect(&socket).await;
    talking.result("hello", json!({})).await;

    // The partial line: a parse error saying why, then the end.
    let mut answer = String::new();
    let read =
        tokio::time::timeout(Duration::from_secs(20), partial.read_to_string(&mut answer)).await;
    assert!(read.is_ok(), "closed");
    let waited = started.elapsed();
    assert!(
        answer.contains("did not end within 5 s"),
        "{answer:?} after {waited:?}"
    );
    assert!(waited >= Duration::from_secs(4), "{waited:?}");
    // The silent one: closed after its first deadline.
    assert!(closed_within(&mut silent, Duration::from_secs(20)).await);
    assert!(started.elapsed() >= Duration::from_secs(9));
    // A connection that spoke stays, idle.
    assert_eq!(
        talking.result("hello", json!({})).await["protocol"],
        json!(1)
    );
    api.stop().await;
}

#[tokio::test]
async fn ids_are_a_bounded_string_or_a_number() {
    let env = Env::new().await;
    let api = Listening::start(&env);
    let mut client = api.client().await;
    let long = "i".repeat(300);
    for id in [json!(long), json!({ "a": 1 }), json!([1]), json!(true)] {
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": "hello" });
        client.send_raw(format!("{request}\n").as_bytes()).await;
        let answer = client.recv().await.unwrap();
        assert_eq!(answer["error"]["code"], json!(-32600), "{answer}");
        assert_eq!(answer["id"], Value::Null, "{answer}");
    }
    let fits = "i".repeat(256);
    let request = json!({ "jsonrpc": "2.0", "id": fits, "method": "hello" });
    client.send_raw(format!("{request}\n").as_bytes()).await;
    let answer = client.recv().await.unwrap();
    assert_eq!(answer["id"], json!(fits));
    assert_eq!(answer["result"]["protocol"], json!(1));
    api.stop().await;
}

#[tokio::test]
async fn request_bytes_are_bounded_however_many_connections_send_them() {
    let env = Env::new().await;
    let (mut serve, pid, socket) = listening_limited(&env, 4096).await;
    drop(said_hello(&socket).await);
    let before = rss_bytes(pid);
    // 250 connections, each sending a line of almost 1 MiB and never its
    // end: 250 MiB that a service without a bound on bytes would hold.
    let line = vec![b'x'; (1 << 20) - 64];
    let mut senders = Vec::new();
    for _ in 0..250 {
        let mut stream = UnixStream::connect(&socket).await.unwrap();
        let line = line.clone();
        senders.push(tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(8), stream.write_all(&line)).await;
            stream
        }));
    }
    let mut peak = 0;
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        peak = peak.max(rss_bytes(pid));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Meanwhile a client is answered.
    let mut fresh = Line::connect(&socket).await;
    assert_eq!(fresh.result("hello", json!({})).await["pid"], json!(pid));
    let grew = peak.saturating_sub(before);
    eprintln!(
        "250 partial lines of 1 MiB: the service grew by {} MiB",
        grew >> 20
    );
    assert!(
        grew < 200 << 20,
        "the service grew by {} MiB holding partial lines",
        grew >> 20
    );
    // Each is closed at its deadline, and the bytes are given back.
    for sender in senders {
        let mut stream = sender.await.unwrap();
        assert!(closed_within(&mut stream, Duration::from_secs(30)).await);
    }
    signal_and_wait(&mut serve).await;
}

#[tokio::test]
async fn a_client_that_never_reads_is_closed_and_holds_bounded_memory() {
    let env = Env::new().await;
    let (mut serve, pid, socket) = listening_limited(&env, 4096).await;
    drop(said_hello(&socket).await);
    let before = rss_bytes(pid);
    // Requests with ids of 512 KiB (refused, each answered), then many
    // whose answers it never reads.
    let mut stream = UnixStream::connect(&socket).await.unwrap();
    let huge_id = "d".repeat(512 << 10);
    let mut requests = b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"hello\"}\n".to_vec();
    for n in 0..40 {
        let id = if n % 2 == 0 { json!(huge_id) } else { json!(n) };
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": "status" });
        requests.extend_from_slice(format!("{request}\n").as_bytes());
    }
    for n in 0..20_000 {
        let request = json!({ "jsonrpc": "2.0", "id": n, "method": "hello" });
        requests.extend_from_slice(format!("{request}\n").as_bytes());
    }
    // It stops reading requests once its answers are not read, and
    // closes the connection: the writes then fail.
    let writer = tokio::spawn(async move {
        let _ = stream.write_all(&requests).await;
        while stream.write_all(b"\n").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut peak = rss_bytes(pid);
    let started = Instant::now();
    while !writer.is_finished() {
        assert!(started.elapsed() < Duration::from_secs(60), "never closed");
        peak = peak.max(rss_bytes(pid));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let grew = peak.saturating_sub(before);
    eprintln!(
        "a client that never reads: closed after {:?}, the service grew by {} MiB",
        started.elapsed(),
        grew >> 20
    );
    assert!(
        grew < 64 << 20,
        "the service grew by {} MiB for one client",
        grew >> 20
    );
    let mut fresh = Line::connect(&socket).await;
    assert_eq!(fresh.result("hello", json!({})).await["pid"], json!(pid));
    signal_and_wait(&mut serve).await;
}

#[tokio::test]
async fn the_cli_does_not_wait_for_a_service_that_does_not_answer() {
    let env = Env::new().await;
    let store = gem_resources::Store::open(&env.store_dir()).unwrap();
    let lock = gem_resources::api::discovery::hold(&store, &env.store_dir()).unwrap();
    // A service that accepts and never answers, named by service.json.
    let (_dir, socket, listener) = private_socket("grmute");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let file = json!({
        "protocol": 1, "socket": socket.to_str().unwrap(), "pid": std::process::id(),
        "version": "0.2.0", "secret": "s".repeat(64),
    });
    std::fs::write(
        store.root().join("service.json"),
        serde_json::to_vec(&file).unwrap(),
    )
    .unwrap();
    let started = Instant::now();
    let out = env.run(&["--json", "status"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        stderr.contains("no answer to hello within 5 s") && stderr.contains("in process"),
        "{stderr}"
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], json!(true));
    drop(lock);
}

#[tokio::test]
async fn a_dropped_client_closes_its_connection_on_both_sides() {
    let env = Env::new().await;
    let mut serve = serve_limited(&env, 4096);
    let pid = serve.0.id();
    service_file(&env.store_dir(), pid).await;
    let store = gem_resources::Store::open(&env.store_dir()).unwrap();
    let warm = gem_resources::api::Client::for_store(&store).await.unwrap();
    warm.status(None).await.unwrap();
    drop(warm);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (theirs, ours) = (open_descriptors(pid), open_descriptors(std::process::id()));
    for _ in 0..20 {
        let client = gem_resources::api::Client::for_store(&store).await.unwrap();
        client.status(None).await.unwrap();
        drop(client);
    }
    wait_until("the service closes the 20 connections", || {
        open_descriptors(pid) <= theirs + 2
    })
    .await;
    // This process's own descriptors: the test runs beside others, so
    // only a leak of all twenty would show.
    assert!(
        open_descriptors(std::process::id()) < ours + 20,
        "the client process kept its sockets"
    );
    signal_and_wait(&mut serve).await;
}
