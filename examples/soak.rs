//! The chaos soak of `gem-resources serve` (see `scripts/soak.sh`, which
//! builds this and the release binary and runs it).
//!
//! ```text
//! soak --bin PATH --dir DIR [--minutes M] [--seed N] [--disk DIR] [--quiet]
//! ```
//!
//! Exits 1 when an invariant was violated; the summary says which, with the
//! seed and the events around the first one.

// The soak kills and signals processes the Unix way (`kill -9`, SIGHUP).
#[cfg(unix)]
#[path = "../tests/support/origin.rs"]
mod origin;
#[cfg(unix)]
#[path = "../tests/support/soak/mod.rs"]
mod soak;

#[cfg(unix)]
use std::path::PathBuf;
use std::process::ExitCode;

#[cfg(not(unix))]
fn main() -> ExitCode {
    eprintln!("the soak runs on Unix only (it uses kill -9 and SIGHUP)");
    ExitCode::from(2)
}

#[cfg(unix)]
fn main() -> ExitCode {
    let mut settings = soak::Settings {
        bin: PathBuf::from("target/release/gem-resources"),
        dir: PathBuf::new(),
        seed: seed_from_clock(),
        chaos_secs: 600.0,
        settle_secs: 120.0,
        resources: 36,
        max_size: 4 << 20,
        restart_mean_secs: 150.0,
        disk: None,
        verbose: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_default();
        match arg.as_str() {
            "--bin" => settings.bin = PathBuf::from(value()),
            "--dir" => settings.dir = PathBuf::from(value()),
            "--disk" => settings.disk = Some(PathBuf::from(value())),
            "--quiet" => settings.verbose = false,
            "--minutes" => match value().parse::<f64>() {
                Ok(m) if m > 0.0 => settings.chaos_secs = m * 60.0,
                _ => return usage("--minutes takes a positive number"),
            },
            "--seed" => match value().parse::<u64>() {
                Ok(s) => settings.seed = s,
                Err(_) => return usage("--seed takes a number"),
            },
            other => return usage(&format!("unknown argument {other}")),
        }
    }
    if settings.dir.as_os_str().is_empty() {
        return usage("--dir is required");
    }
    println!(
        "soak: seed {} (replay with --seed {})",
        settings.seed, settings.seed
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return usage(&format!("no runtime: {e}")),
    };
    let summary = runtime.block_on(soak::run(settings));
    println!("{}", summary.text);
    if summary.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(unix)]
fn seed_from_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

#[cfg(unix)]
fn usage(why: &str) -> ExitCode {
    eprintln!("soak: {why}\nusage: soak --bin PATH --dir DIR [--minutes M] [--seed N] [--disk DIR] [--quiet]");
    ExitCode::from(2)
}
