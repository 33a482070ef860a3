//! Progress events, for a UI to draw bars and for logs.
//!
//! The service publishes them on a broadcast channel
//! ([`crate::Resources::subscribe`]). Each subscriber has a buffer of
//! [`DEFAULT_EVENT_BUFFER`] events (set another size with
//! [`crate::ResourcesBuilder::event_buffer`]); a subscriber that falls
//! further behind misses the oldest events rather than slowing downloads
//! down, and its next `recv` says so with
//! [`RecvError::Lagged`](tokio::sync::broadcast::error::RecvError::Lagged).
//! Keep receiving after a lag, and rebuild the view from
//! [`crate::Resources::status`]; [`crate::Resources::subscribe_with_status`]
//! gives a subscription and a status taken after it, so nothing falls
//! between the two.
//!
//! As JSON (`serde`), an event is one flat object: `event` names its kind
//! in snake case, `at` is when the service observed it ([`Event::at`];
//! RFC 3339 in UTC with milliseconds), then the variant's fields:
//! `{"event":"progress","at":"2026-12-01T18:40:02.513Z","gem":"notes",…}`.
//! PROTOCOL.md ("Events") lists every kind with its fields.
//!
//! What a subscriber can count on:
//! - Every event about a resource names the gem, the resource id and its
//!   `sha256`. When several gems wait on one download (the same bytes from
//!   the same addresses), each gets its own copy of every event, named with
//!   its own gem and id.
//! - The order of one download, for each waiter: [`Event::Queued`] first,
//!   then [`Event::Started`] before anything else about its addresses:
//!   `Retrying`, `FellBack`, `Resumed` and `Progress` only ever follow a
//!   `Started`. `Started` goes out with the download's first connection, or
//!   with its first retry or fallback when a try failed before it connected
//!   (a host that refuses connections, the network policy or the address
//!   rule refusing the url while a mirror is left). A download whose only
//!   try is refused before connecting sends no `Started`: `Failed` follows
//!   `Queued`. [`Event::Waiting`] (another download of the same file holds
//!   it: another process's, or another gem's from other addresses, named in
//!   `on`) may come before `Started`, or with none at all when that
//!   download's file is used.
//!   A gem that joins a download already started gets `Queued` and
//!   `Started` at once, then the download's later events.
//! - `Started`, `Resumed` and `Progress` carry the `address` being tried:
//!   the url or a mirror, as declared. After a `FellBack`, the next
//!   `Progress` (and the `Started` of a gem that joins later) names the new
//!   address. [`Event::Verified`]'s `served_by` names the address that
//!   delivered the file, as [`crate::Resources::status`] does.
//! - How often [`Event::Progress`] comes: at most once per 100 ms for each
//!   download (the first no sooner than 100 ms after the download took its
//!   slot), and once more when the bytes reach the declared size, so a
//!   download publishes at most one `Progress` per interval plus the last
//!   one, however fast its bytes arrive; each waiter gets a copy of each.
//!   Within one try, `bytes` never goes back. A download that ends before
//!   its first interval (a small file) has just the last one, and one that
//!   fails early may have none.
//! - A download ends with exactly one of [`Event::Verified`],
//!   [`Event::Failed`] or [`Event::Cancelled`] for each waiter. A download
//!   stopped by a policy change ends with `Failed` whose `code` is
//!   `E_RESOURCE_UNAVAILABLE` (no address delivered the file) and whose
//!   `primary_cause` is `E_RESOURCE_POLICY`; in its `message`, the line of
//!   the address that was stopped carries `E_RESOURCE_POLICY`. One stopped by
//!   [`crate::Resources::cancel`], an uninstall, an upgrade that drops it,
//!   or shutdown ends with `Cancelled`.
//! - The order around an install or upgrade: [`Event::Installed`] first,
//!   once the registration is written, then the `Cancelled` and `Deleted`
//!   events of files the new version no longer declares, then the
//!   `Queued` (and later `Started`) events of its required files.
//! - The order around an uninstall: the `Cancelled` events of the gem's
//!   downloads, the `Deleted` events of its files that no gem declares any
//!   more, then [`Event::Uninstalled`], last. An uninstall of a gem that
//!   is not installed publishes nothing.
//! - [`Event::Deleted`] names the gem and resource whose uninstall or
//!   upgrade removed the file; for a file that failed
//!   [`crate::Resources::verify`], the first installed gem (in the order
//!   [`crate::Resources::status`] lists them) that declares it, or none.
//! - [`crate::Resources::shutdown`] ends every subscription: once the
//!   downloads it stopped have sent their last events, each receiver gets
//!   what is still in its buffer and then
//!   [`RecvError::Closed`](tokio::sync::broadcast::error::RecvError::Closed).
//!   A subscription taken after shutdown is closed from the start.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::error::ErrorCode;
use crate::net::policy::Mode;
use crate::service::ResourceStatus;

/// How many events each subscriber's buffer holds by default.
pub const DEFAULT_EVENT_BUFFER: usize = 1024;

/// Something that happened to a resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// A gem's resources were registered (install or upgrade).
    #[non_exhaustive]
    Installed {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem.
        gem: String,
        /// Its resources in manifest order, each as [`crate::Resources::status`]
        /// shows it once the registration is written (before any of its
        /// downloads is queued).
        resources: Vec<ResourceStatus>,
    },
    /// The network policy was replaced ([`crate::Resources::set_policy`]).
    #[non_exhaustive]
    PolicyChanged {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The mode before (serialised as `allowlist` or `blocklist`).
        old_mode: Mode,
        /// Host patterns listed before.
        old_hosts: usize,
        /// The mode now (serialised as `allowlist` or `blocklist`).
        new_mode: Mode,
        /// Host patterns listed now.
        new_hosts: usize,
    },
    /// A gem was removed.
    #[non_exhaustive]
    Uninstalled {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem.
        gem: String,
    },
    /// A download is waiting for a free slot.
    #[non_exhaustive]
    Queued {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Its SHA-256.
        sha256: String,
        /// Declared size.
        size: u64,
    },
    /// A download started: the first report about its addresses (a
    /// connection, a retry or a fallback) follows. See the module
    /// documentation for the order.
    #[non_exhaustive]
    Started {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Its SHA-256.
        sha256: String,
        /// Declared size.
        size: u64,
        /// The address being tried (the url or a mirror, as declared).
        address: String,
    },
    /// An attempt continues bytes kept from an interrupted one: the
    /// server agreed to send the rest from `offset`.
    #[non_exhaustive]
    Resumed {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Its SHA-256.
        sha256: String,
        /// Bytes kept and not downloaded again.
        offset: u64,
        /// Declared size.
        size: u64,
        /// The address that agreed to continue them (the url or a mirror,
        /// as declared).
        address: String,
    },
    /// Bytes received so far; at most one every 100 ms per download, plus
    /// the last (see the module documentation).
    #[non_exhaustive]
    Progress {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Its SHA-256.
        sha256: String,
        /// Bytes of the file present so far (a resumed prefix included).
        bytes: u64,
        /// Declared size.
        size: u64,
        /// The address the bytes come from (the url or a mirror, as
        /// declared; the url when parts also come from the mirrors).
        address: String,
        /// The current rate: this try's bytes over the last three seconds
        /// ([`crate::transfer::meter::Meter`]; a resumed prefix never
        /// counts).
        #[serde(default)]
        bytes_per_sec: u64,
        /// The time left at that rate, in seconds; `null` when it cannot
        /// be told (no rate yet, or stalled).
        #[serde(default)]
        eta_secs: Option<u64>,
    },
    /// The file was verified and is in place.
    #[non_exhaustive]
    Verified {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Its SHA-256.
        sha256: String,
        /// Its local path.
        path: PathBuf,
        /// The address from the manifest (the url or a mirror, as
        /// declared, before any redirect) that delivered the file, as the
        /// status row's `served_by` says: `null` when that is not known.
        served_by: Option<String>,
    },
    /// Every address failed, or a policy change stopped the download (see
    /// the module documentation for its codes).
    #[non_exhaustive]
    Failed {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Its SHA-256.
        sha256: String,
        /// The error code: `E_RESOURCE_UNAVAILABLE` when the addresses
        /// were tried (a policy change included), another code for a
        /// failure of this machine (`E_RESOURCE_DISK_SPACE`, `E_RESOURCE_IO`).
        code: ErrorCode,
        /// The most specific code among the addresses' failures
        /// ([`crate::Error::primary_cause`]): `E_RESOURCE_POLICY` when
        /// the network policy refused or stopped an address.
        primary_cause: ErrorCode,
        /// The full message, with the reason for each address.
        message: String,
        /// When the service tries this file again by itself: a required
        /// file is queued again `service.retry_failed_after` after a
        /// failure, the wait doubling (RFC 3339 in JSON); `null` when
        /// nothing will (a file downloaded on first use, the retry turned
        /// off).
        #[serde(default, with = "crate::time::rfc3339_opt")]
        next_try: Option<SystemTime>,
    },
    /// The download stopped before it finished: [`crate::Resources::cancel`],
    /// an uninstall or upgrade that dropped the file, or shutdown. Bytes
    /// received so far are kept for resume when something still declares
    /// the file.
    #[non_exhaustive]
    Cancelled {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem that waited for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Its SHA-256.
        sha256: String,
        /// Why it stopped.
        reason: String,
    },
    /// A stored file was deleted (no installed gem declares it any more, or
    /// it failed verification).
    #[non_exhaustive]
    Deleted {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// Its SHA-256.
        sha256: String,
        /// The gem whose uninstall or upgrade removed it (the gem that
        /// declared it); for a file that failed [`crate::Resources::verify`],
        /// the first installed gem that declares it, `None` when none does.
        gem: Option<String>,
        /// That gem's id for the file, `None` with `gem`.
        resource: Option<String>,
    },
    /// A try of an address failed for a reason worth another try: the same
    /// address is tried again in `wait_ms` milliseconds (the backoff, or
    /// the server's `Retry-After`).
    #[non_exhaustive]
    Retrying {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Its SHA-256.
        sha256: String,
        /// The address tried again (the url or a mirror, as declared).
        address: String,
        /// The try that comes next, counting from 1.
        attempt: u32,
        /// How many tries the address gets at most.
        of: u32,
        /// How long until that try, in milliseconds.
        wait_ms: u64,
        /// Why the last try failed.
        reason: String,
    },
    /// Another download of the same file (in this process or in another one
    /// sharing the store) holds it: this one waits for that to end, and
    /// then uses its file. When that download fetches from other addresses
    /// (another gem's manifest), the wait is bounded
    /// (`network.wait_for_others_secs`): then this one fetches from its own
    /// addresses too (`Started` follows), and the first verified copy wins.
    #[non_exhaustive]
    Waiting {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Its SHA-256.
        sha256: String,
        /// The gem whose download it waits for, when known (absent: a
        /// download by hand, or one that has not said).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        on: Option<String>,
    },
    /// An address failed for good (its last try, or a failure that no
    /// retry mends, such as wrong bytes): the next address is tried.
    #[non_exhaustive]
    FellBack {
        /// When the service observed it (RFC 3339 in UTC with
        /// milliseconds in JSON: `2026-12-01T18:40:02.513Z`).
        #[serde(with = "crate::time::rfc3339_millis")]
        at: SystemTime,
        /// The gem that asked for it.
        gem: String,
        /// The resource id.
        resource: String,
        /// Its SHA-256.
        sha256: String,
        /// The address that failed (the url or a mirror, as declared).
        from: String,
        /// The redirect target where it failed, when that is not `from`
        /// itself (a CDN's signed URL that answered 403, say); `null`
        /// otherwise.
        hop: Option<String>,
        /// The address tried next.
        to: String,
        /// The failure's code (`E_RESOURCE_SHA256`, `E_RESOURCE_HTTP`, …).
        code: ErrorCode,
        /// Why it failed.
        reason: String,
    },
}

impl Event {
    /// When the service observed it (its `at`).
    pub fn at(&self) -> SystemTime {
        match self {
            Event::Installed { at, .. }
            | Event::PolicyChanged { at, .. }
            | Event::Uninstalled { at, .. }
            | Event::Queued { at, .. }
            | Event::Started { at, .. }
            | Event::Resumed { at, .. }
            | Event::Progress { at, .. }
            | Event::Verified { at, .. }
            | Event::Failed { at, .. }
            | Event::Cancelled { at, .. }
            | Event::Deleted { at, .. }
            | Event::Retrying { at, .. }
            | Event::Waiting { at, .. }
            | Event::FellBack { at, .. } => *at,
        }
    }
}

/// The service's event channel, shared by everything that publishes:
/// open until [`Events::close`], after which nothing is published and
/// every receiver, old or new, sees `Closed`.
#[derive(Debug, Clone)]
pub(crate) struct Events {
    sender: Arc<RwLock<Option<broadcast::Sender<Event>>>>,
    buffer: usize,
}

impl Events {
    /// A channel whose subscribers each buffer `buffer` events (at least 1).
    pub(crate) fn new(buffer: usize) -> Events {
        let (sender, _) = broadcast::channel(buffer.max(1));
        Events {
            sender: Arc::new(RwLock::new(Some(sender))),
            buffer: buffer.max(1),
        }
    }

    /// How many events each subscriber buffers.
    pub(crate) fn buffer(&self) -> usize {
        self.buffer
    }

    fn sender(&self) -> Option<broadcast::Sender<Event>> {
        self.sender
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Publishes `event` to every subscriber; nothing once closed.
    pub(crate) fn send(&self, event: Event) {
        let sender = self.sender.read().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = sender.as_ref() {
            // No subscriber is not an error.
            let _ = sender.send(event);
        }
    }

    /// A new subscription; closed from the start once the channel is.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Event> {
        match self.sender() {
            Some(sender) => sender.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    /// How many subscriptions are open.
    pub(crate) fn receiver_count(&self) -> usize {
        self.sender().map_or(0, |s| s.receiver_count())
    }

    /// Ends every subscription: each receiver gets what its buffer still
    /// holds, then `Closed`.
    pub(crate) fn close(&self) {
        self.sender
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::{Duration, UNIX_EPOCH};
    use tokio::sync::broadcast::error::RecvError;

    /// 2026-12-01T18:40:02.513Z.
    fn at() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_796_150_402_513)
    }

    fn deleted() -> Event {
        Event::Deleted {
            at: at(),
            sha256: "a".repeat(64),
            gem: Some("notes".into()),
            resource: Some("ocr".into()),
        }
    }

    #[test]
    fn events_are_flat_json_with_their_kind_and_time_first() {
        let sha = "a".repeat(64);
        let progress = Event::Progress {
            at: at(),
            gem: "notes".into(),
            resource: "ocr".into(),
            sha256: sha.clone(),
            bytes: 1_048_576,
            size: 4_194_304,
            address: "https://cdn.test/ocr.onnx".into(),
            bytes_per_sec: 2_097_152,
            eta_secs: Some(1),
        };
        let text = serde_json::to_string(&progress).unwrap();
        assert!(
            text.starts_with(r#"{"event":"progress","at":"2026-12-01T18:40:02.513Z","#),
            "{text}"
        );
        assert_eq!(
            serde_json::to_value(&progress).unwrap(),
            json!({
                "event": "progress", "at": "2026-12-01T18:40:02.513Z", "gem": "notes",
                "resource": "ocr", "sha256": sha, "bytes": 1_048_576, "size": 4_194_304,
                "address": "https://cdn.test/ocr.onnx", "bytes_per_sec": 2_097_152, "eta_secs": 1,
            })
        );
        let started = Event::Started {
            at: at(),
            gem: "notes".into(),
            resource: "ocr".into(),
            sha256: sha.clone(),
            size: 4,
            address: "https://mirror.test/ocr.onnx".into(),
        };
        assert_eq!(
            serde_json::to_value(&started).unwrap(),
            json!({
                "event": "started", "at": "2026-12-01T18:40:02.513Z", "gem": "notes",
                "resource": "ocr", "sha256": sha, "size": 4,
                "address": "https://mirror.test/ocr.onnx",
            })
        );
        let verified = Event::Verified {
            at: at(),
            gem: "notes".into(),
            resource: "ocr".into(),
            sha256: sha.clone(),
            path: PathBuf::from("/s/ocr.onnx"),
            served_by: Some("https://mirror.test/ocr.onnx".into()),
        };
        assert_eq!(
            serde_json::to_value(&verified).unwrap(),
            json!({
                "event": "verified", "at": "2026-12-01T18:40:02.513Z", "gem": "notes",
                "resource": "ocr", "sha256": sha, "path": "/s/ocr.onnx",
                "served_by": "https://mirror.test/ocr.onnx",
            })
        );
        assert_eq!(
            serde_json::to_value(deleted()).unwrap(),
            json!({
                "event": "deleted", "at": "2026-12-01T18:40:02.513Z", "sha256": sha,
                "gem": "notes", "resource": "ocr",
            })
        );
        let unclaimed = Event::Deleted {
            at: at(),
            sha256: sha.clone(),
            gem: None,
            resource: None,
        };
        assert_eq!(
            serde_json::to_value(&unclaimed).unwrap(),
            json!({
                "event": "deleted", "at": "2026-12-01T18:40:02.513Z", "sha256": sha,
                "gem": null, "resource": null,
            })
        );
        let row = ResourceStatus {
            id: "ocr".into(),
            label: "ocr".into(),
            file: "ocr.onnx".into(),
            size: 4,
            description: None,
            host: "cdn.test".into(),
            addresses: vec!["https://cdn.test/ocr.onnx".into()],
            hosts: vec!["cdn.test".into()],
            required: true,
            sha256: sha.clone(),
            state: crate::service::ResourceState::Missing,
            partial_bytes: None,
            next_try: None,
        };
        let installed = Event::Installed {
            at: at(),
            gem: "notes".into(),
            resources: vec![row.clone()],
        };
        assert_eq!(
            serde_json::to_value(&installed).unwrap(),
            json!({
                "event": "installed", "at": "2026-12-01T18:40:02.513Z", "gem": "notes",
                "resources": [serde_json::to_value(&row).unwrap()],
            })
        );
        assert_eq!(installed.at(), at());
    }

    #[tokio::test]
    async fn close_ends_old_subscriptions_after_their_buffer_and_new_ones_at_once() {
        let events = Events::new(4);
        let mut old = events.subscribe();
        events.send(deleted());
        events.close();
        events.send(deleted());
        assert_eq!(old.recv().await, Ok(deleted()));
        assert_eq!(old.recv().await, Err(RecvError::Closed));
        let mut new = events.subscribe();
        assert_eq!(new.recv().await, Err(RecvError::Closed));
        assert_eq!(events.receiver_count(), 0);
    }
}
