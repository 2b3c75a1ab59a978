//! `cargo xtask bench --model dtln` / `--model oww`: a real audio pipeline
//! of several models per stream served through one runner per model (ours,
//! blocking and as tasks; tract's `LanedRunnable`), against a plain state
//! per stream and the ideal loop, side by side in one process. xtask pins
//! it to one core (`--cores`).
//!
//! - `dtln`: DTLN noise suppression, two explicit-state models per 8 ms
//!   shift of 128 samples (laned-models' `Denoiser` around them).
//! - `oww`: openWakeWord, three stateless models (mel spectrogram,
//!   embedding, "hey jarvis") per 80 ms chunk of 1280 samples (the
//!   laned-models' `Windows` around them).
//!
//! A stream's whole pipeline (its frame loop and one state per model) is a
//! `Runnable` here, fed one chunk of audio at a time, so the closed loop and
//! the real-time search of `laned_load` drive it as they drive one
//! model; as tasks it is an [`AsyncStream`] for `laned_load::tasks`. The
//! ideal loop runs every stream's chunk through one batched plain state per
//! model on one thread, inputs stacked, with no queue at all.
//!
//! tract's runner keeps no state between calls: DTLN's LSTM state goes
//! through it as an input that each stream feeds back, which works only
//! because that state is batched on axis 0 (Silero's is not).

use std::sync::Arc;
use std::time::Duration;

use laned_bench::cli::{self, Common};
use laned_bench::searches::Searches;
use laned_load::ideal::Above;
use laned_load::tasks::{self, AsyncStream, AsyncStreams, BoxFuture, TaskSystem};
use laned_load::FeedBack;
use laned_models::dtln::{self, Denoiser};
use laned_models::oww::{self, Windows};
use laned_models::sound::{self, Sound};
use laned_runner::{LanedRunner, LanedStateHandle, Mode, RunnerConfig, StatePair, StateSpec, TurnPolicy};
use tract_core::internal::*;

const HELP: &str = "\
audio-bench --model dtln|oww [--streams 64] [--seconds 2] [--repeats 3] [--skip-real-time] [--quick]
            [--only 'WORDS|WORDS'] [--rt-at N] [--searches 1]

Closed loop (a thread or task per stream, each sending its next chunk once
answered): chunks/s of a state per stream, the ideal loop (ideal: the models
as given on plain batched tract states, one thread, no lanes API), ours (a runner per model) in both modes and as
tasks, tract's LanedRunnable (threads and tasks), and per core the shards
ideal loop and ours with a shard per core; and how many streams' real time
that is. Real time: a chunk every period per stream (8 ms for dtln, 80 ms
for oww); capacity is the most streams with p99 latency within half the
period. `--only 'chain|tract'` keeps the systems whose label holds one of the
words (the state per stream and the ideal loops always run: the ratios'
denominators). `--rt-at N` probes each real-time system once at N streams
instead of searching (p50 and p99: a profile at a load). `--searches N`
runs each real-time search N times, interleaved; the capacity is the median.
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model {
    Dtln,
    Oww,
}

impl Model {
    /// Samples per chunk, the period they span, and the models per chunk.
    fn chunk(self) -> usize {
        match self {
            Model::Dtln => dtln::SHIFT,
            Model::Oww => oww::CHUNK,
        }
    }

    fn period(self) -> Duration {
        Duration::from_micros(self.chunk() as u64 * 1_000_000 / sound::SAMPLE_RATE as u64)
    }
}

struct Args {
    model: Model,
    only: Vec<String>,
    rt_at: Option<usize>,
    searches: usize,
    common: Common,
}

fn args() -> Result<Args, String> {
    let mut model = None;
    let mut only = vec![];
    let mut rt_at = None;
    let mut searches = 1;
    let common = cli::parse(std::env::args().skip(1), HELP, |flag, value| {
        if flag == "--only" {
            only = value("--only")?.split('|').map(str::to_string).collect();
            return Ok(true);
        }
        if flag == "--searches" {
            searches = cli::number::<usize>(&value("--searches")?, "--searches")?.max(1);
            return Ok(true);
        }
        if flag == "--rt-at" {
            rt_at = Some(cli::number(&value("--rt-at")?, "--rt-at")?);
            return Ok(true);
        }
        if flag != "--model" {
            return Ok(false);
        }
        model = Some(match value("--model")?.as_str() {
            "dtln" => Model::Dtln,
            "oww" => Model::Oww,
            other => return Err(format!("--model {other:?}: dtln or oww")),
        });
        Ok(true)
    })?;
    let model = model.ok_or(format!("--model is required\n\n{HELP}"))?;
    Ok(Args {
        model,
        only,
        rt_at,
        searches,
        common,
    })
}

/// Stream `s`'s next chunk, `[1, chunk]`: noisy speech-like audio (the
/// models' cost does not depend on the sound), the same chunk every time.
fn chunk_inputs(model: Model, s: usize) -> TVec<TValue> {
    let audio = sound::samples(Sound::NoisyBuzz, s as u64 * 2 + 1, model.chunk());
    tvec!(Tensor::from_shape(&[1, model.chunk()], &audio)
        .expect("a chunk's shape")
        .into_tvalue())
}

/// A stream's frame loop (DTLN) or feature windows (openWakeWord): the
/// per-stream work around the models, one stage at a time, so that the
/// stages can run on plain states, runners, tasks or one batched state.
#[derive(Debug, Clone)]
enum Loop {
    Dtln(Box<Denoiser>),
    Oww(Box<Windows>),
}

impl Loop {
    fn new(model: Model) -> Loop {
        match model {
            Model::Dtln => Loop::Dtln(Box::default()),
            Model::Oww => Loop::Oww(Box::default()),
        }
    }

    /// The first stage's data inputs for `chunk`.
    fn start(&mut self, chunk: &[f32]) -> TVec<TValue> {
        match self {
            Loop::Dtln(denoiser) => denoiser.magnitude(chunk),
            Loop::Oww(windows) => windows.mel_input(chunk),
        }
    }

    /// Takes stage `k`'s data output; gives stage `k + 1`'s data inputs, or
    /// `None` after the last stage.
    fn step(&mut self, k: usize, out: &Tensor) -> TractResult<Option<TVec<TValue>>> {
        match (self, k) {
            (Loop::Dtln(denoiser), 0) => denoiser.masked(out).map(Some),
            (Loop::Dtln(denoiser), _) => denoiser.overlap_add(out).map(|_| None),
            (Loop::Oww(windows), 0) => windows.embedding_input(out).map(Some),
            (Loop::Oww(windows), 1) => windows.classifier_input(out).map(Some),
            (Loop::Oww(_), _) => Ok(None),
        }
    }
}

fn chunk_of(inputs: &TVec<TValue>) -> TractResult<Vec<f32>> {
    Ok(inputs[0].try_as_plain_ram()?.as_slice::<f32>()?.to_vec())
}

/// A stream's whole pipeline as one `Runnable`: a state of each stage and
/// its loop. Input: one chunk of audio; output: the last stage's.
#[derive(Debug)]
struct Pipeline {
    model: Model,
    stages: Vec<Arc<dyn Runnable>>,
}

#[derive(Debug, Clone)]
struct PipelineState {
    states: Vec<Box<dyn State>>,
    frames: Loop,
}

impl State for PipelineState {
    fn run(&mut self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let mut next = self.frames.start(&chunk_of(&inputs)?);
        for (k, state) in self.states.iter_mut().enumerate() {
            let out = state.run(next)?;
            match self.frames.step(k, &out[0])? {
                Some(inputs) => next = inputs,
                None => return Ok(out),
            }
        }
        bail!("the loop wants more stages than the pipeline has")
    }
    fn runnable(&self) -> &dyn Runnable {
        self.states[0].runnable()
    }
}

impl Runnable for Pipeline {
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        Ok(Box::new(PipelineState {
            states: self.stages.iter().map(|s| s.spawn()).collect::<TractResult<_>>()?,
            frames: Loop::new(self.model),
        }))
    }
    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        self.stages[0].typed_plan()
    }
    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        self.stages[0].typed_model()
    }
}

/// Ours as tasks: a stream is a handle of each stage's runner
/// (`spawn_async`), and a chunk goes through them with `call_async`.
struct OursTasks {
    model: Model,
    runners: Vec<LanedRunner>,
}

struct TaskPipeline {
    handles: Vec<LanedStateHandle>,
    frames: Loop,
}

impl AsyncStreams for OursTasks {
    fn spawn(&self) -> BoxFuture<'_, TractResult<Box<dyn AsyncStream>>> {
        Box::pin(async move {
            let mut handles = Vec::with_capacity(self.runners.len());
            for runner in &self.runners {
                handles.push(runner.spawn_async().await?);
            }
            Ok(Box::new(TaskPipeline {
                handles,
                frames: Loop::new(self.model),
            }) as Box<dyn AsyncStream>)
        })
    }
}

impl AsyncStream for TaskPipeline {
    fn call(&mut self, inputs: TVec<TValue>) -> BoxFuture<'_, TractResult<()>> {
        Box::pin(async move {
            let mut next = self.frames.start(&chunk_of(&inputs)?);
            for k in 0..self.handles.len() {
                let out = self.handles[k].call_async(next).await?;
                match self.frames.step(k, &out[0])? {
                    Some(inputs) => next = inputs,
                    None => return Ok(()),
                }
            }
            bail!("the loop wants more stages than the pipeline has")
        })
    }
}

/// The ideal loop's state on one thread (ideal: the models as given on
/// plain batched tract states): one plain state per model as prepared
/// (never a runner's plan), batched over all its `n` streams, every stream
/// in every run, no lanes API (never seated nor reset), DTLN's LSTM state
/// fed back by hand, no queue at all. The per-stream work (FFTs, windows)
/// and the stacking between models are the glue, done by hand as every
/// system does them.
struct Ideal {
    states: Vec<Box<dyn State>>,
    /// DTLN's LSTM state per model, all streams stacked; fed back by hand.
    lstm: Vec<Option<TValue>>,
    loops: Vec<Loop>,
    chunks: Vec<Vec<f32>>,
}

impl Ideal {
    fn new(model: Model, plans: &[Arc<dyn Runnable>], first: usize, n: usize) -> TractResult<Ideal> {
        let lstm = plans
            .iter()
            .map(|_| {
                (model == Model::Dtln)
                    .then(|| {
                        let mut shape = dtln::STATE_SHAPE;
                        shape[0] = n;
                        Tensor::zero::<f32>(&shape).map(|t| t.into_tvalue())
                    })
                    .transpose()
            })
            .collect::<TractResult<_>>()?;
        Ok(Ideal {
            states: plans.iter().map(|p| p.spawn()).collect::<TractResult<_>>()?,
            lstm,
            loops: (0..n).map(|_| Loop::new(model)).collect(),
            chunks: (first..first + n)
                .map(|s| chunk_of(&chunk_inputs(model, s)))
                .collect::<TractResult<_>>()?,
        })
    }

    /// Every stream's next chunk through every model; the chunks served.
    fn round(&mut self) -> TractResult<u64> {
        let mut inputs: Vec<TVec<TValue>> = self
            .loops
            .iter_mut()
            .zip(&self.chunks)
            .map(|(l, c)| l.start(c))
            .collect();
        for k in 0..self.states.len() {
            let mut batch: TVec<TValue> = (0..inputs[0].len())
                .map(|i| {
                    let rows: TVec<&Tensor> = inputs.iter().map(|row| &*row[i]).collect();
                    Tensor::stack_tensors(0, &rows).map(|t| t.into_tvalue())
                })
                .collect::<TractResult<_>>()?;
            batch.extend(self.lstm[k].clone());
            let mut out = self.states[k].run(batch)?;
            if self.lstm[k].is_some() {
                self.lstm[k] = Some(out.remove(1));
            }
            let mut next = Vec::with_capacity(self.loops.len());
            for (s, frames) in self.loops.iter_mut().enumerate() {
                next.extend(frames.step(k, &out[0].slice(0, s, s + 1)?)?);
            }
            inputs = next;
        }
        Ok(self.loops.len() as u64)
    }
}

/// The models, prepared.
struct Models {
    model: Model,
    plans: Vec<Arc<dyn Runnable>>,
}

impl Models {
    /// A state per stream per model.
    fn solo(&self) -> Arc<dyn Runnable> {
        self.pipeline(|p| p.clone())
    }

    /// Each stage run by `wrap(plan)`, DTLN's LSTM state fed back by hand
    /// around it.
    fn pipeline(&self, mut wrap: impl FnMut(&Arc<dyn Runnable>) -> Arc<dyn Runnable>) -> Arc<dyn Runnable> {
        let lstm_zeros = Tensor::zero::<f32>(&dtln::STATE_SHAPE).expect("a fixed shape");
        let stages = self
            .plans
            .iter()
            .map(|p| match self.model {
                Model::Dtln => Arc::new(FeedBack::new(wrap(p), lstm_zeros.clone())) as Arc<dyn Runnable>,
                Model::Oww => wrap(p),
            })
            .collect();
        Arc::new(Pipeline {
            model: self.model,
            stages,
        })
    }

    /// tract's runner per model, `n` lanes each. It keeps no state: for
    /// DTLN each stream feeds its LSTM state back as an input, which tract
    /// stacks with the rest (the state's batch axis is axis 0).
    fn tract(&self, n: usize) -> TractResult<Arc<dyn Runnable>> {
        let runners = self
            .plans
            .iter()
            .map(|p| Ok(Arc::new(tract_core::lanes::LanedRunnable::wrap(p.clone(), n)?) as Arc<dyn Runnable>))
            .collect::<TractResult<Vec<_>>>()?;
        let mut each = runners.into_iter();
        Ok(self.pipeline(|_| each.next().expect("a runner per plan")))
    }

    /// A runner per model, on `shards` states of `n / shards` lanes.
    fn runners(&self, n: usize, shards: usize, mode: Mode, budget: Option<Duration>) -> TractResult<Vec<LanedRunner>> {
        let states = [dtln::STATE_1, dtln::STATE_2];
        self.plans
            .iter()
            .enumerate()
            .map(|(ix, plan)| {
                let mut config = RunnerConfig::builder()
                    .shards(shards)
                    .max_lanes(n.div_ceil(shards))
                    .mode(mode)
                    .linger(Duration::ZERO);
                if self.model == Model::Dtln {
                    config = config.state(StateSpec::Pairs(vec![StatePair::new(states[ix], 1)]));
                }
                // The budget shared by the stages a chunk goes through.
                if let Some(budget) = budget {
                    config = config.policy(TurnPolicy::latency_budget(budget / self.plans.len() as u32));
                }
                Ok(LanedRunner::new(plan.clone(), config.build())?)
            })
            .collect()
    }

    /// Ours: a runner per model, blocking calls.
    fn ours(&self, n: usize, shards: usize, mode: Mode, budget: Option<Duration>) -> TractResult<Arc<dyn Runnable>> {
        let stages = self
            .runners(n, shards, mode, budget)?
            .into_iter()
            .map(|r| Arc::new(r) as Arc<dyn Runnable>)
            .collect();
        Ok(Arc::new(Pipeline {
            model: self.model,
            stages,
        }))
    }

    /// DTLN as one laned model ([`dtln::Chain`]): one runner, a hand-off
    /// per chunk, both LSTM states kept per stream.
    fn chain(&self, n: usize, shards: usize, mode: Mode, budget: Option<Duration>) -> TractResult<LanedRunner> {
        ensure!(self.model == Model::Dtln, "only DTLN has a chain");
        let chain = Arc::new(dtln::Chain::new(self.plans[0].clone(), self.plans[1].clone())?);
        let pairs = dtln::Chain::STATE_PAIRS
            .iter()
            .map(|(i, o)| StatePair::new(*i, *o))
            .collect();
        let mut config = RunnerConfig::builder()
            .shards(shards)
            .max_lanes(n.div_ceil(shards))
            .mode(mode)
            .linger(Duration::ZERO)
            .state(StateSpec::Pairs(pairs));
        if let Some(budget) = budget {
            config = config.policy(TurnPolicy::latency_budget(budget));
        }
        Ok(LanedRunner::new(chain, config.build())?)
    }

    /// Ours as tasks.
    fn ours_tasks(&self, n: usize, shards: usize, budget: Option<Duration>) -> TractResult<TaskSystem> {
        Ok(TaskSystem::Streams(Arc::new(OursTasks {
            model: self.model,
            runners: self.runners(n, shards, Mode::Worker, budget)?,
        })))
    }
}

fn load_models(model: Model) -> Result<(Models, String), String> {
    let prepare = |m: TractResult<TypedModel>| -> Result<Arc<dyn Runnable>, String> {
        let m = m.map_err(|e| format!("{e:#}"))?;
        Ok(DefaultRuntime.prepare(m).map_err(|e| format!("{e:#}"))?.into())
    };
    Ok(match model {
        Model::Dtln => {
            let files = dtln::fetch().map_err(|e| e.to_string())?;
            let plans = vec![
                prepare(dtln::load_model_1(&files.model_1))?,
                prepare(dtln::load_model_2(&files.model_2))?,
            ];
            let what = format!("DTLN ({}, {})", files.model_1.display(), files.model_2.display());
            (Models { model, plans }, what)
        }
        Model::Oww => {
            let files = oww::fetch().map_err(|e| e.to_string())?;
            let plans = oww::plans(&files).map_err(|e| format!("{e:#}"))?.to_vec();
            let what = format!("openWakeWord ({}, ...)", files.classifier.display());
            (Models { model, plans }, what)
        }
    })
}

#[derive(Clone, Copy, Debug)]
enum System {
    Solo,
    /// One thread, one batched state per model.
    Ideal,
    Ours(Mode),
    /// Ours in worker mode, streams as tokio tasks.
    OursTasks,
    Tract,
    /// tract's runner, streams as tokio tasks (a `spawn_blocking` per call).
    TractTasks,
    /// The ideal loop on a thread per core, each its own batched states.
    IdealShards(usize),
    /// Ours in worker mode with a shard per core.
    OursShards(usize),
    /// DTLN as one laned model: one runner, a hand-off per chunk.
    Chain(Mode),
    /// The same, streams as tokio tasks.
    ChainTasks,
}

impl System {
    fn label(self) -> &'static str {
        match self {
            System::Solo => "a state per stream per model, a thread each",
            System::Ideal => "ideal (the models as given on plain batched tract states, one thread)",
            System::Ours(Mode::Worker) => "ours (worker, a runner per model)",
            System::Ours(Mode::Combining) => "ours (combining, a runner per model)",
            System::OursTasks => "ours async (worker; tasks)",
            System::Tract => "tract LanedRunnable (a runner per model)",
            System::TractTasks => "tract LanedRunnable (tasks, spawn_blocking per chunk)",
            System::IdealShards(_) => "shards ideal (plain batched tract states per core, a thread each)",
            System::OursShards(_) => "ours (worker, a shard per core)",
            System::Chain(Mode::Worker) => "ours (worker, the chain as one model)",
            System::Chain(Mode::Combining) => "ours (combining, the chain as one model)",
            System::ChainTasks => "ours async (worker, the chain as one model; tasks)",
        }
    }
}

fn measure(
    system: System,
    models: &Models,
    tokio: &tokio::runtime::Runtime,
    n: usize,
    d: Duration,
) -> TractResult<f64> {
    let model = models.model;
    let threads = |pipeline: Arc<dyn Runnable>| {
        laned_load::threads::closed_loop(
            n,
            d,
            move |s| Ok((pipeline.spawn()?, chunk_inputs(model, s))),
            |(state, inputs)| {
                state.run(inputs.clone())?;
                Ok(1)
            },
        )
    };
    // `n` streams split as evenly as the threads allow (never more).
    let ideal = |threads: usize| {
        let shares = laned_load::ideal::shares(n, threads);
        let (plans, model) = (models.plans.clone(), models.model);
        laned_load::threads::closed_loop(
            shares.len(),
            d,
            move |t| Ideal::new(model, &plans, shares[t].start, shares[t].len()),
            Ideal::round,
        )
    };
    let run = match system {
        System::Solo => threads(models.solo()),
        System::Ideal => ideal(1),
        System::IdealShards(cores) => ideal(cores),
        System::Ours(mode) => threads(models.ours(n, 1, mode, None)?),
        System::OursShards(cores) => threads(models.ours(n, cores, Mode::Worker, None)?),
        System::Tract => threads(models.tract(n)?),
        System::OursTasks => {
            tasks::closed_loop(tokio, &models.ours_tasks(n, 1, None)?, n, d, |s| chunk_inputs(model, s))
        }
        System::Chain(mode) => threads(Arc::new(models.chain(n, 1, mode, None)?)),
        System::ChainTasks => tasks::closed_loop(
            tokio,
            &TaskSystem::Ours(models.chain(n, 1, Mode::Worker, None)?),
            n,
            d,
            |s| chunk_inputs(model, s),
        ),
        System::TractTasks => tasks::closed_loop(tokio, &TaskSystem::TractBlocking(models.tract(n)?), n, d, |s| {
            chunk_inputs(model, s)
        }),
    }?;
    Ok(run.per_sec)
}

fn main() -> TractResult<()> {
    let Args {
        model,
        only,
        rt_at,
        searches,
        common: args,
    } = cli::or_exit(args());
    let kept = |label: &str| only.is_empty() || only.iter().any(|w| label.contains(w.as_str()));
    let (models, what) = cli::model_or_exit(load_models(model), "the models");
    let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .enable_time()
        .build()?;
    let n = args.streams;
    let d = Duration::from_secs_f64(args.seconds);
    let period = model.period();
    println!(
        "{what}: {} models per chunk of {} samples ({} ms), {n} streams, {cores} core(s) available",
        models.plans.len(),
        model.chunk(),
        period.as_millis()
    );
    let mut systems = vec![
        System::Solo,
        System::Ideal,
        System::Ours(Mode::Worker),
        System::Ours(Mode::Combining),
        System::OursTasks,
        System::Tract,
        System::TractTasks,
        System::IdealShards(cores),
        System::OursShards(cores),
    ];
    if model == Model::Dtln {
        systems.extend([
            System::Chain(Mode::Worker),
            System::Chain(Mode::Combining),
            System::ChainTasks,
        ]);
    }
    systems.retain(|s| matches!(s, System::Solo | System::Ideal | System::IdealShards(_)) || kept(s.label()));
    let mut runs: Vec<Vec<f64>> = vec![vec![]; systems.len()];
    // Interleaved: every system once per repeat, so drift hits all alike.
    for _ in 0..args.repeats {
        for (ix, system) in systems.iter().enumerate() {
            runs[ix].push(measure(*system, &models, &tokio, n, d)?);
        }
    }
    let rates: Vec<f64> = runs.iter().map(|r| laned_load::median(r)).collect();
    let rate_of = |wanted: fn(&System) -> bool| rates[systems.iter().position(wanted).expect("in the table")];
    let solo = rate_of(|s| matches!(s, System::Solo));
    let ideal = rate_of(|s| matches!(s, System::Ideal));
    let shards_ideal = rate_of(|s| matches!(s, System::IdealShards(_)));
    println!(
        "\n## Closed loop, {n} streams (median of {} runs of {} s)\n",
        args.repeats, args.seconds
    );
    println!("| system | chunks/s | runs | / solo | / ideal | / shards ideal | streams' real time |");
    println!("|---|---|---|---|---|---|---|");
    let runs_of = |wanted: fn(&System) -> bool| &runs[systems.iter().position(wanted).expect("in the table")];
    let (ideal_runs, shards_ideal_runs) = (
        runs_of(|s| matches!(s, System::Ideal)),
        runs_of(|s| matches!(s, System::IdealShards(_))),
    );
    let mut notes = vec![];
    for (ix, system) in systems.iter().enumerate() {
        let all: Vec<String> = runs[ix].iter().map(|r| format!("{r:.0}")).collect();
        // Every served system against its own ideal: a shard per core
        // against the shards ideal, the rest against the ideal loop.
        let sharded = matches!(system, System::OursShards(_));
        let above = match system {
            System::Solo | System::Ideal | System::IdealShards(_) => None,
            _ if sharded => Above::of(&runs[ix], shards_ideal_runs),
            _ => Above::of(&runs[ix], ideal_runs),
        };
        let flag = |mine: bool| match above {
            Some(a) if mine => format!(" {}", a.flag()),
            _ => String::new(),
        };
        println!(
            "| {} | {:.0} | {} | {:.2}x | {:.2}{} | {:.2}{} | {:.0} |",
            system.label(),
            rates[ix],
            all.join(", "),
            rates[ix] / solo,
            rates[ix] / ideal,
            flag(!sharded),
            rates[ix] / shards_ideal,
            flag(sharded),
            rates[ix] * period.as_secs_f64()
        );
        if let Some(a) = above {
            notes.push(format!("- {}: {a}", system.label()));
        }
    }
    if !notes.is_empty() {
        println!("\nAbove the ideal:\n{}", notes.join("\n"));
    }
    if model == Model::Dtln {
        println!(
            "\ntract's runner keeps no state between calls: DTLN's LSTM state travels through it as an input \
             each stream feeds back, which only works because that state is batched on axis 0."
        );
    }
    if args.real_time {
        let budget = period / 2;
        let probe = args.probe();
        println!(
            "\n## Real time: a chunk every {} ms per stream, capacity = most streams with p99 <= {} ms\n",
            period.as_millis(),
            budget.as_millis()
        );
        println!("{}", Searches::HEADER);
        const SHARDED_THREADS: &str = "ours (a shard per core, latency budget half the period)";
        enum Rt<'a> {
            Threads(&'a dyn Fn(usize) -> TractResult<Arc<dyn Runnable>>),
            Tasks(&'a dyn Fn(usize) -> TractResult<TaskSystem>),
        }
        let solo = |_: usize| -> TractResult<Arc<dyn Runnable>> { Ok(models.solo()) };
        let no_linger = |n: usize| models.ours(n, 1, Mode::Worker, None);
        let budgeted = |n: usize| models.ours(n, 1, Mode::Worker, Some(budget));
        let sharded = |n: usize| models.ours(n, cores, Mode::Worker, Some(budget));
        let tract = |n: usize| models.tract(n);
        let as_tasks = |n: usize| models.ours_tasks(n, 1, None);
        let as_tasks_sharded = |n: usize| models.ours_tasks(n, cores, Some(budget));
        let chain =
            |n: usize| -> TractResult<Arc<dyn Runnable>> { Ok(Arc::new(models.chain(n, 1, Mode::Worker, None)?)) };
        let chain_tasks = |n: usize| Ok(TaskSystem::Ours(models.chain(n, 1, Mode::Worker, None)?));
        let chain_tasks_combining = |n: usize| Ok(TaskSystem::Ours(models.chain(n, 1, Mode::Combining, None)?));
        let chain_tasks_budget = |n: usize| Ok(TaskSystem::Ours(models.chain(n, cores, Mode::Worker, Some(budget))?));
        let mut rt: Vec<(&str, Rt<'_>)> = vec![
            ("a state per stream per model, a thread each", Rt::Threads(&solo)),
            ("tract LanedRunnable (a runner per model)", Rt::Threads(&tract)),
            ("ours (worker, no linger)", Rt::Threads(&no_linger)),
            ("ours (worker, latency budget half the period)", Rt::Threads(&budgeted)),
            (SHARDED_THREADS, Rt::Threads(&sharded)),
            (
                "ours async (worker, no linger; tasks, latency from send)",
                Rt::Tasks(&as_tasks),
            ),
            (
                "ours async (a shard per core, latency budget half the period; tasks, latency from send)",
                Rt::Tasks(&as_tasks_sharded),
            ),
        ];
        if model == Model::Dtln {
            rt.extend([
                ("ours (worker, the chain as one model, no linger)", Rt::Threads(&chain)),
                (
                    "ours async (the chain as one model, no linger; tasks, latency from send)",
                    Rt::Tasks(&chain_tasks),
                ),
                (
                    "ours async (the chain, a shard per core, latency budget half the period; tasks, latency from send)",
                    Rt::Tasks(&chain_tasks_budget),
                ),
                (
                    "ours async (combining, the chain as one model; tasks, latency from send)",
                    Rt::Tasks(&chain_tasks_combining),
                ),
            ]);
        }
        // On one core a shard per core is one shard: the threads' system
        // would repeat the budgeted one.
        rt.retain(|(label, _)| kept(label) && (cores > 1 || *label != SHARDED_THREADS));
        // Every system's search once per round, so drift hits all alike.
        let mut found = Searches::new(rt.len(), budget);
        for _ in 0..searches {
            for (ix, (label, make)) in rt.iter().enumerate() {
                let mut probes = vec![];
                let mut probe_at = |n: usize| -> TractResult<bool> {
                    let inputs = move |s| chunk_inputs(model, s);
                    let (lat, turns) = match make {
                        Rt::Threads(make) => {
                            let system = make(n)?;
                            let lat =
                                laned_load::threads::real_time(system.clone(), n, period, probe, n as u64, inputs)?;
                            (lat, system.downcast_ref::<LanedRunner>().map(|r| r.metrics()))
                        }
                        Rt::Tasks(make) => {
                            let system = make(n)?;
                            let turns = match &system {
                                TaskSystem::Ours(r) => Some(r.metrics()),
                                _ => None,
                            };
                            let lat = tasks::real_time(&tokio, &system, n, period, probe, n as u64, inputs)?;
                            let turns = match (&system, turns) {
                                (TaskSystem::Ours(r), Some(before)) => Some(r.metrics().delta(&before)),
                                _ => None,
                            };
                            (lat, turns)
                        }
                    };
                    let p99 = lat.quantile_us(0.99);
                    if rt_at.is_some() {
                        let occupancy = turns
                        .filter(|m| m.turns > 0)
                        .map(|m| {
                            format!(
                                ", {} turns, {:.1} seats a turn, turn time mean {} µs (p99 {} µs), queue wait p50 {} µs (p99 {} µs)",
                                m.turns,
                                m.seats as f64 / m.turns as f64,
                                m.turn_time.mean().as_micros(),
                                m.turn_time.p99().as_micros(),
                                m.queue_wait.p50().as_micros(),
                                m.queue_wait.p99().as_micros()
                            )
                        })
                        .unwrap_or_default();
                        eprintln!(
                            "{label}, {n} streams: p50 {} µs, p99 {p99} µs{occupancy}",
                            lat.quantile_us(0.5)
                        );
                    }
                    probes.push((n, lat.quantile_us(0.5), p99));
                    Ok(p99 as u128 <= budget.as_micros())
                };
                let cap = match rt_at {
                    Some(n) => laned_load::Capacity {
                        streams: if probe_at(n)? { n } else { 0 },
                        disputed: vec![],
                    },
                    None => laned_load::search_capacity(4, 4096, 8, probe_at)?,
                };
                let cap = cap.streams;
                found.record(ix, cap, &probes);
            }
        }
        for row in found.rows(rt.iter().map(|(label, _)| *label)) {
            println!("{row}");
        }
    }
    Ok(())
}
