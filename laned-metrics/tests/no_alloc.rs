//! Recording from the hot path allocates nothing.

use std::time::Duration;

use laned_metrics::Metrics;
/// Heap allocations `f` makes on this thread (allocation-counter's global
/// allocator counts them).
fn allocations_of(f: impl FnOnce()) -> u64 {
    allocation_counter::measure(f).count_total
}

/// A turn's worth of recording performs no heap allocation.
#[test]
fn recording_a_turn_allocates_nothing() {
    let metrics = Metrics::new(64);
    let recording = allocations_of(|| {
        for k in 0..1000u64 {
            metrics.record_turn((k % 64) as usize, Duration::from_micros(k));
            metrics.record_queue_wait(Duration::from_nanos(k * 7));
            metrics.set_lanes_taken(k as usize);
            metrics.record_failed_seats(1);
            metrics.record_admission_waited(Duration::from_micros(k));
        }
    });
    assert_eq!(recording, 0, "recording allocated {recording} times");
    // The counting allocator does see allocations: the snapshot makes some.
    let snapshot = allocations_of(|| {
        let _ = metrics.snapshot();
    });
    assert!(snapshot > 0);
}
