//! What the runner knows of the model's inputs and outputs: which carry the
//! batch axis, and what a seat must feed. Checked once at construction, and
//! against every call on the caller's thread before it is queued.

use std::sync::Arc;

use tract_core::internal::*;

use crate::err::{NewRunnerError, RunError, RunErrorKind};

/// The model's interface, shared read-only by every thread.
#[derive(Debug)]
pub(crate) struct Interface {
    pub batch: Symbol,
    /// Per input: its name and fact, and whether axis 0 carries the batch.
    pub inputs: Vec<Port>,
    /// Per output: whether axis 0 carries the batch.
    pub batch_out: Vec<bool>,
    /// The model inputs a caller feeds (all but the state inputs), in order.
    pub data_inputs: Vec<usize>,
    /// The model outputs a caller gets (all but the state outputs), in order,
    /// and whether each carries the batch.
    pub data_outputs: Vec<usize>,
    pub data_batch_out: Vec<bool>,
    /// Among the caller's inputs: the batched ones and the shared ones.
    pub batched_inputs: Vec<usize>,
    pub shared_inputs: Vec<usize>,
    /// State the model carries as an input and returns as an output, kept
    /// per lane by the runner.
    pub state: Vec<StateIo>,
    /// State the runner's own ops keep per lane in place (the implicit
    /// state of a Delay or a PulsePad), after `state` on the wire.
    pub kept: Vec<crate::implicit::KeptAt>,
    /// How a stream of a pulsed model ends, from tract-pulse's properties.
    pub pulse: Option<PulseInfo>,
    /// Whether a batched input has a free dim besides the batch: then seats
    /// of different shapes can be fed, and the shape joins the group key.
    pub free_dims: bool,
}

/// What ending a stream needs to know of a pulsed model.
#[derive(Debug, Clone)]
pub(crate) struct PulseInfo {
    /// The streaming symbol (the stream's length), resolved on its last calls.
    pub symbol: Symbol,
    /// Frames per pulse.
    pub pulse: usize,
    /// Frames of delay between input and output (the largest of the outputs).
    pub delay: usize,
}

impl PulseInfo {
    fn of(inner: &dyn Runnable, inputs: &[Port]) -> Option<PulseInfo> {
        let props = inner.properties();
        let name = props
            .get("pulse.streaming_symbol")?
            .try_as_plain_ram()
            .ok()?
            .as_slice::<String>()
            .ok()?
            .first()?
            .clone();
        let symbol = inner.typed_model()?.symbols.get(&name)?;
        let axes = props.get("pulse.input_axes")?.cast_to::<i64>().ok()?.into_owned();
        let axes = axes.try_as_plain_ram().ok()?.as_slice::<i64>().ok()?.to_vec();
        let (ix, axis) = axes
            .iter()
            .enumerate()
            .find(|(ix, a)| **a >= 0 && inputs.get(*ix).is_some_and(|p| p.batched))?;
        let pulse = inputs[ix].fact.shape.dims().get(*axis as usize)?.to_usize().ok()?;
        let delays = props.get("pulse.delay")?.cast_to::<i64>().ok()?.into_owned();
        let delay = delays
            .try_as_plain_ram()
            .ok()?
            .as_slice::<i64>()
            .ok()?
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .max(0) as usize;
        Some(PulseInfo { symbol, pulse, delay })
    }
}

#[derive(Debug)]
pub(crate) struct Port {
    pub name: String,
    pub fact: TypedFact,
    pub batched: bool,
    /// An explicit-state input: fed by the runner, not the caller.
    pub state: bool,
}

/// One explicit state: model input `input` is fed, output `output` returns
/// its next value; the batch sits on `axis` of both.
#[derive(Debug, Clone)]
pub(crate) struct StateIo {
    pub input: usize,
    pub output: usize,
    pub axis: usize,
    /// The input's fact (its shape with the batch symbol on `axis`).
    pub fact: TypedFact,
    /// One stream's initial state, as configured; zeros where `None`.
    pub initial: Option<Tensor>,
}

/// The stem state inputs and outputs are paired on: lowercase, trailing
/// digits and a trailing "n", "out", "new" or "next" (and separators) off.
fn stem(name: &str) -> String {
    let mut s = name.to_lowercase();
    loop {
        let before = s.len();
        s = s
            .trim_end_matches(|c: char| c.is_ascii_digit() || c == '_' || c == '.' || c == '-' || c == ':')
            .to_string();
        for suffix in ["next", "new", "out", "n"] {
            if s.len() > suffix.len() && s.ends_with(suffix) {
                s.truncate(s.len() - suffix.len());
                break;
            }
        }
        if s.len() == before {
            return s;
        }
    }
}

fn port_index(port: &crate::config::PortRef, names: &[String], what: &str) -> Result<usize, NewRunnerError> {
    match port {
        crate::config::PortRef::Index(ix) if *ix < names.len() => Ok(*ix),
        crate::config::PortRef::Index(ix) => Err(NewRunnerError::Config(format!(
            "state {what} {ix} is past the model's {} {what}s",
            names.len()
        ))),
        crate::config::PortRef::Name(name) => names.iter().position(|n| n == name).ok_or_else(|| {
            NewRunnerError::Config(format!("no {what} named {name:?}; the model's {what}s are {names:?}"))
        }),
    }
}

/// The (input, output) index pairs of the explicit state: as configured, or
/// detected (same stem, same fact) where that is unambiguous.
fn state_pairs(
    spec: &crate::config::StateSpec,
    inputs: &[(String, TypedFact)],
    outputs: &[(String, TypedFact)],
    lifted: bool,
) -> Result<Vec<(usize, usize)>, NewRunnerError> {
    use crate::config::StateSpec;
    let in_names: Vec<String> = inputs.iter().map(|(n, _)| n.clone()).collect();
    let out_names: Vec<String> = outputs.iter().map(|(n, _)| n.clone()).collect();
    match spec {
        StateSpec::None => Ok(vec![]),
        StateSpec::Pairs(pairs) => pairs
            .iter()
            .map(|p| {
                Ok((
                    port_index(&p.input, &in_names, "input")?,
                    port_index(&p.output, &out_names, "output")?,
                ))
            })
            .collect(),
        StateSpec::Detect => {
            let same = |a: &TypedFact, b: &TypedFact| a.datum_type == b.datum_type && a.shape == b.shape;
            let mut pairs = vec![];
            for (i, (iname, ifact)) in inputs.iter().enumerate() {
                let candidates: Vec<usize> = outputs
                    .iter()
                    .enumerate()
                    .filter(|(_, (oname, ofact))| stem(oname) == stem(iname) && oname != iname && same(ifact, ofact))
                    .map(|(o, _)| o)
                    .collect();
                match candidates.len() {
                    0 => (),
                    1 => pairs.push((i, candidates[0])),
                    _ => {
                        let names: Vec<&String> = candidates.iter().map(|o| &outputs[*o].0).collect();
                        return Err(NewRunnerError::Config(format!(
                            "state input {iname:?} matches several outputs ({names:?}): name the pairs in the config"
                        )));
                    }
                }
            }
            // A model whose state the lift found needs no pair detected.
            if pairs.is_empty() && !lifted {
                return Err(NewRunnerError::Config(format!(
                    "no state pair detected among inputs {in_names:?} and outputs {out_names:?} (an output named like an input plus N, _out, _new or a digit, of the same fact): name the pairs in the config"
                )));
            }
            for (k, (_, o)) in pairs.iter().enumerate() {
                if pairs[..k].iter().any(|(_, o2)| o2 == o) {
                    return Err(NewRunnerError::Config(format!(
                        "output {:?} matches several state inputs: name the pairs in the config",
                        outputs[*o].0
                    )));
                }
            }
            Ok(pairs)
        }
    }
}

/// What a call carries once checked: one seat's batched inputs per row, and
/// the shared inputs every row of it agrees on.
pub(crate) struct Checked {
    pub seats: TVec<TVec<TValue>>,
    pub shared: TVec<TValue>,
    /// Where the batched inputs have free dims: their shapes past axis 0,
    /// one after the other (seats of different shapes never share a turn).
    pub shapes: TVec<usize>,
}

/// `fact`'s shape for one stream: `batch_axis` (if any) of extent 1, every
/// other dim concrete (`None` where one is symbolic).
pub(crate) fn one_stream_shape(fact: &TypedFact, batch_axis: Option<usize>) -> Option<TVec<usize>> {
    fact.shape
        .dims()
        .iter()
        .enumerate()
        .map(|(axis, d)| {
            if Some(axis) == batch_axis {
                Some(1)
            } else {
                d.to_usize().ok()
            }
        })
        .collect()
}

/// A configured initial state as a tensor of state input `ix`'s type,
/// checked against one stream's shape of it.
fn initial_tensor(
    init: &crate::config::InitialState,
    ix: usize,
    name: &str,
    fact: &TypedFact,
    axis: usize,
) -> Result<Tensor, NewRunnerError> {
    let want = one_stream_shape(fact, Some(axis)).ok_or_else(|| {
        NewRunnerError::BatchAxis(format!(
            "state input {ix} ({name:?}) has a symbolic dim besides the batch: {}",
            shape_text(fact)
        ))
    })?;
    if init.shape[..] != want[..] {
        return Err(NewRunnerError::Config(format!(
            "the initial state of input {ix} ({name:?}) has shape {:?}, one stream's state is {:?}",
            init.shape,
            &want[..]
        )));
    }
    let count: usize = want.iter().product();
    if init.values.len() != count {
        return Err(NewRunnerError::Config(format!(
            "the initial state of input {ix} ({name:?}) gives {} values for shape {:?}, which holds {count}",
            init.values.len(),
            &want[..]
        )));
    }
    Tensor::from_shape(&init.shape, &init.values)
        .and_then(|t| t.cast_to_dt(fact.datum_type).map(|t| t.into_owned()))
        .map_err(|e| NewRunnerError::Config(format!("the initial state of input {ix} ({name:?}): {e:#}")))
}

fn batch_symbol(fact: &TypedFact) -> Option<Symbol> {
    match fact.shape.dims().first() {
        Some(TDim::Sym(s)) => Some(s.clone()),
        _ => None,
    }
}

/// `fact` as an error names it: its datum type and dims.
pub(crate) fn shape_text(fact: &TypedFact) -> String {
    let dims: Vec<String> = fact.shape.dims().iter().map(|d| d.to_string()).collect();
    format!("{:?} [{}]", fact.datum_type, dims.join(", "))
}

fn tensor_text(t: &Tensor) -> String {
    let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    format!("{:?} [{}]", t.datum_type(), dims.join(", "))
}

impl Interface {
    /// `inner`'s interface: the configured state pairs, then `lifted`, the
    /// pairs the implicit-state lift added (`implicit`).
    pub fn of(
        inner: &dyn Runnable,
        state_spec: &crate::config::StateSpec,
        lifted: &[crate::implicit::LiftedPair],
    ) -> Result<Interface, NewRunnerError> {
        let model = inner.typed_model();
        let name_of = |ix: usize, input: bool| -> String {
            model
                .and_then(|m| {
                    let outlet = if input { m.inputs.get(ix) } else { m.outputs.get(ix) }?;
                    Some(m.node(outlet.node).name.clone())
                })
                .unwrap_or_else(|| format!("{} {ix}", if input { "input" } else { "output" }))
        };
        let read = |ix: usize, input: bool| -> Result<(String, TypedFact), NewRunnerError> {
            let fact = if input {
                inner.input_fact(ix)
            } else {
                inner.output_fact(ix)
            };
            let fact = fact.map_err(|e| NewRunnerError::Model(format!("{e:#}")))?.clone();
            Ok((name_of(ix, input), fact))
        };
        let in_ports = (0..inner.input_count())
            .map(|ix| read(ix, true))
            .collect::<Result<Vec<_>, _>>()?;
        let out_ports = (0..inner.output_count())
            .map(|ix| read(ix, false))
            .collect::<Result<Vec<_>, _>>()?;
        // The lifted ports are named like pairs; detection leaves them to
        // the lift, which pairs them itself, after the configured ones.
        let lifted_port = |i: usize, o: usize| lifted.iter().any(|p| p.input == i || p.output == o);
        let mut pairs = if lifted.is_empty() {
            state_pairs(state_spec, &in_ports, &out_ports, false)?
        } else {
            let user_in: Vec<(String, TypedFact)> = in_ports
                .iter()
                .enumerate()
                .filter(|(i, _)| !lifted.iter().any(|p| p.input == *i))
                .map(|(_, p)| p.clone())
                .collect();
            let user_out: Vec<(String, TypedFact)> = out_ports
                .iter()
                .enumerate()
                .filter(|(o, _)| !lifted.iter().any(|p| p.output == *o))
                .map(|(_, p)| p.clone())
                .collect();
            // The lift appends its ports, so the user's keep their indices.
            state_pairs(state_spec, &user_in, &user_out, true)?
        };
        debug_assert!(pairs.iter().all(|(i, o)| !lifted_port(*i, *o)));
        let configured = pairs.len();
        pairs.extend(lifted.iter().map(|p| (p.input, p.output)));
        let state_in = |ix: usize| pairs.iter().any(|(i, _)| *i == ix);
        let state_out = |ix: usize| pairs.iter().any(|(_, o)| *o == ix);
        let mut symbols: Vec<Symbol> = vec![];
        let mut elsewhere: Vec<String> = vec![];
        let mut note = |what: String, fact: &TypedFact, symbols: &mut Vec<Symbol>| {
            if let Some(s) = batch_symbol(fact) {
                symbols.push(s);
            }
            for (axis, dim) in fact.shape.dims().iter().enumerate().skip(1) {
                if let TDim::Sym(s) = dim {
                    elsewhere.push(format!("{what} carries {s} on axis {axis}"));
                }
            }
        };
        let mut inputs = vec![];
        for (ix, (name, fact)) in in_ports.iter().enumerate() {
            if !state_in(ix) {
                note(format!("input {ix} ({name:?})"), fact, &mut symbols);
            }
            inputs.push(Port {
                name: name.clone(),
                batched: false,
                state: state_in(ix),
                fact: fact.clone(),
            });
        }
        let mut out_facts = vec![];
        for (ix, (name, fact)) in out_ports.iter().enumerate() {
            if !state_out(ix) {
                note(format!("output {ix} ({name:?})"), fact, &mut symbols);
            }
            out_facts.push(fact.clone());
        }
        symbols.sort();
        symbols.dedup();
        let batch = match symbols.len() {
            1 => symbols.remove(0),
            0 => {
                let found = if elsewhere.is_empty() {
                    "no input or output carries a symbol at all".to_string()
                } else {
                    elsewhere.join(", ")
                };
                return Err(NewRunnerError::BatchAxis(format!(
                    "a laned model carries its batch symbol on axis 0 of the tensors it batches, and {found}; move the batch to axis 0 with a graph edit (Batchify)"
                )));
            }
            _ => {
                let names: Vec<String> = symbols.iter().map(|s| s.to_string()).collect();
                return Err(NewRunnerError::BatchAxis(format!(
                    "axis 0 carries {} symbols ({}); one symbol must stand for the whole turn's occupancy",
                    names.len(),
                    names.join(" and ")
                )));
            }
        };
        for port in &mut inputs {
            port.batched = !port.state && batch_symbol(&port.fact).as_ref() == Some(&batch);
        }
        let mut state = vec![];
        for (i, o) in &pairs {
            let (name, fact) = &in_ports[*i];
            let axes: Vec<usize> = fact
                .shape
                .dims()
                .iter()
                .enumerate()
                .filter(|(_, d)| matches!(d, TDim::Sym(s) if *s == batch))
                .map(|(a, _)| a)
                .collect();
            let [axis] = axes[..] else {
                return Err(NewRunnerError::BatchAxis(format!(
                    "state input {i} ({name:?}) carries the batch {batch} on {} axes of {}; it needs exactly one",
                    axes.len(),
                    shape_text(fact)
                )));
            };
            let (oname, ofact) = &out_ports[*o];
            if ofact.datum_type != fact.datum_type || ofact.shape != fact.shape {
                return Err(NewRunnerError::BatchAxis(format!(
                    "state input {i} ({name:?}) is {}, its output {o} ({oname:?}) is {}: they must match",
                    shape_text(fact),
                    shape_text(ofact)
                )));
            }
            let initial = match state_spec {
                _ if state.len() >= configured => lifted[state.len() - configured].initial.clone(),
                crate::config::StateSpec::Pairs(spec) => spec[state.len()]
                    .initial
                    .as_ref()
                    .map(|init| initial_tensor(init, *i, name, fact, axis))
                    .transpose()?,
                _ => None,
            };
            state.push(StateIo {
                input: *i,
                output: *o,
                axis,
                fact: fact.clone(),
                initial,
            });
        }
        let batch_out: Vec<bool> = out_facts
            .iter()
            .map(|f| batch_symbol(f).as_ref() == Some(&batch))
            .collect();
        if !batch_out.iter().any(|b| *b) {
            return Err(NewRunnerError::NoBatchedOutput {
                outputs: batch_out.len(),
            });
        }
        for (ix, batched) in batch_out.iter().enumerate() {
            if !*batched && !state_out(ix) {
                unbatched_output_is_shared(inner, ix, &out_ports[ix].0, &inputs)?;
            }
        }
        let data_inputs: Vec<usize> = (0..inputs.len()).filter(|ix| !inputs[*ix].state).collect();
        let batched_inputs = (0..data_inputs.len())
            .filter(|k| inputs[data_inputs[*k]].batched)
            .collect();
        let shared_inputs = (0..data_inputs.len())
            .filter(|k| !inputs[data_inputs[*k]].batched)
            .collect();
        let data_outputs: Vec<usize> = (0..batch_out.len()).filter(|ix| !state_out(*ix)).collect();
        let data_batch_out = data_outputs.iter().map(|ix| batch_out[*ix]).collect();
        let pulse = PulseInfo::of(inner, &inputs);
        let free_dims = inputs
            .iter()
            .filter(|p| p.batched)
            .any(|p| p.fact.shape.dims().iter().skip(1).any(|d| d.to_usize().is_err()));
        Ok(Interface {
            batch,
            inputs,
            batch_out,
            data_inputs,
            data_outputs,
            data_batch_out,
            batched_inputs,
            shared_inputs,
            state,
            kept: vec![],
            pulse,
            free_dims,
        })
    }

    /// One row of zeros for every input: a pulse of silence.
    pub fn silence(&self) -> Result<TVec<TValue>, String> {
        self.data_inputs
            .iter()
            .map(|ix| &self.inputs[*ix])
            .map(|port| {
                let shape = one_stream_shape(&port.fact, port.batched.then_some(0))
                    .ok_or_else(|| format!("input {:?} has a symbolic dim, so silence has no shape", port.name))?;
                Tensor::zero_dt(port.fact.datum_type, &shape)
                    .map(|t| t.into_tvalue())
                    .map_err(|e| format!("{e:#}"))
            })
            .collect()
    }

    /// Check a call's inputs against the facts (count, datum type, rank,
    /// every concrete dim but the batch axis, every dim that is a symbol
    /// `resolved` pins) and split it into seats. Any failure hands the
    /// inputs back inside the error.
    pub fn check(&self, inputs: TVec<TValue>, resolved: &[(Symbol, i64)]) -> Result<Checked, RunError> {
        if inputs.len() != self.data_inputs.len() {
            let kind = RunErrorKind::InputCount {
                got: inputs.len(),
                wanted: self.data_inputs.len(),
            };
            return Err(RunError::with_inputs(kind, inputs));
        }
        let mut rows: Option<(usize, usize)> = None;
        let ports = self.data_inputs.iter().map(|ix| &self.inputs[*ix]);
        for (index, (input, port)) in inputs.iter().zip(ports).enumerate() {
            let fact = &port.fact;
            let mismatch = input.datum_type() != fact.datum_type
                || input.rank() != fact.rank()
                || fact
                    .shape
                    .dims()
                    .iter()
                    .zip(input.shape())
                    .enumerate()
                    .any(|(axis, (want, got))| {
                        if axis == 0 && port.batched {
                            return *got == 0;
                        }
                        match (want.to_usize(), want) {
                            (Ok(want), _) => want != *got,
                            (Err(_), TDim::Sym(s)) => resolved.iter().any(|(r, v)| r == s && *v != *got as i64),
                            (Err(_), _) => false,
                        }
                    });
            if mismatch {
                let mut wanted = shape_text(fact);
                let pins: Vec<String> = resolved
                    .iter()
                    .filter(|(r, _)| fact.shape.dims().iter().any(|d| matches!(d, TDim::Sym(s) if s == r)))
                    .map(|(r, v)| format!("{r} = {v}"))
                    .collect();
                if !pins.is_empty() {
                    wanted = format!("{wanted} with {} resolved for this call", pins.join(", "));
                }
                let kind = RunErrorKind::Input {
                    index,
                    name: port.name.clone(),
                    got: tensor_text(input),
                    wanted,
                };
                return Err(RunError::with_inputs(kind, inputs));
            }
            if port.batched {
                let got = input.shape()[0];
                match rows {
                    None => rows = Some((got, index)),
                    Some((first, _)) if first != got => {
                        let kind = RunErrorKind::Rows {
                            index,
                            name: port.name.clone(),
                            got,
                            first,
                        };
                        return Err(RunError::with_inputs(kind, inputs));
                    }
                    _ => (),
                }
            }
        }
        let rows = rows.map(|r| r.0).unwrap_or(1);
        let shared: TVec<TValue> = self.shared_inputs.iter().map(|ix| inputs[*ix].clone()).collect();
        let shapes: TVec<usize> = if self.free_dims {
            self.batched_inputs
                .iter()
                .flat_map(|ix| inputs[*ix].shape()[1..].iter().copied())
                .collect()
        } else {
            TVec::new()
        };
        let seats = if rows == 1 {
            let mut inputs = inputs;
            let seat: TVec<TValue> = if self.shared_inputs.is_empty() {
                std::mem::take(&mut inputs)
            } else {
                self.batched_inputs.iter().map(|ix| inputs[*ix].clone()).collect()
            };
            tvec!(seat)
        } else {
            let mut seats = TVec::with_capacity(rows);
            for row in 0..rows {
                let mut seat = TVec::with_capacity(self.batched_inputs.len());
                for ix in &self.batched_inputs {
                    match inputs[*ix].slice(0, row, row + 1) {
                        Ok(t) => seat.push(t.into_tvalue()),
                        Err(e) => {
                            let kind = RunErrorKind::Turn(format!("slicing row {row} of input {ix}: {e:#}"));
                            return Err(RunError::with_inputs(kind, inputs));
                        }
                    }
                }
                seats.push(seat);
            }
            seats
        };
        Ok(Checked { seats, shared, shapes })
    }
}

/// An output without the batch axis is one value for the whole turn: fine
/// when it depends only on shared inputs and constants, a leak between
/// streams when anything batched (a batched input, an explicit state) flows
/// into it. Refused then, naming the output and the input.
fn unbatched_output_is_shared(
    inner: &dyn Runnable,
    ix: usize,
    name: &str,
    inputs: &[Port],
) -> Result<(), NewRunnerError> {
    let Some(model) = inner.typed_model() else {
        return Err(NewRunnerError::MixedOutput {
            output: format!("{ix} ({name:?})"),
            input: "(unknown: the runnable exposes no typed model to trace it through)".into(),
        });
    };
    let Some(outlet) = model.outputs.get(ix) else {
        return Ok(());
    };
    let mut seen = vec![false; model.nodes.len()];
    let mut todo = vec![outlet.node];
    while let Some(node) = todo.pop() {
        if std::mem::replace(&mut seen[node], true) {
            continue;
        }
        if let Some(input) = model.inputs.iter().position(|i| i.node == node) {
            let port = &inputs[input];
            if port.batched || port.state {
                return Err(NewRunnerError::MixedOutput {
                    output: format!("{ix} ({name:?})"),
                    input: format!("{input} ({:?})", port.name),
                });
            }
        }
        todo.extend(model.nodes[node].inputs.iter().map(|i| i.node));
    }
    Ok(())
}

/// Seats share a turn only when they agree on the shared inputs and on the
/// symbols resolved for the call. `None` is the common case: nothing shared,
/// nothing resolved.
#[derive(Debug, Clone, Default)]
pub(crate) struct Group(pub Option<Arc<GroupKey>>);

#[derive(Debug)]
pub(crate) struct GroupKey {
    pub shared: TVec<TValue>,
    pub resolved: Vec<(Symbol, i64)>,
    /// The seats' shapes where the model leaves dims free (see
    /// [`Checked::shapes`]).
    pub shapes: TVec<usize>,
}

impl PartialEq for Group {
    fn eq(&self, other: &Group) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                Arc::ptr_eq(a, b) || (a.resolved == b.resolved && a.shapes == b.shapes && a.shared == b.shared)
            }
            _ => false,
        }
    }
}

impl Group {
    pub fn new(shared: TVec<TValue>, resolved: Vec<(Symbol, i64)>, shapes: TVec<usize>) -> Group {
        if shared.is_empty() && resolved.is_empty() && shapes.is_empty() {
            Group(None)
        } else {
            Group(Some(Arc::new(GroupKey {
                shared,
                resolved,
                shapes,
            })))
        }
    }

    pub fn shared(&self) -> &[TValue] {
        self.0.as_ref().map(|k| &*k.shared).unwrap_or(&[])
    }

    pub fn resolved(&self) -> &[(Symbol, i64)] {
        self.0.as_ref().map(|k| &*k.resolved).unwrap_or(&[])
    }
}
