//! A stream's explicit state as it travels between runners or processes
//! (a replica draining hands its streams to another): the tensors, the
//! identity of the model they belong to, and the format's version. Plain
//! serde data: JSON, TOML, bincode, whatever the transport carries.
//!
//! ```
//! # use laned_runner::{StreamState, STREAM_STATE_VERSION};
//! let json = r#"{"version":2,"model":"rnn|state F32 1,B,6|weights 6c62272e07bb0142|graph 0d6a3f0c2e5b1a97","tensors":[]}"#;
//! let state: StreamState = serde_json::from_str(json).unwrap();
//! assert_eq!(state.version, STREAM_STATE_VERSION);
//! ```

use serde::{Deserialize, Serialize};
use tract_core::internal::*;

/// The version [`StreamState`]s are written in, and the only one read.
///
/// Version 2: the model's identity covers its graph, not only its weights
/// (see the runner's `identity` module); a version-1 state is refused by
/// its version, naming both.
pub const STREAM_STATE_VERSION: u32 = 2;

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
    /// state takes at model input `input` (tensor `index` of the state): a
    /// shape from outside reaches tract only if it is the model's (a
    /// zero-element shape whose dims overflow passes the byte count, then
    /// overflows tract's strides).
    pub(crate) fn to_tensor_as(
        &self,
        index: usize,
        input: usize,
        dt: DatumType,
        shape: &[usize],
    ) -> Result<Tensor, String> {
        if self.datum_type != format!("{dt:?}") || self.shape[..] != shape[..] {
            return Err(format!(
                "state tensor {index} is {:?} {:?}, state input {input} takes {dt:?} {shape:?} per stream",
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
        unsafe { Tensor::from_raw_dt(dt, &self.shape, &data) }.map_err(|e| format!("{e:#}"))
    }
}
