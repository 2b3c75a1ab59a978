//! Stacking seats' rows into a turn's batched input, in buffers reused from
//! turn to turn: kernel-memo keyed by (input slot, turn shape), so a turn of
//! another occupancy never writes into a buffer laid out for another.

use std::sync::Arc;

use kernel_memo::{Memo, MemoConfig};
use tract_core::internal::*;

/// Stacks rows along axis 0 into memoized buffers. A steady stream of turns
/// of the same shape allocates nothing once the buffer exists, provided the
/// previous turn's stacked value was dropped (the state drops its inputs at
/// the end of a run).
pub(crate) struct Stacker {
    buffers: Memo<usize, (), Arc<Tensor>>,
}

impl Default for Stacker {
    fn default() -> Stacker {
        Stacker::new(MemoConfig::default())
    }
}

impl Stacker {
    /// Keep `config.shapes_per_key()` turn shapes per input slot.
    pub(crate) fn new(config: MemoConfig) -> Stacker {
        Stacker {
            buffers: Memo::new(config),
        }
    }

    /// `rows` (each with 1 on axis 0, all of one shape and datum type)
    /// stacked on axis 0, for input slot `slot`.
    pub(crate) fn stack<'a>(
        &mut self,
        slot: usize,
        rows: impl ExactSizeIterator<Item = &'a Tensor> + Clone,
    ) -> TractResult<TValue> {
        let count = rows.len();
        let Some(first) = rows.clone().next() else {
            bail!("stacking no row for input {slot}")
        };
        let dt = first.datum_type();
        if !dt.is_copy() {
            let rows: TVec<&Tensor> = rows.collect();
            return Ok(Tensor::stack_tensors(0, &rows)?.into_tvalue());
        }
        ensure!(
            first.rank() > 0 && first.shape()[0] == 1,
            "input {slot}: a row has 1 on axis 0, got {:?}",
            first.shape()
        );
        let mut shape: TVec<usize> = first.shape().into();
        shape[0] = count;
        let buffer = self
            .buffers
            .get_or_try_build(&slot, &shape, &(), |shape, _| -> TractResult<Arc<Tensor>> {
                // SAFETY: `dt` is a plain-data type (`is_copy`, checked
                // above), so its bytes need no drop and no constructor; and
                // no byte of the buffer is read before it is written: the
                // loop below writes `count` rows of `row` bytes (the whole
                // tensor, its shape being a row's with `count` on axis 0),
                // and the buffer is handed out only after every seat is
                // written (the check after the loop).
                Ok(Arc::new(unsafe { Tensor::uninitialized_dt(dt, shape)? }))
            })?;
        if Arc::get_mut(buffer).is_none() {
            // The previous turn's value of this shape is still held somewhere:
            // never write under it; take a fresh buffer instead.
            // SAFETY: as for the buffer built above: a plain-data type, and
            // every byte written by the loop below before the buffer is
            // handed out.
            *buffer = Arc::new(unsafe { Tensor::uninitialized_dt(dt, &shape)? });
        }
        let tensor = Arc::get_mut(buffer).expect("unique");
        let row = first.len() * dt.size_of();
        let bytes = tensor.as_bytes_mut();
        let mut written = 0;
        for (seat, t) in rows.enumerate() {
            ensure!(
                t.datum_type() == dt,
                "input {slot}: seat {seat} is {:?}, seat 0 {dt:?}",
                t.datum_type()
            );
            ensure!(
                t.shape() == first.shape(),
                "input {slot}: seat {seat} has shape {:?}, seat 0 {:?}",
                t.shape(),
                first.shape()
            );
            let src = t.as_bytes();
            bytes[seat * row..(seat + 1) * row].copy_from_slice(src);
            written += 1;
        }
        // An iterator shorter than it said would leave rows unwritten.
        ensure!(
            written == count,
            "input {slot}: {written} rows stacked, {count} announced"
        );
        Ok(TValue::from_const(buffer.clone()))
    }

    /// Buffers built so far (misses of the memo).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn builds(&self) -> u64 {
        self.buffers.builds()
    }

    /// Drop every buffer (the engine closing).
    pub(crate) fn clear(&mut self) {
        self.buffers.clear()
    }
}

#[cfg(all(test, not(loom)))]
pub(crate) mod tests {
    //! A steady-state turn (same occupancy as the previous one) allocates
    //! nothing for stacking its inputs. The counting allocator counts this
    //! thread's allocations alone.

    use super::*;

    /// Heap allocations `f` makes on this thread (allocation-counter's
    /// global allocator, linked into the unit tests, counts them).
    pub(crate) fn allocations_of(f: impl FnOnce()) -> u64 {
        allocation_counter::measure(f).count_total
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
}
