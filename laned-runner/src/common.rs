//! What every clone of a runner and every stream's handle share: the
//! shards, the admission queue, the live settings, and placing a new stream.

use std::sync::Arc;
use std::time::Duration;

use laned_metrics::Metrics;
use tract_core::internal::*;

use crate::admission::Admission;
use crate::config::Resolved;
use crate::err::{RunError, RunErrorKind, SpawnError};
use crate::iface::Interface;
use crate::policy::LearnedTurnTimes;
use crate::protocol::{Grant, Live, Request};
use crate::shard::Shard;
use crate::slot::{Slot, Wake};
use arc_swap::ArcSwap;

/// What every clone of the runner and every handle share.
pub(crate) struct Common {
    pub(crate) inner: Arc<dyn Runnable>,
    pub(crate) iface: Arc<Interface>,
    /// The laned states; a stream stays on the shard it was placed on.
    pub(crate) shards: Vec<Arc<Shard>>,
    /// Per shard: what its engine records (turns, seats, lanes, ...).
    pub(crate) metrics: Vec<Arc<Metrics>>,
    /// Runner-wide events, no shard's: admission refusals, policy changes.
    pub(crate) events: Arc<Metrics>,
    pub(crate) times: Vec<Arc<LearnedTurnTimes>>,
    /// Spawners waiting for a lane on any shard.
    pub(crate) admission: Arc<Admission>,
    pub(crate) config: Resolved,
    /// The live policy and `max_seats` (shared with every shard).
    pub(crate) live: Arc<ArcSwap<Live>>,
    /// Set by a drain that closed the runner: what its streams are told
    /// from then on is `Draining` (they may retry elsewhere), not `Closed`.
    /// Written once by the draining thread, read by any handle.
    pub(crate) drained: std::sync::atomic::AtomicBool,
    /// The deadlines of task calls (`call_until_async`).
    pub(crate) timer: Arc<crate::deadline::Timer>,
}

impl Common {
    /// Shards in placement order: most free lanes first, lowest index on ties.
    pub(crate) fn placement(&self) -> Vec<usize> {
        let mut order: Vec<(u64, usize)> = self
            .metrics
            .iter()
            .enumerate()
            .map(|(ix, m)| (m.lanes_taken(), ix))
            .collect();
        order.sort();
        order.into_iter().map(|(_, ix)| ix).collect()
    }

    /// A lane on the first shard in placement order that has one.
    pub(crate) fn try_shards(&self, waited: Option<Duration>) -> Result<(usize, Grant), SpawnError> {
        let slot = Arc::new(Slot::new());
        for ix in self.placement() {
            self.shards[ix].push(Request::Spawn {
                slot: slot.clone(),
                waited,
            });
            match self.shards[ix].wait(&slot, None) {
                Wake::Value(Ok(grant)) => return Ok((ix, grant)),
                Wake::Value(Err(SpawnError::Full { .. })) => continue,
                Wake::Value(Err(e)) => return Err(e),
                _ => continue,
            }
        }
        Err(SpawnError::Full {
            total_lanes: self.total_lanes(),
            waiting: self.admission.waiting(),
        })
    }

    /// [`Common::try_shards`] for a task: each shard's answer is polled (the
    /// state served in combining mode when free), and a spawn dropped while
    /// waiting leaves no lane behind (a grant landing later is refused, one
    /// that landed is released).
    pub(crate) async fn try_shards_async(&self, waited: Option<Duration>) -> Result<(usize, Grant), SpawnError> {
        for ix in self.placement() {
            let shard = &self.shards[ix];
            let slot = Arc::new(Slot::new());
            shard.push(Request::Spawn {
                slot: slot.clone(),
                waited,
            });
            let mut asking = Asking {
                shard,
                slot: Some(&slot),
            };
            let answer = std::future::poll_fn(|cx| {
                shard.serve(&|| slot.is_filled());
                slot.poll_value(cx)
            })
            .await;
            asking.slot = None;
            match answer {
                Ok(grant) => return Ok((ix, grant)),
                Err(SpawnError::Full { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(SpawnError::Full {
            total_lanes: self.total_lanes(),
            waiting: self.admission.waiting(),
        })
    }

    pub(crate) fn total_lanes(&self) -> usize {
        self.config.max_lanes * self.shards.len()
    }

    /// Streams holding a lane now, every shard's.
    pub(crate) fn streams(&self) -> usize {
        self.metrics.iter().map(|m| m.lanes_taken() as usize).sum()
    }

    /// What a stream is told once its runner closed: `Draining` after a
    /// drain (it may retry elsewhere), `Closed` otherwise.
    pub(crate) fn told(&self, e: RunError) -> RunError {
        if *e.kind() == RunErrorKind::Closed && self.drained.load(std::sync::atomic::Ordering::Acquire) {
            return match e.into_inputs() {
                Some(inputs) => RunError::with_inputs(RunErrorKind::Draining, inputs),
                None => RunError::new(RunErrorKind::Draining),
            };
        }
        e
    }

    pub(crate) fn close(&self) {
        self.admission.refuse(SpawnError::Closed);
        self.timer.close();
        for shard in &self.shards {
            shard.close();
        }
    }
}

/// A task's spawn request in flight on one shard: dropped before its answer
/// was taken, it abandons the slot, so that no lane is granted to nobody.
struct Asking<'a> {
    shard: &'a Shard,
    /// `None` once the answer was taken.
    slot: Option<&'a Arc<Slot<crate::protocol::SpawnResult>>>,
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else { return };
        // A grant that landed first goes back; one landing later is refused
        // by the abandoned slot, and the engine takes the lane back itself.
        if let Some(Ok(grant)) = slot.abandon() {
            self.shard.push(Request::Release(grant));
            self.shard.tend();
        }
    }
}
