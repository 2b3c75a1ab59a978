//! What a bench run found, as `report.json` keeps it: the machine, every
//! closed-loop run and every real-time search. Rendered as markdown tables
//! ([`markdown`]); two reports set side by side by [`compare`].

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use laned_load::Disputed;

/// A whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// `--quick` runs are short and noisier.
    pub quick: bool,
    /// Closed loop: seconds per run.
    pub seconds_per_run: f64,
    /// Closed loop: interleaved runs per system.
    pub repeats: usize,
    /// Closed loop: one row per model, stream count and system.
    pub closed_loop: Vec<ClosedLoop>,
    /// Real time: one capacity search summary per system.
    pub real_time: Vec<RealTime>,
}

/// The facts that make two reports comparable or not.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Machine {
    /// Cores this process may run on.
    pub cores: usize,
    /// `model name` of `/proc/cpuinfo`, where there is one.
    pub cpu_model: String,
    /// The commit the bench was built from (`git describe --always
    /// --dirty`), or `unknown` outside a checkout.
    pub commit: String,
    /// The tract-core version the bench links (from `Cargo.lock`).
    pub tract_version: String,
    /// The 1-minute load average when the run started: above the core
    /// count, something else was competing.
    pub load_average: Option<f64>,
    /// The bench's nice value (see [`raise_priority`]): -10 where it could
    /// raise its priority, 0 otherwise.
    #[serde(default)]
    pub nice: i32,
}

/// Raise this process's scheduling priority (nice -10) where the system
/// allows it (root, or `CAP_SYS_NICE`), before any thread is started, so
/// that every thread of the bench inherits it: a build or a browser
/// competing for the cores then slows the measured systems far less (the
/// kernel gives a nice -10 thread about nine times the CPU share of a nice
/// 0 one), and every system alike. Returns the nice value now in force.
pub fn raise_priority() -> i32 {
    let pid = std::process::id().to_string();
    let raised = std::process::Command::new("renice")
        .args(["-n", "-10", "-p", &pid])
        .output()
        .is_ok_and(|o| o.status.success());
    if raised {
        -10
    } else {
        0
    }
}

impl Machine {
    /// This machine, now.
    pub fn here() -> Machine {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let commit = std::process::Command::new("git")
            .args(["describe", "--always", "--dirty"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let load_average = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()));
        Machine {
            cores,
            cpu_model,
            commit,
            tract_version: tract_version().into(),
            load_average,
            nice: 0,
        }
    }
}

/// tract-core's version as the workspace's `Cargo.lock` pins it (read at
/// build time, so a binary carried elsewhere still knows it).
pub fn tract_version() -> &'static str {
    const LOCK: &str = include_str!("../../Cargo.lock");
    LOCK.split("[[package]]")
        .find(|p| p.contains("name = \"tract-core\""))
        .and_then(|p| p.lines().find(|l| l.starts_with("version = ")))
        .map(|l| l.trim_start_matches("version = ").trim_matches('"'))
        .unwrap_or("unknown")
}

/// One system at one stream count in the closed loop.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClosedLoop {
    /// The model measured.
    pub model: String,
    /// Streams, a thread or a task each.
    pub streams: usize,
    /// The system's short name (`--systems`); `ideal` is the reference.
    pub system: String,
    /// What the tables and plots call it.
    pub label: String,
    /// Pulses per second, one figure per repeat.
    pub runs: Vec<f64>,
    /// The median of `runs`.
    pub median: f64,
    /// The smallest of `runs`.
    pub min: f64,
    /// The largest of `runs`.
    pub max: f64,
    /// Mean seats per turn, for the laned runners.
    pub mean_occupancy: Option<f64>,
    /// Process CPU time (every thread) per pulse, microseconds, median of
    /// the repeats.
    pub cpu_us_per_pulse: Option<f64>,
}

/// One system's real-time capacity: the most streams with p99 latency
/// within the budget, and every probe of its searches.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RealTime {
    /// The model measured.
    pub model: String,
    /// The system's short name (`--systems`).
    pub short: String,
    /// What the tables and plots call it.
    pub system: String,
    /// Each stream sends a pulse this often.
    pub period_ms: f64,
    /// The p99 a probe must stay within.
    pub budget_ms: f64,
    /// The median of `capacities`.
    pub capacity: usize,
    /// One capacity per repeat of the search, interleaved with the others'.
    pub capacities: Vec<usize>,
    /// Counts whose probes disagreed, over every search.
    pub disputed: Vec<Disputed>,
    /// Every probe of every search.
    pub probes: Vec<Probe>,
    /// Latencies (µs, sorted, decimated evenly to at most 200 points) at
    /// the median capacity, as reports written before `tail_at_capacity`
    /// kept them; empty in new reports ([`RealTime::latency_points`] reads
    /// either).
    #[serde(default)]
    pub cdf_at_capacity_us: Vec<u64>,
    /// The same latencies as (fraction answered within, µs), spaced
    /// evenly on the tail's log scale ([`tail_points`]): the p99.9 and the
    /// worst are kept, which an even decimation drops. Empty in reports
    /// written before it.
    #[serde(default)]
    pub tail_at_capacity: Vec<(f64, u64)>,
}

/// At most `points` of `sorted` (µs, ascending) as (fraction answered
/// within, µs), spaced evenly in `-log10(1 - fraction)`: as many points
/// between p99 and p99.9 as between p0 and p90, and the worst always last.
/// The fraction of the `k`th of `n` latencies is `(k + 1) / (n + 1)`, so
/// that the worst one's tail `1 / (n + 1)` is finite on a log scale.
pub fn tail_points(sorted: &[u64], points: usize) -> Vec<(f64, u64)> {
    let n = sorted.len();
    if n == 0 || points == 0 {
        return vec![];
    }
    let top = ((n + 1) as f64).log10();
    let mut kept: Vec<usize> = (0..points)
        .map(|i| {
            let t = if points == 1 {
                top
            } else {
                top * i as f64 / (points - 1) as f64
            };
            let fraction = 1.0 - 10f64.powf(-t);
            ((fraction * (n + 1) as f64).ceil() as usize).clamp(1, n) - 1
        })
        .collect();
    kept.push(n - 1);
    kept.sort_unstable();
    kept.dedup();
    kept.into_iter()
        .map(|k| ((k + 1) as f64 / (n + 1) as f64, sorted[k]))
        .collect()
}

impl RealTime {
    /// The probes at the reported capacity that kept p99 within the budget:
    /// the only ones a capacity's latencies are read from (a count passed
    /// two probes of three, say, has a failed one too).
    pub fn passed_at_capacity(&self) -> Vec<&Probe> {
        let budget_us = self.budget_ms * 1000.0;
        self.probes
            .iter()
            .filter(|p| p.streams == self.capacity && p.p99_us as f64 <= budget_us)
            .collect()
    }

    /// The median (by p99) of [`RealTime::passed_at_capacity`]; `None` when
    /// no probe at the capacity passed (a capacity of 0, or a report that
    /// predates this rule).
    pub fn at_capacity(&self) -> Option<&Probe> {
        let mut passed = self.passed_at_capacity();
        passed.sort_by_key(|p| p.p99_us);
        passed.get(passed.len().saturating_sub(1) / 2).copied()
    }

    /// The latencies at capacity as (fraction answered within, µs):
    /// [`RealTime::tail_at_capacity`], or in an older report the even
    /// decimation.
    pub fn latency_points(&self) -> Vec<(f64, u64)> {
        if !self.tail_at_capacity.is_empty() {
            return self.tail_at_capacity.clone();
        }
        let n = self.cdf_at_capacity_us.len();
        self.cdf_at_capacity_us
            .iter()
            .enumerate()
            .map(|(k, us)| ((k + 1) as f64 / (n + 1) as f64, *us))
            .collect()
    }
}

/// One probe: `streams` streams at real-time cadence for a while.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Probe {
    /// Streams probed.
    pub streams: usize,
    /// Median latency, µs.
    pub p50_us: u64,
    /// 99th percentile latency, µs.
    pub p99_us: u64,
    /// Worst latency, µs.
    pub max_us: u64,
    /// Pulses served.
    pub pulses: u64,
    /// Process CPU time per 1000 pulses served (all threads: the streams'
    /// and the runner's).
    pub cpu_ms_per_1k: Option<f64>,
    /// The same for the runner's own threads only (the worker threads, or
    /// tract's), where the system has such threads.
    pub runner_cpu_ms_per_1k: Option<f64>,
}

impl Report {
    /// Models of the closed loop, in the order they ran.
    pub fn models(&self) -> Vec<&str> {
        let mut models: Vec<&str> = self.closed_loop.iter().map(|c| c.model.as_str()).collect();
        models.dedup();
        models
    }
}

fn ms(us: Option<u64>) -> String {
    us.map(|u| format!("{:.2}", u as f64 / 1000.0))
        .unwrap_or_else(|| "-".into())
}

/// Whether `row`, a served system, came out above its ideal (the shards
/// ideal for a system with a shard per core where the run has it, the
/// ideal loop otherwise), found by short name with `at`; with that ideal's
/// row. The references themselves and a state per stream are never
/// flagged.
fn above_its_ideal<'a>(
    row: &ClosedLoop,
    at: impl Fn(&str) -> Option<&'a ClosedLoop>,
) -> Option<(laned_load::ideal::Above, &'a ClosedLoop)> {
    if matches!(row.system.as_str(), "ideal" | "ideal-shards" | "solo") {
        return None;
    }
    let reference = if row.system.contains("shards") {
        at("ideal-shards").or_else(|| at("ideal"))
    } else {
        at("ideal")
    }?;
    laned_load::ideal::Above::of(&row.runs, &reference.runs).map(|a| (a, reference))
}

/// The report's tables, as `report.md` and the README show them. The
/// ideal: the model as given on one plain batched tract state (the
/// reference of `/ ideal`); a served system's row above its ideal is
/// flagged in that column and said why under the table.
pub fn markdown(r: &Report) -> String {
    let mut out = String::new();
    let m = &r.machine;
    let _ = writeln!(
        out,
        "# laned bench\n\n{} cores ({}); commit {}; tract-core {}; load average at start {}; nice {}.\n",
        m.cores,
        m.cpu_model,
        m.commit,
        m.tract_version,
        m.load_average.map(|l| format!("{l:.2}")).unwrap_or_else(|| "-".into()),
        m.nice
    );
    if !r.closed_loop.is_empty() {
        let _ = writeln!(
            out,
            "Closed loop, a thread (or a task) per stream; {} repeats of {:.2} s, interleaved; median pulses/s (min..max); / ideal = median / the ideal loop's median (ideal: the model as given on one plain batched tract state, no lanes API, inputs pre-stacked); occ = mean seats per turn; CPU = process CPU time (every thread) per pulse, median.\n",
            r.repeats, r.seconds_per_run
        );
    }
    for model in r.models() {
        let _ = writeln!(
            out,
            "## {model}\n\n| streams | system | pulses/s | spread | / ideal | occ | CPU µs/pulse |\n|---|---|---|---|---|---|---|"
        );
        let rows: Vec<&ClosedLoop> = r.closed_loop.iter().filter(|c| c.model == model).collect();
        let at = |streams: usize, system: &str| rows.iter().find(|c| c.streams == streams && c.system == system);
        let mut notes = vec![];
        for row in &rows {
            let ideal = at(row.streams, "ideal").map(|c| c.median).unwrap_or(f64::NAN);
            let above = above_its_ideal(row, |system| at(row.streams, system).copied());
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.0}..{:.0} | {:.2}{} | {} | {} |",
                row.streams,
                row.label,
                row.median,
                row.min,
                row.max,
                row.median / ideal,
                above.map(|(a, _)| format!(" {}", a.flag())).unwrap_or_default(),
                row.mean_occupancy.map(|o| format!("{o:.1}")).unwrap_or_default(),
                row.cpu_us_per_pulse.map(|c| format!("{c:.1}")).unwrap_or_default()
            );
            if let Some((a, reference)) = above {
                notes.push(format!(
                    "- {} streams, {}: over {} ({:.0} pulses/s): {a}",
                    row.streams, row.label, reference.label, reference.median
                ));
            }
        }
        if !notes.is_empty() {
            let _ = writeln!(out, "\nAbove the ideal:\n{}", notes.join("\n"));
        }
        out += "\n";
    }
    if let Some(first) = r.real_time.first() {
        let _ = writeln!(
            out,
            "## real time ({})\n\nEach stream sends one pulse every {:.1} ms from a random phase; capacity = most streams with p99 latency within {:.1} ms (doubling, then bisecting; a count is refused only when two of three probes miss). capacity = the median search; searches = every search's capacity; disputed = counts whose probes disagreed (passed/run). Latencies at the median capacity, from the probes there that passed (the median of them by p99; never one over the budget); CPU = process CPU time (every thread) per 1000 pulses at 128 and 256 streams; runner threads = the runner's own threads only, at 256 streams.\n\n| system | capacity | searches | disputed | p50 ms | p99 ms | max ms | CPU ms/1k at 128 | at 256 | runner threads ms/1k at 256 |\n|---|---|---|---|---|---|---|---|---|---|",
            first.model, first.period_ms, first.budget_ms
        );
        for rt in &r.real_time {
            let at = rt.at_capacity();
            let all: Vec<String> = rt.capacities.iter().map(|c| c.to_string()).collect();
            let disputed: Vec<String> = rt
                .disputed
                .iter()
                .map(|d| format!("{} ({}/{})", d.streams, d.passed, d.probes))
                .collect();
            let at_n = |n: usize, f: fn(&Probe) -> Option<f64>, digits: usize| {
                rt.probes
                    .iter()
                    .find(|p| p.streams == n)
                    .and_then(f)
                    .map(|c| format!("{c:.digits$}"))
                    .unwrap_or_else(|| "-".into())
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                rt.system,
                rt.capacity,
                all.join(", "),
                if disputed.is_empty() {
                    "-".into()
                } else {
                    disputed.join(", ")
                },
                ms(at.map(|p| p.p50_us)),
                ms(at.map(|p| p.p99_us)),
                ms(at.map(|p| p.max_us)),
                at_n(128, |p| p.cpu_ms_per_1k, 0),
                at_n(256, |p| p.cpu_ms_per_1k, 0),
                at_n(256, |p| p.runner_cpu_ms_per_1k, 1),
            );
        }
        out += "\n";
    }
    out
}

/// Every figure the two reports share, `b / a`: closed-loop medians by
/// model, streams and system; real-time capacities by system; each figure
/// that fell by more than its spread marked, and listed at the end. Machine
/// facts first, so a reader sees when the two ran on different ground.
pub fn compare(a: &Report, b: &Report) -> Comparison {
    let mut out = String::new();
    let mut falls = vec![];
    let _ = writeln!(out, "| | A | B |\n|---|---|---|");
    let (ma, mb) = (&a.machine, &b.machine);
    for (what, x, y) in [
        ("cores", ma.cores.to_string(), mb.cores.to_string()),
        ("CPU", ma.cpu_model.clone(), mb.cpu_model.clone()),
        ("commit", ma.commit.clone(), mb.commit.clone()),
        ("tract-core", ma.tract_version.clone(), mb.tract_version.clone()),
        ("quick", a.quick.to_string(), b.quick.to_string()),
    ] {
        let _ = writeln!(out, "| {what} | {x} | {y} |");
    }
    let mut shared = 0;
    let _ = writeln!(
        out,
        "\n## closed loop (pulses/s, median)\n\n| model | streams | system | A | B | B / A | |\n|---|---|---|---|---|---|---|"
    );
    for x in &a.closed_loop {
        if let Some(y) = b
            .closed_loop
            .iter()
            .find(|y| y.model == x.model && y.streams == x.streams && y.system == x.system)
        {
            shared += 1;
            let spread = (x.max - x.min).max(y.max - y.min);
            let fell = y.median < x.median - spread;
            if fell {
                falls.push(format!(
                    "closed loop, {} at {} streams, {}: {:.0} to {:.0} pulses/s (spread {:.0})",
                    x.model, x.streams, x.label, x.median, y.median, spread
                ));
            }
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {} |",
                x.model,
                x.streams,
                x.label,
                x.median,
                y.median,
                y.median / x.median,
                if fell { "**fell**" } else { "" }
            );
        }
    }
    let _ = writeln!(
        out,
        "\n## real time (capacity, streams)\n\n| model | system | A | B | B / A | |\n|---|---|---|---|---|---|"
    );
    for x in &a.real_time {
        if let Some(y) = b.real_time.iter().find(|y| y.model == x.model && y.short == x.short) {
            shared += 1;
            let range = |r: &RealTime| {
                let (lo, hi) = (r.capacities.iter().min(), r.capacities.iter().max());
                lo.zip(hi).map_or(0, |(lo, hi)| hi - lo)
            };
            let spread = range(x).max(range(y));
            let fell = y.capacity + spread < x.capacity;
            if fell {
                falls.push(format!(
                    "real time, {}, {}: {} to {} streams (spread {spread})",
                    x.model, x.system, x.capacity, y.capacity
                ));
            }
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.2} | {} |",
                x.model,
                x.system,
                x.capacity,
                y.capacity,
                y.capacity as f64 / x.capacity.max(1) as f64,
                if fell { "**fell**" } else { "" }
            );
        }
    }
    if shared == 0 {
        out += "\nThe two reports share no figure (other models, stream counts or systems).\n";
    }
    if falls.is_empty() {
        out += "\nNo figure fell by more than its spread.\n";
    } else {
        let _ = writeln!(out, "\n{} figures fell by more than their spread:", falls.len());
        for fall in &falls {
            let _ = writeln!(out, "- {fall}");
        }
    }
    Comparison { text: out, falls }
}

/// Two reports side by side ([`compare`]).
pub struct Comparison {
    /// The tables, as markdown.
    pub text: String,
    /// Each figure that fell from A to B by more than its spread (the
    /// larger of the two runs' ranges: closed loop, the repeats' min to
    /// max; real time, the searches' capacities), as a line.
    pub falls: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tail's points: the worst latency always kept, fractions rising
    /// and finite on the tail scale, as many points past p99 as below p90,
    /// at most the points asked (plus the worst); and an old report's even
    /// decimation read the same way.
    #[test]
    fn tail_points_keep_the_tail_and_the_worst() {
        let sorted: Vec<u64> = (1..=100_000).collect();
        let points = tail_points(&sorted, 200);
        assert!(points.len() <= 201 && points.len() > 150, "{}", points.len());
        assert_eq!(points.last().unwrap().1, 100_000, "the worst is kept");
        assert!(points.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        assert!(points.iter().all(|(f, _)| *f > 0.0 && *f < 1.0));
        let past_p99 = points.iter().filter(|(f, _)| *f > 0.99).count();
        let below_p90 = points.iter().filter(|(f, _)| *f < 0.9).count();
        assert!(
            past_p99 * 10 >= below_p90 * 9,
            "{past_p99} past p99 against {below_p90} below p90"
        );
        assert!(points.iter().any(|(f, _)| *f >= 0.9999), "the 99.99 % tail is drawn");
        assert_eq!(tail_points(&[], 200), vec![]);
        assert_eq!(tail_points(&[7], 200), vec![(0.5, 7)]);
        let old = RealTime {
            model: "m".into(),
            short: "s".into(),
            system: "s".into(),
            period_ms: 10.0,
            budget_ms: 5.0,
            capacity: 8,
            capacities: vec![8],
            disputed: vec![],
            probes: vec![],
            cdf_at_capacity_us: vec![10, 20, 30],
            tail_at_capacity: vec![],
        };
        assert_eq!(old.latency_points(), vec![(0.25, 10), (0.5, 20), (0.75, 30)]);
    }

    /// The tract version is found in the lock file, not defaulted.
    #[test]
    fn tract_version_comes_from_the_lock_file() {
        let v = tract_version();
        assert!(v.starts_with("0."), "{v}");
    }

    /// `compare` gives each shared figure's ratio and says when none is shared.
    #[test]
    fn compare_prints_ratios_of_shared_figures() {
        let row = |median: f64| ClosedLoop {
            model: "m".into(),
            streams: 4,
            system: "worker".into(),
            label: "ours (worker)".into(),
            runs: vec![median],
            median,
            min: median,
            max: median,
            mean_occupancy: None,
            cpu_us_per_pulse: None,
        };
        let report = |median: f64| Report {
            machine: Machine::default(),
            quick: true,
            seconds_per_run: 1.0,
            repeats: 1,
            closed_loop: vec![row(median)],
            real_time: vec![],
        };
        let text = compare(&report(100.0), &report(150.0)).text;
        assert!(
            text.contains("| m | 4 | ours (worker) | 100 | 150 | 1.50 |  |"),
            "{text}"
        );
        let mut other = report(1.0);
        other.closed_loop[0].streams = 8;
        assert!(compare(&report(1.0), &other).text.contains("share no figure"));
    }

    /// A figure is marked as fallen only when it fell by more than its
    /// spread, closed loop and real time alike.
    #[test]
    fn compare_marks_what_fell_past_its_spread() {
        let row = |median: f64, spread: f64| ClosedLoop {
            model: "m".into(),
            streams: 4,
            system: "worker".into(),
            label: "ours (worker)".into(),
            runs: vec![median - spread / 2.0, median, median + spread / 2.0],
            median,
            min: median - spread / 2.0,
            max: median + spread / 2.0,
            mean_occupancy: None,
            cpu_us_per_pulse: None,
        };
        let rt = |capacities: Vec<usize>| RealTime {
            model: "m".into(),
            short: "worker".into(),
            system: "ours".into(),
            period_ms: 10.0,
            budget_ms: 5.0,
            capacity: capacities[capacities.len() / 2],
            capacities,
            disputed: vec![],
            probes: vec![],
            cdf_at_capacity_us: vec![],
            tail_at_capacity: vec![],
        };
        let report = |row: ClosedLoop, rt: RealTime| Report {
            machine: Machine::default(),
            quick: true,
            seconds_per_run: 1.0,
            repeats: 3,
            closed_loop: vec![row],
            real_time: vec![rt],
        };
        let a = report(row(100.0, 10.0), rt(vec![500, 512, 520]));
        // Within the spread both ways: nothing fell.
        let within = compare(&a, &report(row(92.0, 4.0), rt(vec![490, 496, 500])));
        assert!(within.falls.is_empty(), "{}", within.text);
        assert!(within.text.contains("No figure fell"));
        // Past it: both marked and listed.
        let fell = compare(&a, &report(row(80.0, 4.0), rt(vec![380, 400, 410])));
        assert_eq!(fell.falls.len(), 2, "{}", fell.text);
        assert!(fell.text.contains("| 100 | 80 | 0.80 | **fell** |"), "{}", fell.text);
        assert!(fell.text.contains("| 512 | 400 | 0.78 | **fell** |"), "{}", fell.text);
    }

    /// A capacity's latencies come from its probes that passed: a failed
    /// probe at the same count (two of three passed) is never the one shown.
    #[test]
    fn latencies_at_capacity_come_from_passing_probes_only() {
        let probe = |streams: usize, p99_ms: f64| Probe {
            streams,
            p50_us: 1000,
            p99_us: (p99_ms * 1000.0) as u64,
            max_us: 20_000,
            pulses: 100,
            cpu_ms_per_1k: None,
            runner_cpu_ms_per_1k: None,
        };
        let rt = RealTime {
            model: "m".into(),
            short: "worker".into(),
            system: "ours".into(),
            period_ms: 10.0,
            budget_ms: 5.0,
            capacity: 64,
            capacities: vec![64],
            disputed: vec![],
            probes: vec![
                probe(32, 1.0),
                probe(64, 4.0),
                probe(64, 9.3),
                probe(64, 4.5),
                probe(128, 12.0),
            ],
            cdf_at_capacity_us: vec![],
            tail_at_capacity: vec![],
        };
        assert_eq!(rt.passed_at_capacity().len(), 2);
        assert_eq!(rt.at_capacity().map(|p| p.p99_us), Some(4000));
        let report = Report {
            machine: Machine::default(),
            quick: true,
            seconds_per_run: 1.0,
            repeats: 1,
            closed_loop: vec![],
            real_time: vec![rt],
        };
        let md = markdown(&report);
        assert!(md.contains("| ours | 64 | 64 | - | 1.00 | 4.00 |"), "{md}");
        assert!(!md.contains("9.30"), "{md}");
    }

    /// A served system above its ideal is flagged in the row (noise or
    /// not) and said under the table; a sharded one is held to the shards
    /// ideal; the references and a state per stream never are.
    #[test]
    fn markdown_flags_ours_above_its_ideal() {
        let row = |system: &str, runs: Vec<f64>| {
            let (min, max) = laned_load::spread(&runs);
            ClosedLoop {
                model: "m".into(),
                streams: 4,
                system: system.into(),
                label: format!("label {system}"),
                median: laned_load::median(&runs),
                runs,
                min,
                max,
                mean_occupancy: None,
                cpu_us_per_pulse: None,
            }
        };
        let report = Report {
            machine: Machine::default(),
            quick: true,
            seconds_per_run: 1.0,
            repeats: 3,
            closed_loop: vec![
                row("solo", vec![300.0, 300.0, 300.0]),
                row("ideal", vec![100.0, 110.0, 120.0]),
                row("ideal-shards", vec![200.0, 210.0, 220.0]),
                row("worker", vec![130.0, 131.0, 132.0]),
                row("combining", vec![112.0, 113.0, 114.0]),
                row("async", vec![90.0, 95.0, 99.0]),
                row("shards", vec![150.0, 160.0, 170.0]),
            ],
            real_time: vec![],
        };
        let md = markdown(&report);
        let line = |system: &str| {
            md.lines()
                .find(|l| l.contains(&format!("| label {system} |")))
                .unwrap_or_else(|| panic!("{system}: {md}"))
                .to_string()
        };
        assert!(line("worker").contains("| 1.19 (ABOVE IDEAL!) |"), "{md}");
        assert!(line("combining").contains("| 1.03 (above ideal) |"), "{md}");
        for quiet in ["async", "shards", "solo", "ideal", "ideal-shards"] {
            assert!(
                !line(quiet).contains("ideal)") && !line(quiet).contains("IDEAL"),
                "{quiet}: {md}"
            );
        }
        assert!(md.contains("Above the ideal:"), "{md}");
        assert!(
            md.contains("- 4 streams, label worker: over label ideal (110 pulses/s): above every round"),
            "{md}"
        );
        assert!(md.contains("- 4 streams, label combining: over label ideal (110 pulses/s): above the ideal's median but not its best round"), "{md}");
    }
}
