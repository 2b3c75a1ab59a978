//! Load on the testkit's fixtures: the two references every figure is
//! compared with (a state per stream, and the ideal loop: one thread, one
//! laned state, every lane seated every turn, inputs pre-stacked) and
//! streams through any runnable, each stream fed a fixture's inputs. The
//! generators themselves, the measures, the CPU clocks and the capacity
//! search are `laned_load`'s.

use std::sync::Arc;
use std::time::Duration;

use tract_core::internal::*;
use tract_core::plan::{LaneId, Seating};

use laned_testkit::fixtures::Fixture;

use laned_load::threads::{self, closed_loop};
use laned_load::{Latencies, Throughput};

/// One plain state per stream, one thread per stream: [`through`] the
/// plan itself, whose `spawn` gives each stream a state of its own.
pub fn solo_states(
    fixture: &Fixture,
    plan: Arc<dyn Runnable>,
    n: usize,
    duration: Duration,
) -> TractResult<Throughput> {
    through(fixture, plan, n, duration)
}

/// Any runnable (a laned runner): a thread per stream, each with its handle.
pub fn through(
    fixture: &Fixture,
    runnable: Arc<dyn Runnable>,
    n: usize,
    duration: Duration,
) -> TractResult<Throughput> {
    let fixture = fixture.clone();
    closed_loop(
        n,
        duration,
        move |s| Ok((runnable.spawn()?, fixture.inputs(1, s as u64))),
        |(handle, inputs)| {
            handle.run(inputs.clone())?;
            Ok(1)
        },
    )
}

/// The ideal loop: one thread, one laned state of `n` lanes, all seated
/// every turn, inputs pre-stacked. No queue at all.
pub fn ideal(fixture: &Fixture, plan: Arc<dyn Runnable>, n: usize, duration: Duration) -> TractResult<Throughput> {
    let fixture = fixture.clone();
    closed_loop(
        1,
        duration,
        move |_| {
            let mut state = plan.spawn()?;
            let lanes: Vec<LaneId> = (0..n).map(LaneId).collect();
            if n > 1 {
                state.reset_lanes(&lanes)?;
            }
            Ok((state, fixture.inputs(n, 7), lanes))
        },
        move |(state, inputs, lanes)| {
            if n > 1 {
                state.seat(Seating::new(n, lanes.iter().copied())?)?;
            }
            state.run(inputs.clone())?;
            Ok(n as u64)
        },
    )
}

/// The shards' ideal loop: `shards` threads, each running its own laned
/// state with its share of `n` lanes, all seated every turn, inputs
/// pre-stacked. What a sharded runner is measured against.
pub fn ideal_shards(
    fixture: &Fixture,
    plan: Arc<dyn Runnable>,
    n: usize,
    shards: usize,
    duration: Duration,
) -> TractResult<Throughput> {
    let fixture = fixture.clone();
    let shards = shards.clamp(1, n.max(1));
    closed_loop(
        shards,
        duration,
        move |s| {
            // Lanes spread as evenly as placement spreads streams.
            let lanes = n / shards + usize::from(s < n % shards);
            let mut state = plan.spawn()?;
            let ids: Vec<LaneId> = (0..lanes).map(LaneId).collect();
            if lanes > 1 {
                state.reset_lanes(&ids)?;
            }
            Ok((state, fixture.inputs(lanes, 7), ids))
        },
        move |(state, inputs, ids)| {
            if ids.len() > 1 {
                state.seat(Seating::new(ids.len(), ids.iter().copied())?)?;
            }
            state.run(inputs.clone())?;
            Ok(ids.len() as u64)
        },
    )
}

/// [`laned_load::threads::real_time`], stream `s` sending the fixture's inputs seeded `s`
/// every period.
pub fn real_time(
    fixture: &Fixture,
    runnable: Arc<dyn Runnable>,
    n: usize,
    period: Duration,
    duration: Duration,
    seed: u64,
) -> TractResult<Latencies> {
    let fixture = fixture.clone();
    threads::real_time(runnable, n, period, duration, seed, move |s| {
        fixture.inputs(1, s as u64)
    })
}
