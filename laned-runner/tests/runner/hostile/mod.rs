//! The promise under attack: ops that fail on demand, calls shaped to pass
//! the checks, cancels timed to race, configurations at their limits. Each
//! test names the defect it guards; every wait is bounded, so a hang fails
//! the test instead of stalling the suite.

mod async_path;
mod call_accounting;
mod churn;
mod end_reasons;
mod finish;
mod fuzz;
mod knobs;
mod ops;
mod policy_config;
mod state_import;
mod task_churn;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{bounded, runner_on, MODES, SETUPS};
use laned_runner::{CancelToken, LanedRunner, Mode, NewRunnerError, RunErrorKind, RunnerConfig, SpawnError};
use ops::{counter, Fault, Hook, Switch};
use tract_core::internal::*;

/// A runner of two lanes on `plan`, its state pairs detected.
fn state_runner(plan: Arc<dyn Runnable>) -> LanedRunner {
    runner_on(
        plan,
        RunnerConfig::builder()
            .max_lanes(2)
            .state(laned_runner::StateSpec::Detect),
    )
}

/// `h`'s output for `f`'s inputs of `seed`.
fn feed(f: &laned_testkit::fixtures::Fixture, h: &mut laned_runner::LanedStateHandle, seed: u64) -> Tensor {
    h.call(f.inputs(1, seed)).unwrap()[0].clone().into_tensor()
}

/// `x` as a call's inputs.
fn tvalue(x: &Tensor) -> TVec<TValue> {
    tvec!(x.clone().into_tvalue())
}

/// A single-threaded tokio runtime with timers.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// A `[1, dims...]` pulse filled from `seed`.
fn pulse(dims: &[usize], seed: f32) -> Tensor {
    let shape: Vec<usize> = std::iter::once(1).chain(dims.iter().copied()).collect();
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| seed + i as f32 * 0.25).collect();
    Tensor::from_shape(&shape, &values).unwrap()
}

/// What a stream of [`counter`] gets alone for `x` as its call number `n`
/// (from 0): `(x + n) * 2`.
fn solo(x: &Tensor, n: usize) -> Tensor {
    let values: Vec<f32> = x
        .to_plain_array_view::<f32>()
        .unwrap()
        .iter()
        .map(|v| (*v + n as f32) * 2.0)
        .collect();
    Tensor::from_shape(x.shape(), &values).unwrap()
}

fn call(h: &mut laned_runner::LanedStateHandle, x: &Tensor) -> Result<Tensor, laned_runner::RunError> {
    h.call(tvec!(x.clone().into_tvalue()))
        .map(|mut out| out.remove(0).into_tensor())
}

/// Starts `h`'s call of `x` on a thread of its own, in a turn that takes
/// `stall`, and returns once that turn runs (the state held: later calls
/// queue behind it); joining gives the handle back with its answer.
fn slow_turn(
    switch: &Arc<Switch>,
    mut h: laned_runner::LanedStateHandle,
    x: &Tensor,
    stall: Duration,
) -> thread::JoinHandle<(laned_runner::LanedStateHandle, Result<Tensor, laned_runner::RunError>)> {
    let evals = switch.calls(Hook::Eval);
    switch.stall(Some(stall));
    let x = x.clone();
    let turn = thread::spawn(move || {
        let out = call(&mut h, &x);
        (h, out)
    });
    while switch.calls(Hook::Eval) == evals {
        thread::sleep(Duration::from_micros(200));
    }
    switch.stall(None);
    turn
}

/// Defect 1: a symbol resolved for a call that its input contradicts is
/// refused on the caller's thread, naming the input, the symbol and the
/// shapes; the stream and the runner go on serving.
#[test]
fn a_resolved_symbol_the_input_contradicts_is_refused_naming_both() {
    for (mode, shards) in SETUPS {
        bounded("resolve contradiction", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[None, None]).unwrap(),
                RunnerConfig::builder().mode(mode).shards(shards).max_lanes(2),
            );
            let mut h = r.try_spawn().unwrap();
            let t = r.inner().typed_model().unwrap().symbols.sym("D0");
            h.resolve(&t, 5).unwrap();
            let x = pulse(&[3, 4], 1.0);
            let err = call(&mut h, &x).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err.kind(), RunErrorKind::Input { .. }), "{mode:?}: {text}");
            assert!(
                text.contains("\"x\"") && text.contains("D0 = 5") && text.contains("[1, 3, 4]"),
                "{text}"
            );
            // Nothing ran: the stream's first call is still its first.
            assert_eq!(call(&mut h, &x).unwrap(), solo(&x, 0), "{mode:?}");
            let mut other = r.try_spawn().unwrap();
            assert_eq!(call(&mut other, &x).unwrap(), solo(&x, 0));
        });
    }
}

/// Defect 1: a turn that fails before tract evaluates anything, on a state
/// that never ran a turn (here: a borrowed lane whose reset errs), fails
/// its own seats with a clear error; the streams keep their state and the
/// runner keeps serving.
#[test]
fn a_turn_failing_before_tract_ran_on_a_fresh_state_fails_its_seats_only() {
    for (mode, shards) in SETUPS {
        for fault in [Fault::Err, Fault::Panic] {
            bounded("fresh state, failed borrowed reset", move || {
                let switch = Switch::new();
                let r = runner_on(
                    counter(&switch, &[Some(3)]).unwrap(),
                    RunnerConfig::builder().mode(mode).shards(shards).max_lanes(2),
                );
                let mut h = r.try_spawn().unwrap();
                // The next reset is the borrowed lane's, for row 1 of a wide call.
                switch.arm(Hook::Reset, 0, fault);
                let wide = Tensor::stack_tensors(0, &[&pulse(&[3], 1.0), &pulse(&[3], 2.0)]).unwrap();
                let err = call(&mut h, &wide).unwrap_err();
                assert!(matches!(err.kind(), RunErrorKind::Turn(_)), "{mode:?} {fault:?}: {err}");
                assert!(err.to_string().contains("resetting borrowed lanes"), "{err}");
                // The turn never reached the state: the stream is whole.
                let x = pulse(&[3], 5.0);
                assert_eq!(call(&mut h, &x).unwrap(), solo(&x, 0), "{mode:?} {fault:?}");
                assert_eq!(call(&mut h, &x).unwrap(), solo(&x, 1));
                let mut other = r.try_spawn().unwrap();
                assert_eq!(call(&mut other, &x).unwrap(), solo(&x, 0));
                // Wide calls still find a lane to borrow.
                let out = call(&mut other, &wide).unwrap();
                assert_eq!(out.shape(), &[2, 3]);
            });
        }
    }
}

/// Defect 1: a turn that errs inside tract on a fresh state (the first
/// turn the state ever ran) fails its seats, marks their streams lost, and
/// leaves the runner serving.
#[test]
fn a_first_turn_that_errs_inside_tract_loses_only_its_streams() {
    for (mode, shards) in SETUPS {
        for fault in [Fault::Err, Fault::Panic] {
            bounded("first turn errs", move || {
                let switch = Switch::new();
                let r = runner_on(
                    counter(&switch, &[Some(3)]).unwrap(),
                    RunnerConfig::builder().mode(mode).shards(shards).max_lanes(2),
                );
                let mut h = r.try_spawn().unwrap();
                switch.arm(Hook::Eval, 0, fault);
                let x = pulse(&[3], 1.0);
                let err = call(&mut h, &x).unwrap_err();
                assert!(matches!(err.kind(), RunErrorKind::Turn(_)), "{err}");
                let lost = call(&mut h, &x).unwrap_err();
                assert!(matches!(lost.kind(), RunErrorKind::Lost(_)), "{lost}");
                let mut fresh = r.try_spawn().unwrap();
                assert_eq!(call(&mut fresh, &x).unwrap(), solo(&x, 0), "{mode:?} {fault:?}");
            });
        }
    }
}

/// Defect 2: an op state's `reset_lanes` that panics when a lane is granted
/// fails that spawn only; the lane goes out of service and everyone else
/// goes on.
#[test]
fn a_reset_panicking_at_a_grant_fails_that_spawn_only() {
    for (mode, shards) in SETUPS {
        for fault in [Fault::Err, Fault::Panic] {
            bounded("grant reset fault", move || {
                let switch = Switch::new();
                let r = runner_on(
                    counter(&switch, &[Some(3)]).unwrap(),
                    RunnerConfig::builder().mode(mode).shards(shards).max_lanes(3),
                );
                let x = pulse(&[3], 1.0);
                let mut a = r.try_spawn().unwrap();
                assert_eq!(call(&mut a, &x).unwrap(), solo(&x, 0));
                switch.arm(Hook::Reset, 0, fault);
                let refused = r.try_spawn().unwrap_err();
                assert!(matches!(refused, SpawnError::Reset(_)), "{mode:?} {fault:?}: {refused}");
                assert!(refused.to_string().contains("planted Reset"), "{refused}");
                // The stream already there is untouched, new ones are served.
                assert_eq!(call(&mut a, &x).unwrap(), solo(&x, 1), "{mode:?} {fault:?}");
                let mut b = r.try_spawn().unwrap();
                assert_eq!(call(&mut b, &x).unwrap(), solo(&x, 0));
            });
        }
    }
}

/// Defect 2: a reset panicking at the borrowed-lane reset of a wide call
/// fails that call only; its stream keeps its state.
#[test]
fn a_reset_panicking_for_a_borrowed_lane_fails_that_call_only() {
    for (mode, shards) in SETUPS {
        bounded("borrowed reset panic", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder().mode(mode).shards(shards).max_lanes(3),
            );
            let x = pulse(&[3], 1.0);
            let (mut a, mut b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            assert_eq!(call(&mut a, &x).unwrap(), solo(&x, 0));
            switch.arm(Hook::Reset, 0, Fault::Panic);
            let wide = Tensor::stack_tensors(0, &[&pulse(&[3], 1.0), &pulse(&[3], 2.0)]).unwrap();
            assert!(call(&mut b, &wide).is_err(), "{mode:?}");
            assert_eq!(call(&mut a, &x).unwrap(), solo(&x, 1), "{mode:?}");
            assert_eq!(call(&mut b, &x).unwrap(), solo(&x, 0), "{mode:?}: b's turn never ran");
        });
    }
}

/// Defect 2: a reset panicking at idle eviction evicts that stream and
/// harms nobody else, in whichever thread runs the eviction (in combining
/// mode: an unrelated caller or spawner).
#[test]
fn a_reset_panicking_at_eviction_evicts_that_stream_only() {
    for (mode, shards) in SETUPS {
        bounded("eviction reset panic", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder()
                    .mode(mode)
                    .shards(shards)
                    .max_lanes(3)
                    .idle_timeout(Duration::from_millis(30)),
            );
            let x = pulse(&[3], 1.0);
            let mut idle = r.try_spawn().unwrap();
            assert_eq!(call(&mut idle, &x).unwrap(), solo(&x, 0));
            // Another stream calls meanwhile (in combining mode it is the one
            // that evicts); it never sees the panic.
            let mut busy = r.try_spawn().unwrap();
            switch.arm(Hook::Reset, 0, Fault::Panic);
            let resets = switch.calls(Hook::Reset);
            // Well past the idle timeout (with shards, `idle` may sit on a
            // shard nobody else visits: its own next call evicts it then).
            let mut n = 0;
            while n < 20 {
                assert_eq!(call(&mut busy, &x).unwrap(), solo(&x, n), "{mode:?}");
                n += 1;
                thread::sleep(Duration::from_millis(5));
            }
            let err = call(&mut idle, &x).unwrap_err();
            assert!(matches!(err.kind(), RunErrorKind::Evicted(_)), "{mode:?}: {err}");
            assert!(switch.calls(Hook::Reset) > resets, "the planted panic fired");
            assert_eq!(call(&mut busy, &x).unwrap(), solo(&x, n));
            drop(idle);
            let mut fresh = r.try_spawn().unwrap();
            assert_eq!(call(&mut fresh, &x).unwrap(), solo(&x, 0));
        });
    }
}

/// Defect 2: a state whose creation panics or errs fails `LanedRunner::new`
/// with an error, never a panic across it.
#[test]
fn a_state_creation_fault_fails_construction_with_an_error() {
    for (mode, shards) in SETUPS {
        for fault in [Fault::Err, Fault::Panic] {
            bounded("spawn fault", move || {
                let switch = Switch::new();
                let plan = counter(&switch, &[Some(3)]).unwrap();
                switch.arm(Hook::Spawn, 0, fault);
                let err =
                    LanedRunner::new(plan, RunnerConfig::builder().mode(mode).shards(shards).build()).unwrap_err();
                assert!(matches!(err, NewRunnerError::Spawn(_)), "{mode:?} {fault:?}: {err}");
                assert!(err.to_string().contains("planted Spawn"), "{err}");
            });
        }
    }
}

/// Defect 2: a turn fails and the state cannot even be cleaned (its reset
/// panics): the state is rebuilt, the streams holding lanes are told they
/// lost theirs, and new streams are served.
#[test]
fn a_recovery_whose_reset_panics_rebuilds_the_state() {
    for (mode, shards) in SETUPS {
        bounded("recovery reset panic", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder().mode(mode).shards(shards).max_lanes(2),
            );
            let x = pulse(&[3], 1.0);
            let mut a = r.try_spawn().unwrap();
            assert_eq!(call(&mut a, &x).unwrap(), solo(&x, 0));
            switch.arm(Hook::Eval, 0, Fault::Err);
            switch.arm(Hook::Reset, 0, Fault::Panic);
            assert!(matches!(call(&mut a, &x).unwrap_err().kind(), RunErrorKind::Turn(_)));
            assert!(matches!(call(&mut a, &x).unwrap_err().kind(), RunErrorKind::Lost(_)));
            drop(a);
            let mut b = r.try_spawn().unwrap();
            assert_eq!(call(&mut b, &x).unwrap(), solo(&x, 0), "{mode:?}");
        });
    }
}

/// Defect 3: seats whose free dims differ never share a turn, whether
/// their byte counts agree (`[1, 3, 4]` and `[1, 2, 6]`) or not; each
/// stream gets exactly its solo answer.
#[test]
fn seats_of_different_shapes_never_share_a_turn() {
    for (mode, _) in SETUPS {
        for (a_dims, b_dims) in [([3, 4], [2, 6]), ([3, 4], [2, 5]), ([3, 4], [3, 4])] {
            bounded("free dims", move || {
                let switch = Switch::new();
                let r = runner_on(
                    counter(&switch, &[None, None]).unwrap(),
                    RunnerConfig::builder()
                        .mode(mode)
                        .shards(1)
                        .max_lanes(2)
                        .linger(Duration::from_millis(200)),
                );
                let (mut a, mut b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
                let (xa, xb) = (pulse(&a_dims, 1.0), pulse(&b_dims, 100.0));
                let xb2 = xb.clone();
                let tb = thread::spawn(move || call(&mut b, &xb2).unwrap());
                let ya = call(&mut a, &xa).unwrap();
                let yb = tb.join().unwrap();
                assert_eq!(ya, solo(&xa, 0), "{mode:?} {a_dims:?}/{b_dims:?}");
                assert_eq!(yb, solo(&xb, 0), "{mode:?} {a_dims:?}/{b_dims:?}");
                let turns = r.metrics().turns;
                if a_dims != b_dims {
                    assert_eq!(turns, 2, "{mode:?}: two shapes, two turns");
                }
            });
        }
    }
}

/// Defect 4: a cancel that loses the race with its answer (it lands while
/// the call's turn runs) leaves the call answered, and never reaches the
/// stream's next call.
#[test]
fn a_cancel_that_loses_the_race_never_cancels_the_next_call() {
    for (mode, shards) in SETUPS {
        bounded("late cancel", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder().mode(mode).shards(shards).max_lanes(2),
            );
            let mut h = r.try_spawn().unwrap();
            let x = pulse(&[3], 1.0);
            switch.stall(Some(Duration::from_millis(100)));
            let token = CancelToken::new();
            let (t2, evals) = (token.clone(), switch.clone());
            let canceller = thread::spawn(move || {
                // Fire once the call's turn is running.
                while evals.calls(Hook::Eval) == 0 {
                    thread::sleep(Duration::from_micros(200));
                }
                t2.cancel();
            });
            let out = h.call_with(tvec!(x.clone().into_tvalue()), &token);
            canceller.join().unwrap();
            switch.stall(None);
            // The seat ran, so the caller gets its answer, and knows it ran.
            assert_eq!(out.unwrap()[0].clone().into_tensor(), solo(&x, 0), "{mode:?}");
            // The next call, with no token, is not cancelled, and follows it.
            assert_eq!(call(&mut h, &x).unwrap(), solo(&x, 1), "{mode:?}");
        });
    }
}

/// Defect 4: a cancel landing while the call is still queued removes it:
/// the caller is told `Cancelled`, and the stream's state shows the call
/// never ran.
#[test]
fn a_cancel_of_a_queued_call_says_it_never_ran() {
    for mode in MODES {
        bounded("queued cancel", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder().mode(mode).shards(1).max_lanes(2),
            );
            let (a, mut b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let x = pulse(&[3], 1.0);
            // a's slow turn holds the state; b's call queues behind it.
            let ta = slow_turn(&switch, a, &x, Duration::from_millis(300));
            let token = CancelToken::new();
            let t2 = token.clone();
            let canceller = thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                t2.cancel();
            });
            let out = b.call_with(tvec!(x.clone().into_tvalue()), &token);
            canceller.join().unwrap();
            let (_a, ya) = ta.join().unwrap();
            assert_eq!(ya.unwrap(), solo(&x, 0));
            let err = out.unwrap_err();
            assert!(matches!(err.kind(), RunErrorKind::Cancelled), "{mode:?}: {err}");
            assert_eq!(
                call(&mut b, &x).unwrap(),
                solo(&x, 0),
                "{mode:?}: the cancelled call never ran"
            );
        });
    }
}

/// Defect 5: an output without the batch axis that a batched input flows
/// into is refused at construction, naming the output and the input; one
/// that depends only on shared inputs is accepted.
#[test]
fn an_unbatched_output_mixing_streams_is_refused() {
    let mut model = TypedModel::default();
    let b = model.symbols.sym("B");
    let x = model.add_source("x", f32::fact(dims!(b, 3))).unwrap();
    let g = model.add_source("gain", f32::fact([1, 3])).unwrap();
    let y = model.wire_node("y", tract_core::ops::math::mul(), &[x, g]).unwrap()[0];
    let z = model
        .wire_node(
            "z",
            tract_core::ops::nn::Reduce::new(tvec!(0), tract_core::ops::nn::Reducer::Sum),
            &[x],
        )
        .unwrap()[0];
    let gg = model.wire_node("gg", tract_core::ops::math::add(), &[g, g]).unwrap()[0];
    model.select_output_outlets(&[y, z, gg]).unwrap();
    let mixed: Arc<dyn Runnable> = DefaultRuntime.prepare(model.clone()).unwrap().into();
    let err = LanedRunner::new(mixed, RunnerConfig::builder().shards(1).build()).unwrap_err();
    assert!(matches!(err, NewRunnerError::MixedOutput { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("\"z\"") && text.contains("\"x\""), "{text}");
    // Without z: gg depends on the shared input only, and is served.
    model.select_output_outlets(&[y, gg]).unwrap();
    let shared: Arc<dyn Runnable> = DefaultRuntime.prepare(model).unwrap().into();
    let r = LanedRunner::new(shared, RunnerConfig::builder().shards(1).build()).unwrap();
    let mut h = r.try_spawn().unwrap();
    let out = h
        .call(tvec!(
            tensor2(&[[1f32, 2., 3.]]).into_tvalue(),
            tensor2(&[[1f32, 1., 2.]]).into_tvalue()
        ))
        .unwrap();
    assert_eq!(*out[0], tensor2(&[[1f32, 2., 6.]]));
    assert_eq!(*out[1], tensor2(&[[2f32, 2., 4.]]));
}

/// Defect 6: waits too long for the clock wait on; `max_waiting: 0` still
/// takes a free lane.
#[test]
fn admission_at_its_limits() {
    for (mode, shards) in SETUPS {
        bounded("admission limits", move || {
            let switch = Switch::new();
            let plan = counter(&switch, &[Some(3)]).unwrap();
            let r = runner_on(
                plan.clone(),
                RunnerConfig::builder().mode(mode).shards(shards).max_lanes(1),
            );
            let held: Vec<_> = (0..shards).map(|_| r.spawn_timeout(Duration::MAX).unwrap()).collect();
            let r2 = r.clone();
            let waiter = thread::spawn(move || r2.spawn_timeout(Duration::MAX).map(|_| ()));
            thread::sleep(Duration::from_millis(20));
            drop(held);
            waiter.join().unwrap().unwrap();

            let r = runner_on(
                plan,
                RunnerConfig::builder()
                    .mode(mode)
                    .shards(shards)
                    .max_lanes(1)
                    .max_waiting(0),
            );
            let held: Vec<_> = (0..shards)
                .map(|_| r.spawn_timeout(Duration::from_secs(1)).unwrap())
                .collect();
            let busy = r.spawn_timeout(Duration::from_secs(1)).unwrap_err();
            assert!(matches!(busy, SpawnError::Busy { .. }), "{busy}");
            drop(held);
        });
    }
}

/// Defect 6: absurd sizes and waits are refused with an error naming the
/// limit; a non-UTF-8 knob is refused, not ignored.
#[test]
fn configuration_at_its_limits_is_refused_clearly() {
    let switch = Switch::new();
    let plan = counter(&switch, &[Some(3)]).unwrap();
    let refused = |config: RunnerConfig, words: &[&str]| {
        let err = LanedRunner::new(plan.clone(), config).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, NewRunnerError::Config(_)), "{text}");
        for w in words {
            assert!(text.contains(w), "{text:?} should say {w:?}");
        }
    };
    refused(
        RunnerConfig::builder().max_lanes(usize::MAX).build(),
        &["max_lanes", "limit"],
    );
    refused(
        RunnerConfig::builder().max_lanes(1 << 33).build(),
        &["max_lanes", "limit"],
    );
    refused(
        RunnerConfig::builder().linger(Duration::from_secs(1 << 60)).build(),
        &["linger", "limit"],
    );
    refused(
        RunnerConfig::builder()
            .policy(laned_runner::TurnPolicy::Tick { period_us: u64::MAX })
            .build(),
        &["tick", "limit"],
    );
    refused(RunnerConfig::builder().shards(1 << 40).build(), &["shards", "limit"]);
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        // Each test runs in a process of its own under nextest; the knob is
        // put back before anything else reads it.
        std::env::set_var("TRACT_MAX_SEATS", std::ffi::OsStr::from_bytes(&[0x34, 0xff]));
        let err = LanedRunner::new(plan.clone(), RunnerConfig::builder().shards(1).build());
        std::env::remove_var("TRACT_MAX_SEATS");
        let text = err.unwrap_err().to_string();
        assert!(text.contains("TRACT_MAX_SEATS") && text.contains("UTF-8"), "{text}");
    }
}

/// Defect 6: `drain` starts a lingering turn at once instead of waiting the
/// linger out, and the queued call is answered.
#[test]
fn drain_does_not_wait_out_a_linger() {
    for mode in MODES {
        bounded("drain under a long linger", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder()
                    .mode(mode)
                    .shards(1)
                    .max_lanes(2)
                    .linger(Duration::from_secs(600)),
            );
            let (mut a, _b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let x = pulse(&[3], 1.0);
            let xa = x.clone();
            let caller = thread::spawn(move || call(&mut a, &xa));
            // The call is queued and lingering (b never calls).
            let start = Instant::now();
            while r.metrics().turns == 0 && start.elapsed() < Duration::from_millis(100) {
                thread::sleep(Duration::from_millis(1));
            }
            let snapshot = r.close();
            assert_eq!(snapshot.seats, 1, "{mode:?}");
            assert_eq!(caller.join().unwrap().unwrap(), solo(&x, 0));
        });
    }
}

/// Defect 6: runners dropped while idle streams are evicted by combining
/// callers: closing and evicting race, and nothing panics or hangs.
#[test]
fn closing_while_combining_callers_evict() {
    for round in 0..20 {
        bounded("close racing eviction", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder()
                    .mode(Mode::Combining)
                    .shards(1)
                    .max_lanes(4)
                    .idle_timeout(Duration::from_millis(1)),
            );
            let _idle = r.try_spawn().unwrap();
            let callers: Vec<_> = (0..2)
                .map(|s| {
                    let mut h = r.try_spawn().unwrap();
                    thread::spawn(move || {
                        let x = pulse(&[3], s as f32);
                        for _ in 0..50 {
                            if let Err(e) = call(&mut h, &x) {
                                assert!(
                                    matches!(e.kind(), RunErrorKind::Closed | RunErrorKind::Evicted(_)),
                                    "{e}"
                                );
                                return;
                            }
                        }
                    })
                })
                .collect();
            thread::sleep(Duration::from_micros(200 * round));
            drop(r);
            for c in callers {
                c.join().unwrap();
            }
        });
    }
}

/// Defect 7: a close under steady load (a seat per turn, every stream
/// calling again at once) is not held off by the combining helper, which
/// always had a seat queued: the flag is taken in, new calls are refused,
/// and every answer given was the stream's own.
#[test]
fn a_close_under_steady_load_is_not_held_off() {
    for mode in MODES {
        bounded("close under steady load", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder().mode(mode).shards(1).max_lanes(8).max_seats(1),
            );
            // A turn of 1 ms: every answered stream is back long before
            // the other seven are served, so the queue never empties.
            switch.stall(Some(Duration::from_millis(1)));
            let callers: Vec<_> = (0..8)
                .map(|s| {
                    let mut h = r.try_spawn().unwrap();
                    thread::spawn(move || {
                        let x = pulse(&[3], s as f32);
                        for n in 0.. {
                            match call(&mut h, &x) {
                                Ok(y) => assert_eq!(y, solo(&x, n), "stream {s}, call {n}"),
                                Err(e) => {
                                    assert!(matches!(e.kind(), RunErrorKind::Draining | RunErrorKind::Closed), "{e}");
                                    return n;
                                }
                            }
                        }
                        unreachable!()
                    })
                })
                .collect();
            while r.metrics().turns < 50 {
                thread::sleep(Duration::from_millis(1));
            }
            let snapshot = r.close();
            let answered: usize = callers.into_iter().map(|c| c.join().unwrap()).sum();
            assert_eq!(
                snapshot.seats as usize, answered,
                "{mode:?}: every seat run was answered"
            );
        });
    }
}

/// Defect 8: a stream whose call waits in the inbox through another
/// stream's long turn is not evicted as idle when that turn ends: the
/// requests are taken in before the idle streams are looked at.
#[test]
fn a_call_waiting_through_a_long_turn_is_not_evicted() {
    for mode in MODES {
        bounded("eviction after a long turn", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder()
                    .mode(mode)
                    .shards(1)
                    .max_lanes(2)
                    .idle_timeout(Duration::from_millis(50)),
            );
            let (a, mut b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let x = pulse(&[3], 1.0);
            // a's turn takes 150 ms, three idle timeouts.
            let ta = slow_turn(&switch, a, &x, Duration::from_millis(150));
            // b calls while a's turn runs, soon after it was admitted.
            let xb = pulse(&[3], 5.0);
            let got = call(&mut b, &xb);
            assert_eq!(ta.join().unwrap().1.unwrap(), solo(&x, 0), "{mode:?}");
            assert_eq!(got.unwrap(), solo(&xb, 0), "{mode:?}: b called in time");
        });
    }
}

/// Defect 9: one token guarding calls of two streams at once cancels both,
/// not only the call guarded last; neither call ran.
#[test]
fn one_token_cancels_every_call_it_guards() {
    for mode in MODES {
        bounded("a token shared by two calls", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder().mode(mode).shards(1).max_lanes(3),
            );
            let (c, a, b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let x = pulse(&[3], 1.0);
            // c's slow turn holds the state; a's and b's calls queue behind.
            let tc = slow_turn(&switch, c, &x, Duration::from_millis(300));
            let token = CancelToken::new();
            let callers: Vec<_> = [a, b]
                .into_iter()
                .map(|mut h| {
                    let (token, x) = (token.clone(), x.clone());
                    thread::spawn(move || {
                        let out = h.call_with(tvec!(x.into_tvalue()), &token);
                        (h, out)
                    })
                })
                .collect();
            thread::sleep(Duration::from_millis(50));
            token.cancel();
            assert_eq!(tc.join().unwrap().1.unwrap(), solo(&x, 0));
            for caller in callers {
                let (mut h, out) = caller.join().unwrap();
                let err = out.unwrap_err();
                assert!(matches!(err.kind(), RunErrorKind::Cancelled), "{mode:?}: {err}");
                assert_eq!(
                    call(&mut h, &x).unwrap(),
                    solo(&x, 0),
                    "{mode:?}: the cancelled call never ran"
                );
            }
        });
    }
}

/// Defect 8, its other side: a spawn that arrives during a long turn, while
/// an idle stream's time runs out, gets that stream's lane when the turn
/// ends (the idle stream is evicted before the spawn looks), not `Full`.
#[test]
fn a_spawn_after_a_long_turn_gets_an_idle_streams_lane() {
    for mode in MODES {
        bounded("spawn after a long turn", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder()
                    .mode(mode)
                    .shards(1)
                    .max_lanes(2)
                    .idle_timeout(Duration::from_millis(50)),
            );
            let (_idle, b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let x = pulse(&[3], 1.0);
            let tb = slow_turn(&switch, b, &x, Duration::from_millis(150));
            // Pushed while b's turn runs; answered after it, when the idle
            // stream is 150 ms past its grant.
            let mut fresh = r.try_spawn().expect("the idle stream's lane");
            assert_eq!(tb.join().unwrap().1.unwrap(), solo(&x, 0), "{mode:?}");
            assert_eq!(call(&mut fresh, &x).unwrap(), solo(&x, 0), "{mode:?}");
        });
    }
}

/// Defect 8, a third side: a call that timed out waiting behind a long
/// turn counts as activity, as an answer does: the stream's retry right
/// after is served, not evicted, and the timed-out call never ran.
#[test]
fn a_retry_after_a_timed_out_call_is_not_evicted() {
    for mode in MODES {
        bounded("retry after a deadline", move || {
            let switch = Switch::new();
            let r = runner_on(
                counter(&switch, &[Some(3)]).unwrap(),
                RunnerConfig::builder()
                    .mode(mode)
                    .shards(1)
                    .max_lanes(2)
                    .idle_timeout(Duration::from_millis(50)),
            );
            let (a, mut b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
            let x = pulse(&[3], 1.0);
            let ta = slow_turn(&switch, a, &x, Duration::from_millis(150));
            let late = b.call_until(
                tvec!(x.clone().into_tvalue()),
                Instant::now() + Duration::from_millis(60),
            );
            let err = late.unwrap_err();
            assert!(matches!(err.kind(), RunErrorKind::DeadlineExceeded), "{mode:?}: {err}");
            assert_eq!(
                call(&mut b, &x).unwrap(),
                solo(&x, 0),
                "{mode:?}: retried, and the first never ran"
            );
            assert_eq!(ta.join().unwrap().1.unwrap(), solo(&x, 0), "{mode:?}");
        });
    }
}
