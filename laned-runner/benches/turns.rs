//! Time per pulse, closed loop with a thread per stream, side by side: a
//! state per stream, the ideal loop, tract's `LanedRunnable`, and ours in
//! each mode, on the light TDNN. `cargo bench -p laned-runner`.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use laned_runner::{LanedRunner, Mode, RunnerConfig};
use laned_testkit::fixtures::{self, Fixture, TdnnConfig};
use tract_core::internal::*;

/// `iters` pulses spread over `n` threads, each calling its own state;
/// returns the wall time from the common start to the last answer, so the
/// figure is the whole system's time per pulse (the inverse of throughput).
fn threads(n: usize, iters: u64, make: &(dyn Fn(usize) -> Box<dyn State> + Sync), f: &Fixture) -> Duration {
    let per = iters.div_ceil(n as u64);
    let barrier = Arc::new(Barrier::new(n + 1));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|s| {
                let (barrier, inputs) = (barrier.clone(), f.inputs(1, s as u64));
                let mut state = make(s);
                scope.spawn(move || {
                    state.run(inputs.clone()).unwrap();
                    barrier.wait();
                    for _ in 0..per {
                        state.run(inputs.clone()).unwrap();
                    }
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for h in handles {
            h.join().unwrap();
        }
        start.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let f = fixtures::tdnn(TdnnConfig::light()).unwrap();
    let plan = f.runnable().unwrap();
    let mut group = c.benchmark_group("light TDNN, time per pulse");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for n in [1usize, 4, 16] {
        group.bench_with_input(BenchmarkId::new("state per stream", n), &n, |b, &n| {
            b.iter_custom(|iters| threads(n, iters, &|_| plan.spawn().unwrap(), &f))
        });
        // The ideal: the model as given on one plain batched tract state
        // (`n` rows, no lanes API: the ops' state under tract's default
        // seating, every row together), inputs pre-stacked.
        group.bench_with_input(BenchmarkId::new("ideal loop", n), &n, |b, &n| {
            let mut state = plan.spawn().unwrap();
            let inputs = f.inputs(n, 7);
            b.iter_custom(|iters| {
                let turns = iters.div_ceil(n as u64);
                let start = Instant::now();
                for _ in 0..turns {
                    state.run(inputs.clone()).unwrap();
                }
                start.elapsed()
            })
        });
        let tract: Arc<dyn Runnable> = Arc::new(tract_core::lanes::LanedRunnable::wrap(plan.clone(), n).unwrap());
        group.bench_with_input(BenchmarkId::new("tract LanedRunnable", n), &n, |b, &n| {
            b.iter_custom(|iters| threads(n, iters, &|_| tract.spawn().unwrap(), &f))
        });
        for mode in [Mode::Worker, Mode::Combining] {
            let ours: Arc<dyn Runnable> = Arc::new(
                LanedRunner::new(
                    plan.clone(),
                    RunnerConfig::builder().shards(1).max_lanes(n).mode(mode).build(),
                )
                .unwrap(),
            );
            group.bench_with_input(BenchmarkId::new(format!("ours {mode:?}"), n), &n, |b, &n| {
                b.iter_custom(|iters| threads(n, iters, &|_| ours.spawn().unwrap(), &f))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
