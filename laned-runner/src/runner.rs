//! The runner (tract's `Runnable`) and the per-stream handle (tract's
//! `State`).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use laned_metrics::{Metrics, Snapshot};
use tract_core::internal::*;

use crate::admission::{Admission, Turn};
use crate::config::{Resolved, RunnerConfig};
use crate::engine::{Call, CallResult, Grant, Live, Request};
use crate::err::{NewRunnerError, RunError, RunErrorKind, SpawnError};
use crate::iface::{Group, Interface};
use crate::policy::{LearnedTurnTimes, TurnPolicy};
use crate::shard::{Parts, Shard};
use crate::slot::{Cancel, Slot, Wake};
use arc_swap::ArcSwap;

/// What every clone of the runner and every handle share.
pub(crate) struct Core {
    inner: Arc<dyn Runnable>,
    iface: Arc<Interface>,
    /// The laned states; a stream stays on the shard it was placed on.
    shards: Vec<Arc<Shard>>,
    /// Per shard.
    metrics: Vec<Arc<Metrics>>,
    times: Vec<Arc<LearnedTurnTimes>>,
    /// Spawners waiting for a lane on any shard.
    admission: Arc<Admission>,
    config: Resolved,
    /// The live policy and `max_seats` (shared with every shard).
    live: Arc<ArcSwap<Live>>,
}

impl Core {
    /// Shards in placement order: most free lanes first, lowest index on ties.
    fn placement(&self) -> Vec<usize> {
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
    fn try_shards(&self, waited: Option<Duration>) -> Result<(usize, Grant), SpawnError> {
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
            lanes: self.total_lanes(),
            waiting: self.admission.waiting(),
        })
    }

    fn total_lanes(&self) -> usize {
        self.config.max_lanes * self.shards.len()
    }

    fn close(&self) {
        self.admission.refuse(SpawnError::Closed);
        for shard in &self.shards {
            shard.close();
        }
    }
}

/// Closes every shard when the last owning [`LanedRunner`] goes: every
/// waiting caller is answered, the workers joined. Handles do not own the
/// runner.
struct Owner {
    core: Arc<Core>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.core.close();
    }
}

/// Serves many streams through one laned tract state. A drop-in for
/// `tract_core::lanes::LanedRunnable`: it implements [`Runnable`], and
/// [`Runnable::spawn`] hands out a [`LanedStateHandle`] per stream.
///
/// Clones share the runner; once the last clone is dropped, every queued or
/// later call is answered with an error and the worker is joined.
#[derive(Clone)]
pub struct LanedRunner {
    core: Arc<Core>,
    /// `None` in the copy a handle keeps for [`State::runnable`].
    _owner: Option<Arc<Owner>>,
}

impl fmt::Debug for LanedRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LanedRunner({} lanes, {:?})",
            self.core.config.max_lanes, self.core.config.mode
        )
    }
}

impl LanedRunner {
    /// Serve `inner`, prepared from a model carrying one batch symbol on
    /// axis 0 of its batched inputs and outputs (one output at least). Every
    /// lane is reset once here, so a state that cannot serve several streams
    /// fails now, naming its op.
    pub fn new(inner: Arc<dyn Runnable>, config: RunnerConfig) -> Result<LanedRunner, NewRunnerError> {
        let state_spec = config.state.clone();
        let config = config.resolve()?;
        let iface = Arc::new(Interface::of(&*inner, &state_spec)?);
        let live = Arc::new(ArcSwap::from_pointee(Live {
            policy: config.policy,
            max_seats: config.max_seats,
        }));
        let admission = Arc::new(Admission::new(config.max_waiting));
        let mut shards: Vec<Arc<Shard>> = vec![];
        let (mut metrics, mut times) = (vec![], vec![]);
        for index in 0..config.shards {
            let parts = Parts {
                inner: inner.clone(),
                iface: iface.clone(),
                metrics: Arc::new(Metrics::new(config.max_lanes + 1)),
                live: live.clone(),
                times: Arc::new(LearnedTurnTimes::new(config.max_lanes + 1)),
                admission: admission.clone(),
                index,
            };
            metrics.push(parts.metrics.clone());
            times.push(parts.times.clone());
            // A shard failing to start closes those already started (their
            // workers joined, states dropped on their own threads).
            match Shard::start(parts, &config) {
                Ok(shard) => shards.push(shard),
                Err(e) => {
                    for shard in &shards {
                        shard.close();
                    }
                    return Err(e);
                }
            }
        }
        let core = Arc::new(Core {
            inner,
            iface,
            shards,
            metrics,
            times,
            admission,
            config,
            live,
        });
        Ok(LanedRunner {
            _owner: Some(Arc::new(Owner { core: core.clone() })),
            core,
        })
    }

    /// A new stream, holding a lane (reset) until its last handle is
    /// dropped. Never waits: fails at once when every lane is taken (tract's
    /// contract), saying how many lanes there are and how many wait.
    pub fn try_spawn(&self) -> Result<LanedStateHandle, SpawnError> {
        self.spawn_with(None)
    }

    /// A new stream, waiting up to `wait` for a lane when every lane is
    /// taken, in arrival order (first come, first served). Refused at once as
    /// busy when `max_waiting` spawners wait already.
    pub fn spawn_timeout(&self, wait: Duration) -> Result<LanedStateHandle, SpawnError> {
        self.spawn_with(Some(wait))
    }

    fn spawn_with(&self, wait: Option<Duration>) -> Result<LanedStateHandle, SpawnError> {
        let core = &self.core;
        // First come, first served: nobody overtakes a waiting spawner.
        let (shard, grant) = match (wait, core.admission.waiting()) {
            (None, 0) => core.try_shards(None).inspect_err(|e| {
                if matches!(e, SpawnError::Full { .. }) {
                    core.metrics[0].record_admission_refused();
                }
            })?,
            (None, waiting) => {
                core.metrics[0].record_admission_refused();
                return Err(SpawnError::Full {
                    lanes: core.total_lanes(),
                    waiting,
                });
            }
            // Nobody waits: a free lane is taken at once, without a place in
            // the admission queue (which may hold none: `max_waiting` 0).
            (Some(wait), 0) => match core.try_shards(None) {
                Ok(placed) => placed,
                Err(SpawnError::Full { .. }) => self.wait_for_lane(wait)?,
                Err(e) => return Err(e),
            },
            (Some(wait), _) => self.wait_for_lane(wait)?,
        };
        Ok(LanedStateHandle {
            stream: Arc::new(Stream {
                grant,
                shard,
                core: core.clone(),
            }),
            slot: Arc::new(Slot::new()),
            resolved: vec![],
            frames: 0,
            runner: LanedRunner {
                core: core.clone(),
                _owner: None,
            },
        })
    }

    /// Wait in the admission queue for a lane on any shard.
    fn wait_for_lane(&self, wait: Duration) -> Result<(usize, Grant), SpawnError> {
        let core = &self.core;
        let since = Instant::now();
        // `None`: a wait too long for the clock (`Duration::MAX`) waits on.
        let deadline = since.checked_add(wait);
        let ticket = core.admission.enter().inspect_err(|e| {
            if matches!(e, SpawnError::Busy { .. }) {
                core.metrics[0].record_admission_refused();
            }
        })?;
        // In combining mode nobody else may be around to evict idle streams:
        // look after them now and then while waiting.
        let tick = (core.config.mode == crate::Mode::Combining && core.config.idle_timeout.is_some())
            .then(|| Duration::from_millis(5));
        loop {
            let seen = core.admission.freed();
            if core.admission.at_front(&ticket) {
                match core.try_shards(Some(since.elapsed())) {
                    Ok(placed) => {
                        core.admission.leave(ticket);
                        return Ok(placed);
                    }
                    Err(SpawnError::Full { .. }) => (),
                    Err(e) => {
                        core.admission.leave(ticket);
                        return Err(e);
                    }
                }
            }
            match core.admission.wait_turn(&ticket, seen, deadline, tick) {
                Turn::Try => {
                    if tick.is_some() {
                        for shard in &core.shards {
                            shard.kick();
                        }
                    }
                }
                Turn::Leave(e) => {
                    core.admission.leave(ticket);
                    let e = match e {
                        SpawnError::TimedOut { .. } => {
                            core.metrics[0].record_admission_refused();
                            SpawnError::TimedOut {
                                waited: wait,
                                lanes: core.total_lanes(),
                            }
                        }
                        other => other,
                    };
                    return Err(e);
                }
            }
        }
    }

    /// Refuse new streams and calls, finish everything queued on every
    /// shard, close the runner, and return the final metrics.
    pub fn drain(&self) -> Snapshot {
        self.core.admission.refuse(SpawnError::Draining);
        for shard in &self.core.shards {
            shard.drain();
        }
        self.core.close();
        self.metrics()
    }

    /// A clone that does not keep the runner open: once every other clone is
    /// dropped, the runner closes (answering everyone) and spawns or calls
    /// through this one fail as closed. For threads that serve streams but
    /// should not decide the runner's life (an accept loop, say).
    pub fn detached(&self) -> LanedRunner {
        LanedRunner {
            core: self.core.clone(),
            _owner: None,
        }
    }

    /// What the runner has served so far, every shard together.
    pub fn metrics(&self) -> Snapshot {
        let shards = self.shard_metrics();
        let mut total = shards[0].clone();
        for s in &shards[1..] {
            total = total.merge(s);
        }
        total
    }

    /// What each shard has served (occupancy per shard shows imbalance).
    pub fn shard_metrics(&self) -> Vec<Snapshot> {
        self.core.metrics.iter().map(|m| m.snapshot()).collect()
    }

    /// Laned states behind the runner.
    pub fn shards(&self) -> usize {
        self.core.shards.len()
    }

    /// Lanes of each shard.
    pub fn max_lanes(&self) -> usize {
        self.core.config.max_lanes
    }

    /// The widest turn, after the environment and the clamp to the lanes.
    pub fn max_seats(&self) -> usize {
        self.core.live.load().max_seats
    }

    /// The turn policy now in force.
    pub fn policy(&self) -> TurnPolicy {
        self.core.live.load().policy
    }

    /// Change the turn policy while serving. Queued calls are not lost: the
    /// next turn is decided by the new policy (a waiting worker re-decides at
    /// once). Counted in the metrics (`policy_changes`).
    pub fn set_policy(&self, policy: TurnPolicy) {
        let live = Live {
            policy,
            ..**self.core.live.load()
        };
        for shard in &self.core.shards {
            shard.set_live(live);
        }
        self.core.metrics[0].record_policy_change();
    }

    /// Change the widest turn while serving (clamped to the state's lanes,
    /// 1 at least).
    pub fn set_max_seats(&self, max_seats: usize) {
        let max_seats = max_seats.clamp(1, self.core.config.max_lanes + 1);
        let live = Live {
            max_seats,
            ..**self.core.live.load()
        };
        for shard in &self.core.shards {
            shard.set_live(live);
        }
        self.core.metrics[0].record_policy_change();
    }

    /// The turn time learned per occupancy on the first shard: (occupancy,
    /// mean turn time).
    pub fn turn_time_curve(&self) -> Vec<(usize, Duration)> {
        self.core.times[0].curve()
    }

    pub fn mode(&self) -> crate::Mode {
        self.core.config.mode
    }

    /// The symbol axis 0 of the batched tensors carries: a turn's occupancy.
    pub fn batch_symbol(&self) -> &Symbol {
        &self.core.iface.batch
    }

    /// The model as prepared, serving one stream at a time.
    pub fn inner(&self) -> &Arc<dyn Runnable> {
        &self.core.inner
    }
}

impl Runnable for LanedRunner {
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        Ok(Box::new(self.try_spawn()?))
    }

    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        self.core.inner.typed_plan()
    }

    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        self.core.inner.typed_model()
    }

    fn input_count(&self) -> usize {
        self.core.inner.input_count()
    }

    fn output_count(&self) -> usize {
        self.core.inner.output_count()
    }

    fn input_fact(&self, ix: usize) -> TractResult<&TypedFact> {
        self.core.inner.input_fact(ix)
    }

    fn output_fact(&self, ix: usize) -> TractResult<&TypedFact> {
        self.core.inner.output_fact(ix)
    }
}

/// The lane a stream holds, shared by its handle's clones; the last one
/// dropped sends the lane back.
struct Stream {
    grant: Grant,
    /// The shard the stream was placed on, for its whole life.
    shard: usize,
    core: Arc<Core>,
}

impl Stream {
    fn shard(&self) -> &Shard {
        &self.core.shards[self.shard]
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.shard().push(Request::Release(self.grant));
        self.shard().kick();
    }
}

/// Cancels a call from another thread. The call then ends one of two ways,
/// and its result says which: `RunErrorKind::Cancelled` when none of its
/// seats had been seated (they are removed: nothing of the call ran, the
/// stream's state is as before it), or its answer when a seat had already
/// been seated (the call completed; cancelling came too late). A cancel
/// affects only the call it guards, never the stream's next one.
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<TokenInner>,
}

#[derive(Default)]
struct TokenInner {
    cancelled: std::sync::atomic::AtomicBool,
    /// The call the token guards now, if any: its slot, and the call's
    /// number there (a cancel reaching the slot after that call ended is
    /// ignored by it).
    target: std::sync::Mutex<Option<(Arc<dyn Cancel>, u64)>>,
}

impl fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CancelToken(cancelled: {})", self.is_cancelled())
    }
}

impl CancelToken {
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    pub fn cancel(&self) {
        self.inner.cancelled.store(true, std::sync::atomic::Ordering::SeqCst);
        let target = self.inner.target.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((slot, call)) = target {
            slot.cancel(call);
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn guard(&self, target: Option<(Arc<dyn Cancel>, u64)>) {
        *self.inner.target.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }
}

/// One stream's view of a [`LanedRunner`]. Clones are the same stream
/// (same lane); each clone has its own answer slot, and a symbol resolved on
/// one clone holds for that clone's next call only.
pub struct LanedStateHandle {
    stream: Arc<Stream>,
    /// This clone's answer channel, reused call after call.
    slot: Arc<Slot<CallResult>>,
    /// Symbols resolved for the next call only.
    resolved: Vec<(Symbol, i64)>,
    /// Frames this clone fed its stream so far (pulsed models), for `finish`.
    frames: usize,
    runner: LanedRunner,
}

impl Clone for LanedStateHandle {
    fn clone(&self) -> LanedStateHandle {
        LanedStateHandle {
            stream: self.stream.clone(),
            slot: Arc::new(Slot::new()),
            resolved: vec![],
            frames: self.frames,
            runner: self.runner.clone(),
        }
    }
}

impl fmt::Debug for LanedStateHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LanedStateHandle(lane {})", self.stream.grant.lane.0)
    }
}

impl LanedStateHandle {
    /// The shard this stream was placed on (for its whole life).
    pub fn shard(&self) -> usize {
        self.stream.shard
    }

    /// This stream's explicit state (a tensor per state pair, the batch
    /// axis of extent 1), read between turns: to save it, or to move the
    /// stream to another runner with [`LanedStateHandle::restore_state`].
    pub fn state_snapshot(&self) -> Result<TVec<Tensor>, RunError> {
        let slot = Arc::new(Slot::new());
        self.stream.shard().push(Request::ReadState {
            stream: self.stream.grant,
            slot: slot.clone(),
        });
        match self.stream.shard().wait(&slot, None) {
            Wake::Value(read) => read,
            _ => Err(RunError::new(RunErrorKind::Closed)),
        }
    }

    /// Overwrite this stream's explicit state (as `state_snapshot` gives
    /// it); the next call continues from it.
    pub fn restore_state(&mut self, state: TVec<Tensor>) -> Result<(), RunError> {
        let slot = Arc::new(Slot::new());
        self.stream.shard().push(Request::WriteState {
            stream: self.stream.grant,
            state,
            slot: slot.clone(),
        });
        match self.stream.shard().wait(&slot, None) {
            Wake::Value(written) => written,
            _ => Err(RunError::new(RunErrorKind::Closed)),
        }
    }

    /// The lane this stream holds on its shard.
    pub fn lane(&self) -> usize {
        self.stream.grant.lane.0
    }

    /// Run one call: one seat per row of the batched inputs (usually one).
    /// Inputs are checked against the model's facts first; a refused call
    /// hands its inputs back in the error.
    pub fn call(&mut self, inputs: TVec<TValue>) -> Result<TVec<TValue>, RunError> {
        self.call_inner(inputs, None)
    }

    /// [`LanedStateHandle::call`], cancellable from another thread through
    /// `token`.
    pub fn call_with(&mut self, inputs: TVec<TValue>, token: &CancelToken) -> Result<TVec<TValue>, RunError> {
        self.call_inner(inputs, Some(token))
    }

    fn call_inner(&mut self, inputs: TVec<TValue>, token: Option<&CancelToken>) -> Result<TVec<TValue>, RunError> {
        let core = self.stream.core.clone();
        if self.stream.shard().is_closed() {
            return Err(RunError::with_inputs(RunErrorKind::Closed, inputs));
        }
        // The call's number on the slot: a cancel meant for an earlier call
        // that raced its answer finds another number, and is ignored.
        let call_no = self.slot.begin();
        if let Some(token) = token {
            // Guard first, then look: a cancel landing in between still
            // reaches the slot.
            let slot: Arc<dyn Cancel> = self.slot.clone();
            token.guard(Some((slot, call_no)));
            if token.is_cancelled() {
                token.guard(None);
                return Err(RunError::with_inputs(RunErrorKind::Cancelled, inputs));
            }
        }
        // Resolved symbols hold for this call only, refused or not.
        let resolved = std::mem::take(&mut self.resolved);
        let checked = match core.iface.check(inputs, &resolved) {
            Ok(checked) => checked,
            Err(e) => {
                if let Some(token) = token {
                    token.guard(None);
                }
                return Err(e);
            }
        };
        let rows = checked.seats.len();
        let group = Group::new(checked.shared, resolved, checked.shapes);
        let call = Call {
            stream: self.stream.grant,
            seats: checked.seats,
            group,
            slot: self.slot.clone(),
            queued: Instant::now(),
        };
        self.stream.shard().push(Request::Call(call));
        let answer = match self.stream.shard().wait(&self.slot, None) {
            Wake::Value(answer) => answer,
            Wake::Cancelled | Wake::TimedOut => {
                // Cancelled: the engine drops the call if none of its seats
                // was seated yet and answers `Cancelled`; otherwise the call
                // completes and its answer comes. Either way the slot gets
                // exactly one verdict, at the latest after the turn running
                // now, and the caller learns whether its call ran.
                self.stream.shard().push(Request::Cancel(self.slot.clone()));
                loop {
                    if let Wake::Value(answer) = self.stream.shard().wait(&self.slot, None) {
                        break answer;
                    }
                }
            }
        };
        if let Some(token) = token {
            token.guard(None);
        }
        let outputs = answer?.into_outputs(&core.iface.data_batch_out)?;
        if let Some(pulse) = &core.iface.pulse {
            if rows >= 1 {
                self.frames += pulse.pulse;
            }
        }
        Ok(outputs)
    }

    /// End the stream: feed its last pulse (`last`, of which only the first
    /// `real_frames` frames are signal; `None` when the stream ended on a
    /// pulse boundary), with the model's stream symbol resolved to the
    /// stream's true length, then pulses of silence until every output frame
    /// is out (the model's `pulse.delay`). Returns the outputs of those
    /// calls, in order; the lane then goes back (once the last clone is
    /// dropped).
    pub fn finish(mut self, last: Option<TVec<TValue>>, real_frames: usize) -> Result<Vec<TVec<TValue>>, RunError> {
        let core = self.stream.core.clone();
        let Some(pulse) = core.iface.pulse.clone() else {
            return Err(RunError::new(RunErrorKind::Finish(
                "the model carries no pulse properties (pulse.streaming_symbol, pulse.input_axes, pulse.delay): pulsify it with tract-pulse".into(),
            )));
        };
        if real_frames > pulse.pulse || (last.is_none() && real_frames > 0) {
            return Err(RunError::new(RunErrorKind::Finish(format!(
                "the last pulse holds {real_frames} real frames; a pulse holds at most {} (and none without a last pulse)",
                pulse.pulse
            ))));
        }
        let total = self.frames + real_frames;
        let mut fed = self.frames;
        let mut outputs = vec![];
        if let Some(last) = last {
            self.resolve(&pulse.symbol, total as i64)?;
            outputs.push(self.call(last)?);
            fed += pulse.pulse;
        }
        while fed < total + pulse.delay {
            self.resolve(&pulse.symbol, total as i64)?;
            outputs.push(
                self.call(
                    core.iface
                        .silence()
                        .map_err(|e| RunError::new(RunErrorKind::Finish(e)))?,
                )?,
            );
            fed += pulse.pulse;
        }
        Ok(outputs)
    }

    /// Pin `symbol` to `value` for this handle's next call only (a stream's
    /// last, partial pulse). Seats resolving different values never share a
    /// turn.
    pub fn resolve(&mut self, symbol: &Symbol, value: i64) -> Result<(), RunError> {
        let core = &self.stream.core;
        if *symbol == core.iface.batch {
            return Err(RunError::new(RunErrorKind::Symbol(format!(
                "{symbol} is the batch symbol, which stands for the turn's occupancy, not for one stream"
            ))));
        }
        if !self.stream.shard().can_forget_symbols() {
            return Err(RunError::new(RunErrorKind::Symbol(
                "this state cannot forget a resolved symbol after the turn".into(),
            )));
        }
        self.resolved.retain(|(s, _)| s != symbol);
        self.resolved.push((symbol.clone(), value));
        Ok(())
    }
}

impl State for LanedStateHandle {
    fn run(&mut self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        Ok(self.call(inputs)?)
    }

    fn resolve_symbol(&mut self, symbol: &Symbol, value: i64) -> TractResult<()> {
        Ok(self.resolve(symbol, value)?)
    }

    fn runnable(&self) -> &dyn Runnable {
        &self.runner
    }
}
