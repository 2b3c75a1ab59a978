//! A stream's life, in both modes: admission with backpressure, end of
//! stream, idle eviction, cancellation, and the races between them. The
//! runner's own life (its drain and close) is `runner_life.rs`'s.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fastrand::Rng;
use laned_runner::{CancelToken, LanedRunner, Mode, RunErrorKind, RunnerConfig, SpawnError};
use laned_testkit::fixtures::{self, Fixture};
use tract_core::internal::*;

use crate::common::{eventually, runner_with, MODES, SETUPS};

/// How many spawners wait, as the refusal of a non-waiting spawn reports it.
fn waiting(r: &LanedRunner) -> usize {
    match r.try_spawn() {
        Err(SpawnError::Full { waiting, .. }) => waiting,
        other => panic!("expected a full runner, got {other:?}"),
    }
}

/// `spawn_timeout` waits for a lane in arrival order, and the metrics count
/// the waits.
#[test]
fn waiting_spawns_get_lanes_first_come_first_served() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner_with(&f, RunnerConfig::builder().shards(1).max_lanes(1).mode(mode));
        let holder = r.try_spawn().unwrap();
        let order = Arc::new(Mutex::new(vec![]));
        let mut waiters = vec![];
        for w in 0..3 {
            let (r2, order) = (r.clone(), order.clone());
            waiters.push(thread::spawn(move || {
                let mut h = r2.spawn_timeout(Duration::from_secs(30)).unwrap();
                order.lock().unwrap().push(w);
                h.call(
                    laned_testkit::fixtures::tdnn(fixtures::TdnnConfig {
                        width: 8,
                        pulse: 4,
                        layout: fixtures::Layout::Nchw,
                    })
                    .unwrap()
                    .inputs(1, w),
                )
                .unwrap();
            }));
            eventually("the waiter is queued", || waiting(&r) == w as usize + 1);
        }
        drop(holder);
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2], "{mode:?}");
        let m = r.metrics();
        assert_eq!(m.admissions_waited, 3);
        assert_eq!(m.admission_wait.count, 3);
    }
}

/// A waiting spawn gives up at its timeout, and the lane it never got is not
/// lost: it goes to the next stream.
#[test]
fn a_spawn_times_out_and_leaks_nothing() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner_with(&f, RunnerConfig::builder().shards(1).max_lanes(1).mode(mode));
        let holder = r.try_spawn().unwrap();
        let err = r.spawn_timeout(Duration::from_millis(30)).unwrap_err();
        assert_eq!(err.to_string(), "no lane of the 1 freed up within 30ms");
        drop(holder);
        eventually("the lane is free again", || r.try_spawn().is_ok());
    }
}

/// Past `max_waiting`, spawning is refused at once with a distinct "busy".
#[test]
fn a_full_admission_queue_refuses_as_busy() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner_with(
            &f,
            RunnerConfig::builder().shards(1).max_lanes(1).max_waiting(1).mode(mode),
        );
        let holder = r.try_spawn().unwrap();
        let r2 = r.clone();
        let waiter = thread::spawn(move || r2.spawn_timeout(Duration::from_secs(30)).map(|_| ()));
        eventually("one waiter", || waiting(&r) == 1);
        let err = r.spawn_timeout(Duration::from_secs(30)).unwrap_err();
        assert_eq!(
            err,
            SpawnError::Busy {
                waiting: 1,
                max_waiting: 1
            }
        );
        assert_eq!(
            err.to_string(),
            "busy: 1 streams already wait for a lane (at most 1 may); retry later"
        );
        assert!(r.metrics().admissions_refused >= 1);
        drop(holder);
        waiter.join().unwrap().unwrap();
    }
}

/// A spawn waiting when the runner is dropped is answered, not left hanging.
#[test]
fn a_spawn_waiting_when_the_runner_is_dropped_is_answered() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner_with(&f, RunnerConfig::builder().shards(1).max_lanes(1).mode(mode));
        let _holder = r.try_spawn().unwrap();
        // The waiter does not own the runner, so dropping `r` closes it.
        let r2 = r.detached();
        let waiter = thread::spawn(move || r2.spawn_timeout(Duration::from_secs(3600)).map(|_| ()));
        eventually("one waiter", || waiting(&r) == 1);
        drop(r);
        assert_eq!(waiter.join().unwrap().unwrap_err(), SpawnError::Closed, "{mode:?}");
    }
}

/// The solo reference of a stream that ends: `pulses` full pulses, then a
/// last pulse of which `real` frames are signal, then silence until the
/// model's delay is flushed, the stream length resolved for the end.
fn solo_end(f: &Fixture, seed: u64, pulses: usize, real: usize) -> Vec<TVec<TValue>> {
    let mut state = f.runnable().unwrap().spawn().unwrap();
    let mut outs = vec![];
    for p in 0..pulses {
        outs.push(state.run(f.inputs(1, seed + p as u64)).unwrap());
    }
    let total = pulses * f.pulse + real;
    let mut fed = pulses * f.pulse;
    if real > 0 {
        state.resolve_symbol(&f.stream, total as i64).unwrap();
        outs.push(state.run(f.inputs(1, seed + 1000)).unwrap());
        fed += f.pulse;
    }
    while fed < total + f.delay {
        state.resolve_symbol(&f.stream, total as i64).unwrap();
        outs.push(
            state
                .run(tvec!(Tensor::zero::<f32>(&f.inputs[0].shape).unwrap().into_tvalue()))
                .unwrap(),
        );
        fed += f.pulse;
    }
    outs
}

/// Streams ending in the same turn with different lengths each get their
/// solo ending, the delay flushed; afterwards their lanes are free.
#[test]
fn streams_end_on_partial_pulses_with_their_delay_flushed() {
    for f in [
        fixtures::strided().unwrap(),
        fixtures::edge_pad().unwrap(),
        fixtures::small_tdnn(),
    ] {
        for mode in MODES {
            let r = runner_with(
                &f,
                RunnerConfig::builder()
                    .shards(1)
                    .max_lanes(3)
                    .mode(mode)
                    .linger(Duration::from_millis(50)),
            );
            let ends = [(3usize, 1usize), (3, 3), (2, 0)];
            let threads: Vec<_> = ends
                .iter()
                .enumerate()
                .map(|(s, &(pulses, real))| {
                    let (r, f) = (r.clone(), f.clone());
                    thread::spawn(move || {
                        let seed = 10 * s as u64;
                        let mut h = r.try_spawn().unwrap();
                        let mut outs = vec![];
                        for p in 0..pulses {
                            outs.push(h.call(f.inputs(1, seed + p as u64)).unwrap());
                        }
                        let last = (real > 0).then(|| f.inputs(1, seed + 1000));
                        outs.extend(h.finish(last, real).unwrap());
                        outs
                    })
                })
                .collect();
            for (s, t) in threads.into_iter().enumerate() {
                let got = t.join().unwrap();
                let (pulses, real) = ends[s];
                let want = solo_end(&f, 10 * s as u64, pulses, real);
                assert_eq!(got.len(), want.len(), "{} {mode:?} stream {s}: calls", f.name);
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(*g[0], *w[0], "{} {mode:?} stream {s}", f.name);
                }
                // Every output frame of the stream is out.
                let frames: usize = got.iter().map(|o| o[0].shape()[2]).sum();
                assert!(
                    frames * (f.pulse / got[0][0].shape()[2]) >= pulses * f.pulse + real,
                    "{}: {frames} frames out",
                    f.name
                );
            }
            eventually("every lane back", || r.metrics().lanes_taken == 0);
        }
    }
}

#[test]
fn finishing_a_stream_of_a_model_without_pulse_properties_is_refused() {
    let mut model = TypedModel::default();
    let b = model.symbols.sym("B");
    let x = model.add_source("x", f32::fact(dims!(b, 3))).unwrap();
    model.select_output_outlets(&[x]).unwrap();
    let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(model).unwrap().into();
    let r = LanedRunner::new(plan, RunnerConfig::builder().shards(1).build()).unwrap();
    let err = r.try_spawn().unwrap().finish(None, 0).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("cannot end the stream: the model carries no pulse properties"),
        "{err}"
    );
}

/// A stream silent for longer than `idle_timeout` loses its lane to a
/// waiting stream; its next call says it was evicted and why; dropping it
/// later does not release the lane its successor holds.
#[test]
fn an_idle_stream_is_evicted_and_its_lane_reused() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner_with(
            &f,
            RunnerConfig::builder()
                .shards(1)
                .max_lanes(1)
                .mode(mode)
                .idle_timeout(Duration::from_millis(40)),
        );
        let mut idle = r.try_spawn().unwrap();
        idle.call(f.inputs(1, 1)).unwrap();
        let mut next = r.spawn_timeout(Duration::from_secs(20)).unwrap();
        let err = idle.call(f.inputs(1, 2)).unwrap_err();
        assert!(matches!(err.kind(), RunErrorKind::Evicted(_)));
        assert_eq!(
            err.to_string(),
            "the stream was evicted (it did not call for 40ms); spawn a new stream",
            "{mode:?}"
        );
        drop(idle);
        // The successor's lane is still its own: a fresh stream's output.
        let solo = f.runnable().unwrap().spawn().unwrap().run(f.inputs(1, 3)).unwrap();
        assert_eq!(*next.call(f.inputs(1, 3)).unwrap()[0], *solo[0]);
        assert!(
            matches!(r.try_spawn(), Err(SpawnError::Full { .. })),
            "{mode:?}: a lane was released twice"
        );
    }
}

/// Eviction racing a call that arrives at the same time: the call either
/// runs (exactly as solo) or fails as evicted; nothing hangs, no lane leaks.
#[test]
fn eviction_racing_a_call() {
    let f = fixtures::small_tdnn();
    let solo = f.runnable().unwrap().spawn().unwrap().run(f.inputs(1, 5)).unwrap();
    for mode in MODES {
        let r = runner_with(
            &f,
            RunnerConfig::builder()
                .shards(1)
                .max_lanes(2)
                .mode(mode)
                .idle_timeout(Duration::from_millis(3)),
        );
        let mut rng = Rng::with_seed(7);
        let (mut ran, mut evicted) = (0, 0);
        for _ in 0..40 {
            let mut h = r.spawn_timeout(Duration::from_secs(20)).unwrap();
            thread::sleep(Duration::from_micros(2000 + rng.u64(..2000)));
            match h.call(f.inputs(1, 5)) {
                Ok(out) => {
                    assert_eq!(*out[0], *solo[0]);
                    ran += 1;
                }
                Err(e) => {
                    assert!(matches!(e.kind(), RunErrorKind::Evicted(_)), "{e}");
                    evicted += 1;
                }
            }
        }
        assert_eq!(ran + evicted, 40);
        eventually("no lane leaked", || r.metrics().lanes_taken == 0);
        let a = r.try_spawn().unwrap();
        let b = r.try_spawn().unwrap();
        drop((a, b));
    }
}

/// A call cancelled while queued is removed: it never runs, so the stream's
/// state is as if it had never been made.
#[test]
fn a_queued_call_is_cancelled_from_another_thread() {
    let f = fixtures::small_tdnn();
    let solo_first = f.runnable().unwrap().spawn().unwrap().run(f.inputs(1, 2)).unwrap();
    for mode in MODES {
        // Two held lanes and a long linger: a's call waits for b's.
        let r = runner_with(
            &f,
            RunnerConfig::builder()
                .shards(1)
                .max_lanes(2)
                .mode(mode)
                .linger(Duration::from_millis(300)),
        );
        let (mut a, _b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
        let token = CancelToken::new();
        let t2 = token.clone();
        let canceller = thread::spawn(move || {
            thread::sleep(Duration::from_millis(30));
            t2.cancel();
        });
        let out = a.call_with(f.inputs(1, 1), &token);
        canceller.join().unwrap();
        match mode {
            // The worker lingers while the caller waits: the cancel lands first.
            Mode::Worker => {
                let err = out.unwrap_err();
                assert_eq!(err.to_string(), "the call was cancelled");
                // The cancelled pulse never ran: the next one is the stream's first.
                assert_eq!(*a.call(f.inputs(1, 2)).unwrap()[0], *solo_first[0]);
            }
            // The caller itself lingers holding the state: the cancel finds
            // the seat already seated, which completes; either way the
            // answer is consistent with what ran.
            Mode::Combining => {
                if let Err(e) = out {
                    assert_eq!(e.to_string(), "the call was cancelled");
                }
            }
        }
        // A cancelled token refuses at once and hands the inputs back.
        let err = a.call_with(f.inputs(1, 9), &token).unwrap_err();
        assert!(err.into_inputs().is_some());
    }
}

/// Cancel racing seating: every call ends answered or cancelled, never
/// hangs, and no lane is released twice.
#[test]
fn cancel_racing_seating() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner_with(&f, RunnerConfig::builder().shards(1).max_lanes(2).mode(mode));
        let mut rng = Rng::with_seed(11);
        for round in 0..40 {
            let mut h = r.try_spawn().unwrap();
            let token = CancelToken::new();
            let t2 = token.clone();
            let delay = Duration::from_micros(rng.u64(..300));
            let c = thread::spawn(move || {
                thread::sleep(delay);
                t2.cancel();
            });
            match h.call_with(f.inputs(1, round), &token) {
                Ok(out) => assert_eq!(out[0].shape(), &[1, 32, 4]),
                Err(e) => assert!(matches!(e.kind(), RunErrorKind::Cancelled), "{e}"),
            }
            c.join().unwrap();
        }
        eventually("no lane leaked", || r.metrics().lanes_taken == 0);
        let _both = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
    }
}

/// Hundreds of short streams on a few threads: spawning (waiting), calling,
/// ending, being evicted or cancelled at random; every stream that
/// completed got exactly its solo run, and no lane leaked.
#[test]
fn churn() {
    let f = fixtures::small_tdnn();
    for (mode, shards) in SETUPS {
        let r = runner_with(
            &f,
            RunnerConfig::builder()
                .shards(shards)
                .max_lanes(3)
                .mode(mode)
                .idle_timeout(Duration::from_millis(20)),
        );
        let deadline = Instant::now() + Duration::from_millis(1500);
        let workers: Vec<_> = (0..4u64)
            .map(|w| {
                let (r, f) = (r.clone(), f.clone());
                thread::spawn(move || {
                    let plan = f.runnable().unwrap();
                    let mut rng = Rng::with_seed(w + 1);
                    // Per completed stream: what it got, and its solo run.
                    let (mut got, mut want) = (vec![], vec![]);
                    while Instant::now() < deadline {
                        let Ok(mut h) = r.spawn_timeout(Duration::from_secs(10)) else {
                            continue;
                        };
                        let mut solo = plan.spawn().unwrap();
                        let (mut stream_got, mut stream_want) = (vec![], vec![]);
                        let seed = rng.u64(..);
                        let calls = 1 + rng.u64(..4);
                        let mut intact = true;
                        for c in 0..calls {
                            let inputs = f.inputs(1, seed + c);
                            match rng.u64(..10) {
                                0 => thread::sleep(Duration::from_millis(30)), // get evicted
                                1 => {
                                    let token = CancelToken::new();
                                    token.cancel();
                                    assert!(h.call_with(inputs.clone(), &token).is_err());
                                }
                                _ => (),
                            }
                            match h.call(inputs.clone()) {
                                Ok(out) => {
                                    stream_got.push(out);
                                    stream_want.push(solo.run(inputs).unwrap());
                                }
                                Err(e) => {
                                    assert!(matches!(e.kind(), RunErrorKind::Evicted(_)), "{e}");
                                    intact = false;
                                    break;
                                }
                            }
                        }
                        if intact && rng.bool() {
                            let _ = h.finish(None, 0);
                        }
                        got.push(stream_got);
                        want.push(stream_want);
                    }
                    (got, want)
                })
            })
            .collect();
        let (mut got, mut want) = (vec![], vec![]);
        for t in workers {
            let (g, w) = t.join().unwrap();
            got.extend(g);
            want.extend(w);
        }
        let calls: usize = got.iter().map(Vec::len).sum();
        assert!(calls > 20, "{mode:?}, {shards} shards: only {calls} calls answered");
        // Every stream, evicted ones up to their eviction, got its solo run.
        let observed = laned_testkit::Observed {
            outputs: got,
            ..Default::default()
        };
        laned_testkit::check(&want, &observed, laned_testkit::Tolerance::Exact)
            .unwrap_or_else(|m| panic!("{mode:?}, {shards} shards: {m}"));
        eventually("the table is empty", || r.metrics().lanes_taken == 0);
    }
}
