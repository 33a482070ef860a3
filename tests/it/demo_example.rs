//! The offline demonstration (`examples/demo.rs`) says what it shows in
//! the command line's words: sizes in human units, deletions by name; the
//! minimal app (`examples/embed.rs`) listens for other processes before
//! it starts. Runs the examples' binaries, which `cargo test` builds with
//! the tests.

use std::path::{Path, PathBuf};

/// The example `name`'s binary beside this test's build of the CLI.
fn example(name: &str) -> Option<PathBuf> {
    let bin = Path::new(env!("CARGO_BIN_EXE_gem-resources"));
    let name = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    let path = bin.parent()?.join("examples").join(name);
    path.exists().then_some(path)
}

#[test]
fn the_demo_says_sizes_as_the_cli_does_and_deletions_by_name() {
    let Some(demo) = example("demo") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "the demo example is not built (cargo test builds it)"
        );
        eprintln!("SKIPPED: the demo example is not built (run `cargo test`, or `cargo build --example demo`)");
        return;
    };
    let out = std::process::Command::new(demo).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("with its mirror -> verified, 8.0 MiB: "),
        "{text}"
    );
    assert!(text.contains("downloading ocr-model (8.0 MiB)"), "{text}");
    assert!(
        text.contains("8.0 MiB: \"size\": 8388608, \"sha256\": \""),
        "{text}"
    );
    assert!(!text.contains("8388608 bytes"), "{text}");
    assert!(text.contains("deleted sample-ocr/dictionary"), "{text}");
    assert!(text.contains("uninstalled: 2 files deleted"), "{text}");
    assert!(text.contains(", 1 file deleted, "), "{text}");
    assert!(!text.contains("file(s)"), "{text}");
}

#[test]
fn the_minimal_app_listens_before_it_starts_and_stops_listening_before_it_shuts_down() {
    let Some(embed) = example("embed") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "the embed example is not built (cargo test builds it)"
        );
        eprintln!("SKIPPED: the embed example is not built (run `cargo test`, or `cargo build --example embed`)");
        return;
    };
    let out = std::process::Command::new(embed).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let listening = text
        .find("other processes reach the service on ")
        .unwrap_or_else(|| panic!("it never listened: {text}"));
    let started = text.find("queued at start").expect("never started");
    assert!(listening < started, "{text}");
    assert!(text.contains("tool got "), "{text}");
    // The order is said where the code is.
    let source =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/embed.rs"))
            .unwrap();
    let at = |call: &str| source.find(call).unwrap_or_else(|| panic!("no {call}"));
    assert!(at("service.listen()") < at("service.start().await"));
    assert!(at("api.stop().await") < at("service.shutdown().await;\n    assert!"));
    assert!(source.contains("`listen()` comes before `start()`"));
}
