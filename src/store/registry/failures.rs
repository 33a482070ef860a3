//! The failure records of a gem's resources: a log per gem
//! (`failures/<gem id>.jsonl`), one JSON line per change, appended, the last
//! line of a resource winning; compacted atomically once it holds more than
//! twice the live records, and kept parsed in memory while its file is
//! unchanged (see `registry`).

use super::*;

/// The last failure of one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// When it failed; RFC 3339 in JSON (records written by earlier
    /// versions hold seconds since the Unix epoch, and still read).
    #[serde(with = "crate::time::rfc3339")]
    pub at: std::time::SystemTime,
    /// The error code.
    pub code: ErrorCode,
    /// The most specific code among the attempts
    /// ([`crate::Error::primary_cause`]): `E_RESOURCE_POLICY` when the
    /// network policy blocked an address, for example.
    #[serde(default = "unavailable")]
    pub primary_cause: ErrorCode,
    /// The full message.
    pub message: String,
    /// Each address with its own code and reason.
    pub attempts: Vec<AttemptRecord>,
    /// The SHA-256 the failed download was for. A record whose SHA-256 or
    /// addresses are not the resource's any more (an upgrade changed them)
    /// is stale and never shown. Empty in records of earlier versions.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// The addresses it tried (url, then mirrors, as declared).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

fn unavailable() -> ErrorCode {
    ErrorCode::Unavailable
}

/// The most attempts a failure record keeps: the url and its 16 mirrors.
const MAX_RECORDED_ATTEMPTS: usize = 17;

/// The most characters a recorded address or reason keeps.
const MAX_RECORDED_TEXT_CHARS: usize = 2048;

impl FailureRecord {
    /// Records `error` of a download of `resource` as of now. The record
    /// is bounded: at most 17 attempts, each address and reason cut to 2048
    /// characters, and the message to 16 KiB.
    pub fn new(resource: &Resource, error: &Error) -> FailureRecord {
        FailureRecord {
            sha256: resource.sha256.clone(),
            addresses: resource.addresses().map(|a| a.to_string()).collect(),
            ..FailureRecord::from_error(error)
        }
    }

    /// This record as it reads back from the store.
    fn into_stored(self) -> FailureRecord {
        serde_json::to_vec(&self)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or(self)
    }

    /// Records `error` as of now, for no resource in particular (see
    /// [`FailureRecord::new`]).
    pub fn from_error(error: &Error) -> FailureRecord {
        let attempts = match error {
            Error::Unavailable { attempts, .. } => attempts
                .iter()
                .take(MAX_RECORDED_ATTEMPTS)
                .map(|a| AttemptRecord {
                    address: shorten_to(a.address.as_str(), MAX_RECORDED_TEXT_CHARS),
                    code: a.code(),
                    reason: shorten_to(&a.error.to_string(), MAX_RECORDED_TEXT_CHARS),
                })
                .collect(),
            // Another process's download: its attempts as it recorded them.
            Error::FailedElsewhere { attempts, .. } => attempts
                .iter()
                .take(MAX_RECORDED_ATTEMPTS)
                .map(|a| AttemptRecord {
                    address: shorten_to(&a.address, MAX_RECORDED_TEXT_CHARS),
                    code: a.code,
                    reason: shorten_to(&a.reason, MAX_RECORDED_TEXT_CHARS),
                })
                .collect(),
            _ => Vec::new(),
        };
        FailureRecord {
            at: std::time::SystemTime::now(),
            code: error.code(),
            primary_cause: error.primary_cause(),
            message: shorten_to(&error.to_string(), MAX_FAILURE_MESSAGE_CHARS),
            attempts,
            sha256: String::new(),
            addresses: Vec::new(),
        }
    }

    /// Whether this record is about `resource` as declared now: the same
    /// SHA-256 and the same addresses. A record of an earlier version that
    /// named neither is taken as current.
    pub fn is_for(&self, resource: &Resource) -> bool {
        if self.sha256.is_empty() {
            return true;
        }
        self.sha256 == resource.sha256
            && self
                .addresses
                .iter()
                .map(String::as_str)
                .eq(resource.addresses().map(|a| a.as_str()))
    }
}

/// A gem's failure log as last read or written, and what it was read from.
#[derive(Debug, Default)]
pub(super) struct FailureLog {
    /// `None` when there was no file.
    stamp: Option<crate::platform::FileStamp>,
    /// Lines in the file (live or not).
    lines: usize,
    /// Whether the file ends in the middle of a line (a crash cut it).
    torn: bool,
    /// Whether a write failed since the file was read: read it again.
    stale: bool,
    /// The live records by resource id.
    records: BTreeMap<String, FailureRecord>,
}

/// One line of a failure log.
#[derive(Debug, Serialize, Deserialize)]
struct FailureLine {
    resource: String,
    record: Option<FailureRecord>,
}

/// Compaction happens when the log holds more lines than this plus twice
/// the live records.
pub(super) const LOG_SLACK: usize = 64;

/// Longest failure log read back.
const MAX_LOG_BYTES: u64 = 256 << 20;

/// `<gem>.jsonl`, the failure log's name in `failures/`.
fn failure_log_name(gem: &str) -> String {
    format!("{}.jsonl", file_stem(gem))
}

/// A gem's failure log: its folder (held open), its name there and its
/// path (for messages).
struct LogFile<'a> {
    dir: &'a Folder,
    name: String,
    path: PathBuf,
}

impl FailureLog {
    /// Appends `lines`, in one write.
    fn append(&mut self, at: &LogFile, lines: &[FailureLine]) -> Result<()> {
        let path = &at.path;
        let mut bytes = Vec::with_capacity(512 * lines.len());
        if self.torn {
            // Ends the line a crash cut short, so these stay whole.
            bytes.push(b'\n');
        }
        for line in lines {
            serde_json::to_writer(&mut bytes, line)
                .map_err(|e| Error::io("cannot encode", path, std::io::Error::other(e)))?;
            bytes.push(b'\n');
        }
        // Readable by the owner only, as the atomically written records;
        // a symbolic link planted at the log's name is never appended to.
        let mut file = at
            .dir
            .open_own(
                &at.name,
                cap_std::fs::OpenOptions::new().create(true).append(true),
            )
            .map_err(|e| Error::io("cannot open", path, e))?;
        // Not fsynced: a failure record only explains why a file is
        // missing, and the file is fetched again either way. What a power
        // cut can lose is the last few explanations, never a line's shape
        // (a cut line is skipped) nor anything about the files themselves.
        file.write_all(&bytes)
            .map_err(|e| crate::store::write_failed("cannot write", path, e, bytes.len() as u64))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io("cannot read", path, e))?;
        self.stamp = Some(crate::platform::FileStamp::of(path, &meta));
        self.lines += lines.len();
        self.torn = false;
        Ok(())
    }

    /// Rewrites the log with only its live records, atomically; removes it
    /// when none is left.
    fn compact(&mut self, at: &LogFile) -> Result<()> {
        let path = &at.path;
        if self.records.is_empty() {
            match at.dir.remove_file(&at.name) {
                Ok(()) => at.dir.sync(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("cannot remove", path, e)),
            }
            *self = FailureLog::default();
            return Ok(());
        }
        write_atomic(at.dir, &at.name, &encode_failures(&self.records))?;
        let meta = at
            .dir
            .own_file_meta(&at.name)
            .map_err(|e| Error::io("cannot read", path, e))?;
        self.stamp = Some(crate::platform::FileStamp::of(path, &meta));
        self.lines = self.records.len();
        self.torn = false;
        Ok(())
    }
}

/// The live records of a failure log, and how many lines it has. Lines that
/// do not parse (one cut short by a crash) are skipped.
fn fold_failure_log(bytes: &[u8]) -> (BTreeMap<String, FailureRecord>, usize) {
    let mut records = BTreeMap::new();
    let mut lines = 0;
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        lines += 1;
        let Ok(line) = serde_json::from_slice::<FailureLine>(line) else {
            continue;
        };
        match line.record {
            Some(record) => records.insert(line.resource, record),
            None => records.remove(&line.resource),
        };
    }
    (records, lines)
}

/// A failure log holding exactly `records`, one line each.
#[doc(hidden)]
pub fn encode_failures(records: &BTreeMap<String, FailureRecord>) -> Vec<u8> {
    let mut out = Vec::new();
    for (resource, record) in records {
        let line = FailureLine {
            resource: resource.clone(),
            record: Some(record.clone()),
        };
        if serde_json::to_writer(&mut out, &line).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// Whether two declarations of a resource download the same bytes from the
/// same addresses (so that a failure of one is a failure of the other).
fn same_download(a: &Resource, b: &Resource) -> bool {
    a.sha256 == b.sha256 && a.addresses().eq(b.addresses())
}

/// Reads the bytes of a failure log as [`Registry::failures`] does (the
/// last line of each resource wins; lines that do not parse are skipped);
/// an entry point for the fuzz targets and property tests.
#[doc(hidden)]
pub fn parse_failures(bytes: &[u8]) -> BTreeMap<String, FailureRecord> {
    fold_failure_log(bytes).0
}

/// A change of one failure record waiting to be written (see
/// [`Registry::set_failure`]), and its caller's answer.
#[derive(Debug)]
struct Change {
    gem: String,
    resource: String,
    record: Option<FailureRecord>,
    done: tokio::sync::oneshot::Sender<Result<()>>,
}

/// The changes of failure records waiting to be written, and whether a
/// task writes them.
#[derive(Debug, Default)]
pub(super) struct Pending {
    changes: Vec<Change>,
    writing: bool,
}

impl Registry {
    /// Drops the failure records a new registration `reg` makes stale
    /// (`old`: the one it replaces): those of resources it no longer
    /// declares, or whose SHA-256 or addresses it changes. Call with the
    /// lock held.
    pub(super) fn drop_stale_failures(
        &self,
        reg: &Registration,
        old: Option<&Registration>,
    ) -> Result<()> {
        self.with_failure_log(&reg.gem, |log, path| {
            let before = log.records.len();
            log.records.retain(|id, record| {
                let declared =
                    |resources: &[Resource]| resources.iter().find(|r| &r.id == id).cloned();
                match (
                    declared(&reg.resources),
                    old.and_then(|o| declared(&o.resources)),
                ) {
                    (None, _) => false,
                    (Some(new), Some(was)) if !same_download(&new, &was) => false,
                    (Some(new), _) => record.is_for(&new),
                }
            });
            if log.records.len() != before {
                log.compact(path)?;
            }
            Ok(())
        })
    }

    /// Removes the failure records of `gem`. Call with the lock held.
    pub(super) fn forget_failures(&self, gem: &str) {
        let _ = self.failures.remove_file(&failure_log_name(gem));
        self.failure_logs().remove(gem);
        self.unsaved().remove(gem);
    }

    /// The failure records of `gem`, by resource id. Records of resources
    /// whose SHA-256 or addresses changed since are left out.
    /// A change that could not be written (a full disk) is reported by
    /// this process all the same.
    pub fn failures(&self, gem: &str) -> Result<BTreeMap<String, FailureRecord>> {
        let mut all = self.with_failure_log(gem, |log, _| Ok(log.records.clone()))?;
        for (resource, record) in self.unsaved().get(gem).into_iter().flatten() {
            match record {
                Some(r) => all.insert(resource.clone(), r.clone()),
                None => all.remove(resource),
            };
        }
        if !all.is_empty() {
            let cached = self.cached(gem)?;
            all.retain(|id, record| {
                let declared = cached.as_ref().and_then(|c| c.resource(id));
                declared.is_some_and(|r| record.is_for(r))
            });
        }
        Ok(all)
    }

    /// Sets (or, with `None`, clears) the failure record of one resource.
    /// The file work runs on the runtime's blocking threads, under the
    /// registry lock; a clear with surely nothing to clear only opens the
    /// gem's failure log (or finds none) on the calling thread. When the
    /// record cannot be written (a full disk), this process keeps it in
    /// memory and reports it ([`Registry::failures`]) all the same, and
    /// the write's error is returned.
    pub async fn set_failure(
        &self,
        gem: &str,
        resource: &str,
        record: Option<FailureRecord>,
    ) -> Result<()> {
        if record.is_none() && self.nothing_to_clear(gem, resource) {
            return Ok(());
        }
        let (done, result) = tokio::sync::oneshot::channel();
        let lead = {
            let mut pending = self.pending();
            pending.changes.push(Change {
                gem: gem.to_string(),
                resource: resource.to_string(),
                record,
                done,
            });
            !std::mem::replace(&mut pending.writing, true)
        };
        if lead {
            // Its own task: a caller that stops waiting never stops the
            // writing of the changes others wait for.
            tokio::spawn(self.clone().write_pending());
        }
        result.await.unwrap_or_else(|_| {
            Err(Error::io(
                "the file work stopped:",
                self.failures.path(),
                std::io::Error::other("the runtime is shutting down"),
            ))
        })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.cache.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the changes of failure records waiting, all those that came
    /// in meanwhile together: under one take of the registry lock, in one
    /// trip to the blocking threads, each gem's log read once and appended
    /// to once. Returns once none waits.
    async fn write_pending(self) {
        loop {
            if self.idle_unless_pending() {
                return;
            }
            let lock = self.lock().await;
            let changes = std::mem::take(&mut self.pending().changes);
            let lock = match lock {
                Ok(lock) => lock,
                Err(e) => {
                    for change in changes {
                        let _ = change.done.send(Err(e.clone()));
                    }
                    continue;
                }
            };
            let this = self.clone();
            let path = self.failures.path().to_path_buf();
            let written = crate::store::off_runtime(&path, move || {
                let answers = this.set_failures_locked(changes);
                drop(lock);
                // Idle before the answers go: a caller that then changes
                // another record finds no writer and starts one, even when
                // this task is never polled again (its runtime stopped).
                let idle = this.idle_unless_pending();
                for (answer, written) in answers {
                    let _ = answer.send(written);
                }
                Ok(idle)
            })
            .await;
            match written {
                Ok(true) => return,
                Ok(false) => {}
                // The changes went with the work; their callers hear of it
                // as their answer is dropped.
                Err(e) => tracing::debug!("{}: {e}", e.code()),
            }
        }
    }

    /// Marks the writing of failure records over when no change waits:
    /// whether it did.
    fn idle_unless_pending(&self) -> bool {
        let mut pending = self.pending();
        if pending.changes.is_empty() {
            pending.writing = false;
        }
        !pending.writing
    }

    /// Whether `gem` surely has no failure record of `resource` to clear:
    /// none kept in memory, and no failure log, or one unchanged since it
    /// was read without that record. One look at the log's name, without
    /// the registry lock: a record another process writes after that look
    /// is one written after this clear, as it would be after the lock.
    fn nothing_to_clear(&self, gem: &str, resource: &str) -> bool {
        if self
            .unsaved()
            .get(gem)
            .is_some_and(|u| u.contains_key(resource))
        {
            return false;
        }
        let name = failure_log_name(gem);
        match self.failures.own_file_meta(&name) {
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            Ok(meta) => {
                let stamp = crate::platform::FileStamp::of(&self.failures.join(&name), &meta);
                self.failure_logs().get(gem).is_some_and(|log| {
                    !log.stale && log.stamp == Some(stamp) && !log.records.contains_key(resource)
                })
            }
        }
    }

    pub(super) fn unsaved(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, BTreeMap<String, Option<FailureRecord>>>> {
        self.cache.unsaved.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Registry::set_failure`] for each of `changes`, with the lock held:
    /// each caller's answer.
    fn set_failures_locked(
        &self,
        changes: Vec<Change>,
    ) -> Vec<(tokio::sync::oneshot::Sender<Result<()>>, Result<()>)> {
        let mut out = Vec::new();
        let mut by_gem: BTreeMap<String, Vec<Change>> = BTreeMap::new();
        for change in changes {
            by_gem.entry(change.gem.clone()).or_default().push(change);
        }
        for (gem, changes) in by_gem {
            let (answers, changes): (Vec<_>, Vec<_>) = changes
                .into_iter()
                .map(|c| (c.done, (c.resource, c.record)))
                .unzip();
            let written = self.set_failure_locked(&gem, changes);
            out.extend(answers.into_iter().map(|a| (a, written.clone())));
        }
        out
    }

    /// Sets (or, with `None`, clears) the failure records of resources of
    /// `gem`, in order, with the lock held: every line in one append.
    fn set_failure_locked(
        &self,
        gem: &str,
        changes: Vec<(String, Option<FailureRecord>)>,
    ) -> Result<()> {
        #[cfg(test)]
        {
            *self.cache.worked_on.lock().unwrap() = Some(std::thread::current().id());
            self.cache.failure_writes.fetch_add(1, Ordering::Relaxed);
        }
        let Some(cached) = self.cached(gem)? else {
            return Ok(());
        };
        let changes: Vec<(String, Option<FailureRecord>, bool)> = changes
            .into_iter()
            .filter(|(resource, record)| {
                // A download that ended after an upgrade changed the
                // resource is not news about the resource as declared now.
                let current = cached.resource(resource);
                record
                    .as_ref()
                    .is_none_or(|r| current.is_some_and(|c| r.is_for(c)))
            })
            .map(|(resource, record)| {
                let unsaved = self
                    .unsaved()
                    .get(gem)
                    .is_some_and(|u| u.contains_key(&resource));
                // Kept as any reader gets it back (times in whole seconds).
                (resource, record.map(|r| r.into_stored()), unsaved)
            })
            .collect();
        if changes.is_empty() {
            return Ok(());
        }
        let written = self.with_failure_log(gem, |log, at| {
            let mut lines = Vec::new();
            for (resource, record, unsaved) in &changes {
                if record.is_none() && !log.records.contains_key(resource) && !unsaved {
                    continue;
                }
                match record {
                    Some(r) => log.records.insert(resource.clone(), r.clone()),
                    None => log.records.remove(resource),
                };
                lines.push(FailureLine {
                    resource: resource.clone(),
                    record: record.clone(),
                });
            }
            if lines.is_empty() {
                return Ok(());
            }
            #[cfg(test)]
            if self.cache.full_disk.load(Ordering::Relaxed) {
                log.stale = true;
                let full = std::io::Error::from_raw_os_error(crate::platform::DISK_FULL_CODES[0]);
                return Err(crate::store::write_failed(
                    "cannot write",
                    &at.path,
                    full,
                    1,
                ));
            }
            let written = if log.lines + lines.len() > 2 * log.records.len() + LOG_SLACK {
                log.compact(at)
            } else {
                log.append(at, &lines)
            };
            // The file no longer says what this log holds: read it again.
            log.stale = written.is_err();
            written
        });
        let mut unsaved = self.unsaved();
        for (resource, record, _) in changes {
            match &written {
                Ok(()) => {
                    if let Some(u) = unsaved.get_mut(gem) {
                        u.remove(&resource);
                    }
                }
                Err(_) => {
                    unsaved
                        .entry(gem.to_string())
                        .or_default()
                        .insert(resource, record);
                }
            }
        }
        written
    }

    fn failure_logs(&self) -> std::sync::MutexGuard<'_, HashMap<String, FailureLog>> {
        self.cache
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `work` on the failure log of `gem`, read again only when its
    /// file changed since this registry last read or wrote it.
    fn with_failure_log<T>(
        &self,
        gem: &str,
        work: impl FnOnce(&mut FailureLog, &LogFile) -> Result<T>,
    ) -> Result<T> {
        let name = failure_log_name(gem);
        let path = self.failures.join(&name);
        let at = LogFile {
            dir: &self.failures,
            name,
            path,
        };
        let (name, path) = (&at.name, &at.path);
        let stamp = if self.failures.is_untrusted(name) {
            // Not the store's own file (a symbolic link planted there):
            // its name is freed, its target never read or written.
            tracing::warn!("removing {}: the store does not trust it", path.display());
            self.failures
                .remove_file(name)
                .map_err(|e| Error::io("cannot remove", path, e))?;
            None
        } else {
            match self.failures.own_file_meta(name) {
                Ok(meta) => Some(crate::platform::FileStamp::of(path, &meta)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(Error::io("cannot read", path, e)),
            }
        };
        let mut logs = self.failure_logs();
        let log = logs.entry(gem.to_string()).or_default();
        if log.stale || log.stamp != stamp || (stamp.is_none() && log.lines > 0) {
            *log = match stamp {
                None => FailureLog::default(),
                Some(_) => {
                    let bytes = match self.failures.read_own(name, MAX_LOG_BYTES) {
                        Ok(bytes) => bytes,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                        Err(e) => return Err(Error::io("cannot read", path, e)),
                    };
                    let (records, lines) = fold_failure_log(&bytes);
                    FailureLog {
                        stamp,
                        lines,
                        torn: bytes.last().is_some_and(|b| *b != b'\n'),
                        stale: false,
                        records,
                    }
                }
            };
        }
        work(log, &at)
    }
}
