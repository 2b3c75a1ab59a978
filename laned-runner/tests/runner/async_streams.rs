//! Streams as tasks: `spawn_async`, `call_async` and `finish_async` give
//! exactly what the blocking calls give, wait in the same admission queue,
//! and clean up after futures dropped at any point. Every wait is bounded.

use crate::common;

use common::{runner, runner_with, MODES, SETUPS};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use fastrand::Rng;
use laned_runner::{LanedRunner, LanedStateHandle, Mode, RunnerConfig, Settled, SpawnError};
use laned_testkit::drive::{self, AsyncRunner, AsyncStream, BoxFuture};
use laned_testkit::fixtures::{self, Fixture};
use laned_testkit::schedule::{proptest_config, schedule, Schedule, ScheduleConfig};
use laned_testkit::Tolerance;
use proptest::prelude::*;
use tract_core::internal::*;

/// A multi-thread tokio runtime with two workers (the machine's cores).
fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

/// `fut` run to completion on `rt`, failing the test past 60 s.
fn run_bounded<T: Send + 'static>(rt: &tokio::runtime::Runtime, fut: impl Future<Output = T> + Send + 'static) -> T {
    rt.block_on(async move {
        tokio::time::timeout(Duration::from_secs(60), fut)
            .await
            .expect("hung: the tasks did not finish within 60 s")
    })
}

/// Waits (20 s at most, polling) until `r` holds no lane, failing with `what`.
fn until_no_lane_is_held(r: &LanedRunner, what: &str) {
    let start = Instant::now();
    while r.metrics().lanes_taken != 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "{what}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// The solo outputs of `inputs` fed in order to a fresh state of `f`.
fn solo_run(f: &Fixture, inputs: &[TVec<TValue>]) -> Vec<TVec<TValue>> {
    let mut state = f.runnable().unwrap().spawn().unwrap();
    inputs.iter().map(|i| state.run(i.clone()).unwrap()).collect()
}

/// The wrapper the testkit's async driver drives.
struct Ours(LanedRunner);

struct OurStream(LanedStateHandle);

impl AsyncRunner for Ours {
    type Stream = OurStream;
    fn spawn(&self) -> BoxFuture<'_, TractResult<OurStream>> {
        Box::pin(async move { Ok(OurStream(self.0.spawn_async().await?)) })
    }
}

impl AsyncStream for OurStream {
    fn resolve(&mut self, symbol: &Symbol, value: i64) -> TractResult<()> {
        Ok(self.0.resolve(symbol, value)?)
    }
    fn call(&mut self, inputs: TVec<TValue>) -> BoxFuture<'_, TractResult<TVec<TValue>>> {
        Box::pin(async move { Ok(self.0.call_async(inputs).await?) })
    }
}

/// The property: a schedule through the async driver, streams as tokio
/// tasks, checked against the solo runs.
fn check_async(fixture: &Fixture, schedule: &Schedule, mode: Mode, shards: usize) -> Result<(), TestCaseError> {
    let plan = fixture.runnable().unwrap();
    let expected = laned_testkit::solo(fixture, &plan, schedule).unwrap();
    let config = RunnerConfig::builder()
        .shards(shards)
        .max_lanes(schedule.max_lanes - 1)
        .mode(mode)
        .build();
    let ours = Arc::new(Ours(LanedRunner::new(plan, config).unwrap()));
    let sleep: drive::Sleep = Arc::new(|d| Box::pin(tokio::time::sleep(d)));
    let streams = drive::through_runner_async(fixture, ours, schedule, Duration::from_micros(300), sleep);
    let rt = tokio_rt();
    let results = run_bounded(&rt, async move {
        let tasks: Vec<_> = streams.into_iter().map(tokio::spawn).collect();
        let mut results = vec![];
        for t in tasks {
            results.push(t.await.unwrap());
        }
        results
    });
    let observed = drive::observed_from(results).map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
    laned_testkit::check(&expected, &observed, Tolerance::Exact)
        .map_err(|m| TestCaseError::fail(format!("{} in {mode:?} mode, {shards} shards: {m}", fixture.name)))
}

proptest! {
    #![proptest_config(proptest_config(16))]

    /// Async callers get exactly their solo outputs, whatever the schedule.
    #[test]
    fn async_streams_get_their_solo_runs(
        schedule in schedule(ScheduleConfig::default()),
        setup in 0..SETUPS.len(),
    ) {
        let (mode, shards) = SETUPS[setup];
        let fixture = fixtures::tdnn(fixtures::TdnnConfig::light()).unwrap();
        check_async(&fixture, &schedule, mode, shards)?;
    }
}

/// The checker run through the async driver catches a runner that mixes
/// streams up: a negative control (two streams' outputs swapped).
#[test]
fn the_async_check_catches_swapped_streams() {
    let fixture = fixtures::small_tdnn();
    let schedule = Schedule {
        max_lanes: 3,
        streams: (0..2)
            .map(|s| laned_testkit::schedule::StreamPlan {
                seed: 7 + s,
                calls: vec![1; 3],
                arrive: 0,
                end: None,
            })
            .collect(),
        picks: vec![u64::MAX],
    };
    let plan = fixture.runnable().unwrap();
    let expected = laned_testkit::solo(&fixture, &plan, &schedule).unwrap();
    let ours = Arc::new(Ours(runner(&fixture, Mode::Worker, 1, 2)));
    let sleep: drive::Sleep = Arc::new(|d| Box::pin(tokio::time::sleep(d)));
    let streams = drive::through_runner_async(&fixture, ours, &schedule, Duration::ZERO, sleep);
    let rt = tokio_rt();
    let results = run_bounded(&rt, async move {
        let mut results = vec![];
        for s in streams {
            results.push(tokio::spawn(s).await.unwrap());
        }
        results
    });
    let mut observed = drive::observed_from(results).unwrap();
    assert!(laned_testkit::check(&expected, &observed, Tolerance::Exact).is_ok());
    observed.outputs.swap(0, 1);
    assert!(laned_testkit::check(&expected, &observed, Tolerance::Exact).is_err());
}

/// The crate needs no executor: a hand-written `block_on` (a waker that
/// unparks the polling thread) drives spawning, calls and the end of a
/// stream, in both modes.
#[test]
fn a_hand_written_block_on_is_enough() {
    struct Unpark(thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    fn block_on<F: Future>(fut: F) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        let waker = Waker::from(Arc::new(Unpark(thread::current())));
        let mut cx = Context::from_waker(&waker);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return out;
            }
            assert!(Instant::now() < deadline, "hung");
            thread::park_timeout(Duration::from_secs(1));
        }
    }
    let f = fixtures::tdnn(fixtures::TdnnConfig::light()).unwrap();
    for (mode, shards) in SETUPS {
        let r = runner(&f, mode, shards, 2);
        let inputs: Vec<TVec<TValue>> = (0..4).map(|c| f.inputs(1, c)).collect();
        let want = solo_run(&f, &inputs);
        let mut h = block_on(r.spawn_async()).unwrap();
        for (x, w) in inputs.iter().zip(&want) {
            assert_eq!(
                &block_on(h.call_async(x.clone())).unwrap(),
                w,
                "{mode:?}, {shards} shards"
            );
        }
        // Its end equals a blocking stream's end, fed alike beside it.
        let mut blocking = r.try_spawn().unwrap();
        for x in &inputs {
            blocking.call(x.clone()).unwrap();
        }
        // A last pulse of one real frame: the stream symbol resolved, then
        // silence until every frame is out.
        let tail = block_on(h.finish_async(Some(f.inputs(1, 99)), 1)).unwrap();
        assert!(!tail.is_empty());
        assert_eq!(
            tail,
            blocking.finish(Some(f.inputs(1, 99)), 1).unwrap(),
            "{mode:?}, {shards} shards"
        );
    }
}

/// The futures are `Send`: a task owning its stream moves to
/// `tokio::spawn`.
#[test]
fn the_futures_are_send() {
    fn send<T: Send>(t: T) -> T {
        t
    }
    let f = fixtures::small_tdnn();
    let r = runner(&f, Mode::Worker, 1, 2);
    let rt = tokio_rt();
    let (r2, f2) = (r.clone(), f.clone());
    let out = run_bounded(&rt, async move {
        let task = tokio::spawn(send(async move {
            let mut h = send(r2.spawn_async()).await.unwrap();
            let out = send(h.call_async(f2.inputs(1, 1))).await.unwrap();
            send(h.finish_async(None, 0)).await.unwrap();
            out
        }));
        task.await.unwrap()
    });
    assert_eq!(out, solo_run(&f, &[f.inputs(1, 1)])[0]);
}

/// 1,000 tasks on 64 lanes (one executor thread, so tasks enter the queue in
/// the order they were spawned): each spawns with `spawn_async`, calls a
/// few times, and ends; those that waited for a lane got one in arrival
/// order, every answer is exact, and no lane leaks.
#[test]
fn a_thousand_tasks_on_64_lanes_in_arrival_order() {
    let f = fixtures::small_tdnn();
    for (mode, shards) in SETUPS {
        let r = runner(&f, mode, shards, 64 / shards + 1);
        let lanes = r.total_lanes();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let admitted = Arc::new(Mutex::new(vec![]));
        let want: Arc<Vec<TVec<TValue>>> = Arc::new(solo_run(&f, &(0..3).map(|c| f.inputs(1, c)).collect::<Vec<_>>()));
        let (r2, f2, a2) = (r.clone(), f.clone(), admitted.clone());
        run_bounded(&rt, async move {
            let tasks: Vec<_> = (0..1000usize)
                .map(|t| {
                    let (r, f, admitted, want) = (r2.clone(), f2.clone(), a2.clone(), want.clone());
                    tokio::spawn(async move {
                        let mut h = r.spawn_async().await.unwrap();
                        admitted.lock().unwrap().push((t, h.shard(), h.stream_id()));
                        for (c, w) in want.iter().enumerate() {
                            assert_eq!(&h.call_async(f.inputs(1, c as u64)).await.unwrap(), w, "task {t}");
                            tokio::time::sleep(Duration::from_micros(200 * (t as u64 % 5))).await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        let admitted = admitted.lock().unwrap().clone();
        assert_eq!(admitted.len(), 1000);
        // Each shard numbers its streams in the order it granted them: on
        // every shard, the tasks that waited (all but the first `lanes`,
        // which found a lane free) were granted in arrival order. (The order
        // in which tasks *see* their grant is the executor's: a wake from
        // the runner's thread and one from the runtime's own may be polled
        // in either order.)
        for shard in 0..shards {
            let mut granted: Vec<(u64, usize)> = admitted
                .iter()
                .filter(|(t, s, _)| *s == shard && *t >= lanes)
                .map(|(t, _, id)| (*id, *t))
                .collect();
            granted.sort_unstable();
            assert!(
                granted.windows(2).all(|w| w[0].1 < w[1].1),
                "{mode:?}, {shards} shards: tasks granted out of arrival order on shard {shard} ({lanes} lanes)"
            );
        }
        let m = r.metrics();
        assert!(m.admissions_waited > 0, "no task had to wait");
        until_no_lane_is_held(&r, "a lane leaked");
    }
}

/// Tasks spawning at once on free lanes, on two executor threads, are all
/// admitted: a ticket that reaches the front of the admission queue after
/// its last look tries at once, though no lane was freed (the lost wake-up
/// `cargo xtask bench` hit: the task before it left between its look and
/// its wait).
#[test]
fn tasks_spawning_at_once_on_free_lanes_are_all_admitted() {
    let f = fixtures::small_tdnn();
    let rt = tokio_rt();
    for (mode, shards) in SETUPS {
        let r = runner(&f, mode, shards, 96 / shards);
        for round in 0..60 {
            let r2 = r.clone();
            let handles = rt.block_on(async move {
                let tasks: Vec<_> = (0..96)
                    .map(|_| {
                        let r = r2.clone();
                        tokio::spawn(async move { r.spawn_async().await })
                    })
                    .collect();
                let mut handles = vec![];
                for t in tasks {
                    let spawned = tokio::time::timeout(Duration::from_secs(20), t)
                        .await
                        .unwrap_or_else(|_| panic!("{mode:?}, {shards} shards, round {round}: a spawn hung"));
                    handles.push(spawned.unwrap().unwrap());
                }
                handles
            });
            assert_eq!(handles.len(), 96);
            drop(handles);
            until_no_lane_is_held(&r, "a lane leaked");
        }
    }
}

/// The solo history a stream had: every call that ran (a dropped call's
/// verdict is settled, so whether it ran is known). An answered call must
/// extend it.
struct Histories {
    candidates: Vec<Vec<TVec<TValue>>>,
}

impl Histories {
    fn answered(&mut self, f: &Fixture, inputs: &TVec<TValue>, got: &TVec<TValue>) -> bool {
        self.candidates.retain_mut(|h| {
            h.push(inputs.clone());
            solo_run(f, h).last() == Some(got)
        });
        !self.candidates.is_empty()
    }
}

/// Futures dropped at random points (before polling, queued, seated,
/// answered but not yet polled; spawns dropped while waiting for a lane):
/// every answer any stream gets, a dropped call's settled answer included,
/// is its solo run's, nothing of anyone else's is lost, and no lane leaks.
#[test]
fn dropped_futures_lose_nothing_of_anyone_else() {
    let f = fixtures::small_tdnn();
    for (mode, shards) in SETUPS {
        let r = runner(&f, mode, shards, 2);
        let rt = tokio_rt();
        let dropped = Arc::new(AtomicUsize::new(0));
        let (r2, f2, d2) = (r.clone(), f.clone(), dropped.clone());
        run_bounded(&rt, async move {
            let tasks: Vec<_> = (0..6u64)
                .map(|t| {
                    let (r, f, dropped) = (r2.clone(), f2.clone(), d2.clone());
                    tokio::spawn(async move {
                        let mut rng = Rng::with_seed(t + 3);
                        for _stream in 0..4 {
                            // A spawn given up on now and then, queued or not.
                            let wait = Duration::from_micros(rng.u64(..3000));
                            let Ok(spawned) = tokio::time::timeout(wait, r.spawn_async()).await else {
                                dropped.fetch_add(1, Ordering::Relaxed);
                                continue;
                            };
                            let mut h = spawned.unwrap();
                            let mut histories = Histories {
                                candidates: vec![vec![]],
                            };
                            let mut drops = 0;
                            for c in 0..6 {
                                let inputs = f.inputs(1, t * 100 + c);
                                if drops < 2 && rng.u64(..5) == 0 {
                                    // Dropped before its first poll: never
                                    // queued, nothing to settle.
                                    drop(h.call_async(inputs.clone()));
                                    assert!(h.settle_async().await.is_none());
                                    drops += 1;
                                    dropped.fetch_add(1, Ordering::Relaxed);
                                } else if drops < 2 && rng.u64(..3) == 0 {
                                    // Dropped after a random time: before
                                    // the first poll, queued, seated or
                                    // answered but not yet polled.
                                    let wait = Duration::from_micros(rng.u64(..400));
                                    match tokio::time::timeout(wait, h.call_async(inputs.clone())).await {
                                        Ok(out) => assert!(histories.answered(&f, &inputs, &out.unwrap())),
                                        // Settled: whether it ran is known,
                                        // and its answer too if it did.
                                        Err(_) => {
                                            match h.settle_async().await {
                                                Some(Settled::Ran(out)) => {
                                                    assert!(
                                                        histories.answered(&f, &inputs, &out),
                                                        "task {t}: a dropped call's answer fits no solo history"
                                                    )
                                                }
                                                Some(Settled::NotRun) | None => (),
                                                Some(other) => panic!("task {t}: {other:?}"),
                                            }
                                            drops += 1;
                                            dropped.fetch_add(1, Ordering::Relaxed);
                                        }
                                    }
                                } else {
                                    let out = h.call_async(inputs.clone()).await.unwrap();
                                    assert!(histories.answered(&f, &inputs, &out), "task {t}: no solo history fits");
                                }
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        assert!(dropped.load(Ordering::Relaxed) > 0, "{mode:?}: nothing was dropped");
        until_no_lane_is_held(&r, &format!("{mode:?}, {shards} shards: a lane leaked"));
        // Every lane serves again.
        let all: Vec<_> = (0..r.total_lanes()).map(|_| r.try_spawn().unwrap()).collect();
        assert_eq!(all.len(), r.total_lanes());
    }
}

/// Threads calling `call` and tasks calling `call_async` share one runner,
/// and one turn: each gets exactly its solo run.
#[test]
fn sync_and_async_callers_share_a_runner() {
    let f = fixtures::small_tdnn();
    for (mode, shards) in SETUPS {
        let r = runner(&f, mode, shards, 8);
        let rt = tokio_rt();
        let threads: Vec<_> = (0..4u64)
            .map(|s| {
                let (mut h, f) = (r.try_spawn().unwrap(), f.clone());
                thread::spawn(move || {
                    let inputs: Vec<_> = (0..20).map(|c| f.inputs(1, s * 1000 + c)).collect();
                    let got: Vec<_> = inputs.iter().map(|x| h.call(x.clone()).unwrap()).collect();
                    assert_eq!(got, solo_run(&f, &inputs), "thread {s}");
                })
            })
            .collect();
        let (r2, f2) = (r.clone(), f.clone());
        run_bounded(&rt, async move {
            let tasks: Vec<_> = (4..8u64)
                .map(|s| {
                    let (r, f) = (r2.clone(), f2.clone());
                    tokio::spawn(async move {
                        let mut h = r.spawn_async().await.unwrap();
                        let inputs: Vec<_> = (0..20).map(|c| f.inputs(1, s * 1000 + c)).collect();
                        let mut got = vec![];
                        for x in &inputs {
                            got.push(h.call_async(x.clone()).await.unwrap());
                        }
                        assert_eq!(got, solo_run(&f, &inputs), "task {s}");
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        for t in threads {
            t.join().unwrap();
        }
    }
}

/// Refusals reach tasks as they reach threads: busy, then draining or
/// closed.
#[test]
fn async_spawns_get_the_same_refusals() {
    let f = fixtures::small_tdnn();
    let rt = tokio_rt();
    let r = LanedRunner::new(
        f.runnable().unwrap(),
        RunnerConfig::builder().shards(1).max_lanes(1).max_waiting(0).build(),
    )
    .unwrap();
    let held = r.try_spawn().unwrap();
    let r2 = r.clone();
    let busy = run_bounded(&rt, async move { r2.spawn_async().await.map(|_| ()) });
    assert!(matches!(busy, Err(SpawnError::Busy { .. })), "{busy:?}");
    drop(held);
    r.close();
    let r2 = r.clone();
    let after = run_bounded(&rt, async move { r2.spawn_async().await.map(|_| ()) });
    assert!(
        matches!(after, Err(SpawnError::Draining | SpawnError::Closed)),
        "{after:?}"
    );
}

/// Idle eviction reaches runners whose callers are all tasks: a stream
/// that stops calling loses its lane while nobody calls into the runner at
/// all (in combining mode the helper ticks eviction itself), and a task
/// waiting in `spawn_async` then gets it.
#[test]
fn idle_streams_are_evicted_with_nobody_calling() {
    let f = fixtures::small_tdnn();
    let rt = tokio_rt();
    for mode in MODES {
        let r = runner_with(
            &f,
            RunnerConfig::builder()
                .mode(mode)
                .shards(1)
                .max_lanes(1)
                .idle_timeout(Duration::from_millis(30)),
        );
        let (r2, f2) = (r.clone(), f.clone());
        let mut idle = run_bounded(&rt, async move {
            let mut idle = r2.spawn_async().await.unwrap();
            idle.call_async(f2.inputs(1, 0)).await.unwrap();
            idle
        });
        // Nothing polls, nothing calls: only the runner's own threads can
        // evict the stream now.
        until_no_lane_is_held(&r, &format!("{mode:?}: the idle stream was never evicted"));
        let (r2, f2) = (r.clone(), f.clone());
        let evicted = run_bounded(&rt, async move {
            let mut next = r2.spawn_async().await.unwrap();
            assert_eq!(
                next.call_async(f2.inputs(1, 1)).await.unwrap(),
                solo_run(&f2, &[f2.inputs(1, 1)])[0]
            );
            idle.call_async(f2.inputs(1, 2)).await.unwrap_err()
        });
        assert!(evicted.stream_is_gone(), "{mode:?}: {evicted}");
        assert!(
            matches!(evicted.kind(), laned_runner::RunErrorKind::Evicted(_)),
            "{mode:?}: {evicted}"
        );
    }
}

/// A burst of tasks spawning at once while lanes are free is admitted
/// whole, however small `max_waiting` is: a task trying the shards is not
/// waiting for a lane, and only spawners that would wait count against it.
#[test]
fn a_burst_of_spawning_tasks_on_free_lanes_is_not_refused_busy() {
    let f = fixtures::small_tdnn();
    let rt = tokio_rt();
    for mode in MODES {
        for max_waiting in [0, 1] {
            let r = runner_with(
                &f,
                RunnerConfig::builder()
                    .mode(mode)
                    .shards(1)
                    .max_lanes(8)
                    .max_waiting(max_waiting),
            );
            let r2 = r.clone();
            let spawned = run_bounded(&rt, async move {
                // One task polls them all in a row: every spawn is in flight
                // before the first is granted.
                futures_util::future::join_all((0..8).map(|_| r2.spawn_async())).await
            });
            let refused: Vec<_> = spawned.iter().filter_map(|s| s.as_ref().err()).collect();
            assert!(
                refused.is_empty(),
                "{mode:?}, max_waiting {max_waiting}: refused with lanes free: {refused:?}"
            );
            // Past the lanes, with no waiting allowed, both are refused at
            // once (a wait here would hang, and `run_bounded` fail).
            let handles: Vec<_> = spawned.into_iter().map(Result::unwrap).collect();
            if max_waiting == 0 {
                let r2 = r.clone();
                let (a, b) = run_bounded(&rt, async move {
                    futures_util::future::join(r2.spawn_async(), r2.spawn_async()).await
                });
                for late in [a, b] {
                    let e = late.map(|_| ()).unwrap_err();
                    assert!(matches!(e, SpawnError::Busy { .. }), "{mode:?}: {e}");
                }
            }
            drop(handles);
        }
    }
}
