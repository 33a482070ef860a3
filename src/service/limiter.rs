//! A counting semaphore with a second, per-key bound (the host) and a
//! per-gem share, that serves urgent waiters first and shares the rest
//! fairly between gems.
//!
//! `tokio::sync::Semaphore` is strictly first-come first-served. The service
//! needs more: an on-demand lookup (a tool waiting for its file) goes ahead
//! of queued background downloads, even when its download was already queued
//! in the background (its urgency flag flips while it waits); background
//! downloads of a gem that declares many files must not starve a gem that
//! declares one; and no host gets more than its share of slots.
//!
//! Both bounds are taken together, in one step: a waiter gets a slot only
//! when a global slot and a slot of its host are both free. (Taking a host
//! slot and then waiting for a global one would let a queued background job
//! sit on its host's slot, so that an urgent lookup for the same host could
//! not even join the queue for the global slot.) A released slot goes to the
//! oldest urgent waiter that can take it, else to the waiter that can take it
//! whose gem has been served least.
//!
//! No gem holds every slot: a gem may hold at most all slots but one (with a
//! single slot, that one). A gem whose files sit on several hosts, or whose
//! server drips bytes just fast enough not to stall, can therefore never
//! keep another gem from starting a download.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// A bounded number of slots, and at most `per_key` of them per key.
#[derive(Debug)]
pub(crate) struct Limiter {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Free slots.
    available: usize,
    /// Slots one key may hold at once.
    per_key: usize,
    /// Slots one gem may hold at once: all but one.
    per_gem: usize,
    /// Slots held per gem.
    held_by_gem: HashMap<String, usize>,
    /// Slots held per key.
    held: HashMap<String, usize>,
    /// Waiting acquirers, by gem and key, each queue oldest first. Waiters
    /// of one queue can all take a slot or none can, so choosing the next
    /// one costs a look per queue, not per waiter.
    queues: Vec<Queue>,
    /// Slots handed out per gem so far, for fair sharing.
    served: HashMap<String, u64>,
    /// Next waiter id.
    next_id: u64,
    /// Whether a waiter may be urgent: set when one arrives urgent or is
    /// flagged urgent while waiting ([`Limiter::urgent_flagged`]), cleared
    /// when a look finds none. Without it, every released slot would look
    /// at every waiter.
    maybe_urgent: bool,
}

#[derive(Debug)]
struct Queue {
    gem: String,
    key: String,
    waiters: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    /// Arrival order over all queues.
    id: u64,
    urgent: Arc<AtomicBool>,
    wake: oneshot::Sender<()>,
}

/// A held slot; released on drop.
#[derive(Debug)]
pub(crate) struct Permit {
    limiter: Arc<Limiter>,
    gem: String,
    key: String,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.limiter.release(&self.gem, &self.key);
    }
}

/// Removes a waiter whose acquire was abandoned, or gives back the slot it
/// was handed just before.
struct Pending<'a> {
    limiter: &'a Arc<Limiter>,
    id: u64,
    gem: String,
    key: String,
    done: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.limiter.lock();
        let was_waiting = state.forget(&self.gem, &self.key, self.id);
        drop(state);
        if !was_waiting {
            // The slot was handed over while the acquirer went away.
            self.limiter.release(&self.gem, &self.key);
        }
    }
}

impl State {
    /// Removes waiter `id` of the queue of `gem` and `key`; whether it was
    /// still waiting.
    fn forget(&mut self, gem: &str, key: &str, id: u64) -> bool {
        let Some(q) = self.queue_index(gem, key) else {
            return false;
        };
        let queue = &mut self.queues[q].waiters;
        let Some(i) = queue.iter().position(|w| w.id == id) else {
            return false;
        };
        queue.remove(i);
        if queue.is_empty() {
            self.queues.swap_remove(q);
        }
        true
    }

    fn queue_index(&self, gem: &str, key: &str) -> Option<usize> {
        self.queues
            .iter()
            .position(|q| q.gem == gem && q.key == key)
    }

    fn can_take(&self, gem: &str, key: &str) -> bool {
        self.available > 0
            && self.held.get(key).copied().unwrap_or(0) < self.per_key
            && self.held_by_gem.get(gem).copied().unwrap_or(0) < self.per_gem
    }

    fn take(&mut self, gem: &str, key: &str) {
        self.available -= 1;
        *self.held.entry(key.to_string()).or_default() += 1;
        *self.held_by_gem.entry(gem.to_string()).or_default() += 1;
        *self.served.entry(gem.to_string()).or_default() += 1;
    }

    fn give_back(&mut self, gem: &str, key: &str) {
        self.available += 1;
        decrement(&mut self.held, key);
        decrement(&mut self.held_by_gem, gem);
    }
}

/// Counts one slot fewer for `name`, forgetting it at zero.
fn decrement(counts: &mut HashMap<String, usize>, name: &str) {
    if let Some(n) = counts.get_mut(name) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(name);
        }
    }
}

impl Limiter {
    /// A limiter with `slots` slots, at most `per_key` of them per key and
    /// at most `slots - 1` (at least one) per gem.
    pub(crate) fn new(slots: usize, per_key: usize) -> Arc<Limiter> {
        Arc::new(Limiter {
            state: Mutex::new(State {
                available: slots,
                per_key,
                per_gem: slots.saturating_sub(1).max(1),
                held_by_gem: HashMap::new(),
                held: HashMap::new(),
                queues: Vec::new(),
                served: HashMap::new(),
                next_id: 0,
                maybe_urgent: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a slot for `key`. `urgent` may flip to true while waiting.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        gem: &str,
        key: &str,
        urgent: &Arc<AtomicBool>,
    ) -> Permit {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut state = self.lock();
            // Every waiter that could take a slot was handed one when the
            // slot came free, so a free slot here is nobody else's.
            if state.can_take(gem, key) {
                state.take(gem, key);
                return Permit {
                    limiter: self.clone(),
                    gem: gem.to_string(),
                    key: key.to_string(),
                };
            }
            let id = state.next_id;
            state.next_id += 1;
            if urgent.load(Ordering::Relaxed) {
                state.maybe_urgent = true;
            }
            let waiter = Waiter {
                id,
                urgent: urgent.clone(),
                wake: tx,
            };
            match state.queue_index(gem, key) {
                Some(q) => state.queues[q].waiters.push_back(waiter),
                None => state.queues.push(Queue {
                    gem: gem.to_string(),
                    key: key.to_string(),
                    waiters: VecDeque::from([waiter]),
                }),
            }
            id
        };
        let mut pending = Pending {
            limiter: self,
            id,
            gem: gem.to_string(),
            key: key.to_string(),
            done: false,
        };
        // The sender is only dropped after a send, or with the limiter.
        let _ = rx.await;
        pending.done = true;
        Permit {
            limiter: self.clone(),
            gem: gem.to_string(),
            key: key.to_string(),
        }
    }

    /// Waiters waiting now (for status and tests).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.lock().queues.iter().map(|q| q.waiters.len()).sum()
    }

    /// Slots `gem` holds now (for tests).
    #[cfg(test)]
    pub(crate) fn held_by(&self, gem: &str) -> usize {
        self.lock().held_by_gem.get(gem).copied().unwrap_or(0)
    }

    /// Says that a waiter's urgent flag was just set.
    pub(crate) fn urgent_flagged(&self) {
        self.lock().maybe_urgent = true;
    }

    fn release(&self, gem: &str, key: &str) {
        let mut state = self.lock();
        state.give_back(gem, key);
        while let Some((q, i)) = pick(&mut state) {
            let queue = &mut state.queues[q];
            let (gem, key) = (queue.gem.clone(), queue.key.clone());
            let Some(waiter) = queue.waiters.remove(i) else {
                break;
            };
            if queue.waiters.is_empty() {
                state.queues.swap_remove(q);
            }
            state.take(&gem, &key);
            if waiter.wake.send(()).is_err() {
                // That acquirer is gone; offer the slot to the next one.
                state.give_back(&gem, &key);
            }
        }
    }
}

/// The waiter that gets the next slot, among those that can take one, as
/// (queue, position in it): the oldest urgent one, else the oldest of the
/// gem served least.
fn pick(state: &mut State) -> Option<(usize, usize)> {
    if state.maybe_urgent {
        let (found, any) = oldest_urgent(state);
        if found.is_some() {
            return found;
        }
        state.maybe_urgent = any;
    }
    state
        .queues
        .iter()
        .enumerate()
        .filter(|(_, q)| state.can_take(&q.gem, &q.key))
        .filter_map(|(qi, q)| {
            let front = q.waiters.front()?;
            let served = state.served.get(&q.gem).copied().unwrap_or(0);
            Some((served, front.id, qi))
        })
        .min()
        .map(|(_, _, q)| (q, 0))
}

/// The oldest urgent waiter that can take a slot, if any, and whether any
/// waiter is urgent at all.
fn oldest_urgent(state: &State) -> (Option<(usize, usize)>, bool) {
    let mut any = false;
    let mut oldest: Option<(u64, usize, usize)> = None;
    for (qi, q) in state.queues.iter().enumerate() {
        let Some((i, w)) = q
            .waiters
            .iter()
            .enumerate()
            .find(|(_, w)| w.urgent.load(Ordering::Relaxed))
        else {
            continue;
        };
        any = true;
        if state.can_take(&q.gem, &q.key) && oldest.is_none_or(|(id, _, _)| w.id < id) {
            oldest = Some((w.id, qi, i));
        }
    }
    (oldest.map(|(_, q, i)| (q, i)), any)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag(v: bool) -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(v))
    }

    /// `work` (an acquire that must succeed, a task holding one), bounded:
    /// on the paused clock of these tests the minute passes at once when
    /// every task waits, so a slot never handed out fails the test with
    /// `what` instead of hanging it.
    async fn soon<T>(what: &str, work: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(60), work)
            .await
            .unwrap_or_else(|_| panic!("{what}: still waiting, no slot was handed out"))
    }

    #[tokio::test(start_paused = true)]
    async fn never_more_than_the_slots() {
        let limiter = Limiter::new(2, 2);
        let a = limiter.acquire("g", "h", &flag(false)).await;
        let _b = limiter.acquire("other", "h", &flag(false)).await;
        let l2 = limiter.clone();
        let third = tokio::spawn(async move { l2.acquire("g", "h", &flag(false)).await });
        tokio::task::yield_now().await;
        while limiter.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!third.is_finished());
        drop(a);
        soon("the third acquire after a slot was released", third)
            .await
            .unwrap();
    }

    async fn order_of_service(waiters: Vec<(&'static str, bool)>) -> Vec<&'static str> {
        let limiter = Limiter::new(1, 1);
        let held = limiter.acquire("holder", "h", &flag(false)).await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut flags = Vec::new();
        for (gem, urgent) in waiters.iter().copied() {
            let (l, tx, f) = (limiter.clone(), tx.clone(), flag(urgent));
            flags.push(f.clone());
            let before = limiter.waiting();
            tokio::spawn(async move {
                let permit = l.acquire(gem, "h", &f).await;
                tx.send(gem).unwrap();
                drop(permit);
            });
            while limiter.waiting() == before {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        let mut out = Vec::new();
        for _ in 0..waiters.len() {
            out.push(soon("the next waiter served", rx.recv()).await.unwrap());
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn urgent_waiters_go_first() {
        let order = order_of_service(vec![("bg1", false), ("bg2", false), ("now", true)]).await;
        assert_eq!(order[0], "now");
    }

    #[tokio::test(start_paused = true)]
    async fn gems_share_slots_fairly() {
        let order = order_of_service(vec![
            ("many", false),
            ("many", false),
            ("many", false),
            ("one", false),
        ])
        .await;
        // "one" is served before the third file of "many".
        let one = order.iter().position(|g| *g == "one").unwrap();
        assert!(one <= 1, "{order:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_acquire_does_not_leak_a_slot() {
        let limiter = Limiter::new(1, 1);
        let held = limiter.acquire("g", "h", &flag(false)).await;
        let l2 = limiter.clone();
        let waiting = tokio::spawn(async move { l2.acquire("g", "h", &flag(false)).await });
        while limiter.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        waiting.abort();
        let _ = waiting.await;
        drop(held);
        let _again = soon(
            "an acquire after an abandoned one",
            limiter.acquire("g", "h", &flag(false)),
        )
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_key_does_not_hold_back_other_keys() {
        let limiter = Limiter::new(2, 1);
        let _a = limiter.acquire("g", "busy", &flag(false)).await;
        let l2 = limiter.clone();
        let same = tokio::spawn(async move { l2.acquire("g", "busy", &flag(false)).await });
        while limiter.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        // The second slot is free, and another key takes it at once.
        let _b = limiter.acquire("other", "free", &flag(false)).await;
        assert!(!same.is_finished());
    }

    #[tokio::test(start_paused = true)]
    async fn no_gem_holds_every_slot_while_another_gem_waits() {
        // Two slots, each host may use both: gem "many" gets one, and its
        // second file (on another host) waits although a slot is free, so
        // that gem "one" starts at once.
        let limiter = Limiter::new(2, 2);
        let first = limiter.acquire("many", "a.test", &flag(false)).await;
        let l2 = limiter.clone();
        let second = tokio::spawn(async move { l2.acquire("many", "b.test", &flag(false)).await });
        // The spawned acquire has either queued or taken a slot once it ran.
        while limiter.waiting() == 0 && !second.is_finished() {
            tokio::task::yield_now().await;
        }
        assert_eq!(limiter.held_by("many"), 1);
        let other = soon(
            "the other gem's first slot",
            limiter.acquire("one", "c.test", &flag(false)),
        )
        .await;
        assert_eq!(limiter.held_by("one"), 1);
        assert!(!second.is_finished());
        // When the other gem is done, the waiting file of "many" still
        // waits for its own gem's slot; when that frees, it runs.
        drop(other);
        assert_eq!(limiter.waiting(), 1);
        drop(first);
        let _second = soon("the gem's own slot, given back", second)
            .await
            .unwrap();
        assert_eq!(limiter.held_by("many"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_single_slot_is_a_gem_share_of_one() {
        let limiter = Limiter::new(1, 1);
        let held = soon(
            "the only slot, free",
            limiter.acquire("g", "h", &flag(false)),
        )
        .await;
        assert_eq!(limiter.held_by("g"), 1);
        drop(held);
        let _again = soon(
            "the only slot, given back",
            limiter.acquire("g", "h", &flag(false)),
        )
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_flagged_urgent_while_waiting_keeps_its_turn_while_its_key_is_busy() {
        // Two slots, one per key: A holds "h", X holds "k". E then C wait for
        // "h", B for "k"; C is flagged urgent while waiting. X's slot goes to
        // B (C cannot use "k"); A's slot must then go to C, not to the older E.
        let limiter = Limiter::new(2, 1);
        let a = limiter.acquire("a", "h", &flag(false)).await;
        let x = limiter.acquire("x", "k", &flag(false)).await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let c_flag = flag(false);
        let mut permits = Vec::new();
        for (gem, key, f) in [
            ("e", "h", flag(false)),
            ("c", "h", c_flag.clone()),
            ("b", "k", flag(false)),
        ] {
            let (l, tx) = (limiter.clone(), tx.clone());
            let before = limiter.waiting();
            permits.push(tokio::spawn(async move {
                let permit = l.acquire(gem, key, &f).await;
                tx.send(gem).unwrap();
                permit
            }));
            while limiter.waiting() == before {
                tokio::task::yield_now().await;
            }
        }
        c_flag.store(true, Ordering::Relaxed);
        limiter.urgent_flagged();
        drop(x);
        assert_eq!(soon("B served", rx.recv()).await.unwrap(), "b");
        drop(a);
        assert_eq!(soon("C served", rx.recv()).await.unwrap(), "c");
        drop(permits);
    }

    #[tokio::test(start_paused = true)]
    async fn an_urgent_waiter_for_a_busy_key_goes_ahead_of_background_waiters() {
        // One global slot, two per key: A runs; B (background) and C
        // (urgent), both for A's key, wait. C must get the slot A frees.
        let limiter = Limiter::new(1, 2);
        let a = limiter.acquire("a", "h", &flag(false)).await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for (gem, urgent) in [("b", false), ("c", true)] {
            let (l, tx) = (limiter.clone(), tx.clone());
            let before = limiter.waiting();
            tokio::spawn(async move {
                let permit = l.acquire(gem, "h", &flag(urgent)).await;
                tx.send(gem).unwrap();
                drop(permit);
            });
            while limiter.waiting() == before {
                tokio::task::yield_now().await;
            }
        }
        drop(a);
        assert_eq!(soon("C served", rx.recv()).await.unwrap(), "c");
        assert_eq!(soon("B served", rx.recv()).await.unwrap(), "b");
    }
}
