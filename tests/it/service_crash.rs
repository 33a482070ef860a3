//! Crashes and the long-running service: a process killed mid-download
//! leaves nothing visible and the next start completes the job; `serve`
//! follows a gems folder and stops cleanly on SIGTERM.

#[cfg(unix)]
use std::process::Command;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use gem_resources::Resources;
use serde_json::json;

use crate::support::*;

/// Waits (polling) for `child` to exit, at most 10 seconds.
async fn wait_exit(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process did not exit in time");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(unix)] // SIGTERM by `kill`
/// Sends SIGTERM to `child`.
fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// Starts `path GEM RES` against a stalled route, waits until stalled bytes
/// are on disk, and kills the process with SIGKILL.
async fn kill_mid_download(env: &Env, gem: &str, res: &str, body: &[u8]) {
    let log = env.dir.path().join("killed.log");
    let mut child = spawn_quiet(env, &["path", gem, res], &log);
    wait_until("stalled bytes are on disk", || {
        partial_files(env)
            .iter()
            .any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
    })
    .await;
    child.0.kill().unwrap();
    let status = wait_exit(&mut child.0).await;
    assert!(!status.success());
    // Nothing of it is visible as a stored file.
    assert!(stored_files(env, body).is_empty());
    assert_eq!(
        partial_files(env).len(),
        1,
        "the crash left its partial file"
    );
}

#[tokio::test]
async fn a_download_killed_mid_way_leaves_no_visible_file_and_sync_completes_it() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(1_000_000, 51);
    let url = env.url("origin.test", "/big.bin");
    env.origin.route("/big.bin", Behaviour::Status(503));
    {
        let service = Resources::open(&env.config()).unwrap();
        service
            .install("g", &manifest(json!([required_entry("big", &url, &body)])))
            .await
            .unwrap();
        within("the first try", service.wait_idle()).await;
    }
    env.origin.route(
        "/big.bin",
        Behaviour::Stall {
            body: body.clone(),
            sent: 600_000,
        },
    );
    kill_mid_download(&env, "g", "big", &body).await;
    assert_eq!(env.origin.hits("/big.bin"), 2);

    env.origin.route("/big.bin", Behaviour::Body(body.clone()));
    let out = env.run(&["sync"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let files = stored_files(&env, &body);
    assert_eq!(files.len(), 1);
    assert_eq!(std::fs::read(&files[0]).unwrap(), body);
    assert!(tmp_files(&env).is_empty(), "{:?}", tmp_files(&env));
    assert_eq!(env.origin.hits("/big.bin"), 3);
}

#[tokio::test]
async fn a_lazy_download_killed_mid_way_is_completed_by_the_next_path_call() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let (body, url) = stalled_route(&env, "/lazy.bin", 1_000_000, 600_000, 52);
    let m = env.write_manifest("m.json", json!([entry("lazy", &url, &body)]));
    let out = env.run(&["install", "g", m.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    kill_mid_download(&env, "g", "lazy", &body).await;

    env.origin.route("/lazy.bin", Behaviour::Body(body.clone()));
    let out = env.run(&["path", "g", "lazy"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(stdout(&out).trim()).unwrap(), body);
    assert_eq!(env.origin.hits("/lazy.bin"), 2);
    // The download that took over the file's lock removed what the crash
    // left for it, without waiting for the next start.
    let partials: Vec<_> = tmp_files(&env)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "partial"))
        .collect();
    assert!(partials.is_empty(), "{partials:?}");
    assert_eq!(stored_files(&env, &body).len(), 1);
}

#[cfg(unix)] // SIGTERM by `kill`
#[tokio::test]
async fn serve_follows_the_gems_folder_and_stops_cleanly_on_sigterm() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let body = bytes(20_000, 53);
    let url = env.serve("/served.bin", &body);
    let gems = env.dir.path().join("gems");
    let gem_dir = gems.join("g");
    std::fs::create_dir_all(&gem_dir).unwrap();
    let doc = json!({ "id": "g", "resources": [required_entry("served", &url, &body)] });
    std::fs::write(gem_dir.join("notochord.json"), doc.to_string()).unwrap();
    // Another gem keeps the folder from going empty (an empty folder
    // uninstalls nothing).
    std::fs::create_dir_all(gems.join("other")).unwrap();
    std::fs::write(gems.join("other/notochord.json"), r#"{"resources": []}"#).unwrap();

    let log = env.dir.path().join("serve.log");
    let mut child = spawn_serve(&env, &gems, "0.05", &log);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("the required file is downloaded", || {
        stored_files(&env, &body).len() == 1
    })
    .await;
    assert_eq!(env.origin.hits("/served.bin"), 1);

    std::fs::remove_dir_all(&gem_dir).unwrap();
    wait_until("the file is deleted after the gem's removal", || {
        stored_files(&env, &body).is_empty()
    })
    .await;
    wait_until("the gem is unregistered", || {
        !store_root(&env).join("gems").join("g.json").exists()
    })
    .await;

    sigterm(&child.0);
    let status = wait_exit(&mut child.0).await;
    assert!(status.success(), "{status:?}\n{}", log_text());
    assert!(tmp_files(&env).is_empty(), "{:?}", tmp_files(&env));
    assert_eq!(env.origin.hits("/served.bin"), 1);
}

#[cfg(unix)] // SIGTERM by `kill`
#[tokio::test]
async fn serve_stops_an_in_flight_download_on_sigterm_without_leaving_a_partial_file() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let (body, url) = stalled_route(&env, "/held.bin", 1_000_000, 600_000, 54);
    let gems = write_gem_folder(&env, "g", json!([required_entry("held", &url, &body)]));

    let log = env.dir.path().join("serve.log");
    let mut child = spawn_serve(&env, &gems, "0.05", &log);
    wait_until("stalled bytes are on disk", || {
        partial_files(&env)
            .iter()
            .any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
    })
    .await;
    sigterm(&child.0);
    let status = wait_exit(&mut child.0).await;
    assert!(
        status.success(),
        "{status:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(tmp_files(&env).is_empty(), "{:?}", tmp_files(&env));
    assert!(stored_files(&env, &body).is_empty());
}

#[cfg(unix)] // SIGTERM by `kill`
#[tokio::test]
async fn serve_stops_promptly_while_waiting_for_another_process_download() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let (body, url) = stalled_route(&env, "/held.bin", 1_000_000, 600_000, 54);
    let gems = write_gem_folder(&env, "g", json!([required_entry("held", &url, &body)]));
    let m = env.write_manifest("m.json", json!([required_entry("held", &url, &body)]));
    let out = env
        .run(&["install", "--no-wait", "g", m.to_str().unwrap()])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));

    // Another process holds the file's lock, stalled mid-download.
    let holder_log = env.dir.path().join("holder.log");
    let _holder = spawn_quiet(&env, &["path", "g", "held"], &holder_log);
    wait_until("the holder has bytes on disk", || {
        partial_files(&env)
            .iter()
            .any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
    })
    .await;

    let log = env.dir.path().join("serve.log");
    let mut serve = spawn_serve(&env, &gems, "0.05", &log);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    // The command line keeps the gem: the first scan says so, and the
    // start queued its required file.
    wait_until("serve has scanned its folder", || {
        log_text().contains("the gem is kept by the command line")
    })
    .await;
    sigterm(&serve.0);
    // The holder is still stalled: serve must not wait for it (the
    // runtime's own 2-second shutdown grace must not be what ends it).
    let deadline = Instant::now() + Duration::from_millis(1500);
    let status = loop {
        if let Some(status) = serve.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not stop while another process held the lock\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(status.success(), "{status:?}\n{}", log_text());
}
