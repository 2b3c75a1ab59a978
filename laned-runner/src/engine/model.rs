//! The model: the laned state itself and what must change with it, its
//! explicit state per lane, the stacked inputs, the symbols it resolved at
//! spawn. Resetting lanes, running one turn's seats, cleaning up after a
//! failed run, rebuilding, closing; every panic from tract or an op state
//! caught here, as an error, so none unwinds into the thread serving.
//!
//! It knows no stream and no call: seats come in, outputs go out, and the
//! engine decides who lost what.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use lane_table::LaneId;
use tract_core::internal::*;
use tract_core::plan::{LaneId as TractLane, Seating};

use crate::err::NewRunnerError;
use crate::explicit::ExplicitState;
use crate::iface::Interface;
use crate::stack::Stacker;

use super::queue::QSeat;

/// What a caught panic carried, as text.
pub(super) fn panic_text(panic: Box<dyn Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// The runner's lanes are `LaneId`s; tract's own lane type is met
/// only here, at the boundary (resets and seatings).
fn tract_lane(lane: LaneId) -> TractLane {
    TractLane(lane.0)
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

/// Reset `lanes` of a new state, naming the op whose state refuses it.
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

/// Why a turn failed, and whether the state was touched before it did: a
/// turn refused before tract saw it (its inputs could not be stacked, a
/// borrowed lane could not be reset) leaves every stream's state as it was.
pub(super) struct Failure {
    pub(super) why: String,
    pub(super) touched: bool,
    /// tract's own error, where tract raised one (the callers' errors
    /// carry it as their `source()`).
    pub(super) cause: Option<Arc<TractError>>,
}

impl Failure {
    pub(super) fn untouched(why: String) -> Failure {
        Failure {
            why,
            touched: false,
            cause: None,
        }
    }

    pub(super) fn touched(why: String) -> Failure {
        Failure {
            why,
            touched: true,
            cause: None,
        }
    }

    /// tract raised `e` once the state was touched: its text, and `e` kept.
    fn raised(e: TractError) -> Failure {
        Failure {
            why: format!("{e:#}"),
            touched: true,
            cause: Some(Arc::new(e)),
        }
    }
}

pub(super) struct Model {
    /// The laned state; `None` once closed (dropped by the closing thread,
    /// which is a live one).
    state: Option<Box<dyn State>>,
    inner: Arc<dyn Runnable>,
    iface: Arc<Interface>,
    /// Lanes of the state.
    lanes: usize,
    /// The model's explicit state, per lane.
    explicit: ExplicitState,
    /// Stacked batched inputs, keyed by (input slot, turn shape).
    stacker: Stacker,
    /// The symbols the state had resolved at spawn, restored after each turn
    /// that resolved some for its seats. `None`: the state cannot forget a
    /// resolved symbol, so calls resolving one are refused.
    symbols_at_spawn: Option<SymbolValues>,
}

impl Model {
    /// Spawn the state and reset every lane once, so an op state that cannot
    /// serve several streams fails here, naming the op.
    pub(super) fn start(
        inner: Arc<dyn Runnable>,
        iface: Arc<Interface>,
        lanes: usize,
    ) -> Result<Model, NewRunnerError> {
        let mut state = spawn_caught(&*inner).map_err(NewRunnerError::Spawn)?;
        let every: Vec<LaneId> = (0..lanes).map(LaneId).collect();
        resettable(&mut state, &*inner, &every)?;
        let explicit = ExplicitState::new(&iface, lanes)?;
        let symbols_at_spawn = state
            .downcast_ref::<TypedSimpleState>()
            .map(|s| s.turn_state.resolved_symbols.clone());
        Ok(Model {
            state: Some(state),
            inner,
            iface,
            lanes,
            explicit,
            stacker: Stacker::default(),
            symbols_at_spawn,
        })
    }

    /// The model's interface.
    pub(super) fn iface(&self) -> &Interface {
        &self.iface
    }

    /// Whether the state is still there (not closed).
    pub(super) fn is_open(&self) -> bool {
        self.state.is_some()
    }

    /// Whether calls resolving a symbol can be served.
    pub(super) fn can_forget_symbols(&self) -> bool {
        self.symbols_at_spawn.is_some()
    }

    /// Reset `lane` (its op states and its explicit state) for a new holder.
    pub(super) fn reset(&mut self, lane: LaneId) -> Result<(), String> {
        let Some(state) = self.state.as_mut() else {
            return Err("the laned state is closed".into());
        };
        reset_caught(&mut **state, &[lane])?;
        self.explicit.reset(&[lane.0]).map_err(|e| format!("{e:#}"))
    }

    /// `lane`'s state as it travels: its explicit state, then what the
    /// runner's own ops keep of it in place.
    pub(super) fn read(&self, lane: usize) -> TractResult<TVec<Tensor>> {
        let mut tensors = self.explicit.read(lane)?;
        if !self.iface.kept.is_empty() {
            let state = self.simple_state().context("the laned state is closed")?;
            for kept in &self.iface.kept {
                tensors.push(kept.read(state, lane)?);
            }
        }
        Ok(tensors)
    }

    /// Overwrite `lane`'s state, as [`Model::read`] gives it. Every tensor
    /// is checked before any is written, so a refused write leaves the
    /// lane as it was. Returns the pulses a kept stream position implies
    /// (`position / step`, every position agreeing), where the model keeps
    /// one: a restored state moves the stream to that pulse.
    pub(super) fn write(&mut self, lane: usize, state: &[Tensor]) -> Result<Option<u64>, String> {
        let explicit = self.iface.state.len();
        let expected = explicit + self.iface.kept.len();
        if state.len() != expected {
            return Err(format!(
                "the model carries {expected} state tensors, {} were given",
                state.len()
            ));
        }
        let (ours, kept) = state.split_at(explicit);
        let mut implied: Option<u64> = None;
        for (kept, t) in self.iface.kept.iter().zip(kept) {
            if t.datum_type() != kept.kept.datum_type || t.shape() != &*kept.kept.lane_shape {
                return Err(format!(
                    "the state of {:?} takes {:?} {:?} per stream, got {:?} {:?}",
                    kept.kept.node,
                    kept.kept.datum_type,
                    kept.kept.lane_shape,
                    t.datum_type(),
                    t.shape()
                ));
            }
            if let Some(step) = kept.kept.step {
                let position = t
                    .try_as_plain_ram()
                    .and_then(|t| t.as_slice::<i64>().map(|s| s[0]))
                    .map_err(|e| format!("{e:#}"))?;
                let pulses = (position >= 0 && step > 0 && position % step == 0).then(|| (position / step) as u64);
                match (pulses, implied) {
                    (None, _) => {
                        return Err(format!(
                        "the stream position {position} of {:?} is no pulse's (a stream moves {step} a pulse from 0)",
                        kept.kept.node
                    ))
                    }
                    (Some(p), Some(q)) if p != q => {
                        return Err(format!(
                            "the stream positions disagree: {:?} stands at pulse {p}, another at {q}",
                            kept.kept.node
                        ))
                    }
                    (Some(p), _) => implied = Some(p),
                }
            }
        }
        self.explicit.write(lane, ours)?;
        let lanes = self.lanes;
        let iface = self.iface.clone();
        if iface.kept.is_empty() {
            return Ok(None);
        }
        let state = self.simple_state_mut().ok_or("the laned state is closed")?;
        for (kept, t) in iface.kept.iter().zip(kept) {
            kept.write(state, lane, lanes, t).map_err(|e| format!("{e:#}"))?;
        }
        Ok(implied)
    }

    /// The state as tract's plain state, where the runner's own ops keep
    /// their lanes (`None` once closed).
    fn simple_state(&self) -> Option<&TypedSimpleState> {
        self.state.as_ref()?.downcast_ref::<TypedSimpleState>()
    }

    fn simple_state_mut(&mut self) -> Option<&mut TypedSimpleState> {
        self.state.as_mut()?.downcast_mut::<TypedSimpleState>()
    }

    /// A fresh state in place of the current one, every lane reset: false
    /// (the current state kept) if even that fails.
    pub(super) fn rebuild(&mut self) -> bool {
        let every: Vec<LaneId> = (0..self.lanes).map(LaneId).collect();
        let fresh = spawn_caught(&*self.inner).and_then(|mut s| reset_caught(&mut *s, &every).map(|_| s));
        let Ok(fresh) = fresh else { return false };
        self.state = Some(fresh);
        let every: Vec<usize> = (0..self.lanes).collect();
        let _ = self.explicit.reset(&every);
        true
    }

    /// Clear what a failed run left in the state, and reset `lanes`: true
    /// when the state is clean again (a panic doing so: false).
    pub(super) fn clean(&mut self, lanes: &[LaneId]) -> bool {
        catch_unwind(AssertUnwindSafe(|| self.clean_uncaught(lanes))).unwrap_or(false)
    }

    fn clean_uncaught(&mut self, lanes: &[LaneId]) -> bool {
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

    /// Stack the seats' inputs, run the state once, slice the outputs back;
    /// `lanes` are the seats' lanes in seat order, `borrowed` those lent to
    /// a wide call's later rows. A panic anywhere (tract's or a bug of ours
    /// while stacking or scattering) is a failure that touched the state,
    /// so that a turn never unwinds into the thread serving the shard.
    pub(super) fn run(
        &mut self,
        seated: &[QSeat],
        lanes: &[LaneId],
        borrowed: &[LaneId],
    ) -> Result<TVec<TValue>, Failure> {
        catch_unwind(AssertUnwindSafe(|| self.run_uncaught(seated, lanes, borrowed)))
            .unwrap_or_else(|panic| Err(Failure::touched(format!("the turn panicked: {}", panic_text(panic)))))
    }

    fn run_uncaught(
        &mut self,
        seated: &[QSeat],
        lanes: &[LaneId],
        borrowed: &[LaneId],
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
            let state = self.state.as_mut().expect("open engine has a state");
            reset_caught(&mut **state, borrowed)
                .and_then(|_| self.explicit.reset(&borrowed_ixs).map_err(|e| format!("{e:#}")))
                .map_err(|why| Failure::untouched(format!("resetting borrowed lanes: {why}")))?;
        }
        let mut inputs: TVec<TValue> = TVec::with_capacity(self.iface.inputs.len());
        let mut batched_slot = 0;
        let mut shared_slot = 0;
        for ix in 0..self.iface.inputs.len() {
            if let Some(gathered) = self.explicit.gather(ix, lanes) {
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
        let seating = Seating::new(self.lanes, lanes.iter().map(|l| tract_lane(*l)))
            .map_err(|e| Failure::untouched(format!("{e:#}")))?;
        state.seat(seating).map_err(Failure::raised)?;
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
            Ok(Err(e)) => return Err(Failure::raised(e)),
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
            .scatter(&outputs, lanes)
            .map_err(|e| Failure::touched(format!("{e:#}")))?;
        Ok(self.iface.data_outputs.iter().map(|ix| outputs[*ix].clone()).collect())
    }

    /// Drop the state (on this thread) and the stacked buffers.
    pub(super) fn close(&mut self) {
        self.stacker.clear();
        self.state = None;
    }
}
