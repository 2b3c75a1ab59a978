//! Load generators for any runnable, for benchmarks: closed loop (a thread
//! per stream calling as fast as answered) and real time (a thread per
//! stream sending one pulse per period), plus the two references every
//! figure is compared with: a state per stream, and the ideal loop (one
//! thread, one laned state, every lane seated every turn, inputs
//! pre-stacked).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tract_core::internal::*;
use tract_core::plan::{LaneId, Seating};

use laned_testkit::fixtures::{Fixture, Lcg};

/// What a closed-loop run served.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// Pulses per second, all streams together.
    pub per_sec: f64,
    /// CPU time of the whole process (every thread: callers, runner,
    /// anything else running) per pulse over the timed part of the run;
    /// `None` where the platform does not tell.
    pub cpu_per_pulse: Option<Duration>,
}

/// Runs `n` threads, each with the state `setup` gives it, calling `step`
/// until `duration` has passed since they all started; returns pulses per
/// second and the CPU each cost. `step` returns the pulses it served.
pub fn closed_loop<S: Send + 'static>(
    n: usize,
    duration: Duration,
    setup: impl Fn(usize) -> TractResult<S> + Send + Sync + 'static,
    step: impl Fn(&mut S) -> TractResult<u64> + Send + Sync + 'static,
) -> TractResult<Throughput> {
    let setup = Arc::new(setup);
    let step = Arc::new(step);
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(n + 1));
    let threads: Vec<_> = (0..n)
        .map(|s| {
            let (setup, step, stop, total, ready) =
                (setup.clone(), step.clone(), stop.clone(), total.clone(), ready.clone());
            std::thread::spawn(move || -> TractResult<()> {
                let state = setup(s);
                ready.wait();
                // One untimed call to warm caches and buffers. A stream that
                // failed still reaches the second barrier, or the others
                // and the timer would wait for it forever.
                let warm = state.and_then(|mut state| step(&mut state).map(|_| state));
                ready.wait();
                let mut state = warm?;
                let mut served = 0;
                while !stop.load(Ordering::Relaxed) {
                    served += step(&mut state)?;
                }
                total.fetch_add(served, Ordering::Relaxed);
                // The state drops here, on this live thread.
                Ok(())
            })
        })
        .collect();
    ready.wait();
    // Taken before the release: the stream threads cannot count a pulse
    // before it, even when this thread is scheduled late after the barrier.
    let started = Instant::now();
    let cpu_before = process_cpu_time();
    ready.wait();
    std::thread::sleep(duration);
    // Read before the stop: what the threads spend stopping and dropping
    // their states is not the load's.
    let cpu_after = process_cpu_time();
    stop.store(true, Ordering::Relaxed);
    let mut result = Ok(());
    for t in threads {
        if let Err(e) = t
            .join()
            .map_err(|_| format_err!("a load thread panicked"))
            .and_then(|r| r)
        {
            result = Err(e);
        }
    }
    let elapsed = started.elapsed();
    result?;
    let pulses = total.load(Ordering::Relaxed);
    Ok(Throughput {
        per_sec: pulses as f64 / elapsed.as_secs_f64(),
        cpu_per_pulse: cpu_before
            .zip(cpu_after)
            .map(|(a, b)| Duration::from_secs_f64(b.saturating_sub(a).as_secs_f64() / pulses.max(1) as f64)),
    })
}

/// One plain state per stream, one thread per stream: [`through`] the
/// plan itself, whose `spawn` gives each stream a state of its own.
pub fn solo_states(
    fixture: &Fixture,
    plan: Arc<dyn Runnable>,
    n: usize,
    duration: Duration,
) -> TractResult<Throughput> {
    through(fixture, plan, n, duration)
}

/// Any runnable (a laned runner): a thread per stream, each with its handle.
pub fn through(
    fixture: &Fixture,
    runnable: Arc<dyn Runnable>,
    n: usize,
    duration: Duration,
) -> TractResult<Throughput> {
    let fixture = fixture.clone();
    closed_loop(
        n,
        duration,
        move |s| Ok((runnable.spawn()?, fixture.inputs(1, s as u64))),
        |(handle, inputs)| {
            handle.run(inputs.clone())?;
            Ok(1)
        },
    )
}

/// The ideal loop: one thread, one laned state of `n` lanes, all seated
/// every turn, inputs pre-stacked. No queue at all.
pub fn ideal(fixture: &Fixture, plan: Arc<dyn Runnable>, n: usize, duration: Duration) -> TractResult<Throughput> {
    let fixture = fixture.clone();
    closed_loop(
        1,
        duration,
        move |_| {
            let mut state = plan.spawn()?;
            let lanes: Vec<LaneId> = (0..n).map(LaneId).collect();
            if n > 1 {
                state.reset_lanes(&lanes)?;
            }
            Ok((state, fixture.inputs(n, 7), lanes))
        },
        move |(state, inputs, lanes)| {
            if n > 1 {
                state.seat(Seating::new(n, lanes.iter().copied())?)?;
            }
            state.run(inputs.clone())?;
            Ok(n as u64)
        },
    )
}

/// The shards' ideal loop: `shards` threads, each running its own laned
/// state with its share of `n` lanes, all seated every turn, inputs
/// pre-stacked. What a sharded runner is measured against.
pub fn ideal_shards(
    fixture: &Fixture,
    plan: Arc<dyn Runnable>,
    n: usize,
    shards: usize,
    duration: Duration,
) -> TractResult<Throughput> {
    let fixture = fixture.clone();
    let shards = shards.clamp(1, n.max(1));
    closed_loop(
        shards,
        duration,
        move |s| {
            // Lanes spread as evenly as placement spreads streams.
            let lanes = n / shards + usize::from(s < n % shards);
            let mut state = plan.spawn()?;
            let ids: Vec<LaneId> = (0..lanes).map(LaneId).collect();
            if lanes > 1 {
                state.reset_lanes(&ids)?;
            }
            Ok((state, fixture.inputs(lanes, 7), ids))
        },
        move |(state, inputs, ids)| {
            if ids.len() > 1 {
                state.seat(Seating::new(ids.len(), ids.iter().copied())?)?;
            }
            state.run(inputs.clone())?;
            Ok(ids.len() as u64)
        },
    )
}

/// The median of `v` (the mean of the two middle values for an even
/// count): how the benches sum up repeated runs. `NaN` for no value.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// CPU time this process has used so far, all threads together, from
/// `/proc/self/stat` (Linux; in USER_HZ ticks of 10 ms); `None` elsewhere.
/// Over a probe of seconds, what a runner costs besides the latency it
/// gives.
pub fn process_cpu_time() -> Option<Duration> {
    cpu_time_from("/proc/self/stat")
}

/// [`process_cpu_time`] of another process (a server the bench started).
pub fn cpu_time_of(pid: u32) -> Option<Duration> {
    cpu_time_from(&format!("/proc/{pid}/stat"))
}

fn cpu_time_from(path: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name (which may hold spaces), from `state`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// CPU time (user and system) of this process's live threads whose name
/// starts with `prefix` (a runner's worker threads: `laned-worker`,
/// tract's `tract-lanes`), in clock ticks of 10 ms. Linux; `None`
/// elsewhere.
pub fn threads_cpu_time(prefix: &str) -> Option<Duration> {
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let (open, close) = (stat.find('(')?, stat.rfind(')')?);
        if !stat[open + 1..close].starts_with(prefix) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        ticks += fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    }
    Some(Duration::from_millis(ticks * 10))
}

/// The smallest and the largest of `v` (`(NaN, NaN)` for no value): the
/// spread the tables show beside a median.
pub fn spread(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// What a capacity search found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacity {
    /// The most streams accepted.
    pub streams: usize,
    /// Every count whose probes disagreed (one missed, another passed):
    /// where the system sits near its limit or the machine hiccuped.
    pub disputed: Vec<Disputed>,
}

/// A count whose probes disagreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Disputed {
    /// The stream count probed.
    pub streams: usize,
    /// Probes within the budget.
    pub passed: u32,
    /// Probes run at this count (2 or 3).
    pub probes: u32,
}

/// The most streams `probe` accepts: doubling from `start` up to `max`,
/// then bisecting between the last accepted and the first refused count
/// until they are within a sixteenth (at most `bisections` probes). 0 if
/// `start` is refused.
///
/// A count is refused only when two of three probes refuse it: a probe
/// that misses is run again (and a third time if the second passes), so a
/// single hiccup (another process's burst, a page fault storm) cannot stop
/// the doubling early or pull the bisection down. Counts whose probes
/// disagreed are handed back in [`Capacity::disputed`].
pub fn search_capacity(
    start: usize,
    max: usize,
    bisections: usize,
    mut probe: impl FnMut(usize) -> TractResult<bool>,
) -> TractResult<Capacity> {
    let mut disputed = vec![];
    let mut probe = |n: usize| -> TractResult<bool> {
        if probe(n)? {
            return Ok(true);
        }
        if !probe(n)? {
            return Ok(false);
        }
        let third = probe(n)?;
        disputed.push(Disputed {
            streams: n,
            passed: 1 + u32::from(third),
            probes: 3,
        });
        Ok(third)
    };
    let (mut good, mut bad) = (0usize, None::<usize>);
    let mut n = start.max(1);
    while n <= max {
        if probe(n)? {
            good = n;
            n *= 2;
        } else {
            bad = Some(n);
            break;
        }
    }
    if let Some(mut bad) = bad {
        for _ in 0..bisections {
            if bad - good <= (good / 16).max(1) {
                break;
            }
            let mid = (good + bad) / 2;
            if probe(mid.max(1))? {
                good = mid;
            } else {
                bad = mid;
            }
        }
    }
    Ok(Capacity {
        streams: good,
        disputed,
    })
}

/// Latencies of a real-time run.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    /// Every pulse's latency, from the instant it was due to its answer,
    /// sorted, in microseconds.
    pub sorted_us: Vec<u64>,
    /// Pulses served.
    pub pulses: u64,
}

impl Latencies {
    /// The latency, in microseconds, that a fraction `q` (0..=1) of the pulses
    /// did not exceed (nearest rank); 0 when no pulse was served.
    pub fn quantile_us(&self, q: f64) -> u64 {
        if self.sorted_us.is_empty() {
            return 0;
        }
        let ix = ((q * self.sorted_us.len() as f64).ceil() as usize).clamp(1, self.sorted_us.len()) - 1;
        self.sorted_us[ix]
    }
}

/// Real time (open loop): `n` streams each due to send one pulse every
/// `period`, starting at random offsets within the first period, for
/// `duration`. A pulse answered late delays the stream's next one (a real
/// stream cannot send what it has not received the answer to), and its
/// latency counts from when it was due.
pub fn real_time(
    fixture: &Fixture,
    runnable: Arc<dyn Runnable>,
    n: usize,
    period: Duration,
    duration: Duration,
    seed: u64,
) -> TractResult<Latencies> {
    let fixture = fixture.clone();
    real_time_with(runnable, n, period, duration, seed, move |s| {
        fixture.inputs(1, s as u64)
    })
}

/// [`real_time`], stream `s` sending `inputs(s)` every period.
pub fn real_time_with(
    runnable: Arc<dyn Runnable>,
    n: usize,
    period: Duration,
    duration: Duration,
    seed: u64,
    inputs: impl Fn(usize) -> TVec<TValue> + Send + Sync + 'static,
) -> TractResult<Latencies> {
    let ready = Arc::new(Barrier::new(n + 1));
    let start_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let inputs = Arc::new(inputs);
    let threads: Vec<_> = (0..n)
        .map(|s| {
            let (runnable, make_inputs, ready, start_at) =
                (runnable.clone(), inputs.clone(), ready.clone(), start_at.clone());
            let offset =
                Duration::from_nanos(Lcg(seed.wrapping_add(s as u64) | 1).next() % period.as_nanos().max(1) as u64);
            std::thread::spawn(move || -> TractResult<Vec<u64>> {
                let handle = runnable.spawn();
                let inputs = make_inputs(s);
                ready.wait();
                let mut handle = handle?;
                let t0 = start_at.lock().unwrap().expect("set before the barrier");
                let mut due = t0 + offset;
                let end = t0 + duration;
                let mut latencies = vec![];
                while due < end {
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    handle.run(inputs.clone())?;
                    latencies.push(due.elapsed().as_micros() as u64);
                    due += period;
                }
                Ok(latencies)
            })
        })
        .collect();
    *start_at.lock().unwrap() = Some(Instant::now() + Duration::from_millis(50));
    ready.wait();
    let mut all = vec![];
    for t in threads {
        all.extend(t.join().map_err(|_| format_err!("a stream thread panicked"))??);
    }
    all.sort_unstable();
    Ok(Latencies {
        pulses: all.len() as u64,
        sorted_us: all,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    /// The CPU per pulse covers the timed run only (not the setup) and is
    /// per pulse: one thread burning CPU uses at most a core per second of
    /// the run, and some of one (Linux).
    #[test]
    #[cfg(target_os = "linux")]
    fn closed_loop_counts_the_timed_runs_cpu_per_pulse() {
        fn burn(d: Duration) {
            let t = Instant::now();
            while t.elapsed() < d {
                std::hint::spin_loop();
            }
        }
        let run = closed_loop(
            1,
            Duration::from_millis(400),
            |_| {
                burn(Duration::from_millis(400));
                Ok(())
            },
            |_| {
                burn(Duration::from_millis(1));
                Ok(1)
            },
        )
        .unwrap();
        let cores = run.cpu_per_pulse.expect("Linux tells the CPU time").as_secs_f64() * run.per_sec;
        assert!(
            (0.05..=1.3).contains(&cores),
            "one burning thread used {cores:.2} cores: {run:?}"
        );
    }

    /// The search finds the largest accepted count within a sixteenth, and
    /// 0 when even the first probe fails.
    #[test]
    fn capacity_search_doubles_then_bisects() {
        let mut probed = vec![];
        let cap = search_capacity(8, 2048, 8, |n| {
            probed.push(n);
            Ok(n <= 300)
        })
        .unwrap()
        .streams;
        assert!((300 - 300 / 16..=300).contains(&cap), "found {cap}");
        assert_eq!(&probed[..7], &[8, 16, 32, 64, 128, 256, 512]);
        assert_eq!(search_capacity(8, 2048, 8, |_| Ok(false)).unwrap().streams, 0);
        assert_eq!(search_capacity(8, 64, 8, |_| Ok(true)).unwrap().streams, 64);
    }

    /// One hiccup (a single probe missing where the system holds) neither
    /// stops the doubling nor pulls the bisection down; a count missed
    /// twice in three probes is refused.
    #[test]
    fn a_single_hiccup_cannot_halve_a_capacity() {
        for hiccup_at in [8, 64, 256, 384] {
            let mut hiccuped = false;
            let cap = search_capacity(8, 2048, 8, |n| {
                if n == hiccup_at && !hiccuped {
                    hiccuped = true;
                    return Ok(false);
                }
                Ok(n <= 300)
            })
            .unwrap();
            assert!(
                (300 - 300 / 16..=300).contains(&cap.streams),
                "hiccup at {hiccup_at}: found {cap:?}"
            );
            // The hiccup shows as a dispute where it hit a count the system holds.
            if hiccup_at <= 300 {
                assert!(
                    cap.disputed.iter().any(|d| d.streams == hiccup_at && d.passed == 2),
                    "hiccup at {hiccup_at} not reported: {cap:?}"
                );
            }
        }
        // Missing two probes of three is a refusal.
        let mut calls_at_64 = 0;
        let cap = search_capacity(8, 2048, 8, |n| {
            if n == 64 {
                calls_at_64 += 1;
                return Ok(calls_at_64 == 2);
            }
            Ok(n <= 300)
        })
        .unwrap();
        assert!(cap.streams < 64, "found {cap:?}");
        assert_eq!(
            cap.disputed,
            vec![Disputed {
                streams: 64,
                passed: 1,
                probes: 3
            }]
        );
    }

    /// A named thread's CPU time is counted under its name's prefix, and
    /// another name's is not (Linux).
    #[test]
    #[cfg(target_os = "linux")]
    fn threads_cpu_time_counts_the_named_threads_only() {
        let busy = std::thread::Builder::new()
            .name("cpu-probe-busy".into())
            .spawn(|| {
                let give_up = Instant::now() + Duration::from_secs(20);
                let mut x = 1u64;
                while threads_cpu_time("cpu-probe-busy").unwrap() < Duration::from_millis(50) {
                    for _ in 0..100_000 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                    assert!(
                        Instant::now() < give_up,
                        "20 s of work and the thread's clock did not move 50 ms"
                    );
                }
                x
            })
            .unwrap();
        assert_ne!(busy.join().unwrap(), 0);
        assert_eq!(threads_cpu_time("no-such-thread"), Some(Duration::ZERO));
    }

    /// The process CPU clock moves while this thread computes (Linux).
    #[test]
    #[cfg(target_os = "linux")]
    fn process_cpu_time_advances_with_work() {
        let start = process_cpu_time().expect("/proc/self/stat is readable on Linux");
        let give_up = Instant::now() + Duration::from_secs(20);
        let mut x = 1u64;
        while process_cpu_time().unwrap() < start + Duration::from_millis(30) {
            for _ in 0..100_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            assert!(
                Instant::now() < give_up,
                "20 s of work and the CPU clock did not move 30 ms"
            );
        }
        assert_ne!(x, 0);
    }
}
