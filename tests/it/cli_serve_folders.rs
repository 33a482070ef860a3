//! `serve` says once why it ignores a gem folder, and that a never
//! installed gem with an invalid manifest is not installed.

use crate::support::*;

#[tokio::test]
async fn ignored_folders_are_logged_once_with_why_and_an_invalid_new_gem_is_not_installed() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let gems = env.dir.path().join("gems");
    std::fs::create_dir_all(gems.join("Bad Name")).unwrap();
    std::fs::create_dir_all(gems.join("empty")).unwrap();
    std::fs::create_dir_all(gems.join("broken")).unwrap();
    std::fs::write(gems.join("broken/notochord.json"), "{\"resources\": 7}").unwrap();
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_logged(
        &env,
        &[
            "serve",
            "--gems",
            gems.to_str().unwrap(),
            "--interval",
            "0.1",
        ],
        &log,
    );
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("the first scan", || text().contains("rejected")).await;
    // A gem added now is installed by a later scan: by then the ignored
    // folders were seen again.
    let later = gems.join("later");
    std::fs::create_dir_all(&later).unwrap();
    std::fs::write(later.join("manifest.json"), "{\"resources\": []}").unwrap();
    wait_until("a later scan", || {
        text().contains("installed gem=\"later\"")
    })
    .await;
    let text = text();
    let bad = format!(
        "ignoring {}: not a valid gem id",
        gems.join("Bad Name").display()
    );
    let empty = format!(
        "ignoring {}: no notochord.json or manifest.json in it",
        gems.join("empty").display()
    );
    assert_eq!(text.matches(&bad).count(), 1, "{text}");
    assert_eq!(text.matches(&empty).count(), 1, "{text}");
    assert!(text.contains("rejected; not installed"), "{text}");
    assert!(!text.contains("keeping the installed version"), "{text}");
}

#[cfg(unix)] // symbolic links by `std::os::unix`
#[tokio::test]
async fn a_manifest_linked_out_of_the_gems_folder_is_refused_once_and_never_read() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let gems = env.dir.path().join("gems");
    // Shaped so that a rejection would quote the value it holds.
    let secret = env.dir.path().join("secret.json");
    std::fs::write(
        &secret,
        "{\"resources\": [{\"id\": \"x\", \"url\": \"http://root-only-secret\"}]}",
    )
    .unwrap();
    files::set_mode(&secret, 0o600);
    std::fs::create_dir_all(gems.join("leak")).unwrap();
    std::os::unix::fs::symlink(&secret, gems.join("leak/notochord.json")).unwrap();
    // A link to a whole folder outside is refused the same way.
    let outside = env.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::copy(&secret, outside.join("manifest.json")).unwrap();
    std::os::unix::fs::symlink(&outside, gems.join("away")).unwrap();
    // A link that stays in the gems folder is followed.
    std::fs::create_dir_all(gems.join("real")).unwrap();
    std::fs::write(gems.join("real/notochord.json"), "{\"resources\": []}").unwrap();
    std::fs::create_dir_all(gems.join("alias")).unwrap();
    std::os::unix::fs::symlink("../real/notochord.json", gems.join("alias/notochord.json"))
        .unwrap();
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_serve(&env, &gems, "0.1", &log);
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("the aliased gem is installed", || {
        text().contains("installed gem=\"alias\"")
    })
    .await;
    // Several scans later, each refusal is still said once.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let text = text();
    assert!(!text.contains("root-only-secret"), "{text}");
    for gem in ["leak", "away"] {
        let said = format!("gem=\"{gem}\"");
        let refusals: Vec<&str> = text.lines().filter(|l| l.contains(&said)).collect();
        assert_eq!(refusals.len(), 1, "{text}");
        assert!(
            refusals[0].contains("a symbolic link leading out of the gems folder"),
            "{text}"
        );
    }
    assert!(text.contains("installed gem=\"real\""), "{text}");
}

#[cfg(unix)] // a second user
#[tokio::test]
async fn a_gem_folder_of_another_user_cannot_have_serve_read_a_root_only_file() {
    use std::os::unix::fs::chown;
    const TEST: &str = "a_gem_folder_of_another_user_cannot_have_serve_read_a_root_only_file";
    let Some(user) = second_user(TEST) else {
        return;
    };
    let env = Env::new().await;
    write_patient_config(&env, "");
    let gems = env.dir.path().join("gems");
    let secret = env.dir.path().join("root-only.json");
    std::fs::write(
        &secret,
        "{\"resources\": [{\"id\": \"x\", \"url\": \"http://root-only-secret\"}]}",
    )
    .unwrap();
    files::set_mode(&secret, 0o600);
    // Her gem's folder; she plants the link herself.
    let hers = gems.join("hers");
    std::fs::create_dir_all(&hers).unwrap();
    chown(&hers, Some(user.0), Some(user.1)).unwrap();
    let planted = as_user(user, "/bin/ln")
        .args([
            "-s",
            secret.to_str().unwrap(),
            hers.join("notochord.json").to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(planted.success());
    std::fs::create_dir_all(gems.join("real")).unwrap();
    std::fs::write(gems.join("real/notochord.json"), "{\"resources\": []}").unwrap();
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_serve(&env, &gems, "0.1", &log);
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("the other gem is installed", || {
        text().contains("installed gem=\"real\"")
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let text = text();
    assert!(!text.contains("root-only-secret"), "{text}");
    assert_eq!(
        text.matches("a symbolic link leading out of the gems folder")
            .count(),
        1,
        "{text}"
    );
    assert!(!text.contains("serve: installed gem=\"hers\""), "{text}");
}

#[tokio::test]
async fn a_folder_whose_manifest_names_another_gem_is_said_once_and_not_installed() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let gems = env.dir.path().join("gems");
    // Renamed, or put in the wrong folder: the folder's name is the gem id.
    std::fs::create_dir_all(gems.join("named")).unwrap();
    std::fs::write(
        gems.join("named/notochord.json"),
        r#"{"id": "other", "resources": []}"#,
    )
    .unwrap();
    // A manifest naming its own folder's gem installs.
    std::fs::create_dir_all(gems.join("same")).unwrap();
    std::fs::write(
        gems.join("same/notochord.json"),
        r#"{"id": "same", "resources": []}"#,
    )
    .unwrap();
    let log = env.dir.path().join("serve.log");
    let _serve = spawn_serve(&env, &gems, "0.05", &log);
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let said = format!(
        "{} declares the gem id other, not named (its folder's name); not installed",
        gems.join("named").join("notochord.json").display()
    );
    wait_until("the folder's gem is installed", || {
        text().contains("installed gem=\"same\"")
    })
    .await;
    scans_later(&gems, &log, 3).await;
    let text = text();
    let out = env.run(&["status", "--json"]).await;
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let installed: Vec<&str> = doc["gems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["gem"].as_str().unwrap())
        .collect();
    assert_eq!(installed, ["same", "tick"], "{text}");
    assert_eq!(text.matches(&said).count(), 1, "{text}");
}
