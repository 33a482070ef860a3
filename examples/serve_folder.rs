//! Serves a folder over HTTPS on 127.0.0.1, to test a manifest against
//! real downloads in five minutes: it prints the `[dev]` lines to put in a
//! configuration file, and a manifest entry (url, size, sha256) for every
//! file, then serves until Ctrl-C, logging each answer (method, target,
//! range, status, bytes sent) on standard error.
//!
//! ```sh
//! cargo run --example serve_folder -- ./my-files [--port 8443] [--rate 512k]
//! ```
//!
//! - `--port N`: the port (default: any free one). With the same port, a
//!   restarted server is the same address, so "kill the origin and start
//!   it again" can be tried.
//! - `--rate R`: bytes per second per connection, as a capped CDN sends;
//!   read as the CLI's `--limit-rate` reads it (`k`, `M`, `G` in either
//!   case, powers of 1024: `512k`, `2m`); default no cap.
//!
//! Its certificate (self-signed, `CA:TRUE`) and key, the `[dev]` lines and
//! the manifest are kept in `FOLDER/.serve-folder/` and reused by the next
//! start: the configuration written once keeps working. Files and folders
//! whose names start with a dot are not served.
//!
//! Every file is served as a CDN would: `Range` requests (`bytes=S-`,
//! `bytes=S-E` and `bytes=-N`, each answered `206` with exactly those
//! bytes), an `ETag` checked against `If-Range`, so resume and ranged parts
//! work too. Nothing listens beyond 127.0.0.1.

#[path = "../tests/support/origin.rs"]
mod origin;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use origin::{Answered, Behaviour, Origin};
use sha2::{Digest, Sha256};

/// The host name the files are served under.
const HOST: &str = "cdn.test";

/// Where the server keeps what it reuses, inside the folder served.
const STATE: &str = ".serve-folder";

/// The piece a capped connection sends between two pauses.
const PIECE: usize = 16 * 1024;

type Outcome = Result<(), Box<dyn std::error::Error>>;

/// The command line: `FOLDER [--port N] [--rate R]`.
struct Args {
    folder: PathBuf,
    port: u16,
    /// Bytes per second per connection.
    rate: Option<u64>,
}

fn usage() -> ! {
    eprintln!("usage: cargo run --example serve_folder -- FOLDER [--port N] [--rate BYTES_PER_SEC (k, M, G)]");
    std::process::exit(2);
}

/// A usage error that says what was wrong first.
fn usage_because(why: &str) -> ! {
    eprintln!("{why}");
    usage()
}

fn parse_args() -> Args {
    let mut folder = None;
    let mut port = 0;
    let mut rate = None;
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--port") => {
                port = args
                    .next()
                    .and_then(|v| v.to_str()?.parse().ok())
                    .unwrap_or_else(|| usage());
            }
            Some("--rate") => {
                let given = args.next();
                let text = given.as_ref().and_then(|v| v.to_str()).unwrap_or("");
                // The CLI's own reading of `--limit-rate`.
                match gem_resources::config::parse_rate(text) {
                    Ok(r) => rate = Some(r),
                    Err(e) => usage_because(&format!("--rate: {e}")),
                }
            }
            Some(flag) if flag.starts_with("--") => usage(),
            _ if folder.is_none() => folder = Some(PathBuf::from(arg)),
            _ => usage(),
        }
    }
    Args {
        folder: folder.unwrap_or_else(|| usage()),
        port,
        rate,
    }
}

/// The certificate and key kept in `state`, made there on the first start.
fn certificate(state: &Path) -> std::io::Result<String> {
    let file = state.join("server.pem");
    match std::fs::read_to_string(&file) {
        Ok(pem) => Ok(pem),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let pem = origin::self_signed_pem();
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            std::io::Write::write_all(&mut options.open(&file)?, pem.as_bytes())?;
            Ok(pem)
        }
        Err(e) => Err(e),
    }
}

#[tokio::main]
async fn main() -> Outcome {
    let Args { folder, port, rate } = parse_args();
    // Named as the file system knows it (`p/../my-files` is `my-files`),
    // in every path printed and written.
    let folder = match std::fs::canonicalize(&folder) {
        Ok(folder) => folder,
        Err(e) => {
            eprintln!("cannot serve {}: {e}", folder.display());
            std::process::exit(1);
        }
    };
    let files = files_in(&folder)?;
    if files.is_empty() {
        eprintln!("no file in {}", folder.display());
        std::process::exit(1);
    }
    let state = folder.join(STATE);
    std::fs::create_dir_all(&state)?;
    let origin = match Origin::start_with_pem_at(&certificate(&state)?, port).await {
        Ok(origin) => origin,
        Err(e) => {
            eprintln!("cannot serve on 127.0.0.1:{port}: {e}");
            std::process::exit(1);
        }
    };
    origin.log_answers(Arc::new(|a: &Answered| {
        let range = a.range.unwrap_or("-");
        let cut = if a.sent < a.announced {
            " (cut short)"
        } else {
            ""
        };
        eprintln!(
            "{} {} range={range} {} sent {} of {} bytes{cut}",
            a.method, a.target, a.status, a.sent, a.announced
        );
    }));
    let ca = state.join("ca.pem");
    std::fs::write(&ca, origin.ca_pem())?;
    // A capped connection sends a piece, then waits for the rate.
    let (piece, pause) = match rate {
        Some(rate) => (PIECE, Duration::from_secs_f64(PIECE as f64 / rate as f64)),
        None => (256 << 10, Duration::ZERO),
    };
    let mut entries = Vec::new();
    for (index, file) in files.iter().enumerate() {
        let bytes = std::fs::read(file)?;
        let name = file
            .strip_prefix(&folder)?
            .to_string_lossy()
            .replace('\\', "/");
        let path = format!("/{name}");
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let etag = format!("\"{}\"", &sha256[..16]);
        let size = bytes.len();
        // Closed and suffix ranges too, as a CDN answers them: a resumed
        // download in parts asks for `bytes=S-E`.
        origin.route(&path, Behaviour::parts(&bytes, &etag, piece, pause));
        let id = name
            .rsplit('/')
            .next()
            .unwrap_or("file")
            .split('.')
            .next()
            .unwrap_or("file")
            .to_string();
        entries.push(serde_json::json!({
            "id": if id.is_empty() { format!("file-{index}") } else { id },
            "url": origin.url(HOST, &path),
            "size": size,
            "sha256": sha256,
        }));
    }
    let dev = format!(
        "[dev]\nextra_root_certs = [{:?}]\nresolve = {{ {HOST:?} = [\"127.0.0.1\"] }}\nallow_addresses = [\"127.0.0.1\"]\n",
        ca.display().to_string()
    );
    let manifest = serde_json::to_string_pretty(&serde_json::json!({ "resources": entries }))?;
    let config = state.join("dev.toml");
    let manifest_file = state.join("notochord.json");
    std::fs::write(&config, &dev)?;
    std::fs::write(&manifest_file, format!("{manifest}\n"))?;
    println!(
        "# The [dev] lines to trust this server (written to {}):",
        config.display()
    );
    println!("{dev}");
    println!(
        "# A manifest of these files (written to {}):",
        manifest_file.display()
    );
    println!("{manifest}");
    println!();
    println!("# Then, in another terminal:");
    println!(
        "#   gem-resources --config {} check {}",
        config.display(),
        manifest_file.display()
    );
    println!(
        "#   gem-resources --config {} fetch {}",
        config.display(),
        manifest_file.display()
    );
    let capped = rate.map_or(String::new(), |r| {
        let human = gem_resources::error::human_bytes(r);
        format!(", {human}/s ({r} bytes/s) per connection")
    });
    println!(
        "# Serving {} file(s) on 127.0.0.1:{}{capped} until Ctrl-C (start it again with --port {} to keep the address).",
        files.len(),
        origin.port(),
        origin.port()
    );
    tokio::signal::ctrl_c().await?;
    Ok(())
}

/// Every regular file under `folder`, sorted.
fn files_in(folder: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![folder.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            // `.serve-folder` and other hidden entries are not served.
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    Ok(out)
}
