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
