//! Cancelling a call stops its work: a `path` asked again right after a
//! cancelled one gets the file (continued from the kept bytes), never the
//! dying download; an `autofill` whose client left, or that
//! `$/cancelRequest` cancelled while it waited for a connection to its
//! host, reads nothing more; a download another process waits for through
//! the store's lock is continued there when it is cancelled here.

use std::time::Duration;

use gem_resources::api::Client;
use gem_resources::CancellationToken;
use serde_json::{json, Value};

use crate::support::api::{Line, Listening};
use crate::support::*;

use crate::api_cancel::slow_file;

/// Writes a config whose hosts take `per_host` connections at once.
fn per_host(env: &Env, per_host: usize) {
    env.write_config_full(
        "",
        &format!("[service]\nmax_per_host = {per_host}\nmax_concurrent_downloads = 8\n"),
    );
}

/// Whether the origin stops sending `path` (its count stays the same for
/// half a second, within 5 s).
async fn stops_sending(env: &Env, path: &str) -> bool {
    for _ in 0..10 {
        let before = env.origin.served(path);
        tokio::time::sleep(Duration::from_millis(500)).await;
        if env.origin.served(path) == before {
            return true;
        }
    }
    false
}

/// Sends `autofill` of `url` with the request id `call`.
async fn ask_autofill(client: &mut Line, call: u64, url: &url::Url) {
    let request = json!({ "jsonrpc": "2.0", "id": call, "method": "autofill", "params": { "url": url.as_str() } });
    client.send_raw(format!("{request}\n").as_bytes()).await;
}

/// The answer to `call`, skipping anything else.
async fn answer_to(client: &mut Line, call: u64) -> Value {
    loop {
        let message = client.recv().await.expect("an answer");
        if message["id"] == json!(call) {
            return message;
        }
    }
}

/// Whether a `Range` request for the rest of the file (from a byte past 0)
/// reached the origin.
fn resumed(env: &Env, path: &str) -> bool {
    env.origin
        .ranges(path)
        .iter()
        .any(|r| r.starts_with("bytes=") && !r.starts_with("bytes=0-"))
}

#[tokio::test]
async fn a_path_right_after_a_cancelled_path_gets_the_file_resumed() {
    let env = Env::new().await;
    let (url, body) = slow_file(&env, "/big.bin", 2_000_000, 81);
    let api = Listening::start(&env);
    let app = Client::connect(&api.socket()).await.unwrap();
    let manifest = env.write_manifest("g.json", json!([entry("big", &url, &body)]));
    app.install("g", &manifest).await.unwrap();
    let tool = std::sync::Arc::new(Client::connect(&api.socket()).await.unwrap());
    let cancel = CancellationToken::new();
    let waiting = {
        let (tool, cancel) = (tool.clone(), cancel.clone());
        tokio::spawn(async move { tool.path_until("g", "big", &cancel).await })
    };
    wait_until("the download runs", || {
        env.origin.served("/big.bin") > 100_000
    })
    .await;
    cancel.cancel();
    let cancelled = waiting.await.unwrap().unwrap_err();
    assert_eq!(
        cancelled.code(),
        gem_resources::ErrorCode::Cancelled,
        "{cancelled}"
    );
    // At once, no gap: the next call for the same file.
    let path = within("the next path", tool.path("g", "big"))
        .await
        .expect("the next path gets the file");
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(
        resumed(&env, "/big.bin"),
        "continued from the kept bytes: {:?}",
        env.origin.ranges("/big.bin")
    );
    api.stop().await;
}

#[tokio::test]
async fn path_after_ctrl_c_of_path_gets_the_file_at_once() {
    let env = Env::new().await;
    let (url, body) = slow_file(&env, "/cli.bin", 2_000_000, 82);
    let api = Listening::start(&env);
    let mut app = api.client().await;
    app.result(
        "install",
        json!({ "gem": "g", "manifest": { "resources": [entry("c", &url, &body)] } }),
    )
    .await;
    let log = env.dir.path().join("path.log");
    let mut child = spawn_quiet(&env, &["path", "g", "c"], &log);
    wait_until("the download runs", || {
        env.origin.served("/cli.bin") > 100_000
    })
    .await;
    crate::support::api::signal(&child, libc::SIGINT);
    // The same command again the moment the first has exited.
    let config = env.dir.path().join("config.toml");
    let out = tokio::task::spawn_blocking(move || {
        child.0.wait().unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .arg("--config")
            .arg(config)
            .args(["path", "g", "c"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read(stdout(&out).trim()).unwrap(), body);
    assert!(
        resumed(&env, "/cli.bin"),
        "continued from the kept bytes: {:?}",
        env.origin.ranges("/cli.bin")
    );
    api.stop().await;
}

#[tokio::test]
async fn autofills_of_a_client_that_left_stop_and_the_queued_never_start() {
    let env = Env::new().await;
    per_host(&env, 2);
    let files: Vec<(String, url::Url)> = (0..4)
        .map(|n| {
            let path = format!("/fill{n}.bin");
            let (url, _) = slow_file(&env, &path, 4_000_000, 90 + n as u8);
            (path, url)
        })
        .collect();
    let api = Listening::start(&env);
    let mut tool = api.client().await;
    for (n, (_, url)) in files.iter().enumerate() {
        ask_autofill(&mut tool, n as u64 + 1, url).await;
    }
    wait_until("two autofills read", || {
        files
            .iter()
            .filter(|(path, _)| env.origin.served(path) > 50_000)
            .count()
            == 2
    })
    .await;
    drop(tool);
    for (path, _) in &files {
        assert!(stops_sending(&env, path).await, "{path} still read");
    }
    // Long enough for a queued call to take a freed connection.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked: Vec<usize> = files
        .iter()
        .map(|(path, _)| env.origin.hits(path))
        .collect();
    assert_eq!(
        asked.iter().filter(|&&h| h > 0).count(),
        2,
        "only the two running autofills reached the origin: {asked:?}"
    );
    api.stop().await;
}

#[tokio::test]
async fn a_queued_autofill_cancelled_never_reaches_the_origin() {
    let env = Env::new().await;
    per_host(&env, 1);
    // The host's one connection, busy for about a second.
    let (busy, _) = slow_file(&env, "/busy.bin", 300_000, 95);
    let (queued, _) = slow_file(&env, "/queued.bin", 300_000, 96);
    let api = Listening::start(&env);
    let mut holder = api.client().await;
    ask_autofill(&mut holder, 1, &busy).await;
    wait_until("the first autofill reads", || {
        env.origin.served("/busy.bin") > 16_000
    })
    .await;
    let mut tool = api.client().await;
    ask_autofill(&mut tool, 2, &queued).await;
    // Given time to queue behind the busy connection.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cancel = json!({ "jsonrpc": "2.0", "method": "$/cancelRequest", "params": { "id": 2 } });
    tool.send_raw(format!("{cancel}\n").as_bytes()).await;
    let answer = within("the cancelled autofill's answer", answer_to(&mut tool, 2)).await;
    assert_eq!(
        answer["error"]["data"]["code"], "E_RESOURCE_CANCELLED",
        "{answer}"
    );
    // The host's connection frees up; the cancelled call does not take it.
    let done = within("the first autofill", answer_to(&mut holder, 1)).await;
    assert!(done["result"]["sha256"].is_string(), "{done}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        env.origin.hits("/queued.bin"),
        0,
        "the cancelled autofill reached the origin"
    );
    api.stop().await;
}

#[tokio::test]
async fn another_process_waiting_for_a_download_that_is_cancelled_continues_it() {
    let env = Env::new().await;
    let (url, body) = slow_file(&env, "/shared.bin", 2_000_000, 97);
    // Two services on one store, as two processes sharing it: the second
    // waits for the first's download through the store's lock.
    let first = gem_resources::Resources::open(&env.config()).unwrap();
    let second = gem_resources::Resources::open(&env.config()).unwrap();
    first
        .install("g", &manifest(json!([entry("f", &url, &body)])))
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let leaving = {
        let (first, cancel) = (first.clone(), cancel.clone());
        tokio::spawn(async move { first.path_until("g", "f", Some(&cancel)).await })
    };
    wait_until("the first download runs", || {
        env.origin.served("/shared.bin") > 100_000
    })
    .await;
    let mut events = second.subscribe();
    let waiting = {
        let second = second.clone();
        tokio::spawn(async move { second.path("g", "f").await })
    };
    within("the second waits for the first", async {
        while !matches!(
            events.recv().await.unwrap(),
            gem_resources::Event::Waiting { .. }
        ) {}
    })
    .await;
    cancel.cancel();
    let left = leaving.await.unwrap().unwrap_err();
    assert_eq!(left.code(), gem_resources::ErrorCode::Cancelled, "{left}");
    let path = within("the waiting path", waiting)
        .await
        .unwrap()
        .expect("the waiting process gets the file, not the cancellation");
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(
        resumed(&env, "/shared.bin"),
        "continued from the kept bytes: {:?}",
        env.origin.ranges("/shared.bin")
    );
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test]
async fn an_embedded_autofill_whose_future_is_dropped_stops_reading() {
    let env = Env::new().await;
    let (url, _) = slow_file(&env, "/dropped.bin", 4_000_000, 98);
    let service = gem_resources::Resources::open(&env.config()).unwrap();
    let reading = service.autofill(&url);
    let gave_up = tokio::time::timeout(Duration::from_millis(500), reading).await;
    assert!(gave_up.is_err(), "still reading after 500 ms");
    assert!(
        env.origin.served("/dropped.bin") > 0,
        "it had begun reading"
    );
    assert!(
        stops_sending(&env, "/dropped.bin").await,
        "the transfer stopped with its future"
    );
    service.shutdown().await;
}
