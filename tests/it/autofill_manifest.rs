//! `gem-resources autofill --manifest FILE [--all] [--write]`: the size and
//! SHA-256 of every resource that lacks them, by the download rules, written
//! into the manifest's own text.

use serde_json::{json, Value};

use crate::support::*;

/// A manifest, written by hand: a top-level key after `resources`, one
/// entry per line style, tabs nowhere.
fn manifest_text(a: &str, b: &str, b_sha: &str) -> String {
    format!(
        "{{\n  \"id\": \"sample\",\n  \"resources\": [\n    {{\n      \"id\": \"a\",\n      \"url\": \"{a}\",\n      \"required\": true\n    }},\n    {{ \"id\": \"b\", \"url\": \"{b}\", \"sha256\": \"{b_sha}\", \"size\": 5 }}\n  ],\n  \"name\": \"Sample\"\n}}\n"
    )
}

fn write(env: &Env, text: &str) -> std::path::PathBuf {
    let path = env.dir.path().join("notochord.json");
    std::fs::write(&path, text).unwrap();
    path
}

/// `manifest_text` with entry `a` filled as autofill writes it.
fn filled_a(text: &str, body: &[u8]) -> String {
    text.replacen(
        "\"required\": true\n",
        &format!(
            "\"required\": true,\n      \"sha256\": \"{}\",\n      \"size\": {}\n",
            sha256_hex(body),
            body.len()
        ),
        1,
    )
}

#[tokio::test]
async fn fills_only_what_lacks_and_prints_the_rest_as_it_was() {
    let env = Env::new().await;
    let a = bytes(3_000, 1);
    let b = bytes(5, 2);
    let (url_a, url_b) = (env.serve("/a.bin", &a), env.serve("/b.bin", &b));
    let text = manifest_text(url_a.as_str(), url_b.as_str(), &sha256_hex(&b));
    let path = write(&env, &text);
    let out = env
        .run(&["autofill", "--manifest", path.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), filled_a(&text, &a));
    assert_eq!(env.origin.hits("/b.bin"), 0, "b has both values");
    // Printing changes nothing on disk.
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
}

#[tokio::test]
async fn write_replaces_the_file_and_the_result_checks() {
    let env = Env::new().await;
    let a = bytes(70_000, 3);
    let b = bytes(5, 4);
    let (url_a, url_b) = (env.serve("/a.bin", &a), env.serve("/b.bin", &b));
    let text = manifest_text(url_a.as_str(), url_b.as_str(), &sha256_hex(&b));
    let path = write(&env, &text);
    let p = path.to_str().unwrap();
    let out = env.run(&["autofill", "--manifest", p, "--write"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert!(
        stderr(&out).contains("1 filled, 0 updated"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), filled_a(&text, &a));
    let leftovers: Vec<_> = files_under(env.dir.path())
        .into_iter()
        .filter(|f| {
            !["ca.pem", "config.toml", "notochord.json"]
                .contains(&f.file_name().unwrap().to_str().unwrap())
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let out = env.run(&["check", p]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[tokio::test]
async fn a_byte_order_mark_is_skipped_by_every_command_that_reads_a_manifest() {
    let env = Env::new().await;
    let a = bytes(3_000, 5);
    let b = bytes(5, 6);
    let (url_a, url_b) = (env.serve("/a.bin", &a), env.serve("/b.bin", &b));
    let text = format!(
        "\u{feff}{}",
        manifest_text(url_a.as_str(), url_b.as_str(), &sha256_hex(&b))
    );
    let path = write(&env, &text);
    let p = path.to_str().unwrap();
    let note = format!("note: {p} starts with a UTF-8 byte-order mark; it was skipped\n");
    // Printed and written with the mark kept, as the file had it.
    let out = env.run(&["autofill", "--manifest", p]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), filled_a(&text, &a));
    assert!(stderr(&out).starts_with(&note), "{}", stderr(&out));
    let out = env.run(&["autofill", "--manifest", p, "--write"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), filled_a(&text, &a));
    let out = env.run(&["check", p]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), note);
    let out = env.run(&["--json", "check", p]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "no note with --json");
    let out = env.run(&["fetch", p, "a"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The gem id is read past the mark too, and the note said once.
    let out = env.run(&["install", "--no-wait", p]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).matches("byte-order mark").count(),
        1,
        "{}",
        stderr(&out)
    );
    assert!(env.store_dir().join("store-v1/gems/sample.json").exists());

    // Through a running service, which gets the manifest as JSON.
    std::fs::write(&path, &text).unwrap();
    let gems = env.dir.path().join("gems");
    std::fs::create_dir_all(&gems).unwrap();
    let _serve = spawn_serve(&env, &gems, "0.1", &env.dir.path().join("serve.log"));
    wait_until("the service listens", || {
        store_root(&env).join("service.json").exists()
    })
    .await;
    let out = env.run(&["-vv", "autofill", "--manifest", p]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("using the service's local API"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), filled_a(&text, &a));
    std::fs::write(&path, filled_a(&text, &a)).unwrap();
    let out = env
        .run(&["-vv", "install", "--no-wait", "--as", "other", p])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("using the service's local API"),
        "{}",
        stderr(&out)
    );
    assert!(env.store_dir().join("store-v1/gems/other.json").exists());
}

#[tokio::test]
async fn all_reads_every_resource_again() {
    let env = Env::new().await;
    let a = bytes(100, 5);
    let b = bytes(7, 6);
    let (url_a, url_b) = (env.serve("/a.bin", &a), env.serve("/b.bin", &b));
    // b declares a stale size and digest.
    let text = manifest_text(url_a.as_str(), url_b.as_str(), &sha256_hex(b"old"));
    let path = write(&env, &text);
    let out = env
        .run(&[
            "--json",
            "autofill",
            "--manifest",
            path.to_str().unwrap(),
            "--all",
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["manifest"]["resources"][1]["size"], 7, "{v}");
    assert_eq!(
        v["manifest"]["resources"][1]["sha256"],
        sha256_hex(&b),
        "{v}"
    );
    assert_eq!(v["manifest"]["name"], "Sample", "{v}");
    assert_eq!(v["resources"][0]["served_by"], url_a.as_str(), "{v}");
}

#[tokio::test]
async fn a_failure_is_named_and_the_others_are_still_filled() {
    let env = Env::new().await;
    let a = bytes(1_000, 7);
    let url_a = env.serve("/a.bin", &a);
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let gone = env.url("origin.test", "/gone.bin");
    let path = env.write_manifest(
        "notochord.json",
        json!([
            { "id": "gone", "url": gone.as_str() },
            { "id": "a", "url": url_a.as_str() },
        ]),
    );
    let p = path.to_str().unwrap();
    let out = env.run(&["autofill", "--manifest", p, "--write"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("not filled: gone: E_RESOURCE_HTTP: {gone}")) && err.contains("404"),
        "{err}"
    );
    let written: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(written["resources"][1]["size"], 1_000, "{written}");
    assert_eq!(written["resources"][1]["sha256"], sha256_hex(&a));
    assert!(written["resources"][0].get("size").is_none(), "{written}");

    let out = env.run(&["--json", "autofill", "--manifest", p]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["resources"][0]["id"], "gone");
    assert_eq!(v["resources"][0]["code"], "E_RESOURCE_HTTP", "{v}");
}

#[tokio::test]
async fn transient_failures_are_retried_and_said_as_json_events() {
    let env = Env::new().await;
    let config = env.write_config("retry_backoff_secs = 0.01");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("retries = 0", "retries = 2")).unwrap();
    let body = bytes(2_000, 8);
    env.origin.route(
        "/flaky.bin",
        Behaviour::Sequence(vec![
            Behaviour::Status(503),
            Behaviour::Status(503),
            Behaviour::Body(body.clone()),
        ]),
    );
    let url = env.url("origin.test", "/flaky.bin");
    let path = env.write_manifest(
        "notochord.json",
        json!([{ "id": "flaky", "url": url.as_str() }]),
    );
    let out = env
        .run(&["--json", "autofill", "--manifest", path.to_str().unwrap()])
        .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stderr(&out),
        stdout(&out)
    );
    assert_eq!(env.origin.hits("/flaky.bin"), 3);
    // Every stderr line is a JSON event; the retries among the progress.
    let events: Vec<Value> = stderr(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] != "progress")
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    for (n, event) in events.iter().enumerate() {
        assert_eq!(event["event"], "retrying", "{event}");
        assert_eq!(event["resource"], "flaky");
        assert_eq!(event["attempt"], n + 2, "{event}");
        assert_eq!(event["of"], 3, "{event}");
        assert!(event["reason"].as_str().unwrap().contains("503"), "{event}");
    }
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["resources"][0]["size"], 2_000, "{v}");

    // A single URL follows the same rules.
    env.origin.route(
        "/flaky2.bin",
        Behaviour::Sequence(vec![Behaviour::Status(500), Behaviour::Body(body.clone())]),
    );
    let url = env.url("origin.test", "/flaky2.bin");
    let out = env.run(&["autofill", url.as_str()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(env.origin.hits("/flaky2.bin"), 2);
}

#[tokio::test]
async fn a_mirror_serves_when_the_url_fails_and_a_declared_value_must_match() {
    let env = Env::new().await;
    let body = bytes(4_000, 9);
    env.origin.route("/broken.bin", Behaviour::Status(403));
    let mirror = env.serve("/m/ok.bin", &body);
    let url = env.url("origin.test", "/broken.bin");
    let wrong = sha256_hex(b"something else");
    let path = env.write_manifest(
        "notochord.json",
        json!([
            { "id": "m", "url": url.as_str(), "mirrors": [mirror.as_str()] },
            { "id": "w", "url": mirror.as_str(), "sha256": wrong },
        ]),
    );
    let out = env
        .run(&["--json", "autofill", "--manifest", path.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["resources"][0]["served_by"], mirror.as_str(), "{v}");
    assert_eq!(v["manifest"]["resources"][0]["size"], 4_000, "{v}");
    assert_eq!(v["resources"][1]["code"], "E_RESOURCE_UNAVAILABLE", "{v}");
    assert_eq!(
        v["resources"][1]["attempts"][0]["code"], "E_RESOURCE_SHA256",
        "{v}"
    );
    assert!(v["manifest"]["resources"][1].get("size").is_none(), "{v}");
}

#[tokio::test]
async fn other_rules_still_apply_and_nothing_is_read() {
    let env = Env::new().await;
    let path = env.write_manifest(
        "notochord.json",
        json!([{ "id": "x", "url": "http://cdn.example.com/x.bin" }]),
    );
    let out = env
        .run(&["autofill", "--manifest", path.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!(
            "E_PERM_INVALID: {}: manifest.resources[0].url: must start with https://, got \"http://cdn.example.com/x.bin\"\n",
            path.display()
        )
    );
    assert_eq!(stdout(&out), "");
    let out = env.run(&["autofill", "--write", "https://x.test/a"]).await;
    assert_eq!(out.status.code(), Some(2), "--write needs --manifest");
}

#[cfg(unix)] // symbolic links and mode bits
#[tokio::test]
async fn write_through_a_symbolic_link_fills_the_target_without_its_setuid_bit() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new().await;
    let a = bytes(4_000, 5);
    let b = bytes(5, 6);
    let (url_a, url_b) = (env.serve("/a.bin", &a), env.serve("/b.bin", &b));
    let text = manifest_text(url_a.as_str(), url_b.as_str(), &sha256_hex(&b));
    let real = env.dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let target = real.join("gem.json");
    std::fs::write(&target, &text).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o6754)).unwrap();
    let link = env.dir.path().join("notochord.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let out = env
        .run(&["autofill", "--manifest", link.to_str().unwrap(), "--write"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let meta = std::fs::symlink_metadata(&link).unwrap();
    assert!(meta.file_type().is_symlink(), "the link was replaced");
    assert_eq!(std::fs::read_link(&link).unwrap(), target);
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        filled_a(&text, &a)
    );
    let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o754, "{mode:o}");
    // The temporary file went where the target is, and nothing stayed.
    let left: Vec<_> = files_under(&real);
    assert_eq!(left, vec![target.clone()]);
}

/// A manifest whose resource `m` has a good url, a mirror serving another
/// file and a mirror answering 404; and `solo`, with no mirror. Returns
/// the manifest and the url's bytes.
fn checked_mirrors(env: &Env) -> (std::path::PathBuf, Vec<u8>) {
    let body = bytes(3_000, 21);
    let url = env.serve("/m.bin", &body);
    let other = env.serve("/other/m.bin", &bytes(3_000, 22));
    let other = env.url("mirror.test", other.path());
    env.origin.route("/missing/m.bin", Behaviour::Status(404));
    let missing = env.url("cdn.test", "/missing/m.bin");
    let solo = env.serve("/solo.bin", b"solo");
    let path = env.write_manifest(
        "notochord.json",
        json!([
            { "id": "m", "url": url.as_str(), "mirrors": [other.as_str(), missing.as_str()] },
            { "id": "solo", "url": solo.as_str() },
        ]),
    );
    (path, body)
}

/// What `autofill --manifest` says of each address of `m`.
fn address_lines(err: &str) -> Vec<&str> {
    err.lines().filter(|l| l.starts_with("m: ")).collect()
}

#[tokio::test]
async fn every_mirror_is_read_and_each_address_reported() {
    let env = Env::new().await;
    let (path, body) = checked_mirrors(&env);
    let m = path.to_str().unwrap();
    let out = env.run(&["autofill", "--manifest", m]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let lines = address_lines(&err);
    assert_eq!(lines.len(), 3, "{err}");
    assert_eq!(lines[0], "m: url: ok");
    assert!(
        lines[1].starts_with("m: mirror 1: SHA-256 differs from the url's (E_RESOURCE_SHA256: "),
        "{err}"
    );
    assert!(
        lines[2].starts_with("m: mirror 2: HTTP status 404")
            && lines[2].contains("(E_RESOURCE_HTTP: "),
        "{err}"
    );
    // No line for a resource with only its url; the values come from the url.
    assert!(!err.contains("solo: url"), "{err}");
    let filled: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(filled["resources"][0]["sha256"], sha256_hex(&body));
    assert_eq!(filled["resources"][1]["size"], 4);
    // Nothing was kept.
    assert!(!env.store_dir().exists());

    let out = env.run(&["--json", "autofill", "--manifest", m]).await;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    let addresses = &v["resources"][0]["addresses"];
    assert_eq!(addresses[0]["ok"], true, "{v}");
    assert_eq!(addresses[1]["code"], "E_RESOURCE_SHA256", "{v}");
    assert_eq!(addresses[1]["sha256"], sha256_hex(&bytes(3_000, 22)), "{v}");
    assert_eq!(addresses[2]["code"], "E_RESOURCE_HTTP", "{v}");
    // The resource's verdict: the url's values are used, and which
    // addresses disagreed.
    assert_eq!(v["resources"][0]["ok"], false, "{v}");
    assert_eq!(
        v["resources"][0]["disagreeing"],
        json!(["mirror 1", "mirror 2"]),
        "{v}"
    );

    // --url-only: the url answers, the mirrors are not read.
    let (other, missing) = (
        env.origin.hits("/other/m.bin"),
        env.origin.hits("/missing/m.bin"),
    );
    let out = env.run(&["autofill", "--url-only", "--manifest", m]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(address_lines(&stderr(&out)).is_empty(), "{}", stderr(&out));
    assert_eq!(env.origin.hits("/other/m.bin"), other);
    assert_eq!(env.origin.hits("/missing/m.bin"), missing);
}

#[cfg(unix)]
#[tokio::test]
async fn a_service_checks_the_mirrors_as_the_command_line_does() {
    let env = Env::new().await;
    let (path, _) = checked_mirrors(&env);
    let m = path.to_str().unwrap();
    let here = env.run(&["autofill", "--manifest", m]).await;
    let gems = env.dir.path().join("gems");
    std::fs::create_dir_all(&gems).unwrap();
    let _serve = spawn_serve(&env, &gems, "0.1", &env.dir.path().join("serve.log"));
    wait_until("the service listens", || {
        store_root(&env).join("service.json").exists()
    })
    .await;
    let there = env.run(&["-vv", "autofill", "--manifest", m]).await;
    assert!(
        stderr(&there).contains("using the service's local API"),
        "{}",
        stderr(&there)
    );
    assert_eq!(there.status.code(), here.status.code());
    assert_eq!(
        address_lines(&stderr(&there)),
        address_lines(&stderr(&here))
    );
    assert_eq!(stdout(&there), stdout(&here));
    // The same verdict as JSON, through the service and in process.
    let json_there: Value = serde_json::from_slice(
        &env.run(&["--json", "autofill", "--manifest", m])
            .await
            .stdout,
    )
    .unwrap();
    let json_here: Value = serde_json::from_slice(
        &env.run(&["--json", "--no-service", "autofill", "--manifest", m])
            .await
            .stdout,
    )
    .unwrap();
    for key in ["ok", "disagreeing", "served_by"] {
        assert_eq!(
            json_there["resources"][0][key], json_here["resources"][0][key],
            "{key}: {json_there} / {json_here}"
        );
    }
    assert_eq!(json_there["resources"][0]["ok"], false, "{json_there}");
}

#[tokio::test]
async fn a_stalled_first_entry_holds_no_other_entry_back() {
    let env = Env::new().await;
    write_patient_config(&env, "[service]\nmax_concurrent_downloads = 2\n");
    let gate = Gate::new();
    let (bodies, entries) = crate::cli_basics::batch_held_first(&env, 5, &gate, false);
    let path = env.write_manifest("batch.json", json!(entries));
    let log = env.dir.path().join("autofill.log");
    let args = ["autofill", "--manifest", path.to_str().unwrap(), "--write"];
    let mut child = spawn_logged(&env, &args, &log);
    wait_until("every other entry is read while the first is held", || {
        (1..bodies.len()).all(|i| env.origin.hits(&format!("/batch/{i}.bin")) == 1)
    })
    .await;
    gate.open();
    assert!(wait_output(&mut child).await.success());
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for (i, body) in bodies.iter().enumerate() {
        let r = &written["resources"][i];
        assert_eq!(r["id"], format!("f{i}"));
        assert_eq!(r["sha256"], sha256_hex(body), "{written}");
    }
}

/// The first 12 digits of a SHA-256 and `…`, as the lines show it.
fn short(sha256: &str) -> String {
    format!("{}…", &sha256[..12])
}

#[tokio::test]
async fn all_lists_each_change_old_to_new_and_a_wrong_value_without_it_is_a_problem() {
    let env = Env::new().await;
    let a = bytes(100, 15);
    let b = bytes(7, 16);
    let (url_a, url_b) = (env.serve("/a.bin", &a), env.serve("/b.bin", &b));
    let old = sha256_hex(b"old");
    // b declares size 5 and another file's SHA-256.
    let text = manifest_text(url_a.as_str(), url_b.as_str(), &old);
    let path = write(&env, &text);
    let p = path.to_str().unwrap();
    let out = env
        .run(&["autofill", "--manifest", p, "--all", "--write"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.contains(&format!("Filling a: size 100, sha256 {}", short(&sha256_hex(&a))).as_str()),
        "{err}"
    );
    assert!(
        lines.contains(
            &format!(
                "Updating b: size 5 → 7, sha256 {} → {}",
                short(&old),
                short(&sha256_hex(&b))
            )
            .as_str()
        ),
        "{err}"
    );
    assert!(
        lines.contains(&format!("wrote {p}: 1 filled, 1 updated").as_str()),
        "{err}"
    );
    // The log record stays the service's: no log line here.
    assert!(
        !err.contains("WARN") && !err.contains("gem_resources::"),
        "{err}"
    );
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(written["resources"][1]["size"], 7, "{written}");
    // As JSON: the values replaced.
    std::fs::write(&path, &text).unwrap();
    let out = env
        .run(&["--json", "autofill", "--manifest", p, "--all"])
        .await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["resources"][1]["replaced"],
        json!({ "size": 5, "sha256": old }),
        "{v}"
    );
    assert!(v["resources"][0].get("replaced").is_none(), "{v}");

    // Without --all, a declared value that differs is a problem, with the
    // command that replaces it; nothing of it is written.
    let c = env.serve("/c.bin", b"12345");
    let path = env.write_manifest(
        "partial.json",
        json!([{ "id": "c", "url": c.as_str(), "sha256": old }]),
    );
    let before = std::fs::read_to_string(&path).unwrap();
    let p = path.to_str().unwrap();
    let out = env.run(&["autofill", "--manifest", p, "--write"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "wrong: c: {c} serves sha256 {}; the manifest says sha256 {}",
            short(&sha256_hex(b"12345")),
            short(&old)
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "`gem-resources autofill --manifest {p} --all --write` replaces them"
        )),
        "{err}"
    );
    assert!(!err.contains("filled 0"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), before);

    // Every value declared: nothing is read, and it says how to compare.
    let path = env.write_manifest(
        "full.json",
        json!([{ "id": "c", "url": c.as_str(), "sha256": old, "size": 5 }]),
    );
    let out = env
        .run(&["autofill", "--manifest", path.to_str().unwrap(), "--write"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing to fill") && stderr(&out).contains("--check"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn check_gives_one_verdict_per_resource_and_nothing_else_on_stdout() {
    let env = Env::new().await;
    let a = bytes(100, 25);
    let b = bytes(7, 26);
    let c = bytes(9, 27);
    let (url_a, url_b, url_c) = (
        env.serve("/a.bin", &a),
        env.serve("/b.bin", &b),
        env.serve("/c.bin", &c),
    );
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let gone = env.url("origin.test", "/gone.bin");
    let other = env.serve("/other/a.bin", &bytes(100, 28));
    let other = env.url("mirror.test", other.path());
    let old = sha256_hex(b"old");
    let doc = json!([
        // Right at its url; its mirror serves another file.
        { "id": "a", "url": url_a.as_str(), "mirrors": [other.as_str()], "size": 100, "sha256": sha256_hex(&a) },
        { "id": "b", "url": url_b.as_str(), "size": 7, "sha256": old },
        { "id": "c", "url": url_c.as_str(), "size": 5, "sha256": sha256_hex(&c) },
        { "id": "d", "url": gone.as_str(), "size": 5, "sha256": old },
        { "id": "e", "url": url_a.as_str(), "size": 100, "sha256": sha256_hex(&a) },
    ]);
    let path = env.write_manifest("notochord.json", doc);
    let before = std::fs::read_to_string(&path).unwrap();
    let p = path.to_str().unwrap();
    let out = env.run(&["autofill", "--manifest", p, "--check"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let expected = [
        format!(
            "badsha  a: mirror 1 serves sha256 {}, the manifest says {} ({other})",
            short(&sha256_hex(&bytes(100, 28))),
            short(&sha256_hex(&a))
        ),
        format!(
            "badsha  b: the url serves sha256 {}, the manifest says {} ({url_b})",
            short(&sha256_hex(&b)),
            short(&old)
        ),
        format!(
            "badsize c: the url serves 9 bytes (sha256 {}), the manifest says 5 (sha256 {}) ({url_c})",
            short(&sha256_hex(&c)),
            short(&sha256_hex(&c))
        ),
        format!("nofile  d: the url answers HTTP status 404 Not Found ({gone})"),
        "ok      e".to_string(),
    ];
    assert_eq!(stdout(&out), expected.join("\n") + "\n");
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "`gem-resources autofill --manifest {p} --all --write`"
        )),
        "{err}"
    );
    assert!(err.contains("4 of 5 resource(s) wrong"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        before,
        "nothing written"
    );

    // As JSON: a document per resource with a stable code.
    let out = env
        .run(&["--json", "autofill", "--manifest", p, "--check"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    assert!(v.get("manifest").is_none(), "{v}");
    let r = &v["resources"];
    let codes: Vec<(&str, &str, &str)> = (0..5)
        .map(|i| {
            (
                r[i]["id"].as_str().unwrap(),
                r[i]["verdict"].as_str().unwrap(),
                r[i]["code"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        codes,
        [
            ("a", "badsha", "E_RESOURCE_SHA256"),
            ("b", "badsha", "E_RESOURCE_SHA256"),
            ("c", "badsize", "E_RESOURCE_SIZE"),
            ("d", "nofile", "E_RESOURCE_HTTP"),
            ("e", "ok", "-"),
        ],
        "{v}"
    );
    assert_eq!(r[1]["address"], url_b.as_str(), "{v}");
    assert_eq!(r[1]["addresses"][0]["sha256"], sha256_hex(&b), "{v}");
    assert_eq!(r[1]["declared"]["sha256"], old, "{v}");
    assert_eq!(r[0]["addresses"][0]["verdict"], "ok", "{v}");
    assert_eq!(r[4]["ok"], true, "{v}");

    // The right values: every verdict ok, exit 0.
    let doc = json!([{ "id": "e", "url": url_a.as_str(), "size": 100, "sha256": sha256_hex(&a) }]);
    let path = env.write_manifest("right.json", doc);
    let out = env
        .run(&["autofill", "--manifest", path.to_str().unwrap(), "--check"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "ok      e\n");
    // It goes with --manifest alone, never with --write.
    let out = env
        .run(&["autofill", "--manifest", p, "--check", "--write"])
        .await;
    assert_eq!(out.status.code(), Some(2));
}
