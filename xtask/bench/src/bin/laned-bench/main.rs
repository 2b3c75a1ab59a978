//! `cargo xtask bench`: ours vs tract's `LanedRunnable` vs the ideal loop vs
//! a state per stream, side by side in one process, on the built-in models.
//! Writes `target/laned-bench/report.md`, `report.json` and SVG plots.

mod tasks;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use laned_runner::{LanedRunner, Mode, RunnerConfig, TurnPolicy};
use laned_testkit::fixtures::{self, Fixture, TdnnConfig};
use laned_testkit::load;
use serde::Serialize;
use tract_core::internal::*;

const HELP: &str = "\
laned-bench [--quick] [--model light|heavy|all|PATH [--pulse P] [--symbol S]] [--streams 1,4,16,64] [--frame-ms F] [--out DIR]

  --quick        short runs (under two minutes on 2 cores)
  --model        which built-in TDNN(s) to measure (default: all), or a streaming model
                 in tract's NNEF format (batch symbol on axis 0), pulsified by --pulse
                 frames (default 4) on --symbol (default S)
  --streams      stream counts of the closed-loop scenario
  --systems      only these systems (comma-separated). Closed loop: solo, ideal, tract, worker,
                 combining, shards, combining-shards, ideal-shards, tract-tasks, async,
                 async-combining, async-shards (the ideal loop always runs);
                 real time: echo, solo, tract, worker, linger (both values), combining, budget,
                 budget-shards, tract-tasks, async, async-budget-shards
                 (tasks: streams as tokio tasks; tract's runner through spawn_blocking)
  --frame-ms     real-time scenario: milliseconds of signal per frame (default 2.5;
                 a pulse of 4 frames is then due every 10 ms)
  --seconds S    closed loop: seconds per run (default 1, --quick 0.25)
  --repeats R    closed loop: interleaved runs per system (default 5, --quick 3)
  --rt-max N     real time: the most streams a capacity search tries (default 2048)
  --skip-real-time
                 closed loop only
  --skip-closed-loop
                 real time only
  --out          where the report goes (default: target/laned-bench)
";

#[derive(Clone)]
enum Source {
    Tdnn(TdnnConfig),
    File {
        path: PathBuf,
        symbol: String,
        pulse: usize,
    },
}

impl Source {
    fn load(&self) -> TractResult<Fixture> {
        match self {
            Source::Tdnn(config) => fixtures::tdnn(*config),
            Source::File { path, symbol, pulse } => Fixture::from_file(path, symbol, *pulse),
        }
    }
}

struct Args {
    quick: bool,
    frame_ms: f64,
    real_time: bool,
    models: Vec<(String, Source)>,
    streams: Vec<usize>,
    systems: Vec<System>,
    /// Real-time systems by short name; `None`: all.
    rt_systems: Option<Vec<&'static str>>,
    /// Closed-loop seconds per run and runs per system, where given.
    seconds: Option<f64>,
    repeats: Option<usize>,
    rt_max: usize,
    out: PathBuf,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        quick: false,
        frame_ms: 2.5,
        real_time: true,
        models: vec![
            ("light TDNN".into(), Source::Tdnn(TdnnConfig::light())),
            ("heavy TDNN".into(), Source::Tdnn(TdnnConfig::heavy())),
        ],
        streams: vec![1, 4, 16, 64],
        systems: SYSTEMS.to_vec(),
        rt_systems: None,
        seconds: None,
        repeats: None,
        rt_max: 2048,
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/laned-bench"),
    };
    let (mut pulse, mut symbol) = (4usize, "S".to_string());
    let mut file: Option<PathBuf> = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--model" => match it.next().as_deref() {
                Some("light") => a.models.retain(|m| m.0.starts_with("light")),
                Some("heavy") => a.models.retain(|m| m.0.starts_with("heavy")),
                Some("all") => (),
                Some(path) => file = Some(PathBuf::from(path)),
                None => return Err("--model takes light, heavy, all or a path".into()),
            },
            "--pulse" => {
                let v = it.next().ok_or("--pulse needs a number")?;
                pulse = v.parse().map_err(|e| format!("--pulse {v:?}: {e}"))?;
            }
            "--symbol" => symbol = it.next().ok_or("--symbol needs a name")?,
            "--streams" => {
                let list = it.next().ok_or("--streams needs a list")?;
                a.streams = list
                    .split(',')
                    .map(|s| s.trim().parse::<usize>().map_err(|e| format!("--streams {s:?}: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            "--systems" => {
                let list = it.next().ok_or("--systems needs a list")?;
                let mut wanted = vec![System::Ideal];
                let mut rt = vec![];
                for name in list.split(',').map(str::trim) {
                    let closed = SYSTEMS.iter().find(|s| s.short() == name);
                    let real_time = RT_NAMES.iter().find(|n| **n == name);
                    if closed.is_none() && real_time.is_none() {
                        return Err(format!("--systems: no system {name:?}"));
                    }
                    wanted.extend(closed);
                    rt.extend(real_time);
                }
                a.systems = SYSTEMS.iter().filter(|s| wanted.contains(s)).copied().collect();
                a.rt_systems = Some(rt);
            }
            "--frame-ms" => {
                let v = it.next().ok_or("--frame-ms needs a number")?;
                a.frame_ms = v.parse().map_err(|e| format!("--frame-ms {v:?}: {e}"))?;
            }
            "--seconds" => {
                let v = it.next().ok_or("--seconds needs a number")?;
                a.seconds = Some(v.parse().map_err(|e| format!("--seconds {v:?}: {e}"))?);
            }
            "--repeats" => {
                let v = it.next().ok_or("--repeats needs a number")?;
                a.repeats = Some(v.parse().map_err(|e| format!("--repeats {v:?}: {e}"))?);
            }
            "--rt-max" => {
                let v = it.next().ok_or("--rt-max needs a number")?;
                a.rt_max = v.parse().map_err(|e| format!("--rt-max {v:?}: {e}"))?;
            }
            "--skip-real-time" => a.real_time = false,
            "--skip-closed-loop" => a.streams.clear(),
            "--out" => a.out = PathBuf::from(it.next().ok_or("--out needs a directory")?),
            "--help" | "-h" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n\n{HELP}")),
        }
    }
    if let Some(path) = file {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_else(|| "model".into());
        a.models = vec![(name, Source::File { path, symbol, pulse })];
    }
    Ok(a)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum System {
    Solo,
    Ideal,
    Tract,
    OursWorker,
    OursCombining,
    /// Ours in worker mode with a shard per core, the streams spread.
    OursShards,
    /// Ours in combining mode with a shard per core, the streams spread.
    OursCombiningShards,
    /// A laned state per core, each on its own thread, all lanes seated.
    IdealShards,
    /// tract's runner driven as a tokio user must: a task per stream, a
    /// `spawn_blocking` per call.
    TractTasks,
    /// Ours with a task per stream (`spawn_async`, `call_async`), worker
    /// mode, one shard.
    OursAsync,
    /// The same in combining mode (a task finding the state free runs the
    /// turn in its poll).
    OursAsyncCombining,
    /// Ours with a task per stream and the default shards (one per core).
    OursAsyncShards,
}

/// The real-time systems' short names (`RtSystem::short`).
const RT_NAMES: [&str; 11] = [
    "echo",
    "solo",
    "tract",
    "worker",
    "linger",
    "combining",
    "budget",
    "budget-shards",
    "tract-tasks",
    "async",
    "async-budget-shards",
];

const SYSTEMS: [System; 12] = [
    System::Solo,
    System::Ideal,
    System::Tract,
    System::OursWorker,
    System::OursCombining,
    System::OursShards,
    System::OursCombiningShards,
    System::IdealShards,
    System::TractTasks,
    System::OursAsync,
    System::OursAsyncCombining,
    System::OursAsyncShards,
];

impl System {
    /// The name `--systems` knows it by.
    fn short(self) -> &'static str {
        match self {
            System::Solo => "solo",
            System::Ideal => "ideal",
            System::Tract => "tract",
            System::OursWorker => "worker",
            System::OursCombining => "combining",
            System::OursShards => "shards",
            System::OursCombiningShards => "combining-shards",
            System::IdealShards => "ideal-shards",
            System::TractTasks => "tract-tasks",
            System::OursAsync => "async",
            System::OursAsyncCombining => "async-combining",
            System::OursAsyncShards => "async-shards",
        }
    }

    fn label(self) -> &'static str {
        match self {
            System::Solo => "a state per stream",
            System::Ideal => "ideal loop",
            System::Tract => "tract LanedRunnable",
            System::OursWorker => "ours (worker)",
            System::OursCombining => "ours (combining)",
            System::OursShards => "ours (worker, a shard per core)",
            System::OursCombiningShards => "ours (combining, a shard per core)",
            System::IdealShards => "shards ideal (a laned state per core)",
            System::TractTasks => "tract LanedRunnable (tasks, spawn_blocking per call)",
            System::OursAsync => "ours async (worker, tasks)",
            System::OursAsyncCombining => "ours async (combining, tasks)",
            System::OursAsyncShards => "ours async (worker, a shard per core, tasks)",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct ClosedLoop {
    model: String,
    streams: usize,
    system: System,
    /// Pulses per second, one figure per repeat.
    runs: Vec<f64>,
    median: f64,
    min: f64,
    max: f64,
    /// Mean seats per turn, for the laned runners.
    mean_occupancy: Option<f64>,
    /// Process CPU time (every thread) per pulse, microseconds, median of
    /// the repeats.
    cpu_us_per_pulse: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    machine_cores: usize,
    quick: bool,
    seconds_per_run: f64,
    repeats: usize,
    closed_loop: Vec<ClosedLoop>,
    real_time: Vec<RealTime>,
}

/// One system's real-time capacity: the most streams with p99 latency
/// within the budget, and every probe of the search.
#[derive(Debug, Clone, Serialize)]
struct RealTime {
    model: String,
    system: String,
    period_ms: f64,
    budget_ms: f64,
    /// The median of `capacities`; the probes are the median search's.
    capacity: usize,
    /// One capacity per repeat of the search, interleaved with the others'.
    capacities: Vec<usize>,
    probes: Vec<Probe>,
    /// Latencies (µs, sorted, decimated to at most 200 points) at the capacity.
    cdf_at_capacity_us: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
struct Probe {
    streams: usize,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
    pulses: u64,
    /// Process CPU time per 1000 pulses served (all threads: the streams'
    /// and the runner's).
    cpu_ms_per_1k: Option<f64>,
    /// The same for the runner's own threads only (the worker threads, or
    /// tract's), where the system has such threads.
    runner_cpu_ms_per_1k: Option<f64>,
}

struct Progress {
    done: usize,
    total: usize,
    started: Instant,
}

impl Progress {
    fn step(&mut self, what: &str) {
        self.done += 1;
        let width = 30;
        let filled = width * self.done / self.total.max(1);
        eprint!(
            "\r[{}{}] {:>3}/{} {:>5.0}s {:<60}",
            "#".repeat(filled),
            "-".repeat(width - filled),
            self.done,
            self.total,
            self.started.elapsed().as_secs_f64(),
            what
        );
        let _ = std::io::stderr().flush();
        if self.done == self.total {
            eprintln!();
        }
    }
}

fn ours(
    plan: &Arc<dyn Runnable>,
    n: usize,
    mode: Mode,
    shards: usize,
) -> TractResult<(Arc<dyn Runnable>, LanedRunner)> {
    let runner = LanedRunner::new(
        plan.clone(),
        RunnerConfig::builder()
            .shards(shards)
            .max_lanes(n.div_ceil(shards))
            .mode(mode)
            .linger(Duration::ZERO)
            .build(),
    )?;
    Ok((Arc::new(runner.clone()), runner))
}

/// One measurement of `system` with `n` streams; returns pulses/s with
/// their CPU, and the mean occupancy where the system has turns.
fn measure(
    rt: &tokio::runtime::Runtime,
    system: System,
    fixture: &Fixture,
    plan: &Arc<dyn Runnable>,
    n: usize,
    d: Duration,
) -> TractResult<(load::Throughput, Option<f64>)> {
    let per_core = std::thread::available_parallelism()
        .map(|c| c.get())
        .unwrap_or(1)
        .min(n);
    match system {
        System::TractTasks => {
            let tract = tract_core::lanes::LanedRunnable::wrap(plan.clone(), n)?;
            let before = tract.turns_and_seats();
            let rate = tasks::closed_loop(
                rt,
                fixture,
                &tasks::TaskSystem::TractBlocking(Arc::new(tract.clone())),
                n,
                d,
            )?;
            let after = tract.turns_and_seats();
            let turns = (after.0 - before.0).max(1);
            Ok((rate, Some((after.1 - before.1) as f64 / turns as f64)))
        }
        System::OursAsync | System::OursAsyncCombining | System::OursAsyncShards => {
            let (mode, shards) = match system {
                System::OursAsync => (Mode::Worker, 1),
                System::OursAsyncCombining => (Mode::Combining, 1),
                _ => (Mode::Worker, per_core),
            };
            let (_, runner) = ours(plan, n, mode, shards)?;
            let before = runner.metrics();
            let rate = tasks::closed_loop(rt, fixture, &tasks::TaskSystem::Ours(runner.clone()), n, d)?;
            let delta = runner.metrics().delta(&before);
            Ok((rate, Some(delta.mean_occupancy())))
        }
        System::Solo => Ok((load::solo_states(fixture, plan.clone(), n, d)?, None)),
        System::Ideal => Ok((load::ideal(fixture, plan.clone(), n, d)?, Some(n as f64))),
        System::IdealShards => {
            let cores = std::thread::available_parallelism()
                .map(|c| c.get())
                .unwrap_or(1)
                .min(n);
            Ok((
                load::ideal_shards(fixture, plan.clone(), n, cores, d)?,
                Some((n / cores) as f64),
            ))
        }
        System::Tract => {
            let tract = tract_core::lanes::LanedRunnable::wrap(plan.clone(), n)?;
            let before = tract.turns_and_seats();
            let rate = load::through(fixture, Arc::new(tract.clone()), n, d)?;
            let after = tract.turns_and_seats();
            let turns = (after.0 - before.0).max(1);
            Ok((rate, Some((after.1 - before.1) as f64 / turns as f64)))
        }
        System::OursWorker | System::OursCombining | System::OursShards | System::OursCombiningShards => {
            let (mode, shards) = match system {
                System::OursWorker => (Mode::Worker, 1),
                System::OursCombining => (Mode::Combining, 1),
                System::OursShards => (Mode::Worker, per_core),
                _ => (Mode::Combining, per_core),
            };
            let (runnable, runner) = ours(plan, n, mode, shards)?;
            let before = runner.metrics();
            let rate = load::through(fixture, runnable, n, d)?;
            let delta = runner.metrics().delta(&before);
            Ok((rate, Some(delta.mean_occupancy())))
        }
    }
}

fn main() -> TractResult<()> {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let (seconds, repeats) = if args.quick { (0.25, 3) } else { (1.0, 5) };
    let (seconds, repeats) = (args.seconds.unwrap_or(seconds), args.repeats.unwrap_or(repeats).max(1));
    let d = Duration::from_secs_f64(seconds);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // The runtime the task systems run on, as a server's would: a worker
    // thread per core.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .enable_time()
        .build()?;
    let mut progress = Progress {
        done: 0,
        total: args.models.len() * args.streams.len() * args.systems.len() * repeats,
        started: Instant::now(),
    };
    let mut rows: Vec<ClosedLoop> = vec![];
    for (name, source) in &args.models {
        let fixture = source.load()?;
        let plan = fixture.runnable()?;
        for &n in &args.streams {
            let mut runs: Vec<Vec<f64>> = vec![vec![]; args.systems.len()];
            let mut occupancy: Vec<Vec<f64>> = vec![vec![]; args.systems.len()];
            let mut cpu: Vec<Vec<f64>> = vec![vec![]; args.systems.len()];
            // Interleaved: every system once per repeat, so drift hits all alike.
            for _ in 0..repeats {
                for (ix, system) in args.systems.iter().enumerate() {
                    progress.step(&format!("closed loop {name} n={n} {}", system.label()));
                    let (run, occ) = measure(&rt, *system, &fixture, &plan, n, d)?;
                    runs[ix].push(run.per_sec);
                    occupancy[ix].extend(occ);
                    cpu[ix].extend(run.cpu_per_pulse.map(|c| c.as_secs_f64() * 1e6));
                }
            }
            for (ix, system) in args.systems.iter().enumerate() {
                let r = &runs[ix];
                rows.push(ClosedLoop {
                    model: name.clone(),
                    streams: n,
                    system: *system,
                    median: load::median(r),
                    min: r.iter().cloned().fold(f64::INFINITY, f64::min),
                    max: r.iter().cloned().fold(0.0, f64::max),
                    runs: r.clone(),
                    mean_occupancy: (!occupancy[ix].is_empty()).then(|| load::median(&occupancy[ix])),
                    cpu_us_per_pulse: (!cpu[ix].is_empty()).then(|| load::median(&cpu[ix])),
                });
            }
        }
    }
    let mut real_time = vec![];
    if args.real_time {
        let (name, source) = args
            .models
            .iter()
            .find(|m| m.0.starts_with("light"))
            .cloned()
            .unwrap_or_else(|| args.models[0].clone());
        let fixture = source.load()?;
        let plan = fixture.runnable()?;
        let period = Duration::from_secs_f64(args.frame_ms * fixture.pulse as f64 / 1000.0);
        let budget = period / 2;
        let probe_time = if args.quick {
            Duration::from_millis(600)
        } else {
            Duration::from_secs(2)
        };
        let systems: Vec<(String, RtSystem)> = vec![
            ("echo (no model: the load generator alone)".into(), RtSystem::Echo),
            ("a state per stream (no runner)".into(), RtSystem::Solo),
            ("tract LanedRunnable (defaults)".into(), RtSystem::Tract),
            (
                "ours (worker, no linger)".into(),
                RtSystem::Ours(Mode::Worker, Duration::ZERO),
            ),
            (
                format!("ours (worker, linger {} µs)", (period / 20).as_micros()),
                RtSystem::Ours(Mode::Worker, period / 20),
            ),
            (
                format!("ours (worker, linger {} µs)", (period / 8).as_micros()),
                RtSystem::Ours(Mode::Worker, period / 8),
            ),
            (
                "ours (combining)".into(),
                RtSystem::Ours(Mode::Combining, Duration::ZERO),
            ),
            (
                format!("ours (worker, latency budget {} ms)", budget.as_secs_f64() * 1000.0),
                RtSystem::Budget(budget),
            ),
            (
                format!(
                    "ours (defaults: a shard per core; latency budget {} ms)",
                    budget.as_secs_f64() * 1000.0
                ),
                RtSystem::BudgetShards(budget),
            ),
            (
                "tract LanedRunnable (tasks, spawn_blocking per call; latency from send)".into(),
                RtSystem::TractTasks,
            ),
            (
                "ours async (worker, tasks, no linger; latency from send)".into(),
                RtSystem::Async,
            ),
            (
                format!(
                    "ours async (defaults: a shard per core; latency budget {} ms; tasks; latency from send)",
                    budget.as_secs_f64() * 1000.0
                ),
                RtSystem::AsyncBudgetShards(budget),
            ),
        ];
        let systems: Vec<(String, RtSystem)> = systems
            .into_iter()
            .filter(|(_, system)| {
                args.rt_systems
                    .as_ref()
                    .is_none_or(|only| only.contains(&system.short()))
            })
            .collect();
        let rt_repeats = if args.quick { 1 } else { 3 };
        let mut progress = Progress {
            done: 0,
            total: systems.len() * rt_repeats,
            started: Instant::now(),
        };
        // Interleaved: every system's search once per repeat, so drift hits
        // all alike; the median search is reported.
        let mut searches: Vec<Vec<RealTime>> = vec![vec![]; systems.len()];
        for repeat in 0..rt_repeats {
            for (ix, (label, system)) in systems.iter().enumerate() {
                progress.step(&format!("real time {name} #{}: capacity of {label}", repeat + 1));
                let scenario = RtScenario {
                    period,
                    budget,
                    probe_time,
                    max_streams: args.rt_max,
                };
                searches[ix].push(capacity(&rt, &fixture, &plan, &name, label, *system, &scenario)?);
            }
        }
        for mut runs in searches {
            let capacities: Vec<usize> = runs.iter().map(|r| r.capacity).collect();
            runs.sort_by_key(|r| r.capacity);
            let mut median = runs.swap_remove(runs.len() / 2);
            median.capacities = capacities;
            real_time.push(median);
        }
    }
    let report = Report {
        machine_cores: cores,
        quick: args.quick,
        seconds_per_run: seconds,
        repeats,
        closed_loop: rows,
        real_time,
    };
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("report.json"), serde_json::to_string_pretty(&report)?)?;
    let md = markdown(&report);
    std::fs::write(args.out.join("report.md"), &md)?;
    for (name, _) in &args.models {
        std::fs::write(
            args.out.join(format!(
                "throughput-{}.svg",
                name.split_whitespace().next().unwrap_or("model")
            )),
            throughput_svg(&report, name),
        )?;
    }
    if !report.real_time.is_empty() {
        std::fs::write(args.out.join("latency-cdf.svg"), cdf_svg(&report.real_time))?;
    }
    println!("{md}");
    println!("report: {}", args.out.join("report.md").display());
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum RtSystem {
    /// A state that hands its inputs back: the stream threads' own sleeping
    /// and waking, with no model and no runner behind them.
    Echo,
    /// A plain state per stream, run on the stream's own thread: no queue,
    /// no hand-off, no batching. What the load generator itself allows.
    Solo,
    Tract,
    Ours(Mode, Duration),
    /// Ours in worker mode under `TurnPolicy::LatencyBudget`, untuned.
    Budget(Duration),
    /// The same with the default shard count (one per core).
    BudgetShards(Duration),
    /// tract's runner with a task per stream, a `spawn_blocking` per call.
    TractTasks,
    /// Ours with a task per stream, worker mode, one shard, no linger.
    Async,
    /// Ours with a task per stream, the defaults and the latency budget.
    AsyncBudgetShards(Duration),
}

impl RtSystem {
    /// The name its runner gives its own threads, where it has threads that
    /// run every turn (not so in combining mode, where callers run turns).
    fn runner_threads(self) -> Option<&'static str> {
        match self {
            RtSystem::Tract => Some("tract-lanes"),
            RtSystem::Ours(Mode::Worker, _)
            | RtSystem::Budget(_)
            | RtSystem::BudgetShards(_)
            | RtSystem::Async
            | RtSystem::AsyncBudgetShards(_) => Some("laned-worker"),
            RtSystem::Echo | RtSystem::Solo | RtSystem::Ours(..) | RtSystem::TractTasks => None,
        }
    }

    /// The name `--systems` knows it by.
    fn short(self) -> &'static str {
        match self {
            RtSystem::Echo => "echo",
            RtSystem::Solo => "solo",
            RtSystem::Tract => "tract",
            RtSystem::Ours(Mode::Combining, _) => "combining",
            RtSystem::Ours(_, linger) if linger.is_zero() => "worker",
            RtSystem::Ours(..) => "linger",
            RtSystem::Budget(_) => "budget",
            RtSystem::BudgetShards(_) => "budget-shards",
            RtSystem::TractTasks => "tract-tasks",
            RtSystem::Async => "async",
            RtSystem::AsyncBudgetShards(_) => "async-budget-shards",
        }
    }
}

/// Facts of the model it stands for; its states hand their inputs back.
#[derive(Debug)]
struct Echo(Arc<dyn Runnable>);

#[derive(Debug, Clone)]
struct EchoState(Arc<dyn Runnable>);

impl State for EchoState {
    fn run(&mut self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        Ok(inputs)
    }
    fn runnable(&self) -> &dyn Runnable {
        &*self.0
    }
    fn input_count(&self) -> usize {
        self.0.input_count()
    }
    fn output_count(&self) -> usize {
        self.0.input_count()
    }
}

impl Runnable for Echo {
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        Ok(Box::new(EchoState(self.0.clone())))
    }
    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        self.0.typed_plan()
    }
    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        self.0.typed_model()
    }
}

/// The task system a task-driven real-time `system` runs on, `None` for
/// the thread-driven ones.
fn rt_tasks(plan: &Arc<dyn Runnable>, system: RtSystem, n: usize) -> TractResult<Option<tasks::TaskSystem>> {
    Ok(match system {
        RtSystem::TractTasks => Some(tasks::TaskSystem::TractBlocking(Arc::new(
            tract_core::lanes::LanedRunnable::wrap(plan.clone(), n)?,
        ))),
        RtSystem::Async => Some(tasks::TaskSystem::Ours(LanedRunner::new(
            plan.clone(),
            RunnerConfig::builder().shards(1).max_lanes(n).build(),
        )?)),
        RtSystem::AsyncBudgetShards(budget) => {
            let shards = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
            Some(tasks::TaskSystem::Ours(LanedRunner::new(
                plan.clone(),
                RunnerConfig::builder()
                    .max_lanes(n.div_ceil(shards))
                    .policy(TurnPolicy::latency_budget(budget))
                    .build(),
            )?))
        }
        _ => None,
    })
}

fn rt_runnable(plan: &Arc<dyn Runnable>, system: RtSystem, n: usize) -> TractResult<Arc<dyn Runnable>> {
    Ok(match system {
        RtSystem::TractTasks | RtSystem::Async | RtSystem::AsyncBudgetShards(_) => {
            unreachable!("task systems run through rt_tasks")
        }
        RtSystem::Solo => plan.clone(),
        RtSystem::Echo => Arc::new(Echo(plan.clone())),
        RtSystem::Tract => Arc::new(tract_core::lanes::LanedRunnable::wrap(plan.clone(), n)?),
        RtSystem::Budget(budget) => Arc::new(LanedRunner::new(
            plan.clone(),
            RunnerConfig::builder()
                .shards(1)
                .max_lanes(n)
                .policy(TurnPolicy::latency_budget(budget))
                .build(),
        )?),
        RtSystem::BudgetShards(budget) => {
            let shards = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
            Arc::new(LanedRunner::new(
                plan.clone(),
                RunnerConfig::builder()
                    .max_lanes(n.div_ceil(shards))
                    .policy(TurnPolicy::latency_budget(budget))
                    .build(),
            )?)
        }
        RtSystem::Ours(mode, linger) => Arc::new(LanedRunner::new(
            plan.clone(),
            RunnerConfig::builder()
                .shards(1)
                .max_lanes(n)
                .mode(mode)
                .linger(linger)
                .build(),
        )?),
    })
}

/// What a real-time capacity search measures under.
struct RtScenario {
    /// Each stream sends a pulse this often.
    period: Duration,
    /// The p99 latency a probe must stay within.
    budget: Duration,
    /// How long each probe runs.
    probe_time: Duration,
    /// The most streams the search tries.
    max_streams: usize,
}

/// The most streams served with p99 latency within the budget: doubling from
/// 8 while within, then bisecting between the last within and the first over.
fn capacity(
    rt: &tokio::runtime::Runtime,
    fixture: &Fixture,
    plan: &Arc<dyn Runnable>,
    model: &str,
    label: &str,
    system: RtSystem,
    scenario: &RtScenario,
) -> TractResult<RealTime> {
    let RtScenario {
        period,
        budget,
        probe_time,
        max_streams,
    } = *scenario;
    let mut probes: Vec<(Probe, load::Latencies)> = vec![];
    let mut probe = |n: usize| -> TractResult<bool> {
        let task_system = rt_tasks(plan, system, n)?;
        let runnable = match task_system {
            Some(_) => None,
            None => Some(rt_runnable(plan, system, n)?),
        };
        let cpu_before = load::process_cpu_time();
        let runner_before = system.runner_threads().and_then(load::threads_cpu_time);
        let lat = match (&task_system, &runnable) {
            (Some(tasks), _) => tasks::real_time(rt, fixture, tasks, n, period, probe_time, n as u64)?,
            (None, Some(runnable)) => load::real_time(fixture, runnable.clone(), n, period, probe_time, n as u64)?,
            (None, None) => unreachable!(),
        };
        // Read while the runner (and so its threads) still lives.
        let runner_cpu = runner_before
            .zip(system.runner_threads().and_then(load::threads_cpu_time))
            .map(|(a, b)| b.saturating_sub(a));
        drop((runnable, task_system));
        let cpu = cpu_before
            .zip(load::process_cpu_time())
            .map(|(a, b)| b.saturating_sub(a));
        let p = Probe {
            streams: n,
            p50_us: lat.quantile_us(0.5),
            p99_us: lat.quantile_us(0.99),
            max_us: lat.quantile_us(1.0),
            pulses: lat.pulses,
            cpu_ms_per_1k: cpu.map(|c| c.as_secs_f64() * 1e6 / lat.pulses.max(1) as f64),
            runner_cpu_ms_per_1k: runner_cpu.map(|c| c.as_secs_f64() * 1e6 / lat.pulses.max(1) as f64),
        };
        let ok = p.p99_us as u128 <= budget.as_micros();
        probes.push((p, lat));
        Ok(ok)
    };
    let good = load::search_capacity(8, max_streams.max(8), 4, &mut probe)?;
    let cdf = probes
        .iter()
        .find(|(p, _)| p.streams == good)
        .map(|(_, lat)| {
            let step = (lat.sorted_us.len() / 200).max(1);
            lat.sorted_us.iter().step_by(step).copied().collect()
        })
        .unwrap_or_default();
    Ok(RealTime {
        model: model.into(),
        system: label.into(),
        period_ms: period.as_secs_f64() * 1000.0,
        budget_ms: budget.as_secs_f64() * 1000.0,
        capacity: good,
        capacities: vec![good],
        probes: probes.into_iter().map(|(p, _)| p).collect(),
        cdf_at_capacity_us: cdf,
    })
}

fn cdf_svg(rt: &[RealTime]) -> String {
    let (w, h, m) = (640.0, 400.0, 60.0);
    let max_x = rt
        .iter()
        .flat_map(|r| r.cdf_at_capacity_us.last().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let colors = [
        "#888888", "#d62728", "#1f77b4", "#9467bd", "#17becf", "#2ca02c", "#ff7f0e",
    ];
    let mut svg = svg_frame(
        w,
        h,
        m,
        &format!("latency CDF at each system's capacity (x: µs, up to {max_x:.0})"),
    );
    for (ix, r) in rt.iter().enumerate() {
        let n = r.cdf_at_capacity_us.len().max(1) as f64;
        let points: Vec<String> = r
            .cdf_at_capacity_us
            .iter()
            .enumerate()
            .map(|(i, us)| {
                format!(
                    "{:.1},{:.1}",
                    m + *us as f64 / max_x * (w - 2.0 * m),
                    h - m - (i + 1) as f64 / n * (h - 2.0 * m)
                )
            })
            .collect();
        let color = colors[ix % colors.len()];
        svg += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
            points.join(" ")
        );
        svg += &format!(
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{} ({} streams)</text>\n",
            w - m - 260.0,
            h - m - 20.0 - 14.0 * ix as f64,
            r.system,
            r.capacity
        );
    }
    svg + "</svg>\n"
}

fn markdown(r: &Report) -> String {
    let mut out = String::new();
    out += &format!(
        "# laned bench\n\n{} cores; closed loop, a thread per stream; {} repeats of {:.2} s, interleaved; median pulses/s (min..max); ratio = median / ideal's median; occ = mean seats per turn; CPU = process CPU time (every thread) per pulse, median.\n\n",
        r.machine_cores, r.repeats, r.seconds_per_run
    );
    let mut models: Vec<&str> = r.closed_loop.iter().map(|c| c.model.as_str()).collect();
    models.dedup();
    for model in models {
        out += &format!(
            "## {model}\n\n| streams | system | pulses/s | spread | / ideal | occ | CPU µs/pulse |\n|---|---|---|---|---|---|---|\n"
        );
        let rows: Vec<&ClosedLoop> = r.closed_loop.iter().filter(|c| c.model == model).collect();
        for row in &rows {
            let ideal = rows
                .iter()
                .find(|c| c.streams == row.streams && c.system == System::Ideal)
                .map(|c| c.median)
                .unwrap_or(f64::NAN);
            out += &format!(
                "| {} | {} | {:.0} | {:.0}..{:.0} | {:.2} | {} | {} |\n",
                row.streams,
                row.system.label(),
                row.median,
                row.min,
                row.max,
                row.median / ideal,
                row.mean_occupancy.map(|o| format!("{o:.1}")).unwrap_or_default(),
                row.cpu_us_per_pulse.map(|c| format!("{c:.1}")).unwrap_or_default()
            );
        }
        out += "\n";
    }
    if let Some(first) = r.real_time.first() {
        out += &format!(
            "## real time ({})\n\nEach stream sends one pulse every {:.1} ms from a random phase; capacity = most streams with p99 latency within {:.1} ms (doubling, then bisecting); the median of the searches (each listed), interleaved. Latencies at the median capacity point; CPU = process CPU time (every thread) per 1000 pulses, at 128 and 256 streams; runner threads = the same for the runner's own threads only (its workers; tract's worker), at 256 streams: what bounds the capacity once the callers have cores of their own.\n\n| system | capacity | searches | p50 ms | p99 ms | max ms | CPU ms/1k at 128 | at 256 | runner threads ms/1k at 256 |\n|---|---|---|---|---|---|---|---|---|\n",
            first.model, first.period_ms, first.budget_ms
        );
        for rt in &r.real_time {
            let at = rt.probes.iter().find(|p| p.streams == rt.capacity);
            let ms = |us: Option<u64>| {
                us.map(|u| format!("{:.2}", u as f64 / 1000.0))
                    .unwrap_or_else(|| "-".into())
            };
            let all: Vec<String> = rt.capacities.iter().map(|c| c.to_string()).collect();
            let cpu = |n: usize| {
                rt.probes
                    .iter()
                    .find(|p| p.streams == n)
                    .and_then(|p| p.cpu_ms_per_1k)
                    .map(|c| format!("{c:.0}"))
                    .unwrap_or_else(|| "-".into())
            };
            let runner_cpu = rt
                .probes
                .iter()
                .find(|p| p.streams == 256)
                .and_then(|p| p.runner_cpu_ms_per_1k)
                .map(|c| format!("{c:.1}"))
                .unwrap_or_else(|| "-".into());
            out += &format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                rt.system,
                rt.capacity,
                all.join(", "),
                ms(at.map(|p| p.p50_us)),
                ms(at.map(|p| p.p99_us)),
                ms(at.map(|p| p.max_us)),
                cpu(128),
                cpu(256),
                runner_cpu
            );
        }
        out += "\n";
    }
    out
}

fn throughput_svg(r: &Report, model: &str) -> String {
    let rows: Vec<&ClosedLoop> = r.closed_loop.iter().filter(|c| c.model == model).collect();
    let (w, h, m) = (640.0, 400.0, 60.0);
    let max_y = rows.iter().map(|c| c.median).fold(1.0, f64::max) * 1.1;
    let streams: Vec<usize> = {
        let mut s: Vec<usize> = rows.iter().map(|c| c.streams).collect();
        s.sort();
        s.dedup();
        s
    };
    let x_of = |n: usize| {
        let ix = streams.iter().position(|s| *s == n).unwrap_or(0) as f64;
        m + ix * (w - 2.0 * m) / ((streams.len().max(2) - 1) as f64)
    };
    let y_of = |v: f64| h - m - v / max_y * (h - 2.0 * m);
    let colors = [
        "#888888", "#000000", "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#8c564b", "#e377c2",
    ];
    let mut svg = svg_frame(w, h, m, &format!("{model}: pulses/s vs streams (closed loop)"));
    for n in &streams {
        svg += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{n}</text>\n",
            x_of(*n),
            h - m + 16.0
        );
    }
    for k in 0..=4 {
        let v = max_y * k as f64 / 4.0;
        svg += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0}k</text>\n",
            m - 4.0,
            y_of(v) + 4.0,
            v / 1000.0
        );
    }
    for (ix, system) in SYSTEMS.iter().enumerate() {
        let points: Vec<String> = rows
            .iter()
            .filter(|c| c.system == *system)
            .map(|c| format!("{:.1},{:.1}", x_of(c.streams), y_of(c.median)))
            .collect();
        if points.is_empty() {
            continue;
        }
        svg += &format!(
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
            colors[ix % colors.len()],
            points.join(" ")
        );
        svg += &format!(
            "<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n",
            w - m - 150.0,
            m + 14.0 * ix as f64,
            colors[ix % colors.len()],
            system.label()
        );
    }
    svg + "</svg>\n"
}

/// An SVG document of `w` x `h` with a title and the two axes, `m` the margin;
/// the caller adds its lines and closes it.
fn svg_frame(w: f64, h: f64, m: f64, title: &str) -> String {
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n"
    );
    svg += &format!("<text x=\"{m}\" y=\"20\">{title}</text>\n");
    svg += &format!(
        "<line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - m,
        w - m,
        h - m
    );
    svg += &format!(
        "<line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - m
    );
    svg
}
