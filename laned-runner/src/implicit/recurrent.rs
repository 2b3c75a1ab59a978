//! Recurrent ops lifted: a Scan (as tract optimizes it, `OptScan`, or not)
//! and a GruSeq keep their hidden state in the session by default and seed
//! it once from their initial-state input. Both also know the other
//! contract, `reset_every_turn`: seed from that input on every call. The
//! lift sets it, feeds the initial-state input from a new state input
//! (starting from the model's initial value, the constant it had), and
//! returns the op's last-value output (added to a Scan where it had none)
//! as the state output. tract's states of both refuse to reset lanes even
//! so; [`Reseeded`] wraps the op to say that its lanes hold nothing.

use tract_core::internal::*;
use tract_core::ops::array::{MultiBroadcastTo, Slice};
use tract_core::ops::gru_seq::GruSeq;
use tract_core::ops::scan::{InputMapping, OptScan, OutputMapping, Scan};

use super::{add_output, add_pair, reroute, LiftedPair, Rewrite};

pub(super) fn lift(model: &mut TypedModel, node: &TypedNode) -> TractResult<Rewrite> {
    if let Some(op) = node.op_as::<OptScan>() {
        let parts = ScanParts {
            skip: op.skip,
            reset_every_turn: op.reset_every_turn,
            body: op.plan.model().clone(),
            input_mapping: op.input_mapping.clone(),
            output_mapping: op.output_mapping.clone(),
            optimized: true,
        };
        return lift_scan(model, node, parts);
    }
    if let Some(op) = node.op_as::<Scan>() {
        let parts = ScanParts {
            skip: op.skip,
            reset_every_turn: op.reset_every_turn,
            body: op.body.clone(),
            input_mapping: op.input_mapping.clone(),
            output_mapping: op.output_mapping.clone(),
            optimized: false,
        };
        return lift_scan(model, node, parts);
    }
    if let Some(op) = node.op_as::<GruSeq>() {
        return lift_gru_seq(model, node, op);
    }
    Ok(Rewrite::NotMine)
}

/// One stream's initial state from the wire seeding it: its constant, one
/// stream's worth (extent 1 on the batch axis, or uniform).
fn initial_of(model: &TypedModel, wire: OutletId, lane_shape: &[usize]) -> Result<Tensor, String> {
    let mut wire = wire;
    // Through the broadcasts and reshapes that give a constant its batch
    // (a symbolic shape no constant can have), when what they carry is
    // uniform.
    loop {
        let fact = model.outlet_fact(wire).map_err(|e| format!("{e:#}"))?;
        let node = model.node(wire.node);
        let passes = node.op_is::<MultiBroadcastTo>() || node.op_is::<AxisOp>() || node.op_is::<Slice>();
        if fact.konst.is_some() || fact.uniform.is_some() || !passes || node.inputs.len() != 1 {
            break;
        }
        let from = model.outlet_fact(node.inputs[0]).map_err(|e| format!("{e:#}"))?;
        let uniform = from
            .konst
            .as_ref()
            .and_then(|k| k.as_uniform())
            .or_else(|| from.uniform.as_deref().cloned());
        match uniform {
            Some(u) => return u.broadcast_scalar_to_shape(lane_shape).map_err(|e| format!("{e:#}")),
            None => wire = node.inputs[0],
        }
    }
    let fact = model.outlet_fact(wire).map_err(|e| format!("{e:#}"))?;
    if let Some(k) = &fact.konst {
        if k.shape() == lane_shape {
            return Ok((**k).clone());
        }
        if let Some(u) = k.as_uniform() {
            return u.broadcast_scalar_to_shape(lane_shape).map_err(|e| format!("{e:#}"));
        }
        return Err(format!(
            "its initial state is a constant of shape {:?}, not one stream's",
            k.shape()
        ));
    }
    if let Some(u) = &fact.uniform {
        return u.broadcast_scalar_to_shape(lane_shape).map_err(|e| format!("{e:#}"));
    }
    let by = model.node(wire.node);
    Err(format!(
        "its initial state is computed (by node {:?}, op {}), not a constant",
        by.name,
        by.op.name()
    ))
}

/// `fact`'s shape with 1 for its one symbolic dim (the batch), if it has
/// exactly one.
fn lane_shape(fact: &TypedFact) -> Option<TVec<usize>> {
    let symbolic = fact.shape.iter().filter(|d| d.to_usize().is_err()).count();
    (symbolic == 1).then(|| fact.shape.iter().map(|d| d.to_usize().unwrap_or(1)).collect())
}

/// A Scan's parameters, read from its optimized form or its decluttered
/// one (tract builds an `OptScan` only from a `Scan`).
struct ScanParts {
    skip: usize,
    reset_every_turn: bool,
    body: TypedModel,
    input_mapping: Vec<InputMapping>,
    output_mapping: Vec<OutputMapping<TDim>>,
    /// Whether `body` is optimized already.
    optimized: bool,
}

fn lift_scan(model: &mut TypedModel, node: &TypedNode, op: ScanParts) -> TractResult<Rewrite> {
    if op.reset_every_turn {
        return Ok(Rewrite::Left(
            "it re-seeds every turn already, yet keeps a state".into(),
        ));
    }
    let slots: Vec<usize> = (0..op.input_mapping.len())
        .filter(|s| op.input_mapping[*s].is_state())
        .collect();
    let states: Vec<usize> = (0..op.output_mapping.len())
        .filter(|o| op.output_mapping[*o].state)
        .collect();
    if slots.len() != 1 || states.len() != 1 {
        return Ok(Rewrite::Left(format!(
            "it carries {} hidden states; the lift takes one",
            slots.len()
        )));
    }
    let (slot, state) = (slots[0], states[0]);
    let fact = op.body.input_fact(slot)?.clone();
    let Some(shape) = lane_shape(&fact) else {
        return Ok(Rewrite::Left(format!("its hidden state {fact:?} has no batch symbol")));
    };
    let initial = match initial_of(model, node.inputs[slot], &shape) {
        Ok(t) => t,
        Err(why) => return Ok(Rewrite::Left(why)),
    };
    let mut output_mapping: Vec<OutputMapping<TDim>> = op.output_mapping.clone();
    let last = match output_mapping[state].last_value_slot {
        Some(slot) => slot,
        None => {
            let slot = node.outputs.len();
            output_mapping[state].last_value_slot = Some(slot);
            slot
        }
    };
    let (source, state_input) = add_pair(model, &node.name, fact.without_value())?;
    let mut inputs = node.inputs.clone();
    inputs[slot] = source;
    let mut scan = Scan::new(op.body, op.input_mapping, output_mapping, op.skip)?;
    scan.reset_every_turn = true;
    scan.external_state = true;
    let wrapped = Reseeded {
        inner: Box::new(scan.to_codegen_op(!op.optimized)?),
    };
    let outs = model.wire_node(format!("{}.laned", node.name), wrapped, &inputs)?;
    for ix in 0..node.outputs.len() {
        reroute(model, OutletId::new(node.id, ix), outs[ix])?;
    }
    let output = add_output(model, outs[last])?;
    Ok(Rewrite::Lifted(LiftedPair {
        input: state_input,
        output,
        initial: Some(initial),
    }))
}

fn lift_gru_seq(model: &mut TypedModel, node: &TypedNode, op: &GruSeq) -> TractResult<Rewrite> {
    if op.reset_every_turn {
        return Ok(Rewrite::Left(
            "it re-seeds every turn already, yet keeps a state".into(),
        ));
    }
    let h0 = node.inputs.len() - 1;
    // Y_h, `[batch, 1, hidden]`: the hidden state's own fact.
    let fact = node.outputs[1].fact.without_value();
    let Some(shape) = lane_shape(&fact) else {
        return Ok(Rewrite::Left(format!("its hidden state {fact:?} has no batch symbol")));
    };
    let initial = match initial_of(model, node.inputs[h0], &shape) {
        Ok(t) => t,
        Err(why) => return Ok(Rewrite::Left(why)),
    };
    let (source, state_input) = add_pair(model, &node.name, fact)?;
    let mut inputs = node.inputs.clone();
    inputs[h0] = source;
    let wrapped = Reseeded {
        inner: Box::new(GruSeq {
            reset_every_turn: true,
            ..op.clone()
        }),
    };
    let outs = model.wire_node(format!("{}.laned", node.name), wrapped, &inputs)?;
    for ix in 0..node.outputs.len() {
        reroute(model, OutletId::new(node.id, ix), outs[ix])?;
    }
    let output = add_output(model, outs[1])?;
    Ok(Rewrite::Lifted(LiftedPair {
        input: state_input,
        output,
        initial: Some(initial),
    }))
}

/// A recurrent op told to re-seed its hidden state every turn: what it
/// keeps in its state is then a cache (the body's session, a packed
/// weight), nothing of a stream's, so its lanes reset to nothing.
#[derive(Debug, Clone)]
pub struct Reseeded {
    inner: Box<dyn TypedOp>,
}

impl PartialEq for Reseeded {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner
    }
}
impl Eq for Reseeded {}

impl Op for Reseeded {
    fn name(&self) -> StaticName {
        format!("Reseeded({})", self.inner.name()).into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        self.inner.info()
    }

    op_as_typed_op!();
}

impl EvalOp for Reseeded {
    fn eval_out_of_plan(&self, inputs: TVec<TValue>) -> TractResult<Option<TVec<TValue>>> {
        self.inner.eval_out_of_plan(inputs)
    }

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        self.inner.eval(ctx, inputs)
    }

    fn state(&self, ctx: &EvalContext) -> TractResult<Option<Box<dyn OpState>>> {
        Ok(self
            .inner
            .state(ctx)?
            .map(|inner| Box::new(ReseededState { inner }) as _))
    }

    fn drop_session(&self, session: SessionId, node_id: usize) {
        self.inner.drop_session(session, node_id)
    }
}

impl TypedOp for Reseeded {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        self.inner.output_facts(inputs)
    }

    as_op!();
}

/// The wrapped op's state: its evaluation, and lanes holding nothing.
#[derive(Debug, Clone)]
struct ReseededState {
    inner: Box<dyn OpState>,
}

impl OpState for ReseededState {
    fn eval(&mut self, ctx: &EvalContext, op: &dyn Op, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = op
            .downcast_ref::<Reseeded>()
            .context("ReseededState runs a Reseeded op")?;
        self.inner.eval(ctx, op.inner.as_op(), inputs)
    }

    fn resolve_symbols(&mut self, turn: &mut TurnState) -> TractResult<()> {
        self.inner.resolve_symbols(turn)
    }

    /// The op re-seeds from its state input every turn: no lane holds
    /// anything of a stream's here.
    fn reset_lanes(&mut self, _lanes: &[LaneId]) -> TractResult<()> {
        Ok(())
    }
}
