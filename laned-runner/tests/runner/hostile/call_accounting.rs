//! What a call is counted as: a dropped call's verdict settles that call
//! alone (a later call waits for none), and a call queued behind a held
//! state counts as queued from its first poll.

use std::pin::pin;
use std::task::Poll;

use laned_runner::Settled;
use laned_testkit::exec::{counting_waker, poll_once};

use super::*;

/// Defect 6 (issue 47): a call made while an earlier dropped call's verdict has not
/// landed is refused at once (`Unsettled`, inputs back), so that a `settle`
/// always settles one call; once that verdict landed as not run, the next
/// call goes ahead, and a `settle` after it is dropped is its own. On main
/// the second call waited for the first's verdict and went ahead, and one
/// `settle` answered for either.
#[test]
fn a_verdict_settles_one_named_call() {
    for mode in MODES {
        bounded("two drops, one verdict", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder().mode(mode).max_lanes(3),
            );
            let (mut a, b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let (xp, xq, xr) = (pulse(&[3], 1.0), pulse(&[3], 10.0), pulse(&[3], 100.0));
            let (waker, _) = counting_waker();
            // P: queued behind b's long turn, then dropped; its cancel waits
            // in the inbox until the turn ends, so its verdict is undecided.
            let long = slow_turn(&switch, b, &xp, Duration::from_millis(300));
            {
                let mut p = pin!(a.call_async(tvalue(&xp)));
                assert!(poll_once(p.as_mut(), &waker).is_pending());
                assert!(poll_once(p.as_mut(), &waker).is_pending());
            }
            // Q while P is undecided: refused at its first poll.
            {
                let mut q = pin!(a.call_async(tvalue(&xq)));
                match poll_once(q.as_mut(), &waker) {
                    Poll::Ready(Err(e)) => {
                        assert_eq!(*e.kind(), RunErrorKind::Unsettled, "{mode:?}");
                        assert_eq!(
                            e.into_inputs().expect("the inputs come back")[0].clone().into_tensor(),
                            xq
                        );
                    }
                    other => panic!(
                        "{mode:?}: a call behind an undecided drop: {:?}",
                        other.map(|r| r.is_ok())
                    ),
                }
            }
            long.join().unwrap().1.unwrap();
            assert!(
                matches!(a.settle(), Some(Settled::NotRun)),
                "{mode:?}: P was never seated"
            );
            // Q now goes ahead; dropped after its first poll, its verdict is
            // the one `settle` gives, and it names Q's pulse.
            {
                let mut q = pin!(a.call_async(tvalue(&xq)));
                assert!(poll_once(q.as_mut(), &waker).is_pending());
            }
            let ran = match a.settle() {
                Some(Settled::Ran(mut out)) => {
                    assert_eq!(out.remove(0).into_tensor(), solo(&xq, 0), "{mode:?}: Q's answer");
                    1
                }
                Some(Settled::NotRun) => 0,
                other => panic!("{mode:?}: {other:?}"),
            };
            assert_eq!(
                call(&mut a, &xr).unwrap(),
                solo(&xr, ran),
                "{mode:?}: P never ran, Q ran {ran}"
            );
        });
    }
}

/// Defect 7 (issue 47): a call queued while the state is held (a turn running) counts
/// in `capacity().seats_queued` from its first poll, in both modes, though
/// no engine took it in yet (on main it counted only once taken in: in
/// combining mode when its task polled again).
#[test]
fn a_call_polled_once_counts_as_queued() {
    for mode in MODES {
        bounded("queued seats from the first poll", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder().mode(mode).max_lanes(3),
            );
            let (mut a, b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let x = pulse(&[3], 1.0);
            let long = slow_turn(&switch, b, &x, Duration::from_millis(300));
            assert_eq!(r.capacity().seats_queued, 0, "{mode:?}: only b's seat, seated");
            let (waker, _) = counting_waker();
            let mut fut = Box::pin(a.call_async(tvalue(&x)));
            assert!(poll_once(fut.as_mut(), &waker).is_pending());
            let capacity = r.capacity();
            assert_eq!(capacity.seats_queued, 1, "{mode:?}: {capacity:?}");
            assert_eq!(capacity.shards[0].seats_queued, 1, "{mode:?}");
            long.join().unwrap().1.unwrap();
            let out = current_thread().block_on(fut).unwrap();
            assert_eq!(out[0].clone().into_tensor(), solo(&x, 0), "{mode:?}");
            assert_eq!(r.capacity().seats_queued, 0, "{mode:?}: answered, nothing queued");
        });
    }
}
