//! The invariants the soak checks on the store, and the figures it samples
//! from `/proc`.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Every file under `dir`, recursively (nothing when it does not exist).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(_) => out.push(p),
                Err(_) => {}
            }
        }
    }
    out.sort();
    out
}

/// Checks the verified files of a store, hashing each file once.
#[derive(Default)]
pub struct Blobs {
    /// (path, inode, size, mtime) of files already found good.
    good: BTreeSet<(PathBuf, u64, u64, i64)>,
    /// Files already reported bad (each is reported once).
    bad: BTreeSet<(PathBuf, u64, u64, i64)>,
}

impl Blobs {
    /// How many distinct verified files were seen (a file downloaded again
    /// after a deletion counts again).
    pub fn verified(&self) -> usize {
        self.good.len()
    }

    /// Checks every file under `<root>/blobs`: its folder names a SHA-256 of
    /// `sizes`, the file has that size and digest, and is read-only. Returns
    /// one line per violation, and the SHA-256s present.
    pub fn check(
        &mut self,
        root: &Path,
        sizes: &BTreeMap<String, u64>,
    ) -> (Vec<String>, BTreeSet<String>) {
        let mut bad = Vec::new();
        let mut present = BTreeSet::new();
        for path in files_under(&root.join("blobs")) {
            let Some(sha) = path
                .parent()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
            else {
                continue;
            };
            // Gone since the listing (deleted by an uninstall): fine.
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let key = (path.clone(), meta.ino(), meta.len(), meta.mtime());
            if self.good.contains(&key) {
                present.insert(sha);
                continue;
            }
            if self.bad.contains(&key) {
                continue;
            }
            match check_file(&path, &meta, &sha, sizes) {
                Ok(()) => {
                    self.good.insert(key);
                    present.insert(sha);
                }
                Err(why) => {
                    self.bad.insert(key);
                    bad.push(format!("{}: {why}", path.display()))
                }
            }
        }
        (bad, present)
    }
}

fn check_file(
    path: &Path,
    meta: &std::fs::Metadata,
    sha: &str,
    sizes: &BTreeMap<String, u64>,
) -> Result<(), String> {
    let Some(&size) = sizes.get(sha) else {
        return Err("a SHA-256 no resource declares".into());
    };
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    if meta.permissions().mode() & 0o222 != 0 {
        return Err(format!("writable (mode {:o})", meta.permissions().mode()));
    }
    if meta.len() != size {
        return Err(format!("{} bytes, declared {size}", meta.len()));
    }
    match std::fs::read(path) {
        Ok(bytes) if hex::encode(Sha256::digest(&bytes)) == sha => Ok(()),
        Ok(_) => Err("wrong SHA-256".into()),
        // Removed between the metadata and the read (an uninstall).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("unreadable: {e}")),
    }
}

/// Number of files and bytes under `dir`.
pub fn usage(dir: &Path) -> (usize, u64) {
    let files = files_under(dir);
    let bytes = files
        .iter()
        .filter_map(|p| std::fs::symlink_metadata(p).ok())
        .map(|m| m.len())
        .sum();
    (files.len(), bytes)
}

/// SHA-256s of the kept partial files in `<root>/tmp` with a record naming
/// flushed bytes.
pub fn kept_partials(root: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for path in files_under(&root.join("tmp")) {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !name.ends_with(".partial.json") {
            continue;
        }
        let sha = name.split('.').next().unwrap_or_default().to_string();
        let durable = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v.get("durable").and_then(|d| d.as_u64()))
            .unwrap_or(0);
        if durable > 0 {
            out.push((sha, durable));
        }
    }
    out
}

/// SHA-256s of every `.partial` file in `<root>/tmp`.
pub fn partial_shas(root: &Path) -> BTreeSet<String> {
    files_under(&root.join("tmp"))
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".partial"))
        .filter_map(|n| n.split('.').next().map(str::to_string))
        .collect()
}

/// One look at a process in `/proc`.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Seconds since the soak started.
    pub at: f64,
    /// Which start of `serve` this is (0 for the first).
    pub incarnation: usize,
    /// Resident set size, KiB.
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// Threads.
    pub threads: u64,
}

/// Samples `pid`; `None` once it is gone.
pub fn sample(pid: u32, at: f64, incarnation: usize) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Sample {
        at,
        incarnation,
        rss_kib: field("VmRSS:"),
        fds,
        threads: field("Threads:"),
    })
}

/// A figure of a sample, its name, and the growth allowed: a percentage
/// and an absolute amount.
type Margin = (&'static str, fn(&Sample) -> u64, u64, u64);

/// Looks for an upward trend in each long-lived start of `serve`: after a
/// warm-up of `warmup` seconds, the peak of the second half may not exceed
/// the peak of the first by more than a margin (RSS 50 % + 32 MiB, 24 file
/// descriptors, 24 threads). Starts shorter than `min_span` seconds are
/// not judged.
pub fn trends(samples: &[Sample], warmup: f64, min_span: f64) -> Vec<String> {
    let mut out = Vec::new();
    let incarnations: BTreeSet<usize> = samples.iter().map(|s| s.incarnation).collect();
    for inc in incarnations {
        let run: Vec<&Sample> = samples.iter().filter(|s| s.incarnation == inc).collect();
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            continue;
        };
        let start = first.at + warmup;
        let judged: Vec<&&Sample> = run.iter().filter(|s| s.at >= start).collect();
        if last.at - start < min_span || judged.len() < 8 {
            continue;
        }
        let (a, b) = judged.split_at(judged.len() / 2);
        let peak =
            |half: &[&&Sample], f: fn(&Sample) -> u64| half.iter().map(|s| f(s)).max().unwrap_or(0);
        let checks: [Margin; 3] = [
            ("RSS (KiB)", |s| s.rss_kib, 50, 32 << 10),
            ("file descriptors", |s| s.fds, 0, 24),
            ("threads", |s| s.threads, 0, 24),
        ];
        for (name, f, percent, extra) in checks {
            let (early, late) = (peak(a, f), peak(b, f));
            if late > early + early * percent / 100 + extra {
                out.push(format!(
                    "serve start {inc}: {name} grew from a peak of {early} to {late}"
                ));
            }
        }
    }
    out
}
