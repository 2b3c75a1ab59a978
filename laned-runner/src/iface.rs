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
    /// Indices of the batched inputs, in order.
    pub batched_inputs: Vec<usize>,
    /// Indices of the shared inputs, in order.
    pub shared_inputs: Vec<usize>,
    /// How a stream of a pulsed model ends, from tract-pulse's properties.
    pub pulse: Option<PulseInfo>,
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
}

/// What a call carries once checked: one seat's batched inputs per row, and
/// the shared inputs every row of it agrees on.
pub(crate) struct Checked {
    pub seats: TVec<TVec<TValue>>,
    pub shared: TVec<TValue>,
}

fn batch_symbol(fact: &TypedFact) -> Option<Symbol> {
    match fact.shape.dims().first() {
        Some(TDim::Sym(s)) => Some(s.clone()),
        _ => None,
    }
}

fn shape_text(fact: &TypedFact) -> String {
    let dims: Vec<String> = fact.shape.dims().iter().map(|d| d.to_string()).collect();
    format!("{:?} [{}]", fact.datum_type, dims.join(", "))
}

fn tensor_text(t: &Tensor) -> String {
    let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    format!("{:?} [{}]", t.datum_type(), dims.join(", "))
}

impl Interface {
    pub fn of(inner: &dyn Runnable) -> Result<Interface, NewRunnerError> {
        let model = inner.typed_model();
        let name_of = |ix: usize, input: bool| -> String {
            model
                .and_then(|m| {
                    let outlet = if input { m.inputs.get(ix) } else { m.outputs.get(ix) }?;
                    Some(m.node(outlet.node).name.clone())
                })
                .unwrap_or_else(|| format!("{} {ix}", if input { "input" } else { "output" }))
        };
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
        for ix in 0..inner.input_count() {
            let fact = inner
                .input_fact(ix)
                .map_err(|e| NewRunnerError::Model(format!("{e:#}")))?
                .clone();
            let name = name_of(ix, true);
            note(format!("input {ix} ({name:?})"), &fact, &mut symbols);
            inputs.push(Port {
                name,
                batched: false,
                fact,
            });
        }
        let mut out_facts = vec![];
        for ix in 0..inner.output_count() {
            let fact = inner
                .output_fact(ix)
                .map_err(|e| NewRunnerError::Model(format!("{e:#}")))?
                .clone();
            note(format!("output {ix} ({:?})", name_of(ix, false)), &fact, &mut symbols);
            out_facts.push(fact);
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
            port.batched = batch_symbol(&port.fact).as_ref() == Some(&batch);
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
        let batched_inputs = (0..inputs.len()).filter(|ix| inputs[*ix].batched).collect();
        let shared_inputs = (0..inputs.len()).filter(|ix| !inputs[*ix].batched).collect();
        let pulse = PulseInfo::of(inner, &inputs);
        Ok(Interface {
            batch,
            inputs,
            batch_out,
            batched_inputs,
            shared_inputs,
            pulse,
        })
    }

    /// One row of zeros for every input: a pulse of silence.
    pub fn silence(&self) -> Result<TVec<TValue>, String> {
        self.inputs
            .iter()
            .map(|port| {
                let shape = port
                    .fact
                    .shape
                    .dims()
                    .iter()
                    .enumerate()
                    .map(|(axis, d)| {
                        if axis == 0 && port.batched {
                            Ok(1)
                        } else {
                            d.to_usize().map_err(|_| ())
                        }
                    })
                    .collect::<Result<TVec<usize>, ()>>()
                    .map_err(|_| format!("input {:?} has a symbolic dim, so silence has no shape", port.name))?;
                Tensor::zero_dt(port.fact.datum_type, &shape)
                    .map(|t| t.into_tvalue())
                    .map_err(|e| format!("{e:#}"))
            })
            .collect()
    }

    /// Check a call's inputs against the facts (count, datum type, rank,
    /// every concrete dim but the batch axis) and split it into seats. Any
    /// failure hands the inputs back inside the error.
    pub fn check(&self, inputs: TVec<TValue>) -> Result<Checked, RunError> {
        if inputs.len() != self.inputs.len() {
            let kind = RunErrorKind::InputCount {
                got: inputs.len(),
                wanted: self.inputs.len(),
            };
            return Err(RunError::with_inputs(kind, inputs));
        }
        let mut rows: Option<(usize, usize)> = None;
        for (index, (input, port)) in inputs.iter().zip(&self.inputs).enumerate() {
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
                        match want.to_usize() {
                            Ok(want) => want != *got,
                            Err(_) => false,
                        }
                    });
            if mismatch {
                let kind = RunErrorKind::Input {
                    index,
                    name: port.name.clone(),
                    got: tensor_text(input),
                    wanted: shape_text(fact),
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
        Ok(Checked { seats, shared })
    }
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
}

impl PartialEq for Group {
    fn eq(&self, other: &Group) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || (a.resolved == b.resolved && a.shared == b.shared),
            _ => false,
        }
    }
}

impl Group {
    pub fn new(shared: TVec<TValue>, resolved: Vec<(Symbol, i64)>) -> Group {
        if shared.is_empty() && resolved.is_empty() {
            Group(None)
        } else {
            Group(Some(Arc::new(GroupKey { shared, resolved })))
        }
    }

    pub fn shared(&self) -> &[TValue] {
        self.0.as_ref().map(|k| &*k.shared).unwrap_or(&[])
    }

    pub fn resolved(&self) -> &[(Symbol, i64)] {
        self.0.as_ref().map(|k| &*k.resolved).unwrap_or(&[])
    }
}
