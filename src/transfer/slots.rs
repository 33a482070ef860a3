//! Download slots that go to the next download once a file's bytes are in.
//!
//! A file whose bytes all arrived and matched its size and SHA-256 still
//! has local work left: flushing it, naming it, making its folders durable
//! (`Store::publish`). Its slot goes to the next download meanwhile
//! ([`Handover::transferred`]), so the network does not wait on the disk,
//! when a place among the files being published is free: there are enough
//! places for two groups of files made durable together (see
//! `store::publish`), and a disk slower than the network then slows the
//! transfers instead of piling up files that wait for it.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A download's slot `S` (held while its transfer lasts), handed over once
/// its bytes are in when a place among the files being published is free.
#[derive(Debug)]
pub struct Handover<S> {
    slot: Option<S>,
    place: Option<OwnedSemaphorePermit>,
    places: Arc<Semaphore>,
}

impl<S> Handover<S> {
    /// Holds `slot`; `places` are the places among the files being
    /// published.
    pub fn new(slot: S, places: &Arc<Semaphore>) -> Handover<S> {
        Handover {
            slot: Some(slot),
            place: None,
            places: Arc::clone(places),
        }
    }

    /// The transfer is over and its bytes verified: the slot is given back
    /// (dropped) when a place is free, which is then held until `self` is
    /// dropped; else the slot is kept.
    pub fn transferred(&mut self) {
        if self.slot.is_none() {
            return;
        }
        if let Ok(place) = Arc::clone(&self.places).try_acquire_owned() {
            self.place = Some(place);
            self.slot = None;
        }
    }

    /// Whether the slot is still held.
    pub fn holds_slot(&self) -> bool {
        self.slot.is_some()
    }
}

/// Slots for downloads run side by side (`fetch`): `parallel` transfers at
/// once, and as many places for files being published without a slot. Run
/// [`Slots::jobs`] downloads at once, each taking a slot first.
#[derive(Debug)]
pub struct Slots {
    transfers: Arc<Semaphore>,
    places: Arc<Semaphore>,
    parallel: usize,
    places_n: usize,
}

/// Places among the files being published for `parallel` transfers: as
/// many, and at least two groups' worth (see `store::publish`), so that
/// one group fills while the one before it is made durable.
pub fn publishing_places(parallel: usize) -> usize {
    parallel.max(2 * crate::store::GROUP_FILES)
}

impl Slots {
    /// `parallel` transfers (at least one) and [`publishing_places`] places.
    pub fn new(parallel: usize) -> Slots {
        Slots::with_places(parallel, publishing_places(parallel))
    }

    /// `parallel` transfers and `places` places (each at least one).
    pub fn with_places(parallel: usize, places: usize) -> Slots {
        let (parallel, places) = (parallel.max(1), places.max(1));
        Slots {
            transfers: Arc::new(Semaphore::new(parallel)),
            places: Arc::new(Semaphore::new(places)),
            parallel,
            places_n: places,
        }
    }

    /// How many downloads to run at once: every transfer, and every file
    /// being published without a slot.
    pub fn jobs(&self) -> usize {
        self.parallel + self.places_n
    }

    /// Waits for a transfer's slot (first come, first served).
    pub async fn take(&self) -> Handover<OwnedSemaphorePermit> {
        let transfer = Arc::clone(&self.transfers).acquire_owned().await;
        Handover {
            // The semaphore is never closed: it lives as long as `self`.
            slot: transfer.ok(),
            place: None,
            places: Arc::clone(&self.places),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    /// Whether `slots` hands out a slot within a moment.
    async fn free(slots: &Slots) -> Option<Handover<OwnedSemaphorePermit>> {
        tokio::time::timeout(Duration::from_millis(50), slots.take())
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_slot_goes_to_the_next_download_once_the_bytes_are_in_while_places_are_free() {
        let slots = Slots::with_places(1, 1);
        assert_eq!(slots.jobs(), 2);
        let mut first = slots.take().await;
        assert!(free(&slots).await.is_none(), "one transfer at a time");
        first.transferred();
        assert!(!first.holds_slot());
        // The first file is still being published: the next transfer runs.
        let mut second = free(&slots).await.expect("the slot was handed over");
        // No place left for a second file being published: the slot stays
        // with its download until that one is done.
        second.transferred();
        assert!(second.holds_slot());
        assert!(free(&slots).await.is_none());
        drop(first);
        second.transferred();
        assert!(!second.holds_slot());
        assert!(free(&slots).await.is_some());
    }

    #[tokio::test]
    async fn a_download_that_ends_without_its_bytes_gives_its_slot_back_when_it_ends() {
        let slots = Slots::with_places(1, 1);
        let failed = slots.take().await;
        assert!(free(&slots).await.is_none());
        drop(failed);
        assert!(free(&slots).await.is_some());
    }

    #[test]
    fn any_slot_is_handed_over_the_same_way() {
        let places = Arc::new(Semaphore::new(1));
        let mut a = Handover::new("a", &places);
        let mut b = Handover::new("b", &places);
        a.transferred();
        b.transferred();
        assert!(!a.holds_slot());
        assert!(b.holds_slot(), "no place was left");
        assert_eq!(places.available_permits(), 0);
        drop(a);
        assert_eq!(places.available_permits(), 1);
    }
}
