//! Implicit state: the state a pulsified model keeps inside its ops (a
//! conv's Delay and PulsePad, a GRU's Scan) is lifted into lanes, so every
//! stream gets its solo run on a plain tract state, and a stream's whole
//! state travels to another runner; an op whose state cannot travel is
//! named, and its streams' state is not exported.

use std::sync::Arc;

use laned_runner::{Laned, LanedRunner, LanedStateHandle, Mode, RunnerConfig, StreamState};
use laned_testkit::fixtures::{self, Fixture};
use laned_testkit::schedule::{Schedule, StreamPlan};
use laned_testkit::{verify_runner, Tolerance};
use tract_core::internal::*;

use crate::common::{bounded, runner, MODES};

/// The models whose state the lift takes whole: a conv stack (PulsePad
/// and Delay), a GRU as tract streams it (Scan), padding on the stream's
/// end (PulsePad with the stream's length) and two delayed branches.
fn lifted() -> Vec<Fixture> {
    vec![
        fixtures::small_tdnn(),
        fixtures::gru_scan(6, 5, 2).unwrap(),
        fixtures::end_padded().unwrap(),
        fixtures::concat_branches().unwrap(),
    ]
}

/// Sixteen streams on sixteen lanes, staggered, of different lengths,
/// four of them ending on a partial pulse, later ones reusing lanes.
fn sixteen() -> Schedule {
    Schedule {
        max_lanes: 13,
        streams: (0..16)
            .map(|s| StreamPlan {
                seed: 700 + s,
                calls: vec![1; 5 + (s as usize % 4)],
                arrive: (s as usize * 7) % 5,
                end: (s % 4 == 3).then_some(1),
            })
            .collect(),
        picks: vec![3, 1, 4, 1, 5, 9, 2, 6],
    }
}

fn ours(mode: Mode) -> impl Fn(Arc<dyn Runnable>, usize) -> TractResult<Arc<dyn Runnable>> {
    move |plan, lanes| {
        let config = RunnerConfig::builder()
            .shards(1)
            .max_lanes(lanes - 1)
            .mode(mode)
            .build();
        Ok(Arc::new(LanedRunner::new(plan, config)?) as Arc<dyn Runnable>)
    }
}

/// Every stream of each lifted model, seated however the runner finds them,
/// gets its run alone on a plain (unlifted) tract state, bit for bit.
#[test]
fn every_stream_of_a_lifted_model_gets_its_solo_run() {
    for fixture in lifted() {
        for mode in MODES {
            verify_runner(&fixture, &sixteen(), &ours(mode), Tolerance::Exact)
                .unwrap_or_else(|e| panic!("{} in {mode:?} mode: {e:#}", fixture.name));
        }
    }
}

/// The runner names every op keeping state and says each is lifted.
#[test]
fn the_runner_names_the_ops_it_lifted() {
    let tdnn = runner(&fixtures::small_tdnn(), Mode::Combining, 1, 4);
    let ops: Vec<&str> = tdnn.implicit_state().iter().map(|s| s.op.as_str()).collect();
    assert!(ops.contains(&"Delay") && ops.contains(&"PulsePad"), "{ops:?}");
    assert!(
        tdnn.implicit_state().iter().all(|s| s.travels()),
        "{:?}",
        tdnn.implicit_state()
    );
    assert!(tdnn.state_travels());
    let gru = runner(&fixtures::gru_scan(6, 5, 2).unwrap(), Mode::Combining, 1, 4);
    let scan: Vec<_> = gru.implicit_state().iter().filter(|s| s.op == "Scan").collect();
    assert_eq!(scan.len(), 1, "{:?}", gru.implicit_state());
    assert!(matches!(scan[0].laned, Laned::Lifted { .. }), "{}", scan[0]);
    assert!(scan[0].to_string().contains("travels"), "{}", scan[0]);
}

/// An edge pad keeps a frame no lift reads out: laned in place, it still
/// serves, but its streams' state is not exported (nor imported), naming it.
#[test]
fn a_state_that_cannot_travel_is_named_and_not_exported() {
    let fixture = fixtures::edge_pad().unwrap();
    let runner = runner(&fixture, Mode::Combining, 1, 4);
    assert!(!runner.state_travels());
    let left: Vec<_> = runner.implicit_state().iter().filter(|s| !s.travels()).collect();
    assert!(!left.is_empty() && left.iter().all(|s| s.op == "PulsePad"), "{left:?}");
    let mut h = runner.try_spawn().unwrap();
    h.run(fixture.inputs(1, 1)).unwrap();
    let e = h.export_state().unwrap_err();
    let text = e.to_string();
    assert!(text.contains("cannot travel") && text.contains(&left[0].node), "{text}");
}

/// Pulse `call` of stream `seed` of `fixture`, one row.
fn pulse(fixture: &Fixture, seed: u64, call: usize) -> TVec<TValue> {
    fixture.inputs(1, seed * 1000 + call as u64)
}

fn data(outputs: TVec<TValue>) -> Vec<Tensor> {
    outputs.into_iter().map(|t| t.into_tensor()).collect()
}

/// A stream run alone on a plain state of the model as the user gave it.
fn alone(fixture: &Fixture, seed: u64, calls: usize) -> Vec<Vec<Tensor>> {
    let mut state = fixture.runnable().unwrap().spawn().unwrap();
    (0..calls)
        .map(|c| data(state.run(pulse(fixture, seed, c)).unwrap()))
        .collect()
}

/// Each stream of each lifted model moved to a second runner after `at`
/// pulses (its state exported as JSON, as the hand-over writes it, and
/// imported into a lane another stream had used) goes on exactly as alone.
#[test]
fn a_stream_moved_to_another_runner_resumes_exactly() {
    for fixture in lifted() {
        for mode in MODES {
            let fixture = fixture.clone();
            bounded("moving streams", move || {
                let from = runner(&fixture, mode, 1, 4);
                let to = runner(&fixture, mode, 1, 4);
                // A lane of `to` used by another stream first.
                let mut other = to.try_spawn().unwrap();
                for c in 0..3 {
                    other.run(pulse(&fixture, 99, c)).unwrap();
                }
                drop(other);
                for (seed, at) in [(1u64, 1usize), (2, 3), (3, 5)] {
                    let calls = 8;
                    let want = alone(&fixture, seed, calls);
                    let mut a = from.try_spawn().unwrap();
                    let mut got: Vec<Vec<Tensor>> = (0..at)
                        .map(|c| data(a.run(pulse(&fixture, seed, c)).unwrap()))
                        .collect();
                    let json = serde_json::to_string(&a.export_state().unwrap()).unwrap();
                    drop(a);
                    let state: StreamState = serde_json::from_str(&json).unwrap();
                    let mut b: LanedStateHandle = to.try_spawn().unwrap();
                    b.import_state(&state).unwrap();
                    got.extend((at..calls).map(|c| data(b.run(pulse(&fixture, seed, c)).unwrap())));
                    assert_eq!(got, want, "{} in {mode:?} mode, moved after {at}", fixture.name);
                }
            });
        }
    }
}

/// Negative control: a stream resumed on a fresh lane without its state
/// (what a hand-over of only the explicit state did) gets other answers.
#[test]
fn a_stream_resumed_without_its_state_differs() {
    for fixture in lifted() {
        let to = runner(&fixture, Mode::Combining, 1, 2);
        let want = alone(&fixture, 5, 6);
        let mut b = to.try_spawn().unwrap();
        let got: Vec<Vec<Tensor>> = (3..6).map(|c| data(b.run(pulse(&fixture, 5, c)).unwrap())).collect();
        assert_ne!(got, want[3..], "{}: the check cannot see a lost state", fixture.name);
    }
}

/// `served` is what a turn runs: three streams batched by hand on a plain
/// state of the served plan (each explicit state fed a row per stream from
/// its initial value, its next value fed back; a Delay's or a PulsePad's
/// kept in the runner's own ops, a row a lane) get what three streams of
/// the runner get; without the state carried, they would not.
#[test]
fn the_served_plan_batched_by_hand_is_what_the_runner_serves() {
    for f in [fixtures::small_tdnn(), fixtures::gru_scan(6, 5, 2).unwrap()] {
        let r = runner(&f, Mode::Worker, 1, 4);
        let (plan, kept) = r.served();
        let kept_in_ops = r.implicit_state().iter().any(|s| matches!(s.laned, Laned::Kept));
        assert!(!kept.is_empty() || kept_in_ops, "{}: the lift kept nothing", f.name);
        let mut state = plan.spawn().unwrap();
        let mut values: Vec<TValue> = kept
            .iter()
            .map(|k| {
                Tensor::stack_tensors(k.axis, &[k.initial.clone(), k.initial.clone(), k.initial.clone()])
                    .unwrap()
                    .into_tvalue()
            })
            .collect();
        let mut streams: Vec<LanedStateHandle> = (0..3).map(|_| r.try_spawn().unwrap()).collect();
        let mut last_by_hand = None;
        for call in 0..4u64 {
            let batch = f.inputs(3, 40 + call);
            let mut inputs = batch.clone();
            for (k, v) in kept.iter().zip(&values) {
                inputs.insert(k.input.min(inputs.len()), v.clone());
            }
            let out = state.run(inputs).unwrap();
            for (k, v) in kept.iter().zip(values.iter_mut()) {
                *v = out[k.output].clone();
            }
            let by_hand = &out[0];
            for (s, h) in streams.iter_mut().enumerate() {
                let row: TVec<TValue> = batch
                    .iter()
                    .map(|t| t.slice(0, s, s + 1).unwrap().into_tvalue())
                    .collect();
                let got = h.call(row).unwrap();
                assert_eq!(
                    got[0].clone().into_tensor(),
                    by_hand.slice(0, s, s + 1).unwrap(),
                    "{}: call {call}, stream {s}",
                    f.name
                );
            }
            last_by_hand = Some(by_hand.clone().into_tensor());
        }
        // Negative control: the fourth call's inputs on a fresh state (the
        // kept state at its initial value, nothing carried) differ from the
        // fourth call's answer: the check sees a state that is not fed back.
        let mut fresh = plan.spawn().unwrap();
        let mut inputs = f.inputs(3, 43);
        for k in &kept {
            let z = Tensor::stack_tensors(k.axis, &[k.initial.clone(), k.initial.clone(), k.initial.clone()]).unwrap();
            inputs.insert(k.input.min(inputs.len()), z.into_tvalue());
        }
        let again = fresh.run(inputs).unwrap();
        assert_ne!(
            Some(again[0].clone().into_tensor()),
            last_by_hand,
            "{}: no state carried",
            f.name
        );
    }
}

/// Pulses `from..to` of stream `seed` of `fixture` through `h`: their
/// outputs.
fn run_calls(fixture: &Fixture, h: &mut LanedStateHandle, seed: u64, from: usize, to: usize) -> Vec<Vec<Tensor>> {
    (from..to)
        .map(|c| data(h.run(pulse(fixture, seed, c)).unwrap()))
        .collect()
}

/// Stream `seed` of `fixture` on one runner, never moved: 5 pulses, then
/// its end (a last pulse of one real frame): every output.
fn unmoved_to_its_end(fixture: &Fixture, mode: Mode, seed: u64) -> Vec<Vec<Tensor>> {
    let unmoved = runner(fixture, mode, 1, 4);
    let mut h = unmoved.try_spawn().unwrap();
    let mut outputs = run_calls(fixture, &mut h, seed, 0, 5);
    outputs.extend(
        h.finish(Some(pulse(fixture, seed, 5)), 1)
            .unwrap()
            .into_iter()
            .map(data),
    );
    outputs
}

/// A stream moved mid-stream (3 pulses on one runner, its state through
/// JSON to another, 2 more there) ends at its own length on the second:
/// the state carries the pulses it fed, so `finish` pads its end where the
/// same stream finished unmoved does (issue 67's first defect).
#[test]
fn a_stream_moved_mid_stream_ends_at_its_own_length() {
    let fixture = fixtures::end_padded().unwrap();
    for mode in MODES {
        let fixture = fixture.clone();
        bounded("finishing a moved stream", move || {
            let seed = 11;
            let want = unmoved_to_its_end(&fixture, mode, seed);

            let (a_runner, b_runner) = (runner(&fixture, mode, 1, 4), runner(&fixture, mode, 1, 4));
            let mut a = a_runner.try_spawn().unwrap();
            let mut got = run_calls(&fixture, &mut a, seed, 0, 3);
            let json = serde_json::to_string(&a.export_state().unwrap()).unwrap();
            drop(a);
            let state: StreamState = serde_json::from_str(&json).unwrap();
            assert_eq!(state.pulses, Some(3), "the exported state carries the pulses fed");
            let mut b = b_runner.try_spawn().unwrap();
            b.import_state(&state).unwrap();
            got.extend(run_calls(&fixture, &mut b, seed, 3, 5));
            got.extend(
                b.finish(Some(pulse(&fixture, seed, 5)), 1)
                    .unwrap()
                    .into_iter()
                    .map(data),
            );
            assert_eq!(
                got.len(),
                want.len(),
                "{mode:?}: moved, the stream ends after another count of pulses"
            );
            assert_eq!(got, want, "{mode:?}: the moved stream's end differs");
        });
    }
}

/// `state` with the `I64` tensor of shape `[1]` (a PulsePad's position)
/// set to `value`, built through serde (the struct is non-exhaustive).
fn with_position(state: &StreamState, value: i64) -> StreamState {
    let mut json = serde_json::to_value(state).unwrap();
    let tensors = json["tensors"].as_array_mut().unwrap();
    let at = tensors
        .iter()
        .position(|t| t["datum_type"] == "I64" && t["shape"] == serde_json::json!([1]))
        .expect("a position among the state's tensors");
    tensors[at]["data"] = serde_json::json!(value.to_le_bytes().to_vec());
    serde_json::from_value(json).unwrap()
}

/// An imported stream position no stream could have reached (negative, an
/// extreme, one pulse ahead of the count the state carries) is refused by
/// name at import; the stream seated beside it is never told `Turn` or
/// `Lost` and keeps getting its solo run (issue 67's second defect).
#[test]
fn an_unreachable_stream_position_is_refused_at_import() {
    let fixture = fixtures::small_tdnn();
    for mode in MODES {
        let fixture = fixture.clone();
        bounded("importing unreachable positions", move || {
            let r = runner(&fixture, mode, 1, 4);
            let mut a = r.try_spawn().unwrap();
            for c in 0..3 {
                a.run(pulse(&fixture, 21, c)).unwrap();
            }
            let exported = a.export_state().unwrap();
            drop(a);
            let step = {
                let json = serde_json::to_value(&exported).unwrap();
                let t = json["tensors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|t| t["datum_type"] == "I64" && t["shape"] == serde_json::json!([1]))
                    .unwrap()
                    .clone();
                let bytes: Vec<u8> = serde_json::from_value(t["data"].clone()).unwrap();
                i64::from_le_bytes(bytes.try_into().unwrap()) / 3
            };
            assert!(step > 0, "the position moves with the stream");
            let want = alone(&fixture, 22, 6);
            let mut neighbour = r.try_spawn().unwrap();
            let mut got = vec![];
            for (k, bad) in [-1, i64::MIN, i64::MAX, 4 * step, 2 * step].into_iter().enumerate() {
                let mut b = r.try_spawn().unwrap();
                let e = b.import_state(&with_position(&exported, bad)).unwrap_err();
                let text = e.to_string();
                assert!(
                    matches!(e.kind(), laned_runner::RunErrorKind::State(_)) && text.contains("position"),
                    "{mode:?}, position {bad}: {text}"
                );
                // Refused whole: the lane serves as a fresh stream, beside the neighbour.
                b.run(pulse(&fixture, 23, 0)).unwrap();
                got.push(data(neighbour.run(pulse(&fixture, 22, k)).unwrap()));
            }
            got.push(data(neighbour.run(pulse(&fixture, 22, 5)).unwrap()));
            assert_eq!(got, want, "{mode:?}: the neighbour's stream changed");
            // The position the stream did reach is taken.
            let mut c = r.try_spawn().unwrap();
            c.import_state(&with_position(&exported, 3 * step)).unwrap();
        });
    }
}

/// A stream restored from another's snapshot (3 pulses on one runner,
/// `state_snapshot`, `restore_state` on a fresh stream of another, 2 more
/// pulses) stands where its kept position says: it ends at its own
/// length, and its state exports and imports as any stream's.
#[test]
fn a_restored_stream_stands_where_its_position_says() {
    let fixture = fixtures::end_padded().unwrap();
    for mode in MODES {
        let fixture = fixture.clone();
        bounded("restoring a snapshot", move || {
            let seed = 12;
            let want = unmoved_to_its_end(&fixture, mode, seed);

            let (a_runner, b_runner) = (runner(&fixture, mode, 1, 4), runner(&fixture, mode, 1, 4));
            let mut a = a_runner.try_spawn().unwrap();
            let mut got = run_calls(&fixture, &mut a, seed, 0, 3);
            let snapshot = a.state_snapshot().unwrap();
            drop(a);
            let mut b = b_runner.try_spawn().unwrap();
            b.restore_state(snapshot).unwrap();
            got.extend(run_calls(&fixture, &mut b, seed, 3, 4));
            // Its export carries the pulses it stands at, and is taken.
            let exported = b.export_state().unwrap();
            assert_eq!(exported.pulses, Some(4), "{mode:?}");
            b_runner.check_state(&exported).unwrap();
            got.extend(run_calls(&fixture, &mut b, seed, 4, 5));
            got.extend(
                b.finish(Some(pulse(&fixture, seed, 5)), 1)
                    .unwrap()
                    .into_iter()
                    .map(data),
            );
            assert_eq!(got, want, "{mode:?}: the restored stream's end differs");
        });
    }
}

/// A snapshot whose stream position is no pulse's (negative, or off the
/// step) is refused whole by `restore_state`: the stream keeps its state.
#[test]
fn a_restore_of_an_unreachable_position_is_refused_whole() {
    let fixture = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner(&fixture, mode, 1, 4);
        let mut a = r.try_spawn().unwrap();
        for c in 0..2 {
            a.run(pulse(&fixture, 31, c)).unwrap();
        }
        let snapshot = a.state_snapshot().unwrap();
        let at = snapshot
            .iter()
            .position(|t| t.datum_type() == i64::datum_type() && t.shape() == [1])
            .expect("a position among the state's tensors");
        let step = snapshot[at].try_as_plain_ram().unwrap().as_slice::<i64>().unwrap()[0] / 2;
        let want = alone(&fixture, 31, 4);
        let mut got: Vec<Vec<Tensor>> = vec![];
        for bad in [-step, step + 1] {
            let mut broken = snapshot.clone();
            broken[at] = tensor1(&[bad]);
            let zeros: TVec<Tensor> = snapshot
                .iter()
                .map(|t| Tensor::zero_dt(t.datum_type(), t.shape()).unwrap())
                .collect();
            broken.iter_mut().zip(zeros).enumerate().for_each(|(i, (t, z))| {
                if i != at {
                    *t = z;
                }
            });
            let e = a.restore_state(broken).unwrap_err();
            assert!(e.to_string().contains("position"), "{mode:?}, {bad}: {e}");
        }
        got.extend((2..4).map(|c| data(a.run(pulse(&fixture, 31, c)).unwrap())));
        assert_eq!(got, want[2..], "{mode:?}: a refused restore changed the stream");
    }
}
