//! Every rule of turns and isolation, each in both modes, errors asserted on
//! their text.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use laned_runner::{LanedRunner, LanedStateHandle, Mode, NewRunnerError, RunErrorKind, RunnerConfig, SpawnError};
use laned_testkit::fixtures::{self, Fixture};
use tract_core::internal::*;

use crate::common::{one_shard, MODES};

/// What `inputs` give on a fresh solo state.
fn solo(fixture: &Fixture, inputs: TVec<TValue>) -> TVec<TValue> {
    fixture.runnable().unwrap().spawn().unwrap().run(inputs).unwrap()
}

type Answer = Result<TVec<TValue>, laned_runner::RunError>;

/// Calls each handle once, all at once, one thread each; hands the handles
/// back with the answers.
fn call_all_keep(handles: Vec<(LanedStateHandle, TVec<TValue>)>) -> Vec<(Answer, LanedStateHandle)> {
    let threads: Vec<_> = handles
        .into_iter()
        .map(|(mut h, inputs)| thread::spawn(move || (h.call(inputs), h)))
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn call_all(handles: Vec<(LanedStateHandle, TVec<TValue>)>) -> Vec<Answer> {
    call_all_keep(handles).into_iter().map(|(a, _)| a).collect()
}

/// A wide call explodes into one seat per row and is answered stacked.
#[test]
fn a_wide_call_is_answered_stacked() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = one_shard(&f, mode, 4, Duration::ZERO);
        let mut h = r.try_spawn().unwrap();
        let out = h.call(f.inputs(3, 5)).unwrap();
        assert_eq!(out[0].shape(), &[3, 32, 4]);
        let m = r.metrics();
        assert_eq!((m.turns, m.seats), (1, 3), "{mode:?}");
    }
}

/// A call wider than the free lanes is split at the turn boundary; its
/// later rows borrow the runner's spare lane turn after turn.
#[test]
fn a_call_wider_than_the_free_lanes_is_split() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = one_shard(&f, mode, 1, Duration::ZERO);
        let mut h = r.try_spawn().unwrap();
        let out = h.call(f.inputs(3, 5)).unwrap();
        assert_eq!(out[0].shape(), &[3, 32, 4]);
        let m = r.metrics();
        assert_eq!(
            (m.turns, m.seats),
            (2, 3),
            "{mode:?}: row 0 + row 1 borrowed, then row 2 borrowed"
        );
    }
}

/// A linger ends as soon as every held lane has a seat queued.
#[test]
fn a_linger_ends_once_every_held_lane_is_queued() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = one_shard(&f, mode, 3, Duration::from_secs(3600));
        let handles = (0..3).map(|s| (r.try_spawn().unwrap(), f.inputs(1, s))).collect();
        for out in call_all(handles) {
            out.unwrap();
        }
        let m = r.metrics();
        assert_eq!((m.turns, m.seats), (1, 3), "{mode:?}");
    }
}

/// Seats agreeing on a shared input share a turn; seats disagreeing are not
/// failed, they go to different turns.
#[test]
fn shared_inputs_group_seats_into_turns() {
    let f = fixtures::shared_gain().unwrap();
    let with_gain = |seed: u64, gain: f32| {
        let mut inputs = f.inputs(1, seed);
        inputs[1] = tensor3(&[[[gain]]]).into_tvalue();
        inputs
    };
    for mode in MODES {
        let r = one_shard(&f, mode, 2, Duration::from_secs(3600));
        let handles = vec![
            (r.try_spawn().unwrap(), with_gain(1, 0.5)),
            (r.try_spawn().unwrap(), with_gain(2, 0.5)),
        ];
        assert!(call_all(handles).iter().all(|o| o.is_ok()));
        assert_eq!(
            (r.metrics().turns, r.metrics().seats),
            (1, 2),
            "{mode:?}: agreeing seats share a turn"
        );

        let r = one_shard(&f, mode, 2, Duration::from_millis(200));
        let handles = vec![
            (r.try_spawn().unwrap(), with_gain(1, 0.5)),
            (r.try_spawn().unwrap(), with_gain(2, 2.0)),
        ];
        let outs = call_all(handles);
        assert_eq!(*outs[0].as_ref().unwrap()[0], *solo(&f, with_gain(1, 0.5))[0]);
        assert_eq!(*outs[1].as_ref().unwrap()[0], *solo(&f, with_gain(2, 2.0))[0]);
        assert_eq!(
            (r.metrics().turns, r.metrics().seats),
            (2, 2),
            "{mode:?}: disagreeing seats take a turn each"
        );
    }
}

/// A symbol resolved on a handle holds for its next call only, and seats
/// resolving different values never share a turn.
#[test]
fn resolved_symbols_hold_for_one_call_and_split_turns() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = one_shard(&f, mode, 2, Duration::from_millis(200));
        let (mut a, mut b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
        a.resolve(&f.stream, 5).unwrap();
        b.resolve(&f.stream, 7).unwrap();
        let outs = call_all_keep(vec![(a, f.inputs(1, 1)), (b, f.inputs(1, 2))]);
        assert!(outs.iter().all(|o| o.0.is_ok()));
        assert_eq!(r.metrics().turns, 2, "{mode:?}: different resolutions, different turns");
        // The resolutions held for that call only.
        let mut outs = outs.into_iter();
        let (a, b) = (outs.next().unwrap().1, outs.next().unwrap().1);
        // Both held lanes will queue: a long linger makes them share a turn
        // however slow the machine.
        r.set_policy(laned_runner::TurnPolicy::linger(Duration::from_secs(3600)))
            .unwrap();
        let outs = call_all(vec![(a, f.inputs(1, 3)), (b, f.inputs(1, 4))]);
        assert!(outs.iter().all(|o| o.is_ok()));
        assert_eq!(r.metrics().turns, 3, "{mode:?}: nothing resolved, one shared turn");

        let mut c = r.try_spawn().unwrap();
        let err = c.resolve(r.batch_symbol(), 3).unwrap_err();
        assert_eq!(err.to_string(), "cannot resolve the symbol: B is the batch symbol, which stands for the turn's occupancy, not for one stream");
    }
}

/// A bad call gets its own clear error (naming the input, the shape it got
/// and the one wanted) and its inputs back; the rest of the turn runs.
#[test]
fn a_bad_input_fails_its_own_call_only() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = one_shard(&f, mode, 2, Duration::from_millis(100));
        let bad = tvec!(Tensor::zero::<f32>(&[1, 39, 4]).unwrap().into_tvalue());
        let good = f.inputs(1, 9);
        let outs = call_all(vec![
            (r.try_spawn().unwrap(), bad.clone()),
            (r.try_spawn().unwrap(), good.clone()),
        ]);
        let err = outs[0].clone().unwrap_err();
        assert_eq!(
            err.to_string(),
            "input 0 (\"features\") is F32 [1, 39, 4], the model wants F32 [B, 40, 4]"
        );
        assert_eq!(
            err.into_inputs().unwrap()[0],
            bad[0],
            "a refused call gets its inputs back"
        );
        assert_eq!(*outs[1].as_ref().unwrap()[0], *solo(&f, good)[0]);

        let mut h = r.try_spawn().unwrap();
        let err = h.call(tvec!()).unwrap_err();
        assert_eq!(err.to_string(), "the call feeds 0 inputs, the model takes 1");
        let err = h
            .call(tvec!(Tensor::zero::<i32>(&[1, 40, 4]).unwrap().into_tvalue()))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "input 0 (\"features\") is I32 [1, 40, 4], the model wants F32 [B, 40, 4]"
        );
        // The stream itself is fine afterwards.
        assert_eq!(*h.call(f.inputs(1, 9)).unwrap()[0], *solo(&f, f.inputs(1, 9))[0]);
    }
}

/// Batched inputs disagreeing on their rows are refused.
#[test]
fn batched_inputs_must_agree_on_rows() {
    let f = fixtures::two_in_two_out().unwrap();
    let r = one_shard(&f, Mode::Worker, 2, Duration::ZERO);
    let mut inputs = f.inputs(2, 1);
    inputs[1] = f.inputs(1, 1)[1].clone();
    let err = r.try_spawn().unwrap().call(inputs).unwrap_err();
    assert_eq!(
        err.to_string(),
        "input 1 (\"right\") feeds 1 rows on axis 0, the batched inputs before it feed 2"
    );
}

/// A turn tract fails with an error (not a panic) hands its callers that
/// error as the `source()` of theirs, its text in their message too.
#[test]
fn a_failed_turn_carries_tracts_error_as_its_source() {
    let f = fixtures::panicking().unwrap();
    for mode in MODES {
        let r = one_shard(&f, mode, 2, Duration::from_secs(3600));
        let mut a = r.try_spawn().unwrap();
        let mut refused = f.inputs(1, 1);
        refused[0] = Tensor::from_shape(&[1, 40, 4], &[fixtures::REFUSED; 160])
            .unwrap()
            .into_tvalue();
        let err = a.call(refused).unwrap_err();
        assert!(
            matches!(err.kind(), laned_runner::RunErrorKind::Turn(_)),
            "{mode:?}: {err}"
        );
        assert!(err.to_string().contains("refused input"), "{err}");
        let source = std::error::Error::source(&err).expect("tract's error as the source");
        let chain: Vec<String> = std::iter::successors(Some(source), |e| e.source())
            .map(|e| e.to_string())
            .collect();
        assert!(chain.iter().any(|e| e.contains("refused input")), "{chain:?}");
        // A refusal of ours (bad input) has no tract error behind it.
        let bad = a.call(tvec!()).unwrap_err();
        assert!(std::error::Error::source(&bad).is_none(), "{bad}");
    }
}

/// A panic inside a turn fails that turn's callers only: their streams are
/// told their state is lost, every other stream and new ones are served.
#[test]
fn a_panicking_turn_fails_its_seats_only() {
    let f = fixtures::panicking().unwrap();
    for mode in MODES {
        let r = one_shard(&f, mode, 3, Duration::from_secs(3600));
        let (a, b, mut c) = (r.try_spawn().unwrap(), r.try_spawn().unwrap(), r.try_spawn().unwrap());
        let mut poisoned = f.inputs(1, 1);
        poisoned[0] = Tensor::from_shape(&[1, 40, 4], &[fixtures::POISON; 160])
            .unwrap()
            .into_tvalue();
        // All three held lanes queue a seat, so the three share one turn.
        let (mut a2, mut b2) = (a.clone(), b.clone());
        let outs = call_all(vec![(a, poisoned), (b, f.inputs(1, 2)), (c.clone(), f.inputs(1, 3))]);
        let text = |o: &Result<TVec<TValue>, laned_runner::RunError>| o.as_ref().unwrap_err().to_string();
        assert!(
            text(&outs[0]).starts_with("the turn seating this call failed: the model panicked: poisoned input"),
            "{}",
            text(&outs[0])
        );
        assert_eq!(text(&outs[0]), text(&outs[1]));
        assert_eq!(text(&outs[0]), text(&outs[2]), "c shared the failed turn");
        // Later calls on the lost streams fail clearly.
        let err = a2.call(f.inputs(1, 4)).unwrap_err();
        assert!(matches!(err.kind(), RunErrorKind::Lost(_)));
        assert!(err.to_string().ends_with("; spawn a new stream"), "{err}");
        assert!(b2.call(f.inputs(1, 4)).is_err());
        assert!(c.call(f.inputs(1, 4)).is_err());
        drop((a2, b2, c));
        // The runner keeps serving: a new stream gets exactly its solo run.
        let mut d = r.try_spawn().unwrap();
        assert_eq!(*d.call(f.inputs(1, 5)).unwrap()[0], *solo(&f, f.inputs(1, 5))[0]);
        assert_eq!(r.metrics().failed_turns, 1);
        assert_eq!(r.metrics().failed_seats, 3 + 3);
    }
}

/// A panicking turn does not touch a stream it did not seat.
#[test]
fn a_stream_outside_a_failed_turn_keeps_its_state() {
    let f = fixtures::panicking().unwrap();
    for mode in MODES {
        let r = one_shard(&f, mode, 2, Duration::ZERO);
        let (mut a, mut c) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
        let solo_state = f.runnable().unwrap();
        let mut c_solo = solo_state.spawn().unwrap();
        for t in 0..3 {
            assert_eq!(
                *c.call(f.inputs(1, 10 + t)).unwrap()[0],
                *c_solo.run(f.inputs(1, 10 + t)).unwrap()[0]
            );
        }
        let mut poisoned = f.inputs(1, 1);
        poisoned[0] = Tensor::from_shape(&[1, 40, 4], &[fixtures::POISON; 160])
            .unwrap()
            .into_tvalue();
        assert!(a.call(poisoned).is_err());
        for t in 3..6 {
            assert_eq!(
                *c.call(f.inputs(1, 10 + t)).unwrap()[0],
                *c_solo.run(f.inputs(1, 10 + t)).unwrap()[0],
                "{mode:?} turn {t}"
            );
        }
    }
}

/// Dropping the runner answers a queued call with an error; later calls and
/// spawns fail at once, never hang.
#[test]
fn dropping_the_runner_answers_queued_calls() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = one_shard(&f, mode, 2, Duration::from_secs(3600));
        let (mut a, mut b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
        let inputs = f.inputs(1, 1);
        let queued = thread::spawn(move || a.call(inputs));
        thread::sleep(Duration::from_millis(50));
        let runnable: Arc<dyn Runnable> = Arc::new(r.clone());
        drop(r);
        drop(runnable);
        let err = queued.join().unwrap().unwrap_err();
        assert_eq!(err.to_string(), "the laned runner was closed", "{mode:?}");
        let err = b.call(f.inputs(1, 2)).unwrap_err();
        assert_eq!(err.to_string(), "the laned runner was closed");
        assert!(err.into_inputs().is_some());
    }
}

/// Dropping a clone while its twin's call is queued loses nothing: the lane
/// stays held, the call and the turn's other seats are answered right.
#[test]
fn a_clone_dropped_while_its_twin_calls_loses_nothing() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = one_shard(&f, mode, 2, Duration::from_millis(100));
        let a = r.try_spawn().unwrap();
        let twin = a.clone();
        let b = r.try_spawn().unwrap();
        let (ia, ib) = (f.inputs(1, 1), f.inputs(1, 2));
        let mut a_moved = a;
        let t = thread::spawn(move || (a_moved.call(ia), a_moved));
        drop(twin);
        let mut b = b;
        let out_b = b.call(ib.clone()).unwrap();
        let (out_a, _a) = t.join().unwrap();
        let out_a = out_a.unwrap();
        assert_eq!(*out_a[0], *solo(&f, f.inputs(1, 1))[0]);
        assert_eq!(*out_b[0], *solo(&f, ib)[0]);
        assert_eq!(r.metrics().lanes_taken, 2, "{mode:?}: the stream still holds its lane");
    }
}

/// Two clones of one stream calling at once are served in two turns, one
/// after the other on the stream's state, though the caller of the first
/// leaves once answered (in `Combining` mode the helper serves the second).
#[test]
fn twin_calls_on_one_stream_are_both_served_in_turn() {
    let f = fixtures::small_tdnn();
    let x = f.inputs(1, 7);
    let mut reference = f.runnable().unwrap().spawn().unwrap();
    let first = reference.run(x.clone()).unwrap();
    let second = reference.run(x.clone()).unwrap();
    assert_ne!(*first[0], *second[0], "the fixture's state must show the order");
    for mode in MODES {
        let r = one_shard(&f, mode, 2, Duration::ZERO);
        for round in 0..40 {
            let a = r.try_spawn().unwrap();
            let answers = call_all(vec![(a.clone(), x.clone()), (a, x.clone())]);
            let mut outs: Vec<Tensor> = answers
                .into_iter()
                .map(|o| {
                    o.unwrap_or_else(|e| panic!("{mode:?} round {round}: {e}"))[0]
                        .clone()
                        .into_tensor()
                })
                .collect();
            if outs[0] != *first[0] {
                outs.swap(0, 1);
            }
            assert_eq!(
                outs[0], *first[0],
                "{mode:?} round {round}: one call gets the first pulse's answer"
            );
            assert_eq!(outs[1], *second[0], "{mode:?} round {round}: the other the second's");
        }
    }
}

/// `spawn` fails at once when every lane is taken, saying how many; the
/// last handle of a stream dropped gives its lane back.
#[test]
fn the_last_handle_dropped_gives_the_lane_back() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = one_shard(&f, mode, 1, Duration::ZERO);
        let a = r.try_spawn().unwrap();
        let err = r.try_spawn().unwrap_err();
        assert_eq!(
            err,
            SpawnError::Full {
                total_lanes: 1,
                waiting: 0
            }
        );
        assert_eq!(
            err.to_string(),
            "every one of the 1 lanes is taken (0 streams waiting for one)"
        );
        let clone = a.clone();
        drop(a);
        assert!(r.try_spawn().is_err(), "{mode:?}: a clone still holds the lane");
        drop(clone);
        let mut b = r.try_spawn().unwrap();
        assert_eq!(*b.call(f.inputs(1, 3)).unwrap()[0], *solo(&f, f.inputs(1, 3))[0]);
    }
}

fn new_error(model: TypedModel) -> String {
    let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(model).unwrap().into();
    LanedRunner::new(plan, RunnerConfig::builder().shards(1).build())
        .unwrap_err()
        .to_string()
}

#[test]
fn a_batch_off_axis_zero_is_refused_saying_where_it_sits() {
    let mut model = TypedModel::default();
    let b = model.symbols.sym("B");
    let x = model.add_source("x", f32::fact(dims!(3, b))).unwrap();
    let y = model.wire_node("y", tract_core::ops::math::mul(), &[x, x]).unwrap();
    model.select_output_outlets(&y).unwrap();
    let err = new_error(model);
    assert!(err.contains("input 0 (\"x\") carries B on axis 1"), "{err}");
    assert!(err.starts_with("the model has no usable batch axis"), "{err}");
}

#[test]
fn two_batch_symbols_are_refused_naming_both() {
    let mut model = TypedModel::default();
    let (b, c) = (model.symbols.sym("B"), model.symbols.sym("C"));
    let x = model.add_source("x", f32::fact(dims!(b, 3))).unwrap();
    let y = model.add_source("y", f32::fact(dims!(c, 3))).unwrap();
    let z = model.wire_node("z", tract_core::ops::math::add(), &[x, y]);
    // tract may refuse B + C itself; then use two outputs.
    let outputs = match z {
        Ok(z) => z,
        Err(_) => vec![x, y].into(),
    };
    model.select_output_outlets(&outputs).unwrap();
    let err = new_error(model);
    assert!(err.contains("B and C"), "{err}");
}

#[test]
fn a_model_without_a_batched_output_is_refused() {
    let mut model = TypedModel::default();
    let b = model.symbols.sym("B");
    let x = model.add_source("x", f32::fact(dims!(b, 3))).unwrap();
    let k = model.add_const("k", tensor1(&[1f32])).unwrap();
    model.select_output_outlets(&[x, k]).unwrap();
    let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(model.clone()).unwrap().into();
    // Keep only the constant as output.
    let mut only_const = model;
    only_const.select_output_outlets(&[k]).unwrap();
    let _ = plan;
    let err = new_error(only_const);
    assert!(
        err.contains("none of the model's 1 outputs carries the batch symbol on axis 0"),
        "{err}"
    );
}

/// A state that cannot serve several streams (tract's Scan) is refused at
/// construction, naming the op, not at the first shared turn.
#[test]
fn a_scan_is_refused_at_construction_naming_the_op() {
    for mode in MODES {
        let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(fixtures::scan_cumsum().unwrap()).unwrap().into();
        let err = LanedRunner::new(plan, RunnerConfig::builder().shards(1).mode(mode).build()).unwrap_err();
        assert!(matches!(err, NewRunnerError::Reset { .. }));
        let text = err.to_string();
        assert!(text.contains("at node \"scan\""), "{text}");
        assert!(text.contains("Scan is not lane-aware"), "{text}");
    }
}

/// tract-pulse's PulseMask (behind a transposed conv) is not lane-aware
/// either: refused at construction, naming the node and the op.
#[test]
fn a_pulse_mask_is_refused_at_construction_naming_the_op() {
    let plan = fixtures::deconv().unwrap().runnable().unwrap();
    let err = LanedRunner::new(plan, RunnerConfig::builder().shards(1).build()).unwrap_err();
    assert!(matches!(err, NewRunnerError::Reset { .. }));
    let text = err.to_string();
    assert!(text.contains("at node \"deconv.mask\" (op PulseMask)"), "{text}");
    assert!(text.contains("not lane-aware"), "{text}");
}
