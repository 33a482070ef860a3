//! The bars on a terminal tell the truth: after a resume the rate counts
//! only this run's bytes, a stall shows as one, a capped download shows
//! the cap, and a bar fits the terminal's width. Each runs the binary on
//! a pseudo-terminal (`script`) and reads the rows it drew.

use std::time::Duration;

use serde_json::json;

use crate::support::*;

const MIB: usize = 1 << 20;

/// A manifest with one resource `f` of `body` at `path` on origin.test.
fn one_file(env: &Env, path: &str, body: &[u8]) -> String {
    let url = env.url("origin.test", path);
    let manifest = env.write_manifest("m.json", json!([entry("f", &url, body)]));
    manifest.display().to_string()
}

#[tokio::test]
async fn after_a_resume_the_rate_is_this_runs_and_the_resume_is_said() {
    let env = Env::new().await;
    let body = bytes(6 * MIB, 51);
    let paced = Behaviour::Ranged {
        body: body.clone(),
        etag: "\"r1\"".into(),
        ignore_range: false,
        cut_at: None,
        hold: false,
        // About 1.2 MiB/s.
        pace: Some((64 * 1024, Duration::from_millis(50))),
    };
    env.origin.route(
        "/r.bin",
        Behaviour::Sequence(vec![Behaviour::ranged_cut(&body, "\"r1\"", 4 * MIB), paced]),
    );
    let manifest = one_file(&env, "/r.bin", &body);
    let first = env.run(&["fetch", &manifest]).await;
    assert_eq!(first.status.code(), Some(1), "{}", stderr(&first));
    // What arrived before the reset: up to 4 MiB (a reset discards what
    // the client had not read yet, so a busy machine keeps a little less).
    let kept = partial_files(&env)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .max()
        .expect("nothing was kept to resume");
    assert!(
        (MIB as u64..=4 * MIB as u64).contains(&kept),
        "{kept} bytes kept"
    );

    let (code, shown) = run_in_terminal(&env, &["fetch", &manifest], 100).await;
    assert_eq!(code, Some(0), "{shown}");
    let rows = terminal_rows(&shown);
    let resuming = format!("resuming at {}", gem_resources::error::human_bytes(kept));
    assert!(
        rows.iter().any(|r| r.contains(&resuming)),
        "{resuming:?} not shown: {rows:#?}"
    );
    let rates = shown_rates(&rows);
    assert!(!rates.is_empty(), "{rows:#?}");
    let highest = rates.iter().cloned().fold(0.0, f64::max) / MIB as f64;
    // The origin sends about 1.2 MiB/s; counting the kept 4 MiB would
    // show several times that.
    assert!(
        highest < 2.5,
        "a rate of {highest:.1} MiB/s was shown: {rows:#?}"
    );
}

#[tokio::test]
async fn a_stall_is_shown_as_one_with_the_rate_falling() {
    let env = Env::new().await;
    env.write_config("stall_timeout_secs = 6");
    let body = bytes(4 * MIB, 53);
    env.origin
        .route("/s.bin", Behaviour::ranged_held(&body, "\"s1\"", MIB));
    let manifest = one_file(&env, "/s.bin", &body);
    let (code, shown) = run_in_terminal(&env, &["fetch", &manifest], 100).await;
    assert_eq!(code, Some(1), "{shown}");
    let rows = terminal_rows(&shown);
    let stalled: Vec<&String> = rows.iter().filter(|r| r.contains("stalled for")).collect();
    assert!(!stalled.is_empty(), "{rows:#?}");
    // The last rows of the stall show the rate fallen to nothing.
    let last = stalled.last().unwrap();
    let rate = shown_rates(&[last.to_string()]);
    assert_eq!(rate, vec![0.0], "{last}");
    // Counting up to the stall timeout (6 s), whatever the machine's load.
    let secs: u64 = last
        .split("stalled for ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!((3..=7).contains(&secs), "{last}");
}

#[tokio::test]
async fn a_capped_download_shows_the_cap_not_its_first_burst() {
    let env = Env::new().await;
    let body = bytes(5 * MIB, 55);
    let manifest = {
        let url = env.serve("/c.bin", &body);
        env.write_manifest("m.json", json!([entry("f", &url, &body)]))
    };
    let manifest = manifest.display().to_string();
    let (code, shown) =
        run_in_terminal(&env, &["--limit-rate", "1M", "fetch", &manifest], 100).await;
    assert_eq!(code, Some(0), "{shown}");
    let rates = shown_rates(&terminal_rows(&shown));
    assert!(rates.len() >= 4, "{rates:?}");
    let cap = MIB as f64;
    // The cap's first burst (its bucket starts full) is spread over a
    // second at least: never the many times the cap a plain average of
    // the first instants gives.
    let highest = rates.iter().cloned().fold(0.0, f64::max);
    assert!(
        highest < 2.5 * cap,
        "a burst showed {:.2} MiB/s",
        highest / cap
    );
    // From the middle on (past 2 s of 5), within 20 % of the cap.
    for rate in &rates[rates.len() / 2..] {
        assert!(
            (rate / cap - 1.0).abs() <= 0.2,
            "{:.2} MiB/s under a 1 MiB/s cap: {rates:?}",
            rate / cap
        );
    }
}

#[tokio::test]
async fn a_bar_fits_an_80_column_terminal() {
    let env = Env::new().await;
    let body = bytes(3 * MIB, 57);
    let paced = Behaviour::Ranged {
        body: body.clone(),
        etag: "\"w1\"".into(),
        ignore_range: false,
        cut_at: None,
        hold: false,
        pace: Some((128 * 1024, Duration::from_millis(50))),
    };
    env.origin
        .route("/a-rather-long-file-name-for-a-bar.bin", paced);
    let manifest = one_file(&env, "/a-rather-long-file-name-for-a-bar.bin", &body);
    let (code, shown) = run_in_terminal(&env, &["fetch", &manifest], 80).await;
    assert_eq!(code, Some(0), "{shown}");
    let rows = terminal_rows(&shown);
    let bars: Vec<&String> = rows
        .iter()
        .filter(|r| r.contains("MiB/s") || r.contains("KiB/s"))
        .collect();
    assert!(!bars.is_empty(), "{rows:#?}");
    for row in bars {
        assert!(
            row.chars().count() <= 80,
            "{} columns: {row}",
            row.chars().count()
        );
    }
}

/// The time left a bar row shows (its last figure: `--`, `12s`, `1m 5s`),
/// in seconds (`None` for `--`); rows without one are skipped.
fn shown_left(row: &str) -> Option<Option<u64>> {
    if !(row.contains("B/s") && row.contains('[')) {
        return None;
    }
    let words: Vec<&str> = row.split_whitespace().collect();
    let last = *words.last()?;
    if last == "--" {
        return Some(None);
    }
    let secs = |w: &str, unit: char, by: u64| {
        w.strip_suffix(unit)
            .and_then(|n| n.parse::<u64>().ok())
            .map(|n| n * by)
    };
    let before = words
        .get(words.len().wrapping_sub(2))
        .copied()
        .unwrap_or("");
    let total = match (secs(before, 'm', 60), secs(last, 's', 1)) {
        (Some(m), Some(s)) => m + s,
        (None, Some(s)) => s,
        _ => secs(last, 'm', 60)? + secs(before, 'h', 3600).unwrap_or(0),
    };
    Some(Some(total))
}

#[tokio::test]
async fn the_time_left_reads_dashes_until_the_rate_settles_then_a_true_figure() {
    let env = Env::new().await;
    let body = bytes(10 * MIB, 56);
    let paced = Behaviour::Ranged {
        body: body.clone(),
        etag: "\"e1\"".into(),
        ignore_range: false,
        cut_at: None,
        hold: false,
        // About 1.2 MiB/s: some 8 s.
        pace: Some((64 * 1024, Duration::from_millis(50))),
    };
    env.origin.route("/eta.bin", paced);
    let manifest = one_file(&env, "/eta.bin", &body);
    let (code, shown) = run_in_terminal(&env, &["fetch", &manifest], 80).await;
    assert_eq!(code, Some(0), "{shown}");
    let rows = terminal_rows(&shown);
    let left: Vec<Option<u64>> = rows.iter().filter_map(|r| shown_left(r)).collect();
    // Bytes flowed from the first rows on, and the time left was not told
    // for their first seconds.
    let flowing: Vec<&String> = rows
        .iter()
        .filter(|r| shown_left(r).is_some() && shown_rates(&[r.to_string()]) != vec![0.0])
        .collect();
    assert!(flowing.len() >= 4, "{rows:#?}");
    for row in &flowing[..2] {
        assert_eq!(shown_left(row), Some(None), "a time left too early: {row}");
    }
    // Then a figure, never more than the whole download takes.
    let figures: Vec<u64> = left.iter().flatten().copied().collect();
    assert!(!figures.is_empty(), "never a time left: {rows:#?}");
    assert!(
        figures.iter().all(|s| *s <= 10),
        "a wild time left: {figures:?}"
    );
}

#[tokio::test]
async fn a_retry_counts_down_under_the_bar_in_80_columns_without_cutting_a_word() {
    let env = Env::new().await;
    env.write_config("retries = 3\nretry_backoff_secs = 0");
    let body = bytes(3 * MIB, 58);
    let paced = Behaviour::Ranged {
        body: body.clone(),
        etag: "\"n1\"".into(),
        ignore_range: false,
        cut_at: None,
        hold: false,
        pace: Some((128 * 1024, Duration::from_millis(50))),
    };
    // Cut after 1 MiB, then "come back in 4 s", then the rest.
    env.origin.route(
        "/n.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_cut(&body, "\"n1\"", MIB),
            Behaviour::RetryAfter {
                status: 503,
                value: "4".into(),
            },
            paced,
        ]),
    );
    let manifest = one_file(&env, "/n.bin", &body);
    let (code, shown) = run_in_terminal(&env, &["fetch", &manifest], 80).await;
    assert_eq!(code, Some(0), "{shown}");
    let rows = terminal_rows(&shown);
    // The words of docs/commands.md, on a row of their own.
    let retries: Vec<&String> = rows
        .iter()
        .filter(|r| r.trim_start().starts_with("retrying in "))
        .collect();
    assert!(!retries.is_empty(), "no retry row: {rows:#?}");
    let mut countdown = std::collections::BTreeSet::new();
    for row in &retries {
        assert!(
            row.chars().count() <= 80,
            "{} columns: {row}",
            row.chars().count()
        );
        let text = row.trim();
        let (head, reason) = text.split_once("): ").unwrap_or_else(|| panic!("{row}"));
        assert!(
            head.contains(" s (attempt ") && head.ends_with(" of 4"),
            "{row}"
        );
        countdown.insert(head.split_whitespace().nth(2).unwrap_or("").to_string());
        // The reason whole, or cut after a whole word.
        // The reason whole, or cut after a whole word.
        let full = "HTTP status 503 Service Unavailable (retry after 4s)";
        match reason.strip_suffix('…') {
            Some(cut) => assert!(
                full.starts_with(cut) && full[cut.len()..].starts_with(' '),
                "cut within a word: {row}"
            ),
            None => assert_eq!(reason, full, "{row}"),
        }
    }
    assert!(
        countdown.len() >= 2,
        "the countdown stood still: {countdown:?} {retries:#?}"
    );
    // The bar stays above it, with its figures, within 80 columns.
    for row in rows.iter().filter(|r| r.contains('[')) {
        assert!(
            row.chars().count() <= 80,
            "{} columns: {row}",
            row.chars().count()
        );
    }
}

#[tokio::test]
async fn a_note_narrows_the_bar_but_never_removes_it_and_fits_80_columns() {
    let env = Env::new().await;
    env.write_config("retries = 3\nretry_backoff_secs = 0");
    let body = bytes(3 * MIB, 58);
    let paced = Behaviour::Ranged {
        body: body.clone(),
        etag: "\"n1\"".into(),
        ignore_range: false,
        cut_at: None,
        hold: false,
        pace: Some((128 * 1024, Duration::from_millis(50))),
    };
    // Cut after 1 MiB, then "come back in 2 s", then the rest.
    env.origin.route(
        "/n.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_cut(&body, "\"n1\"", MIB),
            Behaviour::RetryAfter {
                status: 503,
                value: "2".into(),
            },
            paced,
        ]),
    );
    let manifest = one_file(&env, "/n.bin", &body);
    let (code, shown) = run_in_terminal(&env, &["fetch", &manifest], 80).await;
    assert_eq!(code, Some(0), "{shown}");
    let rows = terminal_rows(&shown);
    let noted: Vec<&String> = rows.iter().filter(|r| r.contains("resuming at ")).collect();
    assert!(!noted.is_empty(), "no resume note: {rows:#?}");
    for row in noted {
        // `[` ten columns of bar `]`, the percentage, then the note.
        let bar = row
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'));
        let Some((bar, after)) = bar else {
            panic!("no bar beside the note: {row}");
        };
        assert_eq!(bar.chars().count(), 10, "{row}");
        assert!(bar.contains('='), "the bar shows nothing done: {row}");
        assert!(after.trim_start().starts_with("33%"), "{row}");
    }
    for row in rows.iter().filter(|r| r.contains('[')) {
        assert!(
            row.chars().count() <= 80,
            "{} columns: {row}",
            row.chars().count()
        );
    }
}
