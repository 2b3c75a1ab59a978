//! The learned turn width, end to end: on a model made slower per row the
//! wider its turn, the runner learns the width a plain laned state serves
//! cheapest per row, and never seats wider but for its one-row probes.

use std::thread;
use std::time::{Duration, Instant};

use laned_runner::{LanedRunner, RunnerConfig};
use laned_testkit::fixtures::{self, Fixture};
use tract_core::plan::{LaneId, Seating};

use crate::common::MODES;

/// The width a plain laned state of `f` (tract's, no runner) serves
/// cheapest per row, among 1 to `widest`: each width timed over `turns`
/// turns, all lanes seated.
fn cheapest_per_row(f: &Fixture, widest: usize, turns: usize) -> usize {
    let plan = f.runnable().unwrap();
    let mut best = (0, f64::INFINITY);
    for width in 1..=widest {
        let mut state = plan.spawn().unwrap();
        let lanes: Vec<LaneId> = (0..width).map(LaneId).collect();
        if width > 1 {
            state.reset_lanes(&lanes).unwrap();
        }
        let inputs = f.inputs(width, width as u64);
        let started = Instant::now();
        for _ in 0..turns {
            if width > 1 {
                state.seat(Seating::new(width, lanes.iter().copied()).unwrap()).unwrap();
            }
            state.run(inputs.clone()).unwrap();
        }
        let per_row = started.elapsed().as_secs_f64() / (turns * width) as f64;
        if per_row < best.1 {
            best = (width, per_row);
        }
    }
    best.0
}

/// Eight streams calling as fast as answered, `calls` each (each call
/// bounded by a deadline), every answer checked against the stream's solo
/// run.
fn closed_loop(r: &LanedRunner, f: &Fixture, calls: u64) {
    let threads: Vec<_> = (0..8u64)
        .map(|s| {
            let (mut h, f) = (r.spawn_timeout(Duration::from_secs(10)).unwrap(), f.clone());
            thread::spawn(move || {
                let mut solo = f.runnable().unwrap().spawn().unwrap();
                for call in 0..calls {
                    let inputs = f.inputs(1, s << 32 | call);
                    // Bounded: a hung runner fails the test, it does not hang it.
                    let got = h
                        .call_until(inputs.clone(), Instant::now() + Duration::from_secs(30))
                        .unwrap();
                    assert_eq!(*got[0], *solo.run(inputs).unwrap()[0], "stream {s} call {call}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// On a model slower per row batched, the learned width is the width a
/// plain state serves cheapest per row, and once learned no turn is wider
/// but the one-row probes (at most one turn in 32, and a few more).
#[test]
fn the_learned_width_never_exceeds_the_cheapest_per_row_width() {
    let f = fixtures::slower_batched().unwrap();
    let cheapest = cheapest_per_row(&f, 4, 20);
    assert_eq!(cheapest, 1, "a turn of k rows spins k² x {:?}", fixtures::CROWDING);
    for mode in MODES {
        let r = LanedRunner::new(
            f.runnable().unwrap(),
            RunnerConfig::builder().max_lanes(8).mode(mode).build(),
        )
        .unwrap();
        closed_loop(&r, &f, 40);
        assert_eq!(r.learned_width(), vec![Some(cheapest)], "{mode:?}");
        assert_eq!(r.metrics().learned_width, cheapest as u64, "{mode:?}: the gauge");
        let learned = r.metrics();
        closed_loop(&r, &f, 40);
        let after = r.metrics().delta(&learned);
        let wider: u64 = after.occupancy.iter().skip(cheapest + 2).sum();
        let probes = after.occupancy.get(cheapest + 1).copied().unwrap_or(0);
        assert_eq!(wider, 0, "{mode:?}: turns wider than a probe: {:?}", after.occupancy);
        assert!(
            probes * 16 <= after.turns,
            "{mode:?}: {probes} probes in {} turns: {:?}",
            after.turns,
            after.occupancy
        );
        assert_eq!(r.learned_width(), vec![Some(cheapest)], "{mode:?}: kept");
    }
}

/// A width given is the width served: with `max_seats` in the config, or
/// set while serving, nothing is learned and turns seat what is queued.
#[test]
fn max_seats_given_turns_the_learning_off() {
    let f = fixtures::slower_batched().unwrap();
    let r = LanedRunner::new(
        f.runnable().unwrap(),
        RunnerConfig::builder().max_lanes(8).max_seats(8).build(),
    )
    .unwrap();
    closed_loop(&r, &f, 10);
    assert_eq!(r.learned_width(), vec![None]);
    assert_eq!(r.metrics().learned_width, 0);
    assert!(
        r.metrics().occupancy.iter().skip(2).sum::<u64>() > 0,
        "{:?}",
        r.metrics().occupancy
    );

    let r = LanedRunner::new(f.runnable().unwrap(), RunnerConfig::builder().max_lanes(8).build()).unwrap();
    closed_loop(&r, &f, 40);
    assert_eq!(r.learned_width(), vec![Some(1)]);
    r.set_max_seats(8);
    assert_eq!(r.learned_width(), vec![None], "set while serving");
    let before = r.metrics();
    closed_loop(&r, &f, 10);
    let after = r.metrics().delta(&before);
    assert!(after.occupancy.iter().skip(2).sum::<u64>() > 0, "{:?}", after.occupancy);
}
