//! Admission under a burst, and mass cancellation: how the cost grows with
//! the number of tasks (it should grow linearly).
//!
//! ```text
//! cargo run -p laned-runner --example admission-burst
//! ```
//!
//! For 1,000 and 10,000 tasks on 64 lanes (one shard, each mode): every
//! task spawns (`spawn_async`, most of them waiting in the admission
//! queue), makes one call and ends. Then 10,000 calls are queued at once
//! and dropped, as a runtime shutting down drops them, and settled. The
//! figures go in BENCHMARKS.md; the ratio 10,000 / 1,000 is the claim.

use std::future::Future;
use std::time::{Duration, Instant};

use laned_runner::{LanedRunner, Mode, RunnerConfig};
use laned_testkit::fixtures;

fn burst(mode: Mode, tasks: u64) -> Duration {
    let f = fixtures::small_tdnn();
    let r = LanedRunner::new(
        f.runnable().unwrap(),
        RunnerConfig::builder()
            .mode(mode)
            .max_lanes(64)
            .max_waiting(20_000)
            .build(),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let start = Instant::now();
    rt.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let (r, f) = (r.clone(), f.clone());
                tokio::spawn(async move {
                    let mut h = r.spawn_async().await.unwrap();
                    h.call_async(f.inputs(1, t)).await.unwrap();
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
    });
    start.elapsed()
}

fn mass_cancel(mode: Mode, calls: usize) -> Duration {
    let f = fixtures::small_tdnn();
    let r = LanedRunner::new(
        f.runnable().unwrap(),
        RunnerConfig::builder().mode(mode).max_lanes(calls).build(),
    )
    .unwrap();
    let mut handles: Vec<_> = (0..calls).map(|_| r.try_spawn().unwrap()).collect();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let start = Instant::now();
    rt.block_on(async {
        let mut queued = Vec::with_capacity(calls);
        for (t, h) in handles.iter_mut().enumerate() {
            queued.push(Box::pin(h.call_async(f.inputs(1, t as u64))));
        }
        // Two polls each: queued (the first poll yields), then waiting.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        for _ in 0..2 {
            for q in &mut queued {
                let _ = q.as_mut().poll(&mut cx);
            }
        }
        drop(queued);
    });
    // Every dropped call settled: each waits for its verdict.
    for h in &mut handles {
        let _ = h.settle();
    }
    start.elapsed()
}

fn main() {
    for mode in [Mode::Worker, Mode::Combining] {
        let small = burst(mode, 1_000);
        let large = burst(mode, 10_000);
        println!(
            "{mode:?}: burst of 1,000 tasks {small:?}, of 10,000 {large:?}: ratio {:.1}",
            large.as_secs_f64() / small.as_secs_f64()
        );
        let small = mass_cancel(mode, 1_000);
        let large = mass_cancel(mode, 10_000);
        println!(
            "{mode:?}: 1,000 calls dropped and settled {small:?}, 10,000 {large:?}: ratio {:.1}",
            large.as_secs_f64() / small.as_secs_f64()
        );
    }
}
