//! The order that makes a publish crash-safe, read from the syscalls the
//! binary makes (`strace -f -y`, as ALICE-style checks do): for every file
//! published, its data is synced before its name appears in `blobs/`, and
//! the name (the file's entry in `blobs/<sha256>/`, and that folder's entry
//! in `blobs/`) is synced before the download is reported verified.
//!
//! Linux only (strace); skipped loudly where strace is missing.

#![cfg(target_os = "linux")]

use std::collections::HashMap;

use serde_json::json;

use crate::support::*;

/// One completed call from the trace: its name, its arguments as strace
/// wrote them (descriptors followed by `<path>`), and the index of the line
/// where it completed.
#[derive(Debug)]
struct Call {
    name: String,
    args: String,
    done_at: usize,
    /// Where it began (an interrupted call begins before it completes).
    began_at: usize,
}

/// The completed calls of an `strace -f -y` trace, in order of completion;
/// a call split into `<unfinished ...>` and `<... resumed>` is joined.
fn calls(trace: &str) -> Vec<Call> {
    let mut pending: HashMap<String, (String, String, usize)> = HashMap::new();
    let mut out = Vec::new();
    for (at, line) in trace.lines().enumerate() {
        let Some((pid, rest)) = line.split_once(' ') else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(resumed) = rest.strip_prefix("<... ") {
            let Some((name, tail)) = resumed.split_once(" resumed>") else {
                continue;
            };
            if let Some((pname, args, began_at)) = pending.remove(pid) {
                if pname == name {
                    out.push(Call {
                        name: pname,
                        args: format!("{args}{tail}"),
                        done_at: at,
                        began_at,
                    });
                }
            }
            continue;
        }
        let Some((name, args)) = rest.split_once('(') else {
            continue;
        };
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(args) = args.strip_suffix(" <unfinished ...>") {
            pending.insert(pid.to_string(), (name.to_string(), args.to_string(), at));
        } else {
            out.push(Call {
                name: name.to_string(),
                args: args.to_string(),
                done_at: at,
                began_at: at,
            });
        }
    }
    out
}

/// Whether `call` succeeded (`= 0` or a descriptor).
fn succeeded(call: &Call) -> bool {
    // strace pads a resumed call's result: `)           = 0`.
    call.args.rsplit_once(')').is_some_and(|(_, result)| {
        result
            .trim_start()
            .strip_prefix("= ")
            .is_some_and(|r| !r.starts_with('-'))
    })
}

/// The path strace shows for the first descriptor argument (`N</path>`).
fn first_fd_path(args: &str) -> Option<&str> {
    let open = args.find('<')?;
    let close = args[open..].find('>')? + open;
    Some(&args[open + 1..close])
}

/// Where in the trace the durable-publish rules break, for the files of
/// `published` (`(sha256, file name)`), the store's `blobs` folder being
/// `blobs`: an empty list when they all hold.
fn broken_rules(trace: &str, blobs: &str, published: &[(String, String)]) -> Vec<String> {
    let calls = calls(trace);
    let syncs: Vec<&Call> = calls
        .iter()
        .filter(|c| matches!(c.name.as_str(), "fsync" | "fdatasync") && succeeded(c))
        .collect();
    let synced_after = |path: &str, from: usize| {
        syncs
            .iter()
            .filter(|c| first_fd_path(&c.args) == Some(path) && c.began_at > from)
            .map(|c| c.done_at)
            .min()
    };
    let mut broken = Vec::new();
    for (sha, name) in published {
        let folder = format!("{blobs}/{sha}");
        // The rename that makes the name appear.
        let Some(rename) = calls.iter().find(|c| {
            c.name.starts_with("rename")
                && succeeded(c)
                && c.args.contains(&format!("<{folder}>, \"{name}\""))
        }) else {
            broken.push(format!("{name}: no rename into {folder} in the trace"));
            continue;
        };
        let Some((from_dir, from_name)) = rename
            .args
            .split_once(", \"")
            .and_then(|(dir, rest)| Some((first_fd_path(dir)?, rest.split('"').next()?)))
        else {
            broken.push(format!("{name}: cannot read the rename {:?}", rename.args));
            continue;
        };
        let data = format!("{from_dir}/{from_name}");
        // 1. The data is durable before its name appears.
        let data_synced = syncs
            .iter()
            .any(|c| first_fd_path(&c.args) == Some(data.as_str()) && c.done_at < rename.began_at);
        if !data_synced {
            broken.push(format!(
                "{name}: {data} was renamed before an fsync of it completed"
            ));
        }
        // 2. The name is durable before the file is reported: the folder
        // holding it synced after the rename, and the folder's own entry in
        // `blobs/` synced after the folder was made.
        let reported = calls
            .iter()
            .find(|c| c.name == "write" && c.args.starts_with("1<") && c.args.contains(name))
            .map(|c| c.began_at);
        let Some(reported) = reported else {
            broken.push(format!("{name}: never reported on standard output"));
            continue;
        };
        match synced_after(&folder, rename.done_at) {
            Some(done) if done < reported => {}
            _ => broken.push(format!(
                "{name}: reported before an fsync of {folder} after the rename completed"
            )),
        }
        let made = calls
            .iter()
            .find(|c| c.name == "mkdirat" && c.args.contains(&format!("<{blobs}>, \"{sha}\"")));
        match made {
            None => broken.push(format!("{name}: {folder} was never made")),
            Some(made) => match synced_after(blobs, made.done_at) {
                Some(done) if done < reported => {}
                _ => broken.push(format!(
                    "{name}: reported before an fsync of {blobs} after {sha} was made in it"
                )),
            },
        }
    }
    broken
}

#[tokio::test]
async fn every_published_file_is_synced_before_its_name_and_its_name_before_the_report() {
    let strace = std::process::Command::new("strace").arg("-V").output();
    if !strace.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "SKIPPED the publish-order test: strace is not installed (apt-get install strace)"
        );
        return;
    }
    let env = Env::new().await;
    // Several files at once, so that their publishes overlap.
    let mut entries = Vec::new();
    let mut published = Vec::new();
    for i in 0..6u8 {
        let body = bytes(300 * 1024 + usize::from(i) * 4096, 90 + i);
        let path = format!("/order{i}.bin");
        let url = env.serve(&path, &body);
        entries.push(json!({
            "id": format!("order{i}"),
            "url": url.as_str(),
            "sha256": sha256_hex(&body),
            "size": body.len(),
        }));
        published.push((sha256_hex(&body), format!("order{i}.bin")));
    }
    let manifest = env.write_manifest("m.json", json!(entries));
    let trace = env.dir.path().join("trace.txt");
    let config = env.dir.path().join("config.toml");
    let args: Vec<String> = [
        "-f",
        "-y",
        "-qq",
        "-s",
        "4096",
        "-e",
        "trace=fsync,fdatasync,rename,renameat,renameat2,mkdirat,write",
        "-o",
        &trace.display().to_string(),
        env!("CARGO_BIN_EXE_gem-resources"),
        "--config",
        &config.display().to_string(),
        "fetch",
        &manifest.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("strace")
            .args(&args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&trace).unwrap();
    let blobs = std::fs::canonicalize(store_root(&env).join("blobs")).unwrap();
    let broken = broken_rules(&text, &blobs.display().to_string(), &published);
    assert!(
        broken.is_empty(),
        "the publish order is broken:\n{}\n(the trace is {} lines)",
        broken.join("\n"),
        text.lines().count()
    );
}

#[test]
fn the_order_check_sees_a_rename_before_the_data_sync_and_a_report_before_the_folder_sync() {
    let sha = "a".repeat(64);
    let good = format!(
        "10 fsync(5</s/tmp/{sha}.9.partial>) = 0\n\
         10 mkdirat(4</s/blobs>, \"{sha}\", 0700) = 0\n\
         11 fsync(4</s/blobs> <unfinished ...>\n\
         10 renameat(3</s/tmp>, \"{sha}.9.partial\", 6</s/blobs/{sha}>, \"x.bin\") = 0\n\
         10 fsync(7</s/blobs/{sha}>) = 0\n\
         11 <... fsync resumed>) = 0\n\
         10 write(1<pipe:[1]>, \"x\\t/s/blobs/{sha}/x.bin\\n\", 20) = 20\n"
    );
    let files = [(sha.clone(), "x.bin".to_string())];
    assert_eq!(
        broken_rules(&good, "/s/blobs", &files),
        Vec::<String>::new()
    );
    // The data synced only after the rename.
    let lines: Vec<&str> = good.lines().collect();
    let late_data = [
        lines[1], lines[2], lines[3], lines[0], lines[4], lines[5], lines[6],
    ]
    .join("\n");
    assert_eq!(broken_rules(&late_data, "/s/blobs", &files).len(), 1);
    // No sync of the folder after the rename.
    let no_folder = [lines[0], lines[1], lines[2], lines[3], lines[5], lines[6]].join("\n");
    assert_eq!(broken_rules(&no_folder, "/s/blobs", &files).len(), 1);
    // Reported before the sync of `blobs/` completed.
    let early = [
        lines[0], lines[1], lines[2], lines[3], lines[4], lines[6], lines[5],
    ]
    .join("\n");
    assert_eq!(broken_rules(&early, "/s/blobs", &files).len(), 1);
}
