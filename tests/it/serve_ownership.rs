//! Who owns a gem: every registration records who installed it, and
//! `serve --gems DIR` uninstalls only the gems it installed from `DIR`.
//! A gem the command line installed, one registered before the record was
//! kept, and every gem of a folder that went empty (a wrong path, an
//! unmounted disk) are never uninstalled by a scan.

use std::path::Path;

use serde_json::json;

use crate::support::*;

fn log_text(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

fn registration(env: &Env, gem: &str) -> std::path::PathBuf {
    store_root(env).join("gems").join(format!("{gem}.json"))
}

/// `status --json`'s `installed_by` of each gem.
async fn owners(env: &Env) -> serde_json::Value {
    let out = env.run(&["status", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    doc["gems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["gem"].as_str().unwrap().to_string(),
                g["installed_by"].clone(),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[tokio::test]
async fn serve_never_uninstalls_a_gem_the_command_line_or_an_earlier_version_installed() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let (cli_body, old_body, g_body) = (bytes(3000, 91), bytes(3100, 92), bytes(3200, 93));
    let cli_url = env.serve("/cli.bin", &cli_body);
    let old_url = env.serve("/old.bin", &old_body);
    let g_url = env.serve("/g.bin", &g_body);
    // Installed by the command line, before `serve` ever ran.
    let m = env.write_manifest(
        "cli.json",
        json!([required_entry("c", &cli_url, &cli_body)]),
    );
    let out = env.run(&["install", "cligem", m.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    // A registration of an earlier version: no record of who installed it.
    let m = env.write_manifest(
        "old.json",
        json!([required_entry("o", &old_url, &old_body)]),
    );
    let out = env.run(&["install", "oldgem", m.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(registration(&env, "oldgem")).unwrap()).unwrap();
    assert_eq!(doc["installed_by"], json!({ "kind": "cli" }));
    doc.as_object_mut().unwrap().remove("installed_by");
    std::fs::write(registration(&env, "oldgem"), doc.to_string()).unwrap();

    let gems = write_gem_folder(&env, "g", json!([required_entry("g", &g_url, &g_body)]));
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_serve(&env, &gems, "0.05", &log);
    wait_until("the folder's gem is stored", || {
        stored_files(&env, &g_body).len() == 1
    })
    .await;
    let by = owners(&env).await;
    let folder = std::fs::canonicalize(&gems).unwrap();
    assert_eq!(
        by["g"],
        json!({ "kind": "folder", "path": folder.to_str().unwrap() })
    );
    assert_eq!(by["cligem"], json!({ "kind": "cli" }));
    assert_eq!(by["oldgem"], json!(null));
    let text = env.run(&["status"]).await;
    let text = stdout(&text);
    assert!(
        text.contains("cligem  (installed by the command line)"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "g  (installed by serve's gems folder {})",
            folder.display()
        )),
        "{text}"
    );

    // The folder's own gem goes when its folder goes; the others stay.
    std::fs::remove_dir_all(gems.join("g")).unwrap();
    std::fs::create_dir_all(gems.join("h")).unwrap();
    std::fs::write(gems.join("h/notochord.json"), r#"{"resources": []}"#).unwrap();
    wait_until("the folder's gem is uninstalled", || {
        !registration(&env, "g").exists()
    })
    .await;
    wait_until("its file is deleted", || {
        stored_files(&env, &g_body).is_empty()
    })
    .await;
    let text = log_text(&log);
    // The deletion names the gem and the resource, not only the SHA-256.
    let deleted = format!("deleted g/g ({}", &sha256_hex(&g_body)[..12]);
    let said = async {
        while !log_text(&log).contains(&deleted) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    // Under Wine a sharing violation can fail the first uninstall, and a
    // later scan removes the file by another way: the line is checked
    // where the first uninstall always runs through.
    if cfg!(unix)
        && tokio::time::timeout(std::time::Duration::from_secs(10), said)
            .await
            .is_err()
    {
        panic!("serve did not say {deleted:?}:\n{}", log_text(&log));
    }
    assert!(!text.contains("gem=\"cligem\""), "{text}");
    assert!(!text.contains("gem=\"oldgem\""), "{text}");
    assert!(registration(&env, "cligem").exists());
    assert!(registration(&env, "oldgem").exists());
    assert_eq!(stored_files(&env, &cli_body).len(), 1);
    assert_eq!(stored_files(&env, &old_body).len(), 1);
}

#[tokio::test]
async fn a_gems_folder_gone_empty_uninstalls_nothing_and_says_so_once() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(3300, 94);
    let url = env.serve("/e.bin", &body);
    let gems = write_gem_folder(&env, "g", json!([required_entry("g", &url, &body)]));
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_serve(&env, &gems, "0.05", &log);
    wait_until("the gem is stored", || stored_files(&env, &body).len() == 1).await;
    // The folder empties (an unmounted disk shows as an empty mount point).
    std::fs::remove_dir_all(gems.join("g")).unwrap();
    wait_until("the empty folder is said", || {
        log_text(&log).contains("holds no manifest")
    })
    .await;
    // Twenty scans later, nothing is uninstalled and it was said once.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let text = log_text(&log);
    assert_eq!(text.matches("holds no manifest").count(), 1, "{text}");
    assert!(
        text.contains("installed from it are registered (g)"),
        "{text}"
    );
    assert!(!text.contains("uninstalled"), "{text}");
    assert!(registration(&env, "g").exists());
    assert_eq!(stored_files(&env, &body).len(), 1);
}

#[tokio::test]
async fn uninstall_of_a_gem_serve_keeps_from_its_folder_says_it_comes_back_and_it_does() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(3400, 95);
    let url = env.serve("/b.bin", &body);
    let gems = write_gem_folder(&env, "g", json!([required_entry("g", &url, &body)]));
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_serve(&env, &gems, "0.2", &log);
    wait_until("the gem is stored", || stored_files(&env, &body).len() == 1).await;
    let out = env.run(&["uninstall", "g"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("was installed by `serve` from its gems folder"),
        "{err}"
    );
    assert!(err.contains("installs it again at its next scan"), "{err}");
    wait_until("the gem is back from its folder", || {
        registration(&env, "g").exists()
    })
    .await;
    let by = owners(&env).await;
    assert_eq!(by["g"]["kind"], "folder");
}

#[tokio::test]
async fn a_folder_holding_a_gem_the_api_installed_is_said_once_and_never_takes_it() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(3500, 96);
    let url = env.serve("/app.bin", &body);
    let resources = json!([required_entry("a", &url, &body)]);
    let gems = write_gem_folder(&env, "g", json!([]));
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_serve(&env, &gems, "0.05", &log);
    wait_until("the folder's gem is installed", || {
        log_text(&log).contains("installed gem=\"g\"")
    })
    .await;
    // The app installs its gem through the local API.
    let store = gem_resources::Store::open(&env.store_dir()).unwrap();
    let client = gem_resources::api::Client::for_store(&store)
        .await
        .expect("serve listens");
    let manifest = env.write_manifest("app.json", resources.clone());
    client.install("app", &manifest).await.unwrap();
    wait_until("the app's file is stored", || {
        stored_files(&env, &body).len() == 1
    })
    .await;
    // The same manifest shows up in the gems folder (a checkout, a sync).
    write_gem_folder(&env, "app", resources);
    let folder = gems.join("app");
    let said = format!(
        "leaving {} alone: the gem is kept by the local API",
        folder.display()
    );
    wait_until("the folder is said", || log_text(&log).contains(&said)).await;
    scans_later(&gems, &log, 3).await;
    let by = owners(&env).await;
    assert_eq!(by["app"], json!({ "kind": "api" }));
    // The folder goes: the app's gem stays.
    std::fs::remove_dir_all(&folder).unwrap();
    scans_later(&gems, &log, 3).await;
    let text = log_text(&log);
    assert_eq!(text.matches(&said).count(), 1, "{text}");
    assert!(!text.contains("installed gem=\"app\""), "{text}");
    assert!(!text.contains("missing from the gems folder"), "{text}");
    assert!(registration(&env, "app").exists());
    assert_eq!(owners(&env).await["app"], json!({ "kind": "api" }));
    assert_eq!(stored_files(&env, &body).len(), 1);
}

#[tokio::test]
async fn install_of_a_gem_a_gems_folder_keeps_leaves_it_the_folders_until_taken_over() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let (body, other) = (bytes(3600, 97), bytes(3700, 98));
    let url = env.serve("/f.bin", &body);
    let other_url = env.serve("/o.bin", &other);
    let gems = write_gem_folder(&env, "g", json!([required_entry("f", &url, &body)]));
    let folder = std::fs::canonicalize(&gems).unwrap();
    let kept_by_folder = json!({ "kind": "folder", "path": folder.to_str().unwrap() });
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_serve(&env, &gems, "0.05", &log);
    wait_until("the gem is stored", || stored_files(&env, &body).len() == 1).await;
    // The same manifest, through the running service: the folder keeps it.
    let manifest = gems.join("g/notochord.json");
    let m = manifest.to_str().unwrap();
    let out = env.run(&["install", "g", m]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "g is unchanged; kept by serve's gems folder {} (`install --take-over` makes it the command line's)",
            folder.display()
        )),
        "{err}"
    );
    assert_eq!(owners(&env).await["g"], kept_by_folder);
    // Another manifest would take it from the folder: refused, naming the
    // option; nothing changes.
    let changed = env.write_manifest(
        "changed.json",
        json!([required_entry("o", &other_url, &other)]),
    );
    let out = env.run(&["install", "g", changed.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("E_RESOURCE_OWNER: gem \"g\" is kept by serve's gems folder"),
        "{err}"
    );
    assert!(err.contains("--take-over"), "{err}");
    assert_eq!(owners(&env).await["g"], kept_by_folder);
    assert!(stored_files(&env, &other).is_empty());
    // Taken over, and said.
    let out = env.run(&["install", "--take-over", "g", m]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "g is unchanged; now kept by the command line (was serve's gems folder {})",
            folder.display()
        )),
        "{err}"
    );
    assert_eq!(owners(&env).await["g"], json!({ "kind": "cli" }));
    // From then on the folder leaves it alone: removing it uninstalls
    // nothing.
    let said = format!(
        "leaving {} alone: the gem is kept by the command line",
        gems.join("g").display()
    );
    wait_until("serve says it", || log_text(&log).contains(&said)).await;
    std::fs::remove_dir_all(gems.join("g")).unwrap();
    scans_later(&gems, &log, 3).await;
    let text = log_text(&log);
    assert_eq!(text.matches(&said).count(), 1, "{text}");
    assert!(registration(&env, "g").exists(), "{text}");
    assert_eq!(stored_files(&env, &body).len(), 1);
}
