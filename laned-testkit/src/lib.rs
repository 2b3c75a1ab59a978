//! Prove, for any model, that serving it through lanes changes nothing for
//! any stream.
//!
//! - [`fixtures`]: models built and pulsified in code, each with the batch
//!   symbol on axis 0.
//! - [`schedule`]: a laned session as data (streams arriving and leaving,
//!   wide calls, partial last pulses), and proptest strategies for it.
//! - [`drive`]: a schedule run solo (the reference), by hand on one laned
//!   state, or through any runner with a thread per stream.
//! - [`check`](mod@check): the one checking function; a failure names the
//!   stream, the call, the seating and the first differing element.
//! - [`exec`]: a strict test executor, failing on a lost wake-up, and test
//!   wakers (panicking, counting, reentrant).
//!
//! The kit knows no runner (each runner under test is handed in) and no
//! real model (those are `laned-models`' own).
//!
//! ```
//! use laned_testkit::{fixtures, schedule::{Schedule, StreamPlan}, verify_by_hand, Sabotage, Tolerance};
//!
//! let fixture = fixtures::edge_pad()?;
//! let schedule = Schedule {
//!     max_lanes: 3,
//!     streams: (0..3).map(|s| StreamPlan { seed: s, calls: vec![1; 3], arrive: s as usize, end: None }).collect(),
//!     picks: vec![0b11, 0b01],
//! };
//! verify_by_hand(&fixture, &schedule, Sabotage::None, Tolerance::Exact)?;
//! // A runner handing a reused lane to a new stream without reset is caught.
//! assert!(verify_by_hand(&fixture, &schedule, Sabotage::NoResetOnSpawn, Tolerance::Exact).is_err());
//! # Ok::<(), tract_core::prelude::TractError>(())
//! ```

#![warn(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use tract_core::internal::*;

pub mod check;
pub mod drive;
pub mod exec;
pub mod fixtures;
pub mod schedule;

pub use check::{check, Mismatch, Tolerance};
pub use drive::{by_hand, solo, through_runner, Observed, Sabotage};

/// Run `schedule` by hand on one laned state of `fixture` and check every
/// stream against its solo run.
pub fn verify_by_hand(
    fixture: &fixtures::Fixture,
    schedule: &schedule::Schedule,
    sabotage: Sabotage,
    tolerance: Tolerance,
) -> TractResult<()> {
    let runnable = fixture.runnable()?;
    let expected = solo(fixture, &runnable, schedule)?;
    let observed = by_hand(fixture, &runnable, schedule, sabotage)?;
    check(&expected, &observed, tolerance).map_err(|m| format_err!("{m}\nschedule: {schedule:?}"))
}

/// Run `schedule` through the runner `make` builds from the fixture's plan
/// (given the plan and the lane count), and check every stream against its
/// solo run.
pub fn verify_runner(
    fixture: &fixtures::Fixture,
    schedule: &schedule::Schedule,
    make: &dyn Fn(Arc<dyn Runnable>, usize) -> TractResult<Arc<dyn Runnable>>,
    tolerance: Tolerance,
) -> TractResult<()> {
    let plan = fixture.runnable()?;
    let expected = solo(fixture, &plan, schedule)?;
    let runner = make(plan, schedule.max_lanes)?;
    let observed = through_runner(fixture, runner, schedule, Duration::from_micros(300))?;
    check(&expected, &observed, tolerance).map_err(|m| format_err!("{m}\nschedule: {schedule:?}"))
}

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
