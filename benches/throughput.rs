//! Download throughput against what SHA-256 alone allows on one core.
//!
//! Serves a file from the in-process HTTPS origin over loopback and
//! downloads it with the real engine (TLS, streaming hash, size checks,
//! temporary file, fsync, rename), then hashes the same bytes in memory with
//! no I/O at all. The ratio says how close the engine gets to the hash's own
//! speed. Peak memory (VmHWM) is printed before and after the download to
//! show it does not grow with the file.
//!
//! `cargo bench --bench throughput` (size in MiB: `GEM_BENCH_MIB`, default 512).

#[path = "../tests/support/origin.rs"]
mod origin;

use std::time::{Duration, Instant};

use gem_resources::{download, parse_manifest, Config, Fetcher, RetryPolicy, Store};
use origin::{Behaviour, Origin};
use sha2::{Digest, Sha256};

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn mib_per_s(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mib: usize = std::env::var("GEM_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let len = mib << 20;
    let body: Vec<u8> = (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1])
        .collect();

    let start = Instant::now();
    let digest = hex::encode(Sha256::digest(&body));
    let hash_only = start.elapsed();
    println!(
        "sha256 in memory, one core: {:>8.1} MiB/s",
        mib_per_s(len, hash_only)
    );

    let origin = Origin::start().await;
    origin.route("/big.bin", Behaviour::Body(body));
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("ca.pem"), origin.ca_pem())?;
    std::fs::write(
        dir.path().join("config.toml"),
        "[dev]\nextra_root_certs = [\"ca.pem\"]\nresolve = { \"origin.test\" = [\"127.0.0.1\"] }\nallow_addresses = [\"127.0.0.1/32\"]\n",
    )?;
    let config = Config::load(&dir.path().join("config.toml"))?;
    let manifest = format!(
        r#"{{"resources":[{{"id":"big","url":"{}","sha256":"{digest}","size":{len}}}]}}"#,
        origin.url("origin.test", "/big.bin")
    );
    let resource = parse_manifest(manifest.as_bytes())?.resources.remove(0);
    let fetcher = Fetcher::new(&config)?;
    let store = Store::open(&dir.path().join("store"))?;
    let retry = RetryPolicy {
        retries: 0,
        backoff: Duration::ZERO,
        ..RetryPolicy::default()
    };

    let start = Instant::now();
    let filled = fetcher.autofill(&resource.url, len as u64).await?;
    assert_eq!(filled.sha256, digest);
    println!(
        "auto-fill (TLS + hash, no disk):       {:>8.1} MiB/s  ({:.0}% of hash-only)",
        mib_per_s(len, start.elapsed()),
        100.0 * hash_only.as_secs_f64() / start.elapsed().as_secs_f64()
    );

    let rss_before = peak_rss_kib();
    let start = Instant::now();
    let path = download(&fetcher, &store, &resource, retry, &mut |_| {}).await?;
    let engine = start.elapsed();
    let rss_after = peak_rss_kib();
    assert_eq!(std::fs::metadata(&path)?.len(), len as u64);
    println!(
        "download (TLS + hash + write + fsync): {:>8.1} MiB/s  ({:.0}% of hash-only)",
        mib_per_s(len, engine),
        100.0 * hash_only.as_secs_f64() / engine.as_secs_f64()
    );
    println!(
        "peak RSS: {} MiB before the download, {} MiB after ({} MiB body held by the origin)",
        rss_before >> 10,
        rss_after >> 10,
        mib
    );
    Ok(())
}
