//! Explicit-state lanes: state a model carries as an input and returns as an
//! output (streaming exports), kept by the runner in one lane-indexed buffer
//! per pair. Before a turn the seated lanes' state is gathered along the
//! state's batch axis, in seat order; after it each seat's new state is
//! scattered back to its lane. Only the thread holding the engine touches it.

use tract_core::internal::*;
use tract_core::plan::LaneId;

use crate::err::NewRunnerError;
use crate::iface::{one_stream_shape, Interface, StateIo};

pub(crate) struct ExplicitState {
    /// Per pair: where it sits in the model, and its buffer, the batch axis
    /// extended to every lane of the state.
    pairs: Vec<(StateIo, Tensor)>,
    /// One lane's worth of the initial state (zeros unless configured).
    initial: Vec<Tensor>,
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
        let mut explicit = ExplicitState { pairs, initial };
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
    pub fn gather(&self, input: usize, lanes: &[LaneId]) -> Option<TractResult<TValue>> {
        let (io, buffer) = self.pairs.iter().find(|(io, _)| io.input == input)?;
        Some((|| {
            let rows: TVec<Tensor> = lanes
                .iter()
                .map(|l| buffer.slice(io.axis, l.0, l.0 + 1))
                .collect::<TractResult<_>>()?;
            let rows: TVec<&Tensor> = rows.iter().collect();
            Ok(Tensor::stack_tensors(io.axis, &rows)?.into_tvalue())
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
