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
    /// The call's deadline: the seat is never seated past it.
    pub(super) deadline: Option<Instant>,
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
    /// Whether any seat waits for a turn (cancelled seats not yet swept
    /// out do not count).
    pub fn has_queue(&self) -> bool {
        self.queue.len() > self.dead_seats
    }

    /// Seats waiting for a turn.
    pub(super) fn queue_len(&self) -> usize {
        self.queue.len() - self.dead_seats
    }

    /// Sweep the seats of cancelled calls out of the queue: one pass, done
    /// before anything reads the queue in order (a turn, a decision, an
    /// unqueue) or once they are half of it, so that cancelling many calls
    /// costs each a constant share (a runtime dropping 10,000 pending calls
    /// is not quadratic here).
    pub(super) fn sweep(&mut self) {
        if self.dead_seats == 0 {
            return;
        }
        let pending = &self.pending;
        self.queue.retain(|seat| pending.contains_key(&seat.call));
        self.dead_seats = 0;
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
            self.records.failed_seats(call.seats.len());
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
        call.slot.set_engine_call(id as usize);
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
                deadline: call.deadline,
            });
            self.queued(call.stream.lane);
        }
    }

    /// A cancelled call: dropped and answered `Cancelled` if none of its
    /// seats was seated yet (requests are taken between turns, so no seat is
    /// in a turn now); left to complete otherwise, its answer the verdict.
    /// A call no longer pending was answered already: that answer stands.
    pub(super) fn cancel(&mut self, slot: &Arc<Slot<CallResult>>) {
        let id = slot.engine_call() as u64;
        if self.pending.get(&id).is_some_and(|p| Arc::ptr_eq(&p.slot, slot)) {
            self.withdraw(id, RunErrorKind::Cancelled);
        }
    }

    /// Withdraw call `id` if none of its seats was seated yet, answering it
    /// with `why` (a cancel, a deadline); a call partly served completes.
    pub(super) fn withdraw(&mut self, id: u64, why: RunErrorKind) {
        let Some(pending) = self.pending.get(&id) else { return };
        if pending.remaining < pending.served.len() {
            return;
        }
        let pending = self.pending.remove(&id).expect("present");
        // Its seats stay in the queue until the next sweep (they no longer
        // have a pending call); the counts forget them now.
        for _ in 0..pending.served.len() {
            self.unqueued(pending.lane);
        }
        self.dead_seats += pending.served.len();
        if self.dead_seats * 2 >= self.queue.len() {
            self.sweep();
        }
        // The stream called and was answered (cancelled) now: its idle time
        // starts here, as after any other answer.
        self.last_active[pending.lane.0] = Instant::now();
        pending.slot.fill(Err(RunError::new(why)));
    }

    /// Take the queued seats matching `which` out of the queue, oldest
    /// first, keeping the per-lane counts right.
    pub(super) fn unqueue_where(&mut self, which: impl Fn(&QSeat) -> bool) -> Vec<QSeat> {
        self.sweep();
        let removed: Vec<QSeat> = self.queue.extract_if(.., |seat| which(seat)).collect();
        for seat in &removed {
            self.unqueued(seat.lane);
        }
        removed
    }
}
