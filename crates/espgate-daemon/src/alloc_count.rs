//! Allocation accounting for the hot path.
//!
//! The `espgate` binary installs [`CountingAlloc`] as its global allocator.
//! It forwards everything to the system allocator and, while the calling
//! thread is inside a [`hot`] section (the data plane's packet handlers),
//! counts the allocations made. `espgate status` shows the total as the
//! counter `hot_path_allocs`; the end-to-end test runs traffic through a
//! gateway pair and checks that the count does not grow with the packets
//! (zero allocations per packet in the steady state).
//!
//! Cost: a thread-local flag test per allocation, nothing per packet.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

static HOT_ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static IN_HOT: Cell<bool> = const { Cell::new(false) };
}

/// The global allocator of the `espgate` binary: the system allocator,
/// counting allocations made inside [`hot`] sections.
pub struct CountingAlloc;

fn note() {
    // `try_with`: during thread teardown the flag may be gone; then the
    // thread is certainly not in a hot section.
    if IN_HOT.try_with(Cell::get).unwrap_or(false) {
        HOT_ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the same arguments; the
// counting touches only an atomic and a const-initialised thread-local
// `Cell`, neither of which allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: as above; `ptr` came from this allocator, i.e. from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Marks the current thread as on the hot path until the guard drops.
pub fn hot() -> HotGuard {
    let was = IN_HOT.with(|f| f.replace(true));
    HotGuard { was }
}

/// Marks the current thread as off the hot path until the guard drops:
/// for work done once per many packets (a sequence-number reservation
/// written to disk every `seqstate::STEP` packets), which is amortised
/// rather than per packet.
pub fn cold() -> HotGuard {
    let was = IN_HOT.with(|f| f.replace(false));
    HotGuard { was }
}

/// See [`hot`] and [`cold`].
pub struct HotGuard {
    was: bool,
}

impl Drop for HotGuard {
    fn drop(&mut self) {
        IN_HOT.with(|f| f.set(self.was));
    }
}

/// Allocations counted inside hot sections since the process started
/// (0 when the binary does not use [`CountingAlloc`], e.g. in unit tests).
pub fn hot_allocs() -> u64 {
    HOT_ALLOCS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_nest_and_restore() {
        assert!(!IN_HOT.with(Cell::get));
        {
            let _a = hot();
            assert!(IN_HOT.with(Cell::get));
            {
                let _b = hot();
            }
            assert!(IN_HOT.with(Cell::get));
        }
        assert!(!IN_HOT.with(Cell::get));
    }
}
