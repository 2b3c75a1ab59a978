//! DTLN's two models and its frame loop as one laned model: [`Chain`].

use std::sync::Arc;

use tract_core::internal::*;
use tract_core::plan::{LaneId, Seating};

use rustfft::num_complex::Complex;

use super::{Denoiser, BINS, BLOCK, SHIFT};

/// DTLN's two models and its frame loop as **one** laned model, so that a
/// runner serving it hands a chunk off once (stream to turn and back), not
/// once per model.
///
/// A tract [`Runnable`] like any other, and it keeps nothing of a stream's
/// itself: a stream's whole state is four explicit states, the two LSTM
/// states and the frame loop's two buffers (the last [`BLOCK`] input
/// samples, the overlap-add buffer), so a runner keeps them per lane,
/// resets them with the lane, and snapshots, restores, exports and imports
/// them whole. A turn runs, for every row: the block moved on and its FFT
/// magnitude, `model_1` over every row at once, the mask applied and
/// `irfft` per row, `model_2` over every row at once, overlap-add per row;
/// each step is [`Denoiser`]'s code. A stream's chunk goes in and its
/// denoised chunk comes out of one call, and it is what
/// [`super::denoise_solo`] gives that stream alone, bit for bit (the
/// models' rows do not mix).
///
/// Ports (batch `B` on axis 0 of each); send one row a call:
/// - input 0: [`SHIFT`] samples, `[B, 128]`; output 0: the [`SHIFT`]
///   samples the chunk completes, `BLOCK - SHIFT` samples late;
/// - input / output 1: `model_1`'s LSTM state, `[B, 2, 128, 2]`;
/// - input / output 2: `model_2`'s, the same shape;
/// - input / output 3: the last [`BLOCK`] input samples, `[B, 512]`;
/// - input / output 4: the overlap-add buffer, `[B, 512]`.
///
/// Pair each of 1 to 4 with itself as the runner's explicit state
/// ([`Chain::STATE_PAIRS`]); every one starts from zeros. Run alone (a
/// plain state) the caller feeds the four back by hand.
///
/// ```no_run
/// use std::sync::Arc;
/// use laned_models::dtln;
/// use laned_runner::{LanedRunner, RunnerConfig, StatePair, StateSpec};
/// use tract_core::internal::*;
///
/// let files = dtln::fetch()?;
/// let prepare = |m: TypedModel| -> TractResult<Arc<dyn Runnable>> { Ok(DefaultRuntime.prepare(m)?.into()) };
/// let chain = dtln::Chain::new(
///     prepare(dtln::load_model_1(&files.model_1)?)?,
///     prepare(dtln::load_model_2(&files.model_2)?)?,
/// )?;
/// let pairs = dtln::Chain::STATE_PAIRS.iter().map(|(i, o)| StatePair::new(*i, *o)).collect();
/// let config = RunnerConfig::builder().state(StateSpec::Pairs(pairs)).build();
/// let runner = LanedRunner::new(Arc::new(chain), config)?;
/// let mut stream = runner.try_spawn()?;
/// let shift = Tensor::zero::<f32>(&[1, dtln::SHIFT])?.into_tvalue();
/// let denoised = stream.call(tvec!(shift))?;
/// assert_eq!(denoised[0].shape(), &[1, dtln::SHIFT]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Chain {
    parts: Arc<Parts>,
}

#[derive(Debug)]
struct Parts {
    model_1: Arc<dyn Runnable>,
    model_2: Arc<dyn Runnable>,
    inputs: [TypedFact; 5],
    outputs: [TypedFact; 5],
}

/// `fact`'s shape after its batch axis, or an error naming `what`, the
/// shape it has and the one wanted; its batch axis must be a symbol.
fn check_fact(what: &str, fact: &TypedFact, want: &[usize]) -> TractResult<()> {
    let dims = fact.shape.dims();
    let tail: Option<Vec<usize>> = dims.iter().skip(1).map(|d| d.to_usize().ok()).collect();
    ensure!(
        fact.datum_type == f32::datum_type()
            && dims.len() == want.len() + 1
            && matches!(dims[0], TDim::Sym(_))
            && tail.as_deref() == Some(want),
        "{what} is {:?} {:?}, not f32 [batch, {}]: not DTLN's (load it with the dtln loaders)",
        fact.datum_type,
        fact.shape,
        want.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

/// One stream's LSTM state, after the batch axis.
const LSTM: [usize; 3] = [2, 128, 2];

impl Chain {
    /// The explicit state pairs a runner serving the chain is configured
    /// with: (input, output) indices.
    pub const STATE_PAIRS: [(usize, usize); 4] = [(1, 1), (2, 2), (3, 3), (4, 4)];

    /// The chain of `model_1` and `model_2`, prepared plans of
    /// [`super::load_model_1`] and [`super::load_model_2`] (the batch
    /// symbolic). Refused, naming the port, when either's ports are not
    /// DTLN's.
    pub fn new(model_1: Arc<dyn Runnable>, model_2: Arc<dyn Runnable>) -> TractResult<Chain> {
        for (name, plan, data) in [("model_1", &model_1, BINS), ("model_2", &model_2, BLOCK)] {
            ensure!(
                plan.input_count() == 2 && plan.output_count() == 2,
                "{name} has {} inputs and {} outputs, not 2 and 2: not DTLN's",
                plan.input_count(),
                plan.output_count()
            );
            check_fact(&format!("{name}'s input 0"), plan.input_fact(0)?, &[1, data])?;
            check_fact(&format!("{name}'s input 1"), plan.input_fact(1)?, &LSTM)?;
            check_fact(&format!("{name}'s output 0"), plan.output_fact(0)?, &[1, data])?;
            check_fact(&format!("{name}'s output 1"), plan.output_fact(1)?, &LSTM)?;
        }
        // One batch symbol for every port: model_1's.
        let b = match model_1.input_fact(0)?.shape.dims().first() {
            Some(TDim::Sym(b)) => b.clone(),
            other => bail!("model_1's batch axis is {other:?}, not a symbol: load it with dtln::load_model_1"),
        };
        let audio = f32::fact(dims!(b.clone(), SHIFT));
        let lstm = f32::fact(dims!(b.clone(), 2, 128, 2));
        let block = f32::fact(dims!(b, BLOCK));
        let ports = [audio, lstm.clone(), lstm, block.clone(), block];
        Ok(Chain {
            parts: Arc::new(Parts {
                model_1,
                model_2,
                inputs: ports.clone(),
                outputs: ports,
            }),
        })
    }
}

impl Runnable for Chain {
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        Ok(Box::new(ChainState {
            chain: self.clone(),
            one: self.parts.model_1.spawn()?,
            two: self.parts.model_2.spawn()?,
            scratch: Denoiser::default(),
            spectra: vec![],
        }))
    }

    fn name(&self) -> Option<&str> {
        Some("dtln-chain")
    }

    fn input_count(&self) -> usize {
        self.parts.inputs.len()
    }

    fn output_count(&self) -> usize {
        self.parts.outputs.len()
    }

    fn input_fact(&self, ix: usize) -> TractResult<&TypedFact> {
        self.parts
            .inputs
            .get(ix)
            .with_context(|| format!("the DTLN chain has 5 inputs, not {}", ix + 1))
    }

    fn output_fact(&self, ix: usize) -> TractResult<&TypedFact> {
        self.parts
            .outputs
            .get(ix)
            .with_context(|| format!("the DTLN chain has 5 outputs, not {}", ix + 1))
    }

    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        None
    }

    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        None
    }
}

/// A state of the chain: a state of each model, and scratch for one turn
/// (no stream's data outlives a run).
#[derive(Debug, Clone)]
struct ChainState {
    chain: Chain,
    one: Box<dyn State>,
    two: Box<dyn State>,
    /// The frame loop's code and FFT plans; its buffers are loaded from a
    /// row's state and stored back around each step.
    scratch: Denoiser,
    /// Each row's spectrum, from its magnitude to its mask.
    spectra: Vec<Complex<f32>>,
}

/// `value` as f32 rows of `row` values each, or an error naming `what`, the
/// shape it has and the one wanted.
fn rows<'a>(what: &str, value: &'a Tensor, rows: usize, row: &[usize]) -> TractResult<&'a [f32]> {
    let want: Vec<usize> = std::iter::once(rows).chain(row.iter().copied()).collect();
    ensure!(
        value.datum_type() == f32::datum_type() && value.shape() == want,
        "{what} is {:?} {:?}, not f32 {want:?}",
        value.datum_type(),
        value.shape()
    );
    value.try_as_plain_ram()?.as_slice::<f32>()
}

impl State for ChainState {
    fn run(&mut self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let [audio, lstm_1, lstm_2, window, overlap]: [TValue; 5] = inputs
            .into_vec()
            .try_into()
            .map_err(|v: Vec<TValue>| format_err!("the DTLN chain takes 5 inputs, not {}", v.len()))?;
        let b = audio.shape().first().copied().unwrap_or(0);
        let audio = rows("the DTLN chain's input 0 (audio)", &audio, b, &[SHIFT])?;
        rows("the DTLN chain's input 1 (model_1's state)", &lstm_1, b, &LSTM)?;
        rows("the DTLN chain's input 2 (model_2's state)", &lstm_2, b, &LSTM)?;
        let window = rows("the DTLN chain's input 3 (the input block)", &window, b, &[BLOCK])?;
        let overlap = rows(
            "the DTLN chain's input 4 (the overlap-add buffer)",
            &overlap,
            b,
            &[BLOCK],
        )?;
        let d = &mut self.scratch;
        self.spectra.resize(b * BINS, Complex::default());
        let (mut magnitude, mut next_window) = (vec![0.0f32; b * BINS], vec![0.0f32; b * BLOCK]);
        for r in 0..b {
            d.input.copy_from_slice(&window[r * BLOCK..][..BLOCK]);
            d.magnitude_into(&audio[r * SHIFT..][..SHIFT], &mut magnitude[r * BINS..][..BINS]);
            next_window[r * BLOCK..][..BLOCK].copy_from_slice(&d.input);
            self.spectra[r * BINS..][..BINS].copy_from_slice(&d.spectrum);
        }
        let magnitude = Tensor::from_shape(&[b, 1, BINS], &magnitude)?.into_tvalue();
        let mut out_1 = self.one.run(tvec!(magnitude, lstm_1))?;
        ensure!(out_1.len() == 2, "model_1 gave {} outputs, not 2", out_1.len());
        let next_1 = out_1.pop().expect("two outputs");
        let mask = rows("model_1's mask", &out_1[0], b, &[1, BINS])?;
        let mut time = vec![0.0f32; b * BLOCK];
        for r in 0..b {
            d.spectrum.copy_from_slice(&self.spectra[r * BINS..][..BINS]);
            d.masked_into(&mask[r * BINS..][..BINS], &mut time[r * BLOCK..][..BLOCK]);
        }
        let time = Tensor::from_shape(&[b, 1, BLOCK], &time)?.into_tvalue();
        let mut out_2 = self.two.run(tvec!(time, lstm_2))?;
        ensure!(out_2.len() == 2, "model_2 gave {} outputs, not 2", out_2.len());
        let next_2 = out_2.pop().expect("two outputs");
        let block = rows("model_2's block", &out_2[0], b, &[1, BLOCK])?;
        let (mut done, mut next_overlap) = (vec![0.0f32; b * SHIFT], vec![0.0f32; b * BLOCK]);
        for r in 0..b {
            d.output.copy_from_slice(&overlap[r * BLOCK..][..BLOCK]);
            d.overlap_add_into(&block[r * BLOCK..][..BLOCK], &mut done[r * SHIFT..][..SHIFT]);
            next_overlap[r * BLOCK..][..BLOCK].copy_from_slice(&d.output);
        }
        Ok(tvec!(
            Tensor::from_shape(&[b, SHIFT], &done)?.into_tvalue(),
            next_1,
            next_2,
            Tensor::from_shape(&[b, BLOCK], &next_window)?.into_tvalue(),
            Tensor::from_shape(&[b, BLOCK], &next_overlap)?.into_tvalue(),
        ))
    }

    fn seat(&mut self, seating: Seating) -> TractResult<()> {
        let lanes = seating.lanes();
        self.one
            .seat(Seating::new(seating.max_lanes(), lanes.iter().copied())?)?;
        self.two.seat(seating)
    }

    fn reset_lanes(&mut self, lanes: &[LaneId]) -> TractResult<()> {
        self.one.reset_lanes(lanes)?;
        self.two.reset_lanes(lanes)
    }

    fn runnable(&self) -> &dyn Runnable {
        &self.chain
    }
}
