//! A turn policy is checked one way however it arrives (its text, serde,
//! a config, `set_policy`), every refusal names its fault, and a policy or
//! a config reads back as it was written.

use laned_runner::{PolicyError, StateSpec, TurnPolicy};
use proptest::prelude::*;

use super::*;

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

/// Defect 4 (issue 47): one validation for every way a policy arrives: its text, serde
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

/// Defect 5 (issue 47): every refusal of a written policy names the field or the kind
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
