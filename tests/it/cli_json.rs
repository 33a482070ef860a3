//! Every `--json` document says `ok`, counts live in named fields, and
//! failures carry `primary_cause`.

use serde_json::{json, Value};

use crate::support::*;

fn doc(out: &std::process::Output) -> Value {
    let text = stdout(out);
    let last = text.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {text:?} / {}", stderr(out)))
}

#[tokio::test]
async fn every_json_document_says_ok() {
    let env = Env::new().await;
    let body = bytes(20_000, 61);
    let url = env.serve("/j.bin", &body);
    let mirror = env.url("mirror.test", "/j.bin");
    let mut resource = required_entry("j", &url, &body);
    resource["mirrors"] = json!([mirror.as_str()]);
    let manifest = env.write_manifest("m.json", json!([resource]));
    let m = manifest.to_str().unwrap();

    let check = doc(&env.run(&["--json", "check", m]).await);
    assert_eq!(check["ok"], true, "{check}");
    assert_eq!(
        check["resources"][0]["mirrors"],
        json!([mirror.as_str()]),
        "{check}"
    );
    for args in [
        vec!["--json", "install", "g", m],
        vec!["--json", "status"],
        vec!["--json", "path", "g", "j"],
        vec!["--json", "sync"],
        vec!["--json", "verify"],
    ] {
        let out = env.run(&args).await;
        let d = doc(&out);
        assert_eq!(d["ok"], true, "{args:?}: {d}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {d}");
    }
    let verify = doc(&env.run(&["--json", "verify"]).await);
    assert_eq!(verify["intact"], 1, "{verify}");

    // A corrupted file: verify says ok false, and counts by name.
    corrupt(stored_files(&env, &body).first().unwrap());
    let out = env.run(&["--json", "verify"]).await;
    let verify = doc(&out);
    assert_eq!(verify["ok"], false, "{verify}");
    assert_eq!(verify["intact"], 0, "{verify}");
    assert_eq!(out.status.code(), Some(1));

    // A failure: ok false, with its code and primary cause.
    let out = env.run(&["--json", "path", "g", "nope"]).await;
    let failure = doc(&out);
    assert_eq!(failure["ok"], false, "{failure}");
    assert_eq!(failure["code"], "E_RESOURCE_NOT_FOUND");
    assert_eq!(failure["primary_cause"], "E_RESOURCE_NOT_FOUND");

    let uninstall = doc(&env.run(&["--json", "uninstall", "g"]).await);
    assert_eq!(uninstall["ok"], true, "{uninstall}");
    assert_eq!(uninstall["installed"], true, "{uninstall}");
}

#[tokio::test]
async fn a_usage_error_under_json_is_a_document_with_its_code() {
    let env = Env::new().await;
    for (args, says) in [
        (
            &["--json", "frobnicate"][..],
            "unrecognized subcommand 'frobnicate'",
        ),
        (&["--json", "path"][..], "<GEM> <RESOURCE>"),
        (&["path", "--json", "--bogus"][..], "'--bogus'"),
    ] {
        let out = env.run(args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let v = doc(&out);
        assert_eq!(v["ok"], false, "{v}");
        assert_eq!(v["code"], "E_RESOURCE_USAGE", "{v}");
        assert_eq!(v["primary_cause"], "E_RESOURCE_USAGE", "{v}");
        assert!(v["message"].as_str().unwrap().contains(says), "{v}");
    }
    // Without --json, clap's own text on stderr, as before.
    let out = env.run(&["frobnicate"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).is_empty());
    assert!(
        stderr(&out).contains("unrecognized subcommand"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn sync_with_a_required_file_still_missing_says_its_code_and_why() {
    let env = Env::new().await;
    let body = bytes(5_000, 62);
    let url = env.url("origin.test", "/missing.bin");
    let manifest = env.write_manifest("m.json", json!([required_entry("r", &url, &body)]));
    let out = env
        .run(&["--json", "install", "g", manifest.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = env.run(&["--json", "sync"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let d = doc(&out);
    assert_eq!(d["ok"], false, "{d}");
    assert_eq!(d["code"], "E_RESOURCE_UNAVAILABLE", "{d}");
    assert_eq!(d["primary_cause"], "E_RESOURCE_HTTP", "{d}");
    assert!(d["message"].as_str().unwrap().contains("g/r"), "{d}");
    assert_eq!(d["failed"], json!(["g/r"]), "{d}");
}
