//! The queue: seats waiting for a turn (oldest first, a call's seats
//! adjacent in place order), the calls waiting for their seats to land, and
//! the per-lane counts kept true with them (a linger ends early when every
//! held lane has a seat queued).
//!
//! The queue answers no caller itself: whatever it takes out (a withdrawn
//! call, a lane's calls) it hands back, and the engine answers it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::Instant;

use lane_table::{Fill, LaneId, QueuedSeat};
use tract_core::internal::*;

use crate::iface::Group;
use crate::protocol::{Call, CallResult};
use crate::slot::Slot;

/// Hashes the engine's call ids (sequential `u64`s it hands out itself, so
/// no adversary picks them): one multiply instead of SipHash, on the path
/// of every call.
#[derive(Default)]
pub(super) struct CallIdHasher(u64);

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

impl Pending {
    /// Whether none of the call's seats has landed yet.
    pub(super) fn untouched(&self) -> bool {
        self.remaining == self.served.len()
    }
}

/// The queued seats, the pending calls, and the per-lane counts.
pub(super) struct Queue {
    /// Seats waiting, oldest first; a call's seats adjacent, in place order.
    /// Seats of cancelled calls may linger until the next sweep (`dead` of
    /// them).
    seats: Vec<QSeat>,
    dead: usize,
    /// A reused buffer for splitting the queue at each turn.
    spare: Vec<QSeat>,
    pending: HashMap<u64, Pending, BuildHasherDefault<CallIdHasher>>,
    next_call: u64,
    /// Seats queued per lane, and how many lanes have one queued at least.
    per_lane: Vec<u32>,
    lanes_queued: usize,
}

impl Queue {
    /// An empty queue for a state of `lanes` lanes.
    pub(super) fn new(lanes: usize) -> Queue {
        Queue {
            seats: vec![],
            dead: 0,
            spare: vec![],
            pending: HashMap::default(),
            next_call: 0,
            per_lane: vec![0; lanes],
            lanes_queued: 0,
        }
    }

    /// Whether any seat waits for a turn (cancelled seats not yet swept
    /// out do not count).
    pub(super) fn has_seats(&self) -> bool {
        self.seats.len() > self.dead
    }

    /// Seats waiting for a turn.
    pub(super) fn len(&self) -> usize {
        self.seats.len() - self.dead
    }

    /// Nothing queued, nothing waiting for an answer.
    pub(super) fn is_quiet(&self) -> bool {
        !self.has_seats() && self.pending.is_empty()
    }

    /// The seats in queue order (swept: call [`Queue::sweep`] first).
    pub(super) fn seats(&self) -> &[QSeat] {
        debug_assert_eq!(self.dead, 0, "read unswept");
        &self.seats
    }

    /// How many lanes have a seat queued.
    pub(super) fn lanes_queued(&self) -> usize {
        self.lanes_queued
    }

    /// Whether `lane` has a seat queued.
    pub(super) fn has_seat_on(&self, lane: LaneId) -> bool {
        self.per_lane[lane.0] > 0
    }

    /// Sweep the seats of cancelled calls out of the queue: one pass, done
    /// before anything reads the queue in order (a turn, a decision, an
    /// unqueue) or once they are half of it, so that cancelling many calls
    /// costs each a constant share (a runtime dropping 10,000 pending calls
    /// is not quadratic here).
    pub(super) fn sweep(&mut self) {
        if self.dead == 0 {
            return;
        }
        let pending = &self.pending;
        self.seats.retain(|seat| pending.contains_key(&seat.call));
        self.dead = 0;
    }

    fn queued(&mut self, lane: LaneId) {
        let n = &mut self.per_lane[lane.0];
        if *n == 0 {
            self.lanes_queued += 1;
        }
        *n += 1;
    }

    fn unqueued(&mut self, lane: LaneId) {
        let n = &mut self.per_lane[lane.0];
        *n -= 1;
        if *n == 0 {
            self.lanes_queued -= 1;
        }
    }

    /// Queue a checked call's seats and keep it pending; its slot learns
    /// its id (a cancel names it).
    pub(super) fn push(&mut self, call: Call) {
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
            self.seats.push(QSeat {
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

    /// The answer slots of the calls queued, oldest first (seats swept).
    pub(super) fn queued_slots(&self) -> impl Iterator<Item = &Arc<Slot<CallResult>>> {
        self.seats
            .iter()
            .filter_map(|seat| self.pending.get(&seat.call))
            .map(|pending| &pending.slot)
    }

    /// The id of the call answering into `slot`, while it is pending.
    pub(super) fn pending_id(&self, slot: &Arc<Slot<CallResult>>) -> Option<u64> {
        let id = slot.engine_call() as u64;
        self.pending
            .get(&id)
            .is_some_and(|p| Arc::ptr_eq(&p.slot, slot))
            .then_some(id)
    }

    /// Withdraw call `id` if none of its seats was seated yet, and hand it
    /// back to be answered; a call partly served stays, to complete.
    pub(super) fn withdraw(&mut self, id: u64) -> Option<Pending> {
        if !self.pending.get(&id)?.untouched() {
            return None;
        }
        let pending = self.pending.remove(&id).expect("present");
        // Its seats stay in the queue until the next sweep (they no longer
        // have a pending call); the counts forget them now.
        for _ in 0..pending.served.len() {
            self.unqueued(pending.lane);
        }
        self.dead += pending.served.len();
        if self.dead * 2 >= self.seats.len() {
            self.sweep();
        }
        Some(pending)
    }

    /// Take the queued seats matching `which` out of the queue, oldest
    /// first, keeping the per-lane counts right.
    fn unqueue_where(&mut self, which: impl Fn(&QSeat) -> bool) -> Vec<QSeat> {
        self.sweep();
        let removed: Vec<QSeat> = self.seats.extract_if(.., |seat| which(seat)).collect();
        for seat in &removed {
            self.unqueued(seat.lane);
        }
        removed
    }

    /// Take `lane`'s seats out of the queue and hand back their calls
    /// (nobody will be served on that lane).
    pub(super) fn drop_lane(&mut self, lane: LaneId) -> Vec<Pending> {
        self.unqueue_where(|seat| seat.lane == lane)
            .into_iter()
            .filter_map(|seat| self.pending.remove(&seat.call))
            .collect()
    }

    /// Take call `id` out, its seats still queued with it: it failed.
    pub(super) fn fail(&mut self, id: u64) -> Option<Pending> {
        if !self.pending.contains_key(&id) {
            return None;
        }
        // Its seats out first, the call still pending: the sweep that
        // `unqueue_where` starts with keeps them, so the counts forget them
        // here and only here.
        self.unqueue_where(|seat| seat.call == id);
        self.pending.remove(&id)
    }

    /// Land seat `place` of call `id`; hand the call back once every seat
    /// has landed.
    pub(super) fn land(&mut self, id: u64, place: usize, outputs: TVec<TValue>) -> Option<Pending> {
        let pending = self.pending.get_mut(&id)?;
        pending.served[place] = Some(outputs);
        pending.remaining -= 1;
        if pending.remaining > 0 {
            return None;
        }
        self.pending.remove(&id)
    }

    /// Take call `id` out if it has a single seat (its answer is its row of
    /// the turn).
    pub(super) fn take_one_row(&mut self, id: u64) -> Option<Pending> {
        if self.pending.get(&id)?.served.len() != 1 {
            return None;
        }
        self.pending.remove(&id)
    }

    /// The calls among the seats `fill` picks that are past their deadline
    /// at `now` with no seat seated yet.
    pub(super) fn overdue(&self, fill: &Fill, now: Instant) -> Vec<u64> {
        fill.seated()
            .iter()
            .map(|placed| &self.seats[placed.queue_ix])
            .filter(|seat| seat.deadline.is_some_and(|d| d <= now))
            .filter(|seat| self.pending.get(&seat.call).is_some_and(Pending::untouched))
            .map(|seat| seat.call)
            .collect()
    }

    /// Move the seats `fill` picked (swept queue) into `seated`, in seat
    /// order, their lanes into `lanes`; the rest stay queued in order.
    pub(super) fn take_seated(&mut self, fill: &Fill, seated: &mut Vec<QSeat>, lanes: &mut Vec<LaneId>) {
        let mut rest = std::mem::take(&mut self.spare);
        debug_assert!(rest.is_empty());
        let mut next = fill.seated().iter().peekable();
        for (ix, seat) in self.seats.drain(..).enumerate() {
            match next.peek() {
                Some(placed) if placed.queue_ix == ix => {
                    lanes.push(placed.lane);
                    next.next();
                    seated.push(seat);
                }
                _ => rest.push(seat),
            }
        }
        self.spare = std::mem::replace(&mut self.seats, rest);
        for seat in seated.iter() {
            let lane = seat.lane;
            self.unqueued(lane);
        }
    }

    /// Empty the queue and hand back every pending call.
    pub(super) fn clear(&mut self) -> Vec<Pending> {
        self.seats.clear();
        self.dead = 0;
        self.per_lane.iter_mut().for_each(|n| *n = 0);
        self.lanes_queued = 0;
        self.pending.drain().map(|(_, p)| p).collect()
    }
}
