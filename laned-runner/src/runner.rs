//! The runner (tract's `Runnable`) and the per-stream handle (tract's
//! `State`).

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use laned_metrics::{Metrics, Snapshot};
use tract_core::internal::*;

use crate::config::{Resolved, RunnerConfig};
use crate::engine::{Call, CallResult, Request};
use crate::err::{NewRunnerError, RunError, RunErrorKind, SpawnError};
use crate::iface::{Group, Interface};
use crate::shard::Shard;
use crate::slot::Slot;

/// What every clone of the runner and every handle share.
pub(crate) struct Core {
    inner: Arc<dyn Runnable>,
    iface: Arc<Interface>,
    shard: Arc<Shard>,
    metrics: Arc<Metrics>,
    config: Resolved,
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
        write!(f, "LanedRunner({} lanes, {:?})", self.core.config.max_lanes, self.core.config.mode)
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
        let metrics = Arc::new(Metrics::new(config.max_seats));
        let shard = Shard::start(inner.clone(), iface.clone(), &config, metrics.clone())?;
        let core = Arc::new(Core { inner, iface, shard, metrics, config });
        Ok(LanedRunner { _owner: Some(Arc::new(Owner { core: core.clone() })), core })
    }

    /// A new stream, holding a lane (reset) until its last handle is
    /// dropped. Fails at once when every lane is taken.
    pub fn spawn_stream(&self) -> Result<LanedStateHandle, SpawnError> {
        let slot = Arc::new(Slot::new());
        self.core.shard.push(Request::Spawn(slot.clone()));
        let lane = self.core.shard.wait(&slot)?;
        Ok(LanedStateHandle {
            stream: Arc::new(Stream { lane, core: self.core.clone() }),
            slot: Arc::new(Slot::new()),
            resolved: vec![],
            runner: LanedRunner { core: self.core.clone(), _owner: None },
        })
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
        self.core.config.max_seats
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
        Ok(Box::new(self.spawn_stream()?))
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
    lane: lane_table::LaneId,
    core: Arc<Core>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.core.shard.push(Request::Release(self.lane));
        self.core.shard.kick();
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
    runner: LanedRunner,
}

impl Clone for LanedStateHandle {
    fn clone(&self) -> LanedStateHandle {
        LanedStateHandle {
            stream: self.stream.clone(),
            slot: Arc::new(Slot::new()),
            resolved: vec![],
            runner: self.runner.clone(),
        }
    }
}

impl fmt::Debug for LanedStateHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LanedStateHandle(lane {})", self.stream.lane.0)
    }
}

impl LanedStateHandle {
    /// The lane this stream holds.
    pub fn lane(&self) -> usize {
        self.stream.lane.0
    }

    /// Run one call: one seat per row of the batched inputs (usually one).
    /// Inputs are checked against the model's facts first; a refused call
    /// hands its inputs back in the error.
    pub fn call(&mut self, inputs: TVec<TValue>) -> Result<TVec<TValue>, RunError> {
        let core = &self.stream.core;
        if core.shard.is_closed() {
            return Err(RunError::with_inputs(RunErrorKind::Closed, inputs));
        }
        let checked = core.iface.check(inputs)?;
        let group = Group::new(checked.shared, std::mem::take(&mut self.resolved));
        let call = Call { lane: self.stream.lane, seats: checked.seats, group, slot: self.slot.clone(), queued: Instant::now() };
        core.shard.push(Request::Call(call));
        core.shard.wait(&self.slot)?.into_outputs(&core.iface.batch_out)
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
