//! The local API, from a client's side: discovery, framing and its limits,
//! one policy for the store, autofill and events, and who may connect.

use std::time::{Duration, Instant};

use gem_resources::{ErrorCode, Mode, Policy, Resources};
use serde_json::{json, Value};

use crate::support::api::{Line, Listening};
use crate::support::*;

fn lazy(id: &str, url: &url::Url, body: &[u8]) -> Value {
    entry(id, url, body)
}

fn manifest_value(resources: Value) -> Value {
    json!({ "resources": resources })
}

#[tokio::test]
async fn hello_and_service_json_say_where_and_who() {
    let env = Env::new().await;
    let api = Listening::start(&env);
    let mut client = api.client().await;
    let hello = client.result("hello", json!(null)).await;
    assert_eq!(hello["protocol"], 1);
    assert_eq!(hello["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(hello["pid"], std::process::id());
    assert_eq!(
        hello["store"].as_str().unwrap(),
        std::path::absolute(env.store_dir())
            .unwrap()
            .to_str()
            .unwrap()
    );
    // Found from the store path alone.
    let file = env.store_dir().join("store-v1/service.json");
    let found: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(found["socket"], api.socket().as_str());
    assert_eq!(found["pid"], std::process::id());
    // The socket's folder is the user's alone.
    use std::os::unix::fs::PermissionsExt;
    let run = std::path::Path::new(&api.socket())
        .parent()
        .unwrap()
        .to_path_buf();
    assert_eq!(
        std::fs::metadata(&run).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let status = client.result("status", json!({})).await;
    assert_eq!(status["service"]["socket"], api.socket().as_str());
    assert_eq!(
        status["store"],
        env.store_dir().to_str().unwrap(),
        "{status}"
    );
    let socket = api.socket();
    api.stop().await;
    assert!(!file.exists(), "service.json outlived the service");
    assert!(
        !std::path::Path::new(&socket).exists(),
        "the socket outlived the service"
    );
}

#[tokio::test]
async fn a_second_service_on_the_store_is_refused_naming_the_holder() {
    let env = Env::new().await;
    let api = Listening::start(&env);
    let other = Resources::open(&env.config()).unwrap();
    let e = other.listen().unwrap_err();
    assert_eq!(e.code(), ErrorCode::Busy, "{e}");
    assert!(
        e.to_string().contains(&std::process::id().to_string()),
        "{e}"
    );
    other.shutdown().await;
    api.stop().await;
    // Once it stopped, the store is free again.
    let again = Listening::start(&env);
    again.stop().await;
}

#[tokio::test]
async fn malformed_and_oversized_lines_leave_everyone_served() {
    let env = Env::new().await;
    let api = Listening::start(&env);
    let mut bad = api.client().await;
    bad.send_raw(b"this is not json\n").await;
    let answer = bad.recv().await.unwrap();
    assert_eq!(answer["error"]["code"], -32700, "{answer}");
    assert_eq!(answer["error"]["data"]["code"], "E_RESOURCE_USAGE");
    bad.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":9}\n").await;
    let answer = bad.recv().await.unwrap();
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    assert_eq!(answer["id"], 9);
    let answer = bad.call("no_such_method", json!({})).await;
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
    let answer = bad.call("path", json!({ "gem": 5 })).await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    // The same connection still works.
    assert_eq!(bad.result("hello", json!(null)).await["protocol"], 1);

    let mut huge = api.client().await;
    let mut line = vec![b'x'; gem_resources::api::protocol::MAX_LINE + 10];
    line.push(b'\n');
    huge.send_raw(&line).await;
    let answer = huge.recv().await.unwrap();
    assert_eq!(answer["error"]["code"], -32700, "{answer}");
    assert!(
        huge.recv().await.is_none(),
        "an oversized line keeps its connection"
    );

    let mut other = api.client().await;
    assert_eq!(other.result("hello", json!(null)).await["protocol"], 1);
    api.stop().await;
}

#[tokio::test]
async fn a_client_that_never_reads_its_events_slows_nobody_and_is_told_it_lagged() {
    let env = Env::new().await;
    let api = Listening::start(&env);
    let mut stuck = api.client().await;
    stuck.result("subscribe", json!({})).await;
    // Events pile up for the stuck client: more than its queue (1,024
    // messages) and its socket's buffer (about a hundred of these events)
    // hold. Few enough calls that a slow disk (each writes the policy)
    // does not make the client's silence outlast the write deadline, after
    // which it would be closed rather than told.
    const CALLS: usize = 2000;
    let mut busy = api.client().await;
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 0..CALLS {
        let hosts: Vec<String> = (0..64).map(|k| format!("h{i}-{k}.example.com")).collect();
        let t = Instant::now();
        busy.result("set_policy", json!({ "mode": "blocklist", "hosts": hosts }))
            .await;
        slowest = slowest.max(t.elapsed());
    }
    // Another client is answered at once meanwhile.
    let mut other = api.client().await;
    let t = Instant::now();
    other.result("hello", json!(null)).await;
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "hello took {:?}",
        t.elapsed()
    );
    assert!(
        slowest < Duration::from_secs(2),
        "a call waited {slowest:?} while a client did not read (total {:?})",
        started.elapsed()
    );
    // The stuck client, once it reads, finds a `lagged` after the events
    // that fit: its subscription ended there.
    let mut lagged = false;
    let mut events = 0;
    while let Some(message) = stuck.recv().await {
        match message["method"].as_str() {
            Some("event") => events += 1,
            Some("lagged") => {
                lagged = true;
                break;
            }
            _ => {}
        }
    }
    // A machine so slow that the calls outlast the write deadline closes
    // the silent client instead: that is the other rule, not a failure.
    let took = started.elapsed();
    assert!(
        lagged || took >= gem_resources::api::protocol::WRITE_DEADLINE,
        "no lagged notification after {events} events ({took:?} of calls)"
    );
    assert!(
        events < CALLS,
        "{events} events were queued for a client that did not read"
    );
    api.stop().await;
}

#[tokio::test]
async fn a_subscriber_sees_the_whole_course_of_a_download() {
    let env = Env::new().await;
    let body = bytes(300_000, 17);
    let url = env.serve("/c.bin", &body);
    let api = Listening::start(&env);
    let mut client = api.client().await;
    client
        .result(
            "install",
            json!({ "gem": "g", "manifest": manifest_value(json!([lazy("c", &url, &body)])) }),
        )
        .await;
    let mut watcher = api.client().await;
    let subscribed = watcher.result("subscribe", json!({ "gem": "g" })).await;
    assert_eq!(subscribed["status"][0]["resources"][0]["state"], "missing");
    let path = client
        .result("path", json!({ "gem": "g", "id": "c" }))
        .await;
    assert_eq!(std::fs::read(path["path"].as_str().unwrap()).unwrap(), body);
    let mut kinds = Vec::new();
    while let Some(message) = watcher.recv().await {
        let event = &message["params"];
        assert_eq!(message["method"], "event", "{message}");
        assert_eq!(event["gem"], "g", "{event}");
        let kind = event["event"].as_str().unwrap().to_string();
        kinds.push(kind.clone());
        if kind == "verified" {
            assert_eq!(event["path"], path["path"]);
            break;
        }
    }
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("queued"),
        "{kinds:?}"
    );
    assert!(kinds.iter().any(|k| k == "started"), "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "progress"), "{kinds:?}");
    api.stop().await;
}

#[tokio::test]
async fn five_clients_asking_for_one_missing_file_cause_one_request() {
    let env = Env::new().await;
    let body = bytes(200_000, 23);
    env.origin.route(
        "/five.bin",
        Behaviour::Slow {
            body: body.clone(),
            chunk: 20_000,
            delay: Duration::from_millis(30),
        },
    );
    let url = env.url("origin.test", "/five.bin");
    let api = Listening::start(&env);
    let mut installer = api.client().await;
    installer
        .result(
            "install",
            json!({ "gem": "g", "manifest": manifest_value(json!([lazy("f", &url, &body)])) }),
        )
        .await;
    let mut asks = Vec::new();
    for _ in 0..5 {
        let mut client = api.client().await;
        asks.push(tokio::spawn(async move {
            client
                .result("path", json!({ "gem": "g", "id": "f" }))
                .await
        }));
    }
    let mut paths = Vec::new();
    for ask in asks {
        paths.push(ask.await.unwrap()["path"].as_str().unwrap().to_string());
    }
    paths.dedup();
    assert_eq!(paths.len(), 1, "{paths:?}");
    assert_eq!(env.origin.hits("/five.bin"), 1);
    api.stop().await;
}

#[tokio::test]
async fn set_policy_through_the_api_stops_the_download_and_holds_for_every_process() {
    let env = Env::new().await;
    let body = bytes(2_000_000, 29);
    env.origin.route(
        "/slow.bin",
        Behaviour::Slow {
            body: body.clone(),
            chunk: 16_384,
            delay: Duration::from_millis(50),
        },
    );
    let slow = env.url("origin.test", "/slow.bin");
    let other_body = bytes(50_000, 31);
    let other = env.serve("/other.bin", &other_body);
    let api = Listening::start(&env);
    let mut app = api.client().await;
    let manifest = manifest_value(json!([
        lazy("slow", &slow, &body),
        lazy("other", &other, &other_body)
    ]));
    app.result("install", json!({ "gem": "g", "manifest": manifest }))
        .await;
    let mut tool = api.client().await;
    let waiting =
        tokio::spawn(async move { tool.call("path", json!({ "gem": "g", "id": "slow" })).await });
    wait_until("the download runs", || env.origin.hits("/slow.bin") > 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let changed = app
        .result(
            "set_policy",
            json!({ "mode": "blocklist", "hosts": ["origin.test"] }),
        )
        .await;
    assert_eq!(changed["stopped"], 1, "{changed}");
    let answer = within("the download stops", waiting).await.unwrap();
    assert_eq!(
        answer["error"]["data"]["primary_cause"], "E_RESOURCE_POLICY",
        "{answer}"
    );
    assert_eq!(
        app.result("policy", json!(null)).await["hosts"],
        json!(["origin.test"])
    );

    // The command line, through the service: refused, nothing requested.
    let out = env.run(&["--json", "path", "g", "other"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let error: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(error["primary_cause"], "E_RESOURCE_POLICY", "{error}");
    assert_eq!(env.origin.hits("/other.bin"), 0);
    api.stop().await;

    // And in its own process once the service is gone: the store's record.
    for args in [
        ["--json", "path", "g", "other"].as_slice(),
        ["--json", "--no-service", "path", "g", "other"].as_slice(),
    ] {
        let out = env.run(args).await;
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let error: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        assert_eq!(error["primary_cause"], "E_RESOURCE_POLICY", "{error}");
    }
    assert_eq!(env.origin.hits("/other.bin"), 0);
}

#[tokio::test]
async fn a_policy_set_by_one_service_applies_in_another_on_the_same_store() {
    let env = Env::new().await;
    let body = bytes(40_000, 37);
    let url = env.serve("/p.bin", &body);
    let first = Resources::open(&env.config()).unwrap();
    let second = Resources::open(&env.config()).unwrap();
    first
        .install("g", &manifest(json!([lazy("p", &url, &body)])))
        .await
        .unwrap();
    first
        .set_policy(Policy::new(Mode::Blocklist, &["origin.test".into()]).unwrap())
        .unwrap();
    // At once, before the watcher's next look: a download checks first.
    let e = second.path("g", "p").await.unwrap_err();
    assert_eq!(e.primary_cause(), ErrorCode::Policy, "{e}");
    assert_eq!(env.origin.hits("/p.bin"), 0);
    // And the watcher applies it by itself.
    wait_until("the second service follows", || {
        second.policy().hosts() == ["origin.test".to_string()]
    })
    .await;
    // Lifting it in the second is followed by the first.
    second.set_policy(Policy::allow_all()).unwrap();
    wait_until("the first service follows", || {
        first.policy().hosts().is_empty()
    })
    .await;
    assert_eq!(
        first
            .path("g", "p")
            .await
            .map(|p| std::fs::read(p).unwrap())
            .unwrap(),
        body
    );
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test]
async fn a_policy_whose_record_would_not_be_read_back_is_refused_and_nothing_is_written() {
    let env = Env::new().await;
    let api = Listening::start(&env);
    let mut app = api.client().await;
    app.result(
        "set_policy",
        json!({ "mode": "blocklist", "hosts": ["kept.test"] }),
    )
    .await;
    let record = env.store_dir().join("store-v1/policy.json");
    let before = std::fs::read(&record).unwrap();
    // 45,000 hosts: a request under the line limit, a record over 1 MiB.
    let hosts: Vec<String> = (0..45_000).map(|i| format!("h{i}.example.com")).collect();
    let answer = app
        .call("set_policy", json!({ "mode": "blocklist", "hosts": hosts }))
        .await;
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("45000 hosts"), "{answer}");
    assert_eq!(std::fs::read(&record).unwrap(), before);
    assert_eq!(
        app.result("policy", json!(null)).await["hosts"],
        json!(["kept.test"])
    );
    api.stop().await;
    // Every process on the store still opens.
    let out = env.run(&["--json", "status"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    Resources::open(&env.config()).unwrap().shutdown().await;
}

#[tokio::test]
async fn a_change_of_the_same_length_in_the_same_tick_is_still_followed() {
    let env = Env::new().await;
    let first = Resources::open(&env.config()).unwrap();
    let second = Resources::open(&env.config()).unwrap();
    let record = env.store_dir().join("store-v1/policy.json");
    second
        .set_policy(Policy::new(Mode::Blocklist, &["aaa.test".into()]).unwrap())
        .unwrap();
    wait_until("the first service follows", || {
        first.policy().hosts() == ["aaa.test".to_string()]
    })
    .await;
    // A file system with coarse timestamps: the next record, of the same
    // length, carries the same modification time.
    let stamped = std::fs::metadata(&record).unwrap().modified().unwrap();
    let len = std::fs::metadata(&record).unwrap().len();
    second
        .set_policy(Policy::new(Mode::Blocklist, &["bbb.test".into()]).unwrap())
        .unwrap();
    std::fs::File::options()
        .write(true)
        .open(&record)
        .unwrap()
        .set_modified(stamped)
        .unwrap();
    assert_eq!(std::fs::metadata(&record).unwrap().len(), len);
    wait_until("the first service follows again", || {
        first.policy().hosts() == ["bbb.test".to_string()]
    })
    .await;
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test]
async fn a_record_from_a_clock_in_the_future_does_not_hide_a_later_edit_of_the_configuration() {
    let env = Env::new().await;
    let first = Resources::open(&env.config()).unwrap();
    first
        .set_policy(Policy::new(Mode::Blocklist, &["origin.test".into()]).unwrap())
        .unwrap();
    first.shutdown().await;
    let record = env.store_dir().join("store-v1/policy.json");
    let mut text: Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    text["set_at"] = json!("2999-01-01T00:00:00Z");
    text["set_at_ms"] = json!(32_472_144_000_000u64);
    std::fs::write(&record, serde_json::to_vec(&text).unwrap()).unwrap();
    // The user edits the configuration file: it holds.
    let body = bytes(30_000, 41);
    let url = env.serve("/later.bin", &body);
    let manifest = env.write_manifest("later", json!([entry("later", &url, &body)]));
    env.write_config("# edited: every host again");
    let out = env
        .run(&["--json", "install", "later", manifest.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = env
        .run(&["--json", "--no-service", "path", "later", "later"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[tokio::test]
async fn autofill_through_the_api_follows_the_policy_and_the_mirrors() {
    let env = Env::new().await;
    let body = bytes(70_000, 41);
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let gone = env.url("origin.test", "/gone.bin");
    let mirror = env.serve("/m.bin", &body);
    let mirror = env.url("mirror.test", mirror.path());
    env.origin
        .route("/blocked.bin", Behaviour::Body(body.clone()));
    let blocked = env.url("blocked.test", "/blocked.bin");
    let api = Listening::start(&env);
    let mut client = api.client().await;
    client
        .result(
            "set_policy",
            json!({ "mode": "blocklist", "hosts": ["blocked.test"] }),
        )
        .await;
    let answer = client
        .call("autofill", json!({ "url": blocked.as_str() }))
        .await;
    assert_eq!(
        answer["error"]["data"]["code"], "E_RESOURCE_POLICY",
        "{answer}"
    );
    assert_eq!(env.origin.hits("/blocked.bin"), 0);
    let manifest =
        json!({ "resources": [{ "id": "m", "url": gone.as_str(), "mirrors": [mirror.as_str()] }] });
    let filled = client
        .result(
            "autofill",
            json!({ "manifest": manifest, "url_only": true }),
        )
        .await;
    assert_eq!(filled["ok"], true, "{filled}");
    assert!(
        filled["resources"][0].get("addresses").is_none(),
        "{filled}"
    );
    assert_eq!(filled["resources"][0]["sha256"], sha256_hex(&body));
    assert_eq!(filled["resources"][0]["size"], body.len());
    assert_eq!(filled["resources"][0]["served_by"], mirror.as_str());
    assert_eq!(filled["manifest"]["resources"][0]["size"], body.len());
    // By default every address is read, and the url's 404 shows.
    let checked = client
        .result("autofill", json!({ "manifest": manifest }))
        .await;
    assert_eq!(checked["ok"], false, "{checked}");
    assert_eq!(checked["resources"][0]["served_by"], mirror.as_str());
    let addresses = &checked["resources"][0]["addresses"];
    assert_eq!(addresses[0]["role"], "url", "{checked}");
    assert_eq!(addresses[0]["code"], "E_RESOURCE_HTTP", "{checked}");
    assert_eq!(addresses[1]["ok"], true, "{checked}");
    let one = client
        .result("autofill", json!({ "url": mirror.as_str() }))
        .await;
    assert_eq!(one["sha256"], sha256_hex(&body));
    api.stop().await;
}

#[tokio::test]
async fn a_long_store_path_still_listens() {
    let env = Env::new().await;
    let deep = env
        .dir
        .path()
        .join("a-rather-long-folder-name-for-a-store-".repeat(3));
    let mut config = env.config();
    config.store = Some(deep.clone());
    let service = Resources::open(&config).unwrap();
    let server = service.listen().unwrap();
    assert!(server.socket().len() <= 100, "{}", server.socket());
    let mut client = Line::connect(server.socket()).await;
    assert_eq!(
        client.result("hello", json!(null)).await["store"],
        deep.to_str().unwrap()
    );
    server.stop().await;
    service.shutdown().await;
}

#[tokio::test]
async fn a_peer_of_another_user_is_refused() {
    let Some((uid, gid)) = second_user("a_peer_of_another_user_is_refused") else {
        return;
    };
    let env = Env::new().await;
    let api = Listening::start(&env);
    let socket = api.socket();
    // Let the other user reach the socket, to see the service's own check
    // (normally the 0700 folders already stop it).
    use std::os::unix::fs::PermissionsExt;
    let mut dir = std::path::Path::new(&socket)
        .parent()
        .unwrap()
        .to_path_buf();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    while dir.starts_with(env.dir.path()) || dir == env.dir.path() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
        if !dir.pop() {
            break;
        }
    }
    let mut up = env.dir.path().to_path_buf();
    while up.pop() {
        let mode = std::fs::metadata(&up).unwrap().permissions().mode();
        if mode & 0o001 == 0 {
            std::fs::set_permissions(&up, std::fs::Permissions::from_mode(mode | 0o001)).unwrap();
        }
    }
    // Connected, then closed without an answer (the write may already
    // find the connection closed).
    let script = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ntry:\n  s.sendall(b'{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hello\"}\\n')\n  s.settimeout(10)\n  got = s.recv(65536).decode()\nexcept OSError:\n  got = ''\nprint('answer:' + got)\n";
    let socket_arg = socket.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("setpriv")
            .args([
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
            ])
            .args(["/usr/bin/python3", "-c", script, &socket_arg])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.trim(), "answer:", "another user was answered: {text}");
    // This user still is.
    let mut me = api.client().await;
    assert_eq!(me.result("hello", json!(null)).await["protocol"], 1);
    api.stop().await;
}

#[tokio::test]
async fn serve_says_where_it_listens_first_and_the_cli_uses_it() {
    let env = Env::new().await;
    let body = bytes(30_000, 43);
    let url = env.serve("/s.bin", &body);
    let gems = write_gem_folder(&env, "g", json!([lazy("s", &url, &body)]));
    let log = env.dir.path().join("serve.log");
    let mut serve = spawn_logged(
        &env,
        &[
            "--json",
            "serve",
            "--gems",
            gems.to_str().unwrap(),
            "--interval",
            "0.1",
        ],
        &log,
    );
    let events = serve.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // Reads the first line, then drains the rest so serve never blocks.
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(events);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
        let _ = tx.send(line);
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    let first =
        tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(20)).unwrap())
            .await
            .unwrap();
    let first: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["event"], "listening", "{first}");
    assert!(
        first["at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{first}"
    );
    assert_eq!(first["pid"], serve.0.id());
    let socket = first["socket"].as_str().unwrap().to_string();
    wait_until("serve installed the gem", || {
        env.store_dir().join("store-v1/gems/g.json").exists()
    })
    .await;
    let out = env.run(&["--json", "status"]).await;
    let status: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(status["service"]["socket"], socket.as_str(), "{status}");
    assert_eq!(status["service"]["pid"], serve.0.id());
    let out = env.run(&["path", "g", "s"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(stdout(&out).trim()).unwrap(), body);
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("local API on"),
        "the start log names the socket"
    );
    // The command line through the service prints the same documents.
    let other = env.write_manifest("other.json", json!([lazy("s", &url, &body)]));
    let out = env
        .run(&[
            "--json",
            "install",
            "--no-wait",
            "via-cli",
            other.to_str().unwrap(),
        ])
        .await;
    let doc: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(doc["ok"], true, "{doc}");
    assert_eq!(doc["report"]["gem"], "via-cli", "{doc}");
    // A gem a client installs through the API is not the folder's: the
    // scans leave it installed.
    let mut client = Line::connect(&socket).await;
    let api_gem = manifest_value(json!([lazy("s", &url, &body)]));
    client
        .result("install", json!({ "gem": "from-api", "manifest": api_gem }))
        .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let status = client.result("status", json!({ "gem": "from-api" })).await;
    assert_eq!(status["gems"][0]["gem"], "from-api", "{status}");
    // Each records who installed it; a client cannot claim a folder.
    assert_eq!(status["gems"][0]["installed_by"], json!({ "kind": "api" }));
    let status = client.result("status", json!({ "gem": "via-cli" })).await;
    assert_eq!(status["gems"][0]["installed_by"], json!({ "kind": "cli" }));
    let status = client.result("status", json!({ "gem": "g" })).await;
    assert_eq!(status["gems"][0]["installed_by"]["kind"], "folder");
    let claim = client
        .call(
            "install",
            json!({ "gem": "claim", "manifest": manifest_value(json!([])), "installed_by": "folder" }),
        )
        .await;
    assert!(
        claim["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("params.installed_by")),
        "{claim}"
    );
    // A subscription may name a gem that is not installed yet.
    let subscribed = client
        .result("subscribe", json!({ "gem": "not-yet" }))
        .await;
    assert_eq!(subscribed["status"], json!([]));
    unsafe { libc::kill(serve.0.id() as i32, libc::SIGTERM) };
    wait_output(&mut serve).await;
    let out = env.run(&["--json", "status"]).await;
    let status: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(status["service"], Value::Null, "{status}");
}

#[tokio::test]
async fn a_running_fetch_follows_a_policy_set_for_its_store() {
    let env = Env::new().await;
    let body = bytes(3_000_000, 47);
    env.origin.route(
        "/long.bin",
        Behaviour::Slow {
            body: body.clone(),
            chunk: 16_384,
            delay: Duration::from_millis(40),
        },
    );
    let url = env.url("origin.test", "/long.bin");
    let manifest = env.write_manifest("m.json", json!([lazy("long", &url, &body)]));
    let service = Resources::open(&env.config()).unwrap();
    let config = env.dir.path().join("config.toml");
    let args: Vec<String> = vec![
        "--config".into(),
        config.display().to_string(),
        "--json".into(),
        "fetch".into(),
        manifest.display().to_string(),
    ];
    let fetch = tokio::spawn(run_bin(args));
    wait_until("the fetch downloads", || env.origin.hits("/long.bin") > 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    service
        .set_policy(Policy::new(Mode::Blocklist, &["origin.test".into()]).unwrap())
        .unwrap();
    let out = within("the fetch stops", fetch).await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("E_RESOURCE_POLICY") || stderr(&out).contains("E_RESOURCE_POLICY"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    service.shutdown().await;
}

#[tokio::test]
async fn a_batch_gets_an_array_of_answers_as_json_rpc_says() {
    let env = Env::new().await;
    let api = Listening::start(&env);
    let mut client = api.client().await;
    let code = |a: &Value| a["error"]["code"].as_i64();
    // Three values that are not requests: three errors, in an array.
    client.send_raw(b"[1,2,3]\n").await;
    let answer = client.recv().await.unwrap();
    let answers = answer.as_array().expect("an array");
    assert_eq!(answers.len(), 3, "{answer}");
    for a in answers {
        assert_eq!((code(a), &a["id"]), (Some(-32600), &Value::Null), "{a}");
    }
    // A mixed batch: a request, a notification (no answer), something
    // that is not a request, an unknown method.
    let batch = json!([
        { "jsonrpc": "2.0", "id": "a", "method": "hello" },
        { "jsonrpc": "2.0", "method": "hello" },
        { "foo": "boo" },
        { "jsonrpc": "2.0", "id": 7, "method": "nope" },
    ]);
    client.send_raw(format!("{batch}\n").as_bytes()).await;
    let answer = client.recv().await.unwrap();
    let answers = answer.as_array().expect("an array");
    assert_eq!(answers.len(), 3, "{answer}");
    let by_id = |id: Value| answers.iter().find(|a| a["id"] == id).unwrap();
    assert_eq!(by_id(json!("a"))["result"]["protocol"], json!(1));
    assert_eq!(code(by_id(Value::Null)), Some(-32600));
    assert_eq!(code(by_id(json!(7))), Some(-32601));
    // A batch of notifications gets nothing: the next line answers the
    // request after it.
    let batch = json!([
        { "jsonrpc": "2.0", "method": "hello" },
        { "jsonrpc": "2.0", "method": "policy" },
    ]);
    client.send_raw(format!("{batch}\n").as_bytes()).await;
    client
        .send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":99,\"method\":\"hello\"}\n")
        .await;
    let next = client.recv().await.unwrap();
    assert_eq!(next["id"], json!(99), "{next}");
    // An empty batch: one error, not an array.
    client.send_raw(b"[]\n").await;
    let answer = client.recv().await.unwrap();
    assert_eq!(code(&answer), Some(-32600), "{answer}");
    api.stop().await;
}

#[tokio::test]
async fn an_unchanged_reinstall_through_the_api_is_no_upgrade() {
    let env = Env::new().await;
    let body = bytes(1_000, 77);
    let url = env.serve("/same.bin", &body);
    let api = Listening::start(&env);
    let mut app = api.client().await;
    let manifest = manifest_value(json!([lazy("s", &url, &body)]));
    let install = json!({ "gem": "g", "manifest": manifest });
    let first = app.result("install", install.clone()).await;
    assert_eq!(
        (&first["upgrade"], &first["unchanged"]),
        (&json!(false), &json!(false))
    );
    let again = app.result("install", install).await;
    assert_eq!(
        (&again["upgrade"], &again["unchanged"]),
        (&json!(false), &json!(true)),
        "{again}"
    );
    let other = manifest_value(json!([lazy("t", &url, &body)]));
    let changed = app
        .result("install", json!({ "gem": "g", "manifest": other }))
        .await;
    assert_eq!(
        (&changed["upgrade"], &changed["unchanged"]),
        (&json!(true), &json!(false))
    );
    api.stop().await;
}
