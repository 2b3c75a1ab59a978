//! A stream's explicit state as it travels between runners or processes
//! (a replica draining hands its streams to another), and the one owner of
//! it: the format (the tensors, the identity of the model they belong to,
//! the format's version: plain serde data, for JSON, TOML, bincode,
//! whatever the transport carries), the model's identity kept once the
//! runner is built ([`Wire`], beside the runner's other shared facts), the
//! export (a stream's tensors to a [`StreamState`]) and the checked import
//! (a [`StreamState`] back to tensors, refused, naming both, for another
//! version, another model or a tensor its state input does not take).
//!
//! How the identity is computed (the digests of the weights and the graph)
//! is the `identity` module's job, called once from here; every other
//! module reaches a stream's travelling state through this one.
//!
//! ```
//! # use laned_runner::{StreamState, STREAM_STATE_VERSION};
//! let json = r#"{"version":3,"model":"rnn|state F32 1,B,6|weights 6c62272e07bb0142|graph 0d6a3f0c2e5b1a97","pulses":12,"tensors":[]}"#;
//! let state: StreamState = serde_json::from_str(json).unwrap();
//! assert_eq!(state.version, STREAM_STATE_VERSION);
//! ```

use serde::{Deserialize, Serialize};
use tract_core::internal::*;

use crate::err::{RunError, RunErrorKind};
use crate::iface::{one_stream_shape, shape_text, Interface};

/// The version [`StreamState`]s are written in, and the only one read.
///
/// Version 3: the tensors hold every piece of a stream's state, its ops'
/// implicit state (`implicit`) after the model's own explicit pairs: first
/// what is lifted into pairs (a Scan's, a GruSeq's), then what the
/// runner's own ops keep in place (a Delay's frames, a PulsePad's
/// position), each in the model's node order; and the pulses the stream
/// fed ([`StreamState::pulses`]), without which a state is refused at
/// import. A version-2 state, which held only the explicit pairs, is
/// refused by its version, naming both. (Version 2: the model's identity
/// covers its graph, not only its weights.)
pub const STREAM_STATE_VERSION: u32 = 3;

/// One stream's explicit state, from
/// [`LanedStateHandle::export_state`](crate::LanedStateHandle::export_state),
/// for [`LanedStateHandle::import_state`](crate::LanedStateHandle::import_state).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StreamState {
    /// [`STREAM_STATE_VERSION`] when written.
    pub version: u32,
    /// The model the state belongs to: its name, its state inputs' facts,
    /// a digest of its weights and one of its graph (its ops and their
    /// parameters). A runner refuses another model's state, naming both.
    pub model: String,
    /// The pulses the stream fed before this state (every clone's calls):
    /// the stream's length so far, for its end and for the positions its
    /// state keeps. Every export writes it; a state without it (written
    /// before it travelled) is refused at import, since the stream would
    /// end at the wrong length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulses: Option<u64>,
    /// One tensor per state pair, in the model's order, batch extent 1.
    pub tensors: Vec<StateTensor>,
}

/// One state tensor: its datum type, its shape and its bytes (little-endian).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StateTensor {
    /// tract's name of the datum type (`F32`, `F16`, `I64`...).
    pub datum_type: String,
    /// The shape, the batch axis of extent 1 included.
    pub shape: Vec<usize>,
    /// The elements, little-endian, in row-major order.
    pub data: Vec<u8>,
}

/// The datum types a state tensor may carry on the wire.
const TYPES: [DatumType; 9] = [
    DatumType::F16,
    DatumType::F32,
    DatumType::F64,
    DatumType::I8,
    DatumType::I16,
    DatumType::I32,
    DatumType::I64,
    DatumType::U8,
    DatumType::U16,
];

impl StateTensor {
    /// `t` for the wire, if its datum type can travel.
    pub(crate) fn of(t: &Tensor) -> Result<StateTensor, String> {
        let dt = t.datum_type();
        if !TYPES.contains(&dt) {
            return Err(format!(
                "a state tensor of {dt:?} cannot travel (only plain numbers do)"
            ));
        }
        let bytes = t.as_bytes();
        let size = dt.size_of();
        let mut data = bytes.to_vec();
        if cfg!(target_endian = "big") {
            data.chunks_mut(size).for_each(|c| c.reverse());
        }
        Ok(StateTensor {
            datum_type: format!("{dt:?}"),
            shape: t.shape().to_vec(),
            data,
        })
    }

    /// The tensor, checked first against `dt` and `shape`, what one stream's
    /// state takes at `place` (`state input 3`; tensor `index` of the
    /// state): a shape from outside reaches tract only if it is the model's
    /// (a zero-element shape whose dims overflow passes the byte count,
    /// then overflows tract's strides).
    pub(crate) fn to_tensor_as(
        &self,
        index: usize,
        place: &str,
        dt: DatumType,
        shape: &[usize],
    ) -> Result<Tensor, String> {
        if self.datum_type != format!("{dt:?}") || self.shape[..] != shape[..] {
            return Err(format!(
                "state tensor {index} is {:?} {:?}, {place} takes {dt:?} {shape:?} per stream",
                self.datum_type, self.shape
            ));
        }
        self.to_tensor()
    }

    /// The tensor its datum type, shape and bytes say, the byte count
    /// checked.
    fn to_tensor(&self) -> Result<Tensor, String> {
        let dt = TYPES
            .iter()
            .copied()
            .find(|dt| format!("{dt:?}") == self.datum_type)
            .ok_or_else(|| {
                format!(
                    "a state tensor of {:?}: not a datum type the wire carries",
                    self.datum_type
                )
            })?;
        // Checked: the shape comes from outside, and a product that wraps
        // could match a short buffer.
        let bytes = self
            .shape
            .iter()
            .try_fold(dt.size_of(), |n, &d| n.checked_mul(d))
            .ok_or_else(|| {
                format!(
                    "a state tensor of {:?} {:?}: more bytes than this machine can address",
                    self.datum_type, self.shape
                )
            })?;
        if self.data.len() != bytes {
            return Err(format!(
                "a state tensor of {:?} {:?} holds {} bytes, {bytes} expected",
                self.datum_type,
                self.shape,
                self.data.len(),
            ));
        }
        let mut data = self.data.clone();
        if cfg!(target_endian = "big") {
            data.chunks_mut(dt.size_of()).for_each(|c| c.reverse());
        }
        // SAFETY: `dt` is one of `TYPES`, plain numbers for which every bit
        // pattern is a value, and `data` holds exactly the bytes `shape`
        // takes of it (counted above; tract counts again).
        unsafe { Tensor::from_raw_dt(dt, &self.shape, &data) }.map_err(|e| format!("{e:#}"))
    }
}

/// What this runner's streams' states are written with and checked
/// against: the model's identity, computed once when the runner is built,
/// and each state pair's facts for one stream. Shared read-only by every
/// handle (in the runner's `Common`).
#[derive(Debug)]
pub(crate) struct Wire {
    /// The identity states carry ([`StreamState::model`]).
    identity: String,
    /// Per state pair, in the model's order.
    pairs: Vec<Pair>,
    /// Every op keeping state across turns, and how it is laned.
    implicit: Vec<crate::implicit::ImplicitState>,
}

/// What one state tensor must be to be imported.
#[derive(Debug)]
struct Pair {
    /// Where the state goes, for errors: `state input 3` (the model input
    /// it feeds), or the op keeping it in place.
    place: String,
    datum_type: DatumType,
    /// One stream's shape (1 on the batch axis), or why there is none (a
    /// symbolic dim besides the batch).
    shape: Result<TVec<usize>, String>,
    /// For a stream position: how far it moves a pulse (it must then be
    /// the stream's pulses times this).
    step: Option<i64>,
}

impl Wire {
    /// The identity of `model`, whose interface is `iface` (the `identity`
    /// module's computation), and its state pairs' per-stream facts.
    pub(crate) fn of(
        model: Option<&TypedModel>,
        iface: &Interface,
        implicit: Vec<crate::implicit::ImplicitState>,
    ) -> Wire {
        let pairs = iface
            .state
            .iter()
            .map(|io| Pair {
                place: format!("state input {}", io.input),
                step: None,
                datum_type: io.fact.datum_type,
                shape: one_stream_shape(&io.fact, Some(io.axis)).ok_or_else(|| {
                    format!(
                        "state input {} has a symbolic dim besides the batch: {}",
                        io.input,
                        shape_text(&io.fact)
                    )
                }),
            })
            .chain(iface.kept.iter().map(|k| Pair {
                place: format!("the state {:?} keeps", k.kept.node),
                datum_type: k.kept.datum_type,
                shape: Ok(k.kept.lane_shape.clone()),
                step: k.kept.step,
            }))
            .collect();
        Wire {
            identity: crate::identity::state_identity(model, &iface.inputs, &iface.state),
            pairs,
            implicit,
        }
    }

    /// Every op of the model keeping state across turns, and how it is
    /// laned.
    pub(crate) fn implicit(&self) -> &[crate::implicit::ImplicitState] {
        &self.implicit
    }

    /// Why a stream's state cannot travel: the ops keeping state that no
    /// export reads, named; `None` when all of it travels.
    pub(crate) fn stays(&self) -> Option<String> {
        let stays: Vec<String> = self
            .implicit
            .iter()
            .filter(|s| !s.travels())
            .map(|s| format!("{:?} ({})", s.node, s.op))
            .collect();
        (!stays.is_empty()).then(|| {
            format!(
                "the model keeps state in {} that cannot travel: {}",
                if stays.len() == 1 { "an op" } else { "ops" },
                stays.join(", ")
            )
        })
    }

    /// The identity this runner's states carry.
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    /// A stream's state tensors (one per pair, batch extent 1) as they
    /// travel, with the model's identity and the pulses it fed.
    pub(crate) fn export(&self, tensors: &[Tensor], pulses: u64) -> Result<StreamState, RunError> {
        if let Some(why) = self.stays() {
            return Err(RunError::new(RunErrorKind::State(why)));
        }
        let tensors = tensors
            .iter()
            .map(StateTensor::of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| RunError::new(RunErrorKind::State(why)))?;
        Ok(StreamState {
            version: STREAM_STATE_VERSION,
            model: self.identity.clone(),
            pulses: Some(pulses),
            tensors,
        })
    }

    /// The tensors of `state`, once it is known to be of this runner's
    /// version and model and each tensor fits its state input's fact for
    /// one stream (datum type and shape): what an import checks before
    /// anything of tract's sees the state.
    /// With the tensors, the pulses the stream fed.
    pub(crate) fn import(&self, state: &StreamState) -> Result<(TVec<Tensor>, u64), RunError> {
        self.checked(state)
            .map_err(|why| RunError::new(RunErrorKind::State(why)))
    }

    /// [`Wire::import`]'s checks, in order: version, model, tensor count,
    /// the pulse count, then each tensor (a position against the count).
    fn checked(&self, state: &StreamState) -> Result<(TVec<Tensor>, u64), String> {
        if let Some(why) = self.stays() {
            return Err(why);
        }
        if state.version != STREAM_STATE_VERSION {
            return Err(format!(
                "the stream state is of version {}, this runner reads version {STREAM_STATE_VERSION}",
                state.version
            ));
        }
        let ours = &self.identity;
        if state.model != *ours {
            return Err(format!(
                "the stream state is of model {:?}, this runner serves {ours:?}",
                state.model
            ));
        }
        if state.tensors.len() != self.pairs.len() {
            return Err(format!(
                "the model carries {} state tensors, {} were given",
                self.pairs.len(),
                state.tensors.len()
            ));
        }
        let Some(pulses) = state.pulses else {
            return Err(
                "the stream state carries no pulse count (it was written before the count travelled): the stream would end at the wrong length".into(),
            );
        };
        let tensors = self
            .pairs
            .iter()
            .zip(&state.tensors)
            .enumerate()
            .map(|(index, (pair, t))| {
                let shape = pair.shape.as_ref().map_err(Clone::clone)?;
                let tensor = t.to_tensor_as(index, &pair.place, pair.datum_type, shape)?;
                if let Some(step) = pair.step {
                    reachable(&tensor, step, pulses, index, &pair.place)?;
                }
                Ok(tensor)
            })
            .collect::<Result<_, String>>()?;
        Ok((tensors, pulses))
    }
}

/// Whether `position` (one `I64`) is where a stream stands after `pulses`
/// pulses of `step` frames: the only value a runner could have exported.
fn reachable(position: &Tensor, step: i64, pulses: u64, index: usize, place: &str) -> Result<(), String> {
    let value = position
        .try_as_plain_ram()
        .and_then(|t| t.as_slice::<i64>().map(|s| s.to_vec()))
        .map_err(|e| format!("{e:#}"))?;
    let expected = i64::try_from(pulses).ok().and_then(|p| p.checked_mul(step));
    if value.len() != 1 || Some(value[0]) != expected {
        return Err(format!(
            "state tensor {index} is the stream position {value:?} of {place}; a stream that fed {pulses} pulses stands at {}",
            expected.map_or_else(|| "no position this runner can hold".into(), |e| e.to_string())
        ));
    }
    Ok(())
}
