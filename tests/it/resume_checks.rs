//! What a resume must check: the `206` continues exactly the bytes kept
//! (its start and its total), and kept bytes are continued only with the
//! address that sent them.

use std::time::Duration;

use gem_resources::{download, Fetcher, Reporter, Resource, RetryPolicy, Store};

use crate::support::*;

/// Records the offsets the transfer reported as resumed.
#[derive(Default)]
struct Resumes(Vec<u64>);

impl Reporter for Resumes {
    fn resumed(&mut self, offset: u64) {
        self.0.push(offset);
    }
    fn bytes(&mut self, _total: u64) {}
}

fn retries(n: u32) -> RetryPolicy {
    RetryPolicy {
        retries: n,
        backoff: Duration::ZERO,
        ..RetryPolicy::default()
    }
}

/// Downloads `r` with `retries`, returning the offsets resumed from.
async fn fetch_resumes(env: &Env, r: &Resource, retries: RetryPolicy) -> Vec<u64> {
    let config = env.config();
    let fetcher = Fetcher::new(&config).unwrap();
    let store = Store::open(&config.store_dir()).unwrap();
    let mut resumes = Resumes::default();
    let path = within(
        "the download",
        download(&fetcher, &store, r, retries, &mut resumes),
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(path).unwrap().len() as u64, r.size);
    resumes.0
}

fn header(env: &Env, path: &str, name: &str) -> Option<String> {
    env.origin
        .last_headers(path)?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

/// The first answer sends `cut` bytes and goes silent (the stall keeps
/// exactly those), the second is the `206` head `content_range` with the
/// rest, the third a plain `200`.
async fn a_wrong_206_is_refused(content_range: impl Fn(usize, usize) -> String) {
    let env = Env::new().await;
    env.write_config("stall_timeout_secs = 0.3");
    let body = bytes(400_000, 140);
    let cut = body.len() / 2;
    let head = format!(
        "HTTP/1.1 206 Partial Content\r\nETag: \"v1\"\r\nContent-Range: {}\r\nContent-Length: {}\r\nConnection: close",
        content_range(cut, body.len()),
        body.len() - cut
    );
    env.origin.route(
        "/r.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_held(&body, "\"v1\"", cut),
            Behaviour::Raw {
                head,
                body: body[cut..].to_vec(),
            },
            Behaviour::ranged(&body, "\"v1\""),
        ]),
    );
    let r = resource("r", &env.url("origin.test", "/r.bin"), &[], &body);
    let resumes = fetch_resumes(&env, &r, retries(1)).await;
    assert_eq!(resumes, Vec::<u64>::new(), "the 206 was accepted");
    assert_eq!(env.origin.hits("/r.bin"), 3);
    // After the refusal the file was asked for whole.
    assert_eq!(header(&env, "/r.bin", "range"), None);
}

#[tokio::test]
async fn a_206_that_starts_elsewhere_than_asked_is_refused() {
    a_wrong_206_is_refused(|cut, len| format!("bytes {}-{}/{len}", cut - 1, len - 1)).await;
}

#[tokio::test]
async fn a_206_whose_total_is_not_the_declared_size_is_refused() {
    a_wrong_206_is_refused(|cut, len| format!("bytes {cut}-{}/{}", len - 1, len + 5)).await;
}

#[tokio::test]
async fn a_good_206_is_resumed_from_the_kept_offset() {
    // The same setup as the refusals, with a correct head: the helper's
    // three-answer sequence stays honest.
    let env = Env::new().await;
    env.write_config("stall_timeout_secs = 0.3");
    let body = bytes(400_000, 141);
    let cut = body.len() / 2;
    env.origin.route(
        "/g.bin",
        Behaviour::Sequence(vec![
            Behaviour::ranged_held(&body, "\"v1\"", cut),
            Behaviour::ranged(&body, "\"v1\""),
        ]),
    );
    let r = resource("g", &env.url("origin.test", "/g.bin"), &[], &body);
    let resumes = fetch_resumes(&env, &r, retries(1)).await;
    assert_eq!(resumes, [cut as u64]);
    assert_eq!(
        header(&env, "/g.bin", "range"),
        Some(format!("bytes={cut}-"))
    );
}

#[tokio::test]
async fn kept_bytes_are_not_continued_from_another_address() {
    let env = Env::new().await;
    env.write_config("stall_timeout_secs = 0.3");
    let body = bytes(400_000, 142);
    let cut = body.len() / 2;
    env.origin
        .route("/url.bin", Behaviour::ranged_held(&body, "\"v1\"", cut));
    // The mirror would honour the range: same bytes, same tag.
    env.origin
        .route("/mirror.bin", Behaviour::ranged(&body, "\"v1\""));
    let r = resource(
        "m",
        &env.url("origin.test", "/url.bin"),
        &[env.url("mirror.test", "/mirror.bin")],
        &body,
    );
    let resumes = fetch_resumes(&env, &r, retries(0)).await;
    assert_eq!(resumes, Vec::<u64>::new());
    assert_eq!(header(&env, "/mirror.bin", "range"), None);
    assert_eq!(header(&env, "/mirror.bin", "if-range"), None);
    assert_eq!(env.origin.served("/mirror.bin"), body.len() as u64);
}
