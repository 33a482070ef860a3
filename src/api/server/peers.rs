//! What each client process may hold, across all its connections, and
//! the subscriptions of the whole service: a peer past its share waits or
//! makes room from its own, and the oldest subscription makes room for a
//! new one, so that one process cannot lock the others out.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::api::protocol;

/// A client process (by its pid; `None` where the platform does not say).
pub(super) type PeerId = Option<u32>;

/// What one client process holds.
pub(super) struct Peer {
    /// Its requests not yet answered and written, over all its
    /// connections ([`protocol::MAX_IN_FLIGHT_PER_PEER`]).
    pub(super) in_flight: Arc<Semaphore>,
    /// Its open connections.
    connections: usize,
}

/// A subscription as the service counts it.
struct Held {
    peer: PeerId,
    /// Ends it with `lagged`.
    evict: CancellationToken,
}

/// Every peer and every subscription of a service.
#[derive(Default)]
pub(super) struct Peers {
    peers: Mutex<HashMap<PeerId, Arc<Mutex<Peer>>>>,
    /// Subscriptions by age (the smallest number is the oldest).
    subscriptions: Mutex<BTreeMap<u64, Held>>,
    next_subscription: AtomicU64,
}

/// A connection's place among its peer's: dropped with the connection,
/// and the peer is forgotten with its last one.
pub(super) struct Seat {
    peers: Arc<Peers>,
    id: PeerId,
    pub(super) peer: Arc<Semaphore>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut peers = self.peers.peers.lock().unwrap_or_else(|p| p.into_inner());
        let gone = match peers.get(&self.id) {
            Some(peer) => {
                let mut peer = peer.lock().unwrap_or_else(|p| p.into_inner());
                peer.connections = peer.connections.saturating_sub(1);
                peer.connections == 0
            }
            None => false,
        };
        if gone {
            peers.remove(&self.id);
        }
    }
}

/// A subscription's place among the service's; dropped when it ends.
pub(super) struct Ticket {
    peers: Arc<Peers>,
    number: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.peers
            .subscriptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.number);
    }
}

impl Peers {
    /// How many connections `id` has open.
    pub(super) fn connections_of(&self, id: PeerId) -> usize {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers
            .get(&id)
            .map(|p| p.lock().unwrap_or_else(|p| p.into_inner()).connections)
            .unwrap_or(0)
    }

    /// Counts one more connection of `id`.
    pub(super) fn seat(self: &Arc<Self>, id: PeerId) -> Seat {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let peer = peers.entry(id).or_insert_with(|| {
            Arc::new(Mutex::new(Peer {
                in_flight: Arc::new(Semaphore::new(protocol::MAX_IN_FLIGHT_PER_PEER)),
                connections: 0,
            }))
        });
        let mut held = peer.lock().unwrap_or_else(|p| p.into_inner());
        held.connections += 1;
        Seat {
            peers: self.clone(),
            id,
            peer: held.in_flight.clone(),
        }
    }

    /// Counts one more subscription of `id`; past
    /// [`protocol::MAX_SUBSCRIPTIONS_PER_PEER`] the peer's oldest, and past
    /// [`protocol::MAX_SUBSCRIPTIONS_TOTAL`] the service's oldest, ends
    /// with `lagged`. `evict` ends the new one the same way.
    pub(super) fn subscribe(self: &Arc<Self>, id: PeerId, evict: CancellationToken) -> Ticket {
        let mut subs = self.subscriptions.lock().unwrap_or_else(|p| p.into_inner());
        let mine = subs.values().filter(|h| h.peer == id).count();
        if mine >= protocol::MAX_SUBSCRIPTIONS_PER_PEER {
            let oldest = subs.iter().find(|(_, h)| h.peer == id).map(|(n, _)| *n);
            if let Some(held) = oldest.and_then(|n| subs.remove(&n)) {
                held.evict.cancel();
            }
        }
        if subs.len() >= protocol::MAX_SUBSCRIPTIONS_TOTAL {
            if let Some((_, held)) = subs.pop_first() {
                held.evict.cancel();
            }
        }
        let number = self.next_subscription.fetch_add(1, Ordering::Relaxed);
        subs.insert(number, Held { peer: id, evict });
        Ticket {
            peers: self.clone(),
            number,
        }
    }
}
