//! `cargo xtask bench --model dtln` / `--model oww`: a real audio pipeline
//! of several models per stream served through one runner per model,
//! against a plain state per stream, side by side in one process. xtask
//! pins it to one core (`--cores`).
//!
//! - `dtln`: DTLN noise suppression, two explicit-state models per 8 ms
//!   shift of 128 samples (the testkit's `Denoiser` around them).
//! - `oww`: openWakeWord, three stateless models (mel spectrogram,
//!   embedding, "hey jarvis") per 80 ms chunk of 1280 samples (the
//!   testkit's `Windows` around them).
//!
//! A stream's whole pipeline (its frame loop and one state per model) is a
//! `Runnable` here, fed one chunk of audio at a time, so the closed loop and
//! the real-time search of `laned_bench::load` drive it as they drive one
//! model.

use std::sync::Arc;
use std::time::Duration;

use laned_bench::load;
use laned_runner::{LanedRunner, Mode, RunnerConfig, StatePair, StateSpec, TurnPolicy};
use laned_testkit::dtln::{self, Denoiser};
use laned_testkit::oww::{self, Windows};
use laned_testkit::sound::{self, Sound};
use tract_core::internal::*;

const HELP: &str = "\
audio-bench --model dtln|oww [--streams 64] [--seconds 2] [--repeats 3] [--skip-real-time] [--quick]

Closed loop (a thread per stream, each sending its next chunk once answered):
chunks/s of a state per stream (a thread each) and of ours (a runner per
model) in both modes and with a shard per core, and how many streams' real
time that is. Real time: a chunk every period per stream (8 ms for dtln,
80 ms for oww); capacity is the most streams with p99 latency within half
the period.
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
    streams: usize,
    seconds: f64,
    repeats: usize,
    real_time: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        model: Model::Dtln,
        streams: 64,
        seconds: 2.0,
        repeats: 3,
        real_time: true,
    };
    let mut model = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--model" => {
                model = Some(match value("--model")?.as_str() {
                    "dtln" => Model::Dtln,
                    "oww" => Model::Oww,
                    other => return Err(format!("--model {other:?}: dtln or oww")),
                })
            }
            "--streams" => a.streams = value("--streams")?.parse().map_err(|e| format!("--streams: {e}"))?,
            "--seconds" => a.seconds = value("--seconds")?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--repeats" => a.repeats = value("--repeats")?.parse().map_err(|e| format!("--repeats: {e}"))?,
            "--skip-real-time" => a.real_time = false,
            "--quick" => {
                a.seconds = 0.5;
                a.repeats = 1;
            }
            "--help" | "-h" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n\n{HELP}")),
        }
    }
    a.model = model.ok_or(format!("--model is required\n\n{HELP}"))?;
    Ok(a)
}

/// Stream `s`'s next chunk: noisy speech-like audio (the models' cost does
/// not depend on the sound), the same chunk every time.
fn chunk_inputs(model: Model, s: usize) -> TVec<TValue> {
    let audio = sound::samples(Sound::NoisyBuzz, s as u64 * 2 + 1, model.chunk());
    tvec!(tensor1(&audio).into_tvalue())
}

/// A model run on a plain state, its explicit state (output 1) fed back by
/// hand as its last input: what a user without lanes writes for DTLN.
#[derive(Debug)]
struct FeedBack(Arc<dyn Runnable>);

#[derive(Debug, Clone)]
struct FeedBackState {
    state: Box<dyn State>,
    lstm: TValue,
}

impl State for FeedBackState {
    fn run(&mut self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let mut all = inputs;
        all.push(self.lstm.clone());
        let mut out = self.state.run(all)?;
        self.lstm = out.remove(1);
        Ok(out)
    }
    fn runnable(&self) -> &dyn Runnable {
        self.state.runnable()
    }
}

impl Runnable for FeedBack {
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        Ok(Box::new(FeedBackState {
            state: self.0.spawn()?,
            lstm: Tensor::zero::<f32>(&dtln::STATE_SHAPE)?.into_tvalue(),
        }))
    }
    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        self.0.typed_plan()
    }
    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        self.0.typed_model()
    }
}

/// A stream's whole pipeline: a state of each stage, and its frame loop or
/// feature windows. Input: one chunk of audio; output: DTLN's denoised
/// samples, or openWakeWord's score.
#[derive(Debug)]
struct Pipeline {
    model: Model,
    stages: Vec<Arc<dyn Runnable>>,
}

#[derive(Debug, Clone)]
enum Loop {
    Dtln(Box<Denoiser>),
    Oww(Box<Windows>),
}

#[derive(Debug, Clone)]
struct PipelineState {
    states: Vec<Box<dyn State>>,
    frames: Loop,
}

impl State for PipelineState {
    fn run(&mut self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let chunk = inputs[0].try_as_plain_ram()?.as_slice::<f32>()?;
        let states = &mut self.states;
        let out = match &mut self.frames {
            Loop::Dtln(denoiser) => {
                let [one, two] = &mut states[..] else {
                    bail!("DTLN has two stages")
                };
                tensor1(&denoiser.process(chunk, |i| one.run(i), |i| two.run(i))?)
            }
            Loop::Oww(windows) => {
                let [mel, embedding, classifier] = &mut states[..] else {
                    bail!("openWakeWord has three stages")
                };
                tensor1(&[windows.process(chunk, |i| mel.run(i), |i| embedding.run(i), |i| classifier.run(i))?])
            }
        };
        Ok(tvec!(out.into_tvalue()))
    }
    fn runnable(&self) -> &dyn Runnable {
        self.states[0].runnable()
    }
}

impl Runnable for Pipeline {
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        Ok(Box::new(PipelineState {
            states: self.stages.iter().map(|s| s.spawn()).collect::<TractResult<_>>()?,
            frames: match self.model {
                Model::Dtln => Loop::Dtln(Box::default()),
                Model::Oww => Loop::Oww(Box::default()),
            },
        }))
    }
    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        self.stages[0].typed_plan()
    }
    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        self.stages[0].typed_model()
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
        let stages = self
            .plans
            .iter()
            .map(|p| match self.model {
                Model::Dtln => Arc::new(FeedBack(p.clone())) as Arc<dyn Runnable>,
                Model::Oww => p.clone(),
            })
            .collect();
        Arc::new(Pipeline {
            model: self.model,
            stages,
        })
    }

    /// Ours: a runner per model, on `shards` states of `n / shards` lanes.
    fn ours(&self, n: usize, shards: usize, mode: Mode, budget: Option<Duration>) -> TractResult<Arc<dyn Runnable>> {
        let states = [dtln::STATE_1, dtln::STATE_2];
        let stages = self
            .plans
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
                Ok(Arc::new(LanedRunner::new(plan.clone(), config.build())?) as Arc<dyn Runnable>)
            })
            .collect::<TractResult<_>>()?;
        Ok(Arc::new(Pipeline {
            model: self.model,
            stages,
        }))
    }
}

fn load_models(model: Model) -> Result<(Models, String), String> {
    let prepare = |m: TractResult<TypedModel>| -> Result<Arc<dyn Runnable>, String> {
        let m = m.map_err(|e| format!("{e:#}"))?;
        Ok(DefaultRuntime.prepare(m).map_err(|e| format!("{e:#}"))?.into())
    };
    Ok(match model {
        Model::Dtln => {
            let files = dtln::fetch()?;
            let plans = vec![
                prepare(dtln::load_model_1(&files.model_1))?,
                prepare(dtln::load_model_2(&files.model_2))?,
            ];
            let what = format!("DTLN ({}, {})", files.model_1.display(), files.model_2.display());
            (Models { model, plans }, what)
        }
        Model::Oww => {
            let files = oww::fetch()?;
            let plans = oww::plans(&files).map_err(|e| format!("{e:#}"))?.to_vec();
            let what = format!("openWakeWord ({}, ...)", files.classifier.display());
            (Models { model, plans }, what)
        }
    })
}

#[derive(Clone, Copy, Debug)]
enum System {
    Solo,
    Ours(Mode),
    /// Ours in worker mode with a shard per core.
    OursShards(usize),
}

impl System {
    fn label(self) -> &'static str {
        match self {
            System::Solo => "a state per stream per model, a thread each",
            System::Ours(Mode::Worker) => "ours (worker, a runner per model)",
            System::Ours(Mode::Combining) => "ours (combining, a runner per model)",
            System::OursShards(_) => "ours (worker, a shard per core)",
        }
    }
}

fn measure(system: System, models: &Models, n: usize, d: Duration) -> TractResult<f64> {
    let pipeline = match system {
        System::Solo => models.solo(),
        System::Ours(mode) => models.ours(n, 1, mode, None)?,
        System::OursShards(cores) => models.ours(n, cores, Mode::Worker, None)?,
    };
    let model = models.model;
    let run = load::closed_loop(
        n,
        d,
        move |s| Ok((pipeline.spawn()?, chunk_inputs(model, s))),
        |(state, inputs)| {
            state.run(inputs.clone())?;
            Ok(1)
        },
    )?;
    Ok(run.per_sec)
}

fn main() -> TractResult<()> {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let (models, what) = match load_models(args.model) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("the models are unavailable here: {why}");
            std::process::exit(3);
        }
    };
    let model = args.model;
    let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    let n = args.streams;
    let d = Duration::from_secs_f64(args.seconds);
    let period = model.period();
    println!(
        "{what}: {} models per chunk of {} samples ({} ms), {n} streams, {cores} core(s) available",
        models.plans.len(),
        model.chunk(),
        period.as_millis()
    );
    let systems = [
        System::Solo,
        System::Ours(Mode::Worker),
        System::Ours(Mode::Combining),
        System::OursShards(cores),
    ];
    let mut runs: Vec<Vec<f64>> = vec![vec![]; systems.len()];
    // Interleaved: every system once per repeat, so drift hits all alike.
    for _ in 0..args.repeats {
        for (ix, system) in systems.iter().enumerate() {
            runs[ix].push(measure(*system, &models, n, d)?);
        }
    }
    let rates: Vec<f64> = runs.iter().map(|r| load::median(r)).collect();
    println!(
        "\n## Closed loop, {n} streams (median of {} runs of {} s)\n",
        args.repeats, args.seconds
    );
    println!("| system | chunks/s | runs | / solo | streams' real time |");
    println!("|---|---|---|---|---|");
    for (ix, system) in systems.iter().enumerate() {
        let all: Vec<String> = runs[ix].iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "| {} | {:.0} | {} | {:.2}x | {:.0} |",
            system.label(),
            rates[ix],
            all.join(", "),
            rates[ix] / rates[0],
            rates[ix] * period.as_secs_f64()
        );
    }
    if args.real_time {
        let budget = period / 2;
        let probe = Duration::from_secs_f64((args.seconds * 1.5).max(1.0));
        println!(
            "\n## Real time: a chunk every {} ms per stream, capacity = most streams with p99 <= {} ms\n",
            period.as_millis(),
            budget.as_millis()
        );
        println!("| system | capacity | probes (streams: p99 ms) |");
        println!("|---|---|---|");
        type Make<'a> = dyn Fn(usize) -> TractResult<Arc<dyn Runnable>> + 'a;
        let solo = |_: usize| -> TractResult<Arc<dyn Runnable>> { Ok(models.solo()) };
        let no_linger = |n: usize| models.ours(n, 1, Mode::Worker, None);
        let budgeted = |n: usize| models.ours(n, 1, Mode::Worker, Some(budget));
        let sharded = |n: usize| models.ours(n, cores, Mode::Worker, Some(budget));
        let rt: [(&str, &Make<'_>); 4] = [
            ("a state per stream per model, a thread each", &solo),
            ("ours (worker, no linger)", &no_linger),
            ("ours (worker, latency budget half the period)", &budgeted),
            ("ours (a shard per core, latency budget half the period)", &sharded),
        ];
        for (label, make) in rt {
            let mut probes = vec![];
            let cap = load::search_capacity(4, 4096, 8, |n| {
                let lat = load::real_time_with(make(n)?, n, period, probe, n as u64, move |s| chunk_inputs(model, s))?;
                let p99 = lat.quantile_us(0.99);
                probes.push((n, p99));
                Ok(p99 as u128 <= budget.as_micros())
            })?
            .streams;
            let probes: Vec<String> = probes
                .iter()
                .map(|(n, p99)| format!("{n}: {:.1}", *p99 as f64 / 1000.0))
                .collect();
            println!("| {label} | {cap} | {} |", probes.join(", "));
        }
    }
    Ok(())
}
