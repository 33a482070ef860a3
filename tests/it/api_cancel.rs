//! A call, not the store, is what a client cancels: `$/cancelRequest`
//! (LSP's convention) ends one waiting `path`, whose download stops when no
//! other caller waits for it and nothing else wants it, and goes on
//! otherwise; the answer says which. A client that goes away cancels its
//! calls the same way.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::api::{Line, Listening};
use crate::support::*;

/// A resumable file of `size` bytes sent at 16 KiB every 50 ms (the
/// cancellation tests of `api_cancel_work` use it too).
pub(crate) fn slow_file(env: &Env, path: &str, size: usize, seed: u8) -> (url::Url, Vec<u8>) {
    let body = bytes(size, seed);
    env.origin.route(
        path,
        Behaviour::Ranged {
            body: body.clone(),
            etag: "\"c1\"".into(),
            ignore_range: false,
            cut_at: None,
            hold: false,
            pace: Some((16_384, Duration::from_millis(50))),
        },
    );
    (env.url("origin.test", path), body)
}

async fn installed(api: &Listening, resources: Value) -> Line {
    let mut app = api.client().await;
    app.result(
        "install",
        json!({ "gem": "g", "manifest": { "resources": resources } }),
    )
    .await;
    app
}

/// Sends `path` of `id` with the request id `call`.
async fn ask_path(client: &mut Line, call: u64, id: &str) {
    let request = json!({ "jsonrpc": "2.0", "id": call, "method": "path", "params": { "gem": "g", "id": id } });
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

#[tokio::test]
async fn a_cancelled_path_stops_a_download_no_one_else_waits_for() {
    let env = Env::new().await;
    let (url, body) = slow_file(&env, "/alone.bin", 2_000_000, 61);
    let api = Listening::start(&env);
    let mut app = installed(&api, json!([entry("a", &url, &body)])).await;
    let mut tool = api.client().await;
    ask_path(&mut tool, 7, "a").await;
    wait_until("the download runs", || {
        env.origin.served("/alone.bin") > 100_000
    })
    .await;
    let cancel =
        json!({ "jsonrpc": "2.0", "id": 8, "method": "$/cancelRequest", "params": { "id": 7 } });
    tool.send_raw(format!("{cancel}\n").as_bytes()).await;
    // Both answers, in whichever order they come.
    let (mut cancelled, mut told) = (Value::Null, Value::Null);
    while cancelled.is_null() || told.is_null() {
        let message = tool.recv().await.expect("an answer");
        match message["id"].as_u64() {
            Some(7) => cancelled = message,
            Some(8) => told = message,
            _ => {}
        }
    }
    assert_eq!(told["result"]["cancelled"], json!(true), "{told}");
    assert_eq!(cancelled["error"]["code"], json!(-32800), "{cancelled}");
    assert_eq!(cancelled["error"]["data"]["code"], "E_RESOURCE_CANCELLED");
    assert_eq!(
        cancelled["error"]["data"]["download"], "stopped",
        "{cancelled}"
    );
    assert!(
        stops_sending(&env, "/alone.bin").await,
        "the download stopped"
    );
    let sent = env.origin.served("/alone.bin");
    assert!(sent < body.len() as u64, "stopped before the end: {sent}");
    // The next call continues from the kept bytes.
    let path = app.result("path", json!({ "gem": "g", "id": "a" })).await;
    assert_eq!(std::fs::read(path["path"].as_str().unwrap()).unwrap(), body);
    // Nothing left to cancel.
    let late = app.call("$/cancelRequest", json!({ "id": 7 })).await;
    assert_eq!(late["result"]["cancelled"], json!(false), "{late}");
    api.stop().await;
}

#[tokio::test]
async fn a_cancelled_path_leaves_the_download_to_another_caller_and_says_so() {
    let env = Env::new().await;
    let (url, body) = slow_file(&env, "/shared.bin", 600_000, 62);
    let api = Listening::start(&env);
    let _app = installed(&api, json!([entry("s", &url, &body)])).await;
    let mut first = api.client().await;
    let mut second = api.client().await;
    ask_path(&mut first, 1, "s").await;
    ask_path(&mut second, 1, "s").await;
    wait_until("the download runs", || {
        env.origin.served("/shared.bin") > 50_000
    })
    .await;
    // As a notification (no id): no answer but the call's own.
    let cancel = json!({ "jsonrpc": "2.0", "method": "$/cancelRequest", "params": { "id": 1 } });
    first.send_raw(format!("{cancel}\n").as_bytes()).await;
    let left = answer_to(&mut first, 1).await;
    assert_eq!(left["error"]["data"]["download"], "continues", "{left}");
    let got = within("the other caller's path", answer_to(&mut second, 1)).await;
    let path = got["result"]["path"].as_str().expect("a path");
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(
        env.origin.hits("/shared.bin"),
        1,
        "one download, never stopped"
    );
    api.stop().await;
}

#[tokio::test]
async fn a_client_that_goes_away_leaves_its_calls_and_a_required_file_goes_on() {
    let env = Env::new().await;
    let (lazy_url, lazy_body) = slow_file(&env, "/gone.bin", 2_000_000, 63);
    let (req_url, req_body) = slow_file(&env, "/needed.bin", 300_000, 64);
    let api = Listening::start(&env);
    let mut app = installed(
        &api,
        json!([
            entry("lazy", &lazy_url, &lazy_body),
            required_entry("needed", &req_url, &req_body)
        ]),
    )
    .await;
    let mut tool = api.client().await;
    ask_path(&mut tool, 1, "lazy").await;
    ask_path(&mut tool, 2, "needed").await;
    wait_until("both download", || {
        env.origin.served("/gone.bin") > 50_000 && env.origin.served("/needed.bin") > 50_000
    })
    .await;
    drop(tool);
    // The lazy file nobody waits for any more stops; the required one goes
    // on and lands.
    assert!(
        stops_sending(&env, "/gone.bin").await,
        "the lazy download stopped"
    );
    let path = app
        .result("path", json!({ "gem": "g", "id": "needed" }))
        .await;
    assert_eq!(
        std::fs::read(path["path"].as_str().unwrap()).unwrap(),
        req_body
    );
    assert_eq!(env.origin.hits("/needed.bin"), 1);
    api.stop().await;
}

/// Interrupts `child` (SIGINT, as Ctrl-C) and returns its exit status.
async fn ctrl_c(child: &mut Spawned) -> std::process::ExitStatus {
    crate::support::api::signal(child, libc::SIGINT);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            return exit;
        }
        assert!(std::time::Instant::now() < deadline, "it did not stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn ctrl_c_of_path_through_the_service_says_whether_the_download_goes_on() {
    let env = Env::new().await;
    let (url, body) = slow_file(&env, "/cli.bin", 2_000_000, 65);
    let api = Listening::start(&env);
    let _app = installed(&api, json!([entry("c", &url, &body)])).await;
    // Alone: the download stops, its bytes kept.
    let log = env.dir.path().join("path.log");
    let mut child = spawn_quiet(&env, &["path", "g", "c"], &log);
    wait_until("the download runs", || {
        env.origin.served("/cli.bin") > 100_000
    })
    .await;
    let exit = ctrl_c(&mut child).await;
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(exit.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted: the service stopped the download; its bytes are kept"),
        "{stderr}"
    );
    assert!(
        stops_sending(&env, "/cli.bin").await,
        "the download stopped"
    );
    // With another caller waiting: it goes on, and says so.
    let mut other = api.client().await;
    ask_path(&mut other, 1, "c").await;
    let log = env.dir.path().join("path2.log");
    let mut child = spawn_quiet(&env, &["path", "g", "c"], &log);
    let before = env.origin.served("/cli.bin");
    wait_until("the download runs again", || {
        env.origin.served("/cli.bin") > before + 50_000
    })
    .await;
    let exit = ctrl_c(&mut child).await;
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(exit.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted: the download goes on"),
        "{stderr}"
    );
    let got = within("the other caller's path", answer_to(&mut other, 1)).await;
    let path = got["result"]["path"].as_str().expect("a path");
    assert_eq!(std::fs::read(path).unwrap(), body);
    api.stop().await;
}

#[tokio::test]
async fn a_path_with_a_progress_token_gets_its_own_events_before_its_answer() {
    let env = Env::new().await;
    let (url, body) = slow_file(&env, "/mine.bin", 200_000, 66);
    let other_body = bytes(300_000, 67);
    let other = env.serve("/other.bin", &other_body);
    let api = Listening::start(&env);
    let mut app = installed(
        &api,
        json!([
            entry("mine", &url, &body),
            entry("other", &other, &other_body)
        ]),
    )
    .await;
    let mut tool = api.client().await;
    let request = json!({ "jsonrpc": "2.0", "id": 3, "method": "path",
        "params": { "gem": "g", "id": "mine", "progress": "bar-1" } });
    tool.send_raw(format!("{request}\n").as_bytes()).await;
    // Another resource downloads meanwhile: none of its events come.
    app.result("path", json!({ "gem": "g", "id": "other" }))
        .await;
    let mut kinds = Vec::new();
    let answer = loop {
        let message = within("the call's messages", tool.recv())
            .await
            .expect("a message");
        if message["id"] == json!(3) {
            break message;
        }
        assert_eq!(message["method"], "$/progress", "{message}");
        assert_eq!(message["params"]["token"], "bar-1", "{message}");
        assert_eq!(message["params"]["value"]["resource"], "mine", "{message}");
        kinds.push(
            message["params"]["value"]["event"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    };
    assert!(answer["result"]["path"].is_string(), "{answer}");
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("queued"),
        "{kinds:?}"
    );
    assert!(kinds.iter().any(|k| k == "progress"), "{kinds:?}");
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("verified"),
        "{kinds:?}"
    );
    // A token that is not one is refused.
    let bad = tool
        .call(
            "path",
            json!({ "gem": "g", "id": "mine", "progress": { "a": 1 } }),
        )
        .await;
    assert_eq!(bad["error"]["code"], json!(-32602), "{bad}");
    api.stop().await;
}

#[tokio::test]
async fn path_through_the_service_shows_only_its_own_resources_events() {
    let env = Env::new().await;
    let (other_url, other) = slow_file(&env, "/other.bin", 600_000, 66);
    let (mine_url, mine) = slow_file(&env, "/mine.bin", 300_000, 67);
    let api = Listening::start(&env);
    // The gem's required file downloads while `path` waits for another.
    let _app = installed(
        &api,
        json!([
            required_entry("other", &other_url, &other),
            entry("mine", &mine_url, &mine)
        ]),
    )
    .await;
    let out = env.run(&["--json", "path", "g", "mine"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events: Vec<Value> = stderr(&out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e["resource"] == "mine" && e["event"] == "verified"),
        "its own file's events: {events:#?}"
    );
    assert!(
        env.origin.served("/other.bin") > 0,
        "the other file was downloading meanwhile"
    );
    let foreign: Vec<&Value> = events.iter().filter(|e| e["resource"] == "other").collect();
    assert!(
        foreign.is_empty(),
        "another resource's events: {foreign:#?}"
    );
    api.stop().await;
}

#[tokio::test]
async fn a_path_the_service_cut_off_as_it_stopped_is_not_called_cancelled_by_the_client() {
    let env = Env::new().await;
    let (url, body) = slow_file(&env, "/cut.bin", 2_000_000, 62);
    let api = Listening::start(&env);
    let _app = installed(&api, json!([entry("a", &url, &body)])).await;
    let store = gem_resources::Store::open(&env.store_dir()).unwrap();
    let client = gem_resources::api::Client::for_store(&store)
        .await
        .expect("a client of the service");
    let waiting = tokio::spawn(async move { client.path("g", "a").await });
    wait_until("the download runs", || {
        env.origin.served("/cut.bin") > 100_000
    })
    .await;
    // The service stops (as `serve` on SIGTERM): its API first.
    api.stop().await;
    let error = waiting
        .await
        .unwrap()
        .expect_err("a path cut off by the stop");
    assert_eq!(
        error.code(),
        gem_resources::ErrorCode::Service,
        "the service stopped; this client cancelled nothing: {error}"
    );
    assert!(
        error
            .to_string()
            .contains("stopped before path was answered"),
        "{error}"
    );
}
