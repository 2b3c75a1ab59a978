//! One laned state and everything that must change with it, as parts that
//! each own their data (one job per file):
//! - `model`: the state, its explicit state per lane, the stacked inputs;
//!   resets, runs, recovery, rebuilds (knows no stream, no call);
//! - `queue`: the queued seats, the pending calls, the per-lane counts
//!   kept true with them (answers nobody: hands calls back);
//! - `streams`: the lane table, each lane's stream and its last call, the
//!   lost and evicted marks (their only writer);
//! - `turn`: one turn over the others, borrowed for its length, and what
//!   only a turn uses (the fill, the wake list, the arrival rate);
//! - `records`: each event booked once, in the counters and the facade.
//!
//! This file composes them: one method per request, each answering its
//! caller. Only the thread holding the engine (the worker, or the
//! combining caller holding its lock) touches any of it: taking a lane
//! resets it, and a reset writes the state. No part imports another's
//! owner: `mod.rs` uses them all, `turn` the other four, `model` the
//! queue's seat type, and none uses `mod.rs`.

mod model;
mod queue;
mod records;
mod streams;
mod turn;

use std::sync::Arc;
use std::time::{Duration, Instant};

use laned_metrics::Metrics;
use tract_core::internal::*;

use crate::admission::Admission;
use crate::err::{EndReason, NewRunnerError, RunError, RunErrorKind, SpawnError};
use crate::iface::Interface;
use crate::life::Life;
use crate::policy::{decide, recheck_after, Decision, LearnedTurnTimes, QueueState};
use crate::protocol::{Call, CallResult, Grant, Live, Request, SpawnResult};
use crate::slot::Slot;
use crate::trace::event;
use arc_swap::ArcSwap;
use lane_table::LaneId;
use model::Model;
use queue::Queue;
use records::Records;
use streams::Streams;
use turn::{withdraw, Turn};

use crate::width::Width;

/// What a shard is built from: the runner's shared parts and its own.
pub(crate) struct Parts {
    pub inner: Arc<dyn Runnable>,
    pub iface: Arc<Interface>,
    /// This shard's counters.
    pub metrics: Arc<Metrics>,
    /// The live policy, shared by every shard.
    pub live: Arc<ArcSwap<Live>>,
    /// This shard's learned turn times.
    pub times: Arc<LearnedTurnTimes>,
    /// The runner's admission queue, shared by every shard.
    pub admission: Arc<Admission>,
    /// The runner's life, shared by every part.
    pub life: Arc<Life>,
    pub index: usize,
    /// This shard's `metrics` facade handles, bound on the thread building
    /// the runner (to the recorder installed there, as tract's are).
    pub meters: crate::facade::Meters,
}

pub(crate) struct Engine {
    model: Model,
    queue: Queue,
    streams: Streams,
    turn: Turn,
    /// The shard's counters and facade handles, booked together.
    records: Records,
    /// The runner's admission queue: its oldest waiter is granted every
    /// lane that frees up.
    admission: Arc<Admission>,
    /// This shard's index among the runner's (its grants carry it).
    index: usize,
    /// Turn time by occupancy, learned from the turns run.
    times: Arc<LearnedTurnTimes>,
    /// The width learned from `times` and its probes.
    width: Width,
    /// Turns run (or tried), for a helper checking that the turn it handed
    /// to a task ran.
    turns_run: u64,
    /// The runner's start, for `Tick`.
    epoch: Instant,
    /// The runner's life: from step 5 on (draining) no new stream or call
    /// is taken in, what is queued is finished. Whether the engine itself
    /// was closed (step 9) is whether its state is still there.
    life: Arc<Life>,
}

impl Engine {
    /// Spawn the state and reset every lane once (see [`Model::start`]).
    ///
    /// The state has one lane more than `max_streams`: it is never given to a
    /// stream, so the later rows of a wide call always find a lane to borrow.
    pub fn start(parts: Parts, config: &crate::config::Resolved) -> Result<Engine, NewRunnerError> {
        let Parts {
            inner,
            iface,
            metrics,
            // The shard's: it loads the settings once per turn and hands
            // them to `turn`.
            live: _,
            times,
            admission,
            meters,
            index,
            life,
        } = parts;
        let max_streams = config.max_lanes;
        let model = Model::start(inner, iface, max_streams + 1)?;
        Ok(Engine {
            model,
            queue: Queue::new(max_streams + 1),
            streams: Streams::new(max_streams, config.idle_timeout)?,
            turn: Turn::default(),
            records: Records::new(metrics, meters, max_streams),
            admission,
            index,
            times,
            width: Width::default(),
            turns_run: 0,
            epoch: Instant::now(),
            life,
        })
    }

    /// Whether calls resolving a symbol can be served.
    pub fn can_forget_symbols(&self) -> bool {
        self.model.can_forget_symbols()
    }

    /// What the turn policy decides for the queue now, and after how many
    /// more seats an arrival could change that (the inbox's sleeper rule);
    /// `None` when nothing is queued.
    pub fn decide(&mut self, live: &Live, now: Instant) -> Option<(Decision, usize)> {
        self.queue.sweep();
        let oldest = self.queue.seats().first()?.queued;
        let queue = QueueState {
            oldest,
            queued: self.queue.len(),
            held: self.streams.taken(),
            lanes_queued: self.queue.lanes_queued(),
            max_seats: self.width.planned(live),
            epoch: self.epoch,
            arrivals_per_sec: self.turn.arrivals_per_sec(),
        };
        let decision = decide(&live.policy, &queue, &*self.times, now);
        Some((decision, recheck_after(&live.policy, &queue, now)))
    }

    pub fn record_policy_wait(&self, wait: Duration) {
        self.records.policy_wait(wait);
    }

    /// Take in the requests taken from the inbox at `taken_at`. Idle
    /// streams are evicted first, as of that instant, so that a spawn in
    /// the batch may have their lanes; a stream with a call in the batch is
    /// left to its call, which `enqueue` judges by the moment it was made.
    /// A call pushed after `taken_at` is judged in the next batch the same
    /// way: a stream that called before it was due is never evicted.
    pub fn accept_batch(&mut self, requests: Vec<Request>, taken_at: Instant) {
        self.evict_idle_at(taken_at, &requests);
        for request in requests {
            self.take(request);
        }
        self.publish_queue();
    }

    fn take(&mut self, request: Request) {
        match request {
            Request::Spawn { slot, waited } => self.spawn(slot, waited),
            Request::Admit => self.admit_waiting(),
            Request::Call(call) => self.enqueue(call),
            Request::Release(grant) => self.release(grant),
            Request::Cancel(slot) => self.cancel(&slot),
            Request::ReadState { stream, export, slot } => {
                let read = self.streams.own(stream).and_then(|lane| {
                    if let (true, Some(why)) = (export, self.streams.lost(LaneId(lane))) {
                        return Err(RunError::new(RunErrorKind::Lost(why.clone())));
                    }
                    self.model
                        .read(lane)
                        .map(|state| (state, self.streams.pulses(lane)))
                        .map_err(|e| RunError::new(RunErrorKind::Output(format!("reading the state: {e:#}"))))
                });
                slot.fill(read);
            }
            // In the order a call is refused (see `enqueue`), so that the
            // status and a call's refusal agree.
            Request::Status { stream, slot } => {
                let status = match self.streams.own(stream) {
                    Err(e) => e.end_reason(),
                    Ok(_) if self.is_draining() => Some(EndReason::Drained),
                    Ok(lane) => self.streams.lost(LaneId(lane)).map(|_| EndReason::Lost),
                };
                slot.fill(if self.is_closed() {
                    Some(EndReason::Closed)
                } else {
                    status
                });
            }
            Request::Pulses { stream, slot } => {
                slot.fill(self.streams.own(stream).map(|lane| self.streams.pulses(lane)));
            }
            Request::WriteState {
                stream,
                state,
                pulses,
                slot,
            } => {
                let written = self.streams.own(stream).and_then(|lane| {
                    let implied = self
                        .model
                        .write(lane, &state)
                        .map_err(|why| RunError::new(RunErrorKind::State(why)))?;
                    // An import says the stream's count (checked against
                    // its positions); a restore's is where its kept
                    // position stands, if the model keeps one.
                    if let Some(pulses) = pulses.or(implied) {
                        self.streams.set_pulses(LaneId(lane), pulses);
                    }
                    Ok(())
                });
                slot.fill(written);
            }
        }
    }

    /// A call: refused (closed, not the stream's lane, evicted, draining,
    /// lost, a symbol the state cannot forget), or queued.
    fn enqueue(&mut self, call: Call) {
        if self.is_closed() {
            call.slot.fill(Err(RunError::new(RunErrorKind::Closed)));
            return;
        }
        let lane = call.stream.lane;
        if let Err(gone) = self.streams.own(call.stream) {
            call.slot.fill(Err(gone));
            return;
        }
        // Idleness is measured to the moment the caller called, not to the
        // moment the engine takes the call in (after a long turn, say): a
        // call made in time is served, one made after the timeout finds
        // its stream evicted, as it would had anyone looked meanwhile.
        if self.streams.idle_by(lane, self.queue.has_seat_on(lane), call.queued) {
            let why = self.evict(lane, call.stream.stream);
            call.slot.fill(Err(RunError::new(RunErrorKind::Evicted(why))));
            return;
        }
        if self.is_draining() {
            call.slot.fill(Err(RunError::new(RunErrorKind::Draining)));
            return;
        }
        // The instant the caller took when queueing: no clock read here.
        self.streams.touch(lane, call.queued);
        if let Some(why) = self.streams.lost(lane) {
            self.records.failed_seats(call.seats.len());
            call.slot.fill(Err(RunError::new(RunErrorKind::Lost(why.clone()))));
            return;
        }
        if !call.group.resolved().is_empty() && !self.model.can_forget_symbols() {
            call.slot.fill(Err(RunError::new(RunErrorKind::Symbol(
                "this state cannot forget a resolved symbol after the turn".into(),
            ))));
            return;
        }
        self.queue.push(call);
    }

    /// A cancelled call: dropped and answered `Cancelled` if none of its
    /// seats was seated yet (requests are taken between turns, so no seat is
    /// in a turn now); left to complete otherwise, its answer the verdict.
    /// A call no longer pending was answered already: that answer stands.
    fn cancel(&mut self, slot: &Arc<Slot<CallResult>>) {
        if let Some(id) = self.queue.pending_id(slot) {
            withdraw(&mut self.queue, &mut self.streams, id, RunErrorKind::Cancelled);
        }
    }

    /// Publish the lanes taken (the gauges of the metrics and the facade).
    fn lanes_changed(&self) {
        self.records.lanes_taken(self.streams.taken());
    }

    /// A lane for a new stream, or `Full` at once: waiting for a lane is
    /// the runner's admission queue, which spans every shard.
    fn spawn(&mut self, slot: Arc<Slot<SpawnResult>>, waited: Option<Duration>) {
        if self.is_closed() {
            return slot.fill(Err(SpawnError::Closed));
        }
        // Not admitting (a soft drain started, or the runner closing):
        // refused from the instant `stop_admitting` or the close refused
        // admission, whatever this request's path, with that refusal.
        if let Some(refusal) = self.admission.refusal() {
            return slot.fill(Err(refusal));
        }
        if self.is_draining() {
            return slot.fill(Err(SpawnError::Draining));
        }
        // The admission queue goes first (arrival order): a direct try
        // gets a lane only once every waiter has one, so a spawner is
        // refused only when no lane is free.
        self.admit_waiting();
        if self.streams.has_room() {
            if !self.grant(slot, waited) {
                // Nobody took the lane: it is the next waiter's.
                self.admit_waiting();
            }
        } else {
            slot.fill(Err(SpawnError::Full {
                total_lanes: self.streams.max_streams(),
                waiting: 0,
            }));
        }
    }

    /// Hand a free lane (reset) to a spawner. Returns false when the
    /// spawner went away meanwhile (its slot refused the grant): the lane
    /// is free again, for the next one.
    fn grant(&mut self, slot: Arc<Slot<SpawnResult>>, waited: Option<Duration>) -> bool {
        let Some(lane) = self.streams.take_lane() else {
            return true;
        };
        if let Err(why) = self.model.reset(lane) {
            // The lane goes back free: whatever the failed reset left in it,
            // its next holder (a stream or a borrowed row) resets it first,
            // and gets it only if that reset succeeds.
            self.streams.give_back(lane);
            slot.fill(Err(SpawnError::Reset(why)));
            return true;
        }
        // Book the lane before answering: a spawner reading the gauge right
        // after this one returns must see the lane taken (placement reads it).
        let stream = self.streams.book(lane);
        self.lanes_changed();
        let grant = Grant {
            shard: self.index,
            lane,
            stream,
        };
        if slot.offer(Ok(grant)).is_err() {
            // The spawner went away meanwhile (its future dropped, its wait
            // timed out): the lane goes back.
            self.streams.unbook(lane);
            self.lanes_changed();
            return false;
        }
        self.records.admission(waited);
        true
    }

    /// Grant free lanes to the admission queue's oldest waiters, one lane
    /// each, while both last (none while draining or closed: the refusal
    /// answers them).
    fn admit_waiting(&mut self) {
        while !self.is_closed() && !self.is_draining() && self.streams.has_room() {
            let Some(waiter) = self.admission.next_waiter() else {
                return;
            };
            self.grant(waiter.slot, Some(waiter.since.elapsed()));
        }
    }

    /// Free `lane`: its queued seats go (nobody waits for them), its marks
    /// are cleared, it goes back to the table and waiters are admitted.
    fn free_lane(&mut self, lane: LaneId) {
        for pending in self.queue.drop_lane(lane) {
            pending.slot.fill(Err(RunError::new(RunErrorKind::Cancelled)));
        }
        self.streams.free(lane);
        self.lanes_changed();
        // The gauge first, then the queue (see `Admission::arrive`): the
        // oldest waiter gets the lane.
        self.admission.lane_freed();
        self.admit_waiting();
    }

    /// The last handle of a stream went: its lane goes back, if still its.
    fn release(&mut self, grant: Grant) {
        if self.streams.release(grant) {
            self.free_lane(grant.lane);
        }
    }

    /// Evict `stream` from `lane` for being idle; returns why, as the
    /// stream is told.
    fn evict(&mut self, lane: LaneId, stream: u64) -> String {
        let why = self.streams.mark_evicted(stream);
        self.records.eviction();
        event!(
            info,
            shard = self.index,
            lane = lane.0,
            stream,
            "a stream was evicted: {why}"
        );
        // A reset that fails here is not the evicted stream's concern: the
        // lane's next holder resets it again first.
        let _ = self.model.reset(lane);
        self.free_lane(lane);
        why
    }

    /// Evict the streams idle for longer than the timeout as of `now`
    /// (none with a seat queued, none with a call among `batch`). Allocates
    /// nothing: the batch is searched only for an overdue stream.
    fn evict_idle_at(&mut self, now: Instant, batch: &[Request]) {
        if self.is_closed() {
            return;
        }
        for lane in (0..self.streams.lanes()).map(LaneId) {
            let Some(stream) = self.streams.holder(lane) else {
                continue;
            };
            if !self.streams.idle_by(lane, self.queue.has_seat_on(lane), now) {
                continue;
            }
            let calling = batch
                .iter()
                .any(|r| matches!(r, Request::Call(call) if call.stream.stream == stream));
            if !calling {
                self.evict(lane, stream);
            }
        }
    }

    /// When the next idle stream is due (a time past, for one overdue):
    /// the holder of the state takes the inbox in then, which evicts it.
    pub fn next_idle_due(&self) -> Option<Instant> {
        if self.is_closed() {
            return None;
        }
        self.streams.next_idle_due(|lane| self.queue.has_seat_on(lane))
    }

    /// Turns run (or tried) on this engine so far.
    pub fn turns_run(&self) -> u64 {
        self.turns_run
    }

    /// Run one turn from the head of the queue, with the live settings the
    /// turn was decided with.
    pub fn turn(&mut self, live: &Live) {
        self.turns_run += 1;
        self.turn.run(turn::Parts {
            queue: &mut self.queue,
            streams: &mut self.streams,
            model: &mut self.model,
            records: &self.records,
            times: &self.times,
            width: &mut self.width,
            live,
            shard: self.index,
        });
    }

    /// Hand the state's next turn to a task whose call is queued: wake the
    /// oldest such task (its poll then tries to hold the state and runs the
    /// turn itself, its answers' wakes local to its executor). False where
    /// no queued call's caller is a task waiting in its poll.
    pub fn pass_to_a_task(&mut self) -> bool {
        self.queue.sweep();
        self.queue.queued_slots().any(|slot| slot.nudge())
    }

    /// Whether any seat waits for a turn.
    pub fn has_queue(&self) -> bool {
        self.queue.has_seats()
    }

    /// Publish the queue's length (the `seats_queued` gauge): after the
    /// requests were taken in and after each turn.
    pub fn publish_queue(&self) {
        self.records.seats_queued(self.queue.len());
    }

    /// Whether the engine was closed (step 9: its state dropped).
    pub fn is_closed(&self) -> bool {
        !self.model.is_open()
    }

    /// Whether the runner drains (step 5): new streams and calls are
    /// refused.
    pub fn is_draining(&self) -> bool {
        self.life.is_draining()
    }

    /// Nothing queued, nothing waiting for an answer.
    pub fn is_quiet(&self) -> bool {
        self.queue.is_quiet()
    }

    /// Answer everything with `Closed` and drop the state on this thread.
    pub fn close(&mut self) {
        for pending in self.queue.clear() {
            pending.slot.fill(Err(RunError::new(RunErrorKind::Closed)));
        }
        self.model.close();
    }
}
