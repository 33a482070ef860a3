//! Messages that say what is wrong and what to do: configuration files
//! that cannot be read, a mistyped subcommand, a refused local address.

use crate::support::*;

#[tokio::test]
async fn a_missing_config_file_or_certificate_is_a_configuration_error_naming_it() {
    let env = Env::new().await;
    let missing = env.dir.path().join("missing.toml");
    let out = run_bin(vec![
        "--config".into(),
        missing.display().to_string(),
        "status".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with(&format!(
            "E_RESOURCE_CONFIG: {}: cannot read the configuration file given by --config: ",
            missing.display()
        )),
        "{err}"
    );

    let config = env.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("\"ca.pem\"", "\"gone.pem\"")).unwrap();
    let out = env.run(&["autofill", "https://origin.test/a.bin"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.starts_with("E_"))
        .unwrap_or_default();
    assert!(
        line.starts_with(
            "E_RESOURCE_CONFIG: [dev] extra_root_certs: cannot read the certificate file "
        ) && line.contains("gone.pem"),
        "{err}"
    );
}

#[tokio::test]
async fn a_mistyped_subcommand_gets_a_suggestion() {
    let out = run_bin(vec!["stauts".into()]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("similar subcommand exists: 'status'"), "{err}");
}

#[tokio::test]
async fn serve_help_says_what_it_reads_and_when_it_reloads() {
    let out = run_bin(vec!["serve".into(), "--help".into()]).await;
    let text = stdout(&out);
    for needle in [
        "notochord.json",
        "manifest.json",
        "SIGHUP",
        "configuration file",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    let out = run_bin(vec!["autofill".into(), "--help".into()]).await;
    let text = stdout(&out);
    for needle in ["--manifest <FILE>", "--all", "--write", "retried"] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    let out = run_bin(vec!["--help".into()]).await;
    assert!(
        stdout(&out).contains("--limit-rate <RATE>"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test]
async fn disk_space_is_said_in_human_units_and_in_bytes_in_json() {
    let env = Env::new().await;
    let url = env.serve("/huge.bin", b"x");
    let mut huge = entry("huge", &url, b"x");
    huge["size"] = serde_json::json!(900_000_000_000_000u64);
    let manifest = env.write_manifest("m.json", serde_json::json!([huge]));
    let m = manifest.to_str().unwrap();
    let out = env.run(&["fetch", m]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("needs 818.5 TiB but only ") && stderr(&out).contains(" are free"),
        "{}",
        stderr(&out)
    );
    let out = env.run(&["--json", "fetch", m]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &v["resources"][0];
    assert_eq!(r["code"], "E_RESOURCE_DISK_SPACE", "{v}");
    assert_eq!(r["needed_bytes"], 900_000_000_000_000u64, "{v}");
    assert!(r["free_bytes"].as_u64().is_some(), "{v}");
    assert_eq!(r["reserved_bytes"], 0, "{v}");
    assert_eq!(env.origin.hits("/huge.bin"), 0);
}

/// What the binary says of the configuration `text`, which it refuses.
async fn say(env: &Env, text: &str) -> String {
    std::fs::write(env.dir.path().join("config.toml"), text).unwrap();
    let out = env
        .run(&["check-url", "https://cdn.example.com/m.onnx"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{text}");
    stderr(&out)
}

#[tokio::test]
async fn a_config_typo_gets_the_key_it_was_meant_to_be_and_a_misplaced_key_its_table() {
    let env = Env::new().await;
    let err = say(&env, "[network]\nretires = 3\n").await;
    assert!(
        err.contains("line 2, key network.retires: unknown key `retires` in `[network]` (did you mean `retries`?)"),
        "{err}"
    );
    let err = say(&env, "[dev]\nstore = \"elsewhere\"\n").await;
    assert!(
        err.contains("line 2, key dev.store: unknown key `store` here (it is a top-level key; move it above `[dev]`)"),
        "{err}"
    );
    let err = say(&env, "retries = 3\n[dev]\n").await;
    assert!(
        err.contains("unknown key `retries` here (it belongs in `[network]`; move it there)"),
        "{err}"
    );
    let err = say(&env, "[network]\nmax_bytes_per_sec = \"fast\"\n").await;
    assert!(
        err.contains("key network.max_bytes_per_sec: not a rate: \"fast\" (e.g. 500k or 2M)"),
        "{err}"
    );
}

#[tokio::test]
async fn the_configured_cap_takes_a_rate_as_limit_rate_does() {
    let env = Env::new().await;
    env.write_config("max_bytes_per_sec = \"200k\"");
    let body = bytes(600 << 10, 3);
    let url = env.serve("/capped.bin", &body);
    let manifest = env.write_manifest("m.json", serde_json::json!([entry("capped", &url, &body)]));
    let start = std::time::Instant::now();
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    let elapsed = start.elapsed().as_secs_f64();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // 600 KiB at 200 KiB/s.
    assert!(elapsed >= 2.5, "took {elapsed:.2} s");
}

#[tokio::test]
async fn a_refused_local_name_points_to_dev_resolve_and_an_address_to_allow_addresses() {
    let env = Env::new().await;
    // `localhost` is refused by its name, before any lookup: no address
    // range can let it through, a fixed answer under `[dev] resolve` can.
    let out = env.run(&["check-url", "https://localhost/model.bin"]).await;
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    assert!(
        text.contains("localhost is a local or internal-network address (local host name; for a local test origin, give the name a fixed answer under `[dev] resolve` and that address under `[dev] allow_addresses`, see docs/configuration.md)"),
        "{text}"
    );
    let out = env.run(&["check-url", "https://10.1.2.3/model.bin"]).await;
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    assert!(
        text.contains("(private network (10.0.0.0/8); for a local test origin, see `[dev] allow_addresses` in docs/configuration.md)"),
        "{text}"
    );
    assert!(!text.contains("[dev] resolve"), "{text}");
}
