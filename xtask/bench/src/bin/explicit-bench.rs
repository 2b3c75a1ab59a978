//! Explicit-state models (state in, stateN out), closed loop with a thread
//! per stream: one plain state per stream feeding its state back, against
//! ours (the runner keeps the state per lane and stacks the streams), with
//! one shard and with a shard per core: a recurrent cell of 512 inputs (a
//! 32 ms chunk at 16 kHz) and `hidden` of state.
//! `cargo run --release -p laned-runner --example explicit-bench -- [streams] [seconds] [hidden]`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use laned_runner::{LanedRunner, RunnerConfig, StateSpec};
use laned_testkit::fixtures::{self, Lcg};
use tract_core::internal::*;

const F: usize = 512;

fn x(seed: u64) -> Tensor {
    let mut rng = Lcg(seed | 1);
    Tensor::from_shape(&[1, F], &(0..F).map(|_| rng.uniform()).collect::<Vec<f32>>()).unwrap()
}

/// Chunks per second over `n` threads, each running `step` in a loop.
fn closed_loop(n: usize, d: Duration, step: Arc<dyn Fn(usize) -> Box<dyn FnMut() + Send> + Send + Sync>) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(n + 1));
    let threads: Vec<_> = (0..n)
        .map(|s| {
            let (stop, total, barrier, step) = (stop.clone(), total.clone(), barrier.clone(), step.clone());
            std::thread::spawn(move || {
                let mut f = step(s);
                f();
                barrier.wait();
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) {
                    f();
                    k += 1;
                }
                total.fetch_add(k, Ordering::Relaxed);
            })
        })
        .collect();
    let started = Instant::now();
    barrier.wait();
    std::thread::sleep(d);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    total.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let hidden: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let d = Duration::from_secs_f64(secs);
    let plan: Arc<dyn Runnable> = DefaultRuntime
        .prepare(fixtures::rnn_cell(F, hidden).unwrap())
        .unwrap()
        .into();
    let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    println!("recurrent cell F={F} H={hidden}, {n} streams, {cores} cores, {secs} s per run; chunks/s (median of 3, interleaved)");
    let mut results: Vec<(&str, Vec<f64>)> = vec![
        ("a state per stream", vec![]),
        ("ours, 1 shard", vec![]),
        ("ours, a shard per core", vec![]),
    ];
    for _ in 0..3 {
        let p = plan.clone();
        results[0].1.push(closed_loop(
            n,
            d,
            Arc::new(move |s| {
                let mut state = p.spawn().unwrap();
                let mut h = Tensor::zero::<f32>(&[1, 1, hidden]).unwrap().into_tvalue();
                let input = x(s as u64).into_tvalue();
                Box::new(move || {
                    let out = state.run(tvec!(input.clone(), h.clone())).unwrap();
                    h = out[1].clone();
                })
            }),
        ));
        for (ix, shards) in [(1, 1), (2, cores.min(n))] {
            let config = RunnerConfig::builder()
                .state(StateSpec::Detect)
                .shards(shards)
                .max_lanes(n.div_ceil(shards))
                .build();
            let runner = LanedRunner::new(plan.clone(), config).unwrap();
            let r = runner.clone();
            results[ix].1.push(closed_loop(
                n,
                d,
                Arc::new(move |s| {
                    let mut handle = r.try_spawn().unwrap();
                    let input = x(s as u64).into_tvalue();
                    Box::new(move || {
                        handle.call(tvec!(input.clone())).unwrap();
                    })
                }),
            ));
        }
    }
    let solo = {
        let mut v = results[0].1.clone();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[1]
    };
    println!("| system | chunks/s | spread | / a state per stream |\n|---|---|---|---|");
    for (name, mut runs) in results {
        runs.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "| {name} | {:.0} | {:.0}..{:.0} | {:.2} |",
            runs[1],
            runs[0],
            runs[2],
            runs[1] / solo
        );
    }
}
