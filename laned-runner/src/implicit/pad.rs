//! tract-pulse's PulsePad lifted: the op pads the frames of a pulse that
//! fall before the stream's start (or past its end, once the stream's
//! length is known), and keeps, per lane, where in its stream the next
//! pulse starts. [`LanePad`] pads the same frames with the same constant,
//! and reads that position from a state input (`I64`, one per seat), and
//! returns the next one as a state output. Edge padding also keeps the
//! last valid frame; it is left in place.

use tract_core::internal::*;
use tract_core::ops::array::PadMode;
use tract_pulse_opl::ops::PulsePad;

use super::{add_output, add_pair, reroute, LiftedPair, Rewrite};

pub(super) fn lift(model: &mut TypedModel, node: &TypedNode) -> TractResult<Rewrite> {
    let Some(op) = node.op_as::<PulsePad>() else {
        return Ok(Rewrite::NotMine);
    };
    let PadMode::Constant(value) = &op.mode else {
        return Ok(Rewrite::Left(format!(
            "{:?} padding keeps the stream's last frame, which no lift reads out",
            op.mode
        )));
    };
    if op.axis == 0 {
        return Ok(Rewrite::Left("it pads axis 0, the lanes' axis".into()));
    }
    let input = node.inputs[0];
    let fact = model.outlet_fact(input)?.without_value();
    let position = i64::fact([fact.shape[0].clone()]);
    let (position, state_input) = add_pair(model, &node.name, position)?;
    let lane_pad = LanePad {
        axis: op.axis,
        before: op.before,
        after: op.after.clone(),
        begin_input: op.begin_input,
        end_input: op.end_input.clone(),
        value: value.clone(),
        overlap: op.overlap,
    };
    let outs = model.wire_node(format!("{}.laned", node.name), lane_pad, &[input, position])?;
    reroute(model, node.id.into(), outs[0])?;
    let output = add_output(model, outs[1])?;
    Ok(Rewrite::Lifted(LiftedPair {
        input: state_input,
        output,
        initial: None,
    }))
}

/// PulsePad with its per-lane position as an input and an output: inputs
/// the pulse `[B, .., P, ..]` and each seat's stream position `[B]` (`I64`),
/// outputs the padded pulse and each seat's next position.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LanePad {
    axis: usize,
    before: usize,
    after: TDim,
    begin_input: usize,
    end_input: TDim,
    value: Arc<Tensor>,
    overlap: usize,
}

impl Op for LanePad {
    fn name(&self) -> StaticName {
        "LanePad".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "axis: {} before: {} after: {} (PulsePad, its position lifted)",
            self.axis, self.before, self.after
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for LanePad {
    not_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (input, positions) = args_2!(inputs);
        let dt = input.datum_type();
        // As PulsePad resolves them: a limit the turn's symbols do not pin
        // (the stream's length, before its last pulse) is infinitely far.
        let end_input = self.end_input.eval(ctx.symbols).to_usize().unwrap_or(usize::MAX);
        let after = self.after.eval(ctx.symbols).to_usize().unwrap_or(usize::MAX);
        let pulse = input.shape()[self.axis];
        let positions = positions.try_as_plain_ram()?.as_slice::<i64>()?.to_vec();
        ensure!(
            positions.len() == input.shape()[0],
            "LanePad: {} positions for a pulse of {} seats",
            positions.len(),
            input.shape()[0]
        );
        let mut next = Vec::with_capacity(positions.len());
        let mut to_pad = tvec!();
        for (seat, &begin) in positions.iter().enumerate() {
            let begin = usize::try_from(begin).context("LanePad: a negative stream position")?;
            let end = begin + pulse;
            next.push((begin + pulse - self.overlap) as i64);
            let valid = begin >= self.begin_input && end <= end_input;
            let outside = end <= self.begin_input - self.before || begin >= end_input.saturating_add(after);
            if !valid && !outside {
                to_pad.push((seat, begin));
            }
        }
        let next = tensor1(&next).into_tvalue();
        if to_pad.is_empty() {
            return Ok(tvec!(input, next));
        }
        let value = self.value.cast_to_dt(dt)?;
        let mut output = input.into_tensor();
        for (seat, begin) in to_pad {
            if begin < self.begin_input {
                let up_to = (self.begin_input - begin).min(pulse);
                output.fill_slice_at_prefix(&[seat], 0..up_to, &value, self.axis)?;
            }
            if begin + pulse > end_input && after > 0 {
                let from = pulse - (begin + pulse - end_input).min(pulse);
                output.fill_slice_at_prefix(&[seat], from..pulse, &value, self.axis)?;
            }
        }
        Ok(tvec!(output.into_tvalue(), next))
    }
}

impl TypedOp for LanePad {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let mut fact = inputs[0].without_value();
        fact.uniform = None;
        Ok(tvec!(fact, inputs[1].without_value()))
    }

    as_op!();
}
