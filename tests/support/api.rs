//! The local API's fixture: a service listening on an [`Env`]'s store, and
//! a raw line client that speaks JSON-RPC to it as any other language
//! would.

use std::time::Duration;

use gem_resources::api::ApiServer;
use gem_resources::Resources;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use crate::support::Env;

/// A service on the env's store, listening on its default socket.
pub struct Listening {
    /// The service.
    pub service: Resources,
    /// Its API.
    pub server: Option<ApiServer>,
}

impl Listening {
    /// Opens the service on `env`'s configuration and store and listens.
    pub fn start(env: &Env) -> Listening {
        let service = Resources::open(&env.config()).unwrap();
        let server = service.listen().unwrap();
        Listening {
            service,
            server: Some(server),
        }
    }

    /// The socket clients connect to.
    pub fn socket(&self) -> String {
        self.server.as_ref().unwrap().socket().to_string()
    }

    /// A new raw client.
    pub async fn client(&self) -> Line {
        Line::connect(&self.socket()).await
    }

    /// Stops the API, then the service.
    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
        self.service.shutdown().await;
    }
}

/// A client that writes request lines and reads answer lines.
pub struct Line {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    next_id: u64,
}

impl Line {
    /// Connects to `socket` and says `hello`, a connection's first call.
    pub async fn connect(socket: &str) -> Line {
        let mut line = Line::connect_silent(socket).await;
        line.result("hello", json!({})).await;
        line
    }

    /// Connects to `socket` and sends nothing.
    pub async fn connect_silent(socket: &str) -> Line {
        let stream = UnixStream::connect(socket).await.unwrap();
        let (read, writer) = stream.into_split();
        Line {
            reader: BufReader::new(read),
            writer,
            next_id: 1,
        }
    }

    /// Writes `bytes` as they are.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).await.unwrap();
    }

    /// The next line from the server as JSON; `None` once it closed.
    pub async fn recv(&mut self) -> Option<Value> {
        let mut line = String::new();
        let read = tokio::time::timeout(Duration::from_secs(20), self.reader.read_line(&mut line))
            .await
            .expect("the service did not answer within 20 s");
        match read {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(serde_json::from_str(&line).unwrap()),
        }
    }

    /// Calls `method` and returns the whole answer (`result` or `error`),
    /// skipping notifications.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        self.send_raw(format!("{request}\n").as_bytes()).await;
        loop {
            let message = self
                .recv()
                .await
                .expect("the service closed the connection");
            if message.get("id") == Some(&json!(id)) {
                return message;
            }
        }
    }

    /// Calls `method` and returns its `result`, failing on an error.
    pub async fn result(&mut self, method: &str, params: Value) -> Value {
        let answer = self.call(method, params).await;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }
}

/// The `service.json` of the service `pid` on the store `store`, once it
/// has written one (at most 10 s).
pub async fn service_file(
    store: &std::path::Path,
    pid: u32,
) -> gem_resources::api::discovery::ServiceFile {
    let file = store.join("store-v1/service.json");
    for _ in 0..1000 {
        if let Ok(bytes) = std::fs::read(&file) {
            if let Ok(found) =
                serde_json::from_slice::<gem_resources::api::discovery::ServiceFile>(&bytes)
            {
                if found.pid == pid {
                    return found;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no service.json for process {pid} in {}", store.display());
}

/// Waits (at most 10 s) for `child` to exit.
pub async fn exits(child: &mut crate::support::Spawned) {
    for _ in 0..1000 {
        if child.0.try_wait().unwrap().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the process did not exit");
}

/// Sends `sig` to `child`.
pub fn signal(child: &crate::support::Spawned, sig: libc::c_int) {
    // SAFETY: kill with a pid of our own child.
    unsafe { libc::kill(child.0.id() as i32, sig) };
}

/// The resident memory of process `pid`, in bytes (Linux; 0 elsewhere).
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The open descriptors of process `pid` (Linux; 0 elsewhere).
pub fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}
