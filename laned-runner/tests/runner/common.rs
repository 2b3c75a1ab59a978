//! What the test files build alike, once: the modes and the runner setups
//! they run in, a runner over a fixture or a plan, and the bounds on every
//! wait (a hang is a failure, not a wait).
#![allow(dead_code)]

use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use laned_runner::{LanedRunner, Mode, RunnerConfig, RunnerConfigBuilder};
use laned_testkit::fixtures::Fixture;
use tract_core::internal::*;

/// Both modes.
pub const MODES: [Mode; 2] = [Mode::Worker, Mode::Combining];

/// Both modes, one shard and three.
pub const SETUPS: [(Mode, usize); 4] = [
    (Mode::Worker, 1),
    (Mode::Combining, 1),
    (Mode::Worker, 3),
    (Mode::Combining, 3),
];

/// A runner over `f` with `lanes` lanes per shard, the default policy.
pub fn runner(f: &Fixture, mode: Mode, shards: usize, lanes: usize) -> LanedRunner {
    runner_with(f, RunnerConfig::builder().mode(mode).shards(shards).max_lanes(lanes))
}

/// One shard of `lanes` lanes over `f` whose turns wait up to `linger` for
/// every held lane's seat.
pub fn one_shard(f: &Fixture, mode: Mode, lanes: usize, linger: Duration) -> LanedRunner {
    runner_with(
        f,
        RunnerConfig::builder()
            .shards(1)
            .max_lanes(lanes)
            .mode(mode)
            .linger(linger),
    )
}

/// A runner on `f`'s model with any other settings.
pub fn runner_with(f: &Fixture, config: RunnerConfigBuilder) -> LanedRunner {
    runner_on(f.runnable().unwrap(), config)
}

/// A runner on any prepared model (`plan`) with any settings.
pub fn runner_on(plan: Arc<dyn Runnable>, config: RunnerConfigBuilder) -> LanedRunner {
    LanedRunner::new(plan, config.build()).unwrap()
}

/// Runs `body` on a thread of its own and fails if it does not return
/// within 60 s: a runner that hangs fails the test. A panic in `body` is
/// raised again here.
pub fn bounded<T: Send + 'static>(what: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let _ = tx.send(body());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(value) => {
            worker.join().unwrap();
            value
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The body panicked: re-raise its panic here.
            std::panic::resume_unwind(worker.join().unwrap_err())
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("hung: {what}"),
    }
}

/// Waits until `cond` holds, polling every millisecond; panics after 20 s
/// (a hang is a failure, not a wait).
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
