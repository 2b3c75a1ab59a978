//! A steady-state turn (same occupancy as the previous one) allocates
//! nothing for stacking its inputs. The only test of its binary: the
//! counting allocator sees this thread alone.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use laned_runner::Stacker;
use tract_core::internal::*;

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

fn allocations_of(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    f();
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

/// Stacking the same occupancy again reuses the buffer; alternating
/// occupancies stay within the memo's bound; a held buffer is never written.
#[test]
fn a_steady_turn_allocates_nothing_to_stack() {
    let rows: Vec<Tensor> = (0..5)
        .map(|s| Tensor::from_shape(&[1, 40, 4], &vec![s as f32; 160]).unwrap())
        .collect();
    let mut stacker = Stacker::default();
    let first = allocations_of(|| drop(stacker.stack(0, rows[..3].iter()).unwrap()));
    assert!(first > 0, "the first turn builds its buffer (the allocator counts)");
    let steady = allocations_of(|| drop(stacker.stack(0, rows[..3].iter()).unwrap()));
    assert_eq!(steady, 0, "a turn of the same occupancy allocated {steady} times");
    // 3, 5, 3, 5: both shapes stay in the memo.
    drop(stacker.stack(0, rows[..5].iter()).unwrap());
    let alternating = allocations_of(|| {
        for n in [3, 5, 3, 5] {
            drop(stacker.stack(0, rows[..n].iter()).unwrap());
        }
    });
    assert_eq!(alternating, 0);
    assert_eq!(stacker.builds(), 2);
    // The stacked rows are the seats' rows, in order.
    let stacked = stacker.stack(0, rows[..3].iter()).unwrap();
    let expected = Tensor::stack_tensors(0, &rows[..3].iter().collect::<Vec<_>>()).unwrap();
    assert_eq!(*stacked, expected);
    // While that value is held, the next stack of the shape gets a fresh buffer.
    let other = stacker.stack(0, rows[2..5].iter()).unwrap();
    assert_eq!(*stacked, expected, "a held buffer was overwritten");
    assert_ne!(*other, expected);
}
