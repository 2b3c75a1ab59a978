//! `laned bench`: on the user's own model, does laning pay, and from how
//! many streams. Checked first as `laned check` checks it (a model it
//! refuses is not timed); then ours is compared with a state per
//! stream, bit for bit, on a few streams; then, for each stream count,
//! three systems run side by side, in turn, for `--repeats` rounds:
//!
//! 1. **a state per stream**: a thread per stream, each with its own plain
//!    state (explicit state fed back by hand): what a user without lanes
//!    runs;
//! 2. **the ideal loop** (ideal: the model as given on one plain batched
//!    tract state): a thread per core, each one plain state of the model
//!    as loaded, batched to its share of the streams, no lanes API, the
//!    explicit state fed back by hand, inputs pre-stacked: the ceiling
//!    batching can reach, with no queue at all (ours above it is flagged
//!    under the table, and said why);
//! 3. **ours**, as a user would run it, four ways: streams as threads and
//!    as tokio tasks, each in both modes (worker, combining; the default
//!    marked), a `LanedRunner` of a shard per core with the default
//!    config, so its turn width is the one it learns.
//!
//! Figures are calls per second (medians of the rounds); the verdict is
//! the smallest stream count from which ours, the best of the four at each
//! count, serves more than a state per stream at every count measured, and
//! names the way that did. With `--cores N` the process is pinned to N of
//! the CPUs it may use, so every system gets the same cores.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use laned_load::ideal::{Above, Batch};
use laned_load::tasks::{self, TaskSystem};
use laned_load::{median, threads, FeedBack, Throughput};
use laned_runner::{LanedRunner, Mode, RunnerConfig};
use tract_core::internal::*;

use crate::check::{self, Laned};
use crate::feed::Feed;
use crate::model::{self, Candidate};

/// What `laned bench` was asked.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub check: check::Args,
    /// Stream counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub streams: Vec<usize>,
    /// Cores to run on: the process is pinned to this many of the CPUs it
    /// may use, the ideal loop runs a thread per core and ours a shard per
    /// core.
    #[arg(long, default_value_t = 1)]
    pub cores: usize,
    /// Seconds each system runs per stream count and round.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Rounds; each figure is the median of its rounds.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
}

/// Streams and calls the exactness check runs.
const EXACT_STREAMS: usize = 4;
const EXACT_CALLS: u64 = 8;

pub fn run(args: &Args) -> ExitCode {
    match bench(args) {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("laned bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// How ours is driven: its streams as threads or as tasks, in a mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Way {
    pub tasks: bool,
    pub mode: Mode,
}

/// The four ways, in the table's order.
pub const WAYS: [Way; 4] = [
    Way {
        tasks: false,
        mode: Mode::Worker,
    },
    Way {
        tasks: false,
        mode: Mode::Combining,
    },
    Way {
        tasks: true,
        mode: Mode::Worker,
    },
    Way {
        tasks: true,
        mode: Mode::Combining,
    },
];

impl std::fmt::Display for Way {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.mode {
            Mode::Worker => "worker",
            _ => "combining",
        };
        let default = if self.mode == Mode::default() {
            ", the default"
        } else {
            ""
        };
        let streams = if self.tasks { "tasks" } else { "threads" };
        write!(f, "{streams}, {mode}{default}")
    }
}

/// One stream count's medians, calls per second.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub streams: usize,
    pub solo: f64,
    pub ideal: f64,
    /// Ours each way, in [`WAYS`]' order.
    pub ours: Vec<(Way, f64)>,
}

impl Row {
    /// Ours the best way at this count, and that way.
    pub fn best(&self) -> (Way, f64) {
        self.ours.iter().copied().fold(
            (WAYS[0], f64::NEG_INFINITY),
            |best, o| if o.1 > best.1 { o } else { best },
        )
    }
}

/// Whether laning pays, read off the rows.
#[derive(Debug, Clone, PartialEq)]
pub enum Pays {
    /// Ours serves more than a state per stream from this many streams on,
    /// at every count measured.
    From(usize),
    /// A state per stream served as much or more at the largest count.
    No,
}

/// The verdict on `rows` (any order).
pub fn pays(rows: &[Row]) -> Pays {
    let mut rows = rows.to_vec();
    rows.sort_by_key(|r| r.streams);
    let mut from = None;
    for row in rows.iter().rev() {
        if row.best().1 > row.solo {
            from = Some(row.streams);
        } else {
            break;
        }
    }
    from.map_or(Pays::No, Pays::From)
}

/// Pins this thread (and every thread it starts later) to `cores` of the
/// CPUs it may run on; returns them.
#[cfg(target_os = "linux")]
fn pin(cores: usize) -> TractResult<Vec<usize>> {
    // SAFETY: `cpu_set_t` is plain data, zeroed is the empty set; both
    // calls get its size and a pointer to it, live for the call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        ensure!(
            libc::sched_getaffinity(0, size, &mut set) == 0,
            "reading this process's CPUs: {}",
            std::io::Error::last_os_error()
        );
        let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|c| libc::CPU_ISSET(*c, &set))
            .collect();
        ensure!(
            cores <= allowed.len(),
            "--cores {cores}: this process may run on {} CPUs",
            allowed.len()
        );
        let mut pinned: libc::cpu_set_t = std::mem::zeroed();
        for c in &allowed[..cores] {
            libc::CPU_SET(*c, &mut pinned);
        }
        ensure!(
            libc::sched_setaffinity(0, size, &pinned) == 0,
            "pinning to CPUs {:?}: {}",
            &allowed[..cores],
            std::io::Error::last_os_error()
        );
        Ok(allowed[..cores].to_vec())
    }
}

#[cfg(not(target_os = "linux"))]
fn pin(_cores: usize) -> TractResult<Vec<usize>> {
    bail!("--cores pins the process on Linux only; run with --cores matching the machine's")
}

/// A stream's answers, call after call.
type Answers = Vec<TVec<TValue>>;

/// What the exactness check found: `None` bit for bit, else the largest
/// difference.
fn exact(runner: &LanedRunner, solo: &Arc<dyn Runnable>, feed: &Feed, streams: usize) -> TractResult<Option<f32>> {
    let runs = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..streams as u64)
            .map(|s| {
                scope.spawn(move || -> TractResult<(Answers, Answers)> {
                    let mut ours = runner.spawn_timeout(Duration::from_secs(30))?;
                    let mut alone = solo.spawn()?;
                    let mut got = vec![];
                    let mut want = vec![];
                    for call in 0..EXACT_CALLS {
                        let inputs = feed.inputs(&[s << 32 | call])?;
                        got.push(ours.call(inputs.clone())?);
                        want.push(alone.run(inputs)?);
                    }
                    Ok((got, want))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().map_err(|_| format_err!("an exactness stream panicked"))?)
            .collect::<TractResult<Vec<_>>>()
    })?;
    let mut worst: Option<f32> = None;
    for (got, want) in runs {
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            let Some((diff, _)) = crate::compare::difference(g, w) else {
                continue;
            };
            worst = Some(worst.map_or(diff, |d| d.max(diff)));
        }
    }
    Ok(worst)
}

/// A state per stream: a thread each.
fn solo(solo: &Arc<dyn Runnable>, feed: &Arc<Feed>, n: usize, d: Duration) -> TractResult<Throughput> {
    let (solo, feed) = (solo.clone(), feed.clone());
    threads::closed_loop(
        n,
        d,
        move |s| Ok((solo.spawn()?, feed.inputs(&[s as u64])?)),
        |(state, inputs)| state.run(inputs.clone()).map(|_| 1),
    )
}

/// The ideal loop (ideal: the model as given on one plain batched tract
/// state): a thread per core, each one plain state of the user's plan
/// (`plan`, as loaded: never the plan a runner serves, nothing lifted)
/// batched to its share of `n` streams, no lanes API (never seated nor
/// reset: the ops' state under tract's default seating, every row
/// together), inputs pre-stacked once (row `r` is stream `r`'s, as a
/// state per stream gets it), the explicit state fed back by hand
/// ([`laned_load::ideal`]).
fn ideal(plan: &Arc<dyn Runnable>, feed: &Arc<Feed>, n: usize, cores: usize, d: Duration) -> TractResult<Throughput> {
    let feed = feed.clone();
    laned_load::ideal::closed_loop(plan.clone(), n, cores, d, move |rows| {
        let streams: Vec<u64> = rows.clone().map(|r| r as u64).collect();
        Ok(Batch {
            inputs: feed.inputs(&streams)?,
            state: feed.state(rows.len())?,
        })
    })
}

/// Ours: a thread per stream calling a runner of a shard per core.
fn ours_threads(runner: &LanedRunner, feed: &Arc<Feed>, n: usize, d: Duration) -> TractResult<Throughput> {
    let (runner, feed) = (runner.clone(), feed.clone());
    threads::closed_loop(
        n,
        d,
        move |s| {
            Ok((
                runner.spawn_timeout(Duration::from_secs(30))?,
                feed.inputs(&[s as u64])?,
            ))
        },
        |(handle, inputs)| handle.call(inputs.clone()).map(|_| 1).map_err(Into::into),
    )
}

/// Ours: a tokio task per stream (a runtime of a thread per core) calling a
/// runner of a shard per core.
fn ours_tasks(
    rt: &tokio::runtime::Runtime,
    runner: &LanedRunner,
    feed: &Arc<Feed>,
    n: usize,
    d: Duration,
) -> TractResult<Throughput> {
    let inputs: Vec<TVec<TValue>> = (0..n as u64).map(|s| feed.inputs(&[s])).collect::<TractResult<_>>()?;
    tasks::closed_loop(rt, &TaskSystem::Ours(runner.clone()), n, d, |s| inputs[s].clone())
}

fn runner_for(
    plan: &Arc<dyn Runnable>,
    config: &RunnerConfig,
    n: usize,
    cores: usize,
    mode: Mode,
) -> TractResult<LanedRunner> {
    let mut config = config.clone();
    config.mode = mode;
    let shards = cores.clamp(1, n.max(1));
    config.shards = Some(shards);
    config.max_lanes = n.div_ceil(shards).max(1);
    LanedRunner::new(plan.clone(), config).map_err(|e| format_err!("starting the runner: {e}"))
}

/// The bench, printed as it goes.
pub fn bench(args: &Args) -> TractResult<ExitCode> {
    ensure!(args.cores > 0, "--cores: got 0, wanted a positive number");
    ensure!(
        !args.streams.is_empty() && args.streams.iter().all(|n| *n > 0),
        "--streams: got {:?}, wanted positive counts (1,4,16,64)",
        args.streams
    );
    ensure!(
        args.seconds > 0.0 && args.seconds.is_finite(),
        "--seconds: got {}, wanted a positive duration",
        args.seconds
    );
    ensure!(args.repeats > 0, "--repeats: got 0, wanted 1 or more");
    let fills = check::fills(&args.check.fills)?;
    let loaded: Candidate = model::load(&args.check.source)?;
    let plan = loaded.plan()?;
    let mut facts = loaded.facts.clone();
    let verdict = check::judge(&loaded, &plan, &fills, &mut facts);
    for fact in &facts {
        println!("{fact}");
    }
    let Laned { config, state, .. } = match verdict {
        Ok(laned) => laned,
        Err(why) => {
            println!("\ncannot be laned: {why}");
            return Ok(ExitCode::from(1));
        }
    };
    let feed = Arc::new(Feed::of(&loaded, &state, &fills)?);
    let alone: Arc<dyn Runnable> = if state.is_empty() {
        plan.clone()
    } else {
        Arc::new(FeedBack::pairs(plan.clone(), feed.state(1)?))
    };
    let cpus = pin(args.cores)?;
    println!("cores: {} (pinned to CPUs {cpus:?})", args.cores);
    let d = Duration::from_secs_f64(args.seconds);

    let streams = EXACT_STREAMS.min(*args.streams.iter().max().unwrap_or(&1)).max(1);
    let exactness = exact(
        &runner_for(&plan, &config, streams, args.cores, Mode::default())?,
        &alone,
        &feed,
        streams,
    )?;
    match exactness {
        None => println!(
            "exact: {streams} streams through ours, {EXACT_CALLS} calls each, got what a state per stream gets, bit for bit"
        ),
        Some(diff) => println!(
            "NOT EXACT: {streams} streams through ours, {EXACT_CALLS} calls each, differ from a state per stream by up to {diff:e}"
        ),
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.cores)
        .enable_all()
        .build()?;
    let mut rows = vec![];
    let mut above = vec![];
    println!(
        "\ncalls per second, medians of {} rounds of {:?}; ours each way (streams as threads or tasks, a mode),",
        args.repeats, d
    );
    println!("the best of the four compared; width: the turn width the default way learned (-: none, every queued stream sits):\n");
    let ways: Vec<String> = WAYS.iter().map(|w| format!("ours ({w})")).collect();
    println!(
        "| streams | a state per stream | ideal (the model as given on one plain batched tract state) | {} | best / a state per stream | best / ideal | width |",
        ways.join(" | ")
    );
    println!("|---:|---:|---:|{}---:|---:|---|", "---:|".repeat(WAYS.len()));
    for &n in &args.streams {
        let runners: Vec<LanedRunner> = WAYS
            .iter()
            .map(|w| runner_for(&plan, &config, n, args.cores, w.mode))
            .collect::<TractResult<_>>()?;
        let (mut s, mut i) = (vec![], vec![]);
        let mut o: Vec<Vec<f64>> = vec![vec![]; WAYS.len()];
        for _ in 0..args.repeats {
            s.push(solo(&alone, &feed, n, d)?.per_sec);
            i.push(ideal(&plan, &feed, n, args.cores, d)?.per_sec);
            for (k, (way, runner)) in WAYS.iter().zip(&runners).enumerate() {
                let got = if way.tasks {
                    ours_tasks(&rt, runner, &feed, n, d)?
                } else {
                    ours_threads(runner, &feed, n, d)?
                };
                o[k].push(got.per_sec);
            }
        }
        for (way, runs) in WAYS.iter().zip(&o) {
            if let Some(a) = Above::of(runs, &i) {
                above.push(format!(
                    "- {n} streams, ours ({way}) {} {:.0} calls/s against the ideal's {:.0}: {a}",
                    a.flag(),
                    median(runs),
                    median(&i)
                ));
            }
        }
        let row = Row {
            streams: n,
            solo: median(&s),
            ideal: median(&i),
            ours: WAYS.iter().copied().zip(o.iter().map(|v| median(v))).collect(),
        };
        let (_, best) = row.best();
        let default = WAYS
            .iter()
            .position(|w| w.tasks && w.mode == Mode::default())
            .expect("the default mode is a way");
        let width = runners[default]
            .learned_width()
            .iter()
            .map(|w| w.map_or("-".to_string(), |w| w.to_string()))
            .collect::<Vec<_>>()
            .join(",");
        let figures: Vec<String> = row.ours.iter().map(|(_, f)| format!("{f:.0}")).collect();
        println!(
            "| {n} | {:.0} | {:.0} | {} | {:.2} | {:.2} | {width} |",
            row.solo,
            row.ideal,
            figures.join(" | "),
            best / row.solo,
            best / row.ideal
        );
        rows.push(row);
    }
    if !above.is_empty() {
        println!("\nabove the ideal (the ideal is the ceiling: each is noise or a reason to find):");
        for line in &above {
            println!("{line}");
        }
    }
    println!();
    match pays(&rows) {
        Pays::From(n) => {
            let at = rows.iter().filter(|r| r.streams >= n).map(Row::best);
            let mut ways: Vec<String> = at.map(|(w, _)| w.to_string()).collect();
            ways.dedup();
            println!(
                "laning pays from {n} streams on {} core(s): ours ({}) serves more calls per second than a state per stream there and at every larger count measured",
                args.cores,
                ways.join("; ")
            )
        }
        Pays::No => {
            let last = rows.iter().max_by_key(|r| r.streams).cloned();
            let (way, ratio) = last
                .as_ref()
                .map_or((WAYS[0], f64::NAN), |r| (r.best().0, r.best().1 / r.solo));
            println!(
                "laning does not pay here on {} core(s): at {} streams ours at its best ({way}) serves {ratio:.2} of what a state per stream serves",
                args.cores,
                last.map_or(0, |r| r.streams)
            )
        }
    }
    Ok(if exactness.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(streams: usize, solo: f64, ours: f64) -> Row {
        Row {
            streams,
            solo,
            ideal: ours * 1.1,
            // The best way is the one that counts.
            ours: vec![(WAYS[0], ours / 2.0), (WAYS[3], ours), (WAYS[1], ours / 3.0)],
        }
    }

    /// The verdict is the smallest count from which ours leads at every
    /// larger one: a lead at 4 lost at 16 does not count.
    #[test]
    fn pays_from_the_count_where_ours_leads_for_good() {
        assert_eq!(
            pays(&[row(1, 10.0, 5.0), row(4, 10.0, 12.0), row(16, 10.0, 30.0)]),
            Pays::From(4)
        );
        assert_eq!(
            pays(&[row(16, 10.0, 30.0), row(1, 10.0, 5.0), row(4, 10.0, 9.0)]),
            Pays::From(16)
        );
        assert_eq!(
            pays(&[row(1, 10.0, 5.0), row(4, 10.0, 12.0), row(16, 10.0, 9.0)]),
            Pays::No
        );
        assert_eq!(pays(&[row(1, 10.0, 10.0)]), Pays::No);
        assert_eq!(pays(&[row(1, 10.0, 11.0), row(2, 10.0, 20.0)]), Pays::From(1));
    }
}
