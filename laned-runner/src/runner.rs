//! The runner (tract's `Runnable`) and the per-stream handle (tract's
//! `State`).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use laned_metrics::{Metrics, Snapshot};
use tract_core::internal::*;

use crate::config::{Resolved, RunnerConfig};
use crate::engine::{Call, CallResult, Grant, Live, Request};
use crate::err::{NewRunnerError, RunError, RunErrorKind, SpawnError};
use crate::iface::{Group, Interface};
use crate::policy::{LearnedTurnTimes, TurnPolicy};
use crate::shard::Shard;
use crate::slot::{Cancel, Slot, Wake};
use arc_swap::ArcSwap;

/// What every clone of the runner and every handle share.
pub(crate) struct Core {
    inner: Arc<dyn Runnable>,
    iface: Arc<Interface>,
    shard: Arc<Shard>,
    metrics: Arc<Metrics>,
    config: Resolved,
    /// The live policy and `max_seats` (shared with the shard).
    live: Arc<ArcSwap<Live>>,
    times: Arc<LearnedTurnTimes>,
}

/// Closes the shard when the last owning [`LanedRunner`] goes: every waiting
/// caller is answered, the worker joined. Handles do not own the runner.
struct Owner {
    core: Arc<Core>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.core.shard.close();
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
        let config = config.resolve()?;
        let iface = Arc::new(Interface::of(&*inner)?);
        let metrics = Arc::new(Metrics::new(config.max_lanes + 1));
        let live = Arc::new(ArcSwap::from_pointee(Live {
            policy: config.policy,
            max_seats: config.max_seats,
        }));
        let times = Arc::new(LearnedTurnTimes::new(config.max_lanes + 1));
        let shard = Shard::start(
            inner.clone(),
            iface.clone(),
            &config,
            metrics.clone(),
            live.clone(),
            times.clone(),
        )?;
        let core = Arc::new(Core {
            inner,
            iface,
            shard,
            metrics,
            config,
            live,
            times,
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
        let slot = Arc::new(Slot::new());
        self.core.shard.push(Request::Spawn {
            slot: slot.clone(),
            wait: wait.is_some(),
        });
        let deadline = wait.map(|w| Instant::now() + w);
        let answer = match self.core.shard.wait(&slot, deadline) {
            Wake::Value(answer) => answer,
            _ => match slot.abandon() {
                Some(answer) => answer,
                None => {
                    self.core.metrics.record_admission_refused();
                    Err(SpawnError::TimedOut {
                        waited: wait.unwrap_or_default(),
                        lanes: self.core.config.max_lanes,
                    })
                }
            },
        };
        let grant = answer?;
        Ok(LanedStateHandle {
            stream: Arc::new(Stream {
                grant,
                core: self.core.clone(),
            }),
            slot: Arc::new(Slot::new()),
            resolved: vec![],
            frames: 0,
            runner: LanedRunner {
                core: self.core.clone(),
                _owner: None,
            },
        })
    }

    /// Refuse new streams and calls, finish everything queued, close the
    /// runner, and return the final metrics.
    pub fn drain(&self) -> Snapshot {
        self.core.shard.drain();
        self.core.shard.close();
        self.core.metrics.snapshot()
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

    /// What the runner has served so far.
    pub fn metrics(&self) -> Snapshot {
        self.core.metrics.snapshot()
    }

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
        self.core.shard.set_live(live);
        self.core.metrics.record_policy_change();
    }

    /// Change the widest turn while serving (clamped to the state's lanes,
    /// 1 at least).
    pub fn set_max_seats(&self, max_seats: usize) {
        let max_seats = max_seats.clamp(1, self.core.config.max_lanes + 1);
        let live = Live {
            max_seats,
            ..**self.core.live.load()
        };
        self.core.shard.set_live(live);
        self.core.metrics.record_policy_change();
    }

    /// The turn time learned per occupancy: (occupancy, mean turn time).
    pub fn turn_time_curve(&self) -> Vec<(usize, Duration)> {
        self.core.times.curve()
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
    core: Arc<Core>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.core.shard.push(Request::Release(self.grant));
        self.core.shard.kick();
    }
}

/// Cancels a call from another thread: a seat not yet seated is removed; one
/// already seated completes and its answer is dropped. The call returns
/// `RunErrorKind::Cancelled` (or its answer, if that landed first).
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<TokenInner>,
}

#[derive(Default)]
struct TokenInner {
    cancelled: std::sync::atomic::AtomicBool,
    /// The slot of the call the token guards now, if any.
    target: std::sync::Mutex<Option<Arc<dyn Cancel>>>,
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
        if let Some(target) = target {
            target.cancel();
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn guard(&self, target: Option<Arc<dyn Cancel>>) {
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
    /// The lane this stream holds.
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
        if core.shard.is_closed() {
            return Err(RunError::with_inputs(RunErrorKind::Closed, inputs));
        }
        if let Some(token) = token {
            // Guard first, then look: a cancel landing in between still
            // reaches the slot.
            token.guard(Some(self.slot.clone()));
            if token.is_cancelled() {
                token.guard(None);
                return Err(RunError::with_inputs(RunErrorKind::Cancelled, inputs));
            }
        }
        let checked = match core.iface.check(inputs) {
            Ok(checked) => checked,
            Err(e) => {
                if let Some(token) = token {
                    token.guard(None);
                }
                return Err(e);
            }
        };
        let rows = checked.seats.len();
        let group = Group::new(checked.shared, std::mem::take(&mut self.resolved));
        let call = Call {
            stream: self.stream.grant,
            seats: checked.seats,
            group,
            slot: self.slot.clone(),
            queued: Instant::now(),
        };
        core.shard.push(Request::Call(call));
        let answer = match core.shard.wait(&self.slot, None) {
            Wake::Value(answer) => answer,
            _ => {
                // Cancelled: drop the seats still queued; an answer that
                // lands later is refused by the abandoned slot, which this
                // handle replaces.
                core.shard.push(Request::Cancel(self.slot.clone()));
                core.shard.kick();
                let landed = self.slot.abandon();
                self.slot = Arc::new(Slot::new());
                landed.unwrap_or_else(|| Err(RunError::new(RunErrorKind::Cancelled)))
            }
        };
        if let Some(token) = token {
            token.guard(None);
        }
        let outputs = answer?.into_outputs(&core.iface.batch_out)?;
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
        if !core.shard.can_forget_symbols() {
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
