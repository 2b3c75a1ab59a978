//! `finish` ends a stream where it really ends, whichever handle made
//! its calls: a clone's pulses are counted, a dropped call's too.

use std::pin::pin;

use laned_runner::LanedStateHandle;
use laned_testkit::exec::{counting_waker, poll_once};
use laned_testkit::fixtures::{self, Fixture};

use super::*;

/// Streams whose end depends on their length: a conv padded after the
/// end, a valid conv wider than the pulse (a delay to flush), strided convs,
/// the causal TDNN.
fn ending_fixtures() -> Vec<Fixture> {
    vec![
        fixtures::end_padded().unwrap(),
        fixtures::wide_overlap().unwrap(),
        fixtures::strided().unwrap(),
        fixtures::small_tdnn(),
    ]
}

/// The outputs of one stream of `f` fed `calls` pulses then ended on a
/// last pulse of `real` frames, the calls going through `handles` in turn
/// (one handle: the stream as it runs alone) and `finish` through the first.
fn ended_through(f: &Fixture, r: &LanedRunner, handles: usize, calls: u64, real: usize) -> Vec<TVec<TValue>> {
    let first = r.try_spawn().unwrap();
    let mut clones: Vec<LanedStateHandle> = (1..handles).map(|_| first.clone()).collect();
    let mut first = first;
    let mut outputs = vec![];
    for c in 0..calls {
        let k = c as usize % handles;
        let h = if k == 0 { &mut first } else { &mut clones[k - 1] };
        outputs.push(h.call(f.inputs(1, c)).unwrap());
    }
    outputs.extend(first.finish(Some(f.inputs(1, calls)), real).unwrap());
    outputs
}

/// Defect 1 (issue 47): `finish` through a handle whose clone made half the calls ends
/// the stream where it really ends: the outputs equal those of the same
/// stream called through one handle (on main the clone's pulses were not
/// counted, the stream taken to be shorter: fewer flush pulses, another
/// length resolved).
#[test]
fn finish_through_a_clone_counts_every_pulse() {
    for f in ending_fixtures() {
        for (mode, shards) in SETUPS {
            let r = runner_on(
                f.runnable().unwrap(),
                RunnerConfig::builder().mode(mode).shards(shards).max_lanes(2),
            );
            let alone = ended_through(&f, &r, 1, 5, 1);
            let shared = ended_through(&f, &r, 2, 5, 1);
            assert_eq!(
                shared, alone,
                "{} {mode:?}/{shards}: a, c, a, c, a then a.finish",
                f.name
            );
            let three = ended_through(&f, &r, 3, 7, f.pulse);
            assert_eq!(
                three,
                ended_through(&f, &r, 1, 7, f.pulse),
                "{} {mode:?}/{shards}",
                f.name
            );
        }
    }
}

/// Defect 1 (issue 47): a clone made while the original has a dropped call unsettled
/// finishes at the stream's true length: the dropped pulse counted exactly
/// when it ran, whichever handle settles it.
#[test]
fn a_clone_finishes_at_the_true_length_after_a_drop() {
    let f = fixtures::end_padded().unwrap();
    for mode in MODES {
        let r = runner_on(f.runnable().unwrap(), RunnerConfig::builder().mode(mode).max_lanes(3));
        let with_pulse = ended_through(&f, &r, 1, 1, 1);
        let without = {
            let h = r.try_spawn().unwrap();
            h.finish(Some(f.inputs(1, 1)), 1).unwrap()
        };
        let mut h = r.try_spawn().unwrap();
        let (waker, _) = counting_waker();
        {
            let mut fut = pin!(h.call_async(f.inputs(1, 0)));
            assert!(poll_once(fut.as_mut(), &waker).is_pending());
        }
        let clone = h.clone();
        let got = clone.finish(Some(f.inputs(1, 1)), 1).unwrap();
        let ran = h.settle().expect("the dropped call is settled here").ran();
        let want = if ran { &with_pulse[1..] } else { &without[..] };
        assert_eq!(got, want, "{mode:?}: the dropped call ran: {ran}");
    }
}
