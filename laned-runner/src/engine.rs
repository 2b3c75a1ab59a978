//! One laned state and everything that must change with it: its lane table,
//! the queued seats, the calls waiting for them, and the turn buffers. Only
//! the thread holding the engine (the worker, or the combining caller holding
//! its lock) touches any of it: taking a lane resets it, and a reset writes
//! the state.

use std::any::Any;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use lane_table::{fill_into, Fill, LaneTable, QueuedSeat};
use laned_metrics::Metrics;
use tract_core::internal::*;
use tract_core::plan::Seating;

use crate::admission::Admission;
use crate::err::{NewRunnerError, RunError, RunErrorKind, SpawnError};
use crate::explicit::ExplicitState;
use crate::iface::{Group, Interface};
use crate::policy::{LearnedTurnTimes, QueueState, TurnPolicy};
use crate::slot::Slot;
use crate::stack::Stacker;
use arc_swap::ArcSwap;

pub(crate) type CallResult = Result<Answer, RunError>;

/// The settings that can change while the runner serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Live {
    pub policy: TurnPolicy,
    pub max_seats: usize,
}

/// What a call is answered with. A one-row call gets the whole turn's
/// outputs and its seat: its caller slices its own row, off the worker's
/// critical path.
pub(crate) enum Answer {
    Outputs(TVec<TValue>),
    Row { turn: Arc<TVec<TValue>>, seat: usize },
}

impl Answer {
    /// The call's outputs, its row sliced out of the turn's where needed.
    pub fn into_outputs(self, batch_out: &[bool]) -> Result<TVec<TValue>, RunError> {
        match self {
            Answer::Outputs(outputs) => Ok(outputs),
            Answer::Row { turn, seat } => turn
                .iter()
                .enumerate()
                .map(|(ix, output)| {
                    if batch_out.get(ix).copied().unwrap_or(false) && output.shape()[0] > 1 {
                        output
                            .slice(0, seat, seat + 1)
                            .map(|t| t.into_tvalue())
                            .map_err(|e| RunError::new(RunErrorKind::Turn(format!("slicing output {ix}: {e:#}"))))
                    } else {
                        Ok(output.clone())
                    }
                })
                .collect(),
        }
    }
}
pub(crate) type SpawnResult = Result<Grant, SpawnError>;

/// A lane handed to a new stream, with the stream's id: the engine answers
/// the stream's requests only while the lane is still that stream's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub lane: lane_table::LaneId,
    pub stream: u64,
}

/// What a handle asks of the engine.
// `Call` is the common request and is moved, not boxed: no allocation per call.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Request {
    /// A new stream wants a lane (`waited`: how long it waited in the
    /// runner's admission queue, for the metrics).
    Spawn {
        slot: Arc<Slot<SpawnResult>>,
        waited: Option<std::time::Duration>,
    },
    /// A stream wants one or several seats.
    Call(Call),
    /// The last handle of a stream was dropped: its lane goes back.
    Release(Grant),
    /// The call answering into this slot was cancelled: drop its queued seats.
    Cancel(Arc<Slot<CallResult>>),
    /// A stream reads its explicit state.
    ReadState {
        stream: Grant,
        slot: Arc<Slot<Result<TVec<Tensor>, RunError>>>,
    },
    /// A stream overwrites its explicit state.
    WriteState {
        stream: Grant,
        state: TVec<Tensor>,
        slot: Arc<Slot<Result<(), RunError>>>,
    },
}

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

/// One checked call, already split into seats on the caller's thread.
pub(crate) struct Call {
    pub stream: Grant,
    pub seats: TVec<TVec<TValue>>,
    pub group: Group,
    pub slot: Arc<Slot<CallResult>>,
    pub queued: Instant,
}

/// One seat waiting for a turn.
struct QSeat {
    call: u64,
    place: usize,
    lane: lane_table::LaneId,
    group: Group,
    /// The seat's batched inputs, one row each.
    inputs: TVec<TValue>,
    queued: Instant,
}

impl QueuedSeat for QSeat {
    type Group = Group;
    fn call(&self) -> u64 {
        self.call
    }
    fn place(&self) -> usize {
        self.place
    }
    fn lane(&self) -> lane_table::LaneId {
        self.lane
    }
    fn group(&self) -> &Group {
        &self.group
    }
}

/// A call with seats still to land.
struct Pending {
    slot: Arc<Slot<CallResult>>,
    /// The caller's lane: its row 0 advances that lane's state.
    lane: lane_table::LaneId,
    served: TVec<Option<TVec<TValue>>>,
    remaining: usize,
}

/// Why a turn failed, and whether the state was touched before it did: a
/// turn refused before tract saw it (its inputs could not be stacked, a
/// borrowed lane could not be reset) leaves every stream's state as it was.
struct Failure {
    why: String,
    touched: bool,
}

impl Failure {
    fn untouched(why: String) -> Failure {
        Failure { why, touched: false }
    }

    fn touched(why: String) -> Failure {
        Failure { why, touched: true }
    }
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
fn reset_caught(state: &mut dyn State, lanes: &[TractLane]) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(|| state.reset_lanes(lanes))) {
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
    queue: Vec<QSeat>,
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
    /// The runner's admission queue, told when a lane frees up.
    admission: Arc<Admission>,
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
    metrics: Arc<Metrics>,
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
    last_turn: Option<Instant>,
    closed: bool,
}

fn resettable(state: &mut Box<dyn State>, inner: &dyn Runnable, lanes: &[TractLane]) -> Result<(), NewRunnerError> {
    if let Err(e) = reset_caught(&mut **state, lanes) {
        let (mut node, mut op) = (None, None);
        if let (Some(simple), Some(model)) = (state.downcast_mut::<TypedSimpleState>(), inner.typed_model()) {
            for (ix, op_state) in simple.op_states.iter_mut().enumerate() {
                if let Some(op_state) = op_state {
                    let failed = !matches!(
                        catch_unwind(AssertUnwindSafe(|| op_state.reset_lanes(lanes))),
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

fn tract_lane(lane: lane_table::LaneId) -> TractLane {
    TractLane(lane.0)
}

impl Engine {
    /// Spawn the state and reset every lane once, so an op state that cannot
    /// serve several streams fails here, naming the op.
    ///
    /// The state has one lane more than `max_streams`: it is never given to a
    /// stream, so the later rows of a wide call always find a lane to borrow.
    pub fn start(parts: crate::shard::Parts, config: &crate::config::Resolved) -> Result<Engine, NewRunnerError> {
        let crate::shard::Parts {
            inner,
            iface,
            metrics,
            live,
            times,
            admission,
            ..
        } = parts;
        let max_streams = config.max_lanes;
        let max_lanes = max_streams + 1;
        let mut state = spawn_caught(&*inner).map_err(NewRunnerError::Spawn)?;
        let every: Vec<TractLane> = (0..max_lanes).map(TractLane).collect();
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
            idle_timeout: config.idle_timeout,
            draining: false,
            stacker: Stacker::default(),
            explicit,
            symbols_at_spawn,
            metrics,
            max_streams,
            live,
            times,
            epoch: Instant::now(),
            arrivals_per_sec: 0.0,
            last_turn: None,
            closed: false,
        })
    }

    /// Whether calls resolving a symbol can be served.
    pub fn can_forget_symbols(&self) -> bool {
        self.symbols_at_spawn.is_some()
    }

    pub fn has_queue(&self) -> bool {
        !self.queue.is_empty()
    }

    /// What the turn policy sees of the queue.
    pub fn queue_state(&self, max_seats: usize) -> Option<QueueState> {
        let oldest = self.queue.first()?.queued;
        Some(QueueState {
            oldest,
            queued: self.queue.len(),
            held: self.table.taken(),
            lanes_queued: self.lanes_queued,
            max_seats,
            epoch: self.epoch,
            arrivals_per_sec: self.arrivals_per_sec,
        })
    }

    pub fn times(&self) -> &LearnedTurnTimes {
        &self.times
    }

    pub fn record_policy_wait(&self, wait: std::time::Duration) {
        self.metrics.record_policy_wait(wait);
    }

    fn queued(&mut self, lane: lane_table::LaneId) {
        let n = &mut self.queued_per_lane[lane.0];
        if *n == 0 {
            self.lanes_queued += 1;
        }
        *n += 1;
    }

    fn unqueued(&mut self, lane: lane_table::LaneId) {
        let n = &mut self.queued_per_lane[lane.0];
        *n -= 1;
        if *n == 0 {
            self.lanes_queued -= 1;
        }
    }

    pub fn accept(&mut self, request: Request) {
        match request {
            Request::Spawn { slot, waited } => self.spawn(slot, waited),
            Request::Call(call) => self.enqueue(call),
            Request::Release(grant) => self.release(grant),
            Request::Cancel(slot) => self.cancel(&slot),
            Request::ReadState { stream, slot } => {
                let read = self.own(stream).and_then(|lane| {
                    self.explicit
                        .read(lane)
                        .map_err(|e| RunError::new(RunErrorKind::Turn(format!("{e:#}"))))
                });
                slot.fill(read);
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

    /// The lane of `stream` while it holds one, the reason it lost it otherwise.
    fn own(&self, stream: Grant) -> Result<usize, RunError> {
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
    fn spawn(&mut self, slot: Arc<Slot<SpawnResult>>, waited: Option<std::time::Duration>) {
        if self.closed {
            return slot.fill(Err(SpawnError::Closed));
        }
        if self.draining {
            return slot.fill(Err(SpawnError::Draining));
        }
        if self.table.taken() < self.max_streams {
            self.grant(slot, waited);
        } else {
            slot.fill(Err(SpawnError::Full {
                lanes: self.max_streams,
                waiting: 0,
            }));
        }
    }

    /// Hand a free lane (reset) to a spawner; if it gave up meanwhile, the
    /// lane goes back and the next waiter is tried.
    fn grant(&mut self, slot: Arc<Slot<SpawnResult>>, waited: Option<std::time::Duration>) {
        let Some(lane) = self.table.take() else { return };
        if let Err(why) = self.reset_lane(lane) {
            // The lane goes back free: whatever the failed reset left in it,
            // its next holder (a stream or a borrowed row) resets it first,
            // and gets it only if that reset succeeds.
            let _ = self.table.give_back(lane);
            slot.fill(Err(SpawnError::Reset(why)));
            return;
        }
        let stream = self.next_stream;
        self.next_stream += 1;
        // Book the lane before answering: a spawner reading the gauge right
        // after this one returns must see the lane taken (placement reads it).
        self.owner[lane.0] = Some(stream);
        self.last_active[lane.0] = Instant::now();
        self.metrics.set_lanes_taken(self.table.taken());
        slot.fill(Ok(Grant { lane, stream }));
        match waited {
            Some(wait) => self.metrics.record_admission_waited(wait),
            None => self.metrics.record_admission(),
        }
    }

    /// Reset `lane` (its op states and its explicit state) for a new holder.
    fn reset_lane(&mut self, lane: lane_table::LaneId) -> Result<(), String> {
        let Some(state) = self.state.as_mut() else {
            return Err("the laned state is closed".into());
        };
        reset_caught(&mut **state, &[tract_lane(lane)])?;
        self.explicit.reset(&[lane.0]).map_err(|e| format!("{e:#}"))
    }

    /// A fresh state in place of the current one, every lane reset; the
    /// streams holding a lane lose their state (`why` says why). If even
    /// that fails, the current state is kept: its next turn fails too, and
    /// says so.
    fn rebuild(&mut self, why: &str) {
        let every: Vec<TractLane> = (0..self.table.max_lanes()).map(TractLane).collect();
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
    fn free_lane(&mut self, lane: lane_table::LaneId) {
        for seat in self.unqueue_where(|seat| seat.lane == lane) {
            if let Some(pending) = self.pending.remove(&seat.call) {
                pending.slot.fill(Err(RunError::new(RunErrorKind::Cancelled)));
            }
        }
        self.lost[lane.0] = None;
        self.owner[lane.0] = None;
        let _ = self.table.give_back(lane);
        self.metrics.set_lanes_taken(self.table.taken());
        // Spawners waiting (on any shard's lane) try again.
        self.admission.lane_freed();
    }

    fn release(&mut self, grant: Grant) {
        self.evicted.remove(&grant.stream);
        // An evicted stream's lane may be another stream's by now.
        if self.owner[grant.lane.0] == Some(grant.stream) {
            self.free_lane(grant.lane);
        }
    }

    /// A cancelled call: dropped and answered `Cancelled` if none of its
    /// seats was seated yet (requests are taken between turns, so no seat is
    /// in a turn now); left to complete otherwise, its answer the verdict.
    /// A call no longer pending was answered already: that answer stands.
    fn cancel(&mut self, slot: &Arc<Slot<CallResult>>) {
        let Some((id, pending)) = self.pending.iter().find(|(_, p)| Arc::ptr_eq(&p.slot, slot)) else {
            return;
        };
        if pending.remaining < pending.served.len() {
            return;
        }
        let id = *id;
        let pending = self.pending.remove(&id).expect("present");
        self.unqueue_where(|seat| seat.call == id);
        pending.slot.fill(Err(RunError::new(RunErrorKind::Cancelled)));
    }

    /// Take the queued seats matching `which` out of the queue, oldest
    /// first, keeping the per-lane counts right.
    fn unqueue_where(&mut self, which: impl Fn(&QSeat) -> bool) -> Vec<QSeat> {
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

    /// Evict the streams idle for longer than the timeout (none with a seat
    /// queued); returns when the next one would be due.
    pub fn evict_idle(&mut self) -> Option<Instant> {
        let idle = self.idle_timeout?;
        if self.closed {
            return None;
        }
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for lane in 0..self.owner.len() {
            let Some(stream) = self.owner[lane] else { continue };
            if self.queued_per_lane[lane] > 0 {
                continue;
            }
            let Some(due) = self.last_active[lane].checked_add(idle) else {
                continue;
            };
            if due <= now {
                self.evicted.insert(stream, format!("it did not call for {idle:?}"));
                // A reset that fails here is not the evicted stream's
                // concern: the lane's next holder resets it again first.
                let lane = lane_table::LaneId(lane);
                let _ = self.reset_lane(lane);
                self.free_lane(lane);
            } else {
                next = Some(next.map_or(due, |n: Instant| n.min(due)));
            }
        }
        next
    }

    /// Whether the engine was closed (its state dropped).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Take no new stream or call from now on.
    pub fn start_draining(&mut self) {
        self.draining = true;
    }

    /// Nothing queued, nothing waiting for an answer.
    pub fn is_quiet(&self) -> bool {
        self.queue.is_empty() && self.pending.is_empty()
    }

    fn enqueue(&mut self, call: Call) {
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

    /// Run one turn from the head of the queue.
    pub fn turn(&mut self) {
        if self.queue.is_empty() || self.state.is_none() {
            return;
        }
        let live = self.live.load();
        fill_into(&self.queue, &self.table, live.max_seats, &mut self.fill);
        if self.fill.seated().is_empty() {
            return;
        }
        let started = Instant::now();
        if let Some(last) = self.last_turn.replace(started) {
            let dt = started.saturating_duration_since(last).as_secs_f64().max(1e-6);
            let rate = self.fill.seated().len() as f64 / dt;
            self.arrivals_per_sec = if self.arrivals_per_sec == 0.0 {
                rate
            } else {
                (self.arrivals_per_sec * 7.0 + rate) / 8.0
            };
        }
        // Split the queue: seated seats in seat order, the rest stay queued.
        let mut is_seated = std::mem::take(&mut self.spare);
        debug_assert!(is_seated.is_empty());
        let mut lanes: Vec<TractLane> = Vec::with_capacity(self.fill.seated().len());
        let mut next = self.fill.seated().iter().peekable();
        for (ix, seat) in self.queue.drain(..).enumerate() {
            match next.peek() {
                Some(placed) if placed.queue_ix == ix => {
                    lanes.push(tract_lane(placed.lane));
                    next.next();
                    self.seated.push(seat);
                }
                _ => is_seated.push(seat),
            }
        }
        self.spare = std::mem::replace(&mut self.queue, is_seated);
        let seated = std::mem::take(&mut self.seated);
        for seat in &seated {
            self.unqueued(seat.lane);
            self.metrics
                .record_queue_wait(started.saturating_duration_since(seat.queued));
        }
        let borrowed: Vec<lane_table::LaneId> = self.fill.borrowed().to_vec();
        for lane in &borrowed {
            let _ = self.table.take_lane(*lane);
        }

        let ran = Instant::now();
        // `run_seated` catches what tract raises; this catches the rest (a
        // bug of ours while stacking or scattering), so that a turn never
        // unwinds into the thread serving the shard.
        let result = catch_unwind(AssertUnwindSafe(|| self.run_seated(&seated, lanes.clone(), &borrowed)))
            .unwrap_or_else(|panic| Err(Failure::touched(format!("the turn panicked: {}", panic_text(panic)))));
        if result.is_ok() {
            self.times.record(seated.len(), ran.elapsed());
        }

        for lane in &borrowed {
            let _ = self.table.give_back(*lane);
        }
        let occupancy = seated.len();
        let now = Instant::now();
        for seat in &seated {
            if seat.place == 0 {
                self.last_active[seat.lane.0] = now;
            }
        }
        // Record before answering: a caller reading the metrics after its
        // answer sees its own turn counted.
        self.metrics.record_turn(occupancy, started.elapsed());
        if let TurnPolicy::LatencyBudget { us } = live.policy {
            let budget = std::time::Duration::from_micros(us);
            let late = seated
                .iter()
                .filter(|s| now.saturating_duration_since(s.queued) > budget)
                .count();
            if late > 0 {
                self.metrics.record_deadline_misses(late);
            }
        }
        match result {
            Ok(outputs) => {
                let outputs = Arc::new(outputs);
                for (ix, seat) in seated.iter().enumerate() {
                    let one_row = self.pending.get(&seat.call).is_some_and(|p| p.served.len() == 1);
                    if one_row {
                        let pending = self.pending.remove(&seat.call).expect("present");
                        let answer = Ok(Answer::Row {
                            turn: outputs.clone(),
                            seat: ix,
                        });
                        if pending.slot.fill_quietly(answer) {
                            self.wakes.push(pending.slot);
                        }
                    } else {
                        let row = Answer::Row {
                            turn: outputs.clone(),
                            seat: ix,
                        }
                        .into_outputs(&self.iface.data_batch_out);
                        self.land(seat.call, seat.place, row.map_err(|e| e.to_string()));
                    }
                }
                // One wake per sleeping caller would cost this thread a
                // system call each: wake them as a tree instead.
                crate::slot::wake_all(&mut self.wakes);
            }
            Err(Failure { why, touched }) => {
                self.metrics.record_failed_turn();
                self.metrics.record_failed_seats(occupancy);
                if touched {
                    self.recover(&seated, &lanes, &borrowed, &why);
                }
                for seat in &seated {
                    self.land(seat.call, seat.place, Err(why.clone()));
                }
            }
        }
        let mut seated = seated;
        seated.clear();
        self.seated = seated;
    }

    /// After a failed turn that touched the state: the seated streams' lanes
    /// are reset and marked lost (their state may be half-advanced); if even
    /// that fails (or panics), the state is rebuilt and every stream is lost.
    fn recover(&mut self, seated: &[QSeat], lanes: &[TractLane], borrowed: &[lane_table::LaneId], why: &str) {
        let cleaned = catch_unwind(AssertUnwindSafe(|| self.clean(lanes))).unwrap_or(false);
        if cleaned {
            for seat in seated {
                if !borrowed.contains(&seat.lane) {
                    self.lost[seat.lane.0] = Some(why.to_string());
                }
            }
            return;
        }
        self.rebuild(why);
    }

    /// Clear what a failed run left in the state, and reset `lanes`: true
    /// when the state is clean again.
    fn clean(&mut self, lanes: &[TractLane]) -> bool {
        let Some(state) = self.state.as_mut() else {
            return false;
        };
        let Some(simple) = state.downcast_mut::<TypedSimpleState>() else {
            return false;
        };
        // A run cut short leaves the turn's values and symbols (the batch
        // extent among them) in the state; the next turn must start clean.
        // A state that failed before its first value was set has no value
        // table yet, and tract's `reset_turn` would index the empty one:
        // then there are only the symbols to clear.
        if simple.turn_state.values.is_empty() {
            simple.turn_state.resolved_symbols = SymbolValues::default();
        } else if simple.reset_turn().is_err() {
            return false;
        }
        if let Some(at_spawn) = &self.symbols_at_spawn {
            simple.turn_state.resolved_symbols = at_spawn.clone();
        }
        let lane_ixs: Vec<usize> = lanes.iter().map(|l| l.0).collect();
        reset_caught(&mut **state, lanes).is_ok() && self.explicit.reset(&lane_ixs).is_ok()
    }

    /// Stack the seats' inputs, run the state once, slice the outputs back.
    fn run_seated(
        &mut self,
        seated: &[QSeat],
        lanes: Vec<TractLane>,
        borrowed: &[lane_table::LaneId],
    ) -> Result<TVec<TValue>, Failure> {
        let occupancy = seated.len();
        let group = seated[0].group.clone();
        // Borrowed lanes are reset before anything reads them: the explicit
        // state gathered below must be the initial one, not what the lane's
        // last borrower left.
        // A borrowed lane that fails to reset fails the turn before the
        // state ran: its streams keep their state, and the lane is reset
        // again at its next use.
        if !borrowed.is_empty() {
            let borrowed_ixs: Vec<usize> = borrowed.iter().map(|l| l.0).collect();
            let tract_lanes: Vec<TractLane> = borrowed.iter().map(|l| tract_lane(*l)).collect();
            let state = self.state.as_mut().expect("open engine has a state");
            reset_caught(&mut **state, &tract_lanes)
                .and_then(|_| self.explicit.reset(&borrowed_ixs).map_err(|e| format!("{e:#}")))
                .map_err(|why| Failure::untouched(format!("resetting borrowed lanes: {why}")))?;
        }
        let mut inputs: TVec<TValue> = TVec::with_capacity(self.iface.inputs.len());
        let mut batched_slot = 0;
        let mut shared_slot = 0;
        for ix in 0..self.iface.inputs.len() {
            if let Some(gathered) = self.explicit.gather(ix, &lanes) {
                inputs.push(gathered.map_err(|e| Failure::untouched(format!("gathering state input {ix}: {e:#}")))?);
            } else if self.iface.inputs[ix].batched {
                let k = batched_slot;
                batched_slot += 1;
                if occupancy == 1 {
                    inputs.push(seated[0].inputs[k].clone());
                } else {
                    inputs.push(
                        self.stacker
                            .stack(ix, seated.iter().map(|s| &*s.inputs[k]))
                            .map_err(|e| Failure::untouched(format!("stacking input {ix}: {e:#}")))?,
                    );
                }
            } else {
                inputs.push(group.shared()[shared_slot].clone());
                shared_slot += 1;
            }
        }
        let state = self.state.as_mut().expect("open engine has a state");
        let seating = Seating::new(self.table.max_lanes(), lanes.iter().copied())
            .map_err(|e| Failure::untouched(format!("{e:#}")))?;
        state.seat(seating).map_err(|e| Failure::touched(format!("{e:#}")))?;
        let resolved = group.resolved();
        if !resolved.is_empty() {
            let simple = state.downcast_mut::<TypedSimpleState>().expect("checked at enqueue");
            for (symbol, value) in resolved {
                simple.turn_state.resolved_symbols.set(symbol, *value);
            }
        }
        let ran = catch_unwind(AssertUnwindSafe(|| state.run(inputs)));
        if !resolved.is_empty() {
            if let (Some(simple), Some(at_spawn)) = (state.downcast_mut::<TypedSimpleState>(), &self.symbols_at_spawn) {
                simple.turn_state.resolved_symbols = at_spawn.clone();
            }
        }
        let outputs = match ran {
            Ok(Ok(outputs)) => outputs,
            Ok(Err(e)) => return Err(Failure::touched(format!("{e:#}"))),
            Err(panic) => return Err(Failure::touched(format!("the model panicked: {}", panic_text(panic)))),
        };
        for (ix, output) in outputs.iter().enumerate() {
            if self.iface.batch_out.get(ix).copied().unwrap_or(false)
                && (output.rank() == 0 || output.shape()[0] != occupancy)
            {
                return Err(Failure::touched(format!(
                    "the turn seats {occupancy}, output {ix} has shape {:?}",
                    output.shape()
                )));
            }
        }
        // Explicit state goes back to its lanes; the caller gets the rest.
        if self.iface.state.is_empty() {
            return Ok(outputs);
        }
        self.explicit
            .scatter(&outputs, &lanes)
            .map_err(|e| Failure::touched(format!("{e:#}")))?;
        Ok(self.iface.data_outputs.iter().map(|ix| outputs[*ix].clone()).collect())
    }

    /// One seat of call `id` landed; answer the call once all have.
    fn land(&mut self, id: u64, place: usize, outputs: Result<TVec<TValue>, String>) {
        let Some(pending) = self.pending.get_mut(&id) else {
            return;
        };
        match outputs {
            Err(why) => {
                let pending = self.pending.remove(&id).expect("present");
                // Drop the call's seats still queued.
                self.unqueue_where(|seat| seat.call == id);
                // Its row 0 ran in an earlier turn and advanced the stream's
                // state, yet the call fails: the stream cannot go on as if
                // it had not been made.
                if pending.served[0].is_some() {
                    self.lost[pending.lane.0] = Some(format!("part of a wide call ran before the rest failed: {why}"));
                }
                pending.slot.fill(Err(RunError::new(RunErrorKind::Turn(why))));
            }
            Ok(outputs) => {
                pending.served[place] = Some(outputs);
                pending.remaining -= 1;
                if pending.remaining == 0 {
                    let pending = self.pending.remove(&id).expect("present");
                    let answer = assemble(pending.served, &self.iface.data_batch_out);
                    pending.slot.fill(answer.map(Answer::Outputs));
                }
            }
        }
    }

    /// Answer everything with `Closed` and drop the state on this thread.
    pub fn close(&mut self) {
        self.closed = true;
        for (_, pending) in self.pending.drain() {
            pending.slot.fill(Err(RunError::new(RunErrorKind::Closed)));
        }
        self.queue.clear();
        self.queued_per_lane.iter_mut().for_each(|n| *n = 0);
        self.lanes_queued = 0;
        self.stacker.clear();
        self.state = None;
    }
}

/// A call's answer from its seats' outputs: the batched ones stacked back in
/// place order, the shared ones as the first seat got them.
fn assemble(served: TVec<Option<TVec<TValue>>>, batch_out: &[bool]) -> Result<TVec<TValue>, RunError> {
    let served: Vec<TVec<TValue>> = served.into_iter().map(|s| s.expect("every seat landed")).collect();
    if served.len() == 1 {
        return Ok(served.into_iter().next().expect("one"));
    }
    let mut answer = TVec::new();
    for ix in 0..served[0].len() {
        if batch_out.get(ix).copied().unwrap_or(false) {
            let rows: TVec<&Tensor> = served.iter().map(|s| &*s[ix]).collect();
            let stacked = Tensor::stack_tensors(0, &rows)
                .map_err(|e| RunError::new(RunErrorKind::Turn(format!("stacking output {ix}: {e:#}"))))?;
            answer.push(stacked.into_tvalue());
        } else {
            answer.push(served[0][ix].clone());
        }
    }
    Ok(answer)
}
