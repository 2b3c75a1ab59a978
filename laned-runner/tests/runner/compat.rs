//! tract-core 0.23.9's own tests of its `LanedRunnable` (the `laned_test`
//! module at the end of `lanes.rs`), ported: each runs on tract's runner and
//! on ours in both modes through one helper, built the way tract builds
//! (`wrap(inner, lanes)`, tract's knobs set in code). Where ours differs on
//! purpose, the test asserts our documented behaviour and says why in one
//! line (README, "Switching from tract").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use laned_runner::{LanedRunner, Mode, RunnerConfig};
use tract_core::internal::*;
use tract_core::lanes::{LanedRunnable, TRACT_TURN_LINGER_US};
use tract_core::ops::math::{add, mul};

/// A runner under test, built from a prepared plan with `lanes` lanes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sys {
    Tract,
    Ours(Mode),
}

const SYSTEMS: [Sys; 3] = [Sys::Tract, Sys::Ours(Mode::Worker), Sys::Ours(Mode::Combining)];

#[derive(Clone)]
enum Wrapped {
    Tract(LanedRunnable),
    Ours(LanedRunner),
}

impl Wrapped {
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        match self {
            Wrapped::Tract(r) => r.spawn(),
            Wrapped::Ours(r) => r.spawn(),
        }
    }

    fn turns_and_seats(&self) -> (u64, u64) {
        match self {
            Wrapped::Tract(r) => r.turns_and_seats(),
            Wrapped::Ours(r) => r.turns_and_seats(),
        }
    }
}

/// The one construction line that differs: tract's `wrap`, ours (`wrap`
/// in the default mode; the other needs the config).
fn wrap(sys: Sys, inner: Box<dyn Runnable>, lanes: usize) -> TractResult<Wrapped> {
    Ok(match sys {
        Sys::Tract => Wrapped::Tract(LanedRunnable::wrap(inner.into(), lanes)?),
        Sys::Ours(mode) if mode == Mode::default() => Wrapped::Ours(LanedRunner::wrap(inner.into(), lanes)?),
        Sys::Ours(mode) => Wrapped::Ours(LanedRunner::new(
            inner.into(),
            RunnerConfig::builder().max_lanes(lanes).mode(mode).build(),
        )?),
    })
}

/// Why `sys` refuses to wrap `model` (panics, saying `accepted`, if it
/// does not).
fn refusal(sys: Sys, model: TypedModel, accepted: &str) -> TractResult<String> {
    match wrap(sys, DefaultRuntime.prepare(model)?, 2) {
        Err(e) => Ok(format!("{e:#}")),
        Ok(_) => panic!("{sys:?}: {accepted}"),
    }
}

/// `[B, 3] * 2`, named `doubler`.
fn doubler(sys: Sys, max_lanes: usize) -> TractResult<Wrapped> {
    let mut model = TypedModel::default();
    model.set_name("doubler");
    let batch = model.symbols.sym("B");
    let input = model.add_source("input", f32::fact(dims!(batch, 3)))?;
    let two = model.add_const("two", tensor2(&[[2f32]]))?;
    let doubled = model.wire_node("doubled", mul(), &[input, two])?;
    model.select_output_outlets(&doubled)?;
    wrap(sys, DefaultRuntime.prepare(model)?, max_lanes)
}

fn turn(handle: &mut Box<dyn State>, stream: usize, turn: usize) -> TractResult<()> {
    let input = tensor2(&[[stream as f32, turn as f32, 1.]]);
    let output = handle.run(tvec!(input.into_tvalue()))?;
    assert_eq!(&*output[0], &tensor2(&[[2. * stream as f32, 2. * turn as f32, 2.]]));
    Ok(())
}

/// The linger knob is process-wide: tests that set it hold this.
static LINGER: Mutex<()> = Mutex::new(());

fn spawn_once_free(runnable: &Wrapped) -> TractResult<Box<dyn State>> {
    for _ in 0..100 {
        if let Ok(handle) = runnable.spawn() {
            return Ok(handle);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    runnable.spawn()
}

#[test]
fn one_stream_at_a_time() -> TractResult<()> {
    for sys in SYSTEMS {
        let runnable = doubler(sys, 2)?;
        let mut handle = runnable.spawn()?;
        for t in 0..4 {
            turn(&mut handle, 0, t)?;
        }
    }
    Ok(())
}

/// tract's names and label through the `metrics` facade (ours with the
/// `metrics-facade` feature); ours labels its gauges per shard as well.
#[test]
fn the_worker_reports_what_it_serves() -> TractResult<()> {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let systems: &[Sys] = if cfg!(feature = "metrics-facade") {
        &SYSTEMS
    } else {
        &[Sys::Tract]
    };
    for &sys in systems {
        let recorder = DebuggingRecorder::new();
        let runnable = metrics::with_local_recorder(&recorder, || doubler(sys, 4))?;
        let mut handles: Vec<Box<dyn State>> = (0..2).map(|_| runnable.spawn()).collect::<TractResult<_>>()?;
        for t in 0..3 {
            for (stream, handle) in handles.iter_mut().enumerate() {
                turn(handle, stream, t)?;
            }
        }
        let (turns, seats) = runnable.turns_and_seats();
        let reported: std::collections::HashMap<String, DebugValue> = recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| {
                key.key()
                    .labels()
                    .any(|l| l.key() == "runnable" && l.value() == "doubler")
            })
            .map(|(key, _, _, value)| (key.key().name().to_string(), value))
            .collect();
        let samples = |name: &str| match &reported[name] {
            DebugValue::Histogram(samples) => samples.iter().map(|s| s.0).collect::<Vec<f64>>(),
            other => panic!("{sys:?}: {name} is {other:?}"),
        };
        assert_eq!(
            reported["tract_autobatch_turns_total"],
            DebugValue::Counter(turns),
            "{sys:?}"
        );
        assert_eq!(
            reported["tract_autobatch_seats_total"],
            DebugValue::Counter(seats),
            "{sys:?}"
        );
        assert_eq!(
            reported["tract_autobatch_lanes_taken"],
            DebugValue::Gauge(2f64.into()),
            "{sys:?}"
        );
        let per_turn = samples("tract_autobatch_seats_per_turn");
        assert_eq!(per_turn.len() as u64, turns);
        assert_eq!(per_turn.iter().sum::<f64>() as u64, seats);
        assert_eq!(samples("tract_autobatch_queue_wait_seconds").len() as u64, seats);
        let runs = samples("tract_autobatch_turn_seconds");
        assert_eq!(runs.len() as u64, turns);
        assert!(runs.iter().all(|run| *run > 0.));
    }
    Ok(())
}

#[test]
fn every_stream_gets_its_own_seat() -> TractResult<()> {
    for sys in SYSTEMS {
        let runnable = doubler(sys, 8)?;
        let streams: Vec<_> = (0..8)
            .map(|stream| {
                let runnable = runnable.clone();
                std::thread::spawn(move || -> TractResult<()> {
                    let mut handle = runnable.spawn()?;
                    for t in 0..32 {
                        turn(&mut handle, stream, t)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for stream in streams {
            stream.join().unwrap()?;
        }
    }
    Ok(())
}

/// tract's linger knob set in code (`Knob::set`) reaches ours too.
#[test]
fn a_turn_seats_the_streams_that_are_ready() -> TractResult<()> {
    let _linger = LINGER.lock().unwrap_or_else(|e| e.into_inner());
    for sys in SYSTEMS {
        TRACT_TURN_LINGER_US.set(20_000);
        let runnable = doubler(sys, 8);
        TRACT_TURN_LINGER_US.clear();
        let runnable = runnable?;
        // Deliberate: ours ends a linger early once every held lane has a
        // seat queued, so a stream spawned while the others had not yet
        // would run alone; ours gets every handle before the first call.
        let held: Vec<Option<Box<dyn State>>> = (0..8)
            .map(|_| {
                if sys == Sys::Tract {
                    Ok(None)
                } else {
                    runnable.spawn().map(Some)
                }
            })
            .collect::<TractResult<_>>()?;
        let streams: Vec<_> = held
            .into_iter()
            .enumerate()
            .map(|(stream, handle)| {
                let runnable = runnable.clone();
                std::thread::spawn(move || -> TractResult<()> {
                    let mut handle = match handle {
                        Some(handle) => handle,
                        None => runnable.spawn()?,
                    };
                    for t in 0..4 {
                        turn(&mut handle, stream, t)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for stream in streams {
            stream.join().unwrap()?;
        }
        let (turns, seats) = runnable.turns_and_seats();
        assert!(
            seats > turns,
            "{sys:?}: {seats} seats over {turns} turns, none of them shared"
        );
    }
    Ok(())
}

/// `[B, 3] * 2 + bias`, `bias` unbatched: a shared input.
fn biased(sys: Sys, max_lanes: usize) -> TractResult<Wrapped> {
    let mut model = TypedModel::default();
    let batch = model.symbols.sym("B");
    let input = model.add_source("input", f32::fact(dims!(batch, 3)))?;
    let bias = model.add_source("bias", f32::fact(dims!(1, 1)))?;
    let two = model.add_const("two", tensor2(&[[2f32]]))?;
    let doubled = model.wire_node("doubled", mul(), &[input, two])?;
    let biased = model.wire_node("biased", add(), &[doubled[0], bias])?;
    model.select_output_outlets(&biased)?;
    wrap(sys, DefaultRuntime.prepare(model)?, max_lanes)
}

fn biased_turns(runnable: &Wrapped, biases: &[f32]) -> TractResult<Vec<TractResult<()>>> {
    let handles: Vec<Box<dyn State>> = biases.iter().map(|_| runnable.spawn()).collect::<TractResult<_>>()?;
    let streams: Vec<_> = handles
        .into_iter()
        .zip(biases.iter().copied())
        .map(|(mut handle, bias)| {
            std::thread::spawn(move || -> TractResult<()> {
                handle.run(tvec!(
                    tensor2(&[[1f32, 2., 3.]]).into_tvalue(),
                    tensor2(&[[bias]]).into_tvalue()
                ))?;
                Ok(())
            })
        })
        .collect();
    Ok(streams.into_iter().map(|stream| stream.join().unwrap()).collect())
}

#[test]
fn seats_agreeing_on_a_shared_input_share_a_turn() -> TractResult<()> {
    let _linger = LINGER.lock().unwrap_or_else(|e| e.into_inner());
    for sys in SYSTEMS {
        TRACT_TURN_LINGER_US.set(100_000);
        let runnable = biased(sys, 2);
        TRACT_TURN_LINGER_US.clear();
        let runnable = runnable?;
        let served = biased_turns(&runnable, &[7., 7.])?;
        assert!(served.iter().all(|s| s.is_ok()), "{sys:?}: {served:?}");
        assert_eq!(runnable.turns_and_seats(), (1, 2), "{sys:?}");
    }
    Ok(())
}

#[test]
fn seats_disagreeing_on_a_shared_input_fail_the_turn() -> TractResult<()> {
    let _linger = LINGER.lock().unwrap_or_else(|e| e.into_inner());
    for sys in SYSTEMS {
        TRACT_TURN_LINGER_US.set(100_000);
        let runnable = biased(sys, 2);
        TRACT_TURN_LINGER_US.clear();
        let runnable = runnable?;
        let served = biased_turns(&runnable, &[7., 8.])?;
        if sys == Sys::Tract {
            assert_eq!(runnable.turns_and_seats(), (1, 2));
            for stream in &served {
                let error = format!("{:#}", stream.as_ref().unwrap_err());
                assert!(error.contains("seats 0 and 1 feed it different ones"), "{error}");
            }
        } else {
            // Deliberate: seats disagreeing on a shared input go to separate
            // turns, and both are served, instead of failing together.
            assert!(served.iter().all(|s| s.is_ok()), "{sys:?}: {served:?}");
            assert_eq!(runnable.turns_and_seats(), (2, 2), "{sys:?}");
        }
    }
    Ok(())
}

fn wide_call(handle: &mut Box<dyn State>, seats: usize) -> TractResult<()> {
    let fed: Vec<f32> = (0..seats)
        .flat_map(|s| [s as f32, s as f32 + 1., s as f32 + 2.])
        .collect();
    let doubled: Vec<f32> = fed.iter().map(|x| 2. * x).collect();
    let output = handle.run(tvec!(Tensor::from_shape(&[seats, 3], &fed)?.into_tvalue()))?;
    assert_eq!(&*output[0], &Tensor::from_shape(&[seats, 3], &doubled)?);
    Ok(())
}

#[test]
fn a_call_asks_for_as_many_seats_as_it_feeds() -> TractResult<()> {
    for sys in SYSTEMS {
        let runnable = doubler(sys, 4)?;
        let mut handle = runnable.spawn()?;
        wide_call(&mut handle, 3)?;
        assert_eq!(runnable.turns_and_seats(), (1, 3), "{sys:?}");
    }
    Ok(())
}

#[test]
fn a_call_wider_than_the_lanes_is_split_across_turns() -> TractResult<()> {
    for sys in SYSTEMS {
        let runnable = doubler(sys, 2)?;
        let mut handle = runnable.spawn()?;
        wide_call(&mut handle, 5)?;
        let (turns, seats) = runnable.turns_and_seats();
        assert_eq!(seats, 5);
        if sys == Sys::Tract {
            assert_eq!(turns, 3, "5 seats over 2 lanes are 3 turns, got {turns}");
        } else {
            // Deliberate: the state keeps a spare lane for the later rows of
            // wide calls, so 5 seats over 2 lanes (3 in the state) are 2 turns.
            assert_eq!(turns, 2, "{sys:?}: 5 seats over 3 lanes are 2 turns, got {turns}");
        }
    }
    Ok(())
}

#[test]
fn a_seat_borrows_a_free_lane_only() -> TractResult<()> {
    for sys in SYSTEMS {
        let runnable = doubler(sys, 2)?;
        let mut handle = runnable.spawn()?;
        let mut other = runnable.spawn()?;
        turn(&mut other, 1, 0)?;
        wide_call(&mut handle, 4)?;
        let (turns, seats) = runnable.turns_and_seats();
        assert_eq!(seats, 5);
        if sys == Sys::Tract {
            assert_eq!(turns, 5, "another stream holds the second lane, so each seat is a turn");
        } else {
            // Deliberate: the spare lane is free to borrow, so some of the
            // 4 rows ride along with another (3 turns for them, not 4).
            assert_eq!(turns, 4, "{sys:?}: 1 turn for the other stream, 3 for the wide call");
        }
    }
    Ok(())
}

fn adder(sys: Sys, max_lanes: usize) -> TractResult<Wrapped> {
    let mut model = TypedModel::default();
    let batch = model.symbols.sym("B");
    let left = model.add_source("left", f32::fact(dims!(batch, 3)))?;
    let right = model.add_source("right", f32::fact(dims!(batch, 3)))?;
    let sum = model.wire_node("sum", add(), &[left, right])?;
    model.select_output_outlets(&sum)?;
    wrap(sys, DefaultRuntime.prepare(model)?, max_lanes)
}

#[test]
fn a_call_whose_batched_inputs_disagree_on_seats_fails() -> TractResult<()> {
    for sys in SYSTEMS {
        let runnable = adder(sys, 4)?;
        let mut handle = runnable.spawn()?;
        let error = handle
            .run(tvec!(
                tensor2(&[[1f32, 2., 3.], [4., 5., 6.]]).into_tvalue(),
                tensor2(&[[7f32, 8., 9.]]).into_tvalue()
            ))
            .unwrap_err();
        let error = format!("{error:#}");
        if sys == Sys::Tract {
            assert!(error.contains("input 1 carries 1 against 2"), "{error}");
        } else {
            // Ours names the input and both row counts in its own words.
            assert!(
                error.contains("input 1 (\"right\") feeds 1 rows on axis 0, the batched inputs before it feed 2"),
                "{error}"
            );
        }
    }
    Ok(())
}

#[test]
fn a_batch_off_axis_zero_says_which_axis_it_sits_on() -> TractResult<()> {
    for sys in SYSTEMS {
        let mut model = TypedModel::default();
        let batch = model.symbols.sym("B");
        let input = model.add_source("input", f32::fact(dims!(3, batch)))?;
        let two = model.add_const("two", tensor2(&[[2f32]]))?;
        let doubled = model.wire_node("doubled", mul(), &[input, two])?;
        model.select_output_outlets(&doubled)?;
        let error = refusal(sys, model, "a batch on axis 1 was accepted")?;
        if sys == Sys::Tract {
            assert!(error.contains("input 0 carries B on axis 1"), "{error}");
            assert!(error.contains("Batchify"), "{error}");
        } else {
            // Ours refuses it too, naming the input and the axis its way.
            assert!(error.contains("axis 1") && error.contains("input"), "{sys:?}: {error}");
        }
    }
    Ok(())
}

#[test]
fn two_batch_symbols_are_named() -> TractResult<()> {
    for sys in SYSTEMS {
        let mut model = TypedModel::default();
        let left_batch = model.symbols.sym("L");
        let right_batch = model.symbols.sym("R");
        let left = model.add_source("left", f32::fact(dims!(left_batch, 3)))?;
        let right = model.add_source("right", f32::fact(dims!(right_batch, 3)))?;
        let sum = model.wire_node("sum", add(), &[left, right])?;
        model.select_output_outlets(&sum)?;
        let error = refusal(sys, model, "two batch symbols were accepted")?;
        if sys == Sys::Tract {
            assert!(error.contains("L and R"), "{error}");
        } else {
            // Ours names both symbols its way.
            assert!(error.contains('L') && error.contains('R'), "{sys:?}: {error}");
        }
    }
    Ok(())
}

/// With the cap meaning tract's (one shard unless asked), a second stream
/// is refused until the first's last handle goes.
#[test]
fn a_dropped_stream_gives_its_lane_back() -> TractResult<()> {
    for sys in SYSTEMS {
        let runnable = doubler(sys, 1)?;
        let mut handle = runnable.spawn()?;
        turn(&mut handle, 0, 0)?;
        assert!(runnable.spawn().is_err(), "{sys:?}");
        let clone = dyn_clone::clone_box(&*handle);
        drop(handle);
        assert!(runnable.spawn().is_err(), "{sys:?}");
        drop(clone);
        let mut handle = spawn_once_free(&runnable)?;
        turn(&mut handle, 1, 0)?;
    }
    Ok(())
}

/// Tract's knobs reach ours whichever way tract reads them: `Knob::set`,
/// a `KnobScope`, the environment.
#[test]
fn tracts_knobs_set_ours_every_way() -> TractResult<()> {
    use tract_core::lanes::TRACT_MAX_SEATS;
    use tract_data::knobs::KnobScope;
    let _linger = LINGER.lock().unwrap_or_else(|e| e.into_inner());
    let inner = || -> TractResult<Arc<dyn Runnable>> {
        let mut model = TypedModel::default();
        let b = model.symbols.sym("B");
        let x = model.add_source("x", f32::fact(dims!(b, 3)))?;
        model.select_output_outlets(&[x])?;
        Ok(DefaultRuntime.prepare(model)?.into())
    };
    let built = |inner: Arc<dyn Runnable>| LanedRunner::wrap(inner, 8).unwrap();
    // Unset: tract's defaults.
    let plain = built(inner()?);
    assert_eq!(plain.policy(), laned_runner::TurnPolicy::Immediate);
    // Knob::set.
    TRACT_TURN_LINGER_US.set(100_000);
    TRACT_MAX_SEATS.set(3);
    let set = built(inner()?);
    TRACT_TURN_LINGER_US.clear();
    TRACT_MAX_SEATS.clear();
    assert_eq!(set.policy(), laned_runner::TurnPolicy::Linger { us: 100_000 });
    assert_eq!(set.max_seats(), 3);
    // A KnobScope (what a deploy config's model section enters).
    let scope = KnobScope::new([("TRACT_TURN_LINGER_US", "250"), ("TRACT_MAX_SEATS", "5")])?;
    let scoped = scope.enter(|| built(inner().unwrap()));
    assert_eq!(scoped.policy(), laned_runner::TurnPolicy::Linger { us: 250 });
    assert_eq!(scoped.max_seats(), 5);
    // Outside the scope, back to the defaults.
    assert_eq!(built(inner()?).policy(), laned_runner::TurnPolicy::Immediate);
    Ok(())
}
