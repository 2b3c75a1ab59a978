//! Explicit-state lanes: state a model carries as an input and returns as an
//! output (streaming exports), kept by the runner in one lane-indexed buffer
//! per pair. Before a turn the seated lanes' state is gathered along the
//! state's batch axis, in seat order; after it each seat's new state is
//! scattered back to its lane. Only the thread holding the engine touches it.

use std::sync::Arc;

use kernel_memo::{Memo, MemoConfig};
use lane_table::LaneId;
use tract_core::internal::*;

use crate::err::NewRunnerError;
use crate::iface::{one_stream_shape, Interface, StateIo};

pub(crate) struct ExplicitState {
    /// Per pair: where it sits in the model, and its buffer, the batch axis
    /// extended to every lane of the state.
    pairs: Vec<(StateIo, Tensor)>,
    /// One lane's worth of the initial state (zeros unless configured).
    initial: Vec<Tensor>,
    /// Turn inputs gathered from the buffers, reused from turn to turn:
    /// keyed by pair and turn shape, so a turn of another occupancy never
    /// writes into a buffer laid out for another.
    gathered: Memo<usize, (), Arc<Tensor>>,
}

impl ExplicitState {
    pub fn new(iface: &Interface, lanes: usize) -> Result<ExplicitState, NewRunnerError> {
        let mut pairs = vec![];
        let mut initial = vec![];
        for io in &iface.state {
            let lane_shape = one_stream_shape(&io.fact, Some(io.axis)).ok_or_else(|| {
                NewRunnerError::BatchAxis(format!(
                    "state input {} has a symbolic dim besides the batch: {:?}",
                    io.input, io.fact
                ))
            })?;
            let mut all = lane_shape.clone();
            all[io.axis] = lanes;
            let zeros = |shape: &[usize]| {
                Tensor::zero_dt(io.fact.datum_type, shape).map_err(|e| NewRunnerError::Model(format!("{e:#}")))
            };
            pairs.push((io.clone(), zeros(&all)?));
            initial.push(match &io.initial {
                Some(t) => t.clone(),
                None => zeros(&lane_shape)?,
            });
        }
        let mut explicit = ExplicitState {
            pairs,
            initial,
            gathered: Memo::new(MemoConfig::default()),
        };
        let every: Vec<usize> = (0..lanes).collect();
        explicit
            .reset(&every)
            .map_err(|e| NewRunnerError::Model(format!("{e:#}")))?;
        Ok(explicit)
    }

    /// Back to the initial state, for a new stream or a borrowed lane.
    pub fn reset(&mut self, lanes: &[usize]) -> TractResult<()> {
        for ((io, buffer), initial) in self.pairs.iter_mut().zip(&self.initial) {
            for lane in lanes {
                buffer.assign_slice(*lane..*lane + 1, initial, 0..1, io.axis)?;
            }
        }
        Ok(())
    }

    /// The state fed to model input `input` for the seated `lanes`, stacked
    /// along its batch axis in seat order; `None` if `input` is no state.
    pub fn gather(&mut self, input: usize, lanes: &[LaneId]) -> Option<TractResult<TValue>> {
        let pair = self.pairs.iter().position(|(io, _)| io.input == input)?;
        let (io, buffer) = &self.pairs[pair];
        let gathered = &mut self.gathered;
        Some((|| {
            let mut shape: TVec<usize> = buffer.shape().into();
            shape[io.axis] = lanes.len();
            let dt = buffer.datum_type();
            let turn = gathered.get_or_try_build(&pair, &shape, &(), |shape, _| -> TractResult<Arc<Tensor>> {
                Ok(Arc::new(Tensor::zero_dt(dt, shape)?))
            })?;
            if Arc::get_mut(turn).is_none() {
                // Last turn's value is still held somewhere: never write
                // under it.
                *turn = Arc::new(Tensor::zero_dt(dt, &shape)?);
            }
            let tensor = Arc::get_mut(turn).expect("unique");
            for (seat, lane) in lanes.iter().enumerate() {
                tensor.assign_slice(seat..seat + 1, buffer, lane.0..lane.0 + 1, io.axis)?;
            }
            Ok(TValue::from_const(turn.clone()))
        })())
    }

    /// Each seat's new state, from the turn's `outputs`, back to its lane.
    pub fn scatter(&mut self, outputs: &[TValue], lanes: &[LaneId]) -> TractResult<()> {
        for (io, buffer) in &mut self.pairs {
            let out = &outputs[io.output];
            ensure!(
                out.rank() > io.axis && out.shape()[io.axis] == lanes.len(),
                "state output {} has shape {:?}, the turn seats {}",
                io.output,
                out.shape(),
                lanes.len()
            );
            for (seat, lane) in lanes.iter().enumerate() {
                buffer.assign_slice(lane.0..lane.0 + 1, out, seat..seat + 1, io.axis)?;
            }
        }
        Ok(())
    }
}

impl ExplicitState {
    /// One lane's state, a tensor per pair (the batch axis of extent 1).
    pub fn read(&self, lane: usize) -> TractResult<TVec<Tensor>> {
        self.pairs
            .iter()
            .map(|(io, buffer)| buffer.slice(io.axis, lane, lane + 1))
            .collect()
    }

    /// Overwrite one lane's state: a tensor per pair, each shaped like
    /// [`ExplicitState::read`]'s.
    pub fn write(&mut self, lane: usize, state: &[Tensor]) -> Result<(), String> {
        if state.len() != self.pairs.len() {
            return Err(format!(
                "the model carries {} state tensors, {} were given",
                self.pairs.len(),
                state.len()
            ));
        }
        for (((io, _), initial), t) in self.pairs.iter().zip(&self.initial).zip(state) {
            if t.shape() != initial.shape() || t.datum_type() != initial.datum_type() {
                return Err(format!(
                    "state input {} takes {:?} {:?} per stream, got {:?} {:?}",
                    io.input,
                    initial.datum_type(),
                    initial.shape(),
                    t.datum_type(),
                    t.shape()
                ));
            }
        }
        for ((io, buffer), t) in self.pairs.iter_mut().zip(state) {
            buffer
                .assign_slice(lane..lane + 1, t, 0..1, io.axis)
                .map_err(|e| format!("{e:#}"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StateSpec;

    /// `x [B, 2]` and `state [1, B, 2]` in; `y = state + x` (squeezed) and
    /// `stateN` (the sum) out: the smallest explicit-state model.
    fn accumulator() -> TractResult<TypedModel> {
        let mut model = TypedModel::default();
        let b = model.symbols.sym("B");
        let x = model.add_source("x", f32::fact(dims!(b.clone(), 2)))?;
        let state = model.add_source("state", f32::fact(dims!(1, b, 2)))?;
        let x = model.wire_node("x.unsqueeze", AxisOp::Add(0), &[x])?[0];
        let next = model.wire_node("stateN", tract_core::ops::math::add(), &[state, x])?[0];
        let y = model.wire_node("y", AxisOp::Rm(0), &[next])?[0];
        model.select_output_outlets(&[y, next])?;
        Ok(model)
    }

    /// A steady turn gathers into the buffer of the previous turn of its
    /// shape; a held value is never written under; seats come in order.
    #[test]
    fn gathering_reuses_the_turn_buffer() {
        let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(accumulator().unwrap()).unwrap().into();
        let iface = Interface::of(&*plan, &StateSpec::Detect, &[]).unwrap();
        let mut state = ExplicitState::new(&iface, 4).unwrap();
        for lane in 0..4 {
            let row = Tensor::from_shape(&[1, 1, 2], &[lane as f32, 10.0 + lane as f32]).unwrap();
            state.write(lane, &[row]).unwrap();
        }
        let lanes = [LaneId(2), LaneId(0)];
        let first = state.gather(1, &lanes).unwrap().unwrap();
        assert_eq!(*first, Tensor::from_shape(&[1, 2, 2], &[2f32, 12., 0., 10.]).unwrap());
        let ptr = first.as_ptr::<f32>().unwrap();
        drop(first);
        let again = state.gather(1, &lanes).unwrap().unwrap();
        assert_eq!(again.as_ptr::<f32>().unwrap(), ptr, "the buffer was reused");
        let other = state.gather(1, &[LaneId(1), LaneId(3)]).unwrap().unwrap();
        assert_ne!(other.as_ptr::<f32>().unwrap(), ptr, "a held value is not written under");
        assert_eq!(*again, Tensor::from_shape(&[1, 2, 2], &[2f32, 12., 0., 10.]).unwrap());
        assert_eq!(*other, Tensor::from_shape(&[1, 2, 2], &[1f32, 11., 3., 13.]).unwrap());
        assert!(state.gather(0, &lanes).is_none(), "input 0 is no state");
    }
}
