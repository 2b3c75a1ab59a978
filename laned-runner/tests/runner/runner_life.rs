//! The runner's life, one test per step as `runner.rs`'s module doc numbers
//! them (start, serve, drain, close), each in both modes. A test is named
//! after its step and checks what that step promises a user.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use laned_runner::{EndReason, LanedRunner, Mode, NewRunnerError, RunErrorKind, RunnerConfig, SpawnError};
use laned_testkit::fixtures::{self, Fixture};
use tract_core::internal::*;

use crate::common::{eventually, one_shard, runner_with, MODES};

/// Turns waiting this long for every held lane's seat are held back until
/// something else starts them.
const HELD: Duration = Duration::from_secs(600);

/// The outputs of `seeds`' pulses run one after the other on a state of
/// their own: what a stream served through lanes must get.
fn solo(f: &Fixture, seeds: &[u64]) -> Vec<TVec<TValue>> {
    let mut state = f.runnable().unwrap().spawn().unwrap();
    seeds.iter().map(|s| state.run(f.inputs(1, *s)).unwrap()).collect()
}

/// The runner's threads alive now, by name prefix (Linux: the task list).
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// Step 1: a state that cannot serve several streams fails at start, naming
/// its op; a good one starts with every lane free and its threads running.
#[test]
fn step_1_start_resets_every_lane_and_starts_the_threads() {
    for mode in MODES {
        let plan = fixtures::deconv().unwrap().runnable().unwrap();
        let err = LanedRunner::new(plan, RunnerConfig::builder().shards(2).mode(mode).build()).unwrap_err();
        assert!(matches!(err, NewRunnerError::Reset { .. }), "{mode:?}: {err}");
        assert!(err.to_string().contains("PulseMask"), "{err}");

        let f = fixtures::small_tdnn();
        let r = runner_with(&f, RunnerConfig::builder().shards(2).max_lanes(3).mode(mode));
        let capacity = r.capacity();
        assert_eq!((capacity.lanes, capacity.lanes_free, capacity.streams()), (6, 6, 0));
        assert!(capacity.accepting && capacity.is_ready());
        // The mode's thread of each shard (thread names are per process,
        // and other tests run threads: count this runner's at least).
        let prefix = if mode == Mode::Worker {
            "laned-worker"
        } else {
            "laned-helper"
        };
        // A thread names itself as it starts: wait for that.
        eventually("the shards' threads run", || threads_named(prefix) >= 2);
        eventually("the deadline thread runs", || threads_named("laned-deadlines") >= 1);
    }
}

/// Step 2: a spawn waiting for a lane gets the one freed on another shard,
/// and the stream it becomes is served exactly as alone.
#[test]
fn step_2_serve_gives_a_freed_lane_to_the_oldest_waiter_and_serves_it_exactly() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner_with(&f, RunnerConfig::builder().shards(2).max_lanes(1).mode(mode));
        let (a, b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
        assert_ne!(a.shard(), b.shard(), "{mode:?}: placed on the least loaded shard");
        let freed = b.shard();
        let waiter = {
            let (r, f) = (r.clone(), f.clone());
            thread::spawn(move || {
                let mut h = r.spawn_timeout(Duration::from_secs(20)).unwrap();
                let seeds = [5, 6, 7];
                let got: Vec<_> = seeds.iter().map(|s| h.call(f.inputs(1, *s)).unwrap()).collect();
                (h.shard(), got)
            })
        };
        eventually("the spawner waits", || r.capacity().spawners_waiting == 1);
        drop(b);
        let (shard, got) = waiter.join().unwrap();
        assert_eq!(shard, freed, "{mode:?}: the freed lane is the waiter's");
        assert_eq!(got, solo(&f, &[5, 6, 7]), "{mode:?}");
        drop(a);
    }
}

/// Step 3: `stop_admitting` answers a waiting spawner `Draining` at once
/// and refuses every spawn after it; a live stream calls as before.
#[test]
fn step_3_admission_is_refused_and_live_streams_call_on() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner_with(&f, RunnerConfig::builder().shards(1).max_lanes(1).mode(mode));
        let mut live = r.try_spawn().unwrap();
        let waiter = {
            let r = r.clone();
            thread::spawn(move || r.spawn_timeout(Duration::from_secs(60)).map(|_| ()))
        };
        eventually("the spawner waits", || r.capacity().spawners_waiting == 1);
        let before = Instant::now();
        r.stop_admitting();
        assert!(matches!(waiter.join().unwrap(), Err(SpawnError::Draining)), "{mode:?}");
        assert!(
            before.elapsed() < Duration::from_secs(30),
            "answered at once, not at its timeout"
        );
        assert!(matches!(r.try_spawn(), Err(SpawnError::Draining)));
        assert!(!r.is_admitting() && !r.capacity().accepting);
        assert_eq!(live.call(f.inputs(1, 3)).unwrap(), solo(&f, &[3])[0], "{mode:?}");
        assert_eq!(live.end_reason(), None);
    }
}

/// Step 4: the drain waits for the live streams to end, and past its
/// deadline tells the stragglers `Drained`.
#[test]
fn step_4_the_drain_waits_for_streams_then_calls_the_rest_stragglers() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        // A stream that ends while the drain waits: no straggler.
        let r = runner_with(&f, RunnerConfig::builder().shards(1).max_lanes(2).mode(mode));
        let ended = Arc::new(AtomicBool::new(false));
        let stream = {
            let (mut h, f, ended) = (r.try_spawn().unwrap(), f.clone(), ended.clone());
            thread::spawn(move || {
                for s in 0..20 {
                    h.call(f.inputs(1, s)).unwrap();
                    thread::sleep(Duration::from_millis(5));
                }
                ended.store(true, Ordering::SeqCst);
            })
        };
        let drained = r.drain(Instant::now() + Duration::from_secs(30));
        assert!(
            ended.load(Ordering::SeqCst),
            "{mode:?}: the drain returned before the stream ended"
        );
        assert_eq!(drained.stragglers, 0);
        assert_eq!(drained.metrics.seats, 20);
        stream.join().unwrap();

        // A stream that never ends: a straggler, told `Drained`.
        let r = runner_with(&f, RunnerConfig::builder().shards(1).max_lanes(2).mode(mode));
        let mut straggler = r.try_spawn().unwrap();
        let drained = r.drain(Instant::now() + Duration::from_millis(50));
        assert_eq!(drained.stragglers, 1, "{mode:?}");
        let err = straggler.call(f.inputs(1, 0)).unwrap_err();
        assert!(matches!(err.kind(), RunErrorKind::Draining), "{err}");
        assert_eq!(err.end_reason(), Some(EndReason::Drained));
        assert_eq!(straggler.end_reason(), Some(EndReason::Drained));
    }
}

/// Step 5: a turn the policy holds back for more seats starts at once when
/// the shard drains (nothing new can join), and its call is answered.
#[test]
fn step_5_a_draining_inbox_starts_a_held_turn_at_once() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = one_shard(&f, mode, 2, HELD);
        let (mut a, _idle) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
        let caller = {
            let f = f.clone();
            thread::spawn(move || a.call(f.inputs(1, 9)))
        };
        // Taken in by the engine, not only pushed: a call still in the
        // inbox when the drain starts is refused, as step 6 says.
        eventually("the call is taken in", || r.metrics().seats_queued == 1);
        let snapshot = r.close();
        assert_eq!(snapshot.seats, 1, "{mode:?}: the held turn ran");
        assert_eq!(caller.join().unwrap().unwrap(), solo(&f, &[9])[0], "{mode:?}");
    }
}

/// Step 6: what was queued before the close is served and answered; every
/// call after it is refused, never run.
#[test]
fn step_6_the_engine_serves_the_queue_and_refuses_new_calls() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner_with(&f, RunnerConfig::builder().shards(1).max_lanes(8).mode(mode));
        let callers: Vec<_> = (0..8)
            .map(|s| {
                let (mut h, f) = (r.try_spawn().unwrap(), f.clone());
                thread::spawn(move || {
                    let (mut answered, mut seeds) = (vec![], vec![]);
                    for call in 0.. {
                        let seed = s * 1000 + call;
                        match h.call(f.inputs(1, seed)) {
                            Ok(out) => {
                                answered.push(out);
                                seeds.push(seed);
                            }
                            Err(e) => {
                                assert!(matches!(e.kind(), RunErrorKind::Draining | RunErrorKind::Closed), "{e}");
                                // Refused ever after.
                                assert!(h.call(f.inputs(1, 0)).is_err());
                                break;
                            }
                        }
                    }
                    (answered, seeds)
                })
            })
            .collect();
        eventually("some turns", || r.metrics().turns > 10);
        let snapshot = r.close();
        let mut total = 0;
        for caller in callers {
            let (answered, seeds) = caller.join().unwrap();
            total += answered.len() as u64;
            assert_eq!(
                answered,
                solo(&f, &seeds),
                "{mode:?}: a stream's answers up to the close"
            );
        }
        assert_eq!(
            snapshot.seats, total,
            "{mode:?}: every seat run was answered, no other ran"
        );
        assert_eq!(r.metrics().seats, total, "nothing ran after the close");
    }
}

/// Step 7: once closed, a call and a spawn are refused by the caller
/// itself, at once.
#[test]
fn step_7_after_the_close_a_push_is_refused_by_the_pusher() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner_with(&f, RunnerConfig::builder().shards(2).max_lanes(2).mode(mode));
        let mut h = r.try_spawn().unwrap();
        r.close();
        let err = h.call(f.inputs(1, 0)).unwrap_err();
        assert!(
            matches!(err.kind(), RunErrorKind::Closed | RunErrorKind::Draining),
            "{mode:?}: {err}"
        );
        assert!(h.end_reason().is_some());
        assert!(matches!(r.try_spawn(), Err(SpawnError::Closed | SpawnError::Draining)));
        assert_eq!(r.metrics().seats, 0);
    }
}

/// Step 8: dropping the runner while its shards run turns joins each
/// shard's thread: none of the runner's is left running once the drop
/// returns (the test runs alone in its process under nextest).
#[test]
fn step_8_the_close_joins_the_modes_threads() {
    // Wide enough that a turn takes tens of milliseconds: a thread left
    // running outlives the grace below.
    let f = fixtures::tdnn(fixtures::TdnnConfig {
        width: 1024,
        pulse: 32,
        ..fixtures::TdnnConfig::heavy()
    })
    .unwrap();
    for mode in MODES {
        let prefix = if mode == Mode::Worker {
            "laned-worker"
        } else {
            "laned-helper"
        };
        let r = runner_with(&f, RunnerConfig::builder().shards(3).max_lanes(8).mode(mode));
        // Callers keep every shard busy, so that the close meets a thread
        // in the middle of a turn (one that is not joined outlives it).
        let callers: Vec<_> = (0..24)
            .map(|s| {
                let (mut h, f) = (r.try_spawn().unwrap(), f.clone());
                thread::spawn(move || while h.call(f.inputs(1, s)).is_ok() {})
            })
            .collect();
        eventually("the shards' threads run", || threads_named(prefix) >= 3);
        eventually("turns run", || r.metrics().turns > 6);
        let before = threads_named(prefix);
        drop(r);
        // Joined: gone by the time the drop returns. A joined thread may
        // linger in the task list for a moment while the kernel reaps it:
        // a few milliseconds' grace, far less than a turn.
        let grace = Instant::now() + Duration::from_millis(5);
        while threads_named(prefix) > before - 3 && Instant::now() < grace {
            thread::yield_now();
        }
        assert_eq!(threads_named(prefix), before - 3, "{mode:?}");
        for caller in callers {
            caller.join().unwrap();
        }
        // The deadline thread is told to stop, not joined: it exits at its
        // next look.
        eventually("the deadline thread stops", || threads_named("laned-deadlines") == 0);
    }
}

/// Step 9: dropping the runner (no drain) answers every call still queued
/// with `Closed`, or with its turn: none hangs.
#[test]
fn step_9_the_closed_engine_answers_every_pending_call() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = one_shard(&f, mode, 5, HELD);
        let _idle = r.try_spawn().unwrap();
        let callers: Vec<_> = (0..4)
            .map(|s| {
                let (mut h, f) = (r.try_spawn().unwrap(), f.clone());
                thread::spawn(move || h.call(f.inputs(1, s)).map(|out| (s, out)))
            })
            .collect();
        // Let the calls queue behind the linger (the worker takes them in
        // only when the policy could change: never, here); a call still on
        // its way when the runner drops is refused by the pusher, as step 7
        // says, and checked the same below.
        eventually("a call is queued", || r.capacity().seats_queued >= 1);
        thread::sleep(Duration::from_millis(100));
        drop(r);
        for caller in callers {
            match caller.join().unwrap() {
                Ok((s, out)) => assert_eq!(out, solo(&f, &[s])[0], "{mode:?}"),
                Err(e) => assert!(matches!(e.kind(), RunErrorKind::Closed), "{mode:?}: {e}"),
            }
        }
    }
}

/// Step 10: calls racing the close each get exactly one answer (served,
/// or refused), none hangs, on every shard.
#[test]
fn step_10_requests_racing_the_close_are_each_answered_once() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        for round in 0..5 {
            let r = runner_with(&f, RunnerConfig::builder().shards(2).max_lanes(4).mode(mode));
            let callers: Vec<_> = (0..8)
                .map(|s| {
                    let (mut h, f) = (r.try_spawn().unwrap(), f.clone());
                    thread::spawn(move || {
                        let mut served = 0u64;
                        while h.call(f.inputs(1, s)).is_ok() {
                            served += 1;
                        }
                        served
                    })
                })
                .collect();
            thread::sleep(Duration::from_millis(round * 3));
            let closer = {
                let r = r.clone();
                thread::spawn(move || r.close())
            };
            let snapshot = closer.join().unwrap();
            let served: u64 = callers.into_iter().map(|c| c.join().unwrap()).sum();
            assert_eq!(
                snapshot.seats, served,
                "{mode:?} round {round}: one answer per seat run"
            );
        }
    }
}

/// Step 7 comes for every shard before any is joined: a waker that an
/// earlier shard's worker runs during the close (the last runner dropped) (its call answered
/// `Closed`), dropping a stream of a later shard, finds that shard's engine
/// let go, so the close ends (in worker mode, with the later worker asleep
/// on an idle inbox, the release would otherwise wait on its lock, and the
/// close on that waker, for good).
#[test]
fn step_7_a_release_to_a_later_shard_during_the_close_is_taken() {
    /// Drops the stream it holds when woken.
    struct DropOnWake(std::sync::Mutex<Option<laned_runner::LanedStateHandle>>);
    impl std::task::Wake for DropOnWake {
        fn wake(self: Arc<Self>) {
            drop(self.0.lock().unwrap().take());
        }
    }
    let f = fixtures::small_tdnn();
    for mode in MODES {
        // A turn of one seat lingers for 30 s: the call waits there
        // when the close comes.
        let r = runner_with(
            &f,
            RunnerConfig::builder()
                .shards(2)
                .max_lanes(2)
                .mode(mode)
                .linger(Duration::from_secs(30)),
        );
        let mut first = r.try_spawn().unwrap();
        // Placed on the shard with the most lanes free: the second.
        let second = r.try_spawn().unwrap();
        let wake = Arc::new(DropOnWake(std::sync::Mutex::new(Some(second))));
        let waker = std::task::Waker::from(wake.clone());
        let inputs = f.inputs(1, 0);
        let closed = crate::common::bounded("the close", move || {
            {
                let mut call = std::pin::pin!(first.call_async(inputs));
                let mut cx = std::task::Context::from_waker(&waker);
                assert!(
                    std::future::Future::poll(call.as_mut(), &mut cx).is_pending(),
                    "{mode:?}"
                );
                // The last runner dropped: the close's steps 7 to 10, no
                // drain first (a drain would answer the call before).
                drop(r);
            }
            first.end_reason()
        });
        assert!(wake.0.lock().unwrap().is_none(), "{mode:?}: the waker ran");
        assert_eq!(closed, Some(EndReason::Closed), "{mode:?}");
    }
}
