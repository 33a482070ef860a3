//! What the soak serves and installs: a catalog of generated resources, the
//! faults a route can have, and the gems of the gems folder.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::Behaviour;

/// A small seeded generator (SplitMix64): the same seed gives the same run.
#[derive(Clone, Debug)]
pub struct Rng(u64);

/// A soak's seed: the number in the environment variable `var` (to replay
/// a run), else one from the clock.
pub fn seed_from(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

impl Rng {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next() % n as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// A uniform pick from `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// One generated resource: its bytes and where they are served.
pub struct Res {
    /// Index in the catalog.
    pub idx: usize,
    /// The bytes.
    pub body: Vec<u8>,
    /// Lowercase hex SHA-256 of the bytes.
    pub sha256: String,
    /// Whether a second mirror (on other.test) is declared.
    pub second_mirror: bool,
}

impl Res {
    /// The url's path (on cdn.test).
    pub fn url_path(&self) -> String {
        format!("/r/{:02}.bin", self.idx)
    }

    /// The mirrors' paths: mirror.test, then other.test for some.
    pub fn mirror_paths(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![("mirror.test", format!("/m/{:02}.bin", self.idx))];
        if self.second_mirror {
            out.push(("other.test", format!("/n/{:02}.bin", self.idx)));
        }
        out
    }

    /// Every (host, path) this resource is served at.
    pub fn routes(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![("cdn.test", self.url_path())];
        out.extend(self.mirror_paths());
        out
    }

    /// The entity tag a well-behaved route sends (stable, so resumes match).
    pub fn etag(&self) -> String {
        format!("\"e{}\"", self.idx)
    }

    /// A well-behaved, resumable route.
    pub fn good(&self) -> Behaviour {
        Behaviour::ranged(&self.body, &self.etag())
    }
}

/// Builds `count` resources of mixed sizes (1 byte up to `max` bytes).
pub fn catalog(rng: &mut Rng, count: usize, max: usize) -> Vec<Res> {
    let sizes = [1, 100, 4096, 65_543, 300_001, max / 4, max / 2, max];
    (0..count)
        .map(|idx| {
            let len = (*rng.pick(&sizes)).max(1);
            let mut gen = Rng::new(rng.next());
            let mut body = Vec::with_capacity(len);
            while body.len() < len {
                body.extend_from_slice(&gen.next().to_le_bytes());
            }
            body.truncate(len);
            let sha256 = hex::encode(Sha256::digest(&body));
            Res {
                idx,
                body,
                sha256,
                second_mirror: rng.chance(0.5),
            }
        })
        .collect()
}

/// The kinds of route behaviour the soak switches between.
pub const FAULTS: &[&str] = &[
    "good",
    "reset-mid-body",
    "reset",
    "stall",
    "drip",
    "wrong-bytes",
    "short-body",
    "long-body",
    "5xx",
    "retry-after",
    "redirect",
    "redirect-refused",
    "redirect-http",
    "slow-steady",
    "ignores-range",
    "new-validator",
    "not-found",
];

/// The behaviour for `fault` of `res`; `refused` is the host:port of the
/// address no connection may reach, `port` the origin's, `nth` a counter
/// making validators new.
pub fn behaviour(
    fault: &str,
    res: &Res,
    rng: &mut Rng,
    refused: &str,
    port: u16,
    nth: u64,
) -> Behaviour {
    let len = res.body.len();
    let cut = if len > 1 { 1 + rng.below(len - 1) } else { 0 };
    match fault {
        "reset-mid-body" => Behaviour::ranged_cut(&res.body, &res.etag(), cut),
        "reset" => Behaviour::Reset {
            body: res.body.clone(),
            sent: cut,
        },
        "stall" => Behaviour::ranged_held(&res.body, &res.etag(), cut),
        "drip" => Behaviour::Drip {
            body: res.body.clone(),
            etag: res.etag(),
            per_try: 1 + rng.below(4096),
        },
        "wrong-bytes" => {
            let mut body = res.body.clone();
            let at = rng.below(len);
            body[at] ^= 0x5a;
            Behaviour::Body(body)
        }
        "short-body" => Behaviour::WrongLength {
            body: res.body[..cut].to_vec(),
            content_length: len as u64,
        },
        "long-body" => {
            let mut body = res.body.clone();
            body.extend_from_slice(b"and some more bytes");
            if rng.chance(0.5) {
                Behaviour::Body(body)
            } else {
                Behaviour::WrongLength {
                    body,
                    content_length: len as u64,
                }
            }
        }
        "5xx" => Behaviour::Status(*rng.pick(&[500, 502, 503, 504])),
        "retry-after" => Behaviour::RetryAfter {
            status: *rng.pick(&[429, 503]),
            value: rng.pick(&["1", "2", "0", "3600"]).to_string(),
        },
        "redirect" => {
            let (host, path) = res.mirror_paths()[0].clone();
            Behaviour::Redirect {
                status: *rng.pick(&[301, 302, 307, 308]),
                location: format!("https://{host}:{port}{path}"),
            }
        }
        "redirect-refused" => Behaviour::Redirect {
            status: 302,
            location: format!("https://{refused}/private.bin"),
        },
        "redirect-http" => Behaviour::Redirect {
            status: 302,
            location: format!("http://cdn.test:{port}{}", res.url_path()),
        },
        "slow-steady" => Behaviour::Slow {
            body: res.body.clone(),
            chunk: 8 << 10,
            delay: Duration::from_millis(20),
        },
        "ignores-range" => Behaviour::Ranged {
            body: res.body.clone(),
            etag: res.etag(),
            ignore_range: true,
            cut_at: Some(cut),
            hold: false,
            pace: None,
        },
        "new-validator" => {
            Behaviour::ranged_cut(&res.body, &format!("\"e{}-{nth}\"", res.idx), cut)
        }
        "not-found" => Behaviour::Status(404),
        _ => res.good(),
    }
}

/// One installed gem: (resource index, required) pairs.
pub type Gem = Vec<(usize, bool)>;

/// A random version of a gem: a few resources, most of them required.
pub fn random_gem(rng: &mut Rng, catalog_len: usize) -> Gem {
    let mut picked: BTreeMap<usize, bool> = BTreeMap::new();
    let want = 2 + rng.below(5);
    while picked.len() < want.min(catalog_len) {
        picked.insert(rng.below(catalog_len), rng.chance(0.7));
    }
    picked.into_iter().collect()
}

/// The manifest of `gem`.
pub fn manifest(gem: &Gem, catalog: &[Res], port: u16) -> String {
    let resources: Vec<serde_json::Value> = gem
        .iter()
        .map(|&(idx, required)| {
            let r = &catalog[idx];
            let mirrors: Vec<String> = r
                .mirror_paths()
                .iter()
                .map(|(host, path)| format!("https://{host}:{port}{path}"))
                .collect();
            serde_json::json!({
                "id": format!("r{idx:02}"),
                "url": format!("https://cdn.test:{port}{}", r.url_path()),
                "mirrors": mirrors,
                "sha256": r.sha256,
                "size": r.body.len(),
                "required": required,
            })
        })
        .collect();
    serde_json::json!({ "resources": resources }).to_string()
}

/// Writes `text` to `path` through a temporary file and a rename, so a
/// reader never sees half of it.
pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("soak-tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
