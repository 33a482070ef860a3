//! Lanes: the downloads of one file that may run at once, and what each
//! says about itself to the others.
//!
//! A file is the SHA-256 *and* the size a manifest declares. Its downloads
//! are serialised per lane, each lane a lock named by the whole SHA-256, the
//! size and the lane's number (`<sha256>.<size>` for lane 0,
//! `<sha256>.<size>.<n>` for the others), with a partial file of the same
//! name in `tmp/`. Two declarations of the same SHA-256 with different
//! sizes never share a lock or a partial file; neither do two hashes that
//! share a prefix.
//!
//! The first download of a file takes lane 0, and a download of the same
//! file from the same addresses waits for it (it would fetch the same
//! bytes from the same servers), as does another download for the same
//! gem. A download from other addresses (another
//! gem's manifest) waits for it only so long
//! (`network.wait_for_others_secs`): then it takes a free lane and fetches
//! from its own addresses, and the first copy verified is published, the
//! other download stopping once it sees the file in place. So one gem's
//! addresses never decide another gem's download.
//!
//! The holder of a lane describes itself beside its lock (`Holder`): the
//! gem it downloads for, its addresses, when it began and what it held
//! then. Waiters name the gem they depend on from it, and the free-space
//! check counts a download's reservation from it (`counted`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::data::ReservedBy;
use crate::store::lockfile::KeyLock;

/// Lanes per file: lane 0 and the ones downloads from other addresses race
/// in. A gem holds at most one lane of a file (its other downloads of it
/// wait for that one), so it takes this many gems declaring one file to
/// fill them.
pub(crate) const LANES: u32 = 16;

/// How long a download's whole declared size is reserved before its rate
/// decides, and how long a download waits for another gem's download of
/// the same file, unless configured (`network.wait_for_others_secs`).
pub const DEFAULT_WAIT_FOR_OTHERS: Duration = Duration::from_secs(30);

/// How far ahead a download's rate reserves disk space: a download counts
/// at most what it would write in this time at the rate it has kept since
/// it began.
pub const RESERVATION_HORIZON: Duration = Duration::from_secs(3600);

/// Longest description read back.
pub(crate) const MAX_HOLDER_BYTES: u64 = 64 * 1024;

/// The lock (and partial file) name of `lane` of the file `sha256`, `size`.
pub(crate) fn lane_key(sha256: &str, size: u64, lane: u32) -> String {
    if lane == 0 {
        format!("{sha256}.{size}")
    } else {
        format!("{sha256}.{size}.{lane}")
    }
}

/// What the holder of a lane says about its download.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holder {
    /// The gem it downloads for (`None`: a download by hand, `fetch`).
    pub gem: Option<String>,
    /// Its addresses: the url, then the mirrors, as declared.
    pub addresses: Vec<String>,
    /// When its transfer began, in milliseconds since the Unix epoch.
    pub since_ms: u64,
    /// The bytes its partial file held then.
    pub from: u64,
    /// The process downloading (absent from a description written by an
    /// earlier version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

impl Holder {
    pub(crate) fn new(gem: Option<&str>, addresses: &[String], from: u64) -> Holder {
        let since_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Holder {
            gem: gem.map(str::to_string),
            addresses: addresses.to_vec(),
            since_ms,
            from,
            pid: Some(std::process::id()),
        }
    }

    /// Who this download is, as a disk-space error names it.
    pub(crate) fn reserved_by(self) -> ReservedBy {
        match self.gem {
            Some(gem) => ReservedBy::Gem { gem, pid: self.pid },
            None => ReservedBy::Fetch { pid: self.pid },
        }
    }

    /// Reads a description back: `None` for anything malformed.
    pub(crate) fn parse(bytes: &[u8]) -> Option<Holder> {
        serde_json::from_slice(bytes).ok()
    }

    /// How long ago its transfer began.
    pub(crate) fn age(&self) -> Duration {
        let since = UNIX_EPOCH + Duration::from_millis(self.since_ms);
        SystemTime::now().duration_since(since).unwrap_or_default()
    }
}

/// A held lane of one file; released when dropped.
#[derive(Debug)]
pub struct LaneLock {
    pub(crate) lock: KeyLock,
    /// The lane's number.
    pub(crate) lane: u32,
}

impl LaneLock {
    /// Tells others what this download is (see [`Holder`]).
    pub(crate) fn describe(&self, holder: &Holder) {
        if let Ok(bytes) = serde_json::to_vec(holder) {
            self.lock.describe(&bytes);
        }
    }
}

/// The bytes a download in progress counts against the free space of
/// others: what it still has to write (`remaining`) while it is younger
/// than `grace` or when nothing is known of it; after that, at most what
/// it would write in [`RESERVATION_HORIZON`] at the rate it has kept since
/// it began (`held` now, against what it held then). A download that
/// drips holds almost nothing, however large its declared size.
pub(crate) fn counted(remaining: u64, held: u64, holder: Option<&Holder>, grace: Duration) -> u64 {
    let Some(holder) = holder else {
        return remaining;
    };
    let age = holder.age();
    if age < grace {
        return remaining;
    }
    let delivered = held.saturating_sub(holder.from) as f64;
    let ahead = delivered * RESERVATION_HORIZON.as_secs_f64() / age.as_secs_f64().max(1.0);
    remaining.min(ahead.min(u64::MAX as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aged(secs: u64, from: u64) -> Holder {
        let mut h = Holder::new(Some("g"), &[], from);
        h.since_ms -= secs * 1000;
        h
    }

    #[test]
    fn a_reservation_follows_the_rate_once_the_grace_is_over() {
        let grace = Duration::from_secs(30);
        // Young, or unknown: everything still to write.
        assert_eq!(counted(1 << 40, 0, Some(&aged(5, 0)), grace), 1 << 40);
        assert_eq!(counted(1 << 40, 0, None, grace), 1 << 40);
        // 60 KB in 60 s: 1 KB/s, an hour ahead is 3.6 MB.
        let slow = counted(1 << 40, 160_000, Some(&aged(60, 100_000)), grace);
        assert!((3_590_000..=3_600_000).contains(&slow), "{slow}");
        // Fast enough to finish within the hour: all that is left.
        assert_eq!(counted(1000, 1 << 30, Some(&aged(60, 0)), grace), 1000);
        // Nothing delivered since it began: nothing reserved.
        assert_eq!(counted(1 << 40, 5, Some(&aged(120, 5)), grace), 0);
    }

    #[test]
    fn lane_keys_are_the_whole_hash_the_size_and_the_lane() {
        let sha = "a".repeat(64);
        assert_eq!(lane_key(&sha, 10, 0), format!("{sha}.10"));
        assert_eq!(lane_key(&sha, 10, 2), format!("{sha}.10.2"));
        let holder = Holder::new(Some("g"), &["https://a.test/x".into()], 7);
        let bytes = serde_json::to_vec(&holder).unwrap();
        assert_eq!(Holder::parse(&bytes), Some(holder));
        assert_eq!(Holder::parse(b"{"), None);
        // A description without a process id (an earlier version's) is
        // read all the same.
        let old = br#"{"gem":null,"addresses":[],"since_ms":1,"from":0}"#;
        let old = Holder::parse(old).unwrap();
        assert_eq!(old.pid, None);
        assert_eq!(old.reserved_by(), ReservedBy::Fetch { pid: None });
    }
}
