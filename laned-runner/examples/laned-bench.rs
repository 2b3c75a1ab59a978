//! `cargo xtask bench`: ours vs tract's `LanedRunnable` vs the ideal loop vs
//! a state per stream, side by side in one process, on the built-in models.
//! Writes `target/laned-bench/report.md`, `report.json` and SVG plots.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use laned_runner::{LanedRunner, Mode, RunnerConfig};
use laned_testkit::fixtures::{self, Fixture, TdnnConfig};
use laned_testkit::load;
use serde::Serialize;
use tract_core::internal::*;

const HELP: &str = "\
laned-bench [--quick] [--model light|heavy|all] [--streams 1,4,16,64] [--out DIR]

  --quick        short runs (under two minutes on 2 cores)
  --model        which built-in TDNN(s) to measure (default: all)
  --streams      stream counts of the closed-loop scenario
  --out          where the report goes (default: target/laned-bench)
";

struct Args {
    quick: bool,
    models: Vec<(String, TdnnConfig)>,
    streams: Vec<usize>,
    out: PathBuf,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        quick: false,
        models: vec![("light".into(), TdnnConfig::light()), ("heavy".into(), TdnnConfig::heavy())],
        streams: vec![1, 4, 16, 64],
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/laned-bench"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--model" => match it.next().as_deref() {
                Some("light") => a.models.retain(|m| m.0 == "light"),
                Some("heavy") => a.models.retain(|m| m.0 == "heavy"),
                Some("all") => (),
                other => return Err(format!("--model takes light, heavy or all, not {other:?}")),
            },
            "--streams" => {
                let list = it.next().ok_or("--streams needs a list")?;
                a.streams = list.split(',').map(|s| s.trim().parse::<usize>().map_err(|e| format!("--streams {s:?}: {e}"))).collect::<Result<_, _>>()?;
            }
            "--out" => a.out = PathBuf::from(it.next().ok_or("--out needs a directory")?),
            "--help" | "-h" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n\n{HELP}")),
        }
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
}

const SYSTEMS: [System; 5] = [System::Solo, System::Ideal, System::Tract, System::OursWorker, System::OursCombining];

impl System {
    fn label(self) -> &'static str {
        match self {
            System::Solo => "a state per stream",
            System::Ideal => "ideal loop",
            System::Tract => "tract LanedRunnable",
            System::OursWorker => "ours (worker)",
            System::OursCombining => "ours (combining)",
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
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    machine_cores: usize,
    quick: bool,
    seconds_per_run: f64,
    repeats: usize,
    closed_loop: Vec<ClosedLoop>,
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

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn ours(plan: &Arc<dyn Runnable>, n: usize, mode: Mode) -> TractResult<(Arc<dyn Runnable>, LanedRunner)> {
    let runner = LanedRunner::new(plan.clone(), RunnerConfig::builder().max_lanes(n).mode(mode).linger(Duration::ZERO).build())?;
    Ok((Arc::new(runner.clone()), runner))
}

/// One measurement of `system` with `n` streams; returns pulses/s and the
/// mean occupancy where the system has turns.
fn measure(system: System, fixture: &Fixture, plan: &Arc<dyn Runnable>, n: usize, d: Duration) -> TractResult<(f64, Option<f64>)> {
    match system {
        System::Solo => Ok((load::solo_states(fixture, plan.clone(), n, d)?, None)),
        System::Ideal => Ok((load::ideal(fixture, plan.clone(), n, d)?, Some(n as f64))),
        System::Tract => {
            let tract = tract_core::lanes::LanedRunnable::wrap(plan.clone(), n)?;
            let before = tract.turns_and_seats();
            let rate = load::through(fixture, Arc::new(tract.clone()), n, d)?;
            let after = tract.turns_and_seats();
            let turns = (after.0 - before.0).max(1);
            Ok((rate, Some((after.1 - before.1) as f64 / turns as f64)))
        }
        System::OursWorker | System::OursCombining => {
            let mode = if system == System::OursWorker { Mode::Worker } else { Mode::Combining };
            let (runnable, runner) = ours(plan, n, mode)?;
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
    let d = Duration::from_secs_f64(seconds);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut progress = Progress { done: 0, total: args.models.len() * args.streams.len() * SYSTEMS.len() * repeats, started: Instant::now() };
    let mut rows: Vec<ClosedLoop> = vec![];
    for (name, config) in &args.models {
        let fixture = fixtures::tdnn(*config)?;
        let plan = fixture.runnable()?;
        for &n in &args.streams {
            let mut runs: Vec<Vec<f64>> = vec![vec![]; SYSTEMS.len()];
            let mut occupancy: Vec<Vec<f64>> = vec![vec![]; SYSTEMS.len()];
            // Interleaved: every system once per repeat, so drift hits all alike.
            for _ in 0..repeats {
                for (ix, system) in SYSTEMS.iter().enumerate() {
                    progress.step(&format!("closed loop {name} n={n} {}", system.label()));
                    let (rate, occ) = measure(*system, &fixture, &plan, n, d)?;
                    runs[ix].push(rate);
                    occupancy[ix].extend(occ);
                }
            }
            for (ix, system) in SYSTEMS.iter().enumerate() {
                let r = &runs[ix];
                rows.push(ClosedLoop {
                    model: name.clone(),
                    streams: n,
                    system: *system,
                    median: median(r),
                    min: r.iter().cloned().fold(f64::INFINITY, f64::min),
                    max: r.iter().cloned().fold(0.0, f64::max),
                    runs: r.clone(),
                    mean_occupancy: (!occupancy[ix].is_empty()).then(|| median(&occupancy[ix])),
                });
            }
        }
    }
    let report = Report { machine_cores: cores, quick: args.quick, seconds_per_run: seconds, repeats, closed_loop: rows };
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("report.json"), serde_json::to_string_pretty(&report)?)?;
    let md = markdown(&report);
    std::fs::write(args.out.join("report.md"), &md)?;
    for (name, _) in &args.models {
        std::fs::write(args.out.join(format!("throughput-{name}.svg")), throughput_svg(&report, name))?;
    }
    println!("{md}");
    println!("report: {}", args.out.join("report.md").display());
    Ok(())
}

fn markdown(r: &Report) -> String {
    let mut out = String::new();
    out += &format!(
        "# laned bench\n\n{} cores; closed loop, a thread per stream; {} repeats of {:.2} s, interleaved; median pulses/s (min..max); ratio = median / ideal's median; occ = mean seats per turn.\n\n",
        r.machine_cores, r.repeats, r.seconds_per_run
    );
    let mut models: Vec<&str> = r.closed_loop.iter().map(|c| c.model.as_str()).collect();
    models.dedup();
    for model in models {
        out += &format!("## {model} TDNN\n\n| streams | system | pulses/s | spread | / ideal | occ |\n|---|---|---|---|---|---|\n");
        let rows: Vec<&ClosedLoop> = r.closed_loop.iter().filter(|c| c.model == model).collect();
        for row in &rows {
            let ideal = rows.iter().find(|c| c.streams == row.streams && c.system == System::Ideal).map(|c| c.median).unwrap_or(f64::NAN);
            out += &format!(
                "| {} | {} | {:.0} | {:.0}..{:.0} | {:.2} | {} |\n",
                row.streams,
                row.system.label(),
                row.median,
                row.min,
                row.max,
                row.median / ideal,
                row.mean_occupancy.map(|o| format!("{o:.1}")).unwrap_or_default()
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
    let colors = ["#888888", "#000000", "#d62728", "#1f77b4", "#2ca02c"];
    let mut svg = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n");
    svg += &format!("<text x=\"{m}\" y=\"20\">{model} TDNN: pulses/s vs streams (closed loop)</text>\n");
    svg += &format!("<line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", h - m, w - m, h - m);
    svg += &format!("<line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n", h - m);
    for n in &streams {
        svg += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{n}</text>\n", x_of(*n), h - m + 16.0);
    }
    for k in 0..=4 {
        let v = max_y * k as f64 / 4.0;
        svg += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0}k</text>\n", m - 4.0, y_of(v) + 4.0, v / 1000.0);
    }
    for (ix, system) in SYSTEMS.iter().enumerate() {
        let points: Vec<String> = rows.iter().filter(|c| c.system == *system).map(|c| format!("{:.1},{:.1}", x_of(c.streams), y_of(c.median))).collect();
        svg += &format!("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n", colors[ix], points.join(" "));
        svg += &format!("<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n", w - m - 150.0, m + 14.0 * ix as f64, colors[ix], system.label());
    }
    svg + "</svg>\n"
}
