//! What every clone of a runner and every stream's handle share: the
//! shards, the admission queue, the live settings, and placing a new stream.

use std::sync::Arc;
use std::time::Duration;

use laned_metrics::Metrics;
use tract_core::internal::*;

use crate::admission::Admission;
use crate::config::Resolved;
use crate::drive::Wait;
use crate::err::{EndReason, RunError, RunErrorKind, SpawnError};
use crate::iface::Interface;
use crate::policy::LearnedTurnTimes;
use crate::protocol::{Grant, Live, Request};
use crate::shard::Shard;
use crate::slot::Slot;
use arc_swap::ArcSwap;

use crate::life::Life;

/// What every clone of the runner and every handle share.
pub(crate) struct Common {
    /// The plan as the caller gave it, what the runner shows as a
    /// `Runnable`; the engines run it with its ops' implicit state lifted
    /// into explicit pairs (`implicit`), whose ports are the runner's own.
    pub(crate) given: Arc<dyn Runnable>,
    /// The plan the engines run: `given` with its ops' state lifted.
    pub(crate) served: Arc<dyn Runnable>,
    pub(crate) iface: Arc<Interface>,
    /// The model's identity and what a stream's state is checked against
    /// on the wire, fixed at construction.
    pub(crate) wire: crate::wire::Wire,
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
    /// The runner's life (see `life`): every refusal a stream gets and
    /// every `end_reason` it reads say the end marked there.
    pub(crate) life: Arc<Life>,
    /// The deadlines of task calls (`call_until_async`).
    pub(crate) timer: Arc<crate::deadline::Timer>,
}

impl Common {
    /// A spawn refused a lane, booked once: in the runner's counters and
    /// the facade together.
    pub(crate) fn book_refusal(&self) {
        self.events.record_admission_refused();
        self.admission.meters().refused();
    }

    /// A change of the live settings, booked once, as a refusal is.
    pub(crate) fn book_policy_change(&self) {
        self.events.record_policy_change();
        self.admission.meters().policy_change();
    }

    /// A call's end, where it is one the runner counts: answered
    /// `Cancelled` or `DeadlineExceeded` (booked where the caller learns
    /// which: the engine withdraws both alike).
    pub(crate) fn book_call_end(&self, kind: &RunErrorKind) {
        match kind {
            RunErrorKind::Cancelled => {
                self.events.record_cancelled();
                self.admission.meters().cancelled();
            }
            RunErrorKind::DeadlineExceeded => {
                self.events.record_deadline_exceeded();
                self.admission.meters().deadline_exceeded();
            }
            _ => (),
        }
    }

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

    /// A lane on the first shard in placement order that has one, each
    /// shard's answer awaited as `w` waits (the state served in combining
    /// mode when free). A try dropped while waiting (a task's) leaves no
    /// lane behind: a grant landing later is refused, one that landed is
    /// released.
    pub(crate) async fn try_shards<W: Wait>(
        &self,
        waited: Option<Duration>,
        w: &mut W,
    ) -> Result<(usize, Grant), SpawnError> {
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
            let answer = crate::drive::value(w, shard, &slot).await;
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

    /// Tell every shard whose gauge shows a free lane that a waiter
    /// arrived in the admission queue (its engine grants the oldest
    /// waiters its free lanes); returns the shards told.
    pub(crate) fn kick(&self) -> Vec<usize> {
        let lanes = self.config.max_lanes as u64;
        (0..self.shards.len())
            .filter(|&ix| self.metrics[ix].lanes_taken() < lanes)
            .inspect(|&ix| self.shards[ix].push(Request::Admit))
            .collect()
    }

    pub(crate) fn total_lanes(&self) -> usize {
        self.config.max_lanes * self.shards.len()
    }

    /// Streams holding a lane now, every shard's.
    pub(crate) fn streams(&self) -> usize {
        self.metrics.iter().map(|m| m.lanes_taken() as usize).sum()
    }

    /// Why a stream ends once its runner's life ends: `Drained` after a
    /// drain (it may retry elsewhere), `Closed` after a close; `None`
    /// before either started.
    pub(crate) fn ending(&self) -> Option<EndReason> {
        self.life.ending()
    }

    /// What a stream is told once its runner's life is ending: every
    /// refusal for that (`Draining`, `Closed`) says the one end the runner
    /// marked, so a stream hears one end reason through every API.
    pub(crate) fn told(&self, e: RunError) -> RunError {
        let kind = match (e.kind(), self.ending()) {
            (RunErrorKind::Closed | RunErrorKind::Draining, Some(EndReason::Drained)) => RunErrorKind::Draining,
            (RunErrorKind::Closed | RunErrorKind::Draining, Some(_)) => RunErrorKind::Closed,
            _ => return e,
        };
        if *e.kind() == kind {
            return e;
        }
        match e.into_inputs() {
            Some(inputs) => RunError::with_inputs(kind, inputs),
            None => RunError::new(kind),
        }
    }

    /// A spawn's refusal as every spawn path gives it: once the runner's
    /// life is ending, the one end the runner marked (`Draining` after a
    /// drain, `Closed` after a close), whichever path the spawn took and
    /// whoever refused it (the admission queue, a closed shard); the same
    /// end its streams are told.
    pub(crate) fn told_spawn(&self, e: SpawnError) -> SpawnError {
        match (e, self.ending()) {
            (SpawnError::Draining | SpawnError::Closed, Some(EndReason::Drained)) => SpawnError::Draining,
            (SpawnError::Draining | SpawnError::Closed, Some(_)) => SpawnError::Closed,
            (e, _) => e,
        }
    }

    /// A stream's end as its shard reported it, made to agree with the
    /// runner's: a stream the runner's end reached is told that end.
    pub(crate) fn told_end(&self, reason: Option<EndReason>) -> Option<EndReason> {
        match reason {
            Some(EndReason::Closed | EndReason::Drained) | None => self.ending().or(reason),
            other => other,
        }
    }

    /// Steps 7 to 10 of the runner's life (numbered in the `runner` module's
    /// doc):
    /// the deadline thread stops, then every shard closes.
    pub(crate) fn close(&self) {
        self.life.mark_end(EndReason::Closed);
        self.admission.refuse(SpawnError::Closed);
        self.timer.close();
        Shard::close_all(&self.shards);
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
