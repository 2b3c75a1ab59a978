//! The queue: seats waiting for a turn (oldest first, a call's seats
//! adjacent in place order), the calls waiting for their seats to land, and
//! the per-lane counts kept true with them (a linger ends early when every
//! held lane has a seat queued).

use std::hash::Hasher;
use std::sync::Arc;
use std::time::Instant;

use lane_table::{LaneId, QueuedSeat};
use tract_core::internal::*;

use crate::err::{RunError, RunErrorKind};
use crate::iface::Group;
use crate::protocol::{Call, CallResult};
use crate::slot::Slot;

use super::Engine;

/// Hashes the engine's call ids (sequential `u64`s it hands out itself, so
/// no adversary picks them): one multiply instead of SipHash, on the path
/// of every call.
#[derive(Default)]
pub(crate) struct CallIdHasher(u64);

impl Hasher for CallIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// One seat waiting for a turn.
pub(super) struct QSeat {
    pub(super) call: u64,
    pub(super) place: usize,
    pub(super) lane: LaneId,
    pub(super) group: Group,
    /// The seat's batched inputs, one row each.
    pub(super) inputs: TVec<TValue>,
    pub(super) queued: Instant,
}

impl QueuedSeat for QSeat {
    type Group = Group;
    fn call(&self) -> u64 {
        self.call
    }
    fn place(&self) -> usize {
        self.place
    }
    fn lane(&self) -> LaneId {
        self.lane
    }
    fn group(&self) -> &Group {
        &self.group
    }
}

/// A call with seats still to land.
pub(super) struct Pending {
    pub(super) slot: Arc<Slot<CallResult>>,
    /// The caller's lane: its row 0 advances that lane's state.
    pub(super) lane: LaneId,
    pub(super) served: TVec<Option<TVec<TValue>>>,
    pub(super) remaining: usize,
}

impl Engine {
    pub fn has_queue(&self) -> bool {
        !self.queue.is_empty()
    }

    pub(super) fn queued(&mut self, lane: LaneId) {
        let n = &mut self.queued_per_lane[lane.0];
        if *n == 0 {
            self.lanes_queued += 1;
        }
        *n += 1;
    }

    pub(super) fn unqueued(&mut self, lane: LaneId) {
        let n = &mut self.queued_per_lane[lane.0];
        *n -= 1;
        if *n == 0 {
            self.lanes_queued -= 1;
        }
    }

    pub(super) fn enqueue(&mut self, call: Call) {
        if self.closed {
            call.slot.fill(Err(RunError::new(RunErrorKind::Closed)));
            return;
        }
        if self.owner[call.stream.lane.0] != Some(call.stream.stream) {
            let kind = match self.evicted.get(&call.stream.stream) {
                Some(why) => RunErrorKind::Evicted(why.clone()),
                None => RunErrorKind::Closed,
            };
            call.slot.fill(Err(RunError::new(kind)));
            return;
        }
        // Idleness is measured to the moment the caller called, not to the
        // moment the engine takes the call in (after a long turn, say): a
        // call made in time is served, one made after the timeout finds
        // its stream evicted, as it would had anyone looked meanwhile.
        if self.idle_by(call.stream.lane, call.queued) {
            let why = self.evict(call.stream.lane, call.stream.stream);
            call.slot.fill(Err(RunError::new(RunErrorKind::Evicted(why))));
            return;
        }
        if self.draining {
            call.slot.fill(Err(RunError::new(RunErrorKind::Draining)));
            return;
        }
        // The instant the caller took when queueing: no clock read here.
        self.last_active[call.stream.lane.0] = call.queued;
        if let Some(why) = &self.lost[call.stream.lane.0] {
            self.metrics.record_failed_seats(call.seats.len());
            call.slot.fill(Err(RunError::new(RunErrorKind::Lost(why.clone()))));
            return;
        }
        if !call.group.resolved().is_empty() && !self.can_forget_symbols() {
            call.slot.fill(Err(RunError::new(RunErrorKind::Symbol(
                "this state cannot forget a resolved symbol after the turn".into(),
            ))));
            return;
        }
        let id = self.next_call;
        self.next_call += 1;
        let rows = call.seats.len();
        self.pending.insert(
            id,
            Pending {
                slot: call.slot,
                lane: call.stream.lane,
                served: (0..rows).map(|_| None).collect(),
                remaining: rows,
            },
        );
        for (place, inputs) in call.seats.into_iter().enumerate() {
            self.queue.push(QSeat {
                call: id,
                place,
                lane: call.stream.lane,
                group: call.group.clone(),
                inputs,
                queued: call.queued,
            });
            self.queued(call.stream.lane);
        }
    }

    /// A cancelled call: dropped and answered `Cancelled` if none of its
    /// seats was seated yet (requests are taken between turns, so no seat is
    /// in a turn now); left to complete otherwise, its answer the verdict.
    /// A call no longer pending was answered already: that answer stands.
    pub(super) fn cancel(&mut self, slot: &Arc<Slot<CallResult>>) {
        let Some((id, pending)) = self.pending.iter().find(|(_, p)| Arc::ptr_eq(&p.slot, slot)) else {
            return;
        };
        if pending.remaining < pending.served.len() {
            return;
        }
        let id = *id;
        let pending = self.pending.remove(&id).expect("present");
        self.unqueue_where(|seat| seat.call == id);
        // The stream called and was answered (cancelled) now: its idle time
        // starts here, as after any other answer.
        self.last_active[pending.lane.0] = Instant::now();
        pending.slot.fill(Err(RunError::new(RunErrorKind::Cancelled)));
    }

    /// Take the queued seats matching `which` out of the queue, oldest
    /// first, keeping the per-lane counts right.
    pub(super) fn unqueue_where(&mut self, which: impl Fn(&QSeat) -> bool) -> Vec<QSeat> {
        let mut removed = vec![];
        let mut ix = 0;
        while ix < self.queue.len() {
            if which(&self.queue[ix]) {
                let seat = self.queue.remove(ix);
                self.unqueued(seat.lane);
                removed.push(seat);
            } else {
                ix += 1;
            }
        }
        removed
    }
}
