//! Shared checks for the fuzz targets: an allocation meter, the independent
//! IANA classifier, and the manifest form of a list of resources.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

#[path = "../../tests/it/prop_iana.rs"]
pub mod iana;

/// Counts live heap bytes and their peak, so a target can assert that a
/// parser allocates no more than a small multiple of its input.
struct Metered;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Metered {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            if new_size >= layout.size() {
                let grow = new_size - layout.size();
                let live = LIVE.fetch_add(grow, Ordering::Relaxed) + grow;
                PEAK.fetch_max(live, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Metered = Metered;

/// How many heap bytes one parse may hold at once, per input byte.
pub const BYTES_PER_INPUT_BYTE: usize = 64;
/// Heap bytes any parse may hold regardless of its input's length (the TOML
/// parser alone keeps about 100 KiB of working state for a small input).
pub const BASE_BYTES: usize = 256 * 1024;

/// Runs `parse` and panics when the heap grew by more than
/// `BYTES_PER_INPUT_BYTE * input_len + BASE_BYTES` at any moment.
pub fn metered<T>(what: &str, input_len: usize, parse: impl FnOnce() -> T) -> T {
    let start = LIVE.load(Ordering::Relaxed);
    PEAK.store(start, Ordering::Relaxed);
    let out = parse();
    let grown = PEAK.load(Ordering::Relaxed).saturating_sub(start);
    let limit = BYTES_PER_INPUT_BYTE * input_len + BASE_BYTES;
    assert!(
        grown <= limit,
        "{what} held {grown} heap bytes for a {input_len}-byte input (limit {limit})"
    );
    out
}

pub use gem_resources::manifest::manifest_json;

/// Panics unless `url` is an address a transfer may use: `https`, no
/// credentials, a host.
pub fn assert_usable_url(url: &url::Url) {
    assert_eq!(url.scheme(), "https", "{url}");
    assert!(
        url.username().is_empty() && url.password().is_none(),
        "{url}"
    );
    assert!(url.host().is_some(), "{url}");
}
