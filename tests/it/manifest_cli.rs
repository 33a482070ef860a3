//! Manifest validation through `gem-resources check` and `fetch`.

use serde_json::{json, Value};

use crate::support::*;

const HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A valid entry with `key` replaced by `value`.
fn entry_with(id: &str, key: &str, value: Value) -> Value {
    let mut e = json!({
        "id": id,
        "url": format!("https://cdn.example.com/{id}.bin"),
        "sha256": HASH,
        "size": 10,
    });
    e[key] = value;
    e
}

fn valid(id: &str) -> Value {
    entry_with(id, "size", json!(10))
}

/// Runs `check` on `resources` and returns the exit code and stderr lines.
async fn check(env: &Env, resources: Value) -> (Option<i32>, Vec<String>) {
    let path = env.write_manifest("manifest.json", resources);
    check_file(env, &path).await
}

async fn check_file(env: &Env, path: &std::path::Path) -> (Option<i32>, Vec<String>) {
    let out = env.run(&["check", path.to_str().unwrap()]).await;
    let lines = stderr(&out)
        .lines()
        .map(|line| in_manifest(line, path))
        .collect();
    (out.status.code(), lines)
}

/// `line` without the file's name that each problem starts with
/// (`FILE: manifest.resources[0].url: …`, `FILE: …` for the whole
/// manifest), so the expectations read as the library says them and the
/// same for every file.
fn in_manifest(line: &str, path: &std::path::Path) -> String {
    let file = path.display().to_string();
    let (code, rest) = line.split_once(": ").unwrap_or(("", line));
    let rest = match rest.strip_prefix(&format!("{file}: manifest.")) {
        Some(tail) => format!("manifest.{tail}"),
        None => match rest.strip_prefix(&file) {
            Some(tail) => format!("manifest{tail}"),
            None => panic!("the problem does not start with the file's name: {line}"),
        },
    };
    format!("{code}: {rest}")
}

#[tokio::test]
async fn problems_name_the_file_and_a_missing_value_points_to_autofill() {
    let env = Env::new().await;
    let mut entry = valid("a");
    entry.as_object_mut().unwrap().remove("sha256");
    let path = env.write_manifest("notochord.json", json!([entry, {"id": "b"}]));
    let out = env.run(&["check", path.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    let file = path.display();
    // The command that fills in every missing value, once.
    let hint = format!(
        "is required (to fill in every missing size and sha256: `gem-resources autofill --manifest {file} --write`)"
    );
    assert_eq!(
        stderr(&out).lines().collect::<Vec<_>>(),
        [
            format!("E_PERM_INVALID: {file}: manifest.resources[0].sha256: {hint}"),
            format!("E_PERM_INVALID: {file}: manifest.resources[1].url: is required"),
            format!("E_PERM_INVALID: {file}: manifest.resources[1].sha256: is required"),
            format!("E_PERM_INVALID: {file}: manifest.resources[1].size: is required"),
        ]
    );
    std::fs::write(&path, "[1]").unwrap();
    let out = env.run(&["check", path.to_str().unwrap()]).await;
    assert_eq!(
        stderr(&out),
        format!("E_PERM_INVALID: {file}: must be a JSON object, got array\n")
    );
}

#[tokio::test]
async fn sha256_problems_say_the_length_or_lower_case_and_keys_get_suggestions() {
    let env = Env::new().await;
    let mut entry = entry_with("a", "sha256", json!(HASH.to_uppercase()));
    entry["descripton"] = json!("OCR");
    let (code, lines) = check(
        &env,
        json!([entry, entry_with("b", "sha256", json!(&HASH[2..]))]),
    )
    .await;
    assert_eq!(code, Some(1));
    assert_eq!(
        lines,
        [
            "E_PERM_INVALID: manifest.resources[0]: unknown key \"descripton\" (did you mean `description`?)".to_string(),
            format!("E_PERM_INVALID: manifest.resources[0].sha256: must be 64 lowercase hex digits (write it in lower-case), got \"{}\"", HASH.to_uppercase()),
            format!("E_PERM_INVALID: manifest.resources[1].sha256: must be 64 lowercase hex digits, got 62 characters: \"{}\"", &HASH[2..]),
        ]
    );
}

#[tokio::test]
async fn a_valid_manifest_is_accepted() {
    let env = Env::new().await;
    let path = env.write_manifest(
        "notochord.json",
        json!([
            valid("a"),
            {
                "id": "b",
                "url": "https://cdn.example.com/models/ocr-v3.onnx",
                "mirrors": ["https://mirror.example.org/ocr-v3.onnx"],
                "sha256": HASH,
                "size": 1,
                "required": true,
                "description": "OCR model",
            }
        ]),
    );
    let out = env.run(&["check", path.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("ok: 2 resource(s)\n"),
        "{}",
        stdout(&out)
    );
    // It declares no gem id: `install FILE` would refuse it, and check says so.
    let file = path.display().to_string();
    assert_eq!(
        stderr(&out),
        format!("note: {file}: declares no gem id (\"id\"): `install {file}` refuses it; add one, or install it as `install GEM {file}`\n")
    );
}

#[tokio::test]
async fn an_http_url_is_reported_with_its_path_and_value() {
    let env = Env::new().await;
    let (code, lines) = check(
        &env,
        json!([
            valid("a"),
            entry_with("b", "url", json!("http://cdn.example.com/b.bin"))
        ]),
    )
    .await;
    assert_eq!(code, Some(1));
    assert_eq!(
        lines,
        ["E_PERM_INVALID: manifest.resources[1].url: must start with https://, got \"http://cdn.example.com/b.bin\""]
    );
}

#[tokio::test]
async fn each_entry_rule_has_its_own_message() {
    let env = Env::new().await;
    let mut missing_id = valid("x");
    missing_id.as_object_mut().unwrap().remove("id");
    let mut missing_sha = valid("x");
    missing_sha.as_object_mut().unwrap().remove("sha256");
    let mut missing_size = valid("x");
    missing_size.as_object_mut().unwrap().remove("size");
    let mut missing_url = valid("x");
    missing_url.as_object_mut().unwrap().remove("url");
    let r0 = "E_PERM_INVALID: manifest.resources[0]";
    let cases: Vec<(Value, String)> = vec![
        (missing_id, format!("{r0}.id: is required")),
        (
            entry_with("x", "id", json!("")),
            format!("{r0}.id: must not be empty"),
        ),
        (
            entry_with("x", "id", json!(7)),
            format!("{r0}.id: must be a string, got number"),
        ),
        (missing_url, format!("{r0}.url: is required")),
        (
            entry_with("x", "url", json!("ftp://cdn.example.com/x")),
            format!("{r0}.url: must start with https://, got \"ftp://cdn.example.com/x\""),
        ),
        (
            entry_with("x", "url", json!("https://user:pass@cdn.example.com/x")),
            format!(
                "{r0}.url: must not contain credentials, got \"https://***@cdn.example.com/x\""
            ),
        ),
        (
            entry_with("x", "url", json!("https://host:99999/x")),
            format!(
                "{r0}.url: is not a valid URL (invalid port number), got \"https://host:99999/x\""
            ),
        ),
        (
            entry_with(
                "x",
                "mirrors",
                json!(["https://m.example.com/x", "http://m.example.com/x"]),
            ),
            format!("{r0}.mirrors[1]: must start with https://, got \"http://m.example.com/x\""),
        ),
        (
            entry_with("x", "mirrors", json!("https://m.example.com/x")),
            format!("{r0}.mirrors: must be an array, got string"),
        ),
        (missing_sha, format!("{r0}.sha256: is required (to fill in every missing size and sha256: `gem-resources autofill --manifest FILE --write`)")),
        (
            entry_with("x", "sha256", json!(HASH.to_uppercase())),
            format!(
                "{r0}.sha256: must be 64 lowercase hex digits (write it in lower-case), got \"{}\"",
                HASH.to_uppercase()
            ),
        ),
        (
            entry_with("x", "sha256", json!(&HASH[1..])),
            format!(
                "{r0}.sha256: must be 64 lowercase hex digits, got 63 characters: \"{}\"",
                &HASH[1..]
            ),
        ),
        (missing_size, format!("{r0}.size: is required (to fill in every missing size and sha256: `gem-resources autofill --manifest FILE --write`)")),
        (
            entry_with("x", "size", json!(-1)),
            format!("{r0}.size: must be a non-negative integer, got -1"),
        ),
        (
            entry_with("x", "size", json!(1.5)),
            format!("{r0}.size: must be a non-negative integer, got 1.5"),
        ),
        (
            entry_with("x", "size", json!("10")),
            format!("{r0}.size: must be a non-negative integer, got the string \"10\" (remove the quotes)"),
        ),
        (
            entry_with("x", "required", json!("yes")),
            format!("{r0}.required: must be a boolean, got string"),
        ),
        (
            entry_with("x", "description", json!(["a"])),
            format!("{r0}.description: must be a string, got array"),
        ),
        (
            entry_with("x", "colour", json!("red")),
            format!("{r0}: unknown key \"colour\""),
        ),
        (
            json!("not an entry"),
            format!("{r0}: must be an object, got string"),
        ),
    ];
    let file = env.dir.path().join("manifest.json");
    for (entry, expected) in cases {
        let expected = expected.replace("FILE", &file.display().to_string());
        let (code, lines) = check(&env, json!([entry])).await;
        assert_eq!(code, Some(1), "{expected}");
        assert_eq!(lines, [expected]);
    }
}

#[tokio::test]
async fn every_error_is_reported_not_only_the_first() {
    let env = Env::new().await;
    let (code, lines) = check(
        &env,
        json!([
            valid("a"),
            entry_with("b", "url", json!("http://cdn.example.com/b.bin")),
            entry_with("c", "colour", json!("blue")),
            valid("a"),
            entry_with("e", "mirrors", json!(["ftp://x/y"])),
        ]),
    )
    .await;
    assert_eq!(code, Some(1));
    assert_eq!(
        lines,
        [
            "E_PERM_INVALID: manifest.resources[1].url: must start with https://, got \"http://cdn.example.com/b.bin\"",
            "E_PERM_INVALID: manifest.resources[2]: unknown key \"colour\"",
            "E_PERM_INVALID: manifest.resources[3].id: duplicate id \"a\" (first used by manifest.resources[0])",
            "E_PERM_INVALID: manifest.resources[4].mirrors[0]: must start with https://, got \"ftp://x/y\"",
        ]
    );
}

#[tokio::test]
async fn a_file_that_is_not_json_is_refused() {
    let env = Env::new().await;
    let path = env.dir.path().join("broken.json");
    std::fs::write(&path, "{\"resources\": [").unwrap();
    let (code, lines) = check_file(&env, &path).await;
    assert_eq!(code, Some(1));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("E_PERM_INVALID: manifest: is not valid JSON ("),
        "{lines:?}"
    );
}

#[tokio::test]
async fn a_manifest_that_is_not_an_object_is_refused() {
    let env = Env::new().await;
    let path = env.dir.path().join("array.json");
    std::fs::write(&path, serde_json::to_vec(&json!([valid("a")])).unwrap()).unwrap();
    let (code, lines) = check_file(&env, &path).await;
    assert_eq!(code, Some(1));
    assert_eq!(
        lines,
        ["E_PERM_INVALID: manifest: must be a JSON object, got array"]
    );

    std::fs::write(
        &path,
        serde_json::to_vec(&json!({ "resources": { "a": 1 } })).unwrap(),
    )
    .unwrap();
    let (code, lines) = check_file(&env, &path).await;
    assert_eq!(code, Some(1));
    assert_eq!(
        lines,
        ["E_PERM_INVALID: manifest.resources: must be an array, got object"]
    );
}

#[tokio::test]
async fn a_manifest_larger_than_one_mebibyte_is_refused() {
    let env = Env::new().await;
    let limit = 1024 * 1024;
    let doc = serde_json::to_string(&json!({ "resources": [valid("a")] })).unwrap();
    // Padded with trailing whitespace: still valid JSON.
    let at_limit = format!("{doc}{}", " ".repeat(limit - doc.len()));
    let path = env.dir.path().join("big.json");
    std::fs::write(&path, &at_limit).unwrap();
    let (code, lines) = check_file(&env, &path).await;
    assert_eq!(code, Some(0), "{lines:?}");

    std::fs::write(&path, format!("{at_limit} ")).unwrap();
    let (code, lines) = check_file(&env, &path).await;
    assert_eq!(code, Some(1));
    assert_eq!(
        lines,
        ["E_PERM_INVALID: manifest: is 1048577 bytes, larger than the 1048576-byte limit"]
    );
}

#[tokio::test]
async fn other_top_level_keys_are_not_ours_and_are_ignored() {
    let env = Env::new().await;
    let path = env.dir.path().join("manifest.json");
    let doc = json!({
        "id": "sample",
        "url": "http://not-checked.example.com/",
        "permissions": { "network": ["http://x/"] },
        "resource": 12,
        "resources": [valid("a")],
    });
    std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
    let (code, lines) = check_file(&env, &path).await;
    assert_eq!(code, Some(0), "{lines:?}");
    assert!(lines.is_empty(), "{lines:?}");
}

/// Writes `doc` as `name` and runs `check` on it: exit code, stdout, stderr.
async fn check_doc(env: &Env, name: &str, doc: Value) -> (Option<i32>, String, String) {
    let path = env.dir.path().join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let out = env.run(&["check", path.to_str().unwrap()]).await;
    (out.status.code(), stdout(&out), stderr(&out))
}

#[tokio::test]
async fn a_misspelt_resources_is_a_problem_and_a_manifest_without_any_is_said() {
    let env = Env::new().await;
    let file = env.dir.path().join("notochord.json");
    let file = file.display();
    // The files meant would silently be none: a problem, with the fix.
    let (code, out, err) = check_doc(
        &env,
        "notochord.json",
        json!({ "id": "g", "name": "G", "resource": [valid("a")] }),
    )
    .await;
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(
        err,
        format!("E_PERM_INVALID: {file}: unknown key \"resource\" (did you mean `resources`?)\n")
    );
    assert_eq!(out, "");
    // No `resources` and no near miss: valid, and said, with the keys a
    // manifest has next to each one it does not.
    let (code, out, err) = check_doc(
        &env,
        "notochord.json",
        json!({ "id": "g", "name": "G", "files": [valid("a")] }),
    )
    .await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out, "ok: 0 resource(s)\n");
    let notes: Vec<&str> = err.lines().collect();
    assert_eq!(notes.len(), 2, "{err}");
    assert!(
        notes[0].starts_with(&format!("note: {file}: unknown key \"files\" (the keys a manifest has: id, name, version, description,"))
            && notes[0].ends_with(", resources)"),
        "{err}"
    );
    assert_eq!(
        notes[1],
        format!("note: {file}: has no `resources`: it declares no files")
    );
    let path = env.dir.path().join("notochord.json");
    let out = env.run(&["--json", "check", path.to_str().unwrap()]).await;
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], true, "{doc}");
    assert_eq!(doc["notes"][1]["path"], "manifest", "{doc}");
    assert_eq!(doc["notes"][1]["file"], path.display().to_string(), "{doc}");
    assert_eq!(
        doc["notes"][1]["message"],
        "has no `resources`: it declares no files"
    );
    assert_eq!(stderr(&out), "");
    // With `resources`, the other keys are the rest of the manifest's.
    let (code, _, err) = check_doc(
        &env,
        "notochord.json",
        json!({ "id": "g", "files": 1, "resources": [valid("a")] }),
    )
    .await;
    assert_eq!((code, err.as_str()), (Some(0), ""));
}

#[tokio::test]
async fn places_read_manifest_resources_n_and_the_fix_for_missing_values_is_said_once() {
    let env = Env::new().await;
    let folder = env.dir.path().join("my gems");
    std::fs::create_dir(&folder).unwrap();
    let path = folder.join("notochord.json");
    let mut bare = valid("b");
    bare.as_object_mut().unwrap().remove("size");
    bare.as_object_mut().unwrap().remove("sha256");
    let doc = json!({ "resources": [valid("a"), valid("x"), valid("a"), bare] });
    std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
    let out = env.run(&["check", path.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    let file = path.display();
    // The folder's name has a space: the command is quoted as the user's
    // shell reads it (cmd and PowerShell take double quotes).
    let quoted = if cfg!(windows) {
        format!("\"{file}\"")
    } else {
        format!("'{file}'")
    };
    assert_eq!(
        stderr(&out).lines().collect::<Vec<_>>(),
        [
            format!("E_PERM_INVALID: {file}: manifest.resources[2].id: duplicate id \"a\" (first used by manifest.resources[0])"),
            format!("E_PERM_INVALID: {file}: manifest.resources[3].sha256: is required (to fill in every missing size and sha256: `gem-resources autofill --manifest {quoted} --write`)"),
            format!("E_PERM_INVALID: {file}: manifest.resources[3].size: is required"),
        ]
    );
}

#[tokio::test]
async fn check_json_output_lists_the_resources() {
    let env = Env::new().await;
    let path = env.write_manifest(
        "manifest.json",
        json!([
            valid("a"),
            entry_with(
                "b",
                "mirrors",
                json!(["https://m.example.com/b", "https://n.example.com/b"])
            ),
        ]),
    );
    let out = env.run(&["--json", "check", path.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let file = path.display().to_string();
    let note = format!("declares no gem id (\"id\"): `install {file}` refuses it; add one, or install it as `install GEM {file}`");
    assert_eq!(
        v,
        json!({
            "ok": true,
            "file": file,
            "notes": [{ "file": file, "path": "manifest", "message": note }],
            "resources": [
                { "id": "a", "url": "https://cdn.example.com/a.bin", "size": 10, "sha256": HASH, "required": false, "mirrors": [] },
                { "id": "b", "url": "https://cdn.example.com/b.bin", "size": 10, "sha256": HASH, "required": false, "mirrors": ["https://m.example.com/b", "https://n.example.com/b"] },
            ]
        })
    );
}

#[tokio::test]
async fn check_json_output_lists_every_problem() {
    let env = Env::new().await;
    let path = env.write_manifest(
        "manifest.json",
        json!([
            entry_with("a", "url", json!("http://cdn.example.com/a.bin")),
            entry_with("b", "size", json!(-3)),
        ]),
    );
    let out = env.run(&["--json", "check", path.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], "E_PERM_INVALID", "{v}");
    assert_eq!(
        v["problems"],
        json!([
            { "file": path.display().to_string(), "path": "manifest.resources[0].url", "code": "E_PERM_INVALID", "message": "must start with https://, got \"http://cdn.example.com/a.bin\"" },
            { "file": path.display().to_string(), "path": "manifest.resources[1].size", "code": "E_PERM_INVALID", "message": "must be a non-negative integer, got -3" },
        ])
    );
}

#[tokio::test]
async fn fetching_an_invalid_manifest_downloads_nothing() {
    let env = Env::new().await;
    let good = bytes(100, 1);
    let url = env.serve("/good.bin", &good);
    let path = env.write_manifest(
        "manifest.json",
        json!([
            entry("good", &url, &good),
            entry_with("bad", "url", json!("http://cdn.example.com/bad.bin")),
        ]),
    );
    let out = env.run(&["fetch", path.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).lines().map(|l| in_manifest(l, &path)).collect::<Vec<_>>(),
        ["E_PERM_INVALID: manifest.resources[1].url: must start with https://, got \"http://cdn.example.com/bad.bin\""]
    );
    assert_eq!(stdout(&out), "");
    assert_eq!(env.origin.total_hits(), 0);
    assert!(files_under(&env.store_dir()).is_empty());
}

#[tokio::test]
async fn a_description_with_terminal_controls_or_bidi_overrides_is_refused() {
    let env = Env::new().await;
    let r0 = "E_PERM_INVALID: manifest.resources[0].description";
    let control = "must not contain control characters";
    let bidi = "must not contain bidirectional formatting characters";
    for (text, expected) in [
        (
            "OCR\u{1b}]0;pwned\u{7}",
            format!("{r0}: {control}, got \"OCR\\u{{1b}}]0;pwned\\u{{7}}\""),
        ),
        (
            "two\nlines",
            format!("{r0}: {control}, got \"two\\nlines\""),
        ),
        (
            "rub\u{7f}out",
            format!("{r0}: {control}, got \"rub\\u{{7f}}out\""),
        ),
        (
            "c1\u{9b}2J",
            format!("{r0}: {control}, got \"c1\\u{{9b}}2J\""),
        ),
        (
            "model\u{202e}exe.txt",
            format!("{r0}: {bidi}, got \"model\\u{{202e}}exe.txt\""),
        ),
        (
            "iso\u{2067}late",
            format!("{r0}: {bidi}, got \"iso\\u{{2067}}late\""),
        ),
        (
            "mark\u{200f}",
            format!("{r0}: {bidi}, got \"mark\\u{{200f}}\""),
        ),
    ] {
        let (code, lines) = check(&env, json!([entry_with("x", "description", json!(text))])).await;
        assert_eq!(code, Some(1), "{text:?}");
        assert_eq!(lines, [expected], "{text:?}");
    }
    let (code, lines) = check(
        &env,
        json!([entry_with("x", "description", json!("模型 — modèle"))]),
    )
    .await;
    assert_eq!(code, Some(0), "{lines:?}");
}

#[tokio::test]
async fn messages_name_the_fix_for_the_usual_mistakes() {
    let env = Env::new().await;
    let (code, lines) = check(
        &env,
        json!([
            entry_with("quoted", "size", json!("6000")),
            entry_with("prefixed", "sha256", json!(format!("sha256:{HASH}"))),
            entry_with("bare", "url", json!("cdn.example.com/bare.bin")),
        ]),
    )
    .await;
    assert_eq!(code, Some(1));
    let all = lines.join("\n");
    assert!(all.contains("resources[0].size: must be a non-negative integer, got the string \"6000\" (remove the quotes)"), "{all}");
    assert!(all.contains("(drop the \"sha256:\" prefix)"), "{all}");
    assert!(all.contains("(add https:// in front)"), "{all}");

    // A comment.
    let commented = env.dir.path().join("commented.json");
    std::fs::write(&commented, "{\n  // the model\n  \"resources\": []\n}\n").unwrap();
    let (code, lines) = check_file(&env, &commented).await;
    assert_eq!(code, Some(1));
    assert!(
        lines.join("\n").contains("JSON has no comments"),
        "{lines:?}"
    );

    // A gem's folder given for its manifest.
    let folder = env.dir.path().join("my-gem");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("notochord.json"), "{\"resources\": []}").unwrap();
    let out = env.run(&["check", folder.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    let all = stderr(&out);
    assert!(
        all.contains("did you mean") && all.contains("notochord.json"),
        "{all}"
    );

    // A byte-order mark is skipped, and said.
    let bom = env.dir.path().join("bom.json");
    let mut bytes = b"\xEF\xBB\xBF".to_vec();
    bytes.extend_from_slice(json!({ "resources": [valid("a")] }).to_string().as_bytes());
    std::fs::write(&bom, bytes).unwrap();
    let out = env.run(&["check", bom.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("byte-order mark"), "{}", stderr(&out));
}

#[tokio::test]
async fn quiet_says_only_errors_and_verbose_says_more() {
    let env = Env::new().await;
    let body = bytes(10_000, 63);
    let url = env.serve("/q.bin", &body);
    let manifest = env.write_manifest("m.json", json!([required_entry_for(&url, &body)]));
    let out = env
        .run(&["-q", "install", "g", manifest.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        !err.contains("verified") && !err.contains("warning"),
        "{err}"
    );
    let out = env.run(&["-v", "status"]).await;
    assert!(stderr(&out).contains("warning: [dev]"), "{}", stderr(&out));
    std::fs::remove_dir_all(env.store_dir()).unwrap();
    let out = env.run(&["-vv", "fetch", manifest.to_str().unwrap()]).await;
    assert!(stderr(&out).contains("DEBUG"), "{}", stderr(&out));
}

fn required_entry_for(url: &url::Url, body: &[u8]) -> Value {
    required_entry("q", url, body)
}

#[tokio::test]
async fn check_refuses_addresses_every_machine_refuses_and_says_when_dev_lets_one_through() {
    let env = Env::new().await;
    let mut local = valid("a");
    local["url"] = json!("https://localhost:8443/a.bin");
    let mut spelled = valid("b");
    spelled["url"] = json!("https://cdn.example.com/b.bin");
    spelled["mirrors"] = json!(["https://0x7f.1/b.bin", "https://[::ffff:10.0.0.1]/b.bin"]);
    let mut exempt = valid("c");
    // The test configuration's [dev] allow_addresses lets 127.0.0.1 through.
    exempt["url"] = json!("https://127.0.0.1:8443/c.bin");
    let (code, lines) = check(&env, json!([local, spelled, exempt, valid("d")])).await;
    assert_eq!(code, Some(1), "{lines:?}");
    let text = lines.join("\n");
    for (path, says) in [
        (
            "manifest.resources[0].url",
            "(local host name): every machine refuses it",
        ),
        (
            "manifest.resources[1].mirrors[0]",
            "127.0.0.1 is a local or internal-network address (loopback)",
        ),
        (
            "manifest.resources[1].mirrors[1]",
            "IPv4-mapped private network",
        ),
        (
            "manifest.resources[2].url",
            "allowed here only by [dev] settings; users' machines refuse it",
        ),
    ] {
        assert!(
            lines.iter().any(|l| l.contains(path)
                && l.contains(says)
                && l.starts_with("E_RESOURCE_ADDRESS")),
            "{path}: {says}\n{text}"
        );
    }
    assert!(!text.contains("resources[3]"), "{text}");
    // The same as JSON: one problem each.
    let path = env.write_manifest("manifest.json", json!([local_only()]));
    let out = env.run(&["--json", "check", path.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], false, "{doc}");
    assert_eq!(doc["code"], "E_RESOURCE_ADDRESS", "{doc}");
    assert_eq!(
        doc["problems"][0]["path"], "manifest.resources[0].url",
        "{doc}"
    );
    assert!(
        doc["problems"][0]["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("manifest.json")),
        "{doc}"
    );
    assert_eq!(
        doc["problems"][0]["address"], "https://printer.local/l.bin",
        "{doc}"
    );
    // The policy configured here refuses a host: said too.
    env.write_config("mode = \"blocklist\"\nhosts = [\"cdn.example.com\"]");
    let (code, lines) = check(&env, json!([valid("p")])).await;
    assert_eq!(code, Some(1), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("E_RESOURCE_POLICY") && l.contains("blocklist mode")),
        "{lines:?}"
    );
}

fn local_only() -> Value {
    let mut r = valid("l");
    r["url"] = json!("https://printer.local/l.bin");
    r
}

#[tokio::test]
async fn check_says_what_install_will_say() {
    let env = Env::new().await;
    // A gem id that install refuses is a problem of check too.
    let path = env.dir.path().join("notochord.json");
    let doc = json!({ "id": "My Gem", "resources": [valid("a")] });
    std::fs::write(&path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let (code, lines) = check_file(&env, &path).await;
    assert_eq!(code, Some(1), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("E_RESOURCE_GEM_ID: manifest.id: ")),
        "{lines:?}"
    );
    let out = env.run(&["install", path.to_str().unwrap()]).await;
    assert_ne!(
        out.status.code(),
        Some(0),
        "install took the gem id check refused"
    );

    // Address rules are said beside the structure's problems, not after them.
    let (code, lines) = check(
        &env,
        json!([
            entry_with("a", "url", json!("https://localhost/a.bin")),
            entry_with("b", "size", json!(-3)),
        ]),
    )
    .await;
    assert_eq!(code, Some(1));
    assert!(
        lines.iter().any(|l| l.starts_with(
            "E_RESOURCE_ADDRESS: manifest.resources[0].url: https://localhost/a.bin: "
        )),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("E_PERM_INVALID: manifest.resources[1].size: ")),
        "{lines:?}"
    );

    // A size of 0 promises the empty file: another hash can never match.
    let (code, lines) = check(&env, json!([entry_with("a", "size", json!(0))])).await;
    assert_eq!(code, Some(1));
    assert!(
        lines.iter().any(|l| l.starts_with(
            "E_PERM_INVALID: manifest.resources[0].size: is 0, but sha256 is not the empty file's"
        ) && l.contains("autofill --manifest")),
        "{lines:?}"
    );
    let empty = json!({ "id": "a", "url": "https://cdn.example.com/a.bin", "size": 0,
        "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" });
    let (code, lines) = check(&env, json!([empty])).await;
    assert_eq!(code, Some(0), "{lines:?}");

    // A misspelt manifest name: the file meant is named.
    let typo = env.dir.path().join("notochrd.json");
    let out = env.run(&["check", typo.to_str().unwrap()]).await;
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains(&format!("did you mean {}?", path.display())),
        "{}",
        stderr(&out)
    );
}
