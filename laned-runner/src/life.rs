//! The runner's life as one state: how far along the steps numbered in the
//! `runner` module's doc it is, and how it ends. Created with the runner and
//! shared (an `Arc`) with the admission queue, every shard's inbox and
//! engine, and every handle (through `Common`); each part reads it here,
//! none keeps a flag of its own.
//!
//! The steps only move forward, and each is one bit set once:
//! - step 3, spawns refused, with the first reason given (`Draining` from
//!   a drain or `stop_admitting`, `Closed` from a close);
//! - step 4 (or a close), the end marked: `Drained` or `Closed`, the
//!   first marked stands;
//! - step 5, the shards draining;
//! - step 7, the shards closed.
//!
//! Who may touch it: the draining or closing thread sets the bits. Step 3
//! under the admission queue's lock, which its queue reads it under; 5 and
//! 7 under the first shard's inbox lock, and then each shard's inbox lock
//! is taken in turn and its sleepers woken, so a sleeper that looked
//! before the bit was set is asleep by then, and woken. Anyone reads,
//! under a lock or not: a reader without one (the engine, a handle) only
//! ever acts on a step that came.

use crate::err::{EndReason, SpawnError};
use crate::sync::{AtomicU8, Ordering};

/// Step 3, refused as `Draining`.
const REFUSING_DRAINING: u8 = 1;
/// Step 3, refused as `Closed`.
const REFUSING_CLOSED: u8 = 2;
/// Step 4 (or a close): the end marked `Drained`.
const ENDED_DRAINED: u8 = 4;
/// The end marked `Closed` (a close, or the last runner dropped).
const ENDED_CLOSED: u8 = 8;
/// Step 5.
const DRAINING: u8 = 16;
/// Step 7.
const CLOSED: u8 = 32;

/// A runner's life: see the module doc.
pub(crate) struct Life(AtomicU8);

impl Life {
    pub fn new() -> Life {
        Life(AtomicU8::new(0))
    }

    fn bits(&self) -> u8 {
        self.0.load(Ordering::Acquire)
    }

    /// Set `bit` unless one of `unless` is set already (the first of two
    /// exclusive bits stands).
    fn set(&self, bit: u8, unless: u8) {
        let _ = self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
            (b & unless == 0).then_some(b | bit)
        });
    }

    /// Step 3: refuse spawns with `why` (`Draining` or `Closed`), unless
    /// they are refused already: the first refusal stands.
    pub fn refuse_spawns(&self, why: &SpawnError) {
        let bit = match why {
            SpawnError::Closed => REFUSING_CLOSED,
            _ => REFUSING_DRAINING,
        };
        self.set(bit, REFUSING_DRAINING | REFUSING_CLOSED);
    }

    /// Which of two exclusive marks is set, if one is.
    fn which<T>(&self, marks: [(u8, T); 2]) -> Option<T> {
        let bits = self.bits();
        marks.into_iter().find(|(bit, _)| bits & bit != 0).map(|(_, t)| t)
    }

    /// Why spawns are refused, once step 3 came.
    pub fn spawn_refusal(&self) -> Option<SpawnError> {
        self.which([
            (REFUSING_CLOSED, SpawnError::Closed),
            (REFUSING_DRAINING, SpawnError::Draining),
        ])
    }

    /// Mark how the life ends, unless a drain or close marked it first.
    pub fn mark_end(&self, how: EndReason) {
        let bit = match how {
            EndReason::Drained => ENDED_DRAINED,
            _ => ENDED_CLOSED,
        };
        self.set(bit, ENDED_DRAINED | ENDED_CLOSED);
    }

    /// How the life ends, once marked: `Drained` after a drain (its streams
    /// may retry elsewhere), `Closed` after a close.
    pub fn ending(&self) -> Option<EndReason> {
        self.which([(ENDED_DRAINED, EndReason::Drained), (ENDED_CLOSED, EndReason::Closed)])
    }

    /// Step 5: the shards drain (take no new call, finish what is queued).
    pub fn start_draining(&self) {
        self.set(DRAINING, 0);
    }

    /// Whether step 5 came.
    pub fn is_draining(&self) -> bool {
        self.bits() & DRAINING != 0
    }

    /// Step 7: the shards are closed; a push is refused by its pusher.
    pub fn close(&self) {
        self.set(CLOSED, 0);
    }

    /// Whether step 7 came.
    pub fn is_closed(&self) -> bool {
        self.bits() & CLOSED != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The steps move forward only, and of two exclusive marks the first
    /// stands.
    #[test]
    fn the_first_refusal_and_the_first_end_stand() {
        let life = Life::new();
        assert_eq!(life.spawn_refusal(), None);
        assert_eq!(life.ending(), None);
        life.refuse_spawns(&SpawnError::Draining);
        life.refuse_spawns(&SpawnError::Closed);
        assert_eq!(life.spawn_refusal(), Some(SpawnError::Draining));
        life.mark_end(EndReason::Drained);
        life.mark_end(EndReason::Closed);
        assert_eq!(life.ending(), Some(EndReason::Drained));
        assert!(!life.is_draining() && !life.is_closed());
        life.start_draining();
        life.close();
        assert!(life.is_draining() && life.is_closed());
        assert_eq!(
            life.spawn_refusal(),
            Some(SpawnError::Draining),
            "unchanged by later steps"
        );
    }
}
