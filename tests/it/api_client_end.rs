//! A client whose service went away: a call sent after the connection's
//! end fails at once, never waits for an answer nobody will send.

use std::time::Duration;

use gem_resources::api::Client;
use gem_resources::ErrorCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// A service that answers `hello`, then ends its side of the connection
/// (as a stopping service does) while still reading what it is sent:
/// the client's later writes succeed, and nothing ever answers them.
async fn service_that_stops_after_hello() -> (tempfile::TempDir, String) {
    let (dir, socket, listener) = crate::support::private_socket("grend");
    let pid = std::process::id();
    tokio::spawn(async move {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read);
        let mut line = String::new();
        if lines.read_line(&mut line).await.unwrap_or(0) > 0 {
            let request: Value = serde_json::from_str(&line).unwrap_or_default();
            let answer = json!({ "jsonrpc": "2.0", "id": request["id"], "result": {
                "protocol": 1, "version": "0.2.0", "store": "/", "pid": pid,
            }});
            let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
        }
        let _ = write.shutdown().await;
        let mut rest = Vec::new();
        let _ = lines.read_to_end(&mut rest).await;
    });
    let socket = socket.to_str().unwrap().to_string();
    (dir, socket)
}

#[tokio::test]
async fn a_call_sent_after_the_service_stopped_fails_at_once() {
    let (_dir, socket) = service_that_stops_after_hello().await;
    let client = Client::connect(&socket).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), client.closed())
        .await
        .expect("the client never saw the connection end");
    // `path` has no answer timeout of its own: it waits for a download.
    let outcome = tokio::time::timeout(Duration::from_secs(10), client.path("g", "r"))
        .await
        .expect("a path sent after the connection ended waited for an answer");
    let e = outcome.expect_err("no service answered, yet the call succeeded");
    assert_eq!(e.code(), ErrorCode::Service, "{e}");
    assert!(e.to_string().contains(&socket), "{e}");
}
