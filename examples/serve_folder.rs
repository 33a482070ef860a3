//! Serves a folder over HTTPS on 127.0.0.1 with a throwaway CA, to test a
//! manifest against real downloads in five minutes: it prints the `[dev]`
//! lines to put in a configuration file, and a manifest entry (url, size,
//! sha256) for every file, then serves until Ctrl-C.
//!
//! ```sh
//! cargo run --example serve_folder -- ./my-files
//! ```
//!
//! Every file is served as a CDN would: `Range` requests (`bytes=S-`,
//! `bytes=S-E` and `bytes=-N`, each answered `206` with exactly those
//! bytes), an `ETag` checked against `If-Range`, so resume and ranged parts
//! work too. Nothing listens beyond 127.0.0.1.

#[path = "../tests/support/origin.rs"]
mod origin;

use std::path::{Path, PathBuf};

use origin::{Behaviour, Origin};
use sha2::{Digest, Sha256};

/// The host name the files are served under.
const HOST: &str = "cdn.test";

type Outcome = Result<(), Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Outcome {
    let Some(folder) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: cargo run --example serve_folder -- FOLDER");
        std::process::exit(2);
    };
    let files = files_in(&folder)?;
    if files.is_empty() {
        eprintln!("no file in {}", folder.display());
        std::process::exit(1);
    }
    let origin = Origin::start().await;
    let scratch = tempfile::Builder::new().prefix("serve-folder-").tempdir()?;
    let ca = scratch.path().join("ca.pem");
    std::fs::write(&ca, origin.ca_pem())?;
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
        origin.route(
            &path,
            Behaviour::parts(&bytes, &etag, 256 << 10, std::time::Duration::ZERO),
        );
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
    let config = scratch.path().join("dev.toml");
    let manifest_file = scratch.path().join("notochord.json");
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
    println!(
        "# Serving {} file(s) on 127.0.0.1:{} until Ctrl-C.",
        files.len(),
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
