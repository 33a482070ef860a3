//! The command line when things go wrong: a service that stops under
//! `path`, a `path` with no service, and what each says to do next.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn path_says_the_bytes_are_kept_when_the_service_stops_mid_download() {
    let env = Env::new().await;
    write_patient_config(&env, "");
    let (body, url) = stalled_route(&env, "/lazy.bin", 1_000_000, 600_000, 61);
    let gems = write_gem_folder(&env, "g", json!([entry("lazy", &url, &body)]));
    let mut serve = spawn_serve(&env, &gems, "0.1", &env.dir.path().join("serve.log"));
    wait_until("the service listens", || {
        store_root(&env).join("service.json").exists()
    })
    .await;
    // `serve` installs the gem on its first scan.
    wait_until("the gem is installed", || {
        store_root(&env).join("gems/g.json").exists()
    })
    .await;
    let log = env.dir.path().join("path.log");
    let mut path = spawn_quiet(&env, &["path", "g", "lazy"], &log);
    wait_until("stalled bytes are on disk", || {
        partial_files(&env)
            .iter()
            .any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
    })
    .await;
    // The service goes away mid-download.
    serve.0.kill().unwrap();
    let _ = serve.0.wait();
    let status = wait_output(&mut path).await;
    assert_eq!(status.code(), Some(1));
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("E_RESOURCE_SERVICE")
            && said.contains(
                "the service stopped before g/lazy was ready; the bytes downloaded so far are kept"
            )
            && said.contains("start the service again")
            && said.contains("run `gem-resources path g lazy` again"),
        "{said}"
    );
    assert!(!said.contains("the connection closed before"), "{said}");
    assert_eq!(partial_files(&env).len(), 1, "the bytes were not kept");

    // Run again, no service: in this process, from the kept bytes, and
    // saying so once.
    env.origin.route("/lazy.bin", Behaviour::Body(body.clone()));
    let out = env.run(&["path", "g", "lazy"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read(stdout(&out).trim()).unwrap(), body);
    let config = env.dir.path().join("config.toml");
    let note = format!(
        "no service; working in this process with {}",
        config.display()
    );
    assert_eq!(stderr(&out).matches(&note).count(), 1, "{}", stderr(&out));
    assert_eq!(
        stderr(&out).matches("no service").count(),
        1,
        "{}",
        stderr(&out)
    );
}
