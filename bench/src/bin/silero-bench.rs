//! `cargo xtask bench --model silero`: Silero VAD (explicit state) served
//! through the runner against a state per stream and the ideal loop, side
//! by side in one process. xtask pins it to one core (`--cores`).

use std::sync::Arc;
use std::time::Duration;

use laned_bench::cli;
use laned_bench::searches::Searches;
use laned_load::ideal::Above;
use laned_load::tasks::{self, TaskSystem};
use laned_load::FeedBack;
use laned_models::silero::{self, Context, CHUNK, CONTEXT, SAMPLE_RATE};
use laned_runner::{LanedRunner, Mode, RunnerConfig, StatePair, StateSpec, TurnPolicy};
use tract_core::internal::*;

const HELP: &str = "\
silero-bench [--streams 64] [--seconds 2] [--repeats 3] [--skip-real-time] [--only 'WORDS|WORDS']
             [--searches 1]
silero-bench --model-path     (fetch the model, print its path, exit)

Closed loop (a thread per stream, each sending its next chunk once answered):
chunks/s of a state per stream (a thread each, and one thread cycling them),
the ideal loop (ideal: the model as given on one plain batched tract state,
one thread, no lanes API, inputs pre-stacked, the state fed back by hand)
and ours in both modes; then a state per core: the shards ideal loop (a
thread per core, each its share of the streams) and ours with a shard per
core; a row of ours above its ideal is flagged, and said why. Real time: a
chunk every 32 ms per stream; capacity is the most streams with p99
latency within 16 ms.
`--only 'combining|budget'` keeps the real-time systems whose label holds
one of the words; `--searches N` runs each search N times, interleaved
(the capacity is the median).
";

/// Stream `s`'s chunk: noise (the model's cost does not depend on the
/// sound), the last `CONTEXT` samples of the one before in front.
fn chunk_inputs(s: usize) -> TVec<TValue> {
    let mut rng = fastrand::Rng::with_seed(s as u64);
    let chunk: Vec<f32> = (0..CHUNK).map(|_| 0.1 * (rng.f32() * 2.0 - 1.0)).collect();
    Context::default().inputs(&chunk)
}

/// A state per stream, its explicit state fed back by hand.
fn per_stream(plan: Arc<dyn Runnable>) -> FeedBack {
    FeedBack::new(plan, zeros_state(1).into_tensor())
}

fn zeros_state(streams: usize) -> TValue {
    Tensor::zero::<f32>(&[2, streams, 128]).unwrap().into_tvalue()
}

/// Ours on `shards` states of `n / shards` lanes each (rounded up).
fn ours(
    plan: &Arc<dyn Runnable>,
    n: usize,
    shards: usize,
    mode: Mode,
    policy: Option<TurnPolicy>,
) -> TractResult<LanedRunner> {
    let mut config = RunnerConfig::builder()
        .state(StateSpec::Pairs(vec![StatePair::new("state", 1)]))
        .shards(shards)
        .max_lanes(n.div_ceil(shards))
        .mode(mode)
        .linger(Duration::ZERO);
    if let Some(policy) = policy {
        config = config.policy(policy);
    }
    Ok(LanedRunner::new(plan.clone(), config.build())?)
}

#[derive(Clone, Copy, Debug)]
enum System {
    SoloThreads,
    SoloOneThread,
    Ideal,
    /// The ideal loop on a thread per core, each its own plain batched
    /// state of its share of the `n` streams.
    IdealShards(usize),
    Ours(Mode),
    /// Ours in worker mode with a shard per core.
    OursShards(usize),
}

impl System {
    fn label(self) -> &'static str {
        match self {
            System::SoloThreads => "a state per stream, a thread each",
            System::SoloOneThread => "a state per stream, one thread cycling",
            System::Ideal => "ideal (the model as given on one plain batched tract state)",
            System::IdealShards(_) => "shards ideal (a plain batched tract state per core, a thread each)",
            System::OursShards(_) => "ours (worker, a shard per core)",
            System::Ours(Mode::Worker) => "ours (worker)",
            System::Ours(Mode::Combining) => "ours (combining)",
        }
    }
}

fn measure(system: System, plan: &Arc<dyn Runnable>, n: usize, d: Duration) -> TractResult<f64> {
    let plan = plan.clone();
    let run = match system {
        System::SoloThreads => {
            let solo = per_stream(plan);
            laned_load::threads::closed_loop(
                n,
                d,
                move |s| Ok((solo.spawn()?, chunk_inputs(s))),
                |(state, inputs)| state.run(inputs.clone()).map(|_| 1),
            )
        }
        System::SoloOneThread => {
            let solo = per_stream(plan);
            laned_load::threads::closed_loop(
                1,
                d,
                move |_| {
                    (0..n)
                        .map(|s| Ok((solo.spawn()?, chunk_inputs(s))))
                        .collect::<TractResult<Vec<_>>>()
                },
                |streams| {
                    for (state, inputs) in streams.iter_mut() {
                        state.run(inputs.clone())?;
                    }
                    Ok(streams.len() as u64)
                },
            )
        }
        System::Ideal => ideal(plan, 1, n, d),
        System::IdealShards(cores) => ideal(plan, cores, n, d),
        System::Ours(mode) => ours_loop(ours(&plan, n, 1, mode, None)?, n, d),
        System::OursShards(cores) => ours_loop(ours(&plan, n, cores, Mode::Worker, None)?, n, d),
    }?;
    Ok(run.per_sec)
}

/// The ideal loop (ideal: the model as given on one plain batched tract
/// state): `threads` threads, each one plain state of Silero's plan (as
/// prepared, never a runner's) carrying its share of `n` streams, no lanes
/// API, the chunks pre-stacked, the state fed back by hand
/// ([`laned_load::ideal`]).
fn ideal(plan: Arc<dyn Runnable>, threads: usize, n: usize, d: Duration) -> TractResult<laned_load::Throughput> {
    laned_load::ideal::closed_loop(plan, n, threads, d, |rows| {
        let chunks: Vec<TVec<TValue>> = rows.clone().map(chunk_inputs).collect();
        let parts: TVec<&Tensor> = chunks.iter().map(|r| &*r[0]).collect();
        Ok(laned_load::ideal::Batch {
            inputs: tvec!(
                Tensor::stack_tensors(0, &parts)?.into_tvalue(),
                tensor0(SAMPLE_RATE).into_tvalue()
            ),
            state: vec![(2, 1, zeros_state(rows.len()).into_tensor())],
        })
    })
}

/// A thread per stream calling `runner`.
fn ours_loop(runner: LanedRunner, n: usize, d: Duration) -> TractResult<laned_load::Throughput> {
    laned_load::threads::closed_loop(
        n,
        d,
        move |s| Ok((runner.try_spawn()?, chunk_inputs(s))),
        |(handle, inputs)| {
            handle.call(inputs.clone())?;
            Ok(1)
        },
    )
}

/// Builds the runnable serving `n` streams.
type MakeRunnable<'a> = dyn Fn(usize) -> TractResult<Arc<dyn Runnable>> + 'a;

fn main() -> TractResult<()> {
    if std::env::args().nth(1).as_deref() == Some("--model-path") {
        println!("{}", cli::model_or_exit(silero::fetch(), "Silero VAD").display());
        return Ok(());
    }
    let mut only: Vec<String> = vec![];
    let mut searches = 1usize;
    let args = cli::or_exit(cli::parse(std::env::args().skip(1), HELP, |flag, value| {
        if flag == "--searches" {
            searches = cli::number::<usize>(&value("--searches")?, "--searches")?.max(1);
            return Ok(true);
        }
        if flag != "--only" {
            return Ok(false);
        }
        only = value("--only")?.split('|').map(str::to_string).collect();
        Ok(true)
    }));
    let kept = |label: &str| only.is_empty() || only.iter().any(|w| label.contains(w.as_str()));
    let path = cli::model_or_exit(silero::fetch(), "Silero VAD");
    let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(silero::load(&path)?)?.into();
    let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    let n = args.streams;
    let d = Duration::from_secs_f64(args.seconds);
    println!(
        "Silero VAD ({}), {n} streams, {cores} core(s) available, chunk {CHUNK} samples (+{CONTEXT} context) = 32 ms",
        path.display()
    );
    let systems = [
        System::SoloThreads,
        System::SoloOneThread,
        System::Ideal,
        System::Ours(Mode::Worker),
        System::Ours(Mode::Combining),
        System::IdealShards(cores),
        System::OursShards(cores),
    ];
    let mut runs: Vec<Vec<f64>> = vec![vec![]; systems.len()];
    // Interleaved: every system once per repeat, so drift hits all alike.
    for _ in 0..args.repeats {
        for (ix, system) in systems.iter().enumerate() {
            runs[ix].push(measure(*system, &plan, n, d)?);
        }
    }
    let rates: Vec<f64> = runs.iter().map(|r| laned_load::median(r)).collect();
    let best_solo = rates[0].max(rates[1]);
    println!(
        "\n## Closed loop, {n} streams (median of {} runs of {} s)\n",
        args.repeats, args.seconds
    );
    let shards_ideal = rates[systems.len() - 2];
    println!("| system | chunks/s | runs | / best solo | / ideal | / shards ideal |");
    println!("|---|---|---|---|---|---|");
    let mut notes = vec![];
    for (ix, system) in systems.iter().enumerate() {
        let all: Vec<String> = runs[ix].iter().map(|r| format!("{r:.0}")).collect();
        // Ours against its own ideal: one state against the ideal loop,
        // a shard per core against the shards ideal.
        let above = match system {
            System::Ours(_) => Above::of(&runs[ix], &runs[2]),
            System::OursShards(_) => Above::of(&runs[ix], &runs[systems.len() - 2]),
            _ => None,
        };
        let flag = |mine: bool| match above {
            Some(a) if mine => format!(" {}", a.flag()),
            _ => String::new(),
        };
        println!(
            "| {} | {:.0} | {} | {:.2}x | {:.2}{} | {:.2}{} |",
            system.label(),
            rates[ix],
            all.join(", "),
            rates[ix] / best_solo,
            rates[ix] / rates[2],
            flag(matches!(system, System::Ours(_))),
            rates[ix] / shards_ideal,
            flag(matches!(system, System::OursShards(_)))
        );
        if let Some(a) = above {
            notes.push(format!("- {}: {a}", system.label()));
        }
    }
    if !notes.is_empty() {
        println!("\nAbove the ideal:\n{}", notes.join("\n"));
    }
    if args.real_time {
        let period = Duration::from_millis(32);
        let budget = period / 2;
        let probe = args.probe();
        println!(
            "\n## Real time: a chunk every 32 ms per stream, capacity = most streams with p99 <= {} ms\n",
            budget.as_millis()
        );
        println!("{}", Searches::HEADER);
        let per_stream = |_: usize| -> TractResult<Arc<dyn Runnable>> { Ok(Arc::new(per_stream(plan.clone()))) };
        let threads = |shards: usize, policy: Option<TurnPolicy>| {
            let plan = plan.clone();
            move |n: usize| -> TractResult<Arc<dyn Runnable>> {
                Ok(Arc::new(ours(&plan, n, shards, Mode::Worker, policy)?))
            }
        };
        let (no_linger, budgeted, sharded) = (
            threads(1, None),
            threads(1, Some(TurnPolicy::latency_budget(budget))),
            threads(cores, Some(TurnPolicy::latency_budget(budget))),
        );
        // Streams as tasks on a tokio runtime with a worker per core.
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores)
            .enable_time()
            .build()?;
        const SHARDED_THREADS: &str = "ours (a shard per core, latency budget 16 ms)";
        enum Rt<'a> {
            Threads(&'a MakeRunnable<'a>),
            /// Ours as tasks: shards, mode, policy.
            Tasks(usize, Mode, Option<TurnPolicy>),
        }
        // Combining: the executor's thread that finds the queue ready runs
        // the turn, so on one core no runner thread competes with it.
        let rt: Vec<(&str, Rt<'_>)> = vec![
            ("a state per stream, a thread each", Rt::Threads(&per_stream)),
            ("ours (worker, no linger)", Rt::Threads(&no_linger)),
            ("ours (worker, latency budget 16 ms)", Rt::Threads(&budgeted)),
            (SHARDED_THREADS, Rt::Threads(&sharded)),
            (
                "ours async (worker, no linger; tasks, latency from send)",
                Rt::Tasks(1, Mode::Worker, None),
            ),
            (
                "ours async (a shard per core, latency budget 16 ms; tasks, latency from send)",
                Rt::Tasks(cores, Mode::Worker, Some(TurnPolicy::latency_budget(budget))),
            ),
            (
                "ours async (combining, no linger; tasks, latency from send)",
                Rt::Tasks(1, Mode::Combining, None),
            ),
            (
                "ours async (combining, a shard per core, latency budget 16 ms; tasks, latency from send)",
                Rt::Tasks(cores, Mode::Combining, Some(TurnPolicy::latency_budget(budget))),
            ),
        ];
        // On one core a shard per core is one shard: the threads' system
        // would repeat the budgeted one.
        let rt: Vec<_> = rt
            .into_iter()
            .filter(|(label, _)| kept(label) && (cores > 1 || *label != SHARDED_THREADS))
            .collect();
        // Every system's search once per round, so drift hits all alike.
        let mut found = Searches::new(rt.len(), budget);
        for _ in 0..searches {
            for (ix, (_, system)) in rt.iter().enumerate() {
                let mut probes = vec![];
                let cap = laned_load::search_capacity(4, 4096, 8, |n| {
                    let lat = match system {
                        Rt::Threads(make) => {
                            laned_load::threads::real_time(make(n)?, n, period, probe, n as u64, chunk_inputs)?
                        }
                        Rt::Tasks(shards, mode, policy) => {
                            let system = TaskSystem::Ours(ours(&plan, n, *shards, *mode, *policy)?);
                            tasks::real_time(&tokio, &system, n, period, probe, n as u64, chunk_inputs)?
                        }
                    };
                    let p99 = lat.quantile_us(0.99);
                    probes.push((n, lat.quantile_us(0.5), p99));
                    Ok(p99 as u128 <= budget.as_micros())
                })?
                .streams;

                found.record(ix, cap, &probes);
            }
        }
        for row in found.rows(rt.iter().map(|(label, _)| *label)) {
            println!("{row}");
        }
    }
    Ok(())
}
