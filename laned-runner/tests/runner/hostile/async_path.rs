//! The async path under attack (issue 30): hostile wakers, stalled and
//! dropped futures, bursts, deadlines while combining, and the ends of a
//! stream told the same way everywhere. Each test names its defect.

use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;

use laned_runner::{EndReason, LanedStateHandle, Settled, TurnPolicy};
use laned_testkit::exec::{counting_waker, panicking_waker, poll_once, reentrant_waker};

use super::*;

/// A runner of the [`counter`] model on `[B, 3]`, and the switch that
/// stalls or fails its op.
fn counting(config: laned_runner::RunnerConfigBuilder) -> (Arc<Switch>, LanedRunner) {
    let switch = Switch::new();
    let r = runner_on(counter(&switch, &[Some(3)]).unwrap(), config);
    (switch, r)
}

/// Defect 1: a call's waker that panics when its answer lands costs that
/// task its wake-up only: the runner's threads live, another stream's
/// blocking call is answered, and new streams are admitted.
#[test]
fn a_panicking_call_waker_touches_only_its_own_task() {
    for mode in MODES {
        bounded("a panicking call waker", move || {
            let (_, r) = counting(
                RunnerConfig::builder()
                    .mode(mode)
                    .max_lanes(3)
                    .policy(TurnPolicy::Linger { us: 20_000 }),
            );
            let (mut a, mut b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let x = pulse(&[3], 1.0);
            let waker = panicking_waker("a hostile waker");
            let (good, _) = counting_waker();
            {
                let mut fut = pin!(a.call_async(tvalue(&x)));
                // The first poll yields (waking its own waker: the good
                // one), the second leaves the hostile one to the runner.
                assert!(poll_once(fut.as_mut(), &good).is_pending());
                assert!(poll_once(fut.as_mut(), &waker).is_pending());
                // b's call shares the turn whose end wakes a's waker.
                assert_eq!(call(&mut b, &x).unwrap(), solo(&x, 0), "{mode:?}");
            }
            assert_eq!(call(&mut b, &x).unwrap(), solo(&x, 1), "{mode:?}: the runner lives on");
            let mut c = r.try_spawn().expect("a new stream is admitted");
            assert_eq!(call(&mut c, &x).unwrap(), solo(&x, 0));
        });
    }
}

/// Defect 1: a spawner's waker that panics when a lane is granted to it
/// (a held lane dropped) harms neither the dropping thread nor the other
/// waiters' wake-ups, and the spawner still gets its lane when polled.
#[test]
fn a_panicking_spawn_waker_harms_nobody_else() {
    for mode in MODES {
        bounded("a panicking spawn waker", move || {
            let (_, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(1));
            let held = r.try_spawn().unwrap();
            let hostile = panicking_waker("a hostile spawn waker");
            let (good, woken) = counting_waker();
            let mut first = pin!(r.spawn_async());
            let mut second = pin!(r.spawn_async());
            assert!(poll_once(first.as_mut(), &hostile).is_pending());
            assert!(poll_once(second.as_mut(), &good).is_pending());
            // Frees the lane: granted to `first`, whose waker panics.
            drop(held);
            let (first_good, _) = counting_waker();
            let mut h = loop {
                if let Poll::Ready(h) = poll_once(first.as_mut(), &first_good) {
                    break h.unwrap();
                }
                thread::sleep(Duration::from_millis(1));
            };
            let x = pulse(&[3], 2.0);
            assert_eq!(call(&mut h, &x).unwrap(), solo(&x, 0), "{mode:?}");
            drop(h);
            // The next freed lane goes to `second`, and wakes it.
            let start = Instant::now();
            while woken.wakes() == 0 {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "{mode:?}: second never woken"
                );
                thread::sleep(Duration::from_millis(1));
            }
            assert!(matches!(poll_once(second.as_mut(), &good), Poll::Ready(Ok(_))));
        });
    }
}

/// Defect 1: a waker panicking on the deadline thread does not kill it: a
/// later call's deadline is still enforced.
#[test]
fn a_panicking_waker_does_not_kill_the_deadline_thread() {
    for mode in MODES {
        bounded("a panicking deadline waker", move || {
            let (_, r) = counting(
                RunnerConfig::builder()
                    .mode(mode)
                    .max_lanes(2)
                    .policy(TurnPolicy::Tick { period_us: 600_000_000 }),
            );
            let (mut a, mut b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let x = pulse(&[3], 1.0);
            let hostile = panicking_waker("a hostile deadline waker");
            let (good, _) = counting_waker();
            {
                let mut fut = pin!(a.call_until_async(tvalue(&x), Instant::now() + Duration::from_millis(50)));
                assert!(poll_once(fut.as_mut(), &good).is_pending());
                assert!(poll_once(fut.as_mut(), &hostile).is_pending());
                thread::sleep(Duration::from_millis(300));
            }
            let rt = current_thread();
            let got = rt.block_on(b.call_until_async(tvalue(&x), Instant::now() + Duration::from_millis(50)));
            assert!(
                matches!(got.as_ref().map_err(|e| e.kind()), Err(RunErrorKind::DeadlineExceeded)),
                "{mode:?}: {got:?}"
            );
        });
    }
}

/// Defect 1: a waker that calls back into the runner (a `try_spawn` from
/// `wake()`) does not deadlock it.
#[test]
fn a_waker_calling_back_into_the_runner_does_not_deadlock() {
    for mode in MODES {
        bounded("a re-entrant waker", move || {
            let (_, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(3));
            let spawned = Arc::new(AtomicUsize::new(0));
            let (r2, s2) = (r.detached(), spawned.clone());
            let waker = reentrant_waker(move || {
                if r2.try_spawn().is_ok() {
                    s2.fetch_add(1, Ordering::SeqCst);
                }
            });
            let mut a = r.try_spawn().unwrap();
            let x = pulse(&[3], 1.0);
            let mut fut = pin!(a.call_async(tvalue(&x)));
            let out = loop {
                if let Poll::Ready(out) = poll_once(fut.as_mut(), &waker) {
                    break out;
                }
                thread::sleep(Duration::from_millis(1));
            };
            assert_eq!(out.unwrap().remove(0).into_tensor(), solo(&x, 0));
            assert!(
                spawned.load(Ordering::SeqCst) >= 1,
                "{mode:?}: the waker's spawn never ran"
            );
        });
    }
}

/// Defect 2: a spawn polled once and then neither polled nor dropped holds
/// at most one lane; blocking and task spawns get the others.
#[test]
fn a_stalled_spawn_holds_at_most_one_lane() {
    for mode in MODES {
        bounded("a stalled spawn", move || {
            let (switch, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(4));
            let busy = r.try_spawn().unwrap();
            let x = pulse(&[3], 1.0);
            let turn = slow_turn(&switch, busy, &x, Duration::from_millis(200));
            let (waker, _) = counting_waker();
            let mut stalled = Box::pin(r.spawn_async());
            assert!(poll_once(stalled.as_mut(), &waker).is_pending());
            let (busy, _) = turn.join().unwrap();
            // Two lanes left beside `busy` and the stalled one's.
            let blocking = r.spawn_timeout(Duration::from_secs(10)).expect("a lane is free");
            let rt = current_thread();
            let task = rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), r.spawn_async()).await })
                .expect("a task's spawn completes")
                .expect("a lane is free");
            assert!(r.try_spawn().is_err(), "{mode:?}: every lane is taken now");
            drop((busy, blocking, task));
            assert!(r.try_spawn().is_ok(), "{mode:?}");
            drop(stalled);
        });
    }
}

/// Defect 2: a task looping `spawn_async` and drop beside a thread looping
/// `try_spawn` and drop never gets the thread refused while lanes are free.
#[test]
fn spawn_churn_never_refuses_a_free_lane() {
    for mode in MODES {
        bounded("spawn churn", move || {
            let (_, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(4));
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (r2, stop2) = (r.clone(), stop.clone());
            let churn = thread::spawn(move || {
                let rt = current_thread();
                rt.block_on(async move {
                    while !stop2.load(Ordering::SeqCst) {
                        drop(r2.spawn_async().await.unwrap());
                    }
                });
            });
            let refused = (0..3000).filter(|_| r.try_spawn().is_err()).count();
            stop.store(true, Ordering::SeqCst);
            churn.join().unwrap();
            assert_eq!(refused, 0, "{mode:?}: try_spawn refused with lanes free");
        });
    }
}

/// Defect 3: a waiting spawn polled 2,000 times with one waker keeps one
/// clone of it and one place in the queue.
#[test]
fn a_repolled_spawn_keeps_one_waker_and_one_place() {
    for mode in MODES {
        bounded("waker pile-up", move || {
            let (_, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(1));
            let held = r.try_spawn().unwrap();
            let (waker, count) = counting_waker();
            let mut fut = pin!(r.spawn_async());
            for _ in 0..2000 {
                assert!(poll_once(fut.as_mut(), &waker).is_pending());
            }
            assert!(count.live() <= 2, "{mode:?}: the runner holds {} clones", count.live());
            assert_eq!(r.capacity().spawners_waiting, 1, "{mode:?}");
            drop(held);
        });
    }
}

/// Defect 4: 1,000 tasks waiting for one lane; freeing it wakes one of
/// them, not all.
#[test]
fn a_freed_lane_wakes_one_waiter() {
    for mode in MODES {
        bounded("thundering herd", move || {
            let (_, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(1));
            let held = r.try_spawn().unwrap();
            let mut waiting: Vec<_> = (0..1000)
                .map(|_| (Box::pin(r.spawn_async()), counting_waker()))
                .collect();
            for (fut, (waker, _)) in &mut waiting {
                assert!(poll_once(fut.as_mut(), waker).is_pending());
            }
            drop(held);
            let wakes = || waiting.iter().map(|(_, (_, c))| c.wakes()).sum::<usize>();
            let start = Instant::now();
            while wakes() == 0 {
                assert!(start.elapsed() < Duration::from_secs(20), "{mode:?}: nobody woken");
                thread::sleep(Duration::from_millis(1));
            }
            // Whatever else was due has landed by now.
            thread::sleep(Duration::from_millis(50));
            assert_eq!(wakes(), 1, "{mode:?}: one lane freed, {} tasks woken", wakes());
        });
    }
}

/// Defect 5: a caller whose call is not seated by its deadline is answered
/// `DeadlineExceeded`, though (combining mode) it won the state and runs
/// the turns of the five streams queued before it: as the repro,
/// C's 100 ms call, five 30 ms calls queued meanwhile, then C's
/// `call_until(now + 40 ms)` on the same thread (blocking, and as a task);
/// five rounds each, since C wins the state only sometimes.
#[test]
fn a_deadline_holds_while_a_caller_serves_others() {
    for mode in MODES {
        for as_task in [false, true] {
            bounded("deadline while combining", move || {
                let (switch, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(6).max_seats(1));
                let mut c = r.try_spawn().unwrap();
                let mut others: Vec<LanedStateHandle> = (0..5).map(|_| r.try_spawn().unwrap()).collect();
                let x = pulse(&[3], 1.0);
                for round in 0..5 {
                    let evals = switch.calls(Hook::Eval);
                    switch.stall(Some(Duration::from_millis(100)));
                    let xc = x.clone();
                    let caller = thread::spawn(move || {
                        let rt = current_thread();
                        let first = if as_task {
                            rt.block_on(c.call_async(tvalue(&xc)))
                        } else {
                            c.call(tvalue(&xc))
                        };
                        first.unwrap();
                        let deadline = Instant::now() + Duration::from_millis(40);
                        let got = if as_task {
                            rt.block_on(c.call_until_async(tvalue(&xc), deadline))
                        } else {
                            c.call_until(tvalue(&xc), deadline)
                        };
                        (c, got.map(|_| ()))
                    });
                    // C's turn runs: the five queue 30 ms calls behind it.
                    while switch.calls(Hook::Eval) == evals {
                        thread::sleep(Duration::from_micros(200));
                    }
                    switch.stall(Some(Duration::from_millis(30)));
                    let queued: Vec<_> = others
                        .drain(..)
                        .map(|mut h| {
                            let x = x.clone();
                            thread::spawn(move || {
                                call(&mut h, &x).unwrap();
                                h
                            })
                        })
                        .collect();
                    let (back, got) = caller.join().unwrap();
                    c = back;
                    others = queued.into_iter().map(|q| q.join().unwrap()).collect();
                    switch.stall(None);
                    assert!(
                        matches!(got.as_ref().map_err(|e| e.kind()), Err(RunErrorKind::DeadlineExceeded)),
                        "{mode:?}, task {as_task}, round {round}: {got:?}"
                    );
                }
            });
        }
    }
}

/// Defect 6: once `finish` ended a stream, a clone's calls are refused,
/// blocking and as a task.
#[test]
fn a_call_after_finish_is_refused() {
    let f = laned_testkit::fixtures::small_tdnn();
    for mode in MODES {
        let r = LanedRunner::new(
            f.runnable().unwrap(),
            RunnerConfig::builder().mode(mode).max_lanes(2).build(),
        )
        .unwrap();
        let h = r.try_spawn().unwrap();
        let mut clone = h.clone();
        h.finish(Some(f.inputs(1, 0)), 1).unwrap();
        assert_eq!(clone.end_reason(), Some(EndReason::Finished));
        let err = clone.call(f.inputs(1, 1)).unwrap_err();
        assert_eq!(*err.kind(), RunErrorKind::Finished, "{mode:?}");
        assert!(err.into_inputs().is_some(), "the inputs come back");
        let err = current_thread().block_on(clone.call_async(f.inputs(1, 1))).unwrap_err();
        assert_eq!(*err.kind(), RunErrorKind::Finished, "{mode:?}");
        // Closed afterwards: still told it finished, by both.
        r.close();
        assert_eq!(
            *clone.call(f.inputs(1, 2)).unwrap_err().kind(),
            RunErrorKind::Finished,
            "{mode:?}"
        );
        assert_eq!(clone.end_reason(), Some(EndReason::Finished));
    }
}

/// A wide call whose deadline passes between its rows' turns (its row 0
/// ran) completes: the deadline withdraws only calls none of whose rows
/// ran, and the turn never spins on one it cannot withdraw.
#[test]
fn a_wide_call_past_its_deadline_between_rows_completes() {
    for mode in MODES {
        bounded("a wide call past its deadline", move || {
            let (switch, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(2).max_seats(1));
            let mut h = r.try_spawn().unwrap();
            let rows = Tensor::from_shape(&[2, 3], &[1f32, 2., 3., 4., 5., 6.]).unwrap();
            switch.stall(Some(Duration::from_millis(100)));
            let got = h.call_until(tvalue(&rows), Instant::now() + Duration::from_millis(50));
            switch.stall(None);
            let out = got.unwrap_or_else(|e| panic!("{mode:?}: {e}"));
            assert_eq!(out[0].shape(), &[2, 3], "{mode:?}");
        });
    }
}

/// Wakers calling back into the runner from two shards' threads at once
/// (each shard full, each waker trying a spawn) never leave the two
/// threads waiting on each other.
#[test]
fn wakers_calling_back_across_shards_do_not_deadlock() {
    for mode in MODES {
        bounded("re-entrant wakers on two shards", move || {
            let (_, r) = counting(RunnerConfig::builder().mode(mode).shards(2).max_lanes(1));
            let (mut a, mut b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let x = pulse(&[3], 1.0);
            let tried = Arc::new(AtomicUsize::new(0));
            for _ in 0..50 {
                let wakers: Vec<_> = (0..2)
                    .map(|_| {
                        let (r2, t2) = (r.detached(), tried.clone());
                        reentrant_waker(move || {
                            let _ = r2.try_spawn();
                            t2.fetch_add(1, Ordering::SeqCst);
                        })
                    })
                    .collect();
                let mut fa = pin!(a.call_async(tvalue(&x)));
                let mut fb = pin!(b.call_async(tvalue(&x)));
                let (mut da, mut db) = (false, false);
                while !(da && db) {
                    if !da {
                        da = poll_once(fa.as_mut(), &wakers[0]).is_ready();
                    }
                    if !db {
                        db = poll_once(fb.as_mut(), &wakers[1]).is_ready();
                    }
                    thread::yield_now();
                }
            }
            assert!(tried.load(Ordering::SeqCst) > 0, "{mode:?}: no waker called back");
        });
    }
}

/// Defect 8: a stream refused by a runner closing says the same end
/// reason through the refusal and `end_reason`; a drain's straggler hears
/// `Drained` from every API.
#[test]
fn end_reasons_agree_through_every_api() {
    for mode in MODES {
        bounded("end reasons", move || {
            let (switch, r) = counting(RunnerConfig::builder().mode(mode).shards(2).max_lanes(1));
            let (s0, s1) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let (mut s0, s1) = if s0.shard() == 0 { (s0, s1) } else { (s1, s0) };
            let x = pulse(&[3], 1.0);
            let long = slow_turn(&switch, s1, &x, Duration::from_millis(700));
            let r2 = r.clone();
            let closing = thread::spawn(move || r2.close());
            thread::sleep(Duration::from_millis(100));
            let err = call(&mut s0, &x).unwrap_err();
            assert_eq!(s0.end_reason(), err.end_reason(), "{mode:?}: {err}");
            let _ = long.join().unwrap();
            closing.join().unwrap();
            assert_eq!(s0.end_reason(), Some(EndReason::Closed), "{mode:?}");

            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder().mode(mode).max_lanes(2),
            );
            let mut straggler = r.try_spawn().unwrap();
            r.drain(Instant::now() + Duration::from_millis(20));
            let reasons = [
                call(&mut straggler, &x).unwrap_err().end_reason(),
                straggler.export_state().unwrap_err().end_reason(),
                straggler.state_snapshot().unwrap_err().end_reason(),
                straggler.end_reason(),
            ];
            assert_eq!(reasons, [Some(EndReason::Drained); 4], "{mode:?}");
        });
    }
}

/// Defect 9: with no room to wait (`max_waiting` 0) and no lane free, the
/// runner is not ready, as `try_spawn` is refused.
#[test]
fn readiness_follows_max_waiting() {
    let (_, r) = counting(RunnerConfig::builder().max_lanes(1).max_waiting(0));
    let _held = r.try_spawn().unwrap();
    assert!(r.try_spawn().is_err());
    assert!(!r.capacity().is_ready(), "ready while every spawn is refused");
}

/// Defect 11: stragglers let go after a drain closed the runner are booked:
/// no lane is held in the gauges or in `capacity`.
#[test]
fn releases_after_a_drain_are_booked() {
    for mode in MODES {
        let (_, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(4));
        let watch = r.detached();
        let stragglers: Vec<_> = (0..3).map(|_| r.try_spawn().unwrap()).collect();
        r.drain(Instant::now() + Duration::from_millis(20));
        drop(stragglers);
        drop(r);
        assert_eq!(watch.capacity().lanes_free, 4, "{mode:?}");
        assert_eq!(watch.metrics().lanes_taken, 0, "{mode:?}");
    }
}

/// Defect 12: combining mode, two shards, 64 tasks calling back to back on
/// a 2-worker runtime: every task is served within the run, and a 1 ms
/// timer on that runtime keeps firing (no task holds its thread).
#[test]
fn combining_tasks_do_not_starve_the_executor() {
    let f = laned_testkit::fixtures::small_tdnn();
    for shards in [1, 2] {
        let r = LanedRunner::new(
            f.runnable().unwrap(),
            RunnerConfig::builder()
                .mode(Mode::Combining)
                .shards(shards)
                .max_lanes(64)
                .build(),
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let (served, late) = rt.block_on(async {
            let stop = Instant::now() + Duration::from_secs(1);
            let tasks: Vec<_> = (0..64)
                .map(|t| {
                    let (r, f) = (r.clone(), f.clone());
                    tokio::spawn(async move {
                        let mut h = r.spawn_async().await.unwrap();
                        let mut n = 0usize;
                        while Instant::now() < stop {
                            h.call_async(f.inputs(1, t)).await.unwrap();
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            let timer = tokio::spawn(async move {
                let mut worst = Duration::ZERO;
                while Instant::now() < stop {
                    let asked = Instant::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    worst = worst.max(asked.elapsed());
                }
                worst
            });
            let mut served = vec![];
            for t in tasks {
                served.push(t.await.unwrap());
            }
            (served, timer.await.unwrap())
        });
        eprintln!(
            "{shards} shards: calls per task {:?}, the 1 ms timer's worst wait {late:?}",
            (served.iter().min(), served.iter().max())
        );
        assert!(
            served.iter().all(|&n| n > 0),
            "{shards} shards: a task served no call: {served:?}"
        );
        // A bound for starvation (the defect: about 1 s), not a latency claim.
        assert!(
            late < Duration::from_millis(250),
            "{shards} shards: the 1 ms timer waited {late:?}"
        );
    }
}

/// Defect 13: a call dropped after it was seated is settled before the
/// handle's next call: the next call is refused (inputs back) until
/// `settle` hands the dropped call's outputs over; one dropped before it
/// was seated settles as not run, and the stream goes on exactly.
#[test]
fn a_dropped_call_is_settled_never_guessed() {
    for mode in MODES {
        bounded("settling a dropped call", move || {
            let (switch, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(2));
            let mut a = r.try_spawn().unwrap();
            let x = pulse(&[3], 1.0);
            let rt = current_thread();
            // Seated, then dropped by a timeout while its turn runs (in
            // worker mode: a combining task would run that turn in its own
            // poll, and the timeout could not fire meanwhile).
            if mode == Mode::Combining {
                return;
            }
            switch.stall(Some(Duration::from_millis(200)));
            let timed_out =
                rt.block_on(async { tokio::time::timeout(Duration::from_millis(50), a.call_async(tvalue(&x))).await });
            switch.stall(None);
            assert!(timed_out.is_err(), "{mode:?}: the call outlived its timeout");
            let refused = rt.block_on(a.call_async(tvalue(&x))).unwrap_err();
            assert_eq!(*refused.kind(), RunErrorKind::Unsettled, "{mode:?}");
            assert!(refused.into_inputs().is_some());
            match a.settle() {
                Some(Settled::Ran(mut out)) => assert_eq!(out.remove(0).into_tensor(), solo(&x, 0)),
                other => panic!("{mode:?}: {other:?}"),
            }
            assert_eq!(call(&mut a, &x).unwrap(), solo(&x, 1), "{mode:?}: the pulse ran once");

            // Queued behind a long turn, dropped before it was seated.
            let b = r.try_spawn().unwrap();
            let long = slow_turn(&switch, b, &x, Duration::from_millis(200));
            let timed_out =
                rt.block_on(async { tokio::time::timeout(Duration::from_millis(50), a.call_async(tvalue(&x))).await });
            assert!(timed_out.is_err());
            assert!(
                matches!(rt.block_on(a.settle_async()), Some(Settled::NotRun)),
                "{mode:?}"
            );
            long.join().unwrap().1.unwrap();
            assert_eq!(
                call(&mut a, &x).unwrap(),
                solo(&x, 2),
                "{mode:?}: the dropped pulse never ran"
            );
            assert!(a.settle().is_none());
        });
    }
}

/// Defect 14: a drain awaited by a task leaves its executor thread free: a
/// task on the same single-threaded runtime keeps running meanwhile.
#[test]
fn an_awaited_drain_does_not_block_the_executor() {
    for mode in MODES {
        let (_, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(2));
        let straggler = r.try_spawn().unwrap();
        let rt = current_thread();
        let ticks = rt.block_on(async {
            let ticks = Arc::new(AtomicUsize::new(0));
            let t2 = ticks.clone();
            let ticker = tokio::spawn(async move {
                loop {
                    t2.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            let before = ticks.load(Ordering::SeqCst);
            let drained = r.drain_async(Instant::now() + Duration::from_millis(300)).await;
            assert_eq!(drained.stragglers, 1);
            assert_eq!(straggler.end_reason_async().await, Some(EndReason::Drained));
            ticker.abort();
            ticks.load(Ordering::SeqCst) - before
        });
        assert!(
            ticks > 5,
            "{mode:?}: the executor ticked {ticks} times during a 300 ms drain"
        );
    }
}

/// Defect 4: 2,000 pending calls dropped at once (a runtime shut down)
/// are all withdrawn, no lane or seat left behind, and the streams serve on.
#[test]
fn thousands_of_dropped_calls_leave_nothing_behind() {
    for mode in MODES {
        bounded("mass cancellation", move || {
            let (switch, r) = counting(RunnerConfig::builder().mode(mode).max_lanes(2001));
            let busy = r.try_spawn().unwrap();
            let mut handles: Vec<_> = (0..2000).map(|_| r.try_spawn().unwrap()).collect();
            let x = pulse(&[3], 1.0);
            let turn = slow_turn(&switch, busy, &x, Duration::from_millis(300));
            let (waker, _) = counting_waker();
            let started = Instant::now();
            {
                let mut calls: Vec<_> = handles.iter_mut().map(|h| Box::pin(h.call_async(tvalue(&x)))).collect();
                for _ in 0..2 {
                    for (i, c) in calls.iter_mut().enumerate() {
                        if let Poll::Ready(out) = poll_once(c.as_mut(), &waker) {
                            panic!("{mode:?}: call {i} answered while the state was busy: {out:?}");
                        }
                    }
                }
            }
            eprintln!("{mode:?}: 2,000 calls queued and dropped in {:?}", started.elapsed());
            let (_busy, _) = turn.join().unwrap();
            for h in &mut handles {
                let settled = h.settle();
                assert!(matches!(settled, Some(Settled::NotRun)), "{mode:?}: {settled:?}");
                assert_eq!(call(h, &x).unwrap(), solo(&x, 0));
            }
            assert_eq!(r.capacity().seats_queued, 0);
        });
    }
}
