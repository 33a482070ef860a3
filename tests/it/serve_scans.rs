//! `serve`'s scans of the gems folder: upgrades, rejected manifests,
//! uninstall after two missed scans, and manifests that are not ordinary
//! files.

use std::path::Path;

use serde_json::json;

use crate::support::*;

fn log_text(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

fn write_gem(gems: &Path, gem: &str, resources: serde_json::Value) {
    std::fs::create_dir_all(gems.join(gem)).unwrap();
    let doc = json!({ "resources": resources });
    std::fs::write(gems.join(gem).join("notochord.json"), doc.to_string()).unwrap();
}

#[tokio::test]
async fn serve_uninstalls_a_gem_only_after_the_second_missed_scan() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(5000, 60);
    let url = env.serve("/s.bin", &body);
    let gems = write_gem_folder(&env, "g", json!([required_entry("s", &url, &body)]));
    // Another gem keeps the folder from going empty (an empty folder
    // uninstalls nothing).
    write_gem(&gems, "other", json!([]));
    let log = env.dir.path().join("serve.log");
    // One second between scans: the first missed scan is seen well before
    // the second.
    let _serve = spawn_logged(
        &env,
        &["serve", "--gems", gems.to_str().unwrap(), "--interval", "1"],
        &log,
    );
    wait_until("the file is stored", || {
        stored_files(&env, &body).len() == 1
    })
    .await;
    std::fs::remove_dir_all(gems.join("g")).unwrap();
    let registration = store_root(&env).join("gems").join("g.json");
    wait_until("the first missed scan", || {
        log_text(&log).contains("(scan 1 of 2)")
    })
    .await;
    assert!(registration.exists(), "uninstalled after one missed scan");
    assert_eq!(stored_files(&env, &body).len(), 1);
    wait_until("the uninstall", || !registration.exists()).await;
    assert!(
        log_text(&log).contains("(scan 2 of 2)"),
        "{}",
        log_text(&log)
    );
    wait_until("the file is deleted", || {
        stored_files(&env, &body).is_empty()
    })
    .await;
}

#[tokio::test]
async fn serve_upgrades_on_a_changed_manifest_and_keeps_the_old_version_when_the_new_one_is_invalid(
) {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let (a, b) = (bytes(4000, 61), bytes(4500, 62));
    let (a_url, b_url) = (env.serve("/a.bin", &a), env.serve("/b.bin", &b));
    let gems = write_gem_folder(&env, "g", json!([required_entry("a", &a_url, &a)]));
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_logged(
        &env,
        &[
            "serve",
            "--gems",
            gems.to_str().unwrap(),
            "--interval",
            "0.05",
        ],
        &log,
    );
    wait_until("v1 is stored", || stored_files(&env, &a).len() == 1).await;

    write_gem(&gems, "g", json!([required_entry("b", &b_url, &b)]));
    wait_until("v2 replaces v1", || {
        stored_files(&env, &b).len() == 1 && stored_files(&env, &a).is_empty()
    })
    .await;
    let registration = store_root(&env).join("gems").join("g.json");
    let v2 = std::fs::read(&registration).unwrap();

    write_gem(
        &gems,
        "g",
        json!([{ "id": "c", "url": "http://origin.test/c.bin", "sha256": sha256_hex(&a), "size": 1 }]),
    );
    wait_until("the invalid v3 is rejected", || {
        log_text(&log).contains("rejected; keeping the installed version")
    })
    .await;
    assert_eq!(std::fs::read(&registration).unwrap(), v2);
    assert_eq!(stored_files(&env, &b).len(), 1);
    assert_eq!(env.origin.total_hits(), 2);
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn serve_refuses_a_huge_manifest_from_its_size_and_a_fifo_without_reading_them() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(3000, 63);
    let url = env.serve("/k.bin", &body);
    let gems = write_gem_folder(&env, "kept", json!([required_entry("k", &url, &body)]));
    // 300 MB, sparse: reading it whole would show in the peak memory.
    std::fs::create_dir_all(gems.join("huge")).unwrap();
    std::fs::File::create(gems.join("huge").join("notochord.json"))
        .unwrap()
        .set_len(300 * 1024 * 1024)
        .unwrap();
    std::fs::create_dir_all(gems.join("pipe")).unwrap();
    let fifo = gems.join("pipe").join("notochord.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let log = env.dir.path().join("serve.log");
    let serve = spawn_logged(
        &env,
        &[
            "serve",
            "--gems",
            gems.to_str().unwrap(),
            "--interval",
            "0.05",
        ],
        &log,
    );
    wait_until("both are refused", || {
        let text = log_text(&log);
        text.contains("is 314572800 bytes, larger than the 1048576-byte limit")
            && text.contains("not a regular file")
    })
    .await;
    wait_until("the ordinary gem is stored", || {
        stored_files(&env, &body).len() == 1
    })
    .await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", serve.0.id())).unwrap();
    let peak_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(peak_kb < 150 * 1024, "peak memory {peak_kb} kB");
}
