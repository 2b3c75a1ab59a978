//! A counting global allocator, for tests that a hot path allocates nothing.
//!
//! Install it as the global allocator of a test binary, then count what a
//! closure allocates on the current thread:
//!
//! ```
//! use laned_testkit::alloc::{allocations_of, CountingAlloc};
//!
//! #[global_allocator]
//! static ALLOC: CountingAlloc = CountingAlloc::new();
//!
//! fn main() {
//!     assert_eq!(allocations_of(|| drop(std::hint::black_box(vec![1u8; 16]))), 1);
//!     assert_eq!(allocations_of(|| drop(std::hint::black_box([1u8; 16]))), 0);
//! }
//! ```
//!
//! Every allocation, zeroed allocation and reallocation counts as one, on the
//! thread that makes it. Counting per thread keeps other threads of the test
//! binary (the harness's, another test's) out of the count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    /// Allocations made by this thread through [`CountingAlloc`]. Const
    /// initialised and without destructor, so touching it never allocates.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count_one() {
    // Fails only while the thread is torn down: that allocation goes uncounted.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

/// The system allocator, counting each allocation on the thread making it.
#[derive(Debug, Default)]
pub struct CountingAlloc {
    _private: (),
}

impl CountingAlloc {
    /// The allocator, for a `#[global_allocator]` static.
    pub const fn new() -> CountingAlloc {
        CountingAlloc { _private: () }
    }
}

// SAFETY: every call is forwarded to `System` unchanged; counting touches a
// const-initialised thread local only, which neither allocates nor unwinds.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations made by the current thread so far.
pub fn thread_allocations() -> usize {
    ALLOCATIONS.try_with(Cell::get).unwrap_or(0)
}

/// How many allocations the current thread makes while running `f`.
///
/// Panics when [`CountingAlloc`] is not the global allocator, so a count of
/// zero always means that nothing was allocated.
pub fn allocations_of(f: impl FnOnce()) -> usize {
    assert_installed();
    let before = thread_allocations();
    f();
    thread_allocations() - before
}

/// Panics unless [`CountingAlloc`] is the global allocator: allocates once and
/// checks that it was counted.
pub fn assert_installed() {
    let before = thread_allocations();
    drop(std::hint::black_box(Box::new(0u8)));
    assert!(
        thread_allocations() > before,
        "laned_testkit::alloc::CountingAlloc is not the global allocator"
    );
}
