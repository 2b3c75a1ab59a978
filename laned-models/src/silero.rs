//! Silero VAD (MIT), the real explicit-state model: fetched from its PyPI
//! package with pip (no other download), pinned and checked
//! ([`crate::fetch`]), loaded with tract-onnx.
//!
//! The model takes `input [B, 64 + 512]` (a 32 ms chunk at 16 kHz after the
//! last 64 samples of the one before, which the caller keeps), `sr` (a
//! shared scalar, 16000) and `state [2, B, 128]`; it returns `output [B, 1]`
//! (the speech probability) and `stateN [2, B, 128]`.

use std::path::{Path, PathBuf};

use tract_core::internal::*;
use tract_onnx::prelude::{Framework, InferenceFact, InferenceModelExt};

use crate::fetch::{self, FetchError, Pin, Registry};

/// Where the model comes from: its PyPI package, pinned.
pub const REGISTRY: Registry = Registry::Pip {
    requirement: "silero-vad==6.2.3",
    wheel_glob: "silero_vad-*.whl",
};
/// The file used (the variant tract 0.23.9 loads) and its digest.
pub const PIN: Pin = Pin {
    in_package: "silero_vad/data/silero_vad_op18_ifless.onnx",
    sha256: "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
};
/// Samples per chunk at 16 kHz (32 ms).
pub const CHUNK: usize = 512;
/// Samples of the previous chunk fed before each chunk.
pub const CONTEXT: usize = 64;
/// The sample rate fed as `sr`.
pub const SAMPLE_RATE: i64 = 16_000;

/// How a stream's audio is cut into pulses: 64 samples of context, then a
/// 512-sample chunk, at 16 kHz (`[model.audio]` of the built-in).
pub const AUDIO: crate::spec::AudioFraming = crate::spec::AudioFraming {
    sample_rate: SAMPLE_RATE as u32,
    hop: CHUNK,
    context: CONTEXT,
};

/// The model file: `LANED_SILERO_ONNX` if set (the caller's file, read as
/// it is), else the checked copy in the cache ([`crate::fetch`]), fetched
/// there with `pip download` if missing. [`FetchError::is_unavailable`]
/// says whether it is simply not to be had here (no pip, no registry).
pub fn fetch() -> Result<PathBuf, FetchError> {
    if let Some(path) = std::env::var_os("LANED_SILERO_ONNX") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(FetchError::Setting {
                var: "LANED_SILERO_ONNX",
                path,
                why: "not a file".into(),
            })
        };
    }
    fetch_in(&fetch::cache_root()?)
}

/// The checked model file in the cache under `root`, fetched if missing.
pub fn fetch_in(root: &Path) -> Result<PathBuf, FetchError> {
    Ok(fetch::cached_in(root, REGISTRY, &[PIN])?.remove(0))
}

/// The model, typed with the batch symbol `batch` on axis 0 of `input` and
/// `output` and axis 1 of the state, decluttered (not optimised: the caller
/// prepares it).
pub fn load(path: &Path) -> TractResult<TypedModel> {
    let mut model = tract_onnx::onnx()
        .model_for_path(path)
        .with_context(|| format!("loading {} with tract-onnx", path.display()))?;
    // The branches of its `If` name the batch `batch`: the same symbol.
    let b = model.symbols.sym("batch");
    model.set_input_fact(0, f32::fact(dims!(b.clone(), CONTEXT + CHUNK)).into())?;
    model.set_input_fact(1, InferenceFact::from(i64::scalar_fact()))?;
    model.set_input_fact(2, f32::fact(dims!(2, b, 128)).into())?;
    model.into_typed()?.into_decluttered()
}

/// A stream's caller-side half: the last samples of its previous chunk.
#[derive(Debug, Clone)]
pub struct Context(Vec<f32>);

impl Default for Context {
    fn default() -> Context {
        Context(vec![0.0; CONTEXT])
    }
}

impl Context {
    /// The [`CONTEXT`] samples kept from the last chunk (zeros before the
    /// first): what the next chunk's inputs start with.
    pub fn samples(&self) -> &[f32] {
        &self.0
    }

    /// A context holding `samples` (as [`Context::samples`] gave them), to
    /// continue a stream elsewhere; `None` unless they are [`CONTEXT`].
    pub fn from_samples(samples: Vec<f32>) -> Option<Context> {
        (samples.len() == CONTEXT).then_some(Context(samples))
    }

    /// The data inputs for one chunk (`input`, `sr`), the context moved on.
    ///
    /// Panics unless `chunk` holds [`CHUNK`] samples.
    pub fn inputs(&mut self, chunk: &[f32]) -> TVec<TValue> {
        assert_eq!(chunk.len(), CHUNK, "a chunk is {CHUNK} samples");
        let mut x = std::mem::take(&mut self.0);
        x.extend_from_slice(chunk);
        self.0 = x[x.len() - CONTEXT..].to_vec();
        tvec!(
            Tensor::from_shape(&[1, CONTEXT + CHUNK], &x).unwrap().into_tvalue(),
            tensor0(SAMPLE_RATE).into_tvalue()
        )
    }
}

pub use crate::sound::Sound;

/// `chunks` chunks of `sound`, seeded.
pub fn audio(sound: Sound, seed: u64, chunks: usize) -> Vec<Vec<f32>> {
    crate::sound::samples(sound, seed, chunks * CHUNK)
        .chunks(CHUNK)
        .map(|c| c.to_vec())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A context rebuilt from its samples feeds the next chunk exactly as
    /// the original would; a wrong length is refused.
    #[test]
    fn a_context_travels_as_its_samples() {
        let chunks = audio(Sound::Noise, 3, 2);
        let mut a = Context::default();
        a.inputs(&chunks[0]);
        let mut b = Context::from_samples(a.samples().to_vec()).unwrap();
        let (x, y) = (a.inputs(&chunks[1]), b.inputs(&chunks[1]));
        assert_eq!(x[0].as_bytes(), y[0].as_bytes());
        assert!(Context::from_samples(vec![0.0; CONTEXT - 1]).is_none());
    }
}
