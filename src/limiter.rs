//! A counting semaphore that serves urgent waiters first and shares the rest
//! fairly between gems.
//!
//! `tokio::sync::Semaphore` is strictly first-come first-served. The service
//! needs two more things: an on-demand lookup (a tool waiting for its file)
//! goes ahead of queued background downloads, even when its download was
//! already queued in the background (its urgency flag flips while it waits);
//! and background downloads of a gem that declares many files must not starve
//! a gem that declares one. So a released slot goes to the oldest urgent
//! waiter, else to the waiter whose gem has been served least.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// A bounded number of slots.
#[derive(Debug)]
pub(crate) struct Limiter {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Free slots.
    available: usize,
    /// Waiting acquirers, oldest first.
    waiters: Vec<Waiter>,
    /// Slots handed out per gem so far, for fair sharing.
    served: HashMap<String, u64>,
    /// Next waiter id.
    next_id: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    gem: String,
    urgent: Arc<AtomicBool>,
    wake: oneshot::Sender<()>,
}

/// A held slot; released on drop.
#[derive(Debug)]
pub(crate) struct Permit {
    limiter: Arc<Limiter>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.limiter.release();
    }
}

/// Removes a waiter whose acquire was abandoned, or gives back the slot it
/// was handed just before.
struct Pending<'a> {
    limiter: &'a Arc<Limiter>,
    id: u64,
    done: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.limiter.lock();
        let before = state.waiters.len();
        state.waiters.retain(|w| w.id != self.id);
        let was_waiting = state.waiters.len() != before;
        drop(state);
        if !was_waiting {
            // The slot was handed over while the acquirer went away.
            self.limiter.release();
        }
    }
}

impl Limiter {
    /// A limiter with `slots` slots.
    pub(crate) fn new(slots: usize) -> Arc<Limiter> {
        Arc::new(Limiter {
            state: Mutex::new(State {
                available: slots,
                waiters: Vec::new(),
                served: HashMap::new(),
                next_id: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a slot. `urgent` may flip to true while waiting.
    pub(crate) async fn acquire(self: &Arc<Self>, gem: &str, urgent: &Arc<AtomicBool>) -> Permit {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut state = self.lock();
            if state.available > 0 && state.waiters.is_empty() {
                state.available -= 1;
                *state.served.entry(gem.to_string()).or_default() += 1;
                return Permit {
                    limiter: self.clone(),
                };
            }
            let id = state.next_id;
            state.next_id += 1;
            state.waiters.push(Waiter {
                id,
                gem: gem.to_string(),
                urgent: urgent.clone(),
                wake: tx,
            });
            id
        };
        let mut pending = Pending {
            limiter: self,
            id,
            done: false,
        };
        // The sender is only dropped after a send, or with the limiter.
        let _ = rx.await;
        pending.done = true;
        Permit {
            limiter: self.clone(),
        }
    }

    /// Waiters waiting now (for status and tests).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.lock().waiters.len()
    }

    fn release(&self) {
        let mut state = self.lock();
        loop {
            let Some(index) = pick(&state) else {
                state.available += 1;
                return;
            };
            let waiter = state.waiters.remove(index);
            *state.served.entry(waiter.gem.clone()).or_default() += 1;
            if waiter.wake.send(()).is_ok() {
                return;
            }
            // That acquirer is gone; offer the slot to the next one.
        }
    }
}

/// The waiter that gets the next slot.
fn pick(state: &State) -> Option<usize> {
    if let Some(i) = state.waiters.iter().position(|w| w.urgent.load(Ordering::Relaxed)) {
        return Some(i);
    }
    state
        .waiters
        .iter()
        .enumerate()
        .min_by_key(|(i, w)| (state.served.get(&w.gem).copied().unwrap_or(0), *i))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag(v: bool) -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(v))
    }

    #[tokio::test]
    async fn never_more_than_the_slots() {
        let limiter = Limiter::new(2);
        let a = limiter.acquire("g", &flag(false)).await;
        let _b = limiter.acquire("g", &flag(false)).await;
        let l2 = limiter.clone();
        let third = tokio::spawn(async move { l2.acquire("g", &flag(false)).await });
        tokio::task::yield_now().await;
        while limiter.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!third.is_finished());
        drop(a);
        third.await.unwrap();
    }

    async fn order_of_service(waiters: Vec<(&'static str, bool)>) -> Vec<&'static str> {
        let limiter = Limiter::new(1);
        let held = limiter.acquire("holder", &flag(false)).await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut flags = Vec::new();
        for (gem, urgent) in waiters.iter().copied() {
            let (l, tx, f) = (limiter.clone(), tx.clone(), flag(urgent));
            flags.push(f.clone());
            let before = limiter.waiting();
            tokio::spawn(async move {
                let permit = l.acquire(gem, &f).await;
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
            out.push(rx.recv().await.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn urgent_waiters_go_first() {
        let order = order_of_service(vec![("bg1", false), ("bg2", false), ("now", true)]).await;
        assert_eq!(order[0], "now");
    }

    #[tokio::test]
    async fn gems_share_slots_fairly() {
        let order =
            order_of_service(vec![("many", false), ("many", false), ("many", false), ("one", false)]).await;
        // "one" is served before the third file of "many".
        let one = order.iter().position(|g| *g == "one").unwrap();
        assert!(one <= 1, "{order:?}");
    }

    #[tokio::test]
    async fn an_abandoned_acquire_does_not_leak_a_slot() {
        let limiter = Limiter::new(1);
        let held = limiter.acquire("g", &flag(false)).await;
        let l2 = limiter.clone();
        let waiting = tokio::spawn(async move { l2.acquire("g", &flag(false)).await });
        while limiter.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        waiting.abort();
        let _ = waiting.await;
        drop(held);
        let _again = limiter.acquire("g", &flag(false)).await;
    }
}
