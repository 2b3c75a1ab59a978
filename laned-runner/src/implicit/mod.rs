//! Implicit state: what a model keeps inside its ops from one turn to the
//! next (tract-pulse's Delay and PulsePad buffers, a Scan's or a GruSeq's
//! hidden state), found in the plan and made readable one lane at a time,
//! so that it travels (`wire.rs`) as the model's explicit state does.
//!
//! The lift is a rewrite of the plan's model, one rewrite per op kind, each
//! in a sibling module computing the bits the op it replaces computes:
//!
//! - `delay`: a Delay becomes [`delay::LaneDelay`], whose state keeps each
//!   lane's frames in place, as tract's laned Delay does (the same copies a
//!   turn), and reads or writes one lane's on demand.
//! - `pad`: a constant PulsePad becomes [`pad::LanePad`], whose state keeps
//!   each lane's stream position, read or written one lane at a time.
//! - `recurrent`: a Scan (optimized or not) or a GruSeq that carries its
//!   hidden state is told to re-seed it every turn from its initial-state
//!   input, which becomes a state input, and to return its last value,
//!   which becomes the state output; the wrapper [`recurrent::Reseeded`]
//!   lets the runner reset its lanes, which then hold nothing.
//!
//! Whatever stateful op is left (a pulsed Range, a cumulative sum, an edge
//! PulsePad...) is still laned by tract in place but cannot travel:
//! [`ImplicitState::travels`] says so, the runner refuses to export such a
//! stream's state, and a server restarts it at 0 instead of resuming it.

mod delay;
mod pad;
mod recurrent;

use std::fmt;
use std::sync::Arc;

use tract_core::internal::*;

/// One op of a model keeping state across turns, and how the runner lanes
/// it ([`LanedRunner::implicit_state`](crate::LanedRunner::implicit_state)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImplicitState {
    /// The node's name in the model.
    pub node: String,
    /// The op's name (`Delay`, `PulsePad`, `Scan`, `GruSeq`...).
    pub op: String,
    /// How its state is laned.
    pub laned: Laned,
}

/// How an op's implicit state is laned.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Laned {
    /// Kept in place, per lane, by the runner's own op standing for it
    /// (a Delay's frames, a PulsePad's position): a turn costs what tract's
    /// laned op costs, and one lane's state is read or written on demand,
    /// so it travels.
    Kept,
    /// Lifted into explicit state: the runner keeps it per lane through
    /// model input `input` and output `output`, so it travels.
    Lifted {
        /// The state input the lift added.
        input: usize,
        /// The state output the lift added.
        output: usize,
    },
    /// Left in the op, which tract lanes itself; it cannot be read out, so
    /// a stream of this model cannot be handed over.
    InPlace {
        /// Why it was not lifted.
        why: String,
    },
}

impl ImplicitState {
    /// Whether this op's state goes with a stream's exported state.
    pub fn travels(&self) -> bool {
        matches!(self.laned, Laned::Lifted { .. } | Laned::Kept)
    }
}

impl fmt::Display for ImplicitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.laned {
            Laned::Kept => write!(
                f,
                "{} ({}): kept in place per lane by the runner's own op; travels",
                self.node, self.op
            ),
            Laned::Lifted { input, output } => write!(
                f,
                "{} ({}): lifted to explicit state (input {input}, output {output}); travels",
                self.node, self.op
            ),
            Laned::InPlace { why } => write!(
                f,
                "{} ({}): laned in place by tract; does not travel ({why})",
                self.node, self.op
            ),
        }
    }
}

/// A state pair the lift added, in the model's order after the user's own.
#[derive(Debug, Clone)]
pub(crate) struct LiftedPair {
    pub input: usize,
    pub output: usize,
    /// One stream's initial value; zeros where `None`.
    pub initial: Option<Tensor>,
}

/// A state the runner's own op keeps in place (`Laned::Kept`): where its
/// op sits, and what one lane of it is on the wire.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    /// The op's node: its name while the lift rewrites, then its id in the
    /// served plan (`KeptAt`).
    pub node: String,
    pub datum_type: DatumType,
    /// One lane's shape (1 on axis 0).
    pub lane_shape: TVec<usize>,
    /// For a stream position (`LanePad`): how far it moves a pulse, so an
    /// imported one is checked against the stream's pulse count.
    pub step: Option<i64>,
}

/// A [`Kept`] state found in the served plan.
#[derive(Debug, Clone)]
pub(crate) struct KeptAt {
    /// The node's id in the served plan: its op state's index.
    pub node: usize,
    pub kept: Kept,
}

impl KeptAt {
    /// One lane of this state in `state`, as it travels.
    pub(crate) fn read(&self, state: &TypedSimpleState, lane: usize) -> TractResult<Tensor> {
        let op_state = state.op_states.get(self.node).and_then(|s| s.as_deref());
        if let Some(s) = op_state.and_then(|s| s.downcast_ref::<delay::LaneDelayState>()) {
            return s.read_lane(lane, self.kept.datum_type);
        }
        if let Some(s) = op_state.and_then(|s| s.downcast_ref::<pad::LanePadState>()) {
            return Ok(s.read_lane(lane));
        }
        bail!("node {} ({:?}) keeps no lane state", self.node, self.kept.node)
    }

    /// Overwrite one lane of this state in `state` of `lanes` lanes.
    pub(crate) fn write(&self, state: &mut TypedSimpleState, lane: usize, lanes: usize, t: &Tensor) -> TractResult<()> {
        let op_state = state.op_states.get_mut(self.node).and_then(|s| s.as_deref_mut());
        let Some(op_state) = op_state else {
            bail!("node {} ({:?}) keeps no lane state", self.node, self.kept.node)
        };
        if let Some(s) = op_state.downcast_mut::<delay::LaneDelayState>() {
            return s.write_lane(lane, lanes, t);
        }
        if let Some(s) = op_state.downcast_mut::<pad::LanePadState>() {
            return s.write_lane(lane, lanes, t);
        }
        bail!("node {} ({:?}) keeps no lane state", self.node, self.kept.node)
    }
}

/// A turn's seats and the state's width in lanes, for a kept state's op
/// whose input carries `rows` on axis 0. A laned turn seats one stream a
/// row, on the lanes its seating names; a state one caller owns
/// ([`Seating::single`](tract_core::plan::Seating::single), a plan batched
/// by hand) keeps a lane per row, row `i` on lane `i`.
pub(crate) fn seats(seating: &tract_core::plan::Seating, rows: usize, op: &str) -> TractResult<(usize, usize)> {
    if seating.max_lanes() == 1 {
        return Ok((rows, rows));
    }
    ensure!(
        rows == seating.occupancy(),
        "{op} input carries {rows} streams, the turn seats {}",
        seating.occupancy()
    );
    Ok((rows, seating.max_lanes()))
}

/// The lane seat `ix` reads and writes (see [`seats`]).
pub(crate) fn lane_of(seating: &tract_core::plan::Seating, ix: usize) -> usize {
    seating.address(ix).1.unwrap_or(ix)
}

/// One stream's shape of `fact`: 1 on axis 0 (the batch), every other dim
/// concrete, or `None`.
pub(crate) fn one_lane_shape(fact: &TypedFact) -> Option<TVec<usize>> {
    let mut shape: TVec<usize> = tvec![1];
    for d in fact.shape.iter().skip(1) {
        shape.push(d.to_usize().ok()?);
    }
    Some(shape)
}

/// The plan to serve, with its lifted pairs, its kept states and the report.
pub(crate) struct Lifted {
    pub runnable: Arc<dyn Runnable>,
    pub pairs: Vec<LiftedPair>,
    pub kept: Vec<KeptAt>,
    pub report: Vec<ImplicitState>,
}

/// What one op's rewrite did to the model under construction.
pub(crate) enum Rewrite {
    /// The op is not of this kind: the next rewrite is tried.
    NotMine,
    /// Lifted: its state is this new pair (node names for the report).
    Lifted(LiftedPair),
    /// Kept in place by the runner's own op, which replaced it.
    Kept(Kept),
    /// Of this kind but left in place, and why.
    Left(String),
}

/// The names the lift gives the sources and outputs it adds.
pub(crate) fn state_name(node: &str) -> String {
    format!("laned.state.{node}")
}

/// Lift every implicit state of `inner`'s model out of its ops. A plan with
/// none (or no typed model to read) is served as it is.
pub(crate) fn lift(inner: Arc<dyn Runnable>) -> TractResult<Lifted> {
    let Some(model) = inner.typed_model() else {
        return Ok(Lifted {
            runnable: inner,
            pairs: vec![],
            kept: vec![],
            report: vec![],
        });
    };
    let stateful = stateful_nodes(&inner)?;
    if stateful.is_empty() {
        return Ok(Lifted {
            runnable: inner,
            pairs: vec![],
            kept: vec![],
            report: vec![],
        });
    }
    let mut model: TypedModel = (**model).clone();
    let mut pairs = vec![];
    let mut kept = vec![];
    let mut report = vec![];
    for id in stateful {
        let node = model.node(id).clone();
        let op = node.op.name().to_string();
        let mut outcome = Rewrite::NotMine;
        for rewrite in [delay::lift, pad::lift, recurrent::lift] {
            outcome = rewrite(&mut model, &node)
                .with_context(|| format!("lifting the state of node {:?} ({op})", node.name))?;
            if !matches!(outcome, Rewrite::NotMine) {
                break;
            }
        }
        let laned = match outcome {
            Rewrite::Lifted(pair) => {
                let laned = Laned::Lifted {
                    input: pair.input,
                    output: pair.output,
                };
                pairs.push(pair);
                laned
            }
            Rewrite::Kept(state) => {
                kept.push(state);
                Laned::Kept
            }
            Rewrite::Left(why) => Laned::InPlace { why },
            Rewrite::NotMine => Laned::InPlace {
                why: "no lift is known for this op".into(),
            },
        };
        report.push(ImplicitState {
            node: node.name.clone(),
            op,
            laned,
        });
    }
    if pairs.is_empty() && kept.is_empty() {
        return Ok(Lifted {
            runnable: inner,
            pairs,
            kept: vec![],
            report,
        });
    }
    // The rewrites leave the replaced nodes in place, unreachable: the plan
    // orders only what the outputs need, and pruning keeps the graph small.
    let model = model.into_compact()?;
    // Compaction renumbers the nodes: each kept state's op found again by
    // the name its rewrite gave it.
    let kept = kept
        .into_iter()
        .map(|kept| {
            let node = model.node_by_name(&kept.node)?.id;
            Ok(KeptAt { node, kept })
        })
        .collect::<TractResult<Vec<_>>>()?;
    let plan = TypedSimplePlan::new(model)?;
    Ok(Lifted {
        runnable: Arc::new(plan),
        pairs,
        kept,
        report,
    })
}

/// The nodes whose op keeps a state from turn to turn: tract's ops known
/// to, recognised by type. Not asked of the ops (building an op's state
/// may have effects of its own, and the runner's first state is its
/// engine's, which reports its own failures); an op of another crate
/// keeping state is laned by tract as before, and not reported.
fn stateful_nodes(inner: &Arc<dyn Runnable>) -> TractResult<Vec<usize>> {
    use tract_core::ops::gru_seq::GruSeq;
    use tract_core::ops::scan::{OptScan, Scan};
    use tract_core::ops::submodel::SubmodelOp;
    use tract_pulse_opl::ops::{DeconvDelay, Delay, PulseMask, PulsePad, PulsedCumSum, PulsedRange};
    let Some(model) = inner.typed_model() else {
        return Ok(vec![]);
    };
    Ok(model
        .nodes()
        .iter()
        .filter(|n| {
            n.op_is::<Delay>()
                || n.op_is::<PulsePad>()
                || n.op_is::<OptScan>()
                || n.op_is::<Scan>()
                || n.op_is::<GruSeq>()
                || n.op_is::<PulseMask>()
                || n.op_is::<DeconvDelay>()
                || n.op_is::<PulsedCumSum>()
                || n.op_is::<PulsedRange>()
                || n.op_is::<SubmodelOp>()
                || n.op_is::<tract_pulse_opl::concat::PulsedSameAxisConcat>()
        })
        .map(|n| n.id)
        .collect())
}

/// Add a state source of `fact` and make `next` a model output; the pair's
/// indices.
pub(crate) fn add_pair(model: &mut TypedModel, node: &str, fact: TypedFact) -> TractResult<(OutletId, usize)> {
    let source = model.add_source(state_name(node), fact)?;
    let input = model.inputs.len() - 1;
    Ok((source, input))
}

/// Make `next` the next model output; its index.
pub(crate) fn add_output(model: &mut TypedModel, next: OutletId) -> TractResult<usize> {
    let mut outputs = model.output_outlets()?.to_vec();
    outputs.push(next);
    model.select_output_outlets(&outputs)?;
    Ok(outputs.len() - 1)
}

/// Route every consumer (and model output) of `from` to `to`.
pub(crate) fn reroute(model: &mut TypedModel, from: OutletId, to: OutletId) -> TractResult<()> {
    let succs = model.outlet_successors(from).to_vec();
    for succ in succs {
        model.add_edge(to, succ)?;
    }
    for output in model.outputs.iter_mut() {
        if *output == from {
            *output = to;
        }
    }
    Ok(())
}
