//! What `laned check` probes and `laned bench` runs a model with: inputs
//! made from its facts. A batched input gets a row per stream, each
//! stream's row drawn from its own seed (so a stream's row is the same
//! alone or stacked beside others); a shared input gets one value; an
//! explicit state starts from zeros with a row per stream on its batch
//! axis. Floats are noise in [-1, 1) (a model's cost rarely depends on the
//! values); other types zeros, or what `--fill IX=VALUE` says.

use laned_models::spec::one_stream_shape;
use laned_runner::PortRef;
use tract_core::internal::*;

use crate::model::Candidate;

/// How one model input is fed.
#[derive(Debug, Clone)]
enum Kind {
    /// A row per stream on axis 0.
    Batched,
    /// One value for every stream of a call.
    Shared,
    /// Explicit state, a row per stream on `axis`, answered by `output`.
    State { axis: usize, output: usize },
}

#[derive(Debug, Clone)]
struct Port {
    datum_type: DatumType,
    /// One stream's shape (1 on the batch axis).
    shape: TVec<usize>,
    kind: Kind,
    fill: Option<f64>,
    /// One stream's initial value of an explicit state, where its pair
    /// gives one (zeros otherwise).
    initial: Option<Tensor>,
}

/// Every model input's feeding.
#[derive(Debug, Clone)]
pub struct Feed {
    ports: Vec<Port>,
}

/// `IX=VALUE`: a model input's value for every call.
pub fn fill(text: &str) -> TractResult<(usize, f64)> {
    let (ix, value) = text
        .split_once('=')
        .with_context(|| format!("--fill: got {text:?}, wanted IX=VALUE (1=16000)"))?;
    let ix = ix
        .trim()
        .parse()
        .with_context(|| format!("--fill: got {ix:?} for the input's index, wanted a number"))?;
    let value = value
        .trim()
        .parse()
        .with_context(|| format!("--fill: got {value:?} for the value, wanted a number"))?;
    Ok((ix, value))
}

impl Feed {
    /// The feeding of `loaded`'s inputs, its explicit state `state` (model
    /// (input, output) index pairs), inputs `fills` set to a value. Every
    /// dim but the batch must be a number: a bench runs concrete shapes.
    pub fn of(loaded: &Candidate, state: &[(usize, usize)], fills: &[(usize, f64)]) -> TractResult<Feed> {
        let model = &loaded.model;
        for (ix, _) in fills {
            ensure!(
                *ix < model.inputs.len(),
                "--fill {ix}: the model has {} inputs",
                model.inputs.len()
            );
        }
        let ports = (0..model.inputs.len())
            .map(|ix| {
                let fact = model.input_fact(ix)?;
                let name = &model.node(model.inputs[ix].node).name;
                let pair = state.iter().find(|(i, _)| *i == ix);
                let kind = match pair {
                    Some((_, output)) => {
                        let axis = loaded
                            .batch
                            .as_ref()
                            .and_then(|b| {
                                fact.shape
                                    .dims()
                                    .iter()
                                    .position(|d| matches!(d, TDim::Sym(s) if s == b))
                            })
                            .with_context(|| {
                                format!("state input {ix} {name:?} has no batch axis: {:?}", fact.shape)
                            })?;
                        Kind::State { axis, output: *output }
                    }
                    None if loaded.batched(fact) => Kind::Batched,
                    None => Kind::Shared,
                };
                let batch_axis = match kind {
                    Kind::Batched => Some(0),
                    Kind::State { axis, .. } => Some(axis),
                    Kind::Shared => None,
                };
                let shape: TVec<usize> = one_stream_shape(fact, batch_axis)
                    .map_err(|(axis, d)| {
                        format_err!(
                            "input {ix} {name:?} {:?} has the free dim {d} on axis {axis}: running it needs every dim but the batch a number (--pulse P, or --input {ix}=DIMS with numbers)",
                            fact.shape
                        )
                    })?
                    .into();
                let initial = match kind {
                    Kind::State { .. } => loaded
                        .pairs
                        .iter()
                        .find(|p| match &p.input {
                            PortRef::Index(i) => *i == ix,
                            PortRef::Name(n) => n == name,
                        })
                        .and_then(|p| p.initial.as_ref())
                        .map(|init| -> TractResult<Tensor> {
                            let values: Vec<f64> = init.values.clone();
                            Ok(Tensor::from_shape(&init.shape, &values)?
                                .cast_to_dt(fact.datum_type)?
                                .into_owned())
                        })
                        .transpose()?,
                    _ => None,
                };
                Ok(Port {
                    datum_type: fact.datum_type,
                    shape,
                    kind,
                    fill: fills.iter().find(|(i, _)| *i == ix).map(|(_, v)| *v),
                    initial,
                })
            })
            .collect::<TractResult<Vec<_>>>()?;
        Ok(Feed { ports })
    }

    /// The explicit state as `(input, output, rows streams' initial
    /// values)`: each pair's initial value, else zeros.
    pub fn state(&self, rows: usize) -> TractResult<Vec<(usize, usize, Tensor)>> {
        self.ports
            .iter()
            .enumerate()
            .filter_map(|(ix, port)| match port.kind {
                Kind::State { axis, output } => Some(match &port.initial {
                    Some(one) => rows_of(one, axis, rows).map(|t| (ix, output, t)),
                    None => {
                        let mut shape = port.shape.clone();
                        shape[axis] = rows;
                        Tensor::zero_dt(port.datum_type, &shape).map(|t| (ix, output, t))
                    }
                }),
                _ => None,
            })
            .collect()
    }
}

/// `rows` copies of one stream's state `one`, side by side on `axis`.
pub fn rows_of(one: &Tensor, axis: usize, rows: usize) -> TractResult<Tensor> {
    Tensor::stack_tensors(axis, &vec![one.clone(); rows])
}

impl Feed {
    /// The caller's inputs (every input but the state) for `streams`, a
    /// row each in that order on the batched ones.
    pub fn inputs(&self, streams: &[u64]) -> TractResult<TVec<TValue>> {
        let gained: Vec<(u64, f32)> = streams.iter().map(|s| (*s, 1.0)).collect();
        self.inputs_gained(&gained)
    }

    /// As [`Feed::inputs`], each stream's noise (on float batched inputs)
    /// times its gain: `(seed, gain)` per stream.
    pub fn inputs_gained(&self, streams: &[(u64, f32)]) -> TractResult<TVec<TValue>> {
        self.ports
            .iter()
            .filter(|p| !matches!(p.kind, Kind::State { .. }))
            .map(|port| {
                let one = |seed: u64, gain: f32| -> TractResult<Tensor> {
                    let len = port.shape.iter().product();
                    let values = match port.fill {
                        // f64: an integer such as a sample rate exactly.
                        Some(v) => Tensor::from_shape(&port.shape, &vec![v; len])?,
                        None if port.datum_type.is_float() => {
                            let mut rng = fastrand::Rng::with_seed(seed);
                            let noise: Vec<f32> = (0..len).map(|_| gain * (rng.f32() * 2.0 - 1.0)).collect();
                            Tensor::from_shape(&port.shape, &noise)?
                        }
                        None => Tensor::zero_dt(port.datum_type, &port.shape)?,
                    };
                    Ok(values.cast_to_dt(port.datum_type)?.into_owned())
                };
                Ok(match port.kind {
                    Kind::Batched => {
                        let rows = streams
                            .iter()
                            .map(|(s, g)| one(*s, *g))
                            .collect::<TractResult<Vec<_>>>()?;
                        Tensor::stack_tensors(0, &rows)?.into_tvalue()
                    }
                    _ => one(u64::MAX, 1.0)?.into_tvalue(),
                })
            })
            .collect()
    }

    /// The model's inputs in its order: the caller's `inputs` with the
    /// `state` values (model input index, value) put in their places.
    pub fn with_state(inputs: &TVec<TValue>, state: &[(usize, TValue)]) -> TVec<TValue> {
        let mut all = inputs.clone();
        let mut state: Vec<&(usize, TValue)> = state.iter().collect();
        state.sort_by_key(|(ix, _)| *ix);
        for (ix, value) in state {
            all.insert((*ix).min(all.len()), value.clone());
        }
        all
    }
}

impl Feed {
    /// The model outputs that answer an explicit state.
    pub fn state_outputs(&self) -> Vec<usize> {
        self.ports
            .iter()
            .filter_map(|p| match p.kind {
                Kind::State { output, .. } => Some(output),
                _ => None,
            })
            .collect()
    }

    /// The batch axis of the state model output `output` answers, if it
    /// answers one.
    pub fn state_axis_of_output(&self, output: usize) -> Option<usize> {
        self.ports.iter().find_map(|p| match p.kind {
            Kind::State { axis, output: o } if o == output => Some(axis),
            _ => None,
        })
    }
}
