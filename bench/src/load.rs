//! Load on the testkit's fixtures: the two references every figure is
//! compared with (a state per stream, and the ideal loop: the model as
//! given on one plain batched tract state, no lanes API, inputs
//! pre-stacked) and
//! streams through any runnable, each stream fed a fixture's inputs. The
//! generators themselves, the measures, the CPU clocks and the capacity
//! search are `laned_load`'s.

use std::sync::Arc;
use std::time::Duration;

use tract_core::internal::*;

use laned_testkit::fixtures::Fixture;

use laned_load::ideal::Batch;
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

/// The ideal loop (ideal: the model as given on one plain batched tract
/// state): one thread, one plain state of `plan` (the fixture's model as
/// prepared, never a runner's plan) run with `n` rows, no lanes API, inputs
/// pre-stacked ([`laned_load::ideal`]). No queue at all.
pub fn ideal(fixture: &Fixture, plan: Arc<dyn Runnable>, n: usize, duration: Duration) -> TractResult<Throughput> {
    ideal_shards(fixture, plan, n, 1, duration)
}

/// The shards' ideal loop: `shards` threads, each one plain state of `plan`
/// batched to its share of `n` streams (shared as a sharded runner places
/// them), no lanes API, inputs pre-stacked. What a sharded runner is
/// measured against.
pub fn ideal_shards(
    fixture: &Fixture,
    plan: Arc<dyn Runnable>,
    n: usize,
    shards: usize,
    duration: Duration,
) -> TractResult<Throughput> {
    let fixture = fixture.clone();
    laned_load::ideal::closed_loop(plan, n, shards, duration, move |rows| {
        Ok(batch(&fixture, rows.len(), 7))
    })
}

/// What the ideal loop feeds a state of `rows` streams: the fixture's
/// inputs of `rows` rows drawn from `seed`, its explicit state's zeros with
/// `rows` on the state's batch axis.
pub fn batch(fixture: &Fixture, rows: usize, seed: u64) -> Batch {
    Batch {
        inputs: fixture.inputs(rows, seed),
        state: fixture
            .state
            .iter()
            .map(|port| {
                let mut shape = port.shape.clone();
                shape[port.axis] = rows;
                (port.input, port.output, Tensor::zero::<f32>(&shape).expect("f32 zeros"))
            })
            .collect(),
    }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use laned_testkit::fixtures;

    use super::*;

    /// A runnable whose states refuse the lanes API (and remember being
    /// asked): the ideal loop must run on it as on the plan it wraps.
    #[derive(Debug)]
    struct NoLanes {
        plan: Arc<dyn Runnable>,
        asked: Arc<AtomicBool>,
    }

    #[derive(Debug, Clone)]
    struct NoLanesState {
        state: Box<dyn State>,
        asked: Arc<AtomicBool>,
    }

    impl State for NoLanesState {
        fn run(&mut self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
            self.state.run(inputs)
        }
        fn seat(&mut self, _: tract_core::plan::Seating) -> TractResult<()> {
            self.asked.store(true, Ordering::Relaxed);
            bail!("the ideal loop seated a state: it must not touch the lanes API")
        }
        fn reset_lanes(&mut self, _: &[tract_core::plan::LaneId]) -> TractResult<()> {
            self.asked.store(true, Ordering::Relaxed);
            bail!("the ideal loop reset lanes: it must not touch the lanes API")
        }
        fn runnable(&self) -> &dyn Runnable {
            self.state.runnable()
        }
    }

    impl Runnable for NoLanes {
        fn spawn(&self) -> TractResult<Box<dyn State>> {
            Ok(Box::new(NoLanesState {
                state: self.plan.spawn()?,
                asked: self.asked.clone(),
            }))
        }
        fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
            self.plan.typed_plan()
        }
        fn typed_model(&self) -> Option<&Arc<TypedModel>> {
            self.plan.typed_model()
        }
    }

    fn no_lanes(fixture: &Fixture) -> (Arc<dyn Runnable>, Arc<AtomicBool>) {
        let asked = Arc::new(AtomicBool::new(false));
        let plan = Arc::new(NoLanes {
            plan: fixture.runnable().unwrap(),
            asked: asked.clone(),
        });
        (plan, asked)
    }

    /// Row `row` of a batch's inputs: a slice of each batched input, a
    /// shared one as it is.
    fn row_of(fixture: &Fixture, inputs: &TVec<TValue>, row: usize) -> TVec<TValue> {
        fixture
            .inputs
            .iter()
            .zip(inputs)
            .map(|(spec, input)| {
                if spec.batched {
                    input.slice(0, row, row + 1).unwrap().into_tvalue()
                } else {
                    input.clone()
                }
            })
            .collect()
    }

    /// The ceiling is the model, exactly: every row of the ideal loop's
    /// one plain batched state answers, call after call, what the model
    /// answers that stream alone (its own plain state, its explicit state
    /// fed back by hand), bit for bit: on the pulsified conv TDNN (its
    /// Delay and PulsePad state kept by tract's plain op states, unseated),
    /// a strided one, a GRU as a Scan, and a GRU cell whose explicit state
    /// is batched on axis 1.
    #[test]
    fn the_ideal_loop_answers_what_the_model_answers_each_stream_alone() {
        let fixtures = [
            fixtures::small_tdnn(),
            fixtures::strided().unwrap(),
            fixtures::gru_scan(8, 8, 2).unwrap(),
            fixtures::gru_cell(8, 8).unwrap(),
        ];
        for fixture in &fixtures {
            let (plan, asked) = no_lanes(fixture);
            let n = 3;
            let first = batch(fixture, n, 0);
            let mut ideal = laned_load::ideal::state(&plan, first.state).unwrap();
            let mut alone: Vec<Box<dyn State>> = (0..n)
                .map(|_| {
                    let one = batch(fixture, 1, 0).state;
                    laned_load::ideal::state(&fixture.runnable().unwrap(), one).unwrap()
                })
                .collect();
            for call in 0..6u64 {
                let inputs = batch(fixture, n, call).inputs;
                let got = ideal.run(inputs.clone()).unwrap();
                for (row, solo) in alone.iter_mut().enumerate() {
                    let want = solo.run(row_of(fixture, &inputs, row)).unwrap();
                    assert_eq!(got.len(), want.len(), "{}", fixture.name);
                    for (g, w) in got.iter().zip(&want) {
                        let g = g.slice(0, row, row + 1).unwrap();
                        assert_eq!(
                            &g, &**w,
                            "{}: call {call}, stream {row}: the ideal loop's row is not the model's answer",
                            fixture.name
                        );
                    }
                }
            }
            assert!(!asked.load(Ordering::Relaxed), "{}", fixture.name);
        }
    }

    /// The ideal loops run on a plan whose states refuse `seat` and
    /// `reset_lanes`: they never touch the lanes API, one thread or a
    /// thread per shard, with and without explicit state.
    #[test]
    fn the_ideal_loops_never_touch_the_lanes_api() {
        for fixture in [fixtures::small_tdnn(), fixtures::gru_cell(8, 8).unwrap()] {
            let (plan, asked) = no_lanes(&fixture);
            let d = Duration::from_millis(20);
            let one = ideal(&fixture, plan.clone(), 4, d).unwrap();
            let shards = ideal_shards(&fixture, plan, 5, 2, d).unwrap();
            assert!(one.per_sec > 0.0 && shards.per_sec > 0.0, "{}", fixture.name);
            assert!(!asked.load(Ordering::Relaxed), "{}", fixture.name);
        }
    }
}
