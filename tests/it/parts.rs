//! Ranged parts: a large file whose server answers ranges exactly is
//! fetched over several connections at once, under every rule of one
//! stream, and verified as a whole.

use std::time::{Duration, Instant};

use gem_resources::policy::{Mode, Policy};
use gem_resources::{download, Error, ErrorCode, Fetcher, Resource, Store};

use crate::support::*;

/// Above the parts threshold (8 MiB).
const SIZE: usize = 12 << 20;

/// 64 KiB every 40 ms: about 1.6 MB/s per connection, so one connection
/// needs about 8 s for [`SIZE`].
fn paced(body: &[u8]) -> Behaviour {
    Behaviour::parts(body, "\"p1\"", 64 << 10, Duration::from_millis(40))
}

/// 64 KiB every 4 ms: about 16 MB/s per connection, below the rate at
/// which a file is split into parts.
fn faulty(body: &[u8], fault: PartsFault) -> Behaviour {
    Behaviour::Parts {
        body: std::sync::Arc::new(body.to_vec()),
        etag: "\"p1\"".into(),
        pace: (64 << 10, Duration::from_millis(4)),
        fault,
    }
}

/// A configuration with eight connections per host, `network` added.
fn config(env: &Env, network: &str) {
    env.write_config_full(network, "[service]\nmax_per_host = 8\n");
}

async fn fetch_logged(
    env: &Env,
    r: &Resource,
) -> (gem_resources::Result<std::path::PathBuf>, String) {
    let logs = Logs::capture();
    let result = fetch_with(env, r, no_retry()).await;
    (result, logs.text())
}

/// The distinct starts of the ranges asked for.
fn starts(env: &Env, path: &str) -> Vec<u64> {
    let mut starts: Vec<u64> = env
        .origin
        .ranges(path)
        .iter()
        .filter_map(|r| r.strip_prefix("bytes=")?.split('-').next()?.parse().ok())
        .collect();
    starts.sort();
    starts.dedup();
    starts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_run_at_once_and_end_verified() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 31);
    env.origin.route("/p.bin", paced(&body));
    let r = resource("p", &env.url("origin.test", "/p.bin"), &[], &body);
    let started = Instant::now();
    let path = fetch_with(&env, &r, no_retry()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(std::fs::read(path).unwrap(), body);
    let starts = starts(&env, "/p.bin");
    assert!(
        starts.len() >= 8,
        "ranges asked for: {:?}",
        env.origin.ranges("/p.bin")
    );
    // One connection needs about 8 s; eight at once well under half.
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert!(partial_files(&env).is_empty());
    // The parts do not overlap: a connection whose range was cut short
    // sends at most a piece or two more before it is closed.
    let served = env.origin.served("/p.bin");
    assert!(
        served >= SIZE as u64 && served <= (SIZE + (1 << 20)) as u64,
        "{served}"
    );
    eprintln!("{SIZE} bytes in parts took {took:?}");
}

/// The `[start, end]` of a `Range: bytes=start-end` header (`end` the
/// file's last byte when open).
fn asked(range: &str, size: u64) -> Option<(u64, u64)> {
    let (start, end) = range.strip_prefix("bytes=")?.split_once('-')?;
    let end = if end.is_empty() {
        size - 1
    } else {
        end.parse().ok()?
    };
    Some((start.parse().ok()?, end))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_file_is_shared_out_in_equal_ranges_each_asked_for_exactly() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 33);
    env.origin.route("/q.bin", paced(&body));
    let r = resource("q", &env.url("origin.test", "/q.bin"), &[], &body);
    let path = fetch_with(&env, &r, no_retry()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    let size = SIZE as u64;
    let ranges = env.origin.ranges("/q.bin");
    let asked: Vec<(u64, u64)> = ranges.iter().filter_map(|r| asked(r, size)).collect();
    // The first request asks for its share only (an eighth), so that the
    // split does not cut it short.
    let first = size / 8;
    assert_eq!(asked.first(), Some(&(0, first - 1)), "{ranges:?}");
    // The seven parts that take over once the first connection is found
    // slow: each a seventh of the rest, the first meeting the first
    // request's end, each the next, the last ending at the file's end.
    // Halving ranges one after another instead makes requests that reach
    // past where their range ends up (a request cut short wastes what is on
    // the way on its connection).
    let mut parts: Vec<(u64, u64)> = asked.iter().skip(1).take(7).copied().collect();
    parts.sort();
    assert_eq!(parts[0].0, first, "{ranges:?}");
    let share = (size - first) / 7;
    for w in parts.windows(2) {
        assert_eq!(w[0].1 + 1, w[1].0, "{ranges:?}");
    }
    assert_eq!(parts[6].1, size - 1, "{ranges:?}");
    for &(start, end) in &parts {
        let len = end + 1 - start;
        assert!(
            len.abs_diff(share) <= share / 7 + 1,
            "{len} against {share}: {ranges:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_connection_fast_enough_is_not_split() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 42);
    env.origin.route("/f.bin", faulty(&body, PartsFault::None));
    let r = resource("f", &env.url("origin.test", "/f.bin"), &[], &body);
    let cfg = env.config();
    let store = Store::open(&cfg.store_dir()).unwrap();
    // 16 MB/s is far above a threshold of 200 kB/s (a margin for a loaded
    // machine): one connection (however late a loaded machine answers:
    // the far-server rule is another test's).
    let fetcher = Fetcher::new(&cfg)
        .unwrap()
        .with_split_below(200_000)
        .with_far_answer(Duration::MAX);
    let logs = Logs::capture();
    let path = download(&fetcher, &store, &r, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    // Read as one stream that carried on: the parts never started.
    let text = logs.text();
    drop(logs);
    assert!(text.contains("one stream while it is fast"), "{text}");
    assert!(!text.contains("ranges answered"), "{text}");
    // Its first share, then the rest of the file on the same connection.
    let first = SIZE / 8;
    assert_eq!(
        env.origin.ranges("/f.bin"),
        vec![
            format!("bytes=0-{}", first - 1),
            format!("bytes={first}-{}", SIZE - 1)
        ]
    );
    assert_eq!(env.origin.served("/f.bin"), SIZE as u64);
    // Below a threshold of 64 MB/s: the same source in parts.
    let other = bytes(SIZE, 43);
    env.origin.route("/g.bin", faulty(&other, PartsFault::None));
    let r = resource("g", &env.url("origin.test", "/g.bin"), &[], &other);
    let fetcher = Fetcher::new(&cfg)
        .unwrap()
        .with_split_below(64_000_000)
        .with_far_answer(Duration::MAX);
    let path = download(&fetcher, &store, &r, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), other);
    assert!(
        starts(&env, "/g.bin").len() >= 4,
        "{:?}",
        env.origin.ranges("/g.bin")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_near_fast_origin_gets_one_connection_and_a_capped_one_gets_parts() {
    let env = Env::new().await;
    config(&env, "");
    let cfg = env.config();
    let store = Store::open(&cfg.store_dir()).unwrap();
    // One rule for both files, from what the first connection shows: split
    // below 2 MB/s (a margin for a loaded machine under the 64 MiB/s of
    // the default), and never for the time of the first answer (a loaded
    // machine may answer late: the far-server rule is another test's).
    let fetcher = || {
        Fetcher::new(&cfg)
            .unwrap()
            .with_split_below(2_000_000)
            .with_far_answer(Duration::MAX)
    };
    let size = SIZE as u64;
    // A near, fast origin (256 KiB a millisecond, as fast as the machine
    // takes it): one connection, its first share then the rest.
    // Connections stay open between requests, as a real server's do.
    env.origin.keep_alive();
    let body = bytes(SIZE, 47);
    env.origin.route(
        "/near.bin",
        Behaviour::parts(&body, "\"n1\"", 256 << 10, Duration::from_millis(1)),
    );
    let r = resource("near", &env.url("origin.test", "/near.bin"), &[], &body);
    let path = download(&fetcher(), &store, &r, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.connections_for("/near.bin"), 1, "one connection");
    let ranges = env.origin.ranges("/near.bin");
    assert_eq!(
        ranges,
        vec![
            format!("bytes=0-{}", size / 8 - 1),
            format!("bytes={}-{}", size / 8, size - 1)
        ]
    );
    assert_eq!(env.origin.served("/near.bin"), size, "each byte once");
    // An origin that caps each connection (1.6 MB/s): the same rule
    // splits it, eight connections at once.
    let other = bytes(SIZE, 48);
    env.origin.route("/capped.bin", paced(&other));
    let r = resource(
        "capped",
        &env.url("origin.test", "/capped.bin"),
        &[],
        &other,
    );
    let started = Instant::now();
    let path = download(&fetcher(), &store, &r, no_retry(), &mut |_| {})
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(std::fs::read(path).unwrap(), other);
    assert!(
        env.origin.connections_for("/capped.bin") >= 8,
        "{} connections: {:?}",
        env.origin.connections_for("/capped.bin"),
        env.origin.ranges("/capped.bin")
    );
    assert!(starts(&env, "/capped.bin").len() >= 8);
    // One connection would need about 8 s.
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_slows_down_hands_over_to_the_parts_where_it_is() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 44);
    let (size, first) = (SIZE as u64, SIZE as u64 / 8);
    // The first share comes at 16 MB/s; the response to the rest (the only
    // one covering the middle of the file) at 400 kB/s.
    let slow_rest = PartsFault::SlowCovering {
        at: SIZE / 2,
        count: 1,
        piece: 16 << 10,
        pause: Duration::from_millis(40),
    };
    env.origin.route("/h.bin", faulty(&body, slow_rest));
    let r = resource("h", &env.url("origin.test", "/h.bin"), &[], &body);
    let cfg = env.config();
    let store = Store::open(&cfg.store_dir()).unwrap();
    let fetcher = Fetcher::new(&cfg)
        .unwrap()
        .with_split_below(4_000_000)
        .with_far_answer(Duration::MAX);
    let logs = Logs::capture();
    let path = download(&fetcher, &store, &r, no_retry(), &mut |_| {})
        .await
        .unwrap();
    let text = logs.text();
    drop(logs);
    assert_eq!(std::fs::read(path).unwrap(), body);
    // One stream: its first share, then the rest on the same connection,
    // until the rest turned slow.
    let ranges = env.origin.ranges("/h.bin");
    assert_eq!(ranges[0], format!("bytes=0-{}", first - 1), "{ranges:?}");
    assert_eq!(
        ranges[1],
        format!("bytes={first}-{}", size - 1),
        "{ranges:?}"
    );
    // Where the stream stopped, the parts took over: the bytes it wrote
    // are kept and never asked for again.
    let from: u64 = text
        .lines()
        .find(|l| l.contains("fetching the rest in parts"))
        .and_then(|l| l.split("from=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no hand-over in the log: {text}"));
    assert!(from >= first && from < size, "{from}");
    let later: Vec<(u64, u64)> = ranges[2..].iter().filter_map(|r| asked(r, size)).collect();
    assert!(later.len() >= 3, "{ranges:?}");
    assert!(
        later.iter().all(|&(start, _)| start >= from),
        "from {from}: {ranges:?}"
    );
    assert!(partial_files(&env).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_server_is_fetched_in_parts_at_once() {
    let env = Env::new().await;
    config(&env, "");
    let cfg = env.config();
    let store = Store::open(&cfg.store_dir()).unwrap();
    // 16 MB/s is above a threshold of 1 MB/s: a connection that answers at
    // once is left alone (a_first_connection_fast_enough_is_not_split).
    let fetcher = Fetcher::new(&cfg).unwrap().with_split_below(1_000_000);
    let body = bytes(SIZE, 45);
    // The first answer comes after 300 ms, as over a link of 100 ms a round
    // trip: the file is split before a byte of it is measured.
    let late = PartsFault::LateFirstHead(Duration::from_millis(300));
    env.origin.route("/far.bin", faulty(&body, late));
    let r = resource("far", &env.url("origin.test", "/far.bin"), &[], &body);
    let logs = Logs::capture();
    let path = download(&fetcher, &store, &r, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    let ranges = env.origin.ranges("/far.bin");
    assert!(logs.text().contains("a far server"), "{}", logs.text());
    // The first request asked for its share, and the seven other parts
    // started at once on equal ranges of the rest (a steal, however early,
    // only moves where a range ends).
    let size = SIZE as u64;
    let first = size / 8;
    assert_eq!(asked(&ranges[0], size), Some((0, first - 1)), "{ranges:?}");
    let step = (size - first) / 7;
    let began = starts(&env, "/far.bin");
    for k in 0..7 {
        assert!(began.contains(&(first + k * step)), "{ranges:?}");
    }
    // A fetcher that never splits does not for a far server either.
    let other = bytes(SIZE, 46);
    let late = PartsFault::LateFirstHead(Duration::from_millis(300));
    env.origin.route("/far2.bin", faulty(&other, late));
    let r = resource("far2", &env.url("origin.test", "/far2.bin"), &[], &other);
    let never = Fetcher::new(&cfg).unwrap().with_split_below(0);
    let path = download(&never, &store, &r, no_retry(), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), other);
    assert_eq!(starts(&env, "/far2.bin"), vec![0, size / 8]);
}

#[tokio::test]
async fn ranges_without_a_validator_get_one_stream_of_the_whole_file() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 44);
    env.origin
        .route("/n.bin", faulty(&body, PartsFault::NoValidator));
    let r = resource("n", &env.url("origin.test", "/n.bin"), &[], &body);
    let path = fetch_with(&env, &r, no_retry()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    // The first share was answered, but with nothing to hold parts to one
    // file: the whole file once more, without a range.
    assert_eq!(
        env.origin.ranges("/n.bin"),
        vec![format!("bytes=0-{}", SIZE / 8 - 1)]
    );
}

#[tokio::test]
async fn a_server_that_ignores_range_gets_one_stream() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 32);
    env.origin.route(
        "/i.bin",
        Behaviour::Ranged {
            body: body.clone(),
            etag: "\"v1\"".into(),
            ignore_range: true,
            cut_at: None,
            hold: false,
            pace: None,
        },
    );
    let r = resource("i", &env.url("origin.test", "/i.bin"), &[], &body);
    let path = fetch_with(&env, &r, no_retry()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert_eq!(env.origin.hits("/i.bin"), 1, "one request, one stream");
    assert_eq!(env.origin.served("/i.bin"), SIZE as u64);
}

#[tokio::test]
async fn a_validator_that_changes_mid_way_falls_back_to_one_stream() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 33);
    env.origin
        .route("/v.bin", faulty(&body, PartsFault::EtagChangesAt(1)));
    let r = resource("v", &env.url("origin.test", "/v.bin"), &[], &body);
    let (result, logs) = fetch_logged(&env, &r).await;
    let path = result.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(logs.contains("fetching as one stream"), "{logs}");
    // The last request is one stream: the whole file, or the prefix kept
    // continued only if the file is still the one it came from.
    let headers = env.origin.last_headers("/v.bin").unwrap();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    assert!(
        header("range").is_none_or(|r| r.ends_with('-') && header("if-range") == Some("\"p1\"")),
        "{headers:?}"
    );
}

#[tokio::test]
async fn a_part_with_a_wrong_content_range_is_refused() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 34);
    env.origin
        .route("/w.bin", faulty(&body, PartsFault::WrongContentRange));
    let r = resource("w", &env.url("origin.test", "/w.bin"), &[], &body);
    let (result, logs) = fetch_logged(&env, &r).await;
    let path = result.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(logs.contains("refused a part"), "{logs}");
}

#[tokio::test]
async fn a_source_that_corrupts_one_byte_is_named_and_the_good_one_is_used() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 35);
    env.origin.route(
        "/bad.bin",
        faulty(&body, PartsFault::Corrupt(SIZE / 2 + 12345)),
    );
    env.origin
        .route("/good.bin", faulty(&body, PartsFault::None));
    let bad = env.url("origin.test", "/bad.bin");
    let alone = resource("c", &bad, &[], &body);
    match fetch_with(&env, &alone, no_retry()).await {
        Err(Error::Unavailable { attempts, .. }) => {
            assert_eq!(attempts.len(), 1);
            assert_eq!(attempts[0].address, bad);
            assert_eq!(
                attempts[0].error.code(),
                ErrorCode::Sha256,
                "{}",
                attempts[0]
            );
        }
        other => panic!("expected the bad source to fail: {other:?}"),
    }
    assert!(
        stored_files(&env, &body).is_empty(),
        "nothing wrong is published"
    );
    let good = env.url("mirror.test", "/good.bin");
    let r = resource("c", &bad, &[good], &body);
    let (result, logs) = fetch_logged(&env, &r).await;
    assert_eq!(std::fs::read(result.unwrap()).unwrap(), body);
    assert!(
        logs.contains(&format!("E_RESOURCE_SHA256: {bad}")),
        "{logs}"
    );
}

#[tokio::test]
async fn a_part_redirected_to_a_local_address_is_refused_before_it_connects() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 36);
    // A listener on another loopback address (not exempt in the test
    // configuration), counting the connections that reach it.
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let leak = format!(
        "https://127.0.0.2:{}/leak",
        listener.local_addr().unwrap().port()
    );
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counting = reached.clone();
    let accepting = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(socket);
        }
    });
    env.origin.route(
        "/r.bin",
        Behaviour::Sequence(vec![
            faulty(&body, PartsFault::None),
            Behaviour::Redirect {
                status: 302,
                location: leak,
            },
            faulty(&body, PartsFault::None),
        ]),
    );
    let r = resource("r", &env.url("origin.test", "/r.bin"), &[], &body);
    let err = fetch_with(&env, &r, no_retry()).await.unwrap_err();
    assert_eq!(err.primary_cause(), ErrorCode::Address, "{err}");
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing reached the local address"
    );
    accepting.abort();
    assert!(stored_files(&env, &body).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bandwidth_cap_holds_over_all_parts() {
    let env = Env::new().await;
    // 4 MB/s for all parts together: at least 2 s for 12 MiB after the
    // one second of burst.
    config(&env, "max_bytes_per_sec = 4000000");
    let body = bytes(SIZE, 37);
    env.origin.route("/b.bin", faulty(&body, PartsFault::None));
    let r = resource("b", &env.url("origin.test", "/b.bin"), &[], &body);
    let started = Instant::now();
    let path = fetch_with(&env, &r, no_retry()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(
        starts(&env, "/b.bin").len() >= 4,
        "{:?}",
        env.origin.ranges("/b.bin")
    );
    let floor = (SIZE as f64 - 4e6) / 4e6;
    assert!(
        took.as_secs_f64() >= floor * 0.9,
        "took {took:?}, floor {floor}s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_stops_every_part_within_a_second() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 38);
    // 16 KiB every 50 ms per connection: a minute for the whole file.
    env.origin.route(
        "/s.bin",
        Behaviour::parts(&body, "\"p1\"", 16 << 10, Duration::from_millis(50)),
    );
    let cfg = env.config();
    let fetcher = Fetcher::new(&cfg).unwrap();
    let store = Store::open(&cfg.store_dir()).unwrap();
    let r = resource("s", &env.url("origin.test", "/s.bin"), &[], &body);
    let task = {
        let (fetcher, store, r) = (fetcher.clone(), store.clone(), r.clone());
        tokio::spawn(async move { download(&fetcher, &store, &r, no_retry(), &mut |_| {}).await })
    };
    wait_until("several parts run", || starts(&env, "/s.bin").len() >= 4).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let changed = Instant::now();
    let hosts = vec!["origin.test".to_string()];
    fetcher.set_policy(Policy::new(Mode::Blocklist, &hosts).unwrap());
    let err = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the download stops")
        .unwrap()
        .unwrap_err();
    assert!(
        changed.elapsed() < Duration::from_secs(2),
        "{:?}",
        changed.elapsed()
    );
    assert_eq!(err.primary_cause(), ErrorCode::Policy, "{err}");
    // Every connection is closed: nothing more is sent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let served = env.origin.served("/s.bin");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(env.origin.served("/s.bin"), served, "a part still receives");
    assert!((served as usize) < SIZE / 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_the_address_the_parts_dialled_stops_every_part() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(SIZE, 39);
    // 16 KiB every 50 ms per connection: a minute for the whole file.
    env.origin.route(
        "/d.bin",
        Behaviour::parts(&body, "\"p1\"", 16 << 10, Duration::from_millis(50)),
    );
    let cfg = env.config();
    let fetcher = Fetcher::new(&cfg).unwrap();
    let store = Store::open(&cfg.store_dir()).unwrap();
    // By name: origin.test resolves to 127.0.0.1 through `[dev] resolve`.
    let r = resource("d", &env.url("origin.test", "/d.bin"), &[], &body);
    let task = {
        let (fetcher, store, r) = (fetcher.clone(), store.clone(), r.clone());
        tokio::spawn(async move { download(&fetcher, &store, &r, no_retry(), &mut |_| {}).await })
    };
    wait_until("several parts run", || starts(&env, "/d.bin").len() >= 4).await;
    let hosts = vec!["127.0.0.1".to_string()];
    fetcher.set_policy(Policy::new(Mode::Blocklist, &hosts).unwrap());
    let err = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the download stops")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.primary_cause(), ErrorCode::Policy, "{err}");
    // Every connection is closed: nothing more is sent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let served = env.origin.served("/d.bin");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(env.origin.served("/d.bin"), served, "a part still receives");
    assert!((served as usize) < SIZE / 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_over_mirrors_takes_parts_from_the_url_and_the_mirror_at_once() {
    let env = Env::new().await;
    config(&env, "spread_over_mirrors = true");
    let body = bytes(SIZE, 40);
    env.origin.route("/u.bin", paced(&body));
    env.origin.route("/m.bin", paced(&body));
    let url = env.url("origin.test", "/u.bin");
    let mirror = env.url("mirror.test", "/m.bin");
    let r = resource("sp", &url, &[mirror], &body);
    let path = fetch_with(&env, &r, no_retry()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(
        starts(&env, "/u.bin").len() >= 3,
        "{:?}",
        env.origin.ranges("/u.bin")
    );
    assert!(
        starts(&env, "/m.bin").len() >= 3,
        "{:?}",
        env.origin.ranges("/m.bin")
    );
}

#[tokio::test]
async fn spread_over_mirrors_with_a_bad_source_refetches_one_source_at_a_time() {
    let env = Env::new().await;
    config(&env, "spread_over_mirrors = true");
    let body = bytes(SIZE, 41);
    // The parts asked of the mirror include the one holding this byte.
    let bad_byte = (SIZE / 8) + 1000;
    env.origin.route("/g.bin", faulty(&body, PartsFault::None));
    env.origin
        .route("/b.bin", faulty(&body, PartsFault::Corrupt(bad_byte)));
    let good = env.url("origin.test", "/g.bin");
    let bad = env.url("mirror.test", "/b.bin");
    // The bad source as a mirror: the url alone then gives the file.
    let r = resource("sb", &good, std::slice::from_ref(&bad), &body);
    let (result, logs) = fetch_logged(&env, &r).await;
    assert_eq!(std::fs::read(result.unwrap()).unwrap(), body);
    assert!(
        logs.contains("fetching from one source at a time"),
        "{logs}"
    );
    assert!(stored_files(&env, &body).len() == 1);
    // The bad source as the url (a byte of the first part, which the url
    // sends): it is named, and the mirror gives the file.
    let env = Env::new().await;
    config(&env, "spread_over_mirrors = true");
    env.origin.route("/g.bin", faulty(&body, PartsFault::None));
    env.origin
        .route("/b.bin", faulty(&body, PartsFault::Corrupt(1000)));
    let bad = env.url("origin.test", "/b.bin");
    let good = env.url("mirror.test", "/g.bin");
    let r = resource("sb", &bad, &[good], &body);
    let (result, logs) = fetch_logged(&env, &r).await;
    assert_eq!(std::fs::read(result.unwrap()).unwrap(), body);
    assert!(
        logs.contains(&format!("E_RESOURCE_SHA256: {bad}")),
        "{logs}"
    );
}

/// 16 MiB, one slow connection (the first, 32 KiB/s) among fast ones
/// (64 KiB every 16 ms, about 4 MB/s each).
fn one_slow_connection(body: &[u8]) -> Behaviour {
    let slow = PartsFault::SlowFirst(4 << 10, Duration::from_millis(125));
    Behaviour::Parts {
        body: std::sync::Arc::new(body.to_vec()),
        etag: "\"p1\"".into(),
        pace: (64 << 10, Duration::from_millis(16)),
        fault: slow,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_connection_does_not_set_the_finishing_time() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(16 << 20, 36);
    env.origin.route("/s.bin", one_slow_connection(&body));
    let r = resource("s", &env.url("origin.test", "/s.bin"), &[], &body);
    let started = Instant::now();
    let path = fetch_with(&env, &r, no_retry()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(std::fs::read(path).unwrap(), body);
    // The slow connection alone would need a range of at least 1 MiB
    // (the least stealing left it): 32 s. The fast ones, the whole file,
    // about 0.5 s.
    assert!(took < Duration::from_secs(8), "took {took:?}");
    let served = env.origin.served("/s.bin");
    assert!(
        served * 4 <= body.len() as u64 * 5,
        "the origin sent {served} bytes for {}: {:?}",
        body.len(),
        env.origin.ranges("/s.bin")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_range_a_hedge_finished_is_not_waited_for() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(16 << 20, 38);
    // The first connection sends a piece, then nothing for 15 s: its range
    // is hedged and finished by another connection long before its next
    // piece would come.
    env.origin.route(
        "/h.bin",
        Behaviour::Parts {
            body: std::sync::Arc::new(body.clone()),
            etag: "\"p2\"".into(),
            pace: (64 << 10, Duration::from_millis(16)),
            fault: PartsFault::SlowFirst(16 << 10, Duration::from_secs(15)),
        },
    );
    let r = resource("h", &env.url("origin.test", "/h.bin"), &[], &body);
    let started = Instant::now();
    let path = fetch_with(&env, &r, no_retry()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(std::fs::read(path).unwrap(), body);
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_that_is_slow_too_is_hedged_again() {
    let env = Env::new().await;
    config(&env, "");
    let body = bytes(16 << 20, 35);
    // The first connection (from byte 0) and the first hedge of its range
    // run at 16 KiB/s, the others at 4 MiB/s. The first connection's range
    // keeps at least 256 KiB after every split, so byte 200 KiB stays in
    // it, and a hedge asks for the rest of it: that byte is in the hedge.
    let at = 200 << 10;
    env.origin.route(
        "/h.bin",
        Behaviour::Parts {
            body: std::sync::Arc::new(body.clone()),
            etag: "\"p1\"".into(),
            pace: (64 << 10, Duration::from_millis(16)),
            fault: PartsFault::SlowCovering {
                at,
                count: 2,
                piece: 2 << 10,
                pause: Duration::from_millis(125),
            },
        },
    );
    let r = resource("h", &env.url("origin.test", "/h.bin"), &[], &body);
    let started = Instant::now();
    let path = fetch_with(&env, &r, no_retry()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(std::fs::read(path).unwrap(), body);
    // Three requests brought that byte: the first, its slow hedge, and the
    // hedge of the hedge.
    let ranges = env.origin.ranges("/h.bin");
    let covering = ranges
        .iter()
        .filter_map(|r| {
            let (s, e) = r.strip_prefix("bytes=")?.split_once('-')?;
            let s: usize = s.parse().ok()?;
            let e: usize = e.parse().unwrap_or(usize::MAX);
            (s <= at && at <= e).then_some(r)
        })
        .count();
    assert!(covering >= 3, "{covering} requests covered it: {ranges:?}");
    // The two slow connections alone would need at least 256 KiB at
    // 16 KiB/s: 16 s.
    assert!(took < Duration::from_secs(8), "took {took:?}");
    let served = env.origin.served("/h.bin");
    assert!(
        served * 4 <= body.len() as u64 * 5,
        "the origin sent {served} bytes for {}: {ranges:?}",
        body.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_connections_per_file_open_sixteen_on_sixteen_mib() {
    let env = Env::new().await;
    env.write_config_full(
        "connections_per_file = 16",
        "[service]\nmax_per_host = 16\n",
    );
    let body = bytes(16 << 20, 37);
    env.origin.route("/c.bin", paced(&body));
    let r = resource("c", &env.url("origin.test", "/c.bin"), &[], &body);
    let path = fetch_with(&env, &r, no_retry()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), body);
    let starts = starts(&env, "/c.bin");
    assert!(
        starts.len() >= 16,
        "ranges asked for: {:?}",
        env.origin.ranges("/c.bin")
    );
}
