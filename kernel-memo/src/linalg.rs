//! For op authors on tract-linalg: memoized `OutputStore`s, keyed by the
//! output's shape and the kernel (and packing) picked for the turn, so only
//! the base pointer changes between turns of the same shape, and a turn of
//! another shape or kernel never reuses a store laid out for another.

use std::hash::Hash;

use tract_data::internal::TensorView;
use tract_linalg::mmm::{MatMatMul, OutputStore};

use crate::{Memo, MemoConfig};

/// Everything a store's layout depends on besides the output's shape: the
/// kernel (its name, and its tile: `mr` and `nr` size the panels) and the
/// packing it runs with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelId {
    name: String,
    mr: usize,
    nr: usize,
    packing: usize,
}

impl KernelId {
    /// The id of `mmm` running with packing number `packing`.
    pub fn of(mmm: &dyn MatMatMul, packing: usize) -> KernelId {
        KernelId {
            name: mmm.name().to_string(),
            mr: mmm.mr(),
            nr: mmm.nr(),
            packing,
        }
    }
}

/// Where the store's rows (m) and columns (n) sit in the output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Axes {
    /// The output axis holding the rows (m).
    pub m: usize,
    /// The output axis holding the columns (n).
    pub n: usize,
}

/// Output stores per key (a node, an output slot...), rebuilt when the
/// output's shape, the kernel, the packing or the axes change.
pub struct StoreMemo<K> {
    memo: Memo<(K, Axes), KernelId, OutputStore>,
}

impl<K: Hash + Eq + Clone> StoreMemo<K> {
    /// An empty memo keeping at most `config`'s bound of stores per key.
    pub fn new(config: MemoConfig) -> StoreMemo<K> {
        StoreMemo {
            memo: Memo::new(config),
        }
    }

    /// The store for writing `output` with `mmm` under `packing`.
    ///
    /// # Safety
    /// As tract-linalg's `OutputStoreSpec::wrap`: the store points into
    /// `output`'s buffer, which must outlive its use and not move.
    pub unsafe fn store(
        &mut self,
        key: &K,
        output: &TensorView,
        axes: Axes,
        mmm: &dyn MatMatMul,
        packing: usize,
    ) -> OutputStore {
        let kernel = KernelId::of(mmm, packing);
        let store = self
            .memo
            .get_or_build(&(key.clone(), axes), output.shape(), &kernel, |_, _| unsafe {
                mmm.c_view(Some(axes.m), Some(axes.n)).wrap(output)
            });
        // Same shape, same kernel: the strides hold, only the base moves.
        unsafe { store.with_tensor(output) }
    }

    /// Stores built so far (misses).
    pub fn builds(&self) -> u64 {
        self.memo.builds()
    }
}
