//! Explicit-state lanes: a model carrying its state as an input and an
//! output (state batch on axis 1) is served with the state kept per lane:
//! every stream gets exactly what it gets feeding its state back alone.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use laned_runner::{LanedRunner, LanedStateHandle, Mode, PortRef, RunnerConfig, StatePair, StateSpec};
use laned_testkit::fixtures::{self, Lcg};
use tract_core::internal::*;

const F: usize = 8;
const H: usize = 6;

fn plan() -> Arc<dyn Runnable> {
    DefaultRuntime
        .prepare(fixtures::rnn_cell(F, H).unwrap())
        .unwrap()
        .into()
}

fn x(rows: usize, seed: u64) -> Tensor {
    let mut rng = Lcg(seed | 1);
    let v: Vec<f32> = (0..rows * F).map(|_| rng.uniform()).collect();
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

fn runner(spec: StateSpec, mode: Mode, shards: usize, lanes: usize) -> LanedRunner {
    let config = RunnerConfig::builder()
        .state(spec)
        .mode(mode)
        .shards(shards)
        .max_lanes(lanes)
        .linger(Duration::from_millis(2))
        .build();
    LanedRunner::new(plan(), config).unwrap()
}

/// Streams calling at once (shared turns), arriving staggered and reusing
/// lanes of streams that ended: each stream's outputs equal its solo run.
#[test]
fn every_stream_gets_its_solo_run() {
    let plan = plan();
    for (mode, shards) in [(Mode::Worker, 1), (Mode::Combining, 1), (Mode::Worker, 3)] {
        let r = runner(StateSpec::Detect, mode, shards, 4);
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
    for mode in [Mode::Worker, Mode::Combining] {
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
    for mode in [Mode::Worker, Mode::Combining] {
        let r = runner(StateSpec::Detect, mode, 1, 2);
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
    let spec = StateSpec::Pairs(vec![StatePair {
        input: PortRef::Name("state".into()),
        output: PortRef::Index(1),
    }]);
    let r = runner(spec, Mode::Worker, 1, 2);
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

    let bad = StateSpec::Pairs(vec![StatePair {
        input: PortRef::Name("hidden".into()),
        output: PortRef::Index(1),
    }]);
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
    let r = runner(StateSpec::Detect, Mode::Worker, 1, 1);
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
    for mode in [Mode::Worker, Mode::Combining] {
        let (from, to) = (
            runner(StateSpec::Detect, mode, 1, 2),
            runner(StateSpec::Detect, mode, 1, 2),
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
