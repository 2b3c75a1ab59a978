//! Streams as threads: closed loop (a thread per stream calling as soon as
//! answered) and real time (a thread per stream sending one pulse per
//! period), over any state a stream's thread sets up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tract_core::internal::*;

use crate::{process_cpu_time, Latencies, Throughput};

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

/// Real time (open loop): `n` streams, each due to send one pulse every
/// `period` from its [`phase`](crate::phase) within the first (seeded
/// `seed`), for `duration`; stream `s` sends `inputs(s)` every time. A pulse answered late delays the stream's next one (a real
/// stream cannot send what it has not received the answer to), and its
/// latency counts from when it was due.
pub fn real_time(
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
            let offset = crate::phase(seed, s, period);
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
    Ok(Latencies::new(all))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
