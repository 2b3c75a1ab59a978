//! Explicit-state models (state in, stateN out), closed loop with a thread
//! per stream: one plain state per stream feeding its state back, against
//! ours (the runner keeps the state per lane and stacks the streams), with
//! one shard and with a shard per core: a recurrent cell of 512 inputs (a
//! 32 ms chunk at 16 kHz) and `hidden` of state. Runs on the bench's one
//! closed loop (`laned_load::threads::closed_loop`: a warm-up call, the clock
//! read before the release).
//! `cargo run --release -p laned-bench --bin explicit-bench -- [streams] [seconds] [hidden]`

use std::sync::Arc;
use std::time::Duration;

use laned_runner::{LanedRunner, RunnerConfig, StateSpec};
use laned_testkit::fixtures;
use tract_core::internal::*;

const F: usize = 512;

fn x(seed: u64) -> TValue {
    let mut rng = fastrand::Rng::with_seed(seed);
    Tensor::from_shape(&[1, F], &(0..F).map(|_| rng.f32() * 2.0 - 1.0).collect::<Vec<f32>>())
        .unwrap()
        .into_tvalue()
}

fn main() -> TractResult<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let hidden: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let d = Duration::from_secs_f64(secs);
    let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(fixtures::rnn_cell(F, hidden)?)?.into();
    let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    println!("recurrent cell F={F} H={hidden}, {n} streams, {cores} cores, {secs} s per run; chunks/s (median of 3, interleaved)");
    let labels = ["a state per stream", "ours, 1 shard", "ours, a shard per core"];
    let mut runs: Vec<Vec<f64>> = vec![vec![]; labels.len()];
    for _ in 0..3 {
        let p = plan.clone();
        let solo = laned_load::threads::closed_loop(
            n,
            d,
            move |s| {
                let h = Tensor::zero::<f32>(&[1, 1, hidden])?.into_tvalue();
                Ok((p.spawn()?, h, x(s as u64)))
            },
            |(state, h, input)| {
                let out = state.run(tvec!(input.clone(), h.clone()))?;
                *h = out[1].clone();
                Ok(1)
            },
        )?;
        runs[0].push(solo.per_sec);
        for (ix, shards) in [(1, 1), (2, cores.min(n))] {
            let config = RunnerConfig::builder()
                .state(StateSpec::Detect)
                .shards(shards)
                .max_lanes(n.div_ceil(shards))
                .build();
            let runner = LanedRunner::new(plan.clone(), config)?;
            let ours = laned_load::threads::closed_loop(
                n,
                d,
                move |s| Ok((runner.try_spawn()?, x(s as u64))),
                |(handle, input)| {
                    handle.call(tvec!(input.clone()))?;
                    Ok(1)
                },
            )?;
            runs[ix].push(ours.per_sec);
        }
    }
    let solo = laned_load::median(&runs[0]);
    println!("| system | chunks/s | spread | / a state per stream |\n|---|---|---|---|");
    for (label, runs) in labels.iter().zip(&runs) {
        let (lo, hi) = laned_load::spread(runs);
        println!(
            "| {label} | {:.0} | {lo:.0}..{hi:.0} | {:.2} |",
            laned_load::median(runs),
            laned_load::median(runs) / solo
        );
    }
    Ok(())
}
