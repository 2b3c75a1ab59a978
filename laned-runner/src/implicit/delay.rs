//! tract-pulse's Delay lifted: its buffer (`delay + overlap` frames of the
//! stream before this pulse, zeros before the stream starts) becomes a state
//! input `buffer`, and the op becomes
//!
//! ```text
//! joined = concat(buffer, pulse)           // along the delayed axis
//! out    = joined[0 .. pulse + overlap]    // what Delay outputs
//! next   = joined[pulse .. pulse + buffered] // the buffer for the next pulse
//! ```
//!
//! Delay's ring keeps the same frames (the last `buffered` of the stream)
//! and writes out the same ones: its output is the buffered frames in
//! stream order followed by the pulse's first `pulse - delay`, or, for a
//! pulse shorter than the delay, the buffer's first `pulse + overlap`. Both
//! are `joined`'s prefix; only copies, so the bits are the op's.

use tract_core::internal::*;
use tract_core::ops::array::{Slice, TypedConcat};
use tract_pulse_opl::ops::Delay;

use super::{add_output, add_pair, reroute, LiftedPair, Rewrite};

pub(super) fn lift(model: &mut TypedModel, node: &TypedNode) -> TractResult<Rewrite> {
    let Some(op) = node.op_as::<Delay>() else {
        return Ok(Rewrite::NotMine);
    };
    let input = node.inputs[0];
    let fact = model.outlet_fact(input)?.without_value();
    let axis = op.axis;
    let pulse = fact.shape[axis]
        .to_usize()
        .with_context(|| format!("the pulse of {:?} has no concrete length on axis {axis}", node.name))?;
    let buffered = op.delay + op.overlap;
    let mut buffer_fact = fact.clone();
    buffer_fact.shape.set(axis, buffered.to_dim());
    let (buffer, state_input) = add_pair(model, &node.name, buffer_fact)?;
    let joined = model.wire_node(
        format!("{}.laned.joined", node.name),
        TypedConcat::new(axis),
        &[buffer, input],
    )?[0];
    let out = model.wire_node(
        format!("{}.laned.out", node.name),
        Slice::new(axis, 0, pulse + op.overlap),
        &[joined],
    )?[0];
    let next = model.wire_node(
        format!("{}.laned.next", node.name),
        Slice::new(axis, pulse, pulse + buffered),
        &[joined],
    )?[0];
    reroute(model, node.id.into(), out)?;
    let output = add_output(model, next)?;
    Ok(Rewrite::Lifted(LiftedPair {
        input: state_input,
        output,
        initial: None,
    }))
}
