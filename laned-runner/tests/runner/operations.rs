//! Running the runner in a server: the soft drain, the capacity reads a
//! readiness probe polls, why a stream ended, and call deadlines. Every
//! test body is bounded: a hang fails it.

use crate::common;

use common::{bounded, eventually, runner, runner_with, MODES, SETUPS};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use laned_runner::{
    CancelToken, EndReason, LanedRunner, LanedStateHandle, Mode, RunErrorKind, RunnerConfig, SpawnError, TurnPolicy,
};
use laned_testkit::fixtures::{self, Fixture};
use proptest::prelude::*;
use tract_core::internal::*;

/// The solo outputs of stream `s`'s first `calls` pulses.
fn solo(f: &Fixture, s: u64, calls: usize) -> Vec<TVec<TValue>> {
    let mut state = f.runnable().unwrap().spawn().unwrap();
    (0..calls)
        .map(|c| state.run(f.inputs(1, s * 100 + c as u64)).unwrap())
        .collect()
}

/// A soft drain with 32 live streams: new spawns are refused with
/// `Draining` from the instant `stop_admitting` returns, every live stream
/// finishes its remaining calls bit-exact against solo, and `drain`
/// returns once the last one ended, with no straggler.
#[test]
fn a_soft_drain_lets_32_live_streams_finish_exactly() {
    bounded("soft drain", || {
        let f = fixtures::small_tdnn();
        for (mode, shards) in SETUPS {
            let r = runner(&f, mode, shards, 33usize.div_ceil(shards));
            // Each stream: 4 calls before the drain, 3 to 12 after it.
            let started = Arc::new(Barrier::new(33));
            let go_on = Arc::new(Barrier::new(33));
            let streams: Vec<_> = (0..32u64)
                .map(|s| {
                    let (r, f, started, go_on) = (r.clone(), f.clone(), started.clone(), go_on.clone());
                    thread::spawn(move || {
                        let mut h = r.try_spawn().unwrap();
                        let calls = 7 + (s as usize % 10);
                        let want = solo(&f, s, calls);
                        for (c, want) in want.iter().enumerate() {
                            if c == 4 {
                                started.wait();
                                go_on.wait();
                            }
                            let got = h.call(f.inputs(1, s * 100 + c as u64)).unwrap();
                            assert_eq!(&got, want, "stream {s}, call {c}");
                            if c % 3 == 0 {
                                thread::sleep(Duration::from_millis(2));
                            }
                        }
                        assert_eq!(h.end_reason(), None, "stream {s} is still served");
                    })
                })
                .collect();
            started.wait();
            r.stop_admitting();
            assert!(!r.is_admitting() && !r.capacity().accepting && !r.capacity().is_ready());
            // From the first instant, whichever way a spawn asks.
            assert_eq!(r.try_spawn().unwrap_err(), SpawnError::Draining);
            assert_eq!(
                r.spawn_timeout(Duration::from_secs(1)).unwrap_err(),
                SpawnError::Draining
            );
            go_on.wait();
            let drained = r.drain(Instant::now() + Duration::from_secs(30));
            for s in streams {
                s.join().unwrap();
            }
            assert_eq!(drained.stragglers, 0, "{mode:?}, {shards} shards");
            assert!(drained.metrics.seats >= 32 * 7);
        }
    });
}

/// A spawner waiting for a lane when the drain starts is answered
/// `Draining` at once, not at the end of its wait (an hour: the test's
/// bound fails first).
#[test]
fn a_waiting_spawner_is_answered_when_admission_stops() {
    bounded("waiting spawner", || {
        let f = fixtures::small_tdnn();
        for (mode, shards) in SETUPS {
            let r = runner(&f, mode, shards, 1);
            let held: Vec<_> = (0..shards).map(|_| r.try_spawn().unwrap()).collect();
            let r2 = r.clone();
            let waiter = thread::spawn(move || r2.spawn_timeout(Duration::from_secs(3600)).map(|_| ()));
            eventually("the spawner waits", || r.capacity().spawners_waiting == 1);
            assert!(!r.capacity().is_ready(), "no lane free and a spawner waits: unready");
            r.stop_admitting();
            assert_eq!(waiter.join().unwrap().unwrap_err(), SpawnError::Draining);
            drop(held);
        }
    });
}

/// A drain past its deadline closes the runner with the stragglers still
/// live; each is told why at its next call (`Draining`, end reason
/// `Drained`) and by `end_reason`.
#[test]
fn a_drain_past_its_deadline_tells_the_stragglers() {
    bounded("drain deadline", || {
        let f = fixtures::small_tdnn();
        for (mode, shards) in SETUPS {
            let r = runner(&f, mode, shards, 4);
            let mut stragglers: Vec<LanedStateHandle> = (0..3).map(|_| r.try_spawn().unwrap()).collect();
            let ended = r.try_spawn().unwrap();
            let r2 = r.clone();
            let deadline = Instant::now() + Duration::from_millis(300);
            let drain = thread::spawn(move || r2.drain(deadline));
            // One stream ends during the drain; the others do not.
            thread::sleep(Duration::from_millis(50));
            drop(ended);
            let drained = drain.join().unwrap();
            assert!(Instant::now() >= deadline, "returned before the deadline");
            assert_eq!(drained.stragglers, 3, "{mode:?}, {shards} shards");
            for h in &mut stragglers {
                let e = h.call(f.inputs(1, 0)).unwrap_err();
                assert_eq!(*e.kind(), RunErrorKind::Draining, "{e}");
                assert!(e.stream_is_gone());
                assert_eq!(e.end_reason(), Some(EndReason::Drained));
                assert!(e.end_reason().unwrap().may_retry());
                assert_eq!(h.end_reason(), Some(EndReason::Drained));
            }
        }
    });
}

/// A drain with no stream returns at once, not at its deadline (an hour:
/// the test's bound fails first).
#[test]
fn a_drain_with_no_stream_returns_at_once() {
    bounded("empty drain", || {
        let f = fixtures::small_tdnn();
        let r = runner(&f, Mode::Worker, 2, 2);
        let drained = r.drain(Instant::now() + Duration::from_secs(3600));
        assert_eq!(drained.stragglers, 0);
    });
}

/// What an operation on the model table does.
#[derive(Debug, Clone)]
enum Op {
    Spawn,
    /// Drop the handle at this index (modulo the live ones).
    Release(usize),
    /// Every stream idle past the timeout: all evicted.
    IdleOut,
    /// Queue one call on the stream at this index from a thread that the
    /// test lets finish later (a seat queued behind a tick).
    Queue(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Spawn),
        3 => (0..64usize).prop_map(Op::Release),
        1 => Just(Op::IdleOut),
        2 => (0..64usize).prop_map(Op::Queue),
    ]
}

/// The checking function of the capacity property: `ops` applied to a
/// runner of `shards` shards of 3 lanes and to a model of its table (which
/// stream holds a lane on which shard, which are evicted, how many seats
/// are queued); after each, the capacity reads equal the model's (at once
/// for spawns, which book the lane before answering; within 5 s for
/// releases and evictions, which the shard takes in between turns).
fn check_capacity(mode: Mode, shards: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let f = fixtures::small_tdnn();
    // Long enough that no stream idles out between two ops (a release
    // waiting for a queued call takes a tick at most): only `IdleOut`
    // evicts.
    let idle = Duration::from_secs(2);
    let config = RunnerConfig::builder()
        .mode(mode)
        .shards(shards)
        .max_lanes(3)
        // Turns only every 50 ms: a queued seat stays queued a while.
        .policy(TurnPolicy::tick(Duration::from_millis(50)))
        .idle_timeout(idle)
        .build();
    let r = LanedRunner::new(f.runnable().unwrap(), config).unwrap();
    let lanes = 3 * shards;
    // The model: live handles (not evicted) and evicted ones kept alive.
    let mut live: Vec<LanedStateHandle> = vec![];
    let mut evicted: Vec<LanedStateHandle> = vec![];
    let mut callers: Vec<thread::JoinHandle<Result<(), laned_runner::RunError>>> = vec![];
    let check = |live: &[LanedStateHandle], what: &str| -> Result<(), TestCaseError> {
        let want_free = lanes - live.len();
        let start = Instant::now();
        loop {
            let c = r.capacity();
            let per_shard_ok = (0..shards).all(|ix| {
                let held = live.iter().filter(|h| h.shard() == ix).count();
                c.shards[ix].lanes == 3 && c.shards[ix].lanes_free == 3 - held
            });
            if c.lanes == lanes && c.lanes_free == want_free && per_shard_ok && c.spawners_waiting == 0 {
                prop_assert_eq!(c.streams(), live.len());
                prop_assert_eq!(r.metrics().lanes_free() as usize, want_free);
                return Ok(());
            }
            prop_assert!(
                start.elapsed() < Duration::from_secs(5),
                "after {}: capacity {:?}, the model holds {} streams ({:?})",
                what,
                c,
                live.len(),
                live.iter().map(|h| h.shard()).collect::<Vec<_>>()
            );
            thread::sleep(Duration::from_millis(1));
        }
    };
    for (ix, op) in ops.iter().enumerate() {
        let what = format!("op {ix} {op:?}");
        match op {
            Op::Spawn => match r.try_spawn() {
                Ok(h) => {
                    prop_assert!(live.len() < lanes, "{}: a lane beyond the {} there are", what, lanes);
                    live.push(h);
                }
                Err(SpawnError::Full { .. }) => prop_assert_eq!(live.len(), lanes, "{}: refused with lanes free", what),
                Err(e) => return Err(TestCaseError::fail(format!("{what}: {e}"))),
            },
            Op::Release(k) if !live.is_empty() => {
                let k = k % live.len();
                drop(live.swap_remove(k));
            }
            Op::Release(_) => (),
            Op::IdleOut => {
                // Wait for the queued calls first: a queued seat keeps its
                // stream active.
                for c in callers.drain(..) {
                    let _ = c.join().unwrap();
                }
                thread::sleep(idle + idle / 4);
                eventually("idle streams evicted", || r.capacity().lanes_free == lanes);
                evicted.append(&mut live);
            }
            Op::Queue(k) if !live.is_empty() => {
                let k = k % live.len();
                let mut h = live[k].clone();
                let input = f.inputs(1, k as u64);
                // Queued behind the tick, answered at the next one.
                callers.push(thread::spawn(move || h.call(input).map(|_| ())));
            }
            Op::Queue(_) => (),
        }
        check(&live, &what)?;
    }
    for c in callers.drain(..) {
        let _ = c.join().unwrap();
    }
    eventually("no seat left queued", || r.capacity().seats_queued == 0);
    for h in &evicted {
        prop_assert_eq!(h.end_reason(), Some(EndReason::Evicted));
    }
    drop(live);
    check(&[], "the end")?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]
    /// The capacity reads stay true through spawns, releases, evictions
    /// and queued calls, on 1 and 3 shards, in both modes.
    #[test]
    fn prop_capacity_reads_follow_the_table(
        ops in prop::collection::vec(op(), 1..16),
        combining in any::<bool>(),
        three in any::<bool>(),
    ) {
        let mode = if combining { Mode::Combining } else { Mode::Worker };
        check_capacity(mode, if three { 3 } else { 1 }, &ops)?;
    }
}

/// Pinned cases of the capacity property: fill, overflow, release and
/// refill across shards; an eviction then a refill.
#[test]
fn capacity_reads_pinned_cases() {
    for (mode, shards) in SETUPS {
        let fill: Vec<Op> = std::iter::repeat_n(Op::Spawn, 10)
            .chain([Op::Release(3), Op::Release(0), Op::Spawn])
            .collect();
        check_capacity(mode, shards, &fill).unwrap();
        let evict = [
            Op::Spawn,
            Op::Spawn,
            Op::Queue(0),
            Op::IdleOut,
            Op::Spawn,
            Op::Release(0),
        ];
        check_capacity(mode, shards, &evict).unwrap();
    }
}

/// A seat queued shows in `seats_queued` (per shard and in total) until
/// its turn, and the gauge goes back to 0.
#[test]
fn queued_seats_are_read_until_their_turn() {
    bounded("seats queued", || {
        let f = fixtures::small_tdnn();
        for mode in MODES {
            let config = RunnerConfig::builder()
                .mode(mode)
                .shards(1)
                .max_lanes(4)
                .policy(TurnPolicy::tick(Duration::from_millis(400)))
                .build();
            let r = LanedRunner::new(f.runnable().unwrap(), config).unwrap();
            let callers: Vec<_> = (0..3u64)
                .map(|s| {
                    let mut h = r.try_spawn().unwrap();
                    let f = f.clone();
                    thread::spawn(move || h.call(f.inputs(1, s)).unwrap())
                })
                .collect();
            eventually("three seats queued", || {
                let c = r.capacity();
                c.seats_queued == 3 && c.shards[0].seats_queued == 3 || r.metrics().turns > 0
            });
            for c in callers {
                c.join().unwrap();
            }
            eventually("the queue emptied", || r.capacity().seats_queued == 0);
            assert_eq!(r.metrics().seats_queued, 0);
        }
    });
}

/// Every end reason, caused on purpose and read back, from the handle and
/// from the error: finished, evicted, cancelled (a call's end, not the
/// stream's), drained (above), closed. Lost is caused by a failing op in
/// the hostile suite.
#[test]
fn every_end_reason_is_read_back() {
    bounded("end reasons", || {
        let f = fixtures::small_tdnn();
        for (mode, shards) in SETUPS {
            // Finished: read on a clone once `finish` fed the last pulse.
            let r = runner(&f, mode, shards, 2);
            let h = r.try_spawn().unwrap();
            let clone = h.clone();
            assert_eq!(clone.end_reason(), None);
            h.finish(Some(f.inputs(1, 1)), 1).unwrap();
            assert_eq!(clone.end_reason(), Some(EndReason::Finished));

            // Cancelled: the call ends, the stream lives on.
            let mut h = r.try_spawn().unwrap();
            let token = CancelToken::new();
            token.cancel();
            let e = h.call_with(f.inputs(1, 2), &token).unwrap_err();
            assert_eq!(e.end_reason(), Some(EndReason::Cancelled));
            assert!(!e.stream_is_gone() && !e.end_reason().unwrap().may_retry());
            assert_eq!(h.end_reason(), None);
            h.call(f.inputs(1, 2)).unwrap();
            drop(h);

            // Evicted.
            let config = RunnerConfig::builder()
                .mode(mode)
                .shards(shards)
                .max_lanes(2)
                .idle_timeout(Duration::from_millis(30))
                .build();
            let idle = LanedRunner::new(f.runnable().unwrap(), config).unwrap();
            let mut h = idle.try_spawn().unwrap();
            eventually("evicted", || idle.capacity().lanes_free == idle.total_lanes());
            assert_eq!(h.end_reason(), Some(EndReason::Evicted));
            let e = h.call(f.inputs(1, 3)).unwrap_err();
            assert_eq!(e.end_reason(), Some(EndReason::Evicted), "{e}");

            // Closed: the runner dropped.
            let mut h = r.try_spawn().unwrap();
            drop(r);
            assert_eq!(h.end_reason(), Some(EndReason::Closed));
            let e = h.call(f.inputs(1, 4)).unwrap_err();
            assert_eq!(e.end_reason(), Some(EndReason::Closed), "{e}");
            assert!(!e.end_reason().unwrap().may_retry());
        }
    });
}

/// A runner whose turns come only every `tick`: a seat queued waits there.
fn ticking(f: &Fixture, mode: Mode, tick: Duration) -> LanedRunner {
    runner_with(
        f,
        RunnerConfig::builder()
            .mode(mode)
            .shards(1)
            .max_lanes(4)
            .policy(TurnPolicy::tick(tick)),
    )
}

/// A blocking call whose deadline passes while it is queued gets
/// `DeadlineExceeded` before any turn has run (so from its deadline, not
/// the turn) and leaves no seat behind; another stream's call in the same
/// queue gets its exact answer at the turn, and the stream past its
/// deadline calls again, exactly.
#[test]
fn a_call_past_its_deadline_leaves_the_queue() {
    bounded("deadline", || {
        let f = fixtures::small_tdnn();
        for mode in MODES {
            let r = ticking(&f, mode, Duration::from_millis(600));
            let mut late = r.try_spawn().unwrap();
            let mut other = r.try_spawn().unwrap();
            let (f2, want) = (f.clone(), solo(&f, 7, 1));
            let waiting = thread::spawn(move || {
                let got = other.call(f2.inputs(1, 700)).unwrap();
                assert_eq!(got, want[0], "the other stream's answer");
            });
            let e = late
                .call_until(f.inputs(1, 100), Instant::now() + Duration::from_millis(80))
                .unwrap_err();
            assert_eq!(*e.kind(), RunErrorKind::DeadlineExceeded, "{e}");
            assert_eq!(e.end_reason(), Some(EndReason::Cancelled));
            assert_eq!(r.turns_and_seats().0, 0, "answered at a turn, not at its deadline");
            // Only the other stream's seat is left.
            eventually("the late seat left", || r.capacity().seats_queued <= 1);
            waiting.join().unwrap();
            // The late stream's state never saw the dropped pulse.
            let want = solo(&f, 1, 1);
            assert_eq!(late.call(f.inputs(1, 100)).unwrap(), want[0]);
            // A deadline already past refuses the call, inputs handed back.
            let e = late.call_until(f.inputs(1, 101), Instant::now()).unwrap_err();
            assert_eq!(*e.kind(), RunErrorKind::DeadlineExceeded);
            assert!(e.into_inputs().is_some());
        }
    });
}

/// The async form: the runner's deadline thread wakes the task when its
/// deadline passes (before any turn), with no executor timer; the seat
/// leaves the queue and a call with a far deadline gets its exact answer.
#[test]
fn an_async_call_past_its_deadline_leaves_the_queue() {
    bounded("async deadline", || {
        let f = fixtures::small_tdnn();
        // A current-thread runtime without the time driver: nothing of
        // tokio's can wake the task at the deadline, only the runner.
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        for mode in MODES {
            let r = ticking(&f, mode, Duration::from_millis(600));
            let mut late = r.try_spawn().unwrap();
            let mut patient = r.try_spawn().unwrap();
            // Another stream's seat queued first: the tick's turn runs it,
            // and counts, even if the late seat has left by then.
            let mut other = r.try_spawn().unwrap();
            let (f3, want) = (f.clone(), solo(&f, 7, 1));
            let queued = thread::spawn(move || assert_eq!(other.call(f3.inputs(1, 700)).unwrap(), want[0]));
            eventually("the other seat queued", || r.capacity().seats_queued == 1);
            let (f2, r2) = (f.clone(), r.clone());
            rt.block_on(async move {
                let e = late
                    .call_until_async(f2.inputs(1, 100), Instant::now() + Duration::from_millis(80))
                    .await
                    .unwrap_err();
                assert_eq!(*e.kind(), RunErrorKind::DeadlineExceeded, "{e}");
                assert_eq!(r2.turns_and_seats().0, 0, "answered at a turn, not at its deadline");
                let got = patient
                    .call_until_async(f2.inputs(1, 100), Instant::now() + Duration::from_secs(30))
                    .await
                    .unwrap();
                assert_eq!(got, solo(&f2, 1, 1)[0]);
            });
            queued.join().unwrap();
            eventually("no seat left", || r.capacity().seats_queued == 0);
        }
    });
}
