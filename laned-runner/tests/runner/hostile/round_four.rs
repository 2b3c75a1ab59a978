//! The promise, round four (issue 47): a finish that counts every pulse, end
//! reasons that do not depend on the door, a state identity that knows the
//! graph, one validation of a policy, a config that reads back as written,
//! a verdict that names its call, queued seats counted from the first poll.
//! Each test names its defect.

use std::pin::pin;
use std::task::Poll;

use laned_runner::{EndReason, LanedStateHandle, PolicyError, RunError, Settled, StateSpec, StreamState, TurnPolicy};
use laned_testkit::exec::{counting_waker, poll_once};
use laned_testkit::fixtures::{self, Fixture};
use proptest::prelude::*;

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

/// Defect 1: `finish` through a handle whose clone made half the calls ends
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

/// Defect 1: a clone made while the original has a dropped call unsettled
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

/// The three ways to spawn, each as its caller sees it.
fn spawns(r: &LanedRunner) -> [(&'static str, Result<LanedStateHandle, SpawnError>); 3] {
    [
        ("try_spawn", r.try_spawn()),
        ("spawn_timeout", r.spawn_timeout(Duration::from_millis(20))),
        ("spawn_async", current_thread().block_on(r.spawn_async())),
    ]
}

/// Every spawn path refused with `want`, converting into `reason`: the end
/// `live`, a stream of the runner, is told.
fn refused_alike(
    r: &LanedRunner,
    want: fn(&SpawnError) -> bool,
    reason: EndReason,
    live: &LanedStateHandle,
    when: &str,
) {
    for (path, got) in spawns(r) {
        let e = got.err().unwrap_or_else(|| panic!("{when}: {path} was admitted"));
        assert!(want(&e), "{when}: {path} refused {e:?}");
        assert_eq!(RunError::from(e).end_reason(), Some(reason), "{when}: {path}");
    }
    assert_eq!(live.end_reason(), Some(reason), "{when}: the stream's end");
}

/// Defect 2: one answer per runner state for every spawn path, the end
/// its streams are told: `Draining` while admission stops and after a drain
/// (streams `Drained`), `Closed` after a close (streams `Closed`). On main
/// `try_spawn` was refused `Closed` after a drain, and `spawn_timeout` and
/// `spawn_async` `Draining` after a close.
#[test]
fn a_refused_spawn_names_the_runners_end_on_every_path() {
    let switch = Switch::new();
    let plan = counter(&switch, &[Some(3)]).unwrap();
    for (mode, shards) in SETUPS {
        let config = || RunnerConfig::builder().mode(mode).shards(shards).max_lanes(2);
        let when = format!("{mode:?}/{shards}");
        // Stopped admitting: no end marked yet, every path `Draining`.
        let r = runner_on(plan.clone(), config());
        let live = r.try_spawn().unwrap();
        r.stop_admitting();
        for (path, got) in spawns(&r) {
            assert!(
                matches!(got, Err(SpawnError::Draining)),
                "{when}, stopped: {path}: {got:?}"
            );
        }
        assert_eq!(live.end_reason(), None, "{when}: a live stream serves on");
        // Drained, a straggler left: `Draining` / `Drained` everywhere.
        let drained = r.drain(Instant::now() + Duration::from_millis(10));
        assert_eq!(drained.stragglers, 1);
        refused_alike(
            &r,
            |e| matches!(e, SpawnError::Draining),
            EndReason::Drained,
            &live,
            &format!("{when}, drained"),
        );
        // Closed: `Closed` everywhere.
        let r = runner_on(plan.clone(), config());
        let live = r.try_spawn().unwrap();
        r.close();
        refused_alike(
            &r,
            |e| matches!(e, SpawnError::Closed),
            EndReason::Closed,
            &live,
            &format!("{when}, closed"),
        );
        assert!(
            !SpawnError::Closed.to_string().contains("dropped"),
            "the runner was closed, not dropped"
        );
        // Dropped (its last owning clone): `Closed` through a detached clone.
        let r = runner_on(plan.clone(), config());
        let detached = r.detached();
        let live = r.try_spawn().unwrap();
        drop(r);
        refused_alike(
            &detached,
            |e| matches!(e, SpawnError::Closed),
            EndReason::Closed,
            &live,
            &format!("{when}, dropped"),
        );
    }
}

/// The GRU cell with its candidate's `tanh` made a `sigmoid`: another graph,
/// the same name, state facts and weights.
fn sigmoid_gru(f: &Fixture) -> TypedModel {
    let mut other = f.model.clone();
    let n = other
        .nodes
        .iter()
        .position(|n| n.name == "n")
        .expect("the candidate's tanh");
    assert!(
        format!("{:?}", other.nodes[n].op).contains("Tanh"),
        "{:?}",
        other.nodes[n].op
    );
    other.nodes[n].op = Box::new(tract_core::ops::nn::sigmoid());
    other
}

/// Defect 3: two models alike but for one op (`tanh` and `sigmoid`) have
/// different identities, and each refuses the other's state naming both
/// (on main each imported the other's); the same model prepared twice
/// agrees, and its state continues exactly.
#[test]
fn another_graphs_state_is_refused_naming_both() {
    let f = fixtures::gru_cell(5, 4).unwrap();
    let tanh = state_runner(f.runnable().unwrap());
    let sigmoid = state_runner(DefaultRuntime.prepare(sigmoid_gru(&f)).unwrap().into());
    let again = state_runner(f.runnable().unwrap());
    let (mut a, mut b) = (tanh.try_spawn().unwrap(), sigmoid.try_spawn().unwrap());
    assert_ne!(feed(&f, &mut a, 1), feed(&f, &mut b, 1), "the graphs compute apart");
    let (ours, theirs) = (a.export_state().unwrap(), b.export_state().unwrap());
    assert_ne!(ours.model, theirs.model, "the identities differ");
    for (to, state, own) in [(&mut b, &ours, &theirs), (&mut a, &theirs, &ours)] {
        let e = to.import_state(state).expect_err("another graph's state was taken");
        assert!(matches!(e.kind(), RunErrorKind::State(_)), "{e}");
        let text = e.to_string();
        for identity in [&state.model, &own.model] {
            assert!(
                text.contains(&format!("{identity:?}")),
                "{text:?} should name {identity:?}"
            );
        }
    }
    let mut c = again.try_spawn().unwrap();
    c.import_state(&ours).unwrap();
    assert_eq!(
        feed(&f, &mut c, 2),
        feed(&f, &mut a, 2),
        "the same model continues exactly"
    );
}

/// Defect 3: a state written before the identity covered the graph
/// (version 1) is refused by its version, naming both versions.
#[test]
fn a_state_of_the_old_format_is_refused_by_version() {
    let f = fixtures::gru_cell(5, 4).unwrap();
    let r = state_runner(f.runnable().unwrap());
    let mut h = r.try_spawn().unwrap();
    let mut json = serde_json::to_value(h.export_state().unwrap()).unwrap();
    json["version"] = 1.into();
    let old: StreamState = serde_json::from_value(json).unwrap();
    let e = h.import_state(&old).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("version 1") && text.contains(&format!("version {}", laned_runner::STREAM_STATE_VERSION)),
        "{text}"
    );
}

/// Policies no way of giving one may install: waits past an hour, a tick
/// of 0.
fn refused_policies() -> Vec<TurnPolicy> {
    vec![
        TurnPolicy::Linger { us: u64::MAX },
        TurnPolicy::LatencyBudget { us: 3_600_000_001 },
        TurnPolicy::Tick { period_us: u64::MAX },
        TurnPolicy::Tick { period_us: 0 },
    ]
}

/// Defect 4: one validation for every way a policy arrives: its text, serde
/// (text and table), a config given to `new` and `set_policy` all refuse
/// the same policies with the same words, and `set_policy` keeps the policy
/// in place (on main it installed them unchanged).
#[test]
fn a_policy_is_refused_alike_however_it_arrives() {
    let switch = Switch::new();
    let plan = counter(&switch, &[Some(3)]).unwrap();
    let r = runner_on(plan.clone(), RunnerConfig::builder().max_lanes(2));
    let before = r.policy();
    for policy in refused_policies() {
        let text = policy.to_string();
        let checked: PolicyError = policy.check().unwrap_err();
        let why = checked.to_string();
        assert_eq!(text.parse::<TurnPolicy>().unwrap_err(), checked, "{text}");
        let from_serde = serde_json::from_str::<TurnPolicy>(&format!("{text:?}")).unwrap_err();
        assert!(from_serde.to_string().contains(&why), "{from_serde} / {why}");
        let table = match policy {
            TurnPolicy::Linger { us } => format!(r#"{{"kind": "linger", "us": {us}}}"#),
            TurnPolicy::LatencyBudget { us } => format!(r#"{{"kind": "latency_budget", "us": {us}}}"#),
            TurnPolicy::Tick { period_us } => format!(r#"{{"kind": "tick", "period_us": {period_us}}}"#),
            _ => unreachable!(),
        };
        let from_table = serde_json::from_str::<TurnPolicy>(&table).unwrap_err();
        assert!(from_table.to_string().contains(&why), "{from_table} / {why}");
        let new = LanedRunner::new(plan.clone(), RunnerConfig::builder().policy(policy).build()).unwrap_err();
        assert!(matches!(new, NewRunnerError::Config(_)), "{new}");
        assert!(new.to_string().contains(&why), "{new} / {why}");
        assert_eq!(r.set_policy(policy).unwrap_err(), checked, "{text}");
        assert_eq!(r.policy(), before, "{text}: the policy in place is kept");
    }
    r.set_policy(TurnPolicy::Linger { us: 3_600_000_000 }).unwrap();
    assert_eq!(
        r.policy(),
        TurnPolicy::Linger { us: 3_600_000_000 },
        "the limit itself is taken"
    );
}

/// Defect 5: every refusal of a written policy names the field or the kind
/// (on main: "data did not match any variant of untagged enum Written").
#[test]
fn a_refused_policy_table_names_its_fault() {
    for (json, words) in [
        (r#"{"policy": {"kind": "linger"}}"#, &["missing field", "us"][..]),
        (r#"{"policy": {"kind": "tick"}}"#, &["missing field", "period_us"]),
        (
            r#"{"policy": {"kind": "sometimes"}}"#,
            &["unknown variant", "sometimes", "linger"],
        ),
        (r#"{"policy": {"us": 5}}"#, &["missing field", "kind"]),
        (
            r#"{"policy": {"kind": "linger", "us": 5, "soon": 1}}"#,
            &["unknown field", "soon"],
        ),
        (r#"{"policy": {"kind": "tick", "us": 5}}"#, &["unknown field", "us"]),
        (r#"{"policy": {"kind": "tick", "period_us": 0}}"#, &["tick:0", "0 µs"]),
        (r#"{"policy": "linger:fast"}"#, &["linger:fast", "microseconds"]),
    ] {
        let e = serde_json::from_str::<RunnerConfig>(json).unwrap_err().to_string();
        for w in words {
            assert!(e.contains(w), "{json}: {e:?} should say {w:?}");
        }
        assert!(!e.contains("untagged"), "{json}: {e}");
    }
}

/// Defect 6: a call made while an earlier dropped call's verdict has not
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

/// Defect 7: a call queued while the state is held (a turn running) counts
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

/// Every policy, valid or not: the four kinds over the whole `u64` range,
/// the edges weighted in.
fn any_policy() -> impl Strategy<Value = TurnPolicy> {
    let us = prop_oneof![
        Just(0u64),
        Just(1),
        Just(3_600_000_000),
        Just(3_600_000_001),
        Just(u64::MAX),
        0..4_000_000_000u64,
        any::<u64>(),
    ];
    prop_oneof![
        Just(TurnPolicy::Immediate),
        us.clone().prop_map(|us| TurnPolicy::Linger { us }),
        us.clone().prop_map(|us| TurnPolicy::LatencyBudget { us }),
        us.prop_map(|period_us| TurnPolicy::Tick { period_us }),
    ]
}

/// A port by index or by name (names that look like numbers included).
fn any_port() -> impl Strategy<Value = laned_runner::PortRef> {
    prop_oneof![
        (0..8usize).prop_map(laned_runner::PortRef::Index),
        "[a-z0-9_.]{1,8}".prop_map(laned_runner::PortRef::Name),
    ]
}

fn any_state() -> impl Strategy<Value = StateSpec> {
    let pair = (
        any_port(),
        any_port(),
        // Any finite value: JSON reads it back exactly (serde_json with
        // `float_roundtrip`, as the workspace builds it).
        proptest::option::of(proptest::collection::vec(-1e300f64..1e300, 0..6)),
    )
        .prop_map(|(input, output, values)| {
            let pair = laned_runner::StatePair::new(input, output);
            match values {
                Some(values) => pair.with_initial(vec![1, values.len()], values),
                None => pair,
            }
        });
    prop_oneof![
        Just(StateSpec::None),
        Just(StateSpec::Detect),
        proptest::collection::vec(pair, 0..3).prop_map(StateSpec::Pairs),
    ]
}

/// Every config serde can be handed: each field set or left out.
fn any_config() -> impl Strategy<Value = RunnerConfig> {
    (
        (
            1..4096usize,
            proptest::option::of(1..64usize),
            proptest::option::of(1..512usize),
        ),
        (
            proptest::option::of(0..10_000_000u64),
            any::<bool>(),
            proptest::option::of(any_policy()),
        ),
        (any_state(), 0..4096usize, proptest::option::of(1..1_000_000u64)),
    )
        .prop_map(
            |((lanes, shards, seats), (linger, combining, policy), (state, waiting, idle))| {
                let mut b = RunnerConfig::builder()
                    .max_lanes(lanes)
                    .mode(if combining { Mode::Combining } else { Mode::Worker })
                    .state(state)
                    .max_waiting(waiting);
                if let Some(shards) = shards {
                    b = b.shards(shards);
                }
                if let Some(seats) = seats {
                    b = b.max_seats(seats);
                }
                if let Some(us) = linger {
                    b = b.linger(Duration::from_micros(us));
                }
                if let Some(policy) = policy {
                    b = b.policy(policy);
                }
                if let Some(ms) = idle {
                    b = b.idle_timeout(Duration::from_millis(ms));
                }
                b.build()
            },
        )
}

/// The one check (defects 4 and 5): a policy every way reads back equal to
/// what was written, or is refused the same way everywhere; a config with a
/// policy that passes reads back equal as JSON.
fn check_round_trip(policy: TurnPolicy, config: &RunnerConfig) -> Result<(), TestCaseError> {
    let text = policy.to_string();
    match policy.check() {
        Ok(()) => {
            prop_assert_eq!(text.parse::<TurnPolicy>(), Ok(policy), "{}", text);
            let json = serde_json::to_string(&policy).unwrap();
            prop_assert_eq!(serde_json::from_str::<TurnPolicy>(&json).unwrap(), policy);
        }
        Err(refused) => {
            prop_assert_eq!(text.parse::<TurnPolicy>(), Err(refused.clone()), "{}", text);
            let e = serde_json::from_str::<TurnPolicy>(&format!("{text:?}")).unwrap_err();
            prop_assert!(e.to_string().contains(&refused.to_string()), "{}", e);
        }
    }
    let json = serde_json::to_string(config).unwrap();
    match config.policy.map(|p| p.check()) {
        Some(Err(refused)) => {
            let e = serde_json::from_str::<RunnerConfig>(&json).unwrap_err();
            prop_assert!(e.to_string().contains(&refused.to_string()), "{}: {}", json, e);
        }
        _ => {
            let back: RunnerConfig =
                serde_json::from_str(&json).map_err(|e| TestCaseError::fail(format!("{json}: {e}")))?;
            prop_assert_eq!(&back, config, "{}", json);
            prop_assert_eq!(serde_json::to_string(&back).unwrap(), json);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn what_is_written_reads_back(policy in any_policy(), config in any_config()) {
        check_round_trip(policy, &config)?;
    }
}

/// The cases that broke on main, pinned: `tick:0` read back as `tick:1`,
/// waits past an hour read and written.
#[test]
fn what_is_written_reads_back_pinned() {
    let config = |policy| RunnerConfig::builder().policy(policy).build();
    for policy in [
        TurnPolicy::Tick { period_us: 0 },
        TurnPolicy::Tick { period_us: 1 },
        TurnPolicy::Linger { us: u64::MAX },
        TurnPolicy::LatencyBudget { us: 3_600_000_001 },
        TurnPolicy::LatencyBudget { us: 3_600_000_000 },
        TurnPolicy::Immediate,
    ] {
        check_round_trip(policy, &config(policy)).unwrap();
    }
    check_round_trip(TurnPolicy::Immediate, &RunnerConfig::default()).unwrap();
    // An initial value serde_json's default float parser reads a unit off.
    let state = StateSpec::Pairs(vec![
        laned_runner::StatePair::new(0, 0).with_initial(vec![1, 1], vec![904786.8330078125])
    ]);
    check_round_trip(TurnPolicy::Immediate, &RunnerConfig::builder().state(state).build()).unwrap();
}
