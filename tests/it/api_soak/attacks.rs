//! What one client of the soak tries on everyone, during the faults: batches
//! it never reads, a flood of subscriptions, an `autofill` it leaves in the
//! middle, and policy changes sent in one write. Checked while each attack
//! holds: a new client gets its `hello` answered within [`GET_IN`]; an
//! abandoned `autofill` stops reading its address; the changes of one
//! connection apply in the order sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gem_resources::api::discovery;
use gem_resources::Store;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::world::Rng;
use super::{ms, Shared};
use crate::support::origin::{Behaviour, OriginHandle};
use crate::support::Spawned;

/// How long a new client may wait for its `hello` while an attack holds.
const GET_IN: Duration = Duration::from_secs(1);
/// How long an attack holds its connections.
const HOLD: Duration = Duration::from_millis(1500);
/// Bytes an abandoned `autofill` may still read once its client has been
/// gone a second (what was in flight).
const AFTER_LEAVING: u64 = 64 << 10;
/// The host the attacks read from: never blocked by the other clients.
const HOST: &str = "mirror.test";

/// A request line.
fn request(id: u64, method: &str, params: Value) -> String {
    format!(
        "{}\n",
        json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
    )
}

const HELLO: &str = "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"hello\"}\n";

/// The socket of the `serve` listening now, if one is.
fn socket(store: &Store) -> Option<(String, u32)> {
    discovery::read(store).map(|f| (f.socket, f.pid))
}

/// Connects and writes `lines`; `None` when the service is away.
async fn open(socket: &str, lines: &str) -> Option<UnixStream> {
    let mut stream = tokio::time::timeout(Duration::from_secs(2), UnixStream::connect(socket))
        .await
        .ok()?
        .ok()?;
    tokio::time::timeout(Duration::from_secs(2), stream.write_all(lines.as_bytes()))
        .await
        .ok()?
        .ok()?;
    Some(stream)
}

/// The time a new client's `hello` took to be answered; `None` when the
/// service went away meanwhile (a restart of the soak's).
async fn get_in(socket: &str) -> Option<Duration> {
    let began = Instant::now();
    let stream = open(socket, HELLO).await?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    match tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut line)).await {
        Ok(Ok(n)) if n > 0 => Some(began.elapsed()),
        Ok(_) => None,
        Err(_) => Some(began.elapsed()),
    }
}

/// One attacker after another until `until`, each attack picked at random.
pub(super) async fn attacker(
    shared: Arc<Shared>,
    store: Store,
    origin: OriginHandle,
    seed: u64,
    until: Instant,
) {
    let mut rng = Rng::new(seed);
    let mut round = 0;
    while Instant::now() < until {
        round += 1;
        let Some((socket, pid)) = socket(&store) else {
            tokio::time::sleep(ms(200)).await;
            continue;
        };
        let held = match rng.below(4) {
            0 => unread_batches(&socket).await,
            1 => subscription_flood(&socket).await,
            2 => abandoned_autofill(&shared, &socket, &origin, round).await,
            _ => pipelined_policies(&shared, &socket, round).await,
        };
        let Some((attack, held)) = held else {
            continue;
        };
        shared.count(&format!("attack: {attack}"));
        // While it holds, a new client still gets in.
        if let Some(took) = get_in(&socket).await {
            let same = socket_of(&store) == Some(pid);
            shared.add("attack: get-in probes", 1);
            let worst = shared.counted("attack: slowest get-in (ms)");
            let took_ms = took.as_millis() as u64;
            if took_ms > worst {
                shared.add("attack: slowest get-in (ms)", took_ms - worst);
            }
            if took > GET_IN && same {
                shared.violation(format!(
                    "a new client waited {took:?} for its hello during {attack} (bound {GET_IN:?})"
                ));
            }
        }
        tokio::time::sleep(HOLD).await;
        drop(held);
        tokio::time::sleep(ms(100 + rng.below(400))).await;
    }
}

/// The pid of the `serve` listening now.
fn socket_of(store: &Store) -> Option<u32> {
    socket(store).map(|(_, pid)| pid)
}

/// What an attack holds until it ends, with its name.
type Attack = (&'static str, Held);

/// What an attack holds: its connections, or its process.
enum Held {
    Connections { _open: Vec<UnixStream> },
    Process { _child: Spawned },
}

/// Sixteen batches of 64 `status` calls in one write, never read, from a
/// process of their own (a limit belongs to a process: this one's other
/// clients would share it); `None` without python3.
async fn unread_batches(socket: &str) -> Option<Attack> {
    let batch: Vec<Value> = (0..64)
        .map(|n| json!({ "jsonrpc": "2.0", "id": n + 1, "method": "status" }))
        .collect();
    let mut lines = HELLO.to_string();
    for _ in 0..16 {
        lines.push_str(&format!("{}\n", Value::Array(batch.clone())));
    }
    let script = "import socket, sys, time\n\
s = socket.socket(socket.AF_UNIX)\n\
s.connect(sys.argv[1])\n\
s.sendall(sys.stdin.buffer.read())\n\
time.sleep(float(sys.argv[2]))\n";
    let mut child = std::process::Command::new("python3")
        .args(["-c", script, socket, "60"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let stdin = child.stdin.take();
    let child = Spawned(child);
    std::io::Write::write_all(&mut stdin?, lines.as_bytes()).ok()?;
    // Until its bytes are read by the service.
    tokio::time::sleep(ms(300)).await;
    Some(("unread batches", Held::Process { _child: child }))
}

/// 48 connections from this process, each holding a subscription.
async fn subscription_flood(socket: &str) -> Option<Attack> {
    let mut held = Vec::new();
    let lines = format!("{HELLO}{}", request(1, "subscribe", json!({})));
    for _ in 0..48 {
        held.push(open(socket, &lines).await?);
    }
    Some(("subscription flood", Held::Connections { _open: held }))
}

/// An `autofill` of a slow file, left once bytes flow: the service stops
/// reading it.
async fn abandoned_autofill(
    shared: &Shared,
    socket: &str,
    origin: &OriginHandle,
    round: usize,
) -> Option<Attack> {
    let path = format!("/attack/autofill-{round}.bin");
    origin.route(
        &path,
        Behaviour::Ranged {
            body: vec![7; 4 << 20],
            etag: format!("\"a{round}\""),
            ignore_range: false,
            cut_at: None,
            hold: false,
            pace: Some((16 << 10, Duration::from_millis(100))),
        },
    );
    let url = origin.url(HOST, &path);
    let lines = format!("{HELLO}{}", request(1, "autofill", json!({ "url": url })));
    let stream = open(socket, &lines).await?;
    let began = Instant::now();
    while origin.served(&path) == 0 && began.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(ms(20)).await;
    }
    let flowing = origin.served(&path) > 0;
    drop(stream);
    if !flowing {
        return None;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let gone = origin.served(&path);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = origin.served(&path);
    if later > gone + AFTER_LEAVING {
        shared.violation(format!(
            "an autofill of {url} read {} more bytes in the 2 s after its client had been gone a second",
            later - gone
        ));
    }
    Some((
        "abandoned autofill",
        Held::Connections { _open: Vec::new() },
    ))
}

/// A subscription, then four policy changes in one write: their
/// `policy_changed` events come in the order sent. Each change lists a
/// count of made-up hosts no other client uses (blocking nothing real).
async fn pipelined_policies(shared: &Shared, socket: &str, round: usize) -> Option<Attack> {
    let counts: Vec<usize> = (0..4).map(|k| 20 + (round % 50) * 4 + k).collect();
    let mut lines = format!("{HELLO}{}", request(1, "subscribe", json!({})));
    for (k, n) in counts.iter().enumerate() {
        let hosts: Vec<String> = (0..*n)
            .map(|h| format!("h{h}.order-{round}.invalid"))
            .collect();
        let params = json!({ "mode": "blocklist", "hosts": hosts });
        lines.push_str(&request(2 + k as u64, "set_policy", params));
    }
    let stream = open(socket, &lines).await?;
    let mut reader = BufReader::new(stream);
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.len() < counts.len() && Instant::now() < deadline {
        let mut line = String::new();
        let read = tokio::time::timeout_at(deadline.into(), reader.read_line(&mut line)).await;
        let Ok(Ok(n)) = read else { return None };
        if n == 0 {
            // The service went away (a restart of the soak's).
            return None;
        }
        let message: Value = serde_json::from_str(&line).unwrap_or_default();
        let event = &message["params"];
        if event["event"] == json!("policy_changed") {
            let hosts = event["new_hosts"].as_u64().unwrap_or(0) as usize;
            if counts.contains(&hosts) {
                seen.push(hosts);
            }
        }
    }
    if seen.len() == counts.len() && seen != counts {
        shared.violation(format!(
            "four policy changes sent in one write applied as {seen:?}, sent as {counts:?}"
        ));
    }
    Some((
        "pipelined policies",
        Held::Connections {
            _open: vec![reader.into_inner()],
        },
    ))
}
