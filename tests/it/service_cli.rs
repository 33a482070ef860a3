//! The service through the binary: install, path, status, sync, verify,
//! uninstall, a failed upgrade, and two processes sharing one store.

use std::path::PathBuf;

use serde_json::json;

use crate::support::*;

fn assert_ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
}

async fn status_json(env: &Env) -> serde_json::Value {
    let out = env.run(&["--json", "status"]).await;
    assert_ok(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn install_waits_for_required_downloads_and_leaves_lazy_ones() {
    let env = Env::new().await;
    let (req, lazy) = (bytes(20_000, 31), bytes(2000, 32));
    let req_url = env.serve("/req.bin", &req);
    let lazy_url = env.serve("/lazy.bin", &lazy);
    let m = env.write_manifest(
        "notochord.json",
        json!([
            required_entry("req", &req_url, &req),
            entry("lazy", &lazy_url, &lazy)
        ]),
    );
    let out = env.run(&["install", "g", m.to_str().unwrap()]).await;
    assert_ok(&out);
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    assert_eq!(stored_files(&env, &req).len(), 1);
    assert!(stored_files(&env, &lazy).is_empty());
    assert_eq!(env.origin.hits("/req.bin"), 1);
    assert_eq!(env.origin.hits("/lazy.bin"), 0);
}

#[tokio::test]
async fn install_no_wait_returns_before_the_download_finishes() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(20_000, 33);
    let (url, gate) = env.serve_gated("/held.bin", &body);
    let m = env.write_manifest("m.json", json!([required_entry("held", &url, &body)]));
    // The gate stays closed, so the download cannot finish before install
    // returns.
    let out = within(
        "install --no-wait",
        env.run(&["--json", "install", "--no-wait", "g", m.to_str().unwrap()]),
    )
    .await;
    assert_ok(&out);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["report"]["queued"], 1, "{report}");
    assert_eq!(report["report"]["present"], 0, "{report}");
    let requested = env.origin.hits("/held.bin");
    assert!(requested <= 1, "{requested}");
    assert!(stored_files(&env, &body).is_empty());
    // The stopped process left nothing half-written behind, and stopping
    // was not a failure.
    assert!(partial_files(&env).is_empty(), "{:?}", partial_files(&env));
    let status = status_json(&env).await;
    assert_eq!(status["gems"][0]["gem"], "g");
    assert_eq!(
        status["gems"][0]["resources"][0]["state"], "missing",
        "{status}"
    );
    // The queued file downloads at the next start.
    gate.open();
    assert_ok(&env.run(&["sync"]).await);
    assert_eq!(stored_files(&env, &body).len(), 1);
    assert_eq!(env.origin.hits("/held.bin"), requested + 1);
}

#[tokio::test]
async fn install_of_a_gem_whose_required_file_fails_still_succeeds() {
    let env = Env::new().await;
    let body = bytes(1000, 34);
    env.origin.route("/nope.bin", Behaviour::Status(404));
    let url = env.url("origin.test", "/nope.bin");
    let m = env.write_manifest("m.json", json!([required_entry("nope", &url, &body)]));
    let out = env.run(&["install", "g", m.to_str().unwrap()]).await;
    assert_ok(&out);
    assert!(
        stderr(&out).contains("E_RESOURCE_UNAVAILABLE"),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.origin.hits("/nope.bin"), 1);
    let status = status_json(&env).await;
    let r = &status["gems"][0]["resources"][0];
    assert_eq!(r["state"], "failed");
    assert_eq!(r["code"], "E_RESOURCE_UNAVAILABLE");
    assert_eq!(r["attempts"][0]["code"], "E_RESOURCE_HTTP");
}

#[tokio::test]
async fn path_prints_only_the_path_of_the_downloaded_file() {
    let env = Env::new().await;
    let body = bytes(30_000, 35);
    let url = env.serve("/models/ocr-v3.onnx", &body);
    let m = env.write_manifest("m.json", json!([entry("ocr", &url, &body)]));
    assert_ok(&env.run(&["install", "g", m.to_str().unwrap()]).await);
    assert_eq!(env.origin.hits("/models/ocr-v3.onnx"), 0);

    let out = env.run(&["path", "g", "ocr"]).await;
    assert_ok(&out);
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    let path = PathBuf::from(text.trim());
    assert!(path.is_file(), "{text}");
    assert!(path.ends_with("ocr-v3.onnx"));
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert_eq!(env.origin.hits("/models/ocr-v3.onnx"), 1);

    let again = env.run(&["path", "g", "ocr"]).await;
    assert_ok(&again);
    assert_eq!(stdout(&again), text);
    assert_eq!(env.origin.hits("/models/ocr-v3.onnx"), 1);

    let unknown = env.run(&["path", "g", "nope"]).await;
    assert_eq!(unknown.status.code(), Some(1));
    assert!(stdout(&unknown).is_empty());
    assert!(
        stderr(&unknown).contains("E_RESOURCE_NOT_FOUND"),
        "{}",
        stderr(&unknown)
    );
}

#[tokio::test]
async fn a_failed_path_exits_1_with_the_code_and_each_address() {
    let env = Env::new().await;
    let body = bytes(1000, 36);
    env.origin.route("/bad.bin", Behaviour::Status(410));
    let url = env.url("origin.test", "/bad.bin");
    let m = env.write_manifest("m.json", json!([entry("bad", &url, &body)]));
    assert_ok(&env.run(&["install", "g", m.to_str().unwrap()]).await);
    let out = env.run(&["path", "g", "bad"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).is_empty());
    let err = stderr(&out);
    assert!(err.contains("E_RESOURCE_UNAVAILABLE"), "{err}");
    assert!(
        err.contains("E_RESOURCE_HTTP") && err.contains("/bad.bin"),
        "{err}"
    );
    assert_eq!(env.origin.hits("/bad.bin"), 1);
}

#[tokio::test]
async fn status_prints_a_readable_table_and_json() {
    let env = Env::new().await;
    let (a, b, c) = (bytes(2048, 37), bytes(3000, 38), bytes(100, 39));
    let a_url = env.serve("/a.bin", &a);
    env.origin.route("/b.bin", Behaviour::Body(b.clone()));
    let b_url = env.url("cdn.test", "/b.bin");
    env.origin.route("/c.bin", Behaviour::Status(404));
    let c_url = env.url("origin.test", "/c.bin");
    let mut a_entry = required_entry("alpha", &a_url, &a);
    a_entry["description"] = json!("Alpha model");
    let m = env.write_manifest(
        "m.json",
        json!([
            a_entry,
            entry("beta", &b_url, &b),
            required_entry("gamma", &c_url, &c)
        ]),
    );
    assert_ok(&env.run(&["install", "g", m.to_str().unwrap()]).await);

    let out = env.run(&["status"]).await;
    assert_ok(&out);
    let table = stdout(&out);
    let line = |label: &str| {
        table
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line in\n{table}"))
            .to_string()
    };
    assert!(table.lines().next().unwrap().starts_with('g'), "{table}");
    // The id first (what `path` takes), then the description.
    let alpha = line("alpha");
    assert!(alpha.contains("Alpha model"), "{alpha}");
    assert!(
        alpha.contains("origin.test") && alpha.contains("required") && alpha.contains("present"),
        "{alpha}"
    );
    let beta = line("beta");
    assert!(
        beta.contains("cdn.test") && beta.contains("on first use") && beta.contains("missing"),
        "{beta}"
    );
    let gamma = line("gamma");
    assert!(
        gamma.contains("failed") && gamma.contains("E_RESOURCE_UNAVAILABLE"),
        "{gamma}"
    );
    assert!(
        table.contains("E_RESOURCE_HTTP"),
        "the reason per address is shown:\n{table}"
    );

    let v = status_json(&env).await;
    let gems = v["gems"].as_array().unwrap();
    assert_eq!(gems.len(), 1);
    assert_eq!(gems[0]["gem"], "g");
    let rs = gems[0]["resources"].as_array().unwrap();
    assert_eq!(rs.len(), 3);
    assert_eq!(rs[0]["id"], "alpha");
    assert_eq!(rs[0]["label"], "Alpha model");
    assert_eq!(rs[0]["size"], 2048);
    assert_eq!(rs[0]["host"], "origin.test");
    assert_eq!(rs[0]["required"], true);
    assert_eq!(rs[0]["sha256"], sha256_hex(&a));
    assert_eq!(rs[0]["state"], "present");
    assert!(PathBuf::from(rs[0]["path"].as_str().unwrap()).is_file());
    assert_eq!(rs[1]["label"], "beta");
    assert_eq!(rs[1]["required"], false);
    assert_eq!(rs[1]["state"], "missing");
    assert_eq!(rs[2]["state"], "failed");
    assert_eq!(rs[2]["code"], "E_RESOURCE_UNAVAILABLE");
    // RFC 3339, UTC: 2026-11-30T00:53:20Z.
    let at = rs[2]["at"].as_str().unwrap();
    assert!(gem_resources::time::from_rfc3339(at).is_some(), "{at}");
    assert!(at.ends_with('Z') && at.len() == 20, "{at}");
    assert!(rs[2]["attempts"][0]["address"]
        .as_str()
        .unwrap()
        .ends_with("/c.bin"));
    assert!(rs[2]["attempts"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("404"));

    let one = env.run(&["--json", "status", "g"]).await;
    assert_ok(&one);
    let none = env.run(&["status", "other"]).await;
    assert_eq!(none.status.code(), Some(1));
}

#[tokio::test]
async fn sync_downloads_missing_required_files_and_fails_while_one_still_fails() {
    let env = Env::new().await;
    let (a, b) = (bytes(4000, 40), bytes(5000, 41));
    env.origin.route("/a.bin", Behaviour::Status(503));
    env.origin.route("/b.bin", Behaviour::Status(503));
    let m = env.write_manifest(
        "m.json",
        json!([
            required_entry("a", &env.url("origin.test", "/a.bin"), &a),
            required_entry("b", &env.url("origin.test", "/b.bin"), &b)
        ]),
    );
    assert_ok(&env.run(&["install", "g", m.to_str().unwrap()]).await);
    assert_eq!(
        (env.origin.hits("/a.bin"), env.origin.hits("/b.bin")),
        (1, 1)
    );

    env.origin.route("/a.bin", Behaviour::Body(a.clone()));
    let out = env.run(&["sync"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("g/b") || stderr(&out).contains("1 still missing"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stored_files(&env, &a).len(), 1);
    assert_eq!(
        (env.origin.hits("/a.bin"), env.origin.hits("/b.bin")),
        (2, 2)
    );

    env.origin.route("/b.bin", Behaviour::Body(b.clone()));
    let out = env.run(&["sync"]).await;
    assert_ok(&out);
    assert_eq!(stored_files(&env, &b).len(), 1);
    // A was present: not fetched again.
    assert_eq!(
        (env.origin.hits("/a.bin"), env.origin.hits("/b.bin")),
        (2, 3)
    );

    let out = env.run(&["--json", "sync"]).await;
    assert_ok(&out);
    let last = stdout(&out).lines().last().unwrap().to_string();
    let v: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(v["queued"], 0);
    assert_eq!(v["failed"], json!([]));
    assert_eq!(env.origin.total_hits(), 5);
}

#[tokio::test]
async fn verify_removes_and_reports_a_corrupted_file() {
    let env = Env::new().await;
    let (good, bad) = (bytes(3000, 42), bytes(4000, 43));
    let m = env.write_manifest(
        "m.json",
        json!([
            required_entry("good", &env.serve("/good.bin", &good), &good),
            required_entry("bad", &env.serve("/bad.bin", &bad), &bad)
        ]),
    );
    assert_ok(&env.run(&["install", "g", m.to_str().unwrap()]).await);
    let clean = env.run(&["verify"]).await;
    assert_ok(&clean);
    assert!(
        stdout(&clean).contains("verified 2 file(s): 2 good, 0 corrupted"),
        "{}",
        stdout(&clean)
    );

    corrupt(&stored_files(&env, &bad).pop().unwrap());

    let out = env.run(&["verify"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("verified 2 file(s): 1 good, 1 corrupted"),
        "{text}"
    );
    assert!(text.contains("removed corrupted g/bad (bad.bin)"), "{text}");
    // Advice that brings it back, whatever kind of file it is.
    assert!(
        text.contains("`gem-resources path g bad` downloads it again"),
        "{text}"
    );
    assert!(stored_files(&env, &bad).is_empty());
    assert_eq!(stored_files(&env, &good).len(), 1);
    let v = status_json(&env).await;
    assert_eq!(v["gems"][0]["resources"][1]["state"], "missing");

    // The next sync fetches it again.
    assert_ok(&env.run(&["sync"]).await);
    assert_eq!(env.origin.hits("/bad.bin"), 2);
    assert_eq!(env.origin.hits("/good.bin"), 1);
}

#[tokio::test]
async fn verify_repair_downloads_what_it_removed_again() {
    let env = Env::new().await;
    let (good, bad) = (bytes(3000, 45), bytes(4000, 46));
    let m = env.write_manifest(
        "m.json",
        json!([
            required_entry("good", &env.serve("/good.bin", &good), &good),
            entry("bad", &env.serve("/bad.bin", &bad), &bad)
        ]),
    );
    assert_ok(&env.run(&["install", "g", m.to_str().unwrap()]).await);
    assert_ok(&env.run(&["path", "g", "bad"]).await);
    corrupt(&stored_files(&env, &bad).pop().unwrap());

    let out = env.run(&["verify", "--repair"]).await;
    assert_ok(&out);
    let text = stdout(&out);
    assert!(
        text.contains("removed corrupted g/bad (bad.bin); downloading it again"),
        "{text}"
    );
    assert!(
        text.contains("repaired g/bad: downloaded again and verified"),
        "{text}"
    );
    let stored = stored_files(&env, &bad);
    assert_eq!(stored.len(), 1);
    assert_eq!(std::fs::read(&stored[0]).unwrap(), bad);
    assert_eq!(env.origin.hits("/bad.bin"), 2);
    assert_eq!(env.origin.hits("/good.bin"), 1);

    // A file that cannot come back: ok false, exit 1, the reason.
    corrupt(&stored_files(&env, &bad).pop().unwrap());
    env.origin.route("/bad.bin", Behaviour::Status(404));
    let out = env.run(&["--json", "verify", "--repair"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let last = stdout(&out).lines().last().unwrap().to_string();
    let v: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["repaired"], json!([]), "{v}");
    assert_eq!(v["unrepaired"][0]["resource"], "bad", "{v}");
    assert_eq!(
        v["unrepaired"][0]["primary_cause"], "E_RESOURCE_HTTP",
        "{v}"
    );
    assert!(stored_files(&env, &bad).is_empty());
}

#[tokio::test]
async fn verify_repair_after_verify_brings_back_a_missing_required_file() {
    let env = Env::new().await;
    let (good, bad) = (bytes(3000, 47), bytes(4000, 48));
    let m = env.write_manifest(
        "m.json",
        json!([
            required_entry("good", &env.serve("/good.bin", &good), &good),
            required_entry("bad", &env.serve("/bad.bin", &bad), &bad)
        ]),
    );
    assert_ok(&env.run(&["install", "g", m.to_str().unwrap()]).await);
    corrupt(&stored_files(&env, &bad).pop().unwrap());
    // A plain `verify` removes it: exit 1.
    let out = env.run(&["verify"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stored_files(&env, &bad).is_empty());

    // The repair that follows finds it missing and brings it back.
    let out = env.run(&["verify", "--repair"]).await;
    assert_ok(&out);
    let text = stdout(&out);
    assert!(
        text.contains("verified 1 file(s): 1 good, 0 corrupted"),
        "{text}"
    );
    assert!(
        text.contains("missing required g/bad; downloading it again"),
        "{text}"
    );
    assert!(
        text.contains("repaired g/bad: downloaded again and verified"),
        "{text}"
    );
    let stored = stored_files(&env, &bad);
    assert_eq!(stored.len(), 1);
    assert_eq!(std::fs::read(&stored[0]).unwrap(), bad);

    // One that cannot come back: exit 1, said in the JSON document.
    remove_stored(&stored[0]);
    env.origin.route("/bad.bin", Behaviour::Status(404));
    let out = env.run(&["--json", "verify", "--repair"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let last = stdout(&out).lines().last().unwrap().to_string();
    let v: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["unrepaired"][0]["resource"], "bad", "{v}");
    assert_eq!(v["unrepaired"][0]["was_missing"], true, "{v}");
}

#[tokio::test]
async fn uninstall_removes_the_gem_and_its_files() {
    let env = Env::new().await;
    let body = bytes(3000, 44);
    let m = env.write_manifest(
        "m.json",
        json!([required_entry("x", &env.serve("/x.bin", &body), &body)]),
    );
    assert_ok(&env.run(&["install", "g", m.to_str().unwrap()]).await);
    assert_eq!(stored_files(&env, &body).len(), 1);
    let out = env.run(&["uninstall", "g"]).await;
    assert_ok(&out);
    assert!(stored_files(&env, &body).is_empty());
    let v = status_json(&env).await;
    assert_eq!(v["gems"], json!([]));
    // Like `rm -f`: the gem is gone either way.
    let again = env.run(&["uninstall", "g"]).await;
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("g is not installed"),
        "{}",
        stderr(&again)
    );
}

#[tokio::test]
async fn a_failed_upgrade_leaves_the_old_version_and_its_files_in_place() {
    let env = Env::new().await;
    let (a, b) = (bytes(3000, 45), bytes(3500, 46));
    let m = env.write_manifest(
        "v1.json",
        json!([
            required_entry("a", &env.serve("/a.bin", &a), &a),
            required_entry("b", &env.serve("/b.bin", &b), &b)
        ]),
    );
    assert_ok(&env.run(&["install", "g", m.to_str().unwrap()]).await);
    let before = status_json(&env).await;
    let registration = store_root(&env).join("gems").join("g.json");
    let registered = std::fs::read(&registration).unwrap();

    // v2 drops B but one of its entries is invalid: nothing of it is used.
    let bad = env.write_manifest(
        "v2.json",
        json!([
            required_entry("a", &env.url("origin.test", "/a.bin"), &a),
            { "id": "c", "url": "http://origin.test/c.bin", "sha256": sha256_hex(&b), "size": 1 }
        ]),
    );
    let out = env.run(&["install", "g", bad.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("E_PERM_INVALID"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&registration).unwrap(), registered);
    assert_eq!(status_json(&env).await, before);
    assert_eq!(stored_files(&env, &a).len(), 1);
    assert_eq!(stored_files(&env, &b).len(), 1);
    assert_eq!(env.origin.total_hits(), 2);
}

#[tokio::test]
async fn two_processes_sharing_a_store_make_one_request() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(50_000, 47);
    let (url, gate) = env.serve_gated("/both.bin", &body);
    let m = env.write_manifest("m.json", json!([entry("both", &url, &body)]));
    assert_ok(&env.run(&["install", "g", m.to_str().unwrap()]).await);

    let (log_a, log_b) = (env.dir.path().join("a.log"), env.dir.path().join("b.log"));
    let mut first = spawn_logged(&env, &["path", "g", "both"], &log_a);
    let mut second = spawn_logged(&env, &["path", "g", "both"], &log_b);
    wait_until("the first request", || env.origin.hits("/both.bin") == 1).await;
    // The gate opens only once the other process waits for this download
    // (not before, when a slow process could simply find the file).
    let waiting = |log: &std::path::Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains(WAITING_FOR_LOCK)
    };
    wait_until("the second process waits", || {
        waiting(&log_a) || waiting(&log_b)
    })
    .await;
    gate.open();
    for child in [&mut first, &mut second] {
        let status = wait_output(child).await;
        assert!(status.success(), "{status:?}");
    }
    let (first, second) = (child_stdout(&mut first), child_stdout(&mut second));
    assert_eq!(first, second);
    let path = PathBuf::from(first.trim());
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/both.bin"), 1);
}

#[cfg(unix)]
#[tokio::test]
async fn an_upgrade_whose_registration_cannot_be_written_keeps_the_old_version_and_its_files() {
    let env = Env::new().await;
    let (a, b) = (bytes(3000, 48), bytes(3500, 49));
    let m = env.write_manifest(
        "v1.json",
        json!([
            required_entry("a", &env.serve("/a.bin", &a), &a),
            required_entry("b", &env.serve("/b.bin", &b), &b)
        ]),
    );
    assert_ok(&env.run(&["install", "g", m.to_str().unwrap()]).await);
    let registration = store_root(&env).join("gems").join("g.json");
    let registered = std::fs::read(&registration).unwrap();

    // v2 is valid and drops B, but the process may not write a single byte
    // to a file (file size limit 0, SIGXFSZ ignored), so writing the new
    // registration fails; this runs even as root.
    let v2 = env.write_manifest(
        "v2.json",
        json!([required_entry("a", &env.url("origin.test", "/a.bin"), &a)]),
    );
    let config = env.dir.path().join("config.toml");
    let out = tokio::task::spawn_blocking({
        let (config, v2) = (config.clone(), v2.clone());
        move || {
            std::process::Command::new("sh")
                .arg("-c")
                .arg("trap '' XFSZ; ulimit -f 0; exec \"$0\" \"$@\"")
                .arg(env!("CARGO_BIN_EXE_gem-resources"))
                .arg("--config")
                .arg(config)
                .args(["install", "g"])
                .arg(v2)
                .env_remove("RUST_LOG")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("E_RESOURCE_IO"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&registration).unwrap(), registered);
    assert_eq!(stored_files(&env, &a).len(), 1);
    assert_eq!(stored_files(&env, &b).len(), 1, "B was deleted");
}
