//! What the binary says while it waits or changes course: another process
//! holding the same file, and a fallback to the next address.

use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::support::*;

#[tokio::test]
async fn a_fallback_to_the_mirror_is_a_warning_naming_resource_address_and_reason() {
    let env = Env::new().await;
    let body = bytes(10_000, 31);
    let url = env.serve("/bad.bin", &bytes(10_000, 32));
    let mirror = env.serve("/good.bin", &body);
    let mut resource = entry("ocr-model", &url, &body);
    resource["mirrors"] = json!([mirror.as_str()]);
    let manifest = env.write_manifest("m.json", json!([resource]));
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let warning = stderr(&out)
        .lines()
        .find(|l| l.starts_with("warning: "))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no warning: {}", stderr(&out)));
    for part in [
        "ocr-model",
        url.as_str(),
        "SHA-256 mismatch",
        "trying the next address",
        mirror.as_str(),
    ] {
        assert!(warning.contains(part), "{part:?} missing: {warning}");
    }
    // The last address failing is an error, not a warning about a next one.
    let only = entry("solo", &url, &bytes(10_000, 34));
    let manifest = env.write_manifest("solo.json", json!([only]));
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}

#[tokio::test]
async fn waiting_for_another_process_downloading_the_same_file_is_said() {
    let env = Env::new().await;
    let body = bytes(50_000, 33);
    let (url, gate) = env.serve_gated("/held.bin", &body);
    let manifest = env.write_manifest("m.json", json!([entry("held", &url, &body)]));
    let config = env.dir.path().join("config.toml");
    let spawn = |json: bool, err: std::fs::File| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gem-resources"));
        command.arg("--config").arg(&config);
        if json {
            command.arg("--json");
        }
        command
            .arg("fetch")
            .arg(&manifest)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap()
    };
    let first_err = env.dir.path().join("first.err");
    let second_err = env.dir.path().join("second.err");
    let mut first = spawn(false, std::fs::File::create(&first_err).unwrap());
    wait_until("the first download to reach the origin", || {
        env.origin.hits("/held.bin") == 1
    })
    .await;
    let mut second = spawn(true, std::fs::File::create(&second_err).unwrap());
    wait_until("the second to say it waits", || {
        std::fs::read_to_string(&second_err).is_ok_and(|t| t.contains("waiting"))
    })
    .await;
    gate.open();
    let (a, b) =
        tokio::task::spawn_blocking(move || (first.wait().unwrap(), second.wait().unwrap()))
            .await
            .unwrap();
    assert!(a.success() && b.success(), "{a:?} {b:?}");
    let text = std::fs::read_to_string(&second_err).unwrap();
    let event: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(event, json!({ "event": "waiting", "resource": "held" }));
    assert_eq!(
        env.origin.hits("/held.bin"),
        1,
        "the second used the first's file"
    );
}

/// The test configuration with one retry and no backoff.
fn one_retry(env: &Env) {
    let path = env.write_config("retry_backoff_secs = 0");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("retries = 0", "retries = 1")).unwrap();
}

#[tokio::test]
async fn path_says_on_stderr_that_it_retries_and_why() {
    let env = Env::new().await;
    one_retry(&env);
    let route = |path: &str, body: &[u8]| {
        env.origin.route(
            path,
            Behaviour::Sequence(vec![Behaviour::Status(503), Behaviour::Body(body.to_vec())]),
        );
        env.url("origin.test", path)
    };
    let (text_body, json_body) = (bytes(10_000, 35), bytes(10_000, 36));
    let text_url = route("/flaky.bin", &text_body);
    let json_url = route("/flaky2.bin", &json_body);
    let manifest = env.write_manifest(
        "m.json",
        json!([
            entry("r", &text_url, &text_body),
            entry("j", &json_url, &json_body)
        ]),
    );
    let out = env
        .run(&["install", "g", manifest.to_str().unwrap(), "--no-wait"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = env.run(&["path", "g", "r"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let line = stderr(&out)
        .lines()
        .find(|l| l.contains("retrying"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no retry line: {}", stderr(&out)));
    assert!(
        line.starts_with("g/r: retrying in 0.0 s (attempt 2 of 2): "),
        "{line}"
    );
    assert!(line.contains("503"), "{line}");
    // With --json, an event line on stderr; stdout keeps the result alone.
    let out = env.run(&["--json", "path", "g", "j"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let retry: Value = stderr(&out)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "retrying")
        .unwrap_or_else(|| panic!("no retrying event: {}", stderr(&out)));
    assert_eq!(retry["gem"], "g");
    assert_eq!(retry["resource"], "j");
    assert_eq!(retry["address"], json_url.as_str());
    assert_eq!(
        (retry["attempt"].as_u64(), retry["of"].as_u64()),
        (Some(2), Some(2))
    );
    let result: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(result["resource"], "j");
}

#[tokio::test]
async fn status_says_the_mirror_served_a_file_the_url_sent_wrong_bytes_of() {
    let env = Env::new().await;
    let body = bytes(10_000, 37);
    let url = env.serve("/bad.bin", &bytes(10_000, 38));
    let mirror = env.serve("/good.bin", &body);
    let mut resource = required_entry("model", &url, &body);
    resource["mirrors"] = json!([mirror.as_str()]);
    let manifest = env.write_manifest("m.json", json!([resource]));
    let out = env.run(&["install", "g", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let warning = format!("warning: g/model: {url} failed (E_RESOURCE_SHA256: ");
    assert!(stderr(&out).contains(&warning), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("; trying the next address, {mirror}")),
        "{}",
        stderr(&out)
    );
    let out = env.run(&["--json", "status"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let r = &status["gems"][0]["resources"][0];
    assert_eq!(r["state"], "present", "{r}");
    assert_eq!(r["served_by"], mirror.as_str(), "{r}");
    let out = env.run(&["status"]).await;
    assert!(
        stdout(&out).contains("present, from mirror 1 (origin.test)"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test]
async fn fetch_without_a_terminal_says_on_stderr_that_it_retries_and_why() {
    let env = Env::new().await;
    one_retry(&env);
    let body = bytes(10_000, 39);
    env.origin.route(
        "/flaky.bin",
        Behaviour::Sequence(vec![Behaviour::Status(503), Behaviour::Body(body.clone())]),
    );
    let url = env.url("origin.test", "/flaky.bin");
    let manifest = env.write_manifest("m.json", json!([entry("r", &url, &body)]));
    // stderr is a pipe here: no bar is drawn to carry the note.
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let line = stderr(&out)
        .lines()
        .find(|l| l.contains("retrying"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no retry line: {}", stderr(&out)));
    assert!(
        line.starts_with("r: retrying in 0.0 s (attempt 2 of 2): "),
        "{line}"
    );
    assert!(line.contains("503"), "{line}");
    assert_eq!(env.origin.hits("/flaky.bin"), 2);
}

#[tokio::test]
async fn the_fallback_warning_names_the_redirect_target_that_failed() {
    let env = Env::new().await;
    let body = bytes(10_000, 41);
    let gone = env.url(
        "cdn.test",
        "/signed/model.bin?X-Amz-Expires=60&X-Amz-Signature=00112233445566778899aabbccddeeff",
    );
    env.origin.route(
        "/model.bin",
        Behaviour::Redirect {
            status: 302,
            location: gone.to_string(),
        },
    );
    env.origin
        .route("/signed/model.bin", Behaviour::Status(403));
    let url = env.url("origin.test", "/model.bin");
    let mirror = env.serve("/good.bin", &body);
    let mut resource = required_entry("model", &url, &body);
    resource["mirrors"] = json!([mirror.as_str()]);
    let manifest = env.write_manifest("m.json", json!([resource]));
    let m = manifest.to_str().unwrap();
    let warning = |label: &str| {
        format!(
            "warning: {label}: {url} failed at its redirect to {}/signed/model.bin?… (E_RESOURCE_HTTP: "
            , env.origin.url("cdn.test", "").trim_end_matches('/')
        )
    };
    // In process (fetch), from the service's events (install), and for
    // an author (autofill --manifest).
    for (args, label) in [
        (vec!["fetch", m], "model"),
        (vec!["install", "g", m], "g/model"),
        (
            vec!["autofill", "--all", "--url-only", "--manifest", m],
            "model",
        ),
    ] {
        // Each run downloads anew.
        let _ = std::fs::remove_dir_all(env.store_dir());
        let out = env.run(&args).await;
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&warning(label)),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains(&format!("; trying the next address, {mirror}")),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // Reading every address, autofill names the hop in the url's line.
    let out = env.run(&["autofill", "--all", "--manifest", m]).await;
    assert!(
        stderr(&out).contains(&format!(
            "model: url: HTTP status 403 Forbidden at its redirect to {}/signed/model.bin?… (E_RESOURCE_HTTP: {url})",
            env.origin.url("cdn.test", "").trim_end_matches('/')
        )),
        "{}",
        stderr(&out)
    );
    // --json gives the whole hop.
    let _ = std::fs::remove_dir_all(env.store_dir());
    let out = env.run(&["--json", "fetch", m]).await;
    let event = fell_back(&out);
    assert_eq!(event["hop"], gone.as_str(), "{event}");
    assert_eq!(event["from"], url.as_str(), "{event}");
}

#[tokio::test]
async fn the_fallback_warning_shows_what_a_short_refusal_says() {
    let env = Env::new().await;
    let body = bytes(10_000, 43);
    let said = "{\n  \"error\": \"Access to this model is restricted.\u{202e} Ask for access at https://hub.test/m\"\n}";
    env.origin.route(
        "/gated.bin",
        Behaviour::Raw {
            head: format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close",
                said.len()
            ),
            body: said.as_bytes().to_vec(),
        },
    );
    // A page of HTML says nothing worth a line.
    env.origin.route(
        "/page.bin",
        Behaviour::Raw {
            head: "HTTP/1.1 401 Unauthorized\r\nContent-Type: text/html\r\nContent-Length: 23\r\nConnection: close".into(),
            body: b"<html>sign in</html>   ".to_vec(),
        },
    );
    let gated = env.url("origin.test", "/gated.bin");
    let page = env.url("origin.test", "/page.bin");
    let mirror = env.serve("/good.bin", &body);
    let mut resource = required_entry("model", &gated, &body);
    resource["mirrors"] = json!([page.as_str(), mirror.as_str()]);
    let manifest = env.write_manifest("m.json", json!([resource]));
    let m = manifest.to_str().unwrap();
    let out = env.run(&["fetch", m]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let shown = "HTTP status 403 Forbidden: { \"error\": \"Access to this model is restricted. Ask for access at https://hub.test/m\" }";
    assert!(
        stderr(&out).contains(&format!(
            "warning: model: {gated} failed (E_RESOURCE_HTTP: {shown})"
        )),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains(&format!(
            "warning: model: {page} failed (E_RESOURCE_HTTP: HTTP status 401 Unauthorized)"
        )),
        "{}",
        stderr(&out)
    );
    // The same words in the event.
    let _ = std::fs::remove_dir_all(env.store_dir());
    let out = env.run(&["--json", "fetch", m]).await;
    let event = fell_back(&out);
    assert!(
        event
            .to_string()
            .contains("Access to this model is restricted."),
        "{event}"
    );
}

/// The `fell_back` event line of a `--json` run's stderr.
fn fell_back(out: &std::process::Output) -> Value {
    stderr(out)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "fell_back")
        .unwrap_or_else(|| panic!("no fell_back event: {}", stderr(out)))
}
