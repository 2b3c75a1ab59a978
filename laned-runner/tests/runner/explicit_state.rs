//! Explicit-state lanes: a model carrying its state as an input and an
//! output (state batch on axis 1) is served with the state kept per lane:
//! every stream gets exactly what it gets feeding its state back alone.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use fastrand::Rng;
use laned_runner::{LanedRunner, LanedStateHandle, Mode, PortRef, RunnerConfig, StatePair, StateSpec};
use laned_testkit::fixtures;
use tract_core::internal::*;

use crate::common::{runner_on, MODES};

const F: usize = 8;
const H: usize = 6;

fn plan() -> Arc<dyn Runnable> {
    DefaultRuntime
        .prepare(fixtures::rnn_cell(F, H).unwrap())
        .unwrap()
        .into()
}

fn x(rows: usize, seed: u64) -> Tensor {
    let mut rng = Rng::with_seed(seed);
    let v: Vec<f32> = (0..rows * F).map(|_| rng.f32() * 2.0 - 1.0).collect();
    Tensor::from_shape(&[rows, F], &v).unwrap()
}

/// The reference: one plain state per stream, its state fed back by hand.
fn solo(plan: &Arc<dyn Runnable>, xs: &[Tensor]) -> Vec<Tensor> {
    let mut state = plan.spawn().unwrap();
    let mut h = Tensor::zero::<f32>(&[1, 1, H]).unwrap();
    xs.iter()
        .map(|x| {
            let out = state
                .run(tvec!(x.clone().into_tvalue(), h.clone().into_tvalue()))
                .unwrap();
            h = out[1].clone().into_tensor();
            out[0].clone().into_tensor()
        })
        .collect()
}

/// A stream's outputs for `xs`, one call each.
fn feed(h: &mut LanedStateHandle, xs: &[Tensor]) -> Vec<Tensor> {
    xs.iter()
        .map(|x| h.call(tvec!(x.clone().into_tvalue())).unwrap()[0].clone().into_tensor())
        .collect()
}

/// A runner on the RNN cell keeping its state as `spec` says.
fn rnn_runner(spec: StateSpec, mode: Mode, shards: usize, lanes: usize) -> LanedRunner {
    runner_on(
        plan(),
        RunnerConfig::builder()
            .state(spec)
            .mode(mode)
            .shards(shards)
            .max_lanes(lanes)
            .linger(Duration::from_millis(2)),
    )
}

/// Streams calling at once (shared turns), arriving staggered and reusing
/// lanes of streams that ended: each stream's outputs equal its solo run.
#[test]
fn every_stream_gets_its_solo_run() {
    let plan = plan();
    for (mode, shards) in [(Mode::Worker, 1), (Mode::Combining, 1), (Mode::Worker, 3)] {
        let r = rnn_runner(StateSpec::Detect, mode, shards, 4);
        let threads: Vec<_> = (0..8u64)
            .map(|s| {
                let r = r.clone();
                thread::spawn(move || {
                    // Four at once (shared turns), four later (reused lanes).
                    thread::sleep(Duration::from_millis(if s < 4 { 0 } else { 20 + 3 * s }));
                    let xs: Vec<Tensor> = (0..5).map(|t| x(1, s * 100 + t)).collect();
                    let mut h = r.spawn_timeout(Duration::from_secs(20)).unwrap();
                    let got = feed(&mut h, &xs);
                    (xs, got)
                })
            })
            .collect();
        for (s, t) in threads.into_iter().enumerate() {
            let (xs, got) = t.join().unwrap();
            let want = solo(&plan, &xs);
            assert_eq!(got, want, "{mode:?}, {shards} shards: stream {s}");
        }
    }
}

/// Streams with different states share every turn (a long linger ends
/// once all three held lanes are queued), each getting its own state back.
#[test]
fn streams_with_different_states_share_turns() {
    let plan = plan();
    for mode in MODES {
        let config = RunnerConfig::builder()
            .state(StateSpec::Detect)
            .mode(mode)
            .shards(1)
            .max_lanes(3)
            .linger(Duration::from_secs(3600))
            .build();
        let r = LanedRunner::new(plan.clone(), config).unwrap();
        let handles: Vec<_> = (0..3).map(|_| r.try_spawn().unwrap()).collect();
        let threads: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(s, mut h)| {
                thread::spawn(move || {
                    let xs: Vec<Tensor> = (0..4).map(|t| x(1, 500 + s as u64 * 10 + t)).collect();
                    let got = feed(&mut h, &xs);
                    (xs, got)
                })
            })
            .collect();
        for t in threads {
            let (xs, got) = t.join().unwrap();
            assert_eq!(got, solo(&plan, &xs), "{mode:?}");
        }
        let m = r.metrics();
        assert_eq!((m.turns, m.occupancy[3]), (4, 4), "{mode:?}: four turns of three seats");
    }
}

/// A wide call: row 0 continues the stream, the others start from the
/// initial state (a borrowed lane, reset).
#[test]
fn a_wide_call_continues_the_stream_in_its_first_row() {
    let plan = plan();
    for mode in MODES {
        let r = rnn_runner(StateSpec::Detect, mode, 1, 2);
        let mut h = r.try_spawn().unwrap();
        let first = x(1, 1);
        let got_first = h.call(tvec!(first.clone().into_tvalue())).unwrap()[0]
            .clone()
            .into_tensor();
        let wide = x(3, 2);
        let got = h.call(tvec!(wide.clone().into_tvalue())).unwrap()[0]
            .clone()
            .into_tensor();
        let row = |t: &Tensor, i: usize| t.slice(0, i, i + 1).unwrap();
        let stream = solo(&plan, &[first, row(&wide, 0)]);
        assert_eq!(got_first, stream[0]);
        assert_eq!(row(&got, 0), stream[1], "{mode:?}: row 0 continues the stream");
        for i in 1..3 {
            assert_eq!(
                row(&got, i),
                solo(&plan, &[row(&wide, i)])[0],
                "{mode:?}: row {i} starts fresh"
            );
        }
    }
}

/// Pairs named in the config work as detected ones; a wrong name says what
/// the model has.
#[test]
fn pairs_by_name_and_clear_errors() {
    let plan = plan();
    let spec = StateSpec::Pairs(vec![StatePair::new(PortRef::Name("state".into()), PortRef::Index(1))]);
    let r = rnn_runner(spec, Mode::Worker, 1, 2);
    let mut h = r.try_spawn().unwrap();
    let xs = [x(1, 5), x(1, 6)];
    for (x, want) in xs.iter().zip(solo(&plan, &xs)) {
        assert_eq!(
            h.call(tvec!(x.clone().into_tvalue())).unwrap()[0].clone().into_tensor(),
            want
        );
    }
    assert_eq!(
        h.call(tvec!()).unwrap_err().to_string(),
        "the call feeds 0 inputs, the model takes 1"
    );

    let bad = StateSpec::Pairs(vec![StatePair::new("hidden", 1)]);
    let err = LanedRunner::new(plan.clone(), RunnerConfig::builder().state(bad).build())
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "invalid runner configuration: no input named \"hidden\"; the model's inputs are [\"x\", \"state\"]"
    );
}

/// A stream's state survives only in its own lane: a new stream on a
/// reused lane starts from the initial state.
#[test]
fn a_reused_lane_starts_from_the_initial_state() {
    let plan = plan();
    let r = rnn_runner(StateSpec::Detect, Mode::Worker, 1, 1);
    let mut a = r.try_spawn().unwrap();
    for t in 0..3 {
        a.call(tvec!(x(1, 40 + t).into_tvalue())).unwrap();
    }
    drop(a);
    let mut b = r.spawn_timeout(Duration::from_secs(20)).unwrap();
    let got = b.call(tvec!(x(1, 7).into_tvalue())).unwrap()[0].clone().into_tensor();
    assert_eq!(got, solo(&plan, &[x(1, 7)])[0]);
}

/// A stream's state can be read and moved to another runner (another
/// shard, another process): the moved stream continues exactly.
#[test]
fn a_stream_moves_between_runners_through_its_state() {
    let plan = plan();
    for mode in MODES {
        let (from, to) = (
            rnn_runner(StateSpec::Detect, mode, 1, 2),
            rnn_runner(StateSpec::Detect, mode, 1, 2),
        );
        let xs: Vec<Tensor> = (0..6).map(|t| x(1, 70 + t)).collect();
        let want = solo(&plan, &xs);
        let mut a = from.try_spawn().unwrap();
        // Another stream on the destination runs meanwhile (a lane taken).
        let mut other = to.try_spawn().unwrap();
        other.call(tvec!(x(1, 99).into_tvalue())).unwrap();
        for t in 0..3 {
            assert_eq!(
                a.call(tvec!(xs[t].clone().into_tvalue())).unwrap()[0]
                    .clone()
                    .into_tensor(),
                want[t]
            );
        }
        let state = a.state_snapshot().unwrap();
        assert_eq!(state.len(), 1);
        assert_eq!(state[0].shape(), &[1, 1, H]);
        drop(a);
        let mut b = to.try_spawn().unwrap();
        b.restore_state(state).unwrap();
        for t in 3..6 {
            assert_eq!(
                b.call(tvec!(xs[t].clone().into_tvalue())).unwrap()[0]
                    .clone()
                    .into_tensor(),
                want[t],
                "{mode:?} call {t}"
            );
        }
        let err = b
            .restore_state(tvec!(Tensor::zero::<f32>(&[1, 2, H]).unwrap()))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot set the stream's state: state input 1 takes F32 [1, 1, 6] per stream, got F32 [1, 2, 6]"
        );
    }
}

/// A configured initial state is where every new stream starts, and where
/// a wide call's borrowed rows start; a wrong shape is refused naming it.
#[test]
fn a_configured_initial_state_is_where_streams_start() {
    let plan = plan();
    let init: Vec<f64> = (0..H).map(|i| i as f64 * 0.25 - 0.5).collect();
    let h0 = Tensor::from_shape(&[1, 1, H], &init.iter().map(|v| *v as f32).collect::<Vec<f32>>()).unwrap();
    let spec = StateSpec::Pairs(vec![
        StatePair::new("state", "stateN").with_initial(vec![1, 1, H], init.clone())
    ]);
    for mode in MODES {
        let r = rnn_runner(spec.clone(), mode, 1, 2);
        let mut a = r.try_spawn().unwrap();
        let xs = [x(1, 31), x(1, 32)];
        assert_eq!(feed(&mut a, &xs), solo_from(&plan, &xs, &h0), "{mode:?}");
        assert_ne!(
            feed(&mut r.try_spawn().unwrap(), &xs[..1]),
            solo(&plan, &xs[..1]),
            "zeros differ"
        );
        let wide = x(2, 33);
        let got = a.call(tvec!(wide.clone().into_tvalue())).unwrap()[0]
            .clone()
            .into_tensor();
        assert_eq!(
            got.slice(0, 1, 2).unwrap(),
            solo_from(&plan, &[wide.slice(0, 1, 2).unwrap()], &h0)[0],
            "{mode:?}: a borrowed row starts from the initial state"
        );
    }
    let wrong = StateSpec::Pairs(vec![StatePair::new("state", "stateN").with_initial(vec![1, 2, H], init)]);
    let err = LanedRunner::new(plan.clone(), RunnerConfig::builder().state(wrong).build()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid runner configuration: the initial state of input 1 (\"state\") has shape [1, 2, 6], one stream's state is [1, 1, 6]"
    );
    let short = StateSpec::Pairs(vec![
        StatePair::new("state", "stateN").with_initial(vec![1, 1, H], vec![0.0; 2])
    ]);
    let err = LanedRunner::new(plan, RunnerConfig::builder().state(short).build()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid runner configuration: the initial state of input 1 (\"state\") gives 2 values for shape [1, 1, 6], which holds 6"
    );
}

/// An idle stream evicted from its lane leaves nothing of its state behind:
/// the stream taking the lane starts from the initial state, and the
/// evicted one is told so at its next call.
#[test]
fn an_evicted_stream_leaves_no_state_behind() {
    let plan = plan();
    for mode in MODES {
        let config = RunnerConfig::builder()
            .state(StateSpec::Detect)
            .mode(mode)
            .shards(1)
            .max_lanes(1)
            .idle_timeout(Duration::from_millis(30))
            .build();
        let r = LanedRunner::new(plan.clone(), config).unwrap();
        let mut idle = r.try_spawn().unwrap();
        feed(&mut idle, &[x(1, 80), x(1, 81), x(1, 82)]);
        let mut next = r.spawn_timeout(Duration::from_secs(20)).unwrap();
        let xs = [x(1, 90), x(1, 91)];
        assert_eq!(feed(&mut next, &xs), solo(&plan, &xs), "{mode:?}");
        let err = idle.call(tvec!(x(1, 83).into_tvalue())).unwrap_err();
        assert!(err.to_string().starts_with("the stream was evicted"), "{mode:?}: {err}");
    }
}

/// [`solo`], the state starting from `h0`.
fn solo_from(plan: &Arc<dyn Runnable>, xs: &[Tensor], h0: &Tensor) -> Vec<Tensor> {
    let mut state = plan.spawn().unwrap();
    let mut h = h0.clone();
    xs.iter()
        .map(|x| {
            let out = state
                .run(tvec!(x.clone().into_tvalue(), h.clone().into_tvalue()))
                .unwrap();
            h = out[1].clone().into_tensor();
            out[0].clone().into_tensor()
        })
        .collect()
}

mod harness {
    //! The testkit's property harness on an explicit-state fixture (a GRU
    //! cell, state batch on axis 1): arbitrary arrivals, wide calls and lane
    //! reuse, through the runner in both modes.

    use std::sync::{Arc, Mutex};

    use laned_runner::{LanedRunner, LanedStateHandle, Mode, RunnerConfig, StateSpec};
    use laned_testkit::fixtures::{self, Fixture};
    use laned_testkit::schedule::{proptest_config, schedule, Schedule, ScheduleConfig, StreamPlan};
    use laned_testkit::{verify_runner, Tolerance};
    use proptest::prelude::*;
    use tract_core::internal::*;

    fn gru() -> Fixture {
        fixtures::gru_cell(5, 4).unwrap()
    }

    fn config(mode: Mode, shards: usize, lanes: usize) -> RunnerConfig {
        RunnerConfig::builder()
            .state(StateSpec::Detect)
            .mode(mode)
            .shards(shards)
            .max_lanes(lanes - 1)
            .build()
    }

    fn check(schedule: &Schedule, mode: Mode, shards: usize) -> Result<(), TestCaseError> {
        let make = move |plan, lanes| -> TractResult<Arc<dyn Runnable>> {
            Ok(Arc::new(LanedRunner::new(plan, config(mode, shards, lanes))?))
        };
        verify_runner(&gru(), schedule, &make, Tolerance::Exact)
            .map_err(|e| TestCaseError::fail(format!("{mode:?}, {shards} shards: {e:#}")))
    }

    fn pinned() -> Schedule {
        Schedule {
            max_lanes: 4,
            streams: (0..7)
                .map(|s| StreamPlan {
                    seed: 40 + s,
                    calls: if s % 3 == 1 {
                        vec![1, 2, 1, 1]
                    } else {
                        vec![1; 4 + s as usize % 3]
                    },
                    arrive: s as usize / 2,
                    end: None,
                })
                .collect(),
            picks: vec![u64::MAX],
        }
    }

    #[test]
    fn pinned_explicit_state_schedule_both_modes() {
        for (mode, shards) in [(Mode::Worker, 1), (Mode::Combining, 1), (Mode::Worker, 2)] {
            check(&pinned(), mode, shards).unwrap();
        }
    }

    /// A runner that serves every stream from one lane (state shared across
    /// streams) is caught by the same check.
    #[test]
    fn the_harness_catches_streams_sharing_a_state() {
        #[derive(Debug)]
        struct OneLaneForAll {
            runner: LanedRunner,
            handle: Mutex<Option<LanedStateHandle>>,
        }
        impl Runnable for OneLaneForAll {
            fn spawn(&self) -> TractResult<Box<dyn State>> {
                let mut handle = self.handle.lock().unwrap();
                if handle.is_none() {
                    *handle = Some(self.runner.try_spawn()?);
                }
                Ok(Box::new(handle.clone().unwrap()))
            }
            fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
                self.runner.typed_plan()
            }
            fn typed_model(&self) -> Option<&Arc<TypedModel>> {
                self.runner.typed_model()
            }
        }
        let make = |plan, lanes| -> TractResult<Arc<dyn Runnable>> {
            Ok(Arc::new(OneLaneForAll {
                runner: LanedRunner::new(plan, config(Mode::Worker, 1, lanes))?,
                handle: Mutex::new(None),
            }))
        };
        let err = verify_runner(&gru(), &pinned(), &make, Tolerance::Exact).unwrap_err();
        assert!(format!("{err:#}").contains("solo gives"), "{err:#}");
    }

    proptest! {
        #![proptest_config(proptest_config(12))]
        #[test]
        fn prop_explicit_state(
            schedule in schedule(ScheduleConfig { ends: false, ..ScheduleConfig::default() }),
            combining in any::<bool>(),
            shards in 1..=2usize,
        ) {
            let mode = if combining { Mode::Combining } else { Mode::Worker };
            check(&schedule, mode, shards)?;
        }
    }
}

/// The same with streams as tokio tasks (`spawn_async`, `call_async`): the
/// explicit state is kept per lane for tasks as for threads.
#[test]
fn async_streams_keep_their_state_per_lane() {
    let plan = plan();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    for (mode, shards) in [(Mode::Worker, 1), (Mode::Combining, 1), (Mode::Worker, 3)] {
        let r = rnn_runner(StateSpec::Detect, mode, shards, 4);
        let results = rt.block_on(async {
            let tasks: Vec<_> = (0..8u64)
                .map(|s| {
                    let r = r.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(if s < 4 { 0 } else { 20 + 3 * s })).await;
                        let xs: Vec<Tensor> = (0..5).map(|t| x(1, s * 100 + t)).collect();
                        let mut h = r.spawn_async().await.unwrap();
                        let mut got = vec![];
                        for x in &xs {
                            got.push(
                                h.call_async(tvec!(x.clone().into_tvalue())).await.unwrap()[0]
                                    .clone()
                                    .into_tensor(),
                            );
                        }
                        (xs, got)
                    })
                })
                .collect();
            let mut results = vec![];
            for t in tasks {
                results.push(
                    tokio::time::timeout(Duration::from_secs(60), t)
                        .await
                        .expect("hung")
                        .unwrap(),
                );
            }
            results
        });
        for (s, (xs, got)) in results.into_iter().enumerate() {
            assert_eq!(got, solo(&plan, &xs), "{mode:?}, {shards} shards: stream {s}");
        }
    }
}

/// A stream handed over on the wire (`export_state`, JSON, `import_state`
/// on another runner) continues exactly; another version, another model's
/// state, corrupt bytes and a shape too big to address are refused, naming
/// what differs, and leave the receiving stream's state as it was.
#[test]
fn a_stream_moves_between_processes_on_the_wire() {
    let plan = plan();
    for mode in MODES {
        let (from, to) = (
            rnn_runner(StateSpec::Detect, mode, 1, 2),
            rnn_runner(StateSpec::Detect, mode, 2, 2),
        );
        let xs: Vec<Tensor> = (0..6).map(|t| x(1, 170 + t)).collect();
        let want = solo(&plan, &xs);
        let mut a = from.try_spawn().unwrap();
        assert_eq!(feed(&mut a, &xs[..3]), want[..3]);
        let json = serde_json::to_string(&a.export_state().unwrap()).unwrap();
        drop(a);
        let wire: laned_runner::StreamState = serde_json::from_str(&json).unwrap();
        assert_eq!(wire.version, laned_runner::STREAM_STATE_VERSION);
        assert!(wire.model.contains(&format!("F32 1,B,{H}")), "{}", wire.model);
        let mut b = to.try_spawn().unwrap();
        b.import_state(&wire).unwrap();
        assert_eq!(feed(&mut b, &xs[3..]), want[3..], "{mode:?}");

        // Refusals leave the stream as it was: it continues from zeros.
        let mut fresh = to.try_spawn().unwrap();
        let mut newer = wire.clone();
        newer.version += 1;
        let e = fresh.import_state(&newer).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot set the stream's state: the stream state is of version 4, this runner reads version 3"
        );
        // The version before implicit state travelled is refused by name.
        let mut older = wire.clone();
        older.version = 2;
        let e = fresh.import_state(&older).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot set the stream's state: the stream state is of version 2, this runner reads version 3"
        );
        let mut other = wire.clone();
        other.model = other.model.replace(&format!(",{H}"), ",7");
        let e = fresh.import_state(&other).unwrap_err();
        assert!(e.to_string().contains("this runner serves"), "{e}");
        let mut corrupt = wire.clone();
        corrupt.tensors[0].data.pop();
        let e = fresh.import_state(&corrupt).unwrap_err();
        assert!(e.to_string().contains("bytes"), "{e}");
        // A shape whose element count overflows: refused against the
        // model's shape for one stream, not a panic, and not a wrapped
        // product matching an empty buffer.
        for huge in [vec![1usize << 62, 4], vec![usize::MAX, 2]] {
            let mut overflowing = wire.clone();
            overflowing.tensors[0].shape = huge.clone();
            overflowing.tensors[0].data.clear();
            let e = fresh.import_state(&overflowing).unwrap_err();
            assert!(
                e.to_string().contains(&format!("takes F32 [1, 1, {H}] per stream")),
                "{huge:?}: {e}"
            );
        }
        assert_eq!(feed(&mut fresh, &xs[..2]), want[..2], "untouched by the refusals");
    }
}

/// The runner says which (input, output) pairs it keeps: those detected by
/// name, those configured by name, none without explicit state.
#[test]
fn the_runner_names_the_state_pairs_it_keeps() {
    let detected = rnn_runner(StateSpec::Detect, Mode::Worker, 1, 2);
    assert_eq!(detected.explicit_state(), vec![(1, 1)]);
    let plain = LanedRunner::new(
        fixtures::small_tdnn().runnable().unwrap(),
        RunnerConfig::builder().shards(1).max_lanes(2).build(),
    )
    .unwrap();
    assert_eq!(plain.explicit_state(), vec![]);
}
