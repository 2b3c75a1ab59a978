//! Through the runner, with a thread per stream and whatever seating the
//! worker finds queued, every stream gets exactly its solo run.

use std::sync::Arc;

use laned_runner::{LanedRunner, Mode, RunnerConfig};
use laned_testkit::fixtures::{self, Fixture};
use laned_testkit::schedule::{proptest_config, schedule, Schedule, ScheduleConfig, StreamPlan};
use laned_testkit::{verify_runner, Tolerance};
use proptest::prelude::*;
use tract_core::internal::*;

use crate::common::MODES;

fn ours(mode: Mode, shards: usize) -> impl Fn(Arc<dyn Runnable>, usize) -> TractResult<Arc<dyn Runnable>> {
    move |plan, lanes| {
        // The schedule's lanes include one for borrowing; the runner adds its own.
        let config = RunnerConfig::builder()
            .shards(shards)
            .max_lanes(lanes - 1)
            .mode(mode)
            .build();
        Ok(Arc::new(LanedRunner::new(plan, config)?) as Arc<dyn Runnable>)
    }
}

fn tracts(plan: Arc<dyn Runnable>, lanes: usize) -> TractResult<Arc<dyn Runnable>> {
    Ok(Arc::new(tract_core::lanes::LanedRunnable::wrap(plan, lanes - 1)?))
}

fn check(fixture: &Fixture, schedule: &Schedule, mode: Mode) -> Result<(), TestCaseError> {
    check_sharded(fixture, schedule, mode, 1)
}

fn check_sharded(fixture: &Fixture, schedule: &Schedule, mode: Mode, shards: usize) -> Result<(), TestCaseError> {
    verify_runner(fixture, schedule, &ours(mode, shards), Tolerance::Exact)
        .map_err(|e| TestCaseError::fail(format!("{} in {mode:?} mode, {shards} shards: {e:#}", fixture.name)))
}

/// The seed's case on three shards, both modes.
#[test]
fn seed_case_three_shards() {
    let fixture = fixtures::tdnn(fixtures::TdnnConfig::light()).unwrap();
    for mode in MODES {
        check_sharded(&fixture, &seed_case(), mode, 3).unwrap();
    }
}

/// The seed's case: a pulsed pad + conv served with a stream per thread,
/// staggered starts, streams ending and new ones reusing their lanes.
fn seed_case() -> Schedule {
    Schedule {
        max_lanes: 4,
        streams: (0..8)
            .map(|s| StreamPlan {
                seed: 100 + s,
                calls: vec![1; 6 + (s as usize % 3)],
                arrive: s as usize,
                end: None,
            })
            .collect(),
        picks: vec![u64::MAX],
    }
}

#[test]
fn seed_case_worker() {
    let fixture = fixtures::tdnn(fixtures::TdnnConfig::light()).unwrap();
    check(&fixture, &seed_case(), Mode::Worker).unwrap();
}

#[test]
fn seed_case_combining() {
    let fixture = fixtures::tdnn(fixtures::TdnnConfig::light()).unwrap();
    check(&fixture, &seed_case(), Mode::Combining).unwrap();
}

/// Tract's own runner passes the same check on plain pulses (the harness
/// drives any `Runnable`).
#[test]
fn seed_case_tracts_laned_runnable() {
    let fixture = fixtures::tdnn(fixtures::TdnnConfig::light()).unwrap();
    verify_runner(&fixture, &seed_case(), &tracts, Tolerance::Exact).unwrap();
}

#[test]
fn every_fixture_both_modes_with_wide_calls_and_ends() {
    let schedule = Schedule {
        max_lanes: 3,
        streams: vec![
            StreamPlan {
                seed: 1,
                calls: vec![1, 2, 1, 1],
                arrive: 0,
                end: None,
            },
            StreamPlan {
                seed: 2,
                calls: vec![1, 1, 1],
                arrive: 0,
                end: Some(9),
            },
            StreamPlan {
                seed: 3,
                calls: vec![2, 1, 1, 1],
                arrive: 1,
                end: Some(11),
            },
            StreamPlan {
                seed: 4,
                calls: vec![1, 1],
                arrive: 2,
                end: None,
            },
        ],
        picks: vec![u64::MAX],
    };
    for fixture in fixtures::all().unwrap() {
        for mode in MODES {
            check(&fixture, &schedule, mode).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(proptest_config(12))]
    #[test]
    fn prop_runner_worker(fixture_ix in 0..fixtures::all().unwrap().len(), schedule in schedule(ScheduleConfig::default())) {
        check(&fixtures::all().unwrap()[fixture_ix], &schedule, Mode::Worker)?;
    }

    #[test]
    fn prop_runner_three_shards(fixture_ix in 0..fixtures::all().unwrap().len(), schedule in schedule(ScheduleConfig::default()), combining in any::<bool>()) {
        let mode = if combining { Mode::Combining } else { Mode::Worker };
        check_sharded(&fixtures::all().unwrap()[fixture_ix], &schedule, mode, 3)?;
    }

    #[test]
    fn prop_runner_combining(fixture_ix in 0..fixtures::all().unwrap().len(), schedule in schedule(ScheduleConfig::default())) {
        check(&fixtures::all().unwrap()[fixture_ix], &schedule, Mode::Combining)?;
    }
}
