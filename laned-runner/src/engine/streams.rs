//! The streams: which stream holds which lane, when it last called, which
//! lost their state or their lane and why; granting lanes (reset first),
//! releasing them, evicting idle streams, rebuilding the state.

use std::sync::Arc;
use std::time::Instant;

use lane_table::LaneId;

use crate::err::{RunError, RunErrorKind, SpawnError};
use crate::protocol::{Grant, Request, SpawnResult};
use crate::slot::Slot;

use super::{reset_caught, spawn_caught, Engine};

impl Engine {
    /// Publish the lanes taken (the gauges of the metrics and the facade).
    fn lanes_changed(&self) {
        let taken = self.table.taken();
        self.records.lanes_taken(taken);
    }

    /// The lane of `stream` while it holds one, the reason it lost it otherwise.
    pub(super) fn own(&self, stream: Grant) -> Result<usize, RunError> {
        if self.owner[stream.lane.0] == Some(stream.stream) {
            return Ok(stream.lane.0);
        }
        Err(RunError::new(match self.evicted.get(&stream.stream) {
            Some(why) => RunErrorKind::Evicted(why.clone()),
            None => RunErrorKind::Closed,
        }))
    }

    /// A lane for a new stream, or `Full` at once: waiting for a lane is
    /// the runner's admission queue, which spans every shard.
    pub(super) fn spawn(&mut self, slot: Arc<Slot<SpawnResult>>, waited: Option<std::time::Duration>) {
        if self.closed {
            return slot.fill(Err(SpawnError::Closed));
        }
        // Not admitting (a soft drain started, or the runner closing):
        // refused from the instant `stop_admitting` or the close refused
        // admission, whatever this request's path, with that refusal.
        if let Some(refusal) = self.admission.refusal() {
            return slot.fill(Err(refusal));
        }
        if self.draining {
            return slot.fill(Err(SpawnError::Draining));
        }
        // The admission queue goes first (arrival order): a direct try
        // gets a lane only once every waiter has one, so a spawner is
        // refused only when no lane is free.
        self.admit_waiting();
        if self.table.taken() < self.max_streams {
            if !self.grant(slot, waited) {
                // Nobody took the lane: it is the next waiter's.
                self.admit_waiting();
            }
        } else {
            slot.fill(Err(SpawnError::Full {
                total_lanes: self.max_streams,
                waiting: 0,
            }));
        }
    }

    /// Hand a free lane (reset) to a spawner. Returns false when the
    /// spawner went away meanwhile (its slot refused the grant): the lane
    /// is free again, for the next one.
    pub(super) fn grant(&mut self, slot: Arc<Slot<SpawnResult>>, waited: Option<std::time::Duration>) -> bool {
        let Some(lane) = self.table.take() else { return true };
        if let Err(why) = self.reset_lane(lane) {
            // The lane goes back free: whatever the failed reset left in it,
            // its next holder (a stream or a borrowed row) resets it first,
            // and gets it only if that reset succeeds.
            let _ = self.table.give_back(lane);
            slot.fill(Err(SpawnError::Reset(why)));
            return true;
        }
        let stream = self.next_stream;
        self.next_stream += 1;
        // Book the lane before answering: a spawner reading the gauge right
        // after this one returns must see the lane taken (placement reads it).
        self.owner[lane.0] = Some(stream);
        self.last_active[lane.0] = Instant::now();
        self.lanes_changed();
        let grant = Grant {
            shard: self.index,
            lane,
            stream,
        };
        if slot.offer(Ok(grant)).is_err() {
            // The spawner went away meanwhile (its future dropped, its wait
            // timed out): the lane goes back.
            self.owner[lane.0] = None;
            let _ = self.table.give_back(lane);
            self.lanes_changed();
            return false;
        }
        self.records.admission(waited);
        true
    }

    /// Grant free lanes to the admission queue's oldest waiters, one lane
    /// each, while both last (none while draining or closed: the refusal
    /// answers them).
    pub(super) fn admit_waiting(&mut self) {
        while !self.closed && !self.draining && self.table.taken() < self.max_streams {
            let Some(waiter) = self.admission.next_waiter() else {
                return;
            };
            self.grant(waiter.slot, Some(waiter.since.elapsed()));
        }
    }

    /// Reset `lane` (its op states and its explicit state) for a new holder.
    pub(super) fn reset_lane(&mut self, lane: LaneId) -> Result<(), String> {
        let Some(state) = self.state.as_mut() else {
            return Err("the laned state is closed".into());
        };
        reset_caught(&mut **state, &[lane])?;
        self.explicit.reset(&[lane.0]).map_err(|e| format!("{e:#}"))
    }

    /// A fresh state in place of the current one, every lane reset; the
    /// streams holding a lane lose their state (`why` says why). If even
    /// that fails, the current state is kept: its next turn fails too, and
    /// says so.
    pub(super) fn rebuild(&mut self, why: &str) {
        let every: Vec<LaneId> = (0..self.table.max_lanes()).map(LaneId).collect();
        let fresh = spawn_caught(&*self.inner).and_then(|mut s| reset_caught(&mut *s, &every).map(|_| s));
        let Ok(fresh) = fresh else { return };
        self.state = Some(fresh);
        let every: Vec<usize> = (0..self.table.max_lanes()).collect();
        let _ = self.explicit.reset(&every);
        for lane in 0..self.owner.len() {
            if self.owner[lane].is_some() {
                self.lost[lane] = Some(format!("the state was rebuilt after a turn failed: {why}"));
            }
        }
    }

    /// Free `lane`: its queued seats go (nobody waits for them), its marks
    /// are cleared, it goes back to the table and waiters are admitted.
    pub(super) fn free_lane(&mut self, lane: LaneId) {
        for seat in self.unqueue_where(|seat| seat.lane == lane) {
            if let Some(pending) = self.pending.remove(&seat.call) {
                pending.slot.fill(Err(RunError::new(RunErrorKind::Cancelled)));
            }
        }
        self.lost[lane.0] = None;
        self.owner[lane.0] = None;
        let _ = self.table.give_back(lane);
        self.lanes_changed();
        // The gauge first, then the queue (see `Admission::arrive`): the
        // oldest waiter gets the lane.
        self.admission.lane_freed();
        self.admit_waiting();
    }

    pub(super) fn release(&mut self, grant: Grant) {
        self.evicted.remove(&grant.stream);
        // An evicted stream's lane may be another stream's by now.
        if self.owner[grant.lane.0] == Some(grant.stream) {
            self.free_lane(grant.lane);
        }
    }

    /// Whether the stream on `lane`, no seat of it queued, had been idle
    /// for the timeout by `at` (false without a timeout). The one rule of
    /// idleness: for a take of the inbox, `at` is the take; for a call, the
    /// moment it was made, however late the engine looks.
    pub(super) fn idle_by(&self, lane: LaneId, at: Instant) -> bool {
        let Some(idle) = self.idle_timeout else {
            return false;
        };
        self.queued_per_lane[lane.0] == 0 && self.last_active[lane.0].checked_add(idle).is_some_and(|due| due <= at)
    }

    /// Evict `stream` from `lane` for being idle; returns why, as the
    /// stream is told.
    pub(super) fn evict(&mut self, lane: LaneId, stream: u64) -> String {
        let why = format!("it did not call for {:?}", self.idle_timeout.unwrap_or_default());
        self.evicted.insert(stream, why.clone());
        // A reset that fails here is not the evicted stream's concern: the
        // lane's next holder resets it again first.
        let _ = self.reset_lane(lane);
        self.free_lane(lane);
        why
    }

    /// Evict the streams idle for longer than the timeout as of `now`
    /// (none with a seat queued, none with a call among `batch`). Allocates
    /// nothing: the batch is searched only for an overdue stream.
    pub(super) fn evict_idle_at(&mut self, now: Instant, batch: &[Request]) {
        if self.closed {
            return;
        }
        for lane in 0..self.owner.len() {
            let Some(stream) = self.owner[lane] else { continue };
            if !self.idle_by(LaneId(lane), now) {
                continue;
            }
            let calling = batch
                .iter()
                .any(|r| matches!(r, Request::Call(call) if call.stream.stream == stream));
            if !calling {
                self.evict(LaneId(lane), stream);
            }
        }
    }

    /// When the next idle stream is due (a time past, for one overdue):
    /// the holder of the state takes the inbox in then, which evicts it.
    pub fn next_idle_due(&self) -> Option<Instant> {
        let idle = self.idle_timeout?;
        if self.closed {
            return None;
        }
        (0..self.owner.len())
            .filter(|&lane| self.owner[lane].is_some() && self.queued_per_lane[lane] == 0)
            .filter_map(|lane| self.last_active[lane].checked_add(idle))
            .min()
    }
}
