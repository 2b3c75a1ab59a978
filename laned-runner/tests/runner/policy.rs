//! The turn policy, live: changes under load lose no call and show in the
//! metrics; the budget policy learns turn times and widens turns.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use laned_runner::{LanedRunner, RunnerConfig, TurnPolicy};
use laned_testkit::fixtures;

use crate::common::MODES;

/// Changing the policy and max_seats while threads call loses no call: every
/// call is answered, exactly as its stream's solo run.
#[test]
fn live_policy_changes_under_load_lose_no_call() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = LanedRunner::new(
            f.runnable().unwrap(),
            RunnerConfig::builder().shards(1).max_lanes(6).mode(mode).build(),
        )
        .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let callers: Vec<_> = (0..6u64)
            .map(|s| {
                let (mut h, f, stop) = (r.try_spawn().unwrap(), f.clone(), stop.clone());
                thread::spawn(move || {
                    let mut solo = f.runnable().unwrap().spawn().unwrap();
                    let mut calls = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let inputs = f.inputs(1, s * 1000 + calls);
                        let got = h.call(inputs.clone()).unwrap();
                        assert_eq!(*got[0], *solo.run(inputs).unwrap()[0], "stream {s} call {calls}");
                        calls += 1;
                    }
                    calls
                })
            })
            .collect();
        let policies = [
            TurnPolicy::linger(Duration::from_millis(2)),
            TurnPolicy::latency_budget(Duration::from_millis(3)),
            TurnPolicy::tick(Duration::from_millis(1)),
            TurnPolicy::Immediate,
            TurnPolicy::linger(Duration::from_secs(3600)),
            TurnPolicy::latency_budget(Duration::from_micros(10)),
        ];
        for (i, p) in policies.iter().enumerate() {
            r.set_policy(*p).unwrap();
            r.set_max_seats(1 + i % 6);
            thread::sleep(Duration::from_millis(40));
        }
        r.set_policy(TurnPolicy::Immediate).unwrap();
        stop.store(true, Ordering::Relaxed);
        let calls: u64 = callers.into_iter().map(|t| t.join().unwrap()).sum();
        let m = r.metrics();
        assert_eq!(m.seats, calls, "{mode:?}: every call was served once");
        assert_eq!(m.policy_changes, 2 * policies.len() as u64 + 1);
        assert_eq!(r.policy(), TurnPolicy::Immediate);
    }
}

/// Under `LatencyBudget`, the runner learns the turn time per occupancy and
/// waits for wider turns than `Immediate` gives, within the budget.
#[test]
fn a_latency_budget_learns_turn_times_and_widens_turns() {
    let f = fixtures::small_tdnn();
    let occupancy = |policy: TurnPolicy| {
        let r = LanedRunner::new(
            f.runnable().unwrap(),
            RunnerConfig::builder().shards(1).max_lanes(4).policy(policy).build(),
        )
        .unwrap();
        // Streams calling at staggered instants: they rarely arrive
        // together, yet often enough that the state would be busy at least
        // half the time (the budget waits only then): a pause of 40 to 160
        // µs (the scheduler's grain stretches it to some 100 µs) against a
        // turn of tens of µs at the least keeps 4 streams' arrival rate
        // times the turn time well over one half, on a quiet machine or a
        // loaded one.
        let callers: Vec<_> = (0..4u64)
            .map(|s| {
                let (mut h, f) = (r.try_spawn().unwrap(), f.clone());
                thread::spawn(move || {
                    for c in 0..60 {
                        h.call(f.inputs(1, c)).unwrap();
                        thread::sleep(Duration::from_micros(40 * (s + 1)));
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        (r.metrics(), r.turn_time_curves().remove(0))
    };
    let (immediate, _) = occupancy(TurnPolicy::Immediate);
    let (budget, curve) = occupancy(TurnPolicy::latency_budget(Duration::from_millis(20)));
    assert!(!curve.is_empty(), "no turn time learned");
    assert!(budget.policy_waits.count > 0, "the budget policy never chose to wait");
    assert!(
        budget.mean_occupancy() > immediate.mean_occupancy(),
        "budget {:.2} vs immediate {:.2} seats per turn",
        budget.mean_occupancy(),
        immediate.mean_occupancy()
    );
}

#[test]
fn a_policy_loads_from_json() {
    let config: RunnerConfig =
        serde_json::from_str(r#"{ "max_lanes": 8, "policy": { "kind": "latency_budget", "us": 20000 } }"#).unwrap();
    assert_eq!(
        config.policy,
        Some(TurnPolicy::latency_budget(Duration::from_millis(20)))
    );
    let r = LanedRunner::new(fixtures::small_tdnn().runnable().unwrap(), config).unwrap();
    assert_eq!(r.policy(), TurnPolicy::LatencyBudget { us: 20000 });
}

/// Two threads changing the live settings at once (one the policy, one
/// `max_seats`) never undo each other: each one's last change stands.
#[test]
fn concurrent_setters_lose_no_change() {
    let r = LanedRunner::new(
        fixtures::small_tdnn().runnable().unwrap(),
        RunnerConfig::builder().shards(2).max_lanes(64).build(),
    )
    .unwrap();
    for round in 0..20u64 {
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let (r1, b1) = (r.clone(), barrier.clone());
        let policies = thread::spawn(move || {
            b1.wait();
            for us in 0..200 {
                r1.set_policy(TurnPolicy::Linger { us: round * 1000 + us }).unwrap();
            }
        });
        let (r2, b2) = (r.clone(), barrier);
        let seats = thread::spawn(move || {
            b2.wait();
            for n in 1..=40 {
                r2.set_max_seats(n);
            }
        });
        policies.join().unwrap();
        seats.join().unwrap();
        assert_eq!(
            r.policy(),
            TurnPolicy::Linger { us: round * 1000 + 199 },
            "round {round}"
        );
        assert_eq!(r.max_seats(), 40, "round {round}");
    }
}
