//! The README and the reference in docs/ stay true: every link points to a
//! file that exists, and every command they show is one the binary has.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents a newcomer reads.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![
        root().join("README.md"),
        root().join("PROTOCOL.md"),
        root().join("js/README.md"),
    ];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// The targets of `[text](target)` links that are not web addresses.
fn local_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        if !target.contains("://") && !target.starts_with('#') && !target.starts_with("mailto:") {
            out.push(target.split('#').next().unwrap_or_default().to_string());
        }
    }
    out
}

#[test]
fn every_link_in_the_documents_points_to_a_file() {
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let folder = doc.parent().unwrap();
        for link in local_links(&text) {
            if link.is_empty() {
                continue;
            }
            assert!(
                folder.join(&link).exists(),
                "{}: the link {link} points to nothing",
                doc.display()
            );
        }
    }
}

/// The subcommands shown at the start of a command line in `sh` blocks.
fn shown_subcommands(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_sh = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            in_sh = trimmed == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let command = trimmed.trim_start_matches("$ ");
        let Some(args) = command.strip_prefix("gem-resources ") else {
            continue;
        };
        // Global options may come first.
        let mut words = args.split_whitespace().peekable();
        while let Some(word) = words.next() {
            if word == "--config" || word == "--store" || word == "--limit-rate" {
                words.next();
                continue;
            }
            if word.starts_with('-') {
                continue;
            }
            out.insert(word.to_string());
            break;
        }
    }
    out
}

#[test]
fn every_command_the_documents_show_exists() {
    let mut seen = BTreeSet::new();
    for doc in [root().join("README.md"), root().join("docs/commands.md")] {
        seen.extend(shown_subcommands(&std::fs::read_to_string(&doc).unwrap()));
    }
    assert!(seen.len() >= 10, "{seen:?}");
    for sub in seen {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .args([sub.as_str(), "--help"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the documents show `gem-resources {sub}`, which the binary does not have: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_readme_shows_the_two_first_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let first = readme.find("## First steps on a fresh machine").unwrap();
    let near = &readme[first..first + 400];
    assert!(near.contains("cargo run --example demo"), "{near}");
    assert!(near.contains("cargo test"), "{near}");
    assert!(Path::new(&root().join("examples/demo.rs")).exists());
}

#[test]
fn every_flag_of_every_command_is_in_docs_commands_md() {
    let docs = std::fs::read_to_string(root().join("docs/commands.md")).unwrap();
    let help = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .args(args)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let top = help(&["--help"]);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() > 10, "{top}");
    let flags = |text: &str| -> BTreeSet<String> {
        text.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| {
                w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                    .split(['=', '<'])
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .filter(|f| f != "--help" && f != "--version")
            .collect()
    };
    let mut missing = Vec::new();
    for command in &commands {
        assert!(
            docs.contains(&format!("gem-resources {command}"))
                || docs.contains(&format!("`{command}`")),
            "docs/commands.md never names the command {command}"
        );
        for flag in flags(&help(&[command.as_str(), "--help"])) {
            if !docs.contains(&flag) {
                missing.push(format!("{command} {flag}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "flags docs/commands.md does not mention: {missing:?}"
    );
}

#[test]
fn protocol_md_s_hand_session_says_this_version_as_the_server_sends_it() {
    let text = std::fs::read_to_string(root().join("PROTOCOL.md")).unwrap();
    let start = text.find("## A session, by hand").unwrap();
    let session = &text[start..];
    let hello = session
        .lines()
        .find(|l| l.contains("\"result\"") && l.contains("\"protocol\""))
        .expect("no hello answer in the hand session");
    let answer: serde_json::Value = serde_json::from_str(hello).unwrap();
    assert_eq!(
        answer["result"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{hello}"
    );
    // The server writes its keys in order (serde_json without
    // `preserve_order`): the session shows them as they come.
    assert_eq!(serde_json::to_string(&answer).unwrap(), hello);
}

#[test]
fn the_readme_says_how_long_the_first_build_takes_where_the_first_command_is() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let first = readme.find("cargo run --example demo").unwrap();
    let near = &readme[first..first + 600];
    assert!(
        near.contains("about 5 to 6 minutes on two") && near.contains("cold start"),
        "{near}"
    );
}

#[test]
fn platforms_md_says_how_large_the_release_binary_is_and_how_to_ship_it_stripped() {
    let text = std::fs::read_to_string(root().join("docs/platforms.md")).unwrap();
    let start = text
        .find("## Shipping the binary")
        .expect("no section on shipping the binary");
    let section = &text[start..];
    for needle in ["cargo build --release", "strip", "--only-keep-debug", " MB"] {
        assert!(section.contains(needle), "{needle:?} not said");
    }
}
