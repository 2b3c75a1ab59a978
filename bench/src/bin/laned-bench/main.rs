//! `cargo xtask bench`: ours vs tract's `LanedRunnable` vs the ideal loop vs
//! a state per stream, side by side in one process, on the built-in models.
//! The ideal: the model as given on one plain batched tract state (the
//! fixture's plan, no lanes API, inputs pre-stacked; `laned_load::ideal`);
//! a row of ours above it is flagged in the report and said why.
//! Writes `target/laned-bench/report.md`, `report.json` and SVG plots;
//! `--compare A.json B.json` sets two reports side by side.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use laned_bench::progress::Progress;
use laned_bench::report::{self, ClosedLoop, Machine, Probe, RealTime, Report};
use laned_bench::{load, plot};
use laned_load::tasks;
use laned_runner::{LanedRunner, Mode, RunnerConfig, TurnPolicy};
use laned_testkit::fixtures::{self, Fixture, TdnnConfig};
use tract_core::internal::*;

const HELP: &str = "\
laned-bench [--quick] [--model light|heavy|tiny|all|PATH [--pulse P] [--symbol S]] [--streams 1,4,16,64] [--frame-ms F] [--out DIR]
laned-bench --compare A.json B.json

  --quick        short runs (about two minutes on 2 cores): the light TDNN only (unless
                 --model says otherwise), shorter runs and probes
  --model        which built-in TDNN(s) to measure (default: all: light and heavy; tiny:
                 W=8, pulse 1, where the runner's cost per call shows most), or a streaming model
                 in tract's NNEF format (batch symbol on axis 0), pulsified by --pulse
                 frames (default 4) on --symbol (default S)
  --streams      stream counts of the closed-loop scenario
  --systems      only these systems (comma-separated). Closed loop: solo, ideal, tract, worker,
                 combining, shards, combining-shards, ideal-shards, tract-tasks, async,
                 async-combining, async-shards, async-combining-shards (the ideal loop always
                 runs: the model as given on one plain batched tract state); linger and async-linger (worker, lingering 200 µs for every held lane)
                 only when named;
                 real time: echo, solo, tract, worker, linger (both values), combining, budget,
                 budget-shards, tract-tasks, async, async-budget-shards, async-combining-shards
                 (tasks: streams as tokio tasks; tract's runner through spawn_blocking)
  --frame-ms     real-time scenario: milliseconds of signal per frame (default 2.5;
                 a pulse of 4 frames is then due every 10 ms)
  --seconds S    closed loop: seconds per run (default 1, --quick 0.2)
  --repeats R    closed loop: interleaved runs per system (default 5, --quick 3)
  --rt-max N     real time: the most streams a capacity search tries (default 2048,
                 --quick 1024)
  --skip-real-time
                 closed loop only
  --skip-closed-loop
                 real time only
  --out          where the report goes (default: target/laned-bench)
  --compare A B  print every figure two reports share, with its ratio B / A, each one that
                 fell by more than its spread marked; exit 0, or 3 when one fell
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
        // The lingering systems only when asked: they answer one question
        // (do wider turns pay in the closed loop?), at 16 % more run time.
        systems: SYSTEMS
            .iter()
            .filter(|s| !matches!(s, System::OursLinger | System::OursAsyncLinger))
            .copied()
            .collect(),
        rt_systems: None,
        seconds: None,
        repeats: None,
        rt_max: 2048,
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/laned-bench"),
    };
    let (mut pulse, mut symbol) = (4usize, "S".to_string());
    let mut file: Option<PathBuf> = None;
    let (mut model_given, mut rt_max_given) = (false, false);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--model" => {
                model_given = true;
                match it.next().as_deref() {
                    Some("light") => a.models.retain(|m| m.0.starts_with("light")),
                    Some("heavy") => a.models.retain(|m| m.0.starts_with("heavy")),
                    Some("tiny") => a.models = vec![("tiny TDNN".into(), Source::Tdnn(TdnnConfig::tiny()))],
                    Some("all") => (),
                    Some(path) => file = Some(PathBuf::from(path)),
                    None => return Err("--model takes light, heavy, tiny, all or a path".into()),
                }
            }
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
                rt_max_given = true;
                let v = it.next().ok_or("--rt-max needs a number")?;
                a.rt_max = v.parse().map_err(|e| format!("--rt-max {v:?}: {e}"))?;
            }
            "--skip-real-time" => a.real_time = false,
            "--skip-closed-loop" => a.streams.clear(),
            "--out" => a.out = PathBuf::from(it.next().ok_or("--out needs a directory")?),
            "--compare" => {
                let (Some(x), Some(y)) = (it.next(), it.next()) else {
                    return Err("--compare needs two report.json paths".into());
                };
                let read = |p: &str| -> Result<Report, String> {
                    let text = std::fs::read_to_string(p).map_err(|e| format!("--compare: reading {p}: {e}"))?;
                    serde_json::from_str(&text).map_err(|e| format!("--compare: {p} is not a report: {e}"))
                };
                let comparison = report::compare(&read(&x)?, &read(&y)?);
                print!("{}", comparison.text);
                // A guard: a script (or CI) comparing against a stored
                // report fails when a figure fell past its spread.
                std::process::exit(if comparison.falls.is_empty() { 0 } else { 3 });
            }
            "--help" | "-h" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n\n{HELP}")),
        }
    }
    if a.quick && !model_given {
        a.models.retain(|m| m.0.starts_with("light"));
    }
    if a.quick && !rt_max_given {
        a.rt_max = 1024;
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// The ideal loop per core: a plain batched tract state per core, each
    /// on its own thread carrying its share of the streams, no lanes API.
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
    /// Ours with a task per stream, combining mode, a shard per core.
    OursAsyncCombiningShards,
    /// Ours, worker mode, one shard, a thread per stream, lingering up to
    /// [`CLOSED_LINGER`] for every held lane to have a seat queued.
    OursLinger,
    /// The same with a task per stream.
    OursAsyncLinger,
}

/// The linger of the closed loop's lingering systems: long enough for the
/// callers a turn just answered to come back (tens of µs), short against
/// a turn.
const CLOSED_LINGER: Duration = Duration::from_micros(200);

/// The real-time systems' short names (`RtSystem::short`).
const RT_NAMES: [&str; 12] = [
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
    "async-combining-shards",
];

const SYSTEMS: [System; 15] = [
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
    System::OursAsyncCombiningShards,
    System::OursLinger,
    System::OursAsyncLinger,
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
            System::OursAsyncCombiningShards => "async-combining-shards",
            System::OursLinger => "linger",
            System::OursAsyncLinger => "async-linger",
        }
    }

    fn label(self) -> &'static str {
        match self {
            System::Solo => "a state per stream",
            System::Ideal => "ideal (the model as given on one plain batched tract state)",
            System::Tract => "tract LanedRunnable",
            System::OursWorker => "ours (worker)",
            System::OursCombining => "ours (combining)",
            System::OursShards => "ours (worker, a shard per core)",
            System::OursCombiningShards => "ours (combining, a shard per core)",
            System::IdealShards => "shards ideal (a plain batched tract state per core)",
            System::TractTasks => "tract LanedRunnable (tasks, spawn_blocking per call)",
            System::OursAsync => "ours async (worker, tasks)",
            System::OursAsyncCombining => "ours async (combining, tasks)",
            System::OursAsyncShards => "ours async (worker, a shard per core, tasks)",
            System::OursAsyncCombiningShards => "ours async (combining, a shard per core, tasks)",
            System::OursLinger => "ours (worker, linger 200 µs)",
            System::OursAsyncLinger => "ours async (worker, linger 200 µs, tasks)",
        }
    }
}

fn ours_lingering(
    plan: &Arc<dyn Runnable>,
    n: usize,
    mode: Mode,
    shards: usize,
    linger: Duration,
) -> TractResult<(Arc<dyn Runnable>, LanedRunner)> {
    let runner = LanedRunner::new(
        plan.clone(),
        RunnerConfig::builder()
            .shards(shards)
            .max_lanes(n.div_ceil(shards))
            .mode(mode)
            .linger(linger)
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
) -> TractResult<(laned_load::Throughput, Option<f64>)> {
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
                &tasks::TaskSystem::TractBlocking(Arc::new(tract.clone())),
                n,
                d,
                |s| fixture.inputs(1, s as u64),
            )?;
            let after = tract.turns_and_seats();
            let turns = (after.0 - before.0).max(1);
            Ok((rate, Some((after.1 - before.1) as f64 / turns as f64)))
        }
        System::OursAsync
        | System::OursAsyncCombining
        | System::OursAsyncShards
        | System::OursAsyncCombiningShards
        | System::OursAsyncLinger => {
            let (mode, shards, linger) = match system {
                System::OursAsync => (Mode::Worker, 1, Duration::ZERO),
                System::OursAsyncCombining => (Mode::Combining, 1, Duration::ZERO),
                System::OursAsyncLinger => (Mode::Worker, 1, CLOSED_LINGER),
                System::OursAsyncCombiningShards => (Mode::Combining, per_core, Duration::ZERO),
                _ => (Mode::Worker, per_core, Duration::ZERO),
            };
            let (_, runner) = ours_lingering(plan, n, mode, shards, linger)?;
            let before = runner.metrics();
            let rate = tasks::closed_loop(rt, &tasks::TaskSystem::Ours(runner.clone()), n, d, |s| {
                fixture.inputs(1, s as u64)
            })?;
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
        System::OursWorker
        | System::OursCombining
        | System::OursShards
        | System::OursCombiningShards
        | System::OursLinger => {
            let (mode, shards, linger) = match system {
                System::OursWorker => (Mode::Worker, 1, Duration::ZERO),
                System::OursCombining => (Mode::Combining, 1, Duration::ZERO),
                System::OursShards => (Mode::Worker, per_core, Duration::ZERO),
                System::OursLinger => (Mode::Worker, 1, CLOSED_LINGER),
                _ => (Mode::Combining, per_core, Duration::ZERO),
            };
            let (runnable, runner) = ours_lingering(plan, n, mode, shards, linger)?;
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
    // Before any thread starts, so that every one inherits it.
    let nice = report::raise_priority();
    let (seconds, repeats) = if args.quick { (0.2, 3) } else { (1.0, 5) };
    let (seconds, repeats) = (args.seconds.unwrap_or(seconds), args.repeats.unwrap_or(repeats).max(1));
    let d = Duration::from_secs_f64(seconds);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // The runtime the task systems run on, as a server's would: a worker
    // thread per core.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .enable_time()
        .build()?;
    let mut machine = Machine::here();
    machine.nice = nice;
    let progress = Progress::new(
        "closed loop",
        args.models.len() * args.streams.len() * args.systems.len() * repeats,
    );
    let mut rows: Vec<ClosedLoop> = vec![];
    for (name, source) in &args.models {
        let fixture = source.load()?;
        let plan = fixture.runnable()?;
        for &n in &args.streams {
            let mut runs: Vec<Vec<f64>> = vec![vec![]; args.systems.len()];
            let mut occupancy: Vec<Vec<f64>> = vec![vec![]; args.systems.len()];
            let mut cpu: Vec<Vec<f64>> = vec![vec![]; args.systems.len()];
            // Interleaved: every system once per repeat, so drift hits all alike.
            for repeat in 0..repeats {
                for (ix, system) in args.systems.iter().enumerate() {
                    progress.step(format!(
                        "{name}, {n} streams, run {}/{repeats}: {}",
                        repeat + 1,
                        system.label()
                    ));
                    let (run, occ) = measure(&rt, *system, &fixture, &plan, n, d)?;
                    runs[ix].push(run.per_sec);
                    occupancy[ix].extend(occ);
                    cpu[ix].extend(run.cpu_per_pulse.map(|c| c.as_secs_f64() * 1e6));
                }
            }
            for (ix, system) in args.systems.iter().enumerate() {
                let r = &runs[ix];
                let (min, max) = laned_load::spread(r);
                rows.push(ClosedLoop {
                    model: name.clone(),
                    streams: n,
                    system: system.short().into(),
                    label: system.label().into(),
                    median: laned_load::median(r),
                    min,
                    max,
                    runs: r.clone(),
                    mean_occupancy: (!occupancy[ix].is_empty()).then(|| laned_load::median(&occupancy[ix])),
                    cpu_us_per_pulse: (!cpu[ix].is_empty()).then(|| laned_load::median(&cpu[ix])),
                });
            }
        }
    }
    progress.finish();
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
            Duration::from_millis(400)
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
                    "ours (a shard per core; latency budget {} ms)",
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
                    "ours async (a shard per core; latency budget {} ms; tasks; latency from send)",
                    budget.as_secs_f64() * 1000.0
                ),
                RtSystem::AsyncBudgetShards(budget),
            ),
            (
                "ours async (combining, a shard per core; tasks; latency from send)".into(),
                RtSystem::AsyncCombiningShards,
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
        let progress = Progress::new("real time", systems.len() * rt_repeats);
        // Interleaved: every system's search once per repeat, so drift hits
        // all alike; the median search is reported.
        let mut searches: Vec<Vec<RealTime>> = vec![vec![]; systems.len()];
        for repeat in 0..rt_repeats {
            for (ix, (label, system)) in systems.iter().enumerate() {
                progress.step(format!("{name}, search {}/{rt_repeats}: {label}", repeat + 1));
                let scenario = RtScenario {
                    period,
                    budget,
                    probe_time,
                    max_streams: args.rt_max,
                };
                searches[ix].push(capacity(&rt, &fixture, &plan, &name, label, *system, &scenario)?);
            }
        }
        progress.finish();
        for mut runs in searches {
            let capacities: Vec<usize> = runs.iter().map(|r| r.capacity).collect();
            let disputed = runs.iter().flat_map(|r| r.disputed.clone()).collect();
            let probes = runs.iter().flat_map(|r| r.probes.clone()).collect();
            runs.sort_by_key(|r| r.capacity);
            let mut median = runs.swap_remove(runs.len() / 2);
            median.capacities = capacities;
            median.disputed = disputed;
            median.probes = probes;
            real_time.push(median);
        }
    }
    let report = Report {
        machine,
        quick: args.quick,
        seconds_per_run: seconds,
        repeats,
        closed_loop: rows,
        real_time,
    };
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("report.json"), serde_json::to_string_pretty(&report)?)?;
    let md = report::markdown(&report);
    std::fs::write(args.out.join("report.md"), &md)?;
    for name in report.models() {
        let svg = plot::throughput(&report, name).map_err(|e| format_err!("plotting {name}: {e}"))?;
        std::fs::write(args.out.join(plot::throughput_file(name)), svg)?;
    }
    if !report.real_time.is_empty() {
        let cdf = plot::latency_cdf(&report).map_err(|e| format_err!("plotting the latency CDF: {e}"))?;
        std::fs::write(args.out.join("latency-cdf.svg"), cdf)?;
        let p99 = plot::p99_against_load(&report).map_err(|e| format_err!("plotting p99 against load: {e}"))?;
        std::fs::write(args.out.join("p99-against-load.svg"), p99)?;
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
    /// The same with a shard per core.
    BudgetShards(Duration),
    /// tract's runner with a task per stream, a `spawn_blocking` per call.
    TractTasks,
    /// Ours with a task per stream, worker mode, one shard, no linger.
    Async,
    /// Ours with a task per stream, a shard per core and the latency budget.
    AsyncBudgetShards(Duration),
    /// Ours with a task per stream, a shard per core, combining mode (the
    /// executor's threads run the turns), no linger.
    AsyncCombiningShards,
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
            RtSystem::Echo
            | RtSystem::Solo
            | RtSystem::Ours(..)
            | RtSystem::TractTasks
            | RtSystem::AsyncCombiningShards => None,
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
            RtSystem::AsyncCombiningShards => "async-combining-shards",
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
        RtSystem::AsyncBudgetShards(_) | RtSystem::AsyncCombiningShards => {
            let shards = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
            let (mode, policy) = match system {
                RtSystem::AsyncBudgetShards(budget) => (Mode::Worker, TurnPolicy::latency_budget(budget)),
                _ => (Mode::Combining, TurnPolicy::Immediate),
            };
            Some(tasks::TaskSystem::Ours(LanedRunner::new(
                plan.clone(),
                RunnerConfig::builder()
                    .shards(shards)
                    .max_lanes(n.div_ceil(shards))
                    .mode(mode)
                    .policy(policy)
                    .build(),
            )?))
        }
        _ => None,
    })
}

fn rt_runnable(plan: &Arc<dyn Runnable>, system: RtSystem, n: usize) -> TractResult<Arc<dyn Runnable>> {
    Ok(match system {
        RtSystem::TractTasks | RtSystem::Async | RtSystem::AsyncBudgetShards(_) | RtSystem::AsyncCombiningShards => {
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
                    .shards(shards)
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
    let mut probes: Vec<(Probe, laned_load::Latencies)> = vec![];
    let mut probe = |n: usize| -> TractResult<bool> {
        let task_system = rt_tasks(plan, system, n)?;
        let runnable = match task_system {
            Some(_) => None,
            None => Some(rt_runnable(plan, system, n)?),
        };
        let cpu_before = laned_load::process_cpu_time();
        let runner_before = system.runner_threads().and_then(laned_load::threads_cpu_time);
        let lat = match (&task_system, &runnable) {
            (Some(tasks), _) => tasks::real_time(rt, tasks, n, period, probe_time, n as u64, |s| {
                fixture.inputs(1, s as u64)
            })?,
            (None, Some(runnable)) => load::real_time(fixture, runnable.clone(), n, period, probe_time, n as u64)?,
            (None, None) => unreachable!(),
        };
        // Read while the runner (and so its threads) still lives.
        let runner_cpu = runner_before
            .zip(system.runner_threads().and_then(laned_load::threads_cpu_time))
            .map(|(a, b)| b.saturating_sub(a));
        drop((runnable, task_system));
        let cpu = cpu_before
            .zip(laned_load::process_cpu_time())
            .map(|(a, b)| b.saturating_sub(a));
        let p = Probe {
            streams: n,
            p50_us: lat.quantile_us(0.5),
            p99_us: lat.quantile_us(0.99),
            max_us: lat.quantile_us(1.0),
            pulses: lat.pulses(),
            cpu_ms_per_1k: cpu.map(|c| c.as_secs_f64() * 1e6 / lat.pulses().max(1) as f64),
            runner_cpu_ms_per_1k: runner_cpu.map(|c| c.as_secs_f64() * 1e6 / lat.pulses().max(1) as f64),
        };
        let ok = p.p99_us as u128 <= budget.as_micros();
        probes.push((p, lat));
        Ok(ok)
    };
    let found = laned_load::search_capacity(8, max_streams.max(8), 4, &mut probe)?;
    let good = found.streams;
    // A probe at the capacity that passed: the curve shown is one the
    // capacity was granted on.
    let granted = probes
        .iter()
        .find(|(p, _)| p.streams == good && p.p99_us as u128 <= budget.as_micros())
        .map(|(_, lat)| &lat.sorted_us[..]);
    let tail = granted
        .map(|sorted| report::tail_points(sorted, 200))
        .unwrap_or_default();
    Ok(RealTime {
        model: model.into(),
        short: system.short().into(),
        system: label.into(),
        period_ms: period.as_secs_f64() * 1000.0,
        budget_ms: budget.as_secs_f64() * 1000.0,
        capacity: good,
        capacities: vec![good],
        disputed: found.disputed,
        probes: probes.into_iter().map(|(p, _)| p).collect(),
        // Reports before `tail_at_capacity` kept this even decimation;
        // it is derived from the same latencies, so new ones leave it empty.
        cdf_at_capacity_us: vec![],
        tail_at_capacity: tail,
    })
}
