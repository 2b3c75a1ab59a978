//! What the model tests build alike: a runner over a real model's plan,
//! a call whose error reads as a tract error, an exact comparison, the
//! proof that turns were shared.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use laned_runner::{LanedRunner, LanedStateHandle, Mode, RunnerConfig, StatePair, StateSpec};
use tract_core::internal::*;

/// A runner over a real model's `plan`, its explicit state the input
/// `state` paired with output 1 where given, lingering 2 ms.
///
/// Short: a stream waiting on one model of a pipeline while others wait
/// on the next must not hold a turn for long (with a long linger two
/// runners could wait on each other); a turn still starts at once when
/// every held lane has a call queued.
pub fn model_runner(
    plan: &Arc<dyn Runnable>,
    state: Option<&str>,
    mode: Mode,
    shards: usize,
    lanes: usize,
) -> LanedRunner {
    let mut config = RunnerConfig::builder()
        .mode(mode)
        .shards(shards)
        .max_lanes(lanes)
        .linger(Duration::from_millis(2));
    if let Some(state) = state {
        config = config.state(StateSpec::Pairs(vec![StatePair::new(state, 1)]));
    }
    LanedRunner::new(plan.clone(), config.build()).unwrap()
}

/// A blocking call, its error as a tract error.
pub fn call(handle: &mut LanedStateHandle, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
    handle.call(inputs).map_err(|e| format_err!("{e}"))
}

/// The largest difference between `want` and `got`, and whether they are
/// equal bit for bit.
pub fn compare(want: &[f32], got: &[f32]) -> (f32, bool) {
    assert_eq!(want.len(), got.len());
    let max = want.iter().zip(got).map(|(w, g)| (w - g).abs()).fold(0.0, f32::max);
    let exact = want.iter().zip(got).all(|(w, g)| w.to_bits() == g.to_bits());
    (max, exact)
}

/// Asserts that some of `runner`'s turns seated several streams (the
/// streams did share the state), and prints its occupancy.
pub fn assert_turns_shared(what: &str, runner: &LanedRunner) {
    let m = runner.metrics();
    let shared: u64 = m.occupancy.iter().skip(2).sum();
    assert!(shared > 0, "{what}: no turn seated several streams: {:?}", m.occupancy);
    eprintln!(
        "{what}: {} calls in {} turns, occupancy {:?}",
        m.seats, m.turns, m.occupancy
    );
}
