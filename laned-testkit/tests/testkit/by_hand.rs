//! Every fixture, by hand on one laned state under arbitrary seating, gives
//! every stream its solo run; and the checker catches broken runners.

use laned_testkit::fixtures::{self, Fixture};
use laned_testkit::schedule::{proptest_config, schedule, Schedule, ScheduleConfig, StreamPlan};
use laned_testkit::{verify_by_hand, Sabotage, Tolerance};
use proptest::prelude::*;

fn check_fixture(fixture: &Fixture, schedule: &Schedule) -> Result<(), TestCaseError> {
    verify_by_hand(fixture, schedule, Sabotage::None, Tolerance::Exact)
        .map_err(|e| TestCaseError::fail(format!("{}: {e:#}", fixture.name)))
}

proptest! {
    #![proptest_config(proptest_config(24))]
    #[test]
    fn prop_every_fixture_by_hand(fixture_ix in 0..fixtures::by_tract().unwrap().len(), schedule in schedule(ScheduleConfig::default())) {
        let fixture = &fixtures::by_tract().unwrap()[fixture_ix];
        check_fixture(fixture, &schedule)?;
    }
}

/// Four streams through three lanes (one kept for borrowing): lanes are
/// reused, turns seat changing subsets, one wide call borrows.
fn reuse_schedule() -> Schedule {
    Schedule {
        max_lanes: 3,
        streams: vec![
            StreamPlan {
                seed: 1,
                calls: vec![1, 1, 1],
                arrive: 0,
                end: None,
            },
            StreamPlan {
                seed: 2,
                calls: vec![1, 2, 1, 1],
                arrive: 0,
                end: None,
            },
            StreamPlan {
                seed: 3,
                calls: vec![1, 1, 1, 1],
                arrive: 1,
                end: None,
            },
            StreamPlan {
                seed: 4,
                calls: vec![1, 1],
                arrive: 2,
                end: Some(7),
            },
        ],
        picks: vec![0b11, 0b10, 0b01, 0b11 | (1 << 40)],
    }
}

#[test]
fn pinned_lane_reuse_on_every_fixture() {
    for fixture in fixtures::by_tract().unwrap() {
        check_fixture(&fixture, &reuse_schedule()).unwrap();
    }
}

#[test]
fn pinned_heavy_and_light_tdnn() {
    for config in [
        fixtures::TdnnConfig::light(),
        fixtures::TdnnConfig::heavy().with_layout(fixtures::Layout::Nhwc),
    ] {
        check_fixture(&fixtures::tdnn(config).unwrap(), &reuse_schedule()).unwrap();
    }
}

/// The checker fails when a turn's seats get each other's outputs.
#[test]
fn negative_control_swapped_seats() {
    let fixture = fixtures::tdnn(fixtures::TdnnConfig {
        width: 8,
        pulse: 4,
        layout: fixtures::Layout::Nchw,
    })
    .unwrap();
    let err = verify_by_hand(&fixture, &reuse_schedule(), Sabotage::SwapSeats, Tolerance::Exact).unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("stream") && text.contains("seat 0") && text.contains("solo gives"),
        "{text}"
    );
}

/// The checker fails when a lane is handed to a new stream without reset.
#[test]
fn negative_control_lane_not_reset_on_spawn() {
    let fixture = fixtures::edge_pad().unwrap();
    assert!(verify_by_hand(&fixture, &reuse_schedule(), Sabotage::NoResetOnSpawn, Tolerance::Exact).is_err());
}

/// The checker fails when a borrowed lane is not reset.
#[test]
fn negative_control_borrowed_lane_not_reset() {
    let fixture = fixtures::tdnn(fixtures::TdnnConfig {
        width: 8,
        pulse: 4,
        layout: fixtures::Layout::Nchw,
    })
    .unwrap();
    // Two wide calls in a row: the second borrows the lane the first left dirty.
    let schedule = Schedule {
        max_lanes: 2,
        streams: vec![StreamPlan {
            seed: 9,
            calls: vec![2, 2, 2],
            arrive: 0,
            end: None,
        }],
        picks: vec![1],
    };
    verify_by_hand(&fixture, &schedule, Sabotage::None, Tolerance::Exact).unwrap();
    assert!(verify_by_hand(&fixture, &schedule, Sabotage::NoResetBorrowed, Tolerance::Exact).is_err());
}
