//! One laned state and everything that must change with it: its lane table,
//! the queued seats, the calls waiting for them, and the turn buffers. Only
//! the thread holding the engine (the worker, or the combining caller holding
//! its lock) touches any of it: taking a lane resets it, and a reset writes
//! the state.
//!
//! One job per file: `queue` (queued seats, pending calls and the per-lane
//! counts kept true with them), `streams` (owners, activity, lost and
//! evicted streams, grants and releases), `turn` (seat, run, recover, land),
//! `records` (each event booked once, in the counters and the facade).

mod queue;
mod records;
mod streams;
mod turn;

use std::any::Any;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use lane_table::{Fill, LaneId, LaneTable};
use laned_metrics::Metrics;
use tract_core::internal::*;

use crate::admission::Admission;
use crate::err::{EndReason, NewRunnerError, RunError, RunErrorKind};
use crate::explicit::ExplicitState;
use crate::iface::Interface;
use crate::policy::{decide, recheck_after, Decision, LearnedTurnTimes, QueueState};
use crate::protocol::{CallResult, Live, Request};
use crate::slot::Slot;
use crate::stack::Stacker;
use arc_swap::ArcSwap;
use records::Records;

use queue::{CallIdHasher, Pending, QSeat};

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
    pub index: usize,
    /// This shard's `metrics` facade handles, bound on the thread building
    /// the runner (to the recorder installed there, as tract's are).
    pub meters: crate::facade::Meters,
}

/// What a caught panic carried, as text.
fn panic_text(panic: Box<dyn Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Reset `lanes` of `state`: an op state that errs or panics doing so is
/// reported as an error, never unwinds into the runner.
fn reset_caught(state: &mut dyn State, lanes: &[LaneId]) -> Result<(), String> {
    let lanes: TVec<TractLane> = lanes.iter().map(|l| tract_lane(*l)).collect();
    match catch_unwind(AssertUnwindSafe(|| state.reset_lanes(&lanes))) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(panic) => Err(format!("an op state panicked resetting lanes: {}", panic_text(panic))),
    }
}

/// Spawn a state from `inner`, a panic caught.
fn spawn_caught(inner: &dyn Runnable) -> Result<Box<dyn State>, String> {
    match catch_unwind(AssertUnwindSafe(|| inner.spawn())) {
        Ok(Ok(state)) => Ok(state),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(panic) => Err(format!("spawning the state panicked: {}", panic_text(panic))),
    }
}

pub(crate) struct Engine {
    /// The laned state; `None` once the engine is closed (the state is
    /// dropped by the closing thread, which is a live one).
    state: Option<Box<dyn State>>,
    inner: Arc<dyn Runnable>,
    iface: Arc<Interface>,
    table: LaneTable,
    /// Seats waiting, oldest first; a call's seats adjacent, in place order.
    /// Seats of cancelled calls may linger until the next sweep
    /// (`dead_seats` of them).
    queue: Vec<QSeat>,
    dead_seats: usize,
    /// Reused buffers for splitting the queue at each turn.
    spare: Vec<QSeat>,
    seated: Vec<QSeat>,
    /// The turn's answered callers that sleep, woken together at its end.
    wakes: Vec<Arc<Slot<CallResult>>>,
    pending: HashMap<u64, Pending, BuildHasherDefault<CallIdHasher>>,
    next_call: u64,
    fill: Fill,
    /// Seats queued per lane, and how many lanes have one queued at least:
    /// a linger ends early when every held lane does.
    queued_per_lane: Vec<u32>,
    lanes_queued: usize,
    /// Per lane: why its stream lost its state (a failed turn), until the
    /// stream is released.
    lost: Vec<Option<String>>,
    /// Per lane: the stream holding it, and when it last called.
    owner: Vec<Option<u64>>,
    last_active: Vec<Instant>,
    /// Streams that lost their lane to eviction, and why, until released.
    evicted: HashMap<u64, String>,
    next_stream: u64,
    /// The runner's admission queue: its oldest waiter is granted every
    /// lane that frees up.
    admission: Arc<Admission>,
    /// This shard's index among the runner's (its grants carry it).
    index: usize,
    idle_timeout: Option<std::time::Duration>,
    /// No new stream or call is taken; what is queued is finished.
    draining: bool,
    /// Stacked batched inputs, keyed by (input slot, turn shape).
    stacker: Stacker,
    /// The model's explicit state, per lane.
    explicit: ExplicitState,
    /// The symbols the state had resolved at spawn, restored after each turn
    /// that resolved some for its seats. `None`: the state cannot forget a
    /// resolved symbol, so calls resolving one are refused.
    symbols_at_spawn: Option<SymbolValues>,
    /// The shard's counters and facade handles, booked together.
    records: Records,
    /// Streams held at most: one lane fewer than the state has.
    max_streams: usize,
    /// The policy and `max_seats`, changeable while serving: read once per
    /// turn.
    live: Arc<ArcSwap<Live>>,
    /// Turn time by occupancy, learned from the turns run.
    times: Arc<LearnedTurnTimes>,
    /// The runner's start, for `Tick`.
    epoch: Instant,
    /// Seats served per second lately (an exponential average over turns,
    /// weight 1/8) and the start of the last turn: in steady state, the
    /// arrival rate the budget policy plans with.
    arrivals_per_sec: f64,
    /// The averages it is the ratio of: seats per turn, seconds between
    /// turn starts (weight 1/8 each).
    arrivals: Option<(f64, f64)>,
    last_turn: Option<Instant>,
    closed: bool,
}

fn resettable(state: &mut Box<dyn State>, inner: &dyn Runnable, lanes: &[LaneId]) -> Result<(), NewRunnerError> {
    if let Err(e) = reset_caught(&mut **state, lanes) {
        let (mut node, mut op) = (None, None);
        if let (Some(simple), Some(model)) = (state.downcast_mut::<TypedSimpleState>(), inner.typed_model()) {
            for (ix, op_state) in simple.op_states.iter_mut().enumerate() {
                if let Some(op_state) = op_state {
                    let tract_lanes: TVec<TractLane> = lanes.iter().map(|l| tract_lane(*l)).collect();
                    let failed = !matches!(
                        catch_unwind(AssertUnwindSafe(|| op_state.reset_lanes(&tract_lanes))),
                        Ok(Ok(()))
                    );
                    if failed {
                        node = model.nodes.get(ix).map(|n| n.name.clone());
                        op = model.nodes.get(ix).map(|n| n.op.name().to_string());
                        break;
                    }
                }
            }
        }
        return Err(NewRunnerError::Reset { node, op, cause: e });
    }
    Ok(())
}

use tract_core::plan::LaneId as TractLane;

/// The runner's lanes are `LaneId`s; tract's own lane type is met
/// only here, at the boundary (resets and seatings).
fn tract_lane(lane: LaneId) -> TractLane {
    TractLane(lane.0)
}

impl Engine {
    /// Spawn the state and reset every lane once, so an op state that cannot
    /// serve several streams fails here, naming the op.
    ///
    /// The state has one lane more than `max_streams`: it is never given to a
    /// stream, so the later rows of a wide call always find a lane to borrow.
    pub fn start(parts: Parts, config: &crate::config::Resolved) -> Result<Engine, NewRunnerError> {
        let Parts {
            inner,
            iface,
            metrics,
            live,
            times,
            admission,
            meters,
            index,
        } = parts;
        let max_streams = config.max_lanes;
        let max_lanes = max_streams + 1;
        let mut state = spawn_caught(&*inner).map_err(NewRunnerError::Spawn)?;
        let every: Vec<LaneId> = (0..max_lanes).map(LaneId).collect();
        resettable(&mut state, &*inner, &every)?;
        let explicit = ExplicitState::new(&iface, max_lanes)?;
        let symbols_at_spawn = state
            .downcast_ref::<TypedSimpleState>()
            .map(|s| s.turn_state.resolved_symbols.clone());
        Ok(Engine {
            state: Some(state),
            inner,
            iface,
            table: LaneTable::new(max_lanes).map_err(|e| NewRunnerError::Config(e.to_string()))?,
            queue: vec![],
            dead_seats: 0,
            spare: vec![],
            wakes: vec![],
            seated: vec![],
            pending: HashMap::default(),
            next_call: 0,
            fill: Fill::default(),
            queued_per_lane: vec![0; max_lanes],
            lanes_queued: 0,
            lost: vec![None; max_lanes],
            owner: vec![None; max_lanes],
            last_active: vec![Instant::now(); max_lanes],
            evicted: HashMap::new(),
            next_stream: 0,
            admission,
            index,
            idle_timeout: config.idle_timeout,
            draining: false,
            stacker: Stacker::default(),
            explicit,
            symbols_at_spawn,
            records: Records::new(metrics, meters, max_streams),
            max_streams,
            live,
            times,
            epoch: Instant::now(),
            arrivals_per_sec: 0.0,
            arrivals: None,
            last_turn: None,
            closed: false,
        })
    }

    /// Whether calls resolving a symbol can be served.
    pub fn can_forget_symbols(&self) -> bool {
        self.symbols_at_spawn.is_some()
    }

    /// What the turn policy decides for the queue now, and after how many
    /// more seats an arrival could change that (the inbox's sleeper rule);
    /// `None` when nothing is queued.
    pub fn decide(&mut self, live: &Live, now: Instant) -> Option<(Decision, usize)> {
        self.sweep();
        let oldest = self.queue.first()?.queued;
        let queue = QueueState {
            oldest,
            queued: self.queue.len(),
            held: self.table.taken(),
            lanes_queued: self.lanes_queued,
            max_seats: live.max_seats,
            epoch: self.epoch,
            arrivals_per_sec: self.arrivals_per_sec,
        };
        let decision = decide(&live.policy, &queue, &*self.times, now);
        Some((decision, recheck_after(&live.policy, &queue, now)))
    }

    pub fn record_policy_wait(&self, wait: std::time::Duration) {
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
            Request::ReadState { stream, slot } => {
                let read = self.own(stream).and_then(|lane| {
                    self.explicit
                        .read(lane)
                        .map_err(|e| RunError::new(RunErrorKind::Output(format!("reading the state: {e:#}"))))
                });
                slot.fill(read);
            }
            // In the order a call is refused (see `enqueue`), so that the
            // status and a call's refusal agree.
            Request::Status { stream, slot } => {
                let status = match self.own(stream) {
                    Err(e) => e.end_reason(),
                    Ok(_) if self.draining => Some(EndReason::Drained),
                    Ok(lane) => self.lost[lane].as_ref().map(|_| EndReason::Lost),
                };
                slot.fill(if self.closed { Some(EndReason::Closed) } else { status });
            }
            Request::WriteState { stream, state, slot } => {
                let written = self.own(stream).and_then(|lane| {
                    self.explicit
                        .write(lane, &state)
                        .map_err(|why| RunError::new(RunErrorKind::State(why)))
                });
                slot.fill(written);
            }
        }
    }

    /// Publish the queue's length (the `seats_queued` gauge): after the
    /// requests were taken in and after each turn.
    pub fn publish_queue(&self) {
        self.records.seats_queued(self.queue_len());
    }

    /// Whether the engine was closed (its state dropped).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Take no new stream or call from now on.
    pub fn start_draining(&mut self) {
        self.draining = true;
    }

    /// Whether the draining flag was taken in (new calls are refused).
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Nothing queued, nothing waiting for an answer.
    pub fn is_quiet(&self) -> bool {
        !self.has_queue() && self.pending.is_empty()
    }

    /// Answer everything with `Closed` and drop the state on this thread.
    pub fn close(&mut self) {
        self.closed = true;
        for (_, pending) in self.pending.drain() {
            pending.slot.fill(Err(RunError::new(RunErrorKind::Closed)));
        }
        self.queue.clear();
        self.dead_seats = 0;
        self.queued_per_lane.iter_mut().for_each(|n| *n = 0);
        self.lanes_queued = 0;
        self.stacker.clear();
        self.state = None;
    }
}
