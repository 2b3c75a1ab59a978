//! The byte interface: what one stream feeds and gets back once a runner
//! has taken a [`Loaded`] model ([`Interface`], its [`Port`]s), and the
//! codecs between a client's little-endian bytes and the call's tensors,
//! with the names the wire and the spec give element types.

use serde::{Deserialize, Serialize};
use tract_core::internal::*;

use super::{symbol_on_axis_0, AudioFraming, LoadError, Loaded};

/// The element type a spec names (`f32`, `i64`, ...), or why it is none.
pub(super) fn dtype_of(text: &str) -> Result<DatumType, String> {
    Ok(match text {
        "f32" => f32::datum_type(),
        "f64" => f64::datum_type(),
        "f16" => f16::datum_type(),
        "i64" => i64::datum_type(),
        "i32" => i32::datum_type(),
        "i16" => i16::datum_type(),
        "i8" => i8::datum_type(),
        "u8" => u8::datum_type(),
        "bool" => bool::datum_type(),
        other => {
            return Err(format!(
                "dtype {other:?} is not one of f32, f64, f16, i64, i32, i16, i8, u8, bool"
            ))
        }
    })
}

/// A datum type as the wire and the spec name it.
pub fn dtype_name(dt: DatumType) -> String {
    format!("{dt:?}").to_lowercase()
}

/// One port as a stream sees it: a fed input or an output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    /// The model's index of the input or output.
    pub index: usize,
    /// Its name in the model.
    pub name: String,
    /// Its element type (`f32`, `i64`, ...).
    pub dtype: String,
    /// One stream's shape: 1 on the batch axis, every other dim a number.
    pub shape: Vec<usize>,
}

impl Port {
    /// Elements in one stream's pulse of it.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether one stream's pulse of it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How one input of a call is made.
#[derive(Debug, Clone)]
enum Source {
    /// The `k`-th fed input, from the client's bytes.
    Fed(usize),
    /// A shared input's value, the same for every call.
    Filled(TValue),
}

/// What one stream feeds and gets back, once the runner has taken the
/// model: the inputs a client sends (every input but the explicit state
/// and the filled ones), in the model's order, and the outputs it gets
/// (every output but the explicit state).
#[derive(Debug, Clone)]
pub struct Interface {
    /// The inputs a stream feeds, in order.
    pub inputs: Vec<Port>,
    /// The outputs a stream gets, in order.
    pub outputs: Vec<Port>,
    /// How audio is cut into its pulses, where the model says (checked
    /// against its one fed input).
    pub audio: Option<AudioFraming>,
    dtypes_in: Vec<DatumType>,
    dtypes_out: Vec<DatumType>,
    call: Vec<Source>,
}

/// The bytes of one element of `dt` on the wire, or why it has none.
fn width(dt: DatumType) -> Option<usize> {
    (dt.is_number() || dt == bool::datum_type()).then(|| dt.size_of())
}

/// `fact`'s shape for one stream: 1 on `batch_axis`, every other dim a
/// number; `Err` with the axis and the dim that is not.
pub fn one_stream_shape(fact: &TypedFact, batch_axis: Option<usize>) -> Result<Vec<usize>, (usize, TDim)> {
    fact.shape
        .dims()
        .iter()
        .enumerate()
        .map(|(axis, d)| match d.to_usize() {
            _ if Some(axis) == batch_axis => Ok(1),
            Ok(n) => Ok(n),
            Err(_) => Err((axis, d.clone())),
        })
        .collect()
}

/// [`one_stream_shape`], or an error naming the port and its free dim.
fn one_stream(what: &str, fact: &TypedFact, batch_axis: Option<usize>) -> Result<Vec<usize>, LoadError> {
    one_stream_shape(fact, batch_axis).map_err(|(axis, d)| {
        LoadError(format!(
            "{what} {:?} has the free dim {d} on axis {axis}: a stream's pulse needs every dim but the batch a number (pulse = N in [model], or the input's fact with numbers)",
            fact.shape
        ))
    })
}

impl Interface {
    /// The interface of `loaded` served with the explicit state `state`
    /// (the runner's (input, output) pairs, `LanedRunner::explicit_state`).
    pub fn of(loaded: &Loaded, state: &[(usize, usize)]) -> Result<Interface, LoadError> {
        let plan = &loaded.plan;
        let batch = loaded.batch.as_ref();
        let name_of = |what: &str, ix: usize| -> String {
            match &loaded.model {
                Some(m) => {
                    let outlet = if what == "input" { m.inputs[ix] } else { m.outputs[ix] };
                    m.node(outlet.node).name.clone()
                }
                None => format!("{what}_{ix}"),
            }
        };
        let (mut inputs, mut dtypes_in, mut call) = (vec![], vec![], vec![]);
        for ix in 0..plan.input_count() {
            if state.iter().any(|(i, _)| *i == ix) {
                continue;
            }
            let fact = plan.input_fact(ix)?;
            let name = name_of("input", ix);
            let what = format!("input {ix} {name:?}");
            let batched = batch.is_some() && symbol_on_axis_0(fact).as_ref() == batch;
            let shape = one_stream(&what, fact, batched.then_some(0))?;
            if let Some((_, value)) = loaded.fills.iter().find(|(i, _)| *i == ix) {
                if batched {
                    return Err(LoadError(format!(
                        "{what} is batched (a row per stream): a fill is for an input shared by a turn's streams"
                    )));
                }
                let len = shape.iter().product();
                let t = Tensor::from_shape(&shape, &vec![*value; len])?
                    .cast_to_dt(fact.datum_type)?
                    .into_owned();
                call.push(Source::Filled(t.into_tvalue()));
                continue;
            }
            if !batched {
                return Err(LoadError(format!(
                    "{what} {:?} is shared by a turn's streams (no batch on axis 0): give it a value, [[model.fills]] index = {ix}",
                    fact.shape
                )));
            }
            if width(fact.datum_type).is_none() {
                return Err(LoadError(format!(
                    "{what} is {:?}: only numbers and booleans go on the wire",
                    fact.datum_type
                )));
            }
            call.push(Source::Fed(inputs.len()));
            dtypes_in.push(fact.datum_type);
            inputs.push(Port {
                index: ix,
                name,
                dtype: dtype_name(fact.datum_type),
                shape,
            });
        }
        let (mut outputs, mut dtypes_out) = (vec![], vec![]);
        for ix in 0..plan.output_count() {
            if state.iter().any(|(_, o)| *o == ix) {
                continue;
            }
            let fact = plan.output_fact(ix)?;
            let name = name_of("output", ix);
            let what = format!("output {ix} {name:?}");
            let shape = one_stream(&what, fact, Some(0))?;
            if width(fact.datum_type).is_none() {
                return Err(LoadError(format!(
                    "{what} is {:?}: only numbers and booleans go on the wire",
                    fact.datum_type
                )));
            }
            dtypes_out.push(fact.datum_type);
            outputs.push(Port {
                index: ix,
                name,
                dtype: dtype_name(fact.datum_type),
                shape,
            });
        }
        if inputs.is_empty() {
            return Err(LoadError(
                "the model leaves a stream nothing to feed: every input is state or filled".into(),
            ));
        }
        if let Some(audio) = &loaded.audio {
            let fits = matches!(&inputs[..], [one] if one.dtype == "f32" && one.len() == audio.pulse_len());
            if !fits || audio.hop == 0 || audio.sample_rate == 0 {
                let fed: Vec<String> = inputs
                    .iter()
                    .map(|p| format!("{} {} {:?}", p.name, p.dtype, p.shape))
                    .collect();
                return Err(LoadError(format!(
                    "[model.audio] cuts pulses of {} f32 samples ({} of context, a hop of {}, at {} Hz): the model feeds {}",
                    audio.pulse_len(),
                    audio.context,
                    audio.hop,
                    audio.sample_rate,
                    fed.join(", ")
                )));
            }
        }
        Ok(Interface {
            inputs,
            outputs,
            audio: loaded.audio,
            dtypes_in,
            dtypes_out,
            call,
        })
    }

    /// Bytes of one stream's pulse: every fed input, in order.
    pub fn pulse_bytes(&self) -> usize {
        self.inputs
            .iter()
            .zip(&self.dtypes_in)
            .map(|(p, dt)| p.len() * dt.size_of())
            .sum()
    }

    /// Bytes of one answer: every output, in order.
    pub fn answer_len(&self) -> usize {
        self.outputs
            .iter()
            .zip(&self.dtypes_out)
            .map(|(p, dt)| p.len() * dt.size_of())
            .sum()
    }

    /// A call's inputs from one pulse's bytes (each fed input
    /// little-endian at its per-stream shape, in order), the fills in their
    /// places. Refused, naming both lengths, when `bytes` is not one pulse.
    pub fn call_inputs(&self, bytes: &[u8]) -> Result<TVec<TValue>, String> {
        if bytes.len() != self.pulse_bytes() {
            return Err(format!(
                "a pulse is {} bytes ({}), got {}",
                self.pulse_bytes(),
                self.inputs
                    .iter()
                    .map(|p| format!("{} {} {:?}", p.name, p.dtype, p.shape))
                    .collect::<Vec<_>>()
                    .join(", "),
                bytes.len()
            ));
        }
        let mut fed = Vec::with_capacity(self.inputs.len());
        let mut at = 0;
        for (port, dt) in self.inputs.iter().zip(&self.dtypes_in) {
            let n = port.len() * dt.size_of();
            fed.push(from_le(*dt, &port.shape, &bytes[at..at + n]).map_err(|e| format!("{}: {e:#}", port.name))?);
            at += n;
        }
        Ok(self
            .call
            .iter()
            .map(|s| match s {
                Source::Fed(k) => fed[*k].clone(),
                Source::Filled(v) => v.clone(),
            })
            .collect())
    }

    /// One answer's bytes: every output little-endian, in order. Refused
    /// when the runner's answer is not one stream's (never, for a runner
    /// serving this interface).
    pub fn answer_bytes(&self, outputs: &[TValue]) -> Result<Vec<u8>, String> {
        if outputs.len() != self.outputs.len() {
            return Err(format!("{} outputs, wanted {}", outputs.len(), self.outputs.len()));
        }
        let mut out = Vec::with_capacity(self.answer_len());
        for ((port, dt), t) in self.outputs.iter().zip(&self.dtypes_out).zip(outputs) {
            if t.datum_type() != *dt || t.len() != port.len() {
                return Err(format!(
                    "output {} is {:?} {:?}, wanted {:?} {:?}",
                    port.name,
                    t.datum_type(),
                    t.shape(),
                    dt,
                    port.shape
                ));
            }
            to_le(t, &mut out);
        }
        Ok(out)
    }

    /// One answer as JSON numbers: an array per output, flattened.
    pub fn answer_json(&self, outputs: &[TValue]) -> Result<Vec<Vec<f64>>, String> {
        outputs
            .iter()
            .map(|t| {
                let t = t.cast_to::<f64>().map_err(|e| format!("{e:#}"))?;
                Ok(t.to_plain_array_view::<f64>()
                    .map_err(|e| format!("{e:#}"))?
                    .iter()
                    .copied()
                    .collect())
            })
            .collect()
    }
}

/// A tensor of `dt` and `shape` from little-endian bytes (`bytes` holds
/// exactly its elements; booleans are any byte, nonzero true).
fn from_le(dt: DatumType, shape: &[usize], bytes: &[u8]) -> TractResult<TValue> {
    let mut t = Tensor::zero_dt(dt, shape)?;
    let raw = t.as_bytes_mut();
    ensure!(
        raw.len() == bytes.len(),
        "{} bytes for {dt:?} {shape:?}, wanted {}",
        bytes.len(),
        raw.len()
    );
    if dt == bool::datum_type() {
        for (to, from) in raw.iter_mut().zip(bytes) {
            *to = (*from != 0) as u8;
        }
    } else {
        raw.copy_from_slice(bytes);
        if cfg!(target_endian = "big") {
            for el in raw.chunks_mut(dt.size_of()) {
                el.reverse();
            }
        }
    }
    Ok(t.into_tvalue())
}

/// `t`'s elements little-endian onto `out`.
fn to_le(t: &Tensor, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(t.as_bytes());
    if cfg!(target_endian = "big") {
        for el in out[at..].chunks_mut(t.datum_type().size_of()) {
            el.reverse();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes in and out: a pulse's bytes become the call's tensors, the
    /// fills in their places, and a wrong length names both.
    #[test]
    fn little_endian_round_trip() {
        let t = from_le(f32::datum_type(), &[1, 2], &[0, 0, 128, 63, 0, 0, 0, 64]).unwrap();
        assert_eq!(
            t.to_plain_array_view::<f32>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            vec![1.0, 2.0]
        );
        let mut out = vec![];
        to_le(&t, &mut out);
        assert_eq!(out, vec![0, 0, 128, 63, 0, 0, 0, 64]);
        let i = from_le(i64::datum_type(), &[1], &7i64.to_le_bytes()).unwrap();
        assert_eq!(
            i.to_plain_array_view::<i64>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            vec![7]
        );
    }
}
