//! `check` and `status` say when a file downloads in the same words, in
//! aligned columns.

use serde_json::json;

use crate::support::*;

/// Where each of `words` starts in `line` (by characters).
fn column_of(line: &str, word: &str) -> usize {
    let at = line
        .find(word)
        .unwrap_or_else(|| panic!("{word:?} not in {line:?}"));
    line[..at].chars().count()
}

#[tokio::test]
async fn check_and_status_share_words_and_align_their_columns() {
    let env = Env::new().await;
    let (a, b) = (bytes(1_500_000, 41), bytes(20, 42));
    let (url_a, url_b) = (env.serve("/a.bin", &a), env.serve("/b.bin", &b));
    let mut long = required_entry("a-much-longer-id", &url_a, &a);
    long["mirrors"] = json!([env.url("mirror.test", "/a.bin").as_str()]);
    let manifest = env.write_manifest("m.json", json!([long, entry("b", &url_b, &b)]));
    let out = env.run(&["check", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains("required") && lines[0].contains("(+1 mirror)"),
        "{text}"
    );
    assert!(lines[1].contains("on first use"), "{text}");
    // Sizes end in one column, the "when" and the address start in one.
    let size_end = |l: &str, size: &str| column_of(l, size) + size.chars().count();
    assert_eq!(
        size_end(lines[0], "1.4 MiB"),
        size_end(lines[1], "20 B"),
        "{text}"
    );
    assert_eq!(
        column_of(lines[0], "required"),
        column_of(lines[1], "on first use"),
        "{text}"
    );
    assert_eq!(
        column_of(lines[0], "https://"),
        column_of(lines[1], "https://"),
        "{text}"
    );

    let out = env.run(&["install", "g", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = env.run(&["status"]).await;
    let text = stdout(&out);
    let row = |id: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(id))
            .unwrap_or_else(|| panic!("no {id} in {text}"))
            .to_string()
    };
    let (first, second) = (row("a-much-longer-id"), row("b "));
    assert!(
        first.contains("required") && !first.contains("eager"),
        "{text}"
    );
    assert!(
        second.contains("on first use") && !second.contains("lazy"),
        "{text}"
    );
    assert_eq!(
        column_of(&first, "required"),
        column_of(&second, "on first use"),
        "{text}"
    );
    assert_eq!(
        column_of(&first, "present"),
        column_of(&second, "missing"),
        "{text}"
    );
}

/// `status` on a terminal of `cols` columns: its rows.
#[cfg(unix)]
async fn status_rows(env: &Env, cols: u16) -> Vec<String> {
    let (code, shown) = run_in_terminal(env, &["status"], cols).await;
    assert_eq!(code, Some(0), "{shown}");
    terminal_rows(&shown)
        .into_iter()
        .filter(|r| r.starts_with("  "))
        .collect()
}

#[cfg(unix)]
#[tokio::test]
async fn status_fits_the_terminal_by_cutting_the_description_never_the_state() {
    let env = Env::new().await;
    let (a, b) = (bytes(1_500_000, 43), bytes(20, 44));
    let (url_a, url_b) = (env.serve("/a.bin", &a), env.serve("/b.bin", &b));
    let mut first = required_entry("model", &url_a, &a);
    first["description"] = json!("Handwriting recognition model, version three");
    let mut second = entry("voices", &url_b, &b);
    second["description"] = json!("Reading voices for every language");
    let manifest = env.write_manifest("m.json", json!([first, second]));
    let out = env.run(&["install", "g", manifest.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    for cols in [80u16, 120] {
        let rows = status_rows(&env, cols).await;
        assert_eq!(rows.len(), 2, "{rows:#?}");
        for row in &rows {
            assert!(row.chars().count() <= usize::from(cols), "{cols}: {row}");
        }
        let (model, voices) = (&rows[0], &rows[1]);
        assert!(model.contains("present"), "{cols}: {model}");
        assert!(voices.trim_end().ends_with("missing"), "{cols}: {voices}");
        // The description is cut with an ellipsis, never mid-word wrapped.
        assert!(model.contains("Handwrit"), "{cols}: {model}");
        assert!(model.contains('…'), "{cols}: {model}");
    }
    // Through a pipe, the whole table as before (a description up to 24).
    let out = env.run(&["status"]).await;
    assert!(
        stdout(&out).contains("Handwriting recognition…"),
        "{}",
        stdout(&out)
    );
}
