//! tract-pulse's PulsePad kept in place: the op pads the frames of a pulse
//! that fall before the stream's start (or past its end, once the stream's
//! length is known), and keeps, per lane, where in its stream the next
//! pulse starts. [`LanePad`] pads the same frames with the same constant,
//! and keeps that position per lane in its own state, where export and
//! import read and write one lane's (`I64`, shape `[1]`) on demand. The
//! position moves by the same step every pulse, so a position imported for
//! a stream that fed `n` pulses must be `n` steps: anything else is a
//! record no stream could have written. Edge padding also keeps the last
//! valid frame; it is left to tract.

use tract_core::internal::*;
use tract_core::ops::array::PadMode;
use tract_pulse_opl::ops::PulsePad;

use tract_core::plan::LaneId as TractLane;

use super::{lane_of, reroute, seats, Kept, Rewrite};

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
    let Some(pulse) = fact.shape[op.axis].to_usize().ok() else {
        return Ok(Rewrite::Left(format!("its pulse on axis {} is not concrete", op.axis)));
    };
    let step = pulse
        .checked_sub(op.overlap)
        .context("PulsePad: an overlap longer than its pulse")?;
    let name = format!("{}.laned", node.name);
    let lane_pad = LanePad {
        axis: op.axis,
        before: op.before,
        after: op.after.clone(),
        begin_input: op.begin_input,
        end_input: op.end_input.clone(),
        value: value.clone(),
        overlap: op.overlap,
    };
    let out = model.wire_node(&name, lane_pad, &[input])?[0];
    reroute(model, node.id.into(), out)?;
    Ok(Rewrite::Kept(Kept {
        node: name,
        datum_type: DatumType::I64,
        lane_shape: tvec![1],
        step: Some(step as i64),
    }))
}

/// PulsePad with its per-lane position kept in its own state
/// ([`LanePadState`]): the pulse `[B, .., P, ..]` in, the padded pulse out.
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

    fn state(&self, _ctx: &EvalContext) -> TractResult<Option<Box<dyn OpState>>> {
        Ok(Some(Box::new(LanePadState {
            positions: vec![],
            limits: None,
        })))
    }
}

/// Per lane, where in its stream the lane's next pulse starts (0 for a
/// fresh lane); sized at the first turn or write, when the state's width is
/// known.
#[derive(Debug, Clone)]
pub struct LanePadState {
    positions: Vec<i64>,
    /// The stream's limits as the last turn resolved them, kept while the
    /// symbols they depend on keep their values (most turns: the stream's
    /// length unknown): resolving a symbolic dim costs more than the pad.
    limits: Option<Limits>,
}

/// `end_input` and `after` resolved, and the values of the symbols they
/// depend on when they were.
#[derive(Debug, Clone)]
struct Limits {
    deps: TVec<(Symbol, Option<i64>)>,
    end_input: usize,
    after: usize,
}

impl LanePadState {
    /// The op's `end_input` and `after` under the turn's symbols, as
    /// PulsePad resolves them: a limit the turn does not pin (the stream's
    /// length, before its last pulse) is infinitely far.
    fn limits(&mut self, op: &LanePad, symbols: &SymbolValues) -> (usize, usize) {
        if let Some(l) = &self.limits {
            if l.deps.iter().all(|(s, v)| symbols.get(s) == *v) {
                return (l.end_input, l.after);
            }
        }
        let end_input = op.end_input.eval(symbols).to_usize().unwrap_or(usize::MAX);
        let after = op.after.eval(symbols).to_usize().unwrap_or(usize::MAX);
        let deps = op
            .end_input
            .symbols()
            .into_iter()
            .chain(op.after.symbols())
            .map(|s| {
                let v = symbols.get(&s);
                (s, v)
            })
            .collect();
        self.limits = Some(Limits { deps, end_input, after });
        (end_input, after)
    }
}

impl LanePadState {
    fn sized(&mut self, lanes: usize) -> TractResult<&mut Vec<i64>> {
        if self.positions.is_empty() {
            self.positions = vec![0; lanes];
        }
        ensure!(
            self.positions.len() == lanes,
            "LanePad holds {} lanes, asked for {lanes}",
            self.positions.len()
        );
        Ok(&mut self.positions)
    }

    /// One lane's position, `[1]` (`I64`).
    pub(crate) fn read_lane(&self, lane: usize) -> Tensor {
        tensor1(&[self.positions.get(lane).copied().unwrap_or(0)])
    }

    /// Overwrite one lane's position in a state of `lanes` lanes (checked
    /// by the caller against what the stream could have reached).
    pub(crate) fn write_lane(&mut self, lane: usize, lanes: usize, position: &Tensor) -> TractResult<()> {
        let value = position.try_as_plain_ram()?.as_slice::<i64>()?;
        ensure!(
            value.len() == 1,
            "LanePad takes one position a lane, got {}",
            value.len()
        );
        ensure!(value[0] >= 0, "LanePad: a negative stream position {}", value[0]);
        self.sized(lanes)?[lane] = value[0];
        Ok(())
    }
}

impl OpState for LanePadState {
    fn eval(&mut self, ctx: &EvalContext, op: &dyn Op, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = op.downcast_ref::<LanePad>().context("LanePadState runs LanePad")?;
        let input = args_1!(inputs);
        let (seats, width) = seats(ctx.seating, input.shape()[0], "LanePad")?;
        let lanes: TVec<usize> = (0..seats).map(|ix| lane_of(ctx.seating, ix)).collect();
        let begins: TVec<i64> = {
            let positions = self.sized(width)?;
            lanes.iter().map(|l| positions[*l]).collect()
        };
        let limits = self.limits(op, ctx.symbols);
        let (output, next) = op.pad(limits, input, &begins)?;
        for (lane, next) in lanes.iter().zip(next) {
            self.positions[*lane] = next;
        }
        Ok(tvec!(output))
    }

    fn reset_lanes(&mut self, lanes: &[TractLane]) -> TractResult<()> {
        if self.positions.is_empty() {
            return Ok(());
        }
        let width = self.positions.len();
        ensure!(
            lanes.iter().all(|l| l.0 < width),
            "LanePad holds {width} lanes, asked to reset {lanes:?}"
        );
        for lane in lanes {
            self.positions[lane.0] = 0;
        }
        Ok(())
    }
}

impl LanePad {
    /// Pad a turn's pulse whose seats start at stream positions `positions`,
    /// the stream's limits `(end_input, after)` resolved
    /// ([`LanePadState::limits`]); the padded pulse and each seat's next
    /// position.
    fn pad(
        &self,
        (end_input, after): (usize, usize),
        input: TValue,
        positions: &[i64],
    ) -> TractResult<(TValue, TVec<i64>)> {
        let dt = input.datum_type();
        let pulse = input.shape()[self.axis];
        let mut next = TVec::with_capacity(positions.len());
        let mut to_pad = tvec!();
        for (seat, &begin) in positions.iter().enumerate() {
            let begin = usize::try_from(begin).context("LanePad: a negative stream position")?;
            let end = begin
                .checked_add(pulse)
                .context("LanePad: a stream position past any stream's length")?;
            next.push((end - self.overlap) as i64);
            let valid = begin >= self.begin_input && end <= end_input;
            let outside = end <= self.begin_input - self.before || begin >= end_input.saturating_add(after);
            if !valid && !outside {
                to_pad.push((seat, begin));
            }
        }
        if to_pad.is_empty() {
            return Ok((input, next));
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
        Ok((output.into_tvalue(), next))
    }
}

impl TypedOp for LanePad {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let mut fact = inputs[0].without_value();
        fact.uniform = None;
        Ok(tvec!(fact))
    }

    as_op!();
}
