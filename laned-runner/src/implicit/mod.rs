//! Implicit state: what a model keeps inside its ops from one turn to the
//! next (tract-pulse's Delay and PulsePad buffers, a Scan's or a GruSeq's
//! hidden state), found in the plan and lifted out of it into explicit
//! state pairs, which the runner already keeps per lane, resets at spawn,
//! gathers and scatters, and hands over (`wire.rs`).
//!
//! The lift is a rewrite of the plan's model, one rewrite per op kind, each
//! in a sibling module computing the bits the op it replaces computes:
//!
//! - `delay`: a Delay becomes a concat of its buffer (a new state input)
//!   and the pulse, sliced into the pulse out and the next buffer (a new
//!   state output): the same copies as tract's ring, in stream order.
//! - `pad`: a constant PulsePad becomes [`pad::LanePad`], which reads each
//!   seat's stream position from a new state input instead of keeping it.
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
        matches!(self.laned, Laned::Lifted { .. })
    }
}

impl fmt::Display for ImplicitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.laned {
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

/// The plan to serve, with its lifted pairs and the report.
pub(crate) struct Lifted {
    pub runnable: Arc<dyn Runnable>,
    pub pairs: Vec<LiftedPair>,
    pub report: Vec<ImplicitState>,
}

/// What one op's rewrite did to the model under construction.
pub(crate) enum Rewrite {
    /// The op is not of this kind: the next rewrite is tried.
    NotMine,
    /// Lifted: its state is this new pair (node names for the report).
    Lifted(LiftedPair),
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
            report: vec![],
        });
    };
    let stateful = stateful_nodes(&inner)?;
    if stateful.is_empty() {
        return Ok(Lifted {
            runnable: inner,
            pairs: vec![],
            report: vec![],
        });
    }
    let mut model: TypedModel = (**model).clone();
    let mut pairs = vec![];
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
    if pairs.is_empty() {
        return Ok(Lifted {
            runnable: inner,
            pairs,
            report,
        });
    }
    // The rewrites leave the replaced nodes in place, unreachable: the plan
    // orders only what the outputs need, and pruning keeps the graph small.
    let model = model.into_compact()?;
    let plan = TypedSimplePlan::new(model)?;
    Ok(Lifted {
        runnable: Arc::new(plan),
        pairs,
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
