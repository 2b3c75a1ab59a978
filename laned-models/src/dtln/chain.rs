//! DTLN's two models and its frame loop as one laned model: [`Chain`].

use std::sync::Arc;

use tract_core::internal::*;
use tract_core::plan::{LaneId, Seating};

use super::{Denoiser, BINS, BLOCK, SHIFT};

/// DTLN's two models and its frame loop as **one** laned model, so that a
/// runner serving it hands a chunk off once (stream to turn and back), not
/// once per model.
///
/// A tract [`Runnable`] like any other: a laned runner seats streams on its
/// lanes, resets the lanes it gives out, and keeps the two LSTM states as
/// explicit state. Each lane also keeps its stream's [`Denoiser`] (the
/// block being filled, its spectrum, the overlap-add buffer), reset with
/// the lane, so a turn runs, for every seated row: the row's FFT magnitude,
/// `model_1` over every row at once, the mask applied and `irfft` per row,
/// `model_2` over every row at once, overlap-add per row. A stream's chunk
/// goes in and its denoised chunk comes out of one call, and it is what
/// [`super::denoise_solo`] gives that stream alone, bit for bit (the
/// models' rows do not mix; the frame loop is the same code per lane).
///
/// Ports (batch `B` on axis 0 of each):
/// - input 0: [`SHIFT`] samples, `[B, 128]`; output 0: the [`SHIFT`]
///   samples the chunk completes, `BLOCK - SHIFT` samples late;
/// - input 1 / output 1: `model_1`'s LSTM state, `[B, 2, 128, 2]`;
/// - input 2 / output 2: `model_2`'s, the same shape.
///
/// Pair 1 with 1 and 2 with 2 as the runner's explicit state
/// ([`Chain::STATE_PAIRS`]). Run alone (a plain state, batch 1, no
/// seating) the chain is one stream on lane 0, the states fed back by hand.
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
    inputs: [TypedFact; 3],
    outputs: [TypedFact; 3],
    /// A new lane's frame loop, cloned on every reset (its FFT plans are
    /// shared, not planned again).
    fresh: Denoiser,
}

/// `fact`'s shape after its batch axis, or an error naming `what`, the
/// shape it has and the one wanted.
fn check_tail(what: &str, fact: &TypedFact, want: &[usize]) -> TractResult<()> {
    let dims = fact.shape.dims();
    let tail: Option<Vec<usize>> = dims.iter().skip(1).map(|d| d.to_usize().ok()).collect();
    ensure!(
        fact.datum_type == f32::datum_type() && dims.len() == want.len() + 1 && tail.as_deref() == Some(want),
        "{what} is {:?} {:?}, not f32 [batch, {}]: not DTLN's (load it with the dtln loaders)",
        fact.datum_type,
        fact.shape,
        want.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

impl Chain {
    /// The explicit state pairs a runner serving the chain is configured
    /// with: (input, output) indices.
    pub const STATE_PAIRS: [(usize, usize); 2] = [(1, 1), (2, 2)];

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
            check_tail(&format!("{name}'s input 0"), plan.input_fact(0)?, &[1, data])?;
            check_tail(&format!("{name}'s input 1"), plan.input_fact(1)?, &[2, 128, 2])?;
            check_tail(&format!("{name}'s output 0"), plan.output_fact(0)?, &[1, data])?;
            check_tail(&format!("{name}'s output 1"), plan.output_fact(1)?, &[2, 128, 2])?;
        }
        // One batch symbol for every port: model_1's.
        let b = match model_1.input_fact(0)?.shape.dims().first() {
            Some(TDim::Sym(b)) => b.clone(),
            other => bail!("model_1's batch axis is {other:?}, not a symbol: load it with dtln::load_model_1"),
        };
        let audio = f32::fact(dims!(b.clone(), SHIFT));
        let state = f32::fact(dims!(b, 2, 128, 2));
        Ok(Chain {
            parts: Arc::new(Parts {
                model_1,
                model_2,
                inputs: [audio.clone(), state.clone(), state.clone()],
                outputs: [audio, state.clone(), state],
                fresh: Denoiser::default(),
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
            loops: vec![self.parts.fresh.clone()],
            seated: vec![0],
        }))
    }

    fn name(&self) -> Option<&str> {
        Some("dtln-chain")
    }

    fn input_count(&self) -> usize {
        3
    }

    fn output_count(&self) -> usize {
        3
    }

    fn input_fact(&self, ix: usize) -> TractResult<&TypedFact> {
        self.parts
            .inputs
            .get(ix)
            .with_context(|| format!("the DTLN chain has 3 inputs, not {}", ix + 1))
    }

    fn output_fact(&self, ix: usize) -> TractResult<&TypedFact> {
        self.parts
            .outputs
            .get(ix)
            .with_context(|| format!("the DTLN chain has 3 outputs, not {}", ix + 1))
    }

    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        None
    }

    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        None
    }
}

/// A state of the chain: a state of each model and a frame loop per lane.
#[derive(Debug, Clone)]
struct ChainState {
    chain: Chain,
    one: Box<dyn State>,
    two: Box<dyn State>,
    /// Lane `l`'s stream's frame loop; grown to the seatings' lane count.
    loops: Vec<Denoiser>,
    /// The lanes the coming turn's rows read and write, row by row (lane 0
    /// until a seating says otherwise: a plain state is one stream).
    seated: Vec<usize>,
}

impl ChainState {
    fn grow(&mut self, lanes: usize) {
        while self.loops.len() < lanes {
            self.loops.push(self.chain.parts.fresh.clone());
        }
    }
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
        let [audio, state_1, state_2]: [TValue; 3] = inputs
            .into_vec()
            .try_into()
            .map_err(|v: Vec<TValue>| format_err!("the DTLN chain takes 3 inputs, not {}", v.len()))?;
        let b = audio.shape().first().copied().unwrap_or(0);
        ensure!(
            b == self.seated.len(),
            "the DTLN chain's input 0 carries {b} rows and the turn seats {} lanes",
            self.seated.len()
        );
        let audio = rows("the DTLN chain's input 0 (audio)", &audio, b, &[SHIFT])?;
        let mut magnitude = vec![0.0f32; b * BINS];
        for (r, &lane) in self.seated.iter().enumerate() {
            self.loops[lane].magnitude_into(&audio[r * SHIFT..][..SHIFT], &mut magnitude[r * BINS..][..BINS]);
        }
        let magnitude = Tensor::from_shape(&[b, 1, BINS], &magnitude)?.into_tvalue();
        let mut out_1 = self.one.run(tvec!(magnitude, state_1))?;
        ensure!(out_1.len() == 2, "model_1 gave {} outputs, not 2", out_1.len());
        let next_1 = out_1.pop().expect("two outputs");
        let mask = rows("model_1's mask", &out_1[0], b, &[1, BINS])?;
        let mut time = vec![0.0f32; b * BLOCK];
        for (r, &lane) in self.seated.iter().enumerate() {
            self.loops[lane].masked_into(&mask[r * BINS..][..BINS], &mut time[r * BLOCK..][..BLOCK]);
        }
        let time = Tensor::from_shape(&[b, 1, BLOCK], &time)?.into_tvalue();
        let mut out_2 = self.two.run(tvec!(time, state_2))?;
        ensure!(out_2.len() == 2, "model_2 gave {} outputs, not 2", out_2.len());
        let next_2 = out_2.pop().expect("two outputs");
        let block = rows("model_2's block", &out_2[0], b, &[1, BLOCK])?;
        let mut done = vec![0.0f32; b * SHIFT];
        for (r, &lane) in self.seated.iter().enumerate() {
            self.loops[lane].overlap_add_into(&block[r * BLOCK..][..BLOCK], &mut done[r * SHIFT..][..SHIFT]);
        }
        Ok(tvec!(
            Tensor::from_shape(&[b, SHIFT], &done)?.into_tvalue(),
            next_1,
            next_2
        ))
    }

    fn seat(&mut self, seating: Seating) -> TractResult<()> {
        let lanes = seating.lanes();
        for state in [&mut self.one, &mut self.two] {
            state.seat(Seating::new(seating.max_lanes(), lanes.iter().copied())?)?;
        }
        self.grow(seating.max_lanes());
        self.seated = lanes.iter().map(|l| l.0).collect();
        Ok(())
    }

    fn reset_lanes(&mut self, lanes: &[LaneId]) -> TractResult<()> {
        self.one.reset_lanes(lanes)?;
        self.two.reset_lanes(lanes)?;
        if let Some(top) = lanes.iter().map(|l| l.0 + 1).max() {
            self.grow(top);
        }
        for lane in lanes {
            self.loops[lane.0] = self.chain.parts.fresh.clone();
        }
        Ok(())
    }

    fn runnable(&self) -> &dyn Runnable {
        &self.chain
    }
}
