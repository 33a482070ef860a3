//! `gem-resources fetch` and the global options: output, exit status,
//! configuration.

use serde_json::{json, Value};

use crate::support::*;

/// Serves two resources and writes a manifest declaring them.
fn two_resources(env: &Env) -> (std::path::PathBuf, Vec<u8>, Vec<u8>) {
    let a = bytes(2000, 1);
    let b = bytes(3000, 2);
    let ua = env.serve("/models/a.onnx", &a);
    let ub = env.serve("/data/b.bin", &b);
    let manifest = env.write_manifest(
        "manifest.json",
        json!([entry("a", &ua, &a), entry("b", &ub, &b)]),
    );
    (manifest, a, b)
}

#[tokio::test]
async fn fetch_prints_each_id_and_its_local_path() {
    let env = Env::new().await;
    let (manifest, a, b) = two_resources(&env);
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<(&str, &str)> = text.lines().map(|l| l.split_once('\t').unwrap()).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0].0, "a");
    assert_eq!(lines[1].0, "b");
    let store = env.store_dir();
    for ((_, path), (body, name)) in lines.iter().zip([(&a, "a.onnx"), (&b, "b.bin")]) {
        let path = std::path::Path::new(path);
        assert!(path.starts_with(&store), "{}", path.display());
        assert!(path.ends_with(name), "{}", path.display());
        assert_eq!(&std::fs::read(path).unwrap(), body);
    }
}

#[tokio::test]
async fn fetch_json_lists_id_path_size_and_digest() {
    let env = Env::new().await;
    let (manifest, a, b) = two_resources(&env);
    let out = env
        .run(&["--json", "fetch", manifest.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    let list = v["resources"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{v}");
    for (item, (id, body)) in list.iter().zip([("a", &a), ("b", &b)]) {
        assert_eq!(item["id"], id);
        assert_eq!(item["size"], body.len());
        assert_eq!(item["sha256"], sha256_hex(body));
        let path = item["path"].as_str().unwrap();
        assert_eq!(&std::fs::read(path).unwrap(), body);
    }
}

#[tokio::test]
async fn a_resource_already_in_the_store_is_not_downloaded_again() {
    let env = Env::new().await;
    let (manifest, _, _) = two_resources(&env);
    let first = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert_eq!(env.origin.total_hits(), 2);
    let second = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert_eq!(stdout(&second), stdout(&first));
    assert_eq!(env.origin.total_hits(), 2);
}

#[tokio::test]
async fn fetch_with_ids_downloads_only_those() {
    let env = Env::new().await;
    let (manifest, _, b) = two_resources(&env);
    let out = env.run(&["fetch", manifest.to_str().unwrap(), "b"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("b\t"), "{text}");
    assert_eq!(env.origin.hits("/models/a.onnx"), 0);
    assert_eq!(env.origin.hits("/data/b.bin"), 1);
    let store = gem_resources::Store::open(&env.store_dir()).unwrap();
    assert_eq!(store.blobs().unwrap(), [sha256_hex(&b)]);
}

#[tokio::test]
async fn fetch_of_an_unknown_id_fails_with_not_found() {
    let env = Env::new().await;
    let (manifest, _, _) = two_resources(&env);
    let out = env
        .run(&["fetch", manifest.to_str().unwrap(), "a", "nope"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.starts_with("E_RESOURCE_NOT_FOUND: "), "{err}");
    assert!(err.contains("\"nope\""), "{err}");
    assert_eq!(env.origin.total_hits(), 0);
}

#[tokio::test]
async fn a_failed_resource_exits_1_with_its_codes_and_the_others_still_download() {
    let env = Env::new().await;
    let good = bytes(1000, 3);
    let gu = env.serve("/good.bin", &good);
    env.origin.route("/gone.bin", Behaviour::Status(404));
    let bad = env.url("origin.test", "/gone.bin");
    let manifest = env.write_manifest(
        "manifest.json",
        json!([entry("bad", &bad, b"whatever"), entry("good", &gu, &good)]),
    );
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with("E_RESOURCE_UNAVAILABLE: resource \"bad\""),
        "{err}"
    );
    assert!(
        err.contains(&format!("E_RESOURCE_HTTP: {bad}: HTTP status 404")),
        "{err}"
    );
    assert!(stdout(&out).starts_with("good\t"), "{}", stdout(&out));

    let out = env
        .run(&["--json", "fetch", manifest.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["resources"][0]["id"], "bad", "{v}");
    assert_eq!(v["resources"][0]["code"], "E_RESOURCE_UNAVAILABLE", "{v}");
    assert_eq!(
        v["resources"][0]["attempts"][0]["code"], "E_RESOURCE_HTTP",
        "{v}"
    );
    assert_eq!(v["resources"][1]["id"], "good", "{v}");
}

#[tokio::test]
async fn the_store_option_overrides_the_configured_store() {
    let env = Env::new().await;
    let (manifest, _, _) = two_resources(&env);
    let other = env.dir.path().join("elsewhere");
    let out = env
        .run(&[
            "--store",
            other.to_str().unwrap(),
            "fetch",
            manifest.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for line in stdout(&out).lines() {
        let (_, path) = line.split_once('\t').unwrap();
        assert!(path.starts_with(other.to_str().unwrap()), "{line}");
    }
    assert!(!env.store_dir().exists());
}

#[tokio::test]
async fn printed_paths_are_absolute_even_for_a_relative_store() {
    let env = Env::new().await;
    let (manifest, _, _) = two_resources(&env);
    let config = env.dir.path().join("config.toml");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_gem-resources"))
            .current_dir(config.parent().unwrap())
            .args(["--config", "config.toml", "--store", "rel", "fetch"])
            .arg(manifest.file_name().unwrap())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(!text.is_empty());
    for line in text.lines() {
        let (_, path) = line.split_once('\t').unwrap();
        let path = std::path::Path::new(path);
        assert!(path.is_absolute(), "{line}");
        assert!(path.starts_with(env.dir.path().join("rel")), "{line}");
    }
}

#[tokio::test]
async fn a_usage_error_exits_2() {
    let env = Env::new().await;
    for args in [
        vec!["fetch"],
        vec!["frobnicate"],
        vec!["check-url", "not a url"],
        vec!["autofill", "https://"],
    ] {
        let out = env.run(&args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).is_empty(), "{args:?}");
    }
    assert_eq!(env.origin.total_hits(), 0);
}

#[tokio::test]
async fn a_missing_configuration_file_is_an_error() {
    let env = Env::new().await;
    let missing = env.dir.path().join("missing.toml");
    let out = run_bin(vec![
        "--config".into(),
        missing.display().to_string(),
        "check-url".into(),
        "https://1.1.1.1/".into(),
    ])
    .await;
    assert!(!out.status.success());
    assert_eq!(stdout(&out), "");
    assert!(stderr(&out).contains("missing.toml"), "{}", stderr(&out));
}

#[tokio::test]
async fn an_unknown_configuration_key_is_an_error_naming_it() {
    let env = Env::new().await;
    env.write_config("mdoe = \"allowlist\"");
    let out = env.run(&["check-url", "https://1.1.1.1/"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.starts_with("E_RESOURCE_CONFIG: "), "{err}");
    assert!(err.contains("mdoe"), "{err}");
    assert!(err.contains("config.toml"), "{err}");
}

/// `network.retries` asks the same address again after a transient
/// failure: one retry, two requests to the one address.
#[tokio::test]
async fn configured_retries_ask_the_same_address_again() {
    let env = Env::new().await;
    let config = env.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("retries = 0", "retries = 1\nretry_backoff_secs = 0");
    std::fs::write(&config, text).unwrap();
    env.origin.route("/busy.bin", Behaviour::Status(503));
    let url = env.url("origin.test", "/busy.bin");
    let manifest = env.write_manifest("manifest.json", json!([entry("busy", &url, b"x")]));
    let out = env.run(&["fetch", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(env.origin.hits("/busy.bin"), 2);
}

#[tokio::test]
async fn completions_and_a_manual_page_are_printed() {
    let env = Env::new().await;
    for shell in ["bash", "zsh", "fish", "powershell"] {
        let out = env.run(&["completions", shell]).await;
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        for word in ["gem-resources", "install", "autofill", "no-service"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
    }
    let out = env.run(&["man"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = stdout(&out);
    assert!(page.contains(".TH gem-resources 1"), "{page}");
    assert!(page.contains("serve"), "{page}");
    let out = env.run(&["completions", "nope"]).await;
    assert_eq!(out.status.code(), Some(2));
}

/// What bash offers for `words` (the last one being completed) with the
/// binary's completion script loaded, as a user's Tab press would ask
/// the function the script registers; `None` when there is no bash.
fn bash_completes(script: &std::path::Path, words: &[&str]) -> Option<Vec<String>> {
    let program = r#"
source "$1" || exit 3
shift
function_name=$(complete -p gem-resources | sed -n 's/.*-F \([^ ]*\).*/\1/p')
[ -n "$function_name" ] || exit 4
COMP_WORDS=("$@")
COMP_CWORD=$(( $# - 1 ))
COMP_LINE="$*"
COMP_POINT=${#COMP_LINE}
"$function_name" gem-resources "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"#;
    let out = std::process::Command::new("bash")
        .args(["--noprofile", "--norc", "-c", program, "bash"])
        .arg(script)
        .args(words)
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("cannot run bash: {e}"),
    };
    assert!(out.status.success(), "bash: {}", stderr(&out));
    Some(stdout(&out).lines().map(str::to_string).collect())
}

#[tokio::test]
async fn bash_completes_a_subcommands_options() {
    let env = Env::new().await;
    let out = env.run(&["completions", "bash"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let script = env.dir.path().join("gem-resources.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    let Some(top) = bash_completes(&script, &["gem-resources", "--"]) else {
        eprintln!("SKIPPED bash_completes_a_subcommands_options: bash is not installed");
        return;
    };
    assert!(top.contains(&"--json".to_string()), "{top:?}");
    // `gem-resources install --<TAB>`: its own options and the global ones.
    let install = bash_completes(&script, &["gem-resources", "install", "--"]).unwrap();
    for option in ["--as", "--no-wait", "--json"] {
        assert!(
            install.contains(&option.to_string()),
            "{option}: {install:?}"
        );
    }
    // A subcommand whose name has a hyphen too.
    let check_url = bash_completes(&script, &["gem-resources", "check-url", "--"]).unwrap();
    assert!(check_url.contains(&"--json".to_string()), "{check_url:?}");
    let autofill = bash_completes(&script, &["gem-resources", "autofill", "--ma"]).unwrap();
    assert_eq!(autofill, ["--manifest"]);
}

/// Every subcommand `--help` lists, with the options it has of its own.
async fn commands_and_options() -> Vec<(String, Vec<String>)> {
    let help = stdout(&run_bin(vec!["--help".into()]).await);
    let names: Vec<String> = help
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    let top = stdout(&run_bin(vec!["help".into()]).await);
    let global: Vec<&str> = top
        .split_whitespace()
        .map(|w| w.trim_end_matches([',', '.', ')']))
        .collect();
    let mut all = Vec::new();
    for name in names {
        let help = stdout(&run_bin(vec!["help".into(), name.clone()]).await);
        let options: Vec<String> = help
            .split_whitespace()
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.trim_end_matches([',', '.', ')']).to_string())
            .filter(|o| o != "--help" && !global.contains(&o.as_str()))
            .collect();
        all.push((name, options));
    }
    all
}

#[tokio::test]
async fn the_manual_page_has_every_command_with_its_options_and_roff_keeps_its_lists() {
    let out = run_bin(vec!["man".into()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = stdout(&out);
    // One page: no reference to `gem-resources-check(1)` and the like,
    // which are never made.
    assert!(!page.contains("(1)"), "{page}");
    let commands = commands_and_options().await;
    assert!(commands.len() >= 16, "{commands:?}");
    for (command, option) in [
        ("install", "--no-wait"),
        ("autofill", "--url-only"),
        ("serve", "--gems"),
    ] {
        assert!(
            commands
                .iter()
                .any(|(c, o)| c == command && o.iter().any(|x| x == option)),
            "{commands:?}"
        );
    }
    for (command, options) in &commands {
        let head = format!(".SS \"gem-resources {command}\"\n");
        let at = page
            .find(&head)
            .unwrap_or_else(|| panic!("no section for {command}:\n{page}"));
        let section = &page[at + head.len()..];
        let section = &section[..section.find("\n.S").unwrap_or(section.len())];
        for option in options {
            let roff = option.replace('-', "\\-");
            assert!(
                section.contains(&roff),
                "{command} lacks {option}:\n{section}"
            );
        }
    }
    // The help's columns are lists, its examples lines kept as they are.
    assert!(
        page.contains(".SH \"EXIT STATUS\"\n.TP\n\\fB0\\fR\nsuccess\n"),
        "{page}"
    );
    assert!(
        page.contains(".nf\ngem\\-resources check notochord.json\ngem\\-resources install my\\-gem notochord.json\n"),
        "{page}"
    );

    // As `man` shows it.
    let source = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(source.path(), &page).unwrap();
    let rendered = std::process::Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-P-cbou", "-rLL=300n"])
        .arg(source.path())
        .output();
    let rendered = match rendered {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("SKIPPED rendering the manual page: groff is not installed");
            return;
        }
        Err(e) => panic!("cannot run groff: {e}"),
    };
    assert!(rendered.status.success(), "{}", stderr(&rendered));
    assert_eq!(stderr(&rendered), "", "groff warns");
    let text = stdout(&rendered).replace(['\u{2010}', '\u{2212}'], "-");
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    for line in [
        "gem-resources install my-gem notochord.json",
        "gem-resources autofill --manifest notochord.json --write",
    ] {
        assert!(
            lines.contains(&line),
            "{line:?} is not a line of its own:\n{text}"
        );
    }
    for (term, description) in [
        ("0", "success"),
        ("130", "interrupted (Ctrl-C); what was kept is printed"),
        ("RUST_LOG", "log filter on stderr"),
    ] {
        let entry = lines
            .iter()
            .position(|l| l.split_whitespace().next() == Some(term))
            .unwrap_or_else(|| panic!("no entry {term}:\n{text}"));
        let said = format!("{} {}", lines[entry], lines[entry + 1]);
        assert!(said.contains(description), "{term}: {said}");
    }
    // Never the help's columns filled into one run of words.
    assert!(!text.contains("success 1"), "{text}");
    for (command, options) in &commands {
        for option in options {
            assert!(
                text.contains(option.as_str()),
                "{command} {option}:\n{text}"
            );
        }
    }
}

/// Serves `count` small files, the first held until `gate` opens, and
/// returns their bodies and manifest entries (`with_digest`: with size and
/// SHA-256), in order.
pub(crate) fn batch_held_first(
    env: &Env,
    count: usize,
    gate: &Gate,
    with_digest: bool,
) -> (Vec<Vec<u8>>, Vec<Value>) {
    let mut bodies = Vec::new();
    let mut entries = Vec::new();
    for i in 0..count {
        let body = bytes(1000 + i, 40 + i as u8);
        let path = format!("/batch/{i}.bin");
        let behaviour = match i {
            0 => Behaviour::Gated {
                body: body.clone(),
                gate: gate.clone(),
            },
            _ => Behaviour::Body(body.clone()),
        };
        env.origin.route(&path, behaviour);
        let url = env.url("origin.test", &path);
        entries.push(match with_digest {
            true => entry(&format!("f{i}"), &url, &body),
            false => json!({ "id": format!("f{i}"), "url": url.as_str() }),
        });
        bodies.push(body);
    }
    (bodies, entries)
}

#[tokio::test]
async fn a_stalled_first_file_holds_no_other_download_back() {
    let env = Env::new().await;
    write_patient_config(&env, "[service]\nmax_concurrent_downloads = 2\n");
    let gate = Gate::new();
    let (bodies, entries) = batch_held_first(&env, 5, &gate, true);
    let manifest = env.write_manifest("batch.json", json!(entries));
    let log = env.dir.path().join("fetch.log");
    let mut child = spawn_logged(&env, &["fetch", manifest.to_str().unwrap()], &log);
    // The first file's slot waits; the other slot takes every other file.
    wait_until("every other file is stored while the first is held", || {
        bodies[1..].iter().all(|b| stored_files(&env, b).len() == 1)
    })
    .await;
    assert!(stored_files(&env, &bodies[0]).is_empty());
    gate.open();
    assert!(wait_output(&mut child).await.success());
    let text = child_stdout(&mut child);
    let ids: Vec<&str> = text.lines().filter_map(|l| l.split('\t').next()).collect();
    assert_eq!(
        ids,
        ["f0", "f1", "f2", "f3", "f4"],
        "manifest order: {text}"
    );
}
