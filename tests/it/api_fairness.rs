//! One client process holds a bounded share of the service, and the calls
//! of a connection that change the store apply in the order sent: from
//! outside, over the real socket, against `serve` in its own process where
//! memory or processes are counted.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::service_limits::{
    closed_within, hello_answer, listening_limited, said_hello, signal_and_wait,
};
use crate::support::api::{rss_bytes, Line, Listening};
use crate::support::*;

/// A manifest of `count` resources that nothing downloads (not required),
/// each named `{prefix}{n}`.
fn many_resources(env: &Env, prefix: &str, count: usize) -> Value {
    let resources: Vec<Value> = (0..count)
        .map(|n| {
            let url = env.url("origin.test", &format!("/{prefix}{n}.bin"));
            json!({ "id": format!("{prefix}{n}"), "url": url.as_str(), "sha256": format!("{n:064x}"), "size": 1000 + n })
        })
        .collect();
    json!({ "resources": resources })
}

#[tokio::test]
async fn hello_is_a_connections_first_call() {
    let env = Env::new().await;
    let api = Listening::start(&env);
    // A call before hello is refused, naming the rule; so is a batch.
    let mut early = Line::connect_silent(&api.socket()).await;
    let refused = early.call("status", json!({})).await;
    assert_eq!(refused["error"]["code"], json!(-32600), "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("hello must be a connection's first call"),
        "{message}"
    );
    early
        .send_raw(b"[{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"policy\"}]\n")
        .await;
    let batch = early.recv().await.unwrap();
    assert_eq!(batch["error"]["code"], json!(-32600), "{batch}");
    // A subscription before hello gets no events.
    let subscribe = early.call("subscribe", json!({})).await;
    assert_eq!(subscribe["error"]["code"], json!(-32600), "{subscribe}");
    // Once it said hello, everything else is answered.
    early.result("hello", json!({})).await;
    assert!(early.result("status", json!({})).await["gems"].is_array());
    early.result("subscribe", json!({})).await;
    api.stop().await;
}

#[tokio::test]
async fn a_process_holds_at_most_its_share_of_connections_and_others_still_get_in() {
    let env = Env::new().await;
    let (mut serve, pid, socket) = listening_limited(&env, 4096).await;
    let per_peer = gem_resources::api::protocol::MAX_CONNECTIONS_PER_PEER;
    let mut mine = Vec::new();
    for _ in 0..per_peer {
        mine.push(said_hello(&socket).await);
    }
    // One more from this process: its connection idle the longest makes
    // room (the service's own cap, 2048 here, is far).
    let _one_more = said_hello(&socket).await;
    assert!(
        closed_within(&mut mine[0], Duration::from_secs(5)).await,
        "a process held more than {per_peer} connections"
    );
    assert!(!closed_within(&mut mine[per_peer - 1], Duration::from_millis(50)).await);
    // Another process (the command line) goes through the service.
    let out = env.run(&["--json", "status"]).await;
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["service"]["pid"], json!(pid), "{doc}");
    signal_and_wait(&mut serve).await;
}

#[tokio::test]
async fn a_subscription_flood_from_one_process_locks_nobody_out() {
    let env = Env::new().await;
    // 600 open files: a cap of 88 connections.
    let (mut serve, _pid, socket) = listening_limited(&env, 600).await;
    let mut flood = Vec::new();
    for _ in 0..200 {
        let mut line = Line::connect_silent(&socket).await;
        line.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hello\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"subscribe\"}\n").await;
        flood.push(line);
    }
    // Every connection is open and holds a subscription: a new client
    // still gets its hello answered.
    let (answer, took) = hello_answer(&socket).await;
    eprintln!("a new client under a flood of 200 subscribers: hello answered in {took:?}");
    let answer = answer.expect("a new client was shut out by subscribers");
    assert!(answer.get("result").is_some(), "{answer}");
    drop(flood);
    signal_and_wait(&mut serve).await;
}

#[tokio::test]
async fn the_oldest_subscription_of_a_process_past_its_share_is_told_it_lagged() {
    let env = Env::new().await;
    let api = Listening::start(&env);
    let per_connection = gem_resources::api::protocol::MAX_SUBSCRIPTIONS;
    let per_peer = gem_resources::api::protocol::MAX_SUBSCRIPTIONS_PER_PEER;
    let mut first = api.client().await;
    let oldest = first.result("subscribe", json!({})).await["subscription"].clone();
    let mut others = Vec::new();
    let mut held = 1;
    while held < per_peer {
        let mut line = api.client().await;
        for _ in 0..per_connection.min(per_peer - held) {
            line.result("subscribe", json!({})).await;
            held += 1;
        }
        others.push(line);
    }
    // One more from this process: its oldest ends with `lagged`.
    let mut last = api.client().await;
    last.result("subscribe", json!({})).await;
    let told = first
        .recv()
        .await
        .expect("the oldest subscriber was closed");
    assert_eq!(told["method"], json!("lagged"), "{told}");
    assert_eq!(told["params"]["subscription"], oldest, "{told}");
    api.stop().await;
}

#[tokio::test]
async fn batches_that_are_never_read_hold_bounded_memory() {
    let env = Env::new().await;
    let (mut serve, pid, socket) = listening_limited(&env, 4096).await;
    let mut admin = Line::connect(&socket).await;
    admin
        .result(
            "install",
            json!({ "gem": "big", "manifest": many_resources(&env, "r", 300) }),
        )
        .await;
    let status = admin.result("status", json!({ "gem": "big" })).await;
    let answer_bytes = status.to_string().len();
    let before = rss_bytes(pid);
    // Two connections each ask for 2,048 answers of that size in 38 KB of
    // batches, and never read one.
    let batch: Vec<Value> = (0..64)
        .map(|n| json!({ "jsonrpc": "2.0", "id": n, "method": "status", "params": { "gem": "big" } }))
        .collect();
    let mut lines = b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"hello\"}\n".to_vec();
    for _ in 0..32 {
        lines.extend_from_slice(format!("{}\n", Value::Array(batch.clone())).as_bytes());
    }
    // Two rounds, one after the other's clients left: the bound holds for
    // the peak of both.
    let mut after = Vec::new();
    let mut peak = before;
    for round in 0..2 {
        let mut attackers = Vec::new();
        for _ in 0..2 {
            let mut stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
            let lines = lines.clone();
            attackers.push(tokio::spawn(async move {
                let _ =
                    tokio::time::timeout(Duration::from_secs(3), stream.write_all(&lines)).await;
                stream
            }));
        }
        let end = Instant::now() + Duration::from_secs(4);
        while Instant::now() < end {
            peak = peak.max(rss_bytes(pid));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for attacker in attackers {
            drop(attacker.await);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        after.push(rss_bytes(pid));
        eprintln!(
            "round {round}: answers of {answer_bytes} bytes, 4,096 asked and never read: peak {} MiB (from {} MiB), {} MiB once the clients left",
            peak >> 20,
            before >> 20,
            after[round] >> 20
        );
    }
    // At most 64 answers of each connection wait to be written: 128 here,
    // with room for their JSON trees and the threads that build them.
    let bound = 128 * answer_bytes as u64 * 8 + (96 << 20);
    let grew = peak.saturating_sub(before);
    assert!(
        grew < bound,
        "the service grew by {} MiB for clients that do not read (bound {} MiB)",
        grew >> 20,
        bound >> 20
    );
    // The service still answers.
    admin.result("hello", json!({})).await;
    signal_and_wait(&mut serve).await;
}

#[tokio::test]
async fn policy_changes_sent_together_apply_in_the_order_sent() {
    let env = Env::new().await;
    let (mut serve, _pid, socket) = listening_limited(&env, 4096).await;
    let mut client = Line::connect(&socket).await;
    for round in 0..30 {
        // Eight changes in one write; the last is the user's.
        let mut lines = String::new();
        for n in 0..8 {
            let hosts: Vec<String> = (0..=n).map(|h| format!("h{round}-{h}.test")).collect();
            let request = json!({ "jsonrpc": "2.0", "id": 1000 + n, "method": "set_policy", "params": { "mode": "blocklist", "hosts": hosts } });
            lines.push_str(&format!("{request}\n"));
        }
        client.send_raw(lines.as_bytes()).await;
        let mut answered = 0;
        while answered < 8 {
            let message = client.recv().await.expect("the service closed");
            if message.get("id").is_some() {
                assert!(message.get("error").is_none(), "{message}");
                answered += 1;
            }
        }
        let policy = client.result("policy", json!({})).await;
        assert_eq!(
            policy["hosts"].as_array().map(Vec::len),
            Some(8),
            "round {round}: the last change sent was not the one in force: {policy}"
        );
    }
    signal_and_wait(&mut serve).await;
}

#[tokio::test]
async fn installs_and_uninstalls_sent_together_apply_in_the_order_sent() {
    let env = Env::new().await;
    let (mut serve, _pid, socket) = listening_limited(&env, 4096).await;
    let mut client = Line::connect(&socket).await;
    for round in 0..15 {
        // install A, uninstall, install B, a policy change, uninstall,
        // install C: C is installed at the end.
        let calls = [
            json!({ "method": "install", "params": { "gem": "g", "manifest": many_resources(&env, "a", 40) } }),
            json!({ "method": "uninstall", "params": { "gem": "g" } }),
            json!({ "method": "install", "params": { "gem": "g", "manifest": many_resources(&env, "b", 2) } }),
            json!({ "method": "set_policy", "params": { "mode": "blocklist", "hosts": [format!("r{round}.test")] } }),
            json!({ "method": "uninstall", "params": { "gem": "g" } }),
            json!({ "method": "install", "params": { "gem": "g", "manifest": many_resources(&env, "c", 3) } }),
        ];
        let mut lines = String::new();
        for (n, call) in calls.iter().enumerate() {
            let mut request = call.clone();
            request["jsonrpc"] = json!("2.0");
            request["id"] = json!(100 + n);
            lines.push_str(&format!("{request}\n"));
        }
        client.send_raw(lines.as_bytes()).await;
        let mut answered = 0;
        while answered < calls.len() {
            let message = client.recv().await.expect("the service closed");
            if message.get("id").is_some() {
                assert!(message.get("error").is_none(), "{message}");
                answered += 1;
            }
        }
        let status = client.result("status", json!({ "gem": "g" })).await;
        let ids: Vec<&str> = status["gems"][0]["resources"]
            .as_array()
            .map(|rs| rs.iter().filter_map(|r| r["id"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(ids, ["c0", "c1", "c2"], "round {round}: {status}");
        // The same in one batch.
        let batch: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(n, call)| {
                let mut request = call.clone();
                request["jsonrpc"] = json!("2.0");
                request["id"] = json!(200 + n);
                request
            })
            .collect();
        client
            .send_raw(format!("{}\n", Value::Array(batch)).as_bytes())
            .await;
        let answers = client.recv().await.expect("the service closed");
        assert_eq!(
            answers.as_array().map(Vec::len),
            Some(calls.len()),
            "{answers}"
        );
        let status = client.result("status", json!({ "gem": "g" })).await;
        let ids: Vec<&str> = status["gems"][0]["resources"]
            .as_array()
            .map(|rs| rs.iter().filter_map(|r| r["id"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(ids, ["c0", "c1", "c2"], "round {round}, batch: {status}");
    }
    signal_and_wait(&mut serve).await;
}

#[tokio::test]
async fn answers_a_process_has_not_read_hold_up_its_own_calls_only() {
    let env = Env::new().await;
    let api = Listening::start(&env);
    let mut admin = api.client().await;
    admin
        .result(
            "install",
            json!({ "gem": "big", "manifest": many_resources(&env, "r", 300) }),
        )
        .await;
    // Six connections of this process ask for 64 answers of about 80 KB
    // each and read none: more than the process's share in flight.
    let per_peer = gem_resources::api::protocol::MAX_IN_FLIGHT_PER_PEER;
    let mut lines = String::new();
    for n in 0..64 {
        let request =
            json!({ "jsonrpc": "2.0", "id": n, "method": "status", "params": { "gem": "big" } });
        lines.push_str(&format!("{request}\n"));
    }
    let mut unread = Vec::new();
    for _ in 0..(per_peer / 64 + 2) {
        let mut line = api.client().await;
        line.send_raw(lines.as_bytes()).await;
        unread.push(line);
    }
    // Its next call waits until it reads (its answers count until they
    // are written to the socket, not merely queued). The service reads
    // the connections side by side, so a call sent before it has read
    // them all may still be answered: such a call is sent again, and one
    // must be held within a few tries.
    let mut held = None;
    let mut answered = Vec::new();
    for _ in 0..5 {
        let mut next = api.client().await;
        next.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"next\",\"method\":\"policy\"}\n")
            .await;
        match tokio::time::timeout(Duration::from_secs(2), next.recv()).await {
            Err(_) => {
                held = Some(next);
                break;
            }
            Ok(early) => answered.push(early),
        }
    }
    let Some(mut next) = held else {
        panic!("a process past its share was answered: {answered:?}");
    };
    // ... while another process (the command line) is answered.
    let out = env.run(&["--json", "status"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("working in process"),
        "{}",
        stderr(&out)
    );
    // Once it reads, its call is answered.
    for line in &mut unread {
        for _ in 0..64 {
            let answer = line.recv().await.expect("the service closed");
            assert!(answer.get("result").is_some());
        }
    }
    let answer = next.recv().await.expect("the service closed");
    assert_eq!(answer["id"], json!("next"), "{answer}");
    api.stop().await;
}
