//! tract-pulse's Delay kept in place: [`LaneDelay`] replaces the op, and its
//! state holds, per lane, the `delay + overlap` frames of the stream before
//! the coming pulse (zeros before the stream starts), in stream order.
//!
//! A seat's pulse of `p` frames is the tail of the sequence
//!
//! ```text
//! joined = buffer ++ pulse                  // along the delayed axis
//! out    = joined[0 .. p + overlap]         // what Delay outputs
//! buffer = joined[p .. p + buffered]        // what the next pulse finds
//! ```
//!
//! which is what tract's ring computes (the last `buffered` frames of the
//! stream, then the pulse's first `p - delay`): only copies, so the bits
//! are the op's. The lane's frames are copied where tract's own laned
//! Delay copies them (into the output, the new tail back into the lane),
//! and nowhere else: no state input or output, nothing gathered or
//! scattered by the runner around a turn. Export and import read and
//! write one lane's frames on demand ([`LaneDelayState::read_lane`],
//! [`LaneDelayState::write_lane`]).

use tract_core::internal::*;
use tract_core::plan::LaneId as TractLane;
use tract_pulse_opl::ops::Delay;

use super::{lane_of, one_lane_shape, reroute, seats, Kept, Rewrite};

pub(super) fn lift(model: &mut TypedModel, node: &TypedNode) -> TractResult<Rewrite> {
    let Some(op) = node.op_as::<Delay>() else {
        return Ok(Rewrite::NotMine);
    };
    if op.axis == 0 {
        return Ok(Rewrite::Left("it delays axis 0, the lanes' axis".into()));
    }
    let input = node.inputs[0];
    let fact = model.outlet_fact(input)?.without_value();
    if !fact.datum_type.is_copy() {
        return Ok(Rewrite::Left(format!(
            "it delays {:?}, not plain numbers",
            fact.datum_type
        )));
    }
    let axis = op.axis;
    fact.shape[axis]
        .to_usize()
        .with_context(|| format!("the pulse of {:?} has no concrete length on axis {axis}", node.name))?;
    let buffered = op.delay + op.overlap;
    let Some(mut lane_shape) = one_lane_shape(&fact) else {
        return Ok(Rewrite::Left(format!(
            "its input {:?} has a symbolic dim besides the batch",
            fact.shape
        )));
    };
    lane_shape[axis] = buffered;
    let name = format!("{}.laned", node.name);
    let lane_delay = LaneDelay {
        axis,
        delay: op.delay,
        overlap: op.overlap,
        lane_shape: lane_shape.clone(),
    };
    let out = model.wire_node(&name, lane_delay, &[input])?[0];
    reroute(model, node.id.into(), out)?;
    Ok(Rewrite::Kept(Kept {
        node: name,
        datum_type: fact.datum_type,
        lane_shape,
        step: None,
    }))
}

/// Delay with its buffer kept per lane in its own state, readable and
/// writable one lane at a time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LaneDelay {
    axis: usize,
    delay: usize,
    overlap: usize,
    /// One lane's buffer shape (1 on axis 0, `delay + overlap` on `axis`).
    lane_shape: TVec<usize>,
}

impl LaneDelay {
    fn buffered(&self) -> usize {
        self.delay + self.overlap
    }
}

impl Op for LaneDelay {
    fn name(&self) -> StaticName {
        "LaneDelay".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "axis: {} delay: {} overlap: {} (Delay, its buffer kept per lane)",
            self.axis, self.delay, self.overlap
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for LaneDelay {
    not_out_of_plan!();

    fn state(&self, _ctx: &EvalContext) -> TractResult<Option<Box<dyn OpState>>> {
        Ok(Some(Box::new(LaneDelayState {
            op: self.clone(),
            buffer: None,
            heads: vec![],
        })))
    }
}

impl TypedOp for LaneDelay {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let mut fact = inputs[0].without_value();
        fact.uniform = None;
        let pulse = fact.shape[self.axis].clone();
        fact.shape.set(self.axis, pulse + self.overlap);
        Ok(tvec!(fact))
    }

    as_op!();
}

/// Every lane's frames, `[lanes, .., delay + overlap, ..]`, allocated
/// (zeros) at the first turn or write, when the state's width is known; each
/// lane a ring whose oldest frame sits at its `heads` entry, so a turn
/// overwrites the frames it retires instead of moving the others.
#[derive(Debug, Clone)]
pub struct LaneDelayState {
    op: LaneDelay,
    buffer: Option<Tensor>,
    heads: Vec<usize>,
}

/// The runs of a ring of `len` frames holding `count` frames from ring
/// index `start`: each with its offset among the `count`.
fn runs(start: usize, count: usize, len: usize) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> {
    let first = count.min(len - start);
    [(0, start..start + first), (first, 0..count - first)]
        .into_iter()
        .filter(|(_, r)| !r.is_empty())
}

/// A contiguous tensor's bytes seen as `[rows, outer, frames, frame]`:
/// rows on axis 0, frames along the delayed axis, `outer` the axes between,
/// `frame` the bytes of one step of the delayed axis.
#[derive(Debug, Clone, Copy)]
struct Frames {
    outer: usize,
    frames: usize,
    frame: usize,
}

impl Frames {
    fn of(shape: &[usize], axis: usize, size: usize) -> Frames {
        Frames {
            outer: shape[1..axis].iter().product(),
            frames: shape[axis],
            frame: shape[axis + 1..].iter().product::<usize>() * size,
        }
    }

    /// Where frame `frame` of row `row` starts in the slab `outer`.
    fn at(&self, row: usize, outer: usize, frame: usize) -> usize {
        ((row * self.outer + outer) * self.frames + frame) * self.frame
    }
}

/// Copy `n` frames from `src` (laid out as `s`), row and first frame
/// `from`, into `dst` (laid out as `d`, the same frame and outer sizes),
/// row and first frame `to`.
fn copy_frames(dst: &mut [u8], d: Frames, to: (usize, usize), src: &[u8], s: Frames, from: (usize, usize), n: usize) {
    debug_assert_eq!((d.outer, d.frame), (s.outer, s.frame));
    let bytes = n * d.frame;
    for outer in 0..d.outer {
        let (at, of) = (d.at(to.0, outer, to.1), s.at(from.0, outer, from.1));
        dst[at..at + bytes].copy_from_slice(&src[of..of + bytes]);
    }
}

impl LaneDelayState {
    /// The buffer for `lanes` lanes of `dt`, allocated if it was not.
    fn buffer(&mut self, dt: DatumType, lanes: usize) -> TractResult<(&mut Tensor, &mut Vec<usize>)> {
        if self.buffer.is_none() {
            let mut shape = self.op.lane_shape.clone();
            shape[0] = lanes;
            self.buffer = Some(Tensor::zero_dt(dt, &shape)?);
            self.heads = vec![0; lanes];
        }
        let buffer = self.buffer.as_mut().unwrap();
        ensure!(
            buffer.shape()[0] == lanes && buffer.datum_type() == dt,
            "LaneDelay holds {} lanes of {:?}, asked for {lanes} of {dt:?}",
            buffer.shape()[0],
            buffer.datum_type()
        );
        Ok((buffer, &mut self.heads))
    }

    /// One lane's frames in stream order (`[1, .., delay + overlap, ..]`);
    /// zeros for a state not run yet.
    pub(crate) fn read_lane(&self, lane: usize, dt: DatumType) -> TractResult<Tensor> {
        let mut frames = Tensor::zero_dt(dt, &self.op.lane_shape)?;
        if let Some(buffer) = &self.buffer {
            let axis = self.op.axis;
            let len = self.op.buffered();
            for (at, run) in runs(self.heads[lane], len, len) {
                let n = run.len();
                frames.assign_slice_at_prefix(&[0], at..at + n, buffer, &[lane], run, axis)?;
            }
        }
        Ok(frames)
    }

    /// Overwrite one lane's frames (shaped as [`LaneDelayState::read_lane`]
    /// gives them) in a state of `lanes` lanes.
    pub(crate) fn write_lane(&mut self, lane: usize, lanes: usize, frames: &Tensor) -> TractResult<()> {
        ensure!(
            frames.shape() == &*self.op.lane_shape,
            "LaneDelay takes {:?} a lane, got {:?}",
            self.op.lane_shape,
            frames.shape()
        );
        let (buffer, heads) = self.buffer(frames.datum_type(), lanes)?;
        buffer.assign_slice(lane..lane + 1, frames, 0..1, 0)?;
        heads[lane] = 0;
        Ok(())
    }
}

impl OpState for LaneDelayState {
    fn eval(&mut self, ctx: &EvalContext, _op: &dyn Op, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let input = args_1!(inputs);
        let (axis, overlap, len) = (self.op.axis, self.op.overlap, self.op.buffered());
        let dt = input.datum_type();
        let (seats, width) = seats(ctx.seating, input.shape()[0], "LaneDelay")?;
        if len == 0 {
            return Ok(tvec!(input));
        }
        let pulse = input.shape()[axis];
        let out_len = pulse + overlap;
        let mut out_shape: TVec<usize> = input.shape().into();
        out_shape[axis] = out_len;
        // SAFETY: every frame of every seat is written below: `from_lane`
        // frames from the lane's ring, the other `out_len - from_lane` from
        // the pulse.
        let mut output = unsafe { Tensor::uninitialized_dt(dt, &out_shape)? };
        let (buffer, heads) = self.buffer(dt, width)?;
        let from_lane = len.min(out_len);
        let fresh = pulse.min(len);
        // Byte copies, frame runs at a time: the data is plain (the lift
        // keeps only such Delays) and every tensor here is contiguous.
        let size = dt.size_of();
        let (o, i, b) = (
            Frames::of(output.shape(), axis, size),
            Frames::of(input.shape(), axis, size),
            Frames::of(buffer.shape(), axis, size),
        );
        let into = output.as_bytes_mut();
        for ix in 0..seats {
            let lane = lane_of(ctx.seating, ix);
            let head = heads[lane];
            // The output: the lane's frames, oldest first, then the pulse's
            // first ones.
            for (at, run) in runs(head, from_lane, len) {
                copy_frames(into, o, (ix, at), buffer.as_bytes(), b, (lane, run.start), run.len());
            }
            copy_frames(
                into,
                o,
                (ix, from_lane),
                input.as_bytes(),
                i,
                (ix, 0),
                out_len - from_lane,
            );
            // The pulse's frames take the places of the oldest ones: only
            // its last `fresh` survive, written where they land.
            for (at, run) in runs((head + pulse - fresh) % len, fresh, len) {
                let from = pulse - fresh + at;
                copy_frames(
                    buffer.as_bytes_mut(),
                    b,
                    (lane, run.start),
                    input.as_bytes(),
                    i,
                    (ix, from),
                    run.len(),
                );
            }
            heads[lane] = (head + pulse) % len;
        }
        Ok(tvec!(output.into_tvalue()))
    }

    fn reset_lanes(&mut self, lanes: &[TractLane]) -> TractResult<()> {
        let Some(buffer) = self.buffer.as_mut() else {
            return Ok(());
        };
        let width = buffer.shape()[0];
        ensure!(
            lanes.iter().all(|l| l.0 < width),
            "LaneDelay holds {width} lanes, asked to reset {lanes:?}"
        );
        let stride = buffer.len() / width * buffer.datum_type().size_of();
        let bytes = buffer.as_bytes_mut();
        for lane in lanes {
            bytes[lane.0 * stride..(lane.0 + 1) * stride].fill(0);
            self.heads[lane.0] = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_core::plan::{EvalContext, LaneId, Seating, SessionId};

    /// A Delay's case: the axes before and after the delayed one (besides
    /// the lanes' axis 0), the pulse, the delay and the overlap.
    struct Case {
        before: &'static [usize],
        after: &'static [usize],
        pulse: usize,
        delay: usize,
        overlap: usize,
    }

    /// Runs `case` on 3 lanes through `turns` (each the lanes it seats, in
    /// seat order) and checks every seat's output, and every lane's frames
    /// after every turn, against a Delay by its definition: per lane, the
    /// frames so far (zeros before the stream) joined with the pulse along
    /// the axis, the output its first `pulse + overlap` frames, the frames
    /// kept the `delay + overlap` after the pulse's length.
    fn check(case: &Case, turns: &[&[usize]]) {
        let lanes = 3;
        let axis = 1 + case.before.len();
        let len = case.delay + case.overlap;
        let shape = |rows: usize, frames: usize| -> TVec<usize> {
            let mut s: TVec<usize> = tvec![rows];
            s.extend(case.before.iter().copied());
            s.push(frames);
            s.extend(case.after.iter().copied());
            s
        };
        let op = LaneDelay {
            axis,
            delay: case.delay,
            overlap: case.overlap,
            lane_shape: shape(1, len),
        };
        let mut state = LaneDelayState {
            op: op.clone(),
            buffer: None,
            heads: vec![],
        };
        let mut kept: Vec<Tensor> = (0..lanes)
            .map(|_| Tensor::zero::<f32>(&shape(1, len)).unwrap())
            .collect();
        let symbols = SymbolValues::default();
        let mut next = 0f32;
        for (t, seated) in turns.iter().enumerate() {
            let in_shape = shape(seated.len(), case.pulse);
            let values: Vec<f32> = (0..in_shape.iter().product::<usize>())
                .map(|_| {
                    next += 1.0;
                    next
                })
                .collect();
            let input = Tensor::from_shape(&in_shape, &values).unwrap();
            let seating = Seating::new(lanes, seated.iter().map(|l| LaneId(*l))).unwrap();
            let ctx = EvalContext {
                session: SessionId::NONE,
                node_id: 0,
                symbols: &symbols,
                scenario: None,
                shared: None,
                seating: &seating,
            };
            let out = state.eval(&ctx, &op, tvec![input.clone().into_tvalue()]).unwrap();
            for (ix, lane) in seated.iter().enumerate() {
                let pulse = input.slice(0, ix, ix + 1).unwrap();
                let joined = Tensor::stack_tensors(axis, &[kept[*lane].clone(), pulse]).unwrap();
                let wanted = joined.slice(axis, 0, case.pulse + case.overlap).unwrap();
                assert_eq!(
                    out[0].slice(0, ix, ix + 1).unwrap(),
                    wanted,
                    "turn {t}, seat {ix} (lane {lane})"
                );
                kept[*lane] = joined.slice(axis, case.pulse, case.pulse + len).unwrap();
            }
            for (lane, frames) in kept.iter().enumerate() {
                assert_eq!(
                    &state.read_lane(lane, f32::datum_type()).unwrap(),
                    frames,
                    "turn {t}, lane {lane}"
                );
            }
        }
    }

    /// Seatings of every kind: all lanes in order, out of order, a subset,
    /// one lane, a lane left out for a few turns.
    const TURNS: [&[usize]; 10] = [
        &[0, 1, 2],
        &[2, 0],
        &[1],
        &[0, 2, 1],
        &[2],
        &[2],
        &[1, 0],
        &[0, 1, 2],
        &[0],
        &[2, 1, 0],
    ];

    /// The frames' layouts (the delayed axis last, first, between others)
    /// and the ring's cases (a pulse shorter than the frames kept, so
    /// writes wrap; as long; longer; a delay past the pulse; no delay).
    #[test]
    fn laned_delay_is_the_delay_by_its_definition_per_lane() {
        let cases = [
            Case {
                before: &[3],
                after: &[],
                pulse: 4,
                delay: 2,
                overlap: 0,
            },
            Case {
                before: &[],
                after: &[5],
                pulse: 3,
                delay: 4,
                overlap: 1,
            },
            Case {
                before: &[2],
                after: &[3],
                pulse: 2,
                delay: 3,
                overlap: 2,
            },
            Case {
                before: &[2],
                after: &[],
                pulse: 6,
                delay: 2,
                overlap: 0,
            },
            Case {
                before: &[],
                after: &[2],
                pulse: 1,
                delay: 3,
                overlap: 0,
            },
            Case {
                before: &[4],
                after: &[],
                pulse: 3,
                delay: 0,
                overlap: 2,
            },
            Case {
                before: &[2],
                after: &[2],
                pulse: 5,
                delay: 5,
                overlap: 0,
            },
        ];
        for case in &cases {
            check(case, &TURNS);
        }
    }
}
