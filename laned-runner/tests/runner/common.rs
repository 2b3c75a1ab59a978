//! What several test files build alike: the four runner setups, a runner
//! over a fixture.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use laned_runner::{LanedRunner, Mode, RunnerConfig};
use laned_testkit::fixtures::Fixture;

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

/// A runner on `f`'s model with any other settings.
pub fn runner_with(f: &Fixture, config: laned_runner::RunnerConfigBuilder) -> LanedRunner {
    LanedRunner::new(f.runnable().unwrap(), config.build()).unwrap()
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
