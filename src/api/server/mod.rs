//! The server side of the local API: accepts clients on the store's
//! socket and answers their requests with the service's own calls.
//!
//! Each connection has a reader (bounded lines), a writer fed by a bounded
//! queue, and one task per request in flight. Events reach a subscriber
//! through that queue without waiting: a client whose queue is full loses
//! its subscription (a `lagged` notification says so), so a slow or stuck
//! client never holds up a download or another client. `hello` is a
//! connection's first call, and its calls that change the store apply in
//! the order they were read (`order`).
//!
//! The parts, each using only those listed before it:
//! - `connection`: a connection's state and its queue of lines to write.
//! - `fanout`: the service's events, written once for every subscriber.
//! - `order`: the turns of the calls that change the store.
//! - `peers`: what each client process holds, and every subscription.
//! - `request`: whether a line's value is a request, and its params.
//! - `subscriptions`: events forwarded to a subscriber.
//! - `dispatch`: the methods.
//! - `batch`: a batch's requests and their one answer.
//! - `session`: a connection's reading of lines within their limits.
//!
//! No client can exhaust the service for the others: every limit is
//! counted in bytes and time as well as in messages (see the constants of
//! [`protocol`]). Connections are capped below the process's limit of open
//! files, and at the cap the one idle the longest makes room; a partial
//! line has [`protocol::LINE_DEADLINE`], a silent new connection
//! [`protocol::FIRST_LINE_DEADLINE`], and a client that does not read
//! [`protocol::WRITE_DEADLINE`]; request lines of all connections together
//! hold at most [`protocol::REQUEST_BYTES`], and a connection's queue at
//! most [`protocol::CONNECTION_QUEUE_BYTES`]. What a client asked for and
//! has not read counts against it before its answer is built: a
//! connection has [`protocol::MAX_IN_FLIGHT`] requests in flight until
//! their answers are written (a batch counts as its requests), and a
//! client process (by its pid) [`protocol::MAX_IN_FLIGHT_PER_PEER`],
//! [`protocol::MAX_CONNECTIONS_PER_PEER`] and
//! [`protocol::MAX_SUBSCRIPTIONS_PER_PEER`]; the service holds
//! [`protocol::MAX_SUBSCRIPTIONS_TOTAL`] subscriptions, the oldest making
//! room.

mod batch;
mod connection;
mod dispatch;
mod fanout;
mod order;
mod peers;
mod request;
mod session;
mod subscriptions;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::api::discovery::{self, ServiceLock};
use crate::api::protocol;
use crate::error::{Error, Result};
use crate::platform::local_socket::{self, Listener};
use crate::service::Resources;

use session::serve_connection;

/// A running local API; [`ApiServer::stop`] ends it.
#[derive(Debug)]
pub struct ApiServer {
    socket: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    /// The socket (or named pipe) clients connect to.
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// Stops accepting, closes every connection, removes the socket and
    /// `service.json`, and releases the store.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

impl Resources {
    /// Accepts API clients on the store's default socket (see
    /// `PROTOCOL.md` and [`crate::api::discovery`]) until
    /// [`ApiServer::stop`]. Fails with `E_RESOURCE_BUSY` when another
    /// service already listens on the store.
    pub fn listen(&self) -> Result<ApiServer> {
        self.check_live()?;
        let store_dir = self.store_dir();
        // Held before a folder is made for the socket: a second service
        // makes none.
        let lock = discovery::hold(self.store(), &store_dir)?;
        let place = discovery::default_place(self.store())?;
        self.listen_at(place, lock, store_dir)
    }

    /// [`Resources::listen`] on another socket path (`service.json` names
    /// it, so clients that start from the store still find it). The
    /// socket's folder must be the user's own and closed to others, or no
    /// client connects.
    pub fn listen_on(&self, socket: &Path) -> Result<ApiServer> {
        self.check_live()?;
        let store_dir = self.store_dir();
        let lock = discovery::hold(self.store(), &store_dir)?;
        let place = local_socket::Place {
            path: socket.to_path_buf(),
            own_folder: None,
        };
        self.listen_at(place, lock, store_dir)
    }

    fn store_dir(&self) -> std::path::PathBuf {
        self.store()
            .root()
            .parent()
            .unwrap_or(self.store().root())
            .to_path_buf()
    }

    fn listen_at(
        &self,
        place: local_socket::Place,
        lock: ServiceLock,
        store_dir: std::path::PathBuf,
    ) -> Result<ApiServer> {
        discovery::clear_left_over(self.store(), &lock);
        let _runtime = self.handle().enter();
        let listener = Listener::bind(&place).map_err(|e| {
            if let Some(folder) = &place.own_folder {
                let _ = std::fs::remove_dir(folder);
            }
            Error::io("cannot listen on", &place.path, e)
        })?;
        let name = listener.name();
        let secret = discovery::random_hex()?;
        discovery::publish(self.store(), &lock, &name, &secret)?;
        let stop = CancellationToken::new();
        let cap = connection_cap(crate::platform::raise_open_files_limit());
        let shared = Arc::new(Shared {
            service: self.clone(),
            store_dir,
            socket: name.clone(),
            secret,
            connections: Arc::new(Semaphore::new(cap)),
            cap,
            request_bytes: Arc::new(Semaphore::new(protocol::REQUEST_BYTES)),
            open: Mutex::default(),
            next_connection: AtomicU64::new(1),
            peers: Arc::default(),
            no_room_until: Mutex::default(),
            events: fanout::start(self, stop.clone()),
            stop: stop.clone(),
        });
        let task = self.handle().spawn(accept_loop(listener, shared, lock));
        Ok(ApiServer {
            socket: name,
            stop,
            task,
        })
    }
}

/// What every connection shares.
struct Shared {
    service: Resources,
    store_dir: std::path::PathBuf,
    socket: String,
    /// What `hello` proves it holds (`service.json`'s `secret`).
    secret: String,
    /// One permit per open connection.
    connections: Arc<Semaphore>,
    /// How many connections may be open at once.
    cap: usize,
    /// The bytes of request lines all connections may hold at once.
    request_bytes: Arc<Semaphore>,
    /// Every open connection, to find the one idle the longest.
    open: Mutex<HashMap<u64, Arc<Activity>>>,
    next_connection: AtomicU64,
    /// What each client process holds, and every subscription.
    peers: Arc<peers::Peers>,
    /// Until when a new connection at the cap is refused without waiting:
    /// the last wait found no room, and every connection was busy.
    no_room_until: Mutex<Option<tokio::time::Instant>>,
    /// Where subscriptions take the service's events, written once.
    events: tokio::sync::broadcast::WeakSender<Arc<fanout::Item>>,
    stop: CancellationToken,
}

/// How long a new connection waits at the cap for a connection that may
/// be closed to make room, and for that one to end. Both take moments on
/// a machine with time to spare; a busy one may take a second or more.
/// Less than a client's wait for `hello` ([`crate::api::client::CONNECT_TIMEOUT`]).
const MAKE_ROOM_WAIT: std::time::Duration = std::time::Duration::from_secs(4);

/// How often a new connection at the cap looks again for one to close.
const MAKE_ROOM_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// The cap of connections for a process that may open `limit` files.
fn connection_cap(limit: Option<u64>) -> usize {
    match limit {
        Some(limit) => {
            let room = limit.saturating_sub(protocol::RESERVED_DESCRIPTORS);
            usize::try_from(room)
                .unwrap_or(usize::MAX)
                .clamp(16, protocol::MAX_CONNECTIONS)
        }
        None => protocol::MAX_CONNECTIONS,
    }
}

/// What a connection is doing, for the choice of which to close at the
/// cap.
struct Activity {
    /// When it last read a request or finished one.
    last: Mutex<Instant>,
    /// Requests in flight and subscriptions held.
    busy: AtomicUsize,
    /// Subscriptions held (part of `busy`).
    subscribed: AtomicUsize,
    /// The client process.
    peer: peers::PeerId,
    /// Closes it.
    close: CancellationToken,
}

impl Activity {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Counts one piece of work until the guard is dropped.
    fn working(self: &Arc<Self>) -> Working {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Working(self.clone())
    }

    /// Counts one subscription until the guard is dropped.
    fn subscribed(self: &Arc<Self>) -> Subscribed {
        self.subscribed.fetch_add(1, Ordering::SeqCst);
        Subscribed(self.working())
    }

    /// How readily it is closed to make room: 0 when it does nothing, 1
    /// when it only holds subscriptions (it is told by its end and may
    /// subscribe again), 2 when a request is in flight.
    fn rank(&self) -> u8 {
        let busy = self.busy.load(Ordering::SeqCst);
        if busy == 0 {
            0
        } else if busy == self.subscribed.load(Ordering::SeqCst) {
            1
        } else {
            2
        }
    }
}

/// A subscription held.
struct Subscribed(Working);

impl Drop for Subscribed {
    fn drop(&mut self) {
        (self.0).0.subscribed.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A request in flight or a subscription held.
struct Working(Arc<Activity>);

impl Drop for Working {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
        self.0.touch();
    }
}

impl Shared {
    /// Closes the connection (of `peer`, or of anyone with `None`) idle
    /// the longest, or, when none is idle, the one that only holds
    /// subscriptions and has the longest; false when every connection has
    /// a request in flight.
    fn close_idlest(&self, peer: Option<peers::PeerId>) -> bool {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let idlest = open
            .values()
            .filter(|a| peer.is_none_or(|p| a.peer == p))
            .filter(|a| a.rank() < 2 && !a.close.is_cancelled())
            .min_by_key(|a| (a.rank(), *a.last.lock().unwrap_or_else(|p| p.into_inner())));
        match idlest {
            Some(activity) => {
                activity.close.cancel();
                true
            }
            None => false,
        }
    }

    /// A permit for one more connection of `peer`: at its cap
    /// ([`protocol::MAX_CONNECTIONS_PER_PEER`]) the peer's connection idle
    /// the longest is closed to make room, and at the service's cap
    /// anyone's, as soon as one may be (within [`MAKE_ROOM_WAIT`]); `None`
    /// when none can make room.
    async fn admit(&self, peer: peers::PeerId) -> Option<OwnedSemaphorePermit> {
        if self.peers.connections_of(peer) >= protocol::MAX_CONNECTIONS_PER_PEER
            && !self.close_idlest(Some(peer))
        {
            return None;
        }
        if let Ok(permit) = self.connections.clone().try_acquire_owned() {
            return Some(permit);
        }
        let now = tokio::time::Instant::now();
        let waited_in_vain = self
            .no_room_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take_if(|until| now < *until)
            .is_some();
        if waited_in_vain {
            if !self.close_idlest(None) {
                // The last newcomer waited in vain: the clients that keep
                // every connection busy do not hold up the accept loop for
                // the next one too.
                self.refuse_without_waiting_until(now + MAKE_ROOM_WAIT);
                return None;
            }
            return self.permit_by(now + MAKE_ROOM_WAIT).await;
        }
        let deadline = now + MAKE_ROOM_WAIT;
        // Every connection may be in the middle of a request: on a busy
        // machine, each of a flood's `hello` and `subscribe` is still being
        // answered when the next client comes. One of them may be closed
        // moments later, once answered.
        while !self.close_idlest(None) {
            if tokio::time::Instant::now() >= deadline {
                self.refuse_without_waiting_until(deadline + MAKE_ROOM_WAIT);
                return None;
            }
            tokio::time::sleep(MAKE_ROOM_POLL).await;
            if let Ok(permit) = self.connections.clone().try_acquire_owned() {
                return Some(permit);
            }
        }
        self.permit_by(deadline).await
    }

    /// The permit of a connection closed to make room, once it ended, if
    /// by `deadline`.
    async fn permit_by(&self, deadline: tokio::time::Instant) -> Option<OwnedSemaphorePermit> {
        let wait = self.connections.clone().acquire_owned();
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(permit)) => Some(permit),
            _ => None,
        }
    }

    /// New connections at the cap are refused without waiting until
    /// `until`, unless one may be closed at once.
    fn refuse_without_waiting_until(&self, until: tokio::time::Instant) {
        *self.no_room_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    }
}

async fn accept_loop(listener: Listener, shared: Arc<Shared>, lock: ServiceLock) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shared.stop.cancelled() => break,
        };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!("the local API could not accept a client: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if !local_socket::peer_is_me(&stream) {
            tracing::warn!("the local API refused a client of another user");
            continue;
        }
        let peer = local_socket::peer_pid(&stream);
        let admitted = tokio::select! {
            admitted = shared.admit(peer) => admitted,
            () = shared.stop.cancelled() => break,
        };
        let Some(permit) = admitted else {
            tracing::warn!(
                "the local API refused a client: {} connections are open (at most {} per process), none of them idle",
                shared.cap,
                protocol::MAX_CONNECTIONS_PER_PEER
            );
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            serve_connection(stream.into_duplex(), peer, shared).await;
            drop(permit);
        });
    }
    // The socket goes with the listener, then service.json with the lock.
    drop(listener);
    drop(lock);
}
