//! Recording from the hot path allocates nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use laned_metrics::Metrics;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A turn's worth of recording performs no heap allocation.
#[test]
fn recording_a_turn_allocates_nothing() {
    let metrics = Metrics::new(64);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for k in 0..1000u64 {
        metrics.record_turn((k % 64) as usize, Duration::from_micros(k));
        metrics.record_queue_wait(Duration::from_nanos(k * 7));
        metrics.set_lanes_taken(k as usize);
        metrics.record_failed_seats(1);
        metrics.record_admission_waited(Duration::from_micros(k));
    }
    let after = ALLOCATIONS.load(Ordering::Relaxed);
    assert_eq!(after - before, 0, "recording allocated {} times", after - before);
    // The counting allocator does see allocations: the snapshot makes some.
    let _ = metrics.snapshot();
    assert!(ALLOCATIONS.load(Ordering::Relaxed) > after);
}
