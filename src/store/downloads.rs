//! The downloads in progress, seen through their locks and partial files:
//! the locks of a file's lanes, the listing of `locks/` and `tmp/`, the
//! preparation of a partial file against free space and what the other
//! downloads reserve, and the cleanup of what no download can use.

use super::*;

use crate::error::data::ReservedBy;

impl Store {
    /// Takes the lock of every download of `sha256` (every lane of every
    /// declared size), waiting for the downloads in progress, in any
    /// process, to end.
    pub async fn lock(&self, sha256: &str) -> Result<ShaLock> {
        check_sha256(sha256)?;
        lockfile::wait(|| self.try_lock_keys(sha256, None)).await
    }

    /// [`Store::lock`], with lane 0 of the file `sha256` declared with
    /// `size` among the locks, whether or not a download of it ever ran:
    /// for writing its partial file.
    pub async fn lock_with_size(&self, sha256: &str, size: u64) -> Result<ShaLock> {
        check_sha256(sha256)?;
        lockfile::wait(|| self.try_lock_keys(sha256, Some(size))).await
    }

    /// Takes the lock of every download of `sha256` (every lane of every
    /// declared size that has a partial file or a lock file) only if no
    /// download of it is in progress.
    pub fn try_lock(&self, sha256: &str) -> Result<Option<ShaLock>> {
        check_sha256(sha256)?;
        self.try_lock_keys(sha256, None)
    }

    fn try_lock_keys(&self, sha256: &str, size: Option<u64>) -> Result<Option<ShaLock>> {
        let mut keys: Vec<String> = partial_files(&self.folders.tmp)
            .filter(|e| e.sha256 == sha256)
            .map(|e| e.key())
            .collect();
        let prefix = format!("{sha256}.");
        for name in self.locks().names().unwrap_or_default() {
            let key = name
                .strip_suffix(".lock")
                .filter(|k| k.starts_with(&prefix) && partial::parse_key(k).is_some());
            keys.extend(key.map(str::to_string));
        }
        keys.extend(size.map(|size| lane_key(sha256, size, 0)));
        keys.sort();
        keys.dedup();
        let mut locks = Vec::new();
        for key in keys {
            match lockfile::try_lock_key(self.locks(), &key)? {
                Some(lock) => locks.push(lock),
                None => return Ok(None),
            }
        }
        Ok(Some(ShaLock { _locks: locks }))
    }

    /// Takes `lane` of the file `sha256` declared with `size` only if
    /// nobody holds it.
    pub fn try_lock_lane(&self, sha256: &str, size: u64, lane: u32) -> Result<Option<LaneLock>> {
        check_sha256(sha256)?;
        if lane != 0 {
            // Lane 0's lock file is there whenever another lane's is: a
            // look for downloads in progress starts (and with nothing
            // there, ends) at it.
            lockfile::make(self.locks(), &lane_key(sha256, size, 0))?;
        }
        let key = lane_key(sha256, size, lane);
        let taken = lockfile::try_lock_key(self.locks(), &key)?;
        if lane != 0 && taken.is_some() {
            // Made again when a cleanup removed it meanwhile (see
            // `prune_locks`): one open of a name that is there.
            lockfile::make(self.locks(), &lane_key(sha256, size, 0))?;
        }
        Ok(taken.map(|lock| LaneLock { lock, lane }))
    }

    /// The first free lane other than 0 of the file `sha256`, `size`,
    /// preferring one whose kept bytes came from one of `addresses` (they
    /// resume), then one with nothing kept.
    pub(crate) fn try_lock_other_lane(
        &self,
        sha256: &str,
        size: u64,
        addresses: &[String],
    ) -> Result<Option<LaneLock>> {
        let mut lanes: Vec<(u8, u32)> = (1..LANES)
            .map(|lane| {
                let kept = self.partial(sha256, size, lane).kept();
                let rank = match kept {
                    Some((meta, _)) if addresses.contains(&meta.address) => 0,
                    None => 1,
                    Some(_) => 2,
                };
                (rank, lane)
            })
            .collect();
        lanes.sort();
        for (_, lane) in lanes {
            if let Some(lock) = self.try_lock_lane(sha256, size, lane)? {
                return Ok(Some(lock));
            }
        }
        Ok(None)
    }

    /// Sorts the kept bytes ([`Store::sort_kept_listed`]), then prepares the held
    /// lane's partial file ([`Store::prepare`]), from one listing of
    /// `tmp/`: what a new download does before it fetches.
    pub(crate) fn sort_and_prepare(
        &self,
        held: &LaneLock,
        resource: &str,
        sha256: &str,
        size: u64,
        addresses: &[String],
        grace: std::time::Duration,
    ) -> Result<PartialPaths> {
        let listed: Vec<PartialEntry> = partial_files(&self.folders.tmp).collect();
        self.sort_kept_listed(&listed, held, sha256, size, addresses);
        // A partial file the sorting moved is counted under both names
        // below: never less than the truth, and only a store near full
        // reads the exact reservations.
        self.prepare_listed(&listed, resource, sha256, size, held.lane, grace)
    }

    /// Sorts the kept bytes of the file `sha256`, `size` before a download
    /// from `addresses` continues in the lane it holds (`held`): bytes there
    /// that came from none of `addresses` (another declaration's download)
    /// move to a free lane with nothing kept, so this download never starts
    /// over them; then, when its lane keeps nothing, bytes of its own kept
    /// in a free lane move into it, so it resumes them. Where no lane is
    /// free, everything stays. `listed`: the partial files in `tmp/`.
    fn sort_kept_listed(
        &self,
        listed: &[PartialEntry],
        held: &LaneLock,
        sha256: &str,
        size: u64,
        addresses: &[String],
    ) {
        let mine = self.partial(sha256, size, held.lane);
        // Lanes with a partial file of this file, from one listing of
        // `tmp/`: only they keep anything (the held lane's own included:
        // without a data file it keeps nothing, and no record is read).
        let mut kept_in: Vec<u32> = listed
            .iter()
            .filter(|e| e.sha256 == sha256 && e.size == size)
            .map(|e| e.lane)
            .collect();
        let mine_listed = kept_in.contains(&held.lane);
        kept_in.retain(|&lane| lane != held.lane);
        kept_in.sort_unstable();
        let others = (0..LANES).filter(|&lane| lane != held.lane);
        let from_here = |paths: &PartialPaths| {
            paths
                .kept()
                .map(|(meta, _)| addresses.contains(&meta.address))
        };
        if mine_listed && from_here(&mine) == Some(false) {
            for lane in others.clone() {
                let free = self.partial(sha256, size, lane);
                if free.kept().is_some() {
                    continue;
                }
                if let Ok(Some(_lock)) = self.try_lock_lane(sha256, size, lane) {
                    mine.move_to(&free);
                    break;
                }
            }
        }
        if mine_listed && mine.kept().is_some() {
            return;
        }
        for lane in kept_in {
            let theirs = self.partial(sha256, size, lane);
            if from_here(&theirs) != Some(true) {
                continue;
            }
            if let Ok(Some(_lock)) = self.try_lock_lane(sha256, size, lane) {
                theirs.move_to(&mine);
                return;
            }
        }
    }

    /// The downloads of the file `sha256`, `size` in progress now, in this
    /// process or another, lane 0 first.
    pub(crate) fn lanes_in_use(&self, sha256: &str, size: u64) -> Vec<LaneInUse> {
        // Another lane is only taken where lane 0's lock file is (see
        // `try_lock_lane`): without it, one look says no lane is in use.
        if !lockfile::exists(self.locks(), &lane_key(sha256, size, 0)) {
            return Vec::new();
        }
        (0..LANES)
            .filter_map(|lane| self.lane_in_use(sha256, size, lane))
            .collect()
    }

    /// [`Store::lanes_in_use`], from `listing` (see [`Store::listing`]).
    pub(crate) fn lanes_in_use_listed(
        &self,
        listing: &Listing,
        sha256: &str,
        size: u64,
    ) -> Vec<LaneInUse> {
        let lanes = match &listing.locked {
            Some(locked) => locked
                .get(&(sha256.to_string(), size))
                .cloned()
                .unwrap_or_default(),
            None => (0..LANES).collect(),
        };
        lanes
            .into_iter()
            .filter_map(|lane| self.lane_in_use(sha256, size, lane))
            .collect()
    }

    /// One listing of `locks/` and `tmp/`, for
    /// [`Store::lanes_in_use_listed`] and [`Store::kept_bytes_listed`] on
    /// many files. What changes after it is seen by the next one.
    pub(crate) fn listing(&self) -> Listing {
        let mut listing = self.lock_listing();
        self.list_partials(&mut listing);
        listing
    }

    /// Adds the partial files of `tmp/` to `listing`.
    fn list_partials(&self, listing: &mut Listing) {
        for entry in partial_files(&self.folders.tmp) {
            listing
                .partials
                .entry(entry.sha256.clone())
                .or_default()
                .push(entry);
        }
    }

    /// The lanes that may be held, by file, in order: those whose lock
    /// file exists, read from one listing of `locks/` rather than a lookup
    /// per lane.
    fn lock_listing(&self) -> Listing {
        let names = self.locks().names().ok();
        let locked = names.map(|names| {
            let mut locked = std::collections::BTreeMap::<(String, u64), Vec<u32>>::new();
            for (sha, size, lane) in names
                .iter()
                .filter_map(|name| partial::parse_key(name.strip_suffix(".lock")?))
            {
                locked
                    .entry((sha.to_string(), size))
                    .or_default()
                    .push(lane);
            }
            for lanes in locked.values_mut() {
                lanes.sort_unstable();
            }
            locked
        });
        Listing {
            locked,
            ..Listing::default()
        }
    }

    fn lane_in_use(&self, sha256: &str, size: u64, lane: u32) -> Option<LaneInUse> {
        let key = lane_key(sha256, size, lane);
        if !is_sha256(sha256) {
            return None;
        }
        let holder = lockfile::holder_of(self.locks(), &key, lanes::MAX_HOLDER_BYTES)?
            .and_then(|bytes| Holder::parse(&bytes));
        let held = self.partial(sha256, size, lane).held();
        Some(LaneInUse { holder, held })
    }

    /// `locks/`, held open.
    pub(super) fn locks(&self) -> &Arc<Folder> {
        &self.folders.locks
    }

    /// Prepares the partial file of `lane` of a download of `size` bytes
    /// for `sha256`: checks that the file system has room for what is still
    /// missing on top of what other downloads in progress count (see
    /// [`lanes::counted`]; `grace` is how long a new download counts its
    /// whole size). Partial files of other sizes and other lanes are left
    /// alone: they belong to other declarations and downloads. Touches no
    /// network.
    ///
    /// The caller holds the lane ([`Store::try_lock_lane`]).
    pub(crate) fn prepare(
        &self,
        resource: &str,
        sha256: &str,
        size: u64,
        lane: u32,
        grace: std::time::Duration,
    ) -> Result<PartialPaths> {
        let listed: Vec<PartialEntry> = partial_files(&self.folders.tmp).collect();
        self.prepare_listed(&listed, resource, sha256, size, lane, grace)
    }

    /// [`Store::prepare`], with the partial files `listed` in `tmp/`.
    fn prepare_listed(
        &self,
        listed: &[PartialEntry],
        resource: &str,
        sha256: &str,
        size: u64,
        lane: u32,
        grace: std::time::Duration,
    ) -> Result<PartialPaths> {
        check_sha256(sha256)?;
        let _serial = self.space.lock().unwrap_or_else(|p| p.into_inner());
        let paths = self.partial(sha256, size, lane);
        // A partial file the store did not make (a symbolic link, another
        // user's file) is dropped, never written through or published.
        // With no data file (a new download), nothing is kept and nothing
        // is reclaimed: known from this one look, without opening records
        // that do not exist.
        let (kept, reclaimed) = match paths.data_entry() {
            DataEntry::Missing => {
                // A new download: no record of it until one is written.
                paths.set_recorded(false);
                (0, 0)
            }
            DataEntry::Untrusted => {
                paths.remove();
                (0, 0)
            }
            DataEntry::Own => {
                let kept = paths.kept().map_or(0, |(_, n)| n);
                // What the file holds beyond its trusted prefix is cut
                // before the download writes: that space comes back.
                (kept, paths.untrusted_tail(kept))
            }
        };
        let needed = size - kept.min(size);
        let available = available_space_at(&self.folders.tmp)?.saturating_add(reclaimed);
        let own = lane_key(sha256, size, lane);
        // Each download in progress counts at most its declared size, which
        // its partial file's name tells: when even that much fits, whose
        // lanes are held and how fast they go need not be read.
        let at_most = listed
            .iter()
            .filter(|e| e.key() != own)
            .fold(0u64, |sum, e| sum.saturating_add(e.size));
        let reservations = if available >= needed.saturating_add(at_most) {
            Reservations::default()
        } else {
            self.reservations(&own, grace)
        };
        let reserved = reservations.total;
        if available < needed.saturating_add(reserved) {
            // A reservation stands in the way only when the file alone fits.
            let held_by = (needed <= available)
                .then_some(reservations.largest)
                .flatten();
            return Err(Error::DiskSpace {
                resource: resource.to_string(),
                needed,
                available,
                reserved,
                held_by,
                store: self.root.clone(),
            });
        }
        // The data file exists from now on, so other processes count the
        // bytes this download will still write against their free space.
        paths
            .open_data()
            .map_err(|e| write_failed("cannot create temporary file", &paths.data, e, needed))?;
        Ok(paths)
    }

    /// Bytes kept for a resumable download of `sha256` (flushed, with a
    /// validator), if any: the durable bytes its record claims, the prefix
    /// and every range summed, never the partial file's length.
    pub fn partial_len(&self, sha256: &str) -> Option<u64> {
        self.kept_bytes(sha256, None)
    }

    /// [`Store::partial_len`] of the partial files of `sha256` declared
    /// with `size` (every size when `None`), the most any lane keeps.
    pub(crate) fn kept_bytes(&self, sha256: &str, size: Option<u64>) -> Option<u64> {
        let mut listing = Listing::default();
        self.list_partials(&mut listing);
        self.kept_bytes_listed(&listing, sha256, size)
    }

    /// [`Store::kept_bytes`], from the partial files `listing` saw.
    pub(crate) fn kept_bytes_listed(
        &self,
        listing: &Listing,
        sha256: &str,
        size: Option<u64>,
    ) -> Option<u64> {
        let tmp = &self.folders.tmp;
        listing
            .partials
            .get(sha256)?
            .iter()
            .filter(|e| size.is_none_or(|s| s == e.size))
            .filter_map(|e| e.paths(tmp).kept())
            .map(|(_, n)| n)
            .max()
    }

    /// Removes the partial files of `sha256` that no process is
    /// downloading now; returns how many. A lane another process holds is
    /// left to it: that download ends by removing its bytes itself when no
    /// installed gem declares them any more.
    pub fn remove_partials(&self, sha256: &str) -> usize {
        self.remove_partials_of(&std::collections::BTreeSet::from([sha256.to_string()]))
    }

    /// [`Store::remove_partials`] for every SHA-256 of `doomed`, with one
    /// listing of the partial files' folder.
    pub(crate) fn remove_partials_of(&self, doomed: &std::collections::BTreeSet<String>) -> usize {
        let tmp = &self.folders.tmp;
        let mut removed = 0;
        for entry in partial_files(tmp) {
            if !doomed.contains(&entry.sha256) {
                continue;
            }
            if let Ok(Some(_held)) = lockfile::try_lock_key(self.locks(), &entry.key()) {
                entry.paths(tmp).remove();
                removed += 1;
            }
        }
        removed
    }

    /// Removes partial files whose SHA-256 is not in `keep` and that no
    /// process is downloading; returns how many.
    pub fn prune_partials(&self, keep: &std::collections::BTreeSet<String>) -> usize {
        let tmp = &self.folders.tmp;
        let mut removed = 0;
        for entry in partial_files(tmp) {
            if keep.contains(&entry.sha256) {
                continue;
            }
            if let Ok(Some(_held)) = lockfile::try_lock_key(self.locks(), &entry.key()) {
                entry.paths(tmp).remove();
                removed += 1;
            }
        }
        removed
    }

    /// Bytes that downloads in progress (in any process) count against
    /// the free space of a new one: for every partial file whose lane is
    /// held, what it still has to write, or, once its download is older
    /// than [`lanes::DEFAULT_WAIT_FOR_OTHERS`], what its rate would write
    /// within [`lanes::RESERVATION_HORIZON`] (see `lanes::counted`).
    /// Leftovers of a crashed download hold no lock and do not count.
    pub fn reserved_bytes(&self) -> u64 {
        self.reservations("", lanes::DEFAULT_WAIT_FOR_OTHERS).total
    }

    fn reservations(&self, own: &str, grace: std::time::Duration) -> Reservations {
        let mut out = Reservations::default();
        let mut largest = 0;
        for entry in partial_files(&self.folders.tmp) {
            if entry.key() == own {
                continue;
            }
            let Some(used) = self.lane_in_use(&entry.sha256, entry.size, entry.lane) else {
                continue;
            };
            let remaining = entry.size.saturating_sub(used.held);
            let counted = lanes::counted(remaining, used.held, used.holder.as_ref(), grace);
            out.total = out.total.saturating_add(counted);
            if counted > largest {
                largest = counted;
                out.largest = used.holder.map(Holder::reserved_by);
            }
        }
        out
    }

    /// The bytes another process downloading `sha256` holds so far, when
    /// one holds its lock: the durable bytes of its partial file's record
    /// (the prefix and every range the parts wrote), or, before it has one
    /// (or from a server whose bytes cannot be resumed), what the file
    /// occupies on disk; never the file's length, which a download in
    /// parts sets by its furthest write.
    pub fn downloading_elsewhere(&self, sha256: &str) -> Option<u64> {
        let mut sizes: Vec<u64> = partial_files(&self.folders.tmp)
            .filter(|e| e.sha256 == sha256)
            .map(|e| e.size)
            .collect();
        sizes.dedup();
        sizes
            .into_iter()
            .flat_map(|size| self.lanes_in_use(sha256, size))
            .map(|lane| lane.held)
            .max()
    }

    /// Removes what no download can use any more, among the files of
    /// `tmp/` no process holds the lock of: leftovers that cannot be resumed
    /// (no record, nothing flushed, a temporary copy) and partial files
    /// untouched for longer than `max_age`; and the lock files earlier
    /// versions left in `locks/` (one per SHA-256, or the shared
    /// `downloads.lock`: the locks are now one per file and lane). Returns
    /// how many were removed.
    pub fn clean_tmp(&self, max_age: std::time::Duration) -> Result<usize> {
        let mut removed = 0;
        let tmp = &self.folders.tmp;
        let names = tmp
            .names()
            .map_err(|e| Error::io("cannot list", tmp.path(), e))?;
        for name in names {
            if self.in_use(&name) {
                continue;
            }
            let resumable = match partial::parse_lane_name(&name) {
                Some((sha, size, lane)) => self.partial(sha, size, lane).kept().is_some(),
                None => name
                    .strip_suffix(".json")
                    .and_then(partial::parse_lane_name)
                    .is_some_and(|_| tmp.is_own_file(name.trim_end_matches(".json"))),
            };
            let keep = resumable && !partial::older_than(tmp, &name, max_age);
            if !keep && tmp.remove_file(&name).is_ok() {
                removed += 1;
            }
        }
        Ok(removed + self.prune_locks())
    }

    /// Removes from `locks/` what nothing takes any more, and returns how
    /// many: the lock files of earlier versions, descriptions a download
    /// that was killed left, and the lane lock files (kept for the next
    /// download of their file) of files the store does not hold, when
    /// nobody holds them. One listing of `blobs/` and one of `locks/`.
    pub(crate) fn prune_locks(&self) -> usize {
        let mut removed = 0;
        let stored: std::collections::BTreeSet<String> =
            self.blobs().unwrap_or_default().into_iter().collect();
        let locks = self.locks();
        let mut lane_zero = Vec::new();
        for name in locks.names().unwrap_or_default() {
            // The lock file per SHA-256 and the shared lock file of earlier
            // versions: nothing takes them any more.
            let legacy =
                name == "downloads.lock" || name.strip_suffix(".lock").is_some_and(is_sha256);
            if legacy && locks.remove_file(&name).is_ok() {
                removed += 1;
                continue;
            }
            if let Some(key) = name.strip_suffix(".lock.json") {
                // What a download that ended without letting go (killed)
                // said about itself.
                let key = partial::parse_key(key).map(|_| key);
                if key.is_some_and(|k| !lockfile::is_held(locks, k))
                    && locks.remove_file(&name).is_ok()
                {
                    removed += 1;
                }
                continue;
            }
            let lane = name
                .strip_suffix(".lock")
                .and_then(|key| Some((key, partial::parse_key(key)?)));
            if let Some((key, (sha, size, lane))) = lane {
                if stored.contains(sha) {
                    continue;
                }
                if lane == 0 {
                    lane_zero.push((key.to_string(), sha.to_string(), size));
                } else if lockfile::remove_key(locks, key) {
                    removed += 1;
                }
            }
        }
        // Lane 0's lock file goes last, and only with no other lane's left:
        // a look for downloads in progress starts at it (see
        // `try_lock_lane`, which makes it again after a removal here).
        for (key, sha, size) in lane_zero {
            let others = || (1..LANES).any(|l| lockfile::exists(locks, &lane_key(&sha, size, l)));
            if others() || !lockfile::remove_key(locks, &key) {
                continue;
            }
            // Another lane taken while it went: made again.
            if others() {
                let _ = lockfile::make(locks, &key);
            } else {
                removed += 1;
            }
        }
        removed
    }

    /// Whether the file `name` of `tmp/` belongs to a download in progress:
    /// a lane's partial file, record or record being written while its lane
    /// is held, or anything else named after a SHA-256 (a copy being made)
    /// while a download of that SHA-256 is in progress.
    fn in_use(&self, name: &str) -> bool {
        let lane = name
            .find(".partial")
            .and_then(|at| partial::parse_key(&name[..at]));
        if let Some((sha, size, lane)) = lane {
            return lockfile::is_held(self.locks(), &lane_key(sha, size, lane));
        }
        let sha = name.split('.').next().unwrap_or_default();
        is_sha256(sha) && matches!(self.try_lock(sha), Ok(None))
    }
}

/// What the downloads in progress count against free space.
#[derive(Debug, Default)]
struct Reservations {
    /// Their sum.
    total: u64,
    /// Whose download counts the most (`None`: its holder said nothing of
    /// itself, or nothing counts).
    largest: Option<ReservedBy>,
}

/// Every partial data file in `tmp` (of every lane).
fn partial_files(tmp: &Folder) -> impl Iterator<Item = PartialEntry> {
    tmp.names()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|name| {
            let (sha, size, lane) = partial::parse_lane_name(&name)?;
            is_sha256(sha).then(|| PartialEntry {
                sha256: sha.to_string(),
                size,
                lane,
            })
        })
}
