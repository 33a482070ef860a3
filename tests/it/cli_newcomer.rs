//! The command line as a newcomer meets it: each failure printed once, no
//! escape codes in pipes, honest summaries, helpful errors, clean paths.

use std::process::Output;

use serde_json::json;

use crate::support::*;

/// Runs the binary like [`Env::run`] but with `NO_COLOR` unset and
/// `RUST_LOG` as given: what a user's shell passes.
async fn run_plain(env: &Env, rust_log: &str, args: &[&str]) -> Output {
    let config = env.dir.path().join("config.toml");
    let mut all: Vec<String> = vec!["--config".into(), config.display().to_string()];
    all.extend(args.iter().map(|s| s.to_string()));
    let rust_log = rust_log.to_string();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .args(&all)
            .env_remove("NO_COLOR")
            .env("RUST_LOG", rust_log)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// An https address on a local port nothing listens on.
fn refused_url() -> url::Url {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    url::Url::parse(&format!("https://origin.test:{port}/model.onnx")).unwrap()
}

#[tokio::test]
async fn a_refused_connection_is_printed_once_by_path() {
    let env = Env::new().await;
    let url = refused_url();
    let m = env.write_manifest("m.json", json!([entry("model", &url, b"abc")]));
    let install = env.run(&["install", "g", m.to_str().unwrap()]).await;
    assert!(install.status.success(), "{}", stderr(&install));
    let out = run_plain(&env, "warn", &["path", "g", "model"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.matches("E_RESOURCE_UNAVAILABLE").count(), 1, "{err}");
    assert_eq!(err.matches("E_RESOURCE_NETWORK").count(), 1, "{err}");
    assert!(!err.contains("WARN"), "{err}");
    assert_eq!(stdout(&out), "");
}

#[tokio::test]
async fn log_lines_carry_no_escape_codes_when_stderr_is_not_a_terminal() {
    let env = Env::new().await;
    let body = bytes(1000, 90);
    let url = env.serve("/plain.bin", &body);
    let m = env.write_manifest("m.json", json!([entry("plain", &url, &body)]));
    let out = run_plain(&env, "debug", &["fetch", m.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("DEBUG"), "no log line to check:\n{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
}

#[tokio::test]
async fn install_no_wait_queues_and_records_no_failure() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(400_000, 91);
    let (url, _gate) = env.serve_gated("/held.bin", &body);
    let m = env.write_manifest("m.json", json!([required_entry("held", &url, &body)]));
    // The stop raced the download's own clean-up; try it a few times.
    for _ in 0..3 {
        let out = env
            .run(&["install", "--no-wait", "g", m.to_str().unwrap()])
            .await;
        assert!(out.status.success(), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(
                "queued: 1 file(s); they download in the background of `serve`, or now with `sync`"
            ),
            "{err}"
        );
        assert!(!err.contains("E_RESOURCE"), "{err}");
        let status = env.run(&["--json", "status"]).await;
        let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(v["gems"][0]["resources"][0]["state"], "missing", "{v}");
    }
    assert!(partial_files(&env).is_empty(), "{:?}", partial_files(&env));
}

#[tokio::test]
async fn install_says_what_was_present_downloaded_and_failed() {
    let env = Env::new().await;
    let (a, b) = (bytes(2000, 92), bytes(3000, 93));
    let ua = env.serve("/a.bin", &a);
    let ub = env.serve("/b.bin", &b);
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let gone = env.url("origin.test", "/gone.bin");
    let first = env.write_manifest("first.json", json!([required_entry("a", &ua, &a)]));
    assert!(env
        .run(&["install", "other", first.to_str().unwrap()])
        .await
        .status
        .success());
    let m = env.write_manifest(
        "m.json",
        json!([
            required_entry("a", &ua, &a),
            required_entry("b", &ub, &b),
            required_entry("gone", &gone, b"zz")
        ]),
    );
    let out = env.run(&["install", "g", m.to_str().unwrap()]).await;
    // A failed download does not fail the install; the summary says it.
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "installed g: 1 present, 1 downloaded, 1 failed (E_RESOURCE_UNAVAILABLE, see `status`)"
        ),
        "{err}"
    );
    // The failure's own line: its code in front, then each address.
    let failed = format!(
        "E_RESOURCE_UNAVAILABLE: resource \"gone\": every address failed\n  - E_RESOURCE_HTTP: {gone}: HTTP status 404"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("E_RESOURCE_UNAVAILABLE: ")),
        "{err}"
    );
    assert!(err.contains(&failed), "{err}");
    let again = env.run(&["install", "g", m.to_str().unwrap()]).await;
    let err = stderr(&again);
    assert!(err.contains("g is unchanged: "), "{err}");
    assert!(!err.contains("upgraded"), "{err}");
}

#[tokio::test]
async fn path_with_an_unknown_id_lists_the_ids_the_gem_declares() {
    let env = Env::new().await;
    let (a, b) = (bytes(100, 94), bytes(100, 95));
    let m = env.write_manifest(
        "m.json",
        json!([
            entry("ocr-model", &env.serve("/a.bin", &a), &a),
            entry("dictionary", &env.serve("/b.bin", &b), &b)
        ]),
    );
    assert!(env
        .run(&["install", "g", m.to_str().unwrap()])
        .await
        .status
        .success());
    let out = env.run(&["path", "g", "Big model"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("E_RESOURCE_NOT_FOUND"), "{err}");
    assert!(err.contains("ocr-model, dictionary"), "{err}");
}

#[tokio::test]
async fn a_relative_store_prints_normalised_paths() {
    let env = Env::new().await;
    let conf = env.dir.path().join("conf");
    std::fs::create_dir(&conf).unwrap();
    let text = std::fs::read_to_string(env.dir.path().join("config.toml"))
        .unwrap()
        .replace("store = \"store\"", "store = \"../store\"")
        .replace("\"ca.pem\"", "\"../ca.pem\"");
    std::fs::write(conf.join("config.toml"), text).unwrap();
    let body = bytes(1000, 96);
    let m = env.write_manifest(
        "m.json",
        json!([entry("x", &env.serve("/x.bin", &body), &body)]),
    );
    let out = run_bin(vec![
        "--config".into(),
        conf.join("config.toml").display().to_string(),
        "fetch".into(),
        m.display().to_string(),
    ])
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let path = text.trim().split_once('\t').unwrap().1;
    assert!(!path.contains("/../") && !path.contains("/./"), "{path}");
    assert!(
        std::path::Path::new(path).starts_with(env.dir.path().join("store")),
        "{path}"
    );
}

#[tokio::test]
async fn a_configuration_error_names_the_file_line_and_key() {
    let env = Env::new().await;
    let config = env.dir.path().join("config.toml");
    std::fs::write(
        &config,
        "# mine\n[network]\nretries = 1\n[dev]\nallow_addresses = [\"127.0.0.1\", \"nope\"]\n",
    )
    .unwrap();
    let out = env.run(&["status"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.starts_with("E_RESOURCE_CONFIG: "), "{err}");
    assert!(
        err.contains("config.toml: line 5, key dev.allow_addresses"),
        "{err}"
    );
    assert!(err.contains("\"nope\""), "{err}");

    std::fs::write(&config, "store = ../store\n").unwrap();
    let err = stderr(&env.run(&["status"]).await);
    assert!(err.contains("line 1, key store"), "{err}");
    assert!(err.contains("store = \"../store\""), "{err}");
}

#[tokio::test]
async fn a_bare_address_in_allow_addresses_is_a_single_address() {
    let env = Env::new().await;
    let config = env.dir.path().join("config.toml");
    // near.test answers with the address next to the exempt one.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("\"127.0.0.1/32\"", "\"127.0.0.1\"")
        .replace(
            "resolve = { ",
            "resolve = { \"near.test\" = [\"127.0.0.2\"], ",
        );
    std::fs::write(&config, text).unwrap();
    let body = bytes(500, 97);
    let url = env.serve("/x.bin", &body);
    let m = env.write_manifest("m.json", json!([entry("x", &url, &body)]));
    let out = env.run(&["fetch", m.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let near = url.as_str().replace("origin.test", "near.test");
    let out = env.run(&["check-url", &near]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("E_RESOURCE_ADDRESS"), "{err}");
    assert!(err.contains("127.0.0.2"), "{err}");
    assert!(err.contains("loopback"), "{err}");
}

#[tokio::test]
async fn status_and_uninstall_on_a_missing_store_create_nothing() {
    let env = Env::new().await;
    let store = env.store_dir().display().to_string();
    let no_store = format!("E_RESOURCE_NOT_FOUND: no store at {store} ");
    for args in [
        vec!["status"],
        vec!["status", "g"],
        vec!["path", "g", "r"],
        vec!["verify"],
        vec!["gc"],
        vec!["gc", "--dry-run"],
    ] {
        let out = env.run(&args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stdout(&out));
        let last = stderr(&out).lines().last().unwrap_or_default().to_string();
        assert!(last.starts_with(&no_store), "{args:?}: {}", stderr(&out));
        assert!(
            !stdout(&out).contains("declared"),
            "{args:?}: {}",
            stdout(&out)
        );
        let mut json_args = vec!["--json"];
        json_args.extend(&args);
        let out = env.run(&json_args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let doc: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        assert_eq!(doc["ok"], false, "{args:?}: {doc}");
        assert_eq!(doc["code"], "E_RESOURCE_NOT_FOUND", "{args:?}: {doc}");
    }
    let out = env.run(&["uninstall", "g"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim(),
        format!("g is not installed (no store at {store}); nothing to do")
    );
    let out = env.run(&["--json", "uninstall", "g"]).await;
    let doc: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(
        (doc["ok"].clone(), doc["installed"].clone()),
        (json!(true), json!(false))
    );
    assert_eq!(doc["store"], store.as_str(), "{doc}");
    assert!(
        !env.store_dir().exists(),
        "a read-only command created the store"
    );
}

#[tokio::test]
async fn status_names_the_store_it_read() {
    let env = Env::new().await;
    let body = bytes(300, 5);
    let url = env.serve("/s.bin", &body);
    let m = env.write_manifest("m.json", json!([entry("s", &url, &body)]));
    let out = env.run(&["install", "g", m.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let store = env.store_dir().display().to_string();
    let out = env.run(&["status"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(
        text.lines().last(),
        Some(format!("store: {store}").as_str()),
        "{text}"
    );
    let out = env.run(&["--json", "status"]).await;
    let doc: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(doc["store"], store.as_str(), "{doc}");
    let out = env.run(&["uninstall", "other"]).await;
    assert_eq!(
        stderr(&out).trim(),
        format!("other is not installed (in the store {store}); nothing to do")
    );
}

#[tokio::test]
async fn serve_with_a_missing_gems_folder_gives_a_code() {
    let env = Env::new().await;
    let missing = env.dir.path().join("no-such-dir");
    let out = env
        .run(&["serve", "--gems", missing.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("E_RESOURCE_NOT_FOUND: gems folder"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn every_subcommand_has_an_example_and_help_has_its_own_help() {
    for sub in [
        "check",
        "check-url",
        "autofill",
        "fetch",
        "install",
        "uninstall",
        "path",
        "status",
        "sync",
        "verify",
        "serve",
        "help",
    ] {
        let out = run_bin(vec![sub.into(), "--help".into()]).await;
        assert!(out.status.success(), "{sub}: {}", stderr(&out));
        assert!(
            stdout(&out).contains("Example:\n  gem-resources "),
            "{sub}: {}",
            stdout(&out)
        );
    }
    let out = run_bin(vec!["--help".into()]).await;
    let text = stdout(&out);
    for needle in [
        "Exit status:",
        "130",
        "RUST_LOG",
        "NO_COLOR",
        "config.toml",
        "store",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    let out = run_bin(vec!["help".into(), "verify".into()]).await;
    assert!(
        stdout(&out).contains("Usage: gem-resources verify"),
        "{}",
        stdout(&out)
    );
}

/// Runs the binary as `user` with the env's configuration, off the async
/// runtime.
#[cfg(unix)]
async fn run_as(env: &Env, user: (u32, u32), args: &[&str]) -> Output {
    let mut command = as_user(user, env!("CARGO_BIN_EXE_gem-resources"));
    command
        .arg("--config")
        .arg(env.dir.path().join("config.toml"))
        .args(args)
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1");
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

#[cfg(unix)]
#[tokio::test]
async fn commands_on_a_store_its_user_may_only_read_say_the_store_is_read_only() {
    use std::os::unix::fs::{chown, PermissionsExt};
    const TEST: &str = "commands_on_a_store_its_user_may_only_read_say_the_store_is_read_only";
    let Some(user) = second_user(TEST) else {
        return;
    };
    let env = Env::new().await;
    let body = bytes(400, 71);
    let url = env.serve("/lazy.bin", &body);
    let m = env.write_manifest("m.json", json!([entry("lazy", &url, &body)]));
    // The user reaches the scratch folder's files and owns the store.
    let open = std::fs::Permissions::from_mode(0o755);
    std::fs::set_permissions(env.dir.path(), open).unwrap();
    std::fs::create_dir(env.store_dir()).unwrap();
    chown(env.store_dir(), Some(user.0), Some(user.1)).unwrap();
    let out = run_as(&env, user, &["install", "g", m.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    // As an earlier version left it: `stamps/` and `served/` were made
    // on first use only.
    for sub in ["stamps", "served"] {
        let _ = std::fs::remove_dir_all(store_root(&env).join(sub));
    }
    // Then the store becomes read-only, as a read-only mount or a copy
    // handed over would be.
    let done = std::process::Command::new("chmod")
        .args(["-R", "a-w"])
        .arg(env.store_dir())
        .status()
        .unwrap();
    assert!(done.success());
    let out = run_as(&env, user, &["path", "g", "lazy"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let store = env.store_dir().display().to_string();
    // With no service, `path` says it works in this process, then why not.
    let config = env.dir.path().join("config.toml");
    assert_eq!(
        stderr(&out).trim(),
        format!("no service; working in this process with {}\nE_RESOURCE_IO: the store is read-only; cannot download g/lazy (lazy.bin) into {store}: Permission denied (os error 13)", config.display())
    );
    assert_eq!(env.origin.hits("/lazy.bin"), 0);
    // `fetch` and `install` say the same, naming what they could not do.
    let out = run_as(&env, user, &["fetch", m.to_str().unwrap(), "lazy"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert_eq!(
        stderr(&out).trim(),
        format!("E_RESOURCE_IO: the store is read-only; cannot download lazy (lazy.bin) into {store}: Permission denied (os error 13)")
    );
    let out = run_as(&env, user, &["install", "g", m.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert_eq!(
        stderr(&out).trim(),
        format!("E_RESOURCE_IO: the store is read-only; cannot install g into {store}: Permission denied (os error 13)")
    );
    assert_eq!(env.origin.hits("/lazy.bin"), 0);
    // What it holds is still read.
    let out = run_as(&env, user, &["status", "g"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
}
