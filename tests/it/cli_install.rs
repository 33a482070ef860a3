//! What `install` says about the gem it registers.

use serde_json::{json, Value};

use crate::support::*;

#[tokio::test]
async fn the_gem_id_comes_from_the_manifest_and_a_different_one_needs_as() {
    let env = Env::new().await;
    let body = bytes(100, 51);
    let url = env.serve("/a.bin", &body);
    let manifest = env.dir.path().join("m.json");
    let doc = json!({ "id": "sample", "resources": [entry("a", &url, &body)] });
    std::fs::write(&manifest, doc.to_string()).unwrap();
    let m = manifest.to_str().unwrap();
    // A typo of the gem id would make a second gem: refused, naming both.
    let out = env.run(&["install", "other", m]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("declares the gem id sample, not other") && err.contains("--as other"),
        "{err}"
    );
    assert!(!env.store_dir().join("store-v1/gems/other.json").exists());
    // The manifest alone: its own id.
    let out = env.run(&["install", m]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.store_dir().join("store-v1/gems/sample.json").exists());
    // --as says another id is meant.
    let out = env.run(&["install", "--as", "other", m]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("installing sample as other"),
        "{}",
        stderr(&out)
    );
    assert!(env.store_dir().join("store-v1/gems/other.json").exists());
    // The same id given: no word about it.
    let out = env.run(&["install", "sample", m]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("note"), "{}", stderr(&out));
    // A manifest without an id needs one given.
    let bare = env.write_manifest("bare.json", json!([entry("a", &url, &body)]));
    let out = env.run(&["install", bare.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("declares no gem id"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn an_unchanged_reinstall_is_no_upgrade() {
    let env = Env::new().await;
    let body = bytes(100, 52);
    let url = env.serve("/a.bin", &body);
    let manifest = env.write_manifest("m.json", json!([entry("a", &url, &body)]));
    let m = manifest.to_str().unwrap();
    let report = |out: &std::process::Output| -> Value {
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["report"].clone()
    };
    let first = env.run(&["--json", "install", "sample", m]).await;
    assert_eq!(report(&first)["upgrade"], false, "{}", stdout(&first));
    let again = env.run(&["--json", "install", "sample", m]).await;
    let again = report(&again);
    assert_eq!(again["unchanged"], true, "{again}");
    assert_eq!(again["upgrade"], false, "{again}");
    let manifest = env.write_manifest("m.json", json!([entry("b", &url, &body)]));
    let changed = env
        .run(&["--json", "install", "sample", manifest.to_str().unwrap()])
        .await;
    assert_eq!(report(&changed)["upgrade"], true, "{}", stdout(&changed));
}

/// Two gems sharing `shared.bin`: `one` declares it as `shared`, `two` as
/// `copy`; `one` has a file of its own too. Returns the manifests.
async fn two_gems_sharing_a_file(env: &Env) -> (std::path::PathBuf, std::path::PathBuf) {
    let (shared, own) = (bytes(300, 61), bytes(200, 62));
    let shared_url = env.serve("/shared.bin", &shared);
    let own_url = env.serve("/own.bin", &own);
    let one = env.write_manifest(
        "one.json",
        json!([
            required_entry("shared", &shared_url, &shared),
            required_entry("own", &own_url, &own)
        ]),
    );
    let two = env.write_manifest(
        "two.json",
        json!([required_entry("copy", &shared_url, &shared)]),
    );
    (one, two)
}

fn assert_kept_named(out: &std::process::Output) {
    assert!(out.status.success(), "{}", stderr(out));
    let err = stderr(out);
    assert!(
        err.contains("uninstalled one: 1 file deleted, 1 kept (declared by another gem)"),
        "{err}"
    );
    assert!(
        err.contains("  kept shared.bin (one/shared): two/copy declares it"),
        "{err}"
    );
}

#[tokio::test]
async fn uninstall_names_the_files_it_kept_and_the_gems_declaring_them() {
    let env = Env::new().await;
    let (one, two) = two_gems_sharing_a_file(&env).await;
    for (gem, m) in [("one", &one), ("two", &two)] {
        let out = env.run(&["install", gem, m.to_str().unwrap()]).await;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    assert_kept_named(&env.run(&["uninstall", "one"]).await);

    let out = env.run(&["install", "one", one.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.run(&["--json", "uninstall", "one"]).await;
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kept = &doc["kept_files"][0];
    assert_eq!(kept["file"], "shared.bin", "{doc}");
    assert_eq!(kept["id"], "shared", "{doc}");
    assert_eq!(kept["declared_by"], json!(["two/copy"]), "{doc}");
}

#[tokio::test]
async fn uninstall_lists_every_gem_declaring_a_kept_file_and_keeps_nothing_never_downloaded() {
    let env = Env::new().await;
    let (one, two) = two_gems_sharing_a_file(&env).await;
    // A lazy file `one` and `three` declare, never downloaded.
    let big = bytes(500, 63);
    let big_url = env.serve("/big.bin", &big);
    let three = env.write_manifest(
        "three.json",
        json!([
            required_entry(
                "copy",
                &env.url("origin.test", "/shared.bin"),
                &bytes(300, 61)
            ),
            entry("big", &big_url, &big)
        ]),
    );
    let mut one_doc: Value = serde_json::from_slice(&std::fs::read(&one).unwrap()).unwrap();
    one_doc["resources"]
        .as_array_mut()
        .unwrap()
        .push(entry("big", &big_url, &big));
    std::fs::write(&one, one_doc.to_string()).unwrap();
    for (gem, m) in [("one", &one), ("two", &two), ("three", &three)] {
        let out = env.run(&["install", gem, m.to_str().unwrap()]).await;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = env.run(&["uninstall", "one"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("uninstalled one: 1 file deleted, 1 kept (declared by another gem)"),
        "{err}"
    );
    assert!(
        err.contains("  kept shared.bin (one/shared): three/copy and two/copy declare it")
            || err.contains("  kept shared.bin (one/shared): two/copy and three/copy declare it"),
        "{err}"
    );
    assert!(!err.contains("big.bin"), "{err}");
    assert_eq!(env.origin.hits("/big.bin"), 0);

    let out = env.run(&["uninstall", "two"]).await;
    let err = stderr(&out);
    assert!(
        err.contains("uninstalled two: 0 files deleted, 1 kept (declared by another gem)"),
        "{err}"
    );
    assert!(
        err.contains("  kept shared.bin (two/copy): three/copy declares it"),
        "{err}"
    );
    // Nothing kept: the count of files deleted alone.
    let out = env.run(&["uninstall", "three"]).await;
    let err = stderr(&out);
    assert!(err.contains("uninstalled three: 1 file deleted\n"), "{err}");
}

#[cfg(unix)]
#[tokio::test]
async fn uninstall_through_the_service_names_the_files_it_kept() {
    let env = Env::new().await;
    let (one, two) = two_gems_sharing_a_file(&env).await;
    let gems = env.dir.path().join("gems");
    std::fs::create_dir_all(&gems).unwrap();
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_serve(&env, &gems, "0.1", &log);
    wait_until("the service listens", || {
        store_root(&env).join("service.json").exists()
    })
    .await;
    for (gem, m) in [("one", &one), ("two", &two)] {
        let out = env.run(&["install", gem, m.to_str().unwrap()]).await;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = env.run(&["-vv", "uninstall", "one"]).await;
    assert!(
        stderr(&out).contains("using the service's local API"),
        "{}",
        stderr(&out)
    );
    assert_kept_named(&out);
}

#[tokio::test]
async fn fetch_of_an_unknown_id_lists_the_ids_the_manifest_has() {
    let env = Env::new().await;
    let (one, _) = two_gems_sharing_a_file(&env).await;
    let out = env.run(&["fetch", one.to_str().unwrap(), "sahred"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).trim(),
        format!(
            "E_RESOURCE_NOT_FOUND: {} declares no resource \"sahred\"; its resources are: shared, own",
            one.display()
        )
    );
}

#[tokio::test]
async fn install_of_a_programs_gem_keeps_it_theirs_unless_taken_over() {
    let env = Env::new().await;
    let body = bytes(100, 53);
    let url = env.serve("/a.bin", &body);
    let resources = json!([entry("a", &url, &body)]);
    // A program installs its gem with the library.
    let service = env.resources();
    service
        .install("app", &manifest(resources.clone()))
        .await
        .unwrap();
    service.shutdown().await;
    let manifest = env.write_manifest("m.json", resources);
    let m = manifest.to_str().unwrap();
    let out = env.run(&["--json", "install", "app", m]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["report"]["unchanged"], true, "{doc}");
    assert_eq!(
        doc["report"]["installed_by"],
        json!({ "kind": "library" }),
        "{doc}"
    );
    assert_eq!(doc["report"]["taken_from"], Value::Null, "{doc}");
    let out = env.run(&["install", "--take-over", "app", m]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "app is unchanged; now kept by the command line (was a program using the library)"
        ),
        "{err}"
    );
    let out = env.run(&["status", "--json"]).await;
    let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        doc["gems"][0]["installed_by"],
        json!({ "kind": "cli" }),
        "{doc}"
    );
}

#[tokio::test]
async fn a_wrong_declared_sha256_or_size_says_the_command_that_corrects_the_manifest() {
    let env = Env::new().await;
    let body = bytes(300, 53);
    let url = env.serve("/a.bin", &body);
    let mirror = env.serve("/mirror/a.bin", &body);
    let mirror = env.url("mirror.test", mirror.path());
    let wrong = sha256_hex(b"another file");
    let manifest = env.dir.path().join("wrong.json");
    let doc = json!({ "id": "sample", "resources": [
        { "id": "a", "url": url.as_str(), "mirrors": [mirror.as_str()], "sha256": wrong, "size": 300, "required": true },
    ]});
    std::fs::write(&manifest, doc.to_string()).unwrap();
    let m = manifest.to_str().unwrap();
    let out = env.run(&["install", m]).await;
    let err = stderr(&out);
    assert!(err.contains("E_RESOURCE_UNAVAILABLE: "), "{err}");
    assert!(
        err.contains("every address serves the same file, whose sha256 is not the manifest's")
            && err.contains(&format!(
                "`gem-resources autofill --manifest {m} --all --write`"
            )),
        "{err}"
    );
    // The status row says it too, in the generic form (no file is known).
    let v: Value =
        serde_json::from_slice(&env.run(&["--json", "status", "sample"]).await.stdout).unwrap();
    let row = &v["gems"][0]["resources"][0];
    assert_eq!(row["code"], "E_RESOURCE_UNAVAILABLE", "{v}");
    assert!(
        row["message"]
            .as_str()
            .unwrap_or_default()
            .contains("autofill --manifest <manifest file> --all --write"),
        "{v}"
    );

    // A wrong size: the same advice, for the size.
    let manifest = env.dir.path().join("size.json");
    let doc = json!({ "id": "sized", "resources": [
        { "id": "a", "url": url.as_str(), "sha256": sha256_hex(&body), "size": 200, "required": true },
    ]});
    std::fs::write(&manifest, doc.to_string()).unwrap();
    let m = manifest.to_str().unwrap();
    let err = stderr(&env.run(&["install", m]).await);
    assert!(
        err.contains("whose size is not the manifest's")
            && err.contains(&format!("autofill --manifest {m} --all --write")),
        "{err}"
    );

    // One address with other bytes, one without the file: no such advice,
    // the addresses are what is wrong.
    env.origin.route("/gone/a.bin", Behaviour::Status(404));
    let gone = env.url("mirror.test", "/gone/a.bin");
    let manifest = env.dir.path().join("mixed.json");
    let doc = json!({ "id": "mixed", "resources": [
        { "id": "a", "url": url.as_str(), "mirrors": [gone.as_str()], "sha256": wrong, "size": 300, "required": true },
    ]});
    std::fs::write(&manifest, doc.to_string()).unwrap();
    let err = stderr(&env.run(&["install", manifest.to_str().unwrap()]).await);
    assert!(err.contains("E_RESOURCE_UNAVAILABLE: "), "{err}");
    assert!(!err.contains("autofill"), "{err}");
}
