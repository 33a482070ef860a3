//! The JavaScript client's own tests (`js/test/*.test.js`, Node's test
//! runner), against the binary built with these tests: a real `serve` on
//! a fresh store, an HTTPS origin of the tests' own.

use std::path::Path;

#[test]
fn the_javascript_client_passes_its_tests_against_a_real_service() {
    let js = Path::new(env!("CARGO_MANIFEST_DIR")).join("js");
    let node = std::process::Command::new("node").arg("--version").output();
    let Ok(version) = node else {
        // CI installs Node (.ci/run); anywhere else, say so loudly.
        assert!(
            std::env::var_os("CI").is_none(),
            "node is not installed: the JavaScript client cannot be tested (apt-get install nodejs)"
        );
        eprintln!(
            "SKIPPED the JavaScript client's tests: node is not installed (apt-get install nodejs)"
        );
        return;
    };
    let major: u32 = String::from_utf8_lossy(&version.stdout)
        .trim()
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    assert!(
        major >= 18,
        "the JavaScript client needs Node 18 or later, found {major}"
    );
    let mut files: Vec<_> = std::fs::read_dir(js.join("test"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".test.js"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no JavaScript tests found in js/test");
    let out = std::process::Command::new("node")
        .arg("--test")
        .args(&files)
        .current_dir(&js)
        .env("GEM_RESOURCES_BIN", env!("CARGO_BIN_EXE_gem-resources"))
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "node --test failed:\n{text}");
    assert!(text.contains("# fail 0"), "{text}");
}
