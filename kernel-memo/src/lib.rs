//! Stores and buffers keyed by shape and kernel, rebuilt when either changes.
//!
//! A cached layout (a store's strides, a stacked input buffer) is only valid
//! for the shape and the kernel it was built for. In a laned runtime the
//! occupancy (the extent of axis 0) changes from turn to turn, so every entry
//! here is keyed by `(key, shape, kernel)`: a lookup for another shape or
//! kernel builds a new entry instead of handing back a stale one. Occupancy
//! alternates between a few values under real load, so each key keeps a
//! small bounded set of shapes, the least recently used going first.
//!
//! ```
//! use kernel_memo::{Memo, MemoConfig};
//!
//! let mut memo: Memo<usize, (), Vec<f32>> = Memo::new(MemoConfig::default());
//! // Input slot 0 at occupancy 3, then 5, then 3 again: two builds, one hit.
//! for occupancy in [3, 5, 3] {
//!     let buffer = memo.get_or_build(&0, &[occupancy, 40], &(), |shape, _| vec![0.0; shape.iter().product()]);
//!     assert_eq!(buffer.len(), occupancy * 40);
//! }
//! assert_eq!(memo.builds(), 2);
//! ```
//!
//! # Patterns and traps
//! - Look the memo up once per turn, with that turn's shape and kernel, and
//!   use what it returns for that turn only. Never keep a store (or a pointer
//!   into a buffer) across turns: the next turn may have another shape.
//! - The kernel id must name everything the layout depends on: the kernel's
//!   name *and* its mode/packing and tile (`mr`, `nr` size the panels a
//!   store walks). With the `linalg` feature (on by default), `linalg::KernelId`
//!   takes all of them from a tract-linalg `MatMatMul`, and `linalg::StoreMemo`
//!   hands out `OutputStore`s whose only per-turn change is the base pointer.
//! - A bound of 1 is the seed's memo with the bug fixed: correct, but it
//!   rebuilds on every alternation of occupancy. Keep the bound at the number
//!   of occupancies the load really alternates between.

#![warn(missing_docs)]

use std::collections::HashMap;
use std::hash::Hash;

#[cfg(feature = "linalg")]
pub mod linalg;

/// How many shapes a memo keeps per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoConfig {
    shapes_per_key: usize,
}

impl MemoConfig {
    /// Keep at most `shapes_per_key` entries (at least 1) per key.
    pub fn new(shapes_per_key: usize) -> MemoConfig {
        MemoConfig {
            shapes_per_key: shapes_per_key.max(1),
        }
    }

    /// The most entries kept per key (at least 1).
    pub fn shapes_per_key(&self) -> usize {
        self.shapes_per_key
    }
}

impl Default for MemoConfig {
    /// Four shapes per key: enough for a load alternating between a few
    /// occupancies.
    fn default() -> MemoConfig {
        MemoConfig::new(4)
    }
}

struct Entry<Q, V> {
    shape: Vec<usize>,
    kernel: Q,
    value: V,
    /// The memo's clock at the last lookup that returned this entry.
    used: u64,
}

/// Entries per key, each built for one `(shape, kernel)`.
///
/// A hit costs a hash lookup and a comparison of shapes: no allocation.
pub struct Memo<K, Q, V> {
    entries: HashMap<K, Vec<Entry<Q, V>>>,
    config: MemoConfig,
    clock: u64,
    builds: u64,
}

impl<K: Hash + Eq + Clone, Q: PartialEq + Clone, V> Memo<K, Q, V> {
    /// An empty memo keeping at most `config`'s bound of entries per key.
    pub fn new(config: MemoConfig) -> Memo<K, Q, V> {
        Memo {
            entries: HashMap::new(),
            config,
            clock: 0,
            builds: 0,
        }
    }

    /// The entry built for exactly `shape` and `kernel` under `key`, built by
    /// `build` on a miss (evicting the least recently used entry of `key`
    /// when it holds the bound already).
    pub fn get_or_build(
        &mut self,
        key: &K,
        shape: &[usize],
        kernel: &Q,
        build: impl FnOnce(&[usize], &Q) -> V,
    ) -> &mut V {
        match self.get_or_try_build(key, shape, kernel, |s, k| {
            Ok::<V, std::convert::Infallible>(build(s, k))
        }) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }

    /// [`Memo::get_or_build`] with a fallible builder; nothing is stored when
    /// it fails.
    pub fn get_or_try_build<E>(
        &mut self,
        key: &K,
        shape: &[usize],
        kernel: &Q,
        build: impl FnOnce(&[usize], &Q) -> Result<V, E>,
    ) -> Result<&mut V, E> {
        self.clock += 1;
        let clock = self.clock;
        let bound = self.config.shapes_per_key;
        if !self.entries.contains_key(key) {
            self.entries.insert(key.clone(), Vec::with_capacity(bound));
        }
        let entries = self.entries.get_mut(key).expect("inserted above");
        let hit = entries.iter().position(|e| e.shape == shape && e.kernel == *kernel);
        let ix = match hit {
            Some(ix) => ix,
            None => {
                let value = build(shape, kernel)?;
                self.builds += 1;
                let entry = Entry {
                    shape: shape.to_vec(),
                    kernel: kernel.clone(),
                    value,
                    used: clock,
                };
                if entries.len() >= bound {
                    let lru = (0..entries.len())
                        .min_by_key(|&i| entries[i].used)
                        .expect("bound is at least 1");
                    entries[lru] = entry;
                    lru
                } else {
                    entries.push(entry);
                    entries.len() - 1
                }
            }
        };
        entries[ix].used = clock;
        Ok(&mut entries[ix].value)
    }

    /// Entries kept for `key`.
    pub fn len_for(&self, key: &K) -> usize {
        self.entries.get(key).map(Vec::len).unwrap_or(0)
    }

    /// The `(shape, kernel)` pairs kept for `key`, in no particular order.
    pub fn shapes_for(&self, key: &K) -> Vec<(&[usize], &Q)> {
        self.entries
            .get(key)
            .map(|v| v.iter().map(|e| (&*e.shape, &e.kernel)).collect())
            .unwrap_or_default()
    }

    /// Entries built since the memo was made: the misses.
    pub fn builds(&self) -> u64 {
        self.builds
    }

    /// Drop every entry (a model swap, say).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// The configuration the memo was made with.
    pub fn config(&self) -> MemoConfig {
        self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebuilds_when_the_shape_or_the_kernel_changes() {
        let mut memo: Memo<&str, u8, (Vec<usize>, u8)> = Memo::new(MemoConfig::new(4));
        let build = |s: &[usize], k: &u8| (s.to_vec(), *k);
        assert_eq!(*memo.get_or_build(&"a", &[3, 2], &0, build), (vec![3, 2], 0));
        assert_eq!(*memo.get_or_build(&"a", &[5, 2], &0, build), (vec![5, 2], 0));
        assert_eq!(*memo.get_or_build(&"a", &[5, 2], &1, build), (vec![5, 2], 1));
        assert_eq!(*memo.get_or_build(&"a", &[3, 2], &0, build), (vec![3, 2], 0));
        assert_eq!(memo.builds(), 3);
        assert_eq!(memo.len_for(&"a"), 3);
    }

    #[test]
    fn evicts_the_least_recently_used_shape() {
        let mut memo: Memo<u8, (), usize> = Memo::new(MemoConfig::new(2));
        let build = |s: &[usize], _: &()| s[0];
        memo.get_or_build(&0, &[1], &(), build);
        memo.get_or_build(&0, &[2], &(), build);
        memo.get_or_build(&0, &[1], &(), build); // 2 is now the oldest
        memo.get_or_build(&0, &[3], &(), build);
        let mut kept: Vec<usize> = memo.shapes_for(&0).iter().map(|(s, _)| s[0]).collect();
        kept.sort();
        assert_eq!(kept, vec![1, 3]);
        assert_eq!(memo.builds(), 3);
    }

    #[test]
    fn a_failed_build_stores_nothing() {
        let mut memo: Memo<u8, (), usize> = Memo::new(MemoConfig::default());
        let r: Result<&mut usize, &str> = memo.get_or_try_build(&0, &[1], &(), |_, _| Err("no"));
        assert_eq!(r.unwrap_err(), "no");
        assert_eq!(memo.len_for(&0), 0);
        assert_eq!(memo.builds(), 0);
    }
}

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
