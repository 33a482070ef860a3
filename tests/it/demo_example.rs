//! The offline demonstration (`examples/demo.rs`) says what it shows in
//! the command line's words: sizes in human units, deletions by name.
//! Runs the example's binary, which `cargo test` builds with the tests.

use std::path::{Path, PathBuf};

/// The example's binary beside this test's build of the CLI.
fn example() -> Option<PathBuf> {
    let bin = Path::new(env!("CARGO_BIN_EXE_gem-resources"));
    let name = format!("demo{}", std::env::consts::EXE_SUFFIX);
    let path = bin.parent()?.join("examples").join(name);
    path.exists().then_some(path)
}

#[test]
fn the_demo_says_sizes_as_the_cli_does_and_deletions_by_name() {
    let Some(demo) = example() else {
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
