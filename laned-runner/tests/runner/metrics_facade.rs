//! The `metrics` facade (feature `metrics-facade`): a host's recorder sees
//! the runner under tract's names and label, plus our capacity gauges,
//! with the values of a known load. (That recording allocates nothing is
//! a unit test of the facade module.)
#![cfg(feature = "metrics-facade")]

use std::collections::HashMap;
use std::sync::Arc;

use laned_runner::{LanedRunner, RunnerConfig};
use laned_testkit::fixtures;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use tract_core::internal::*;

use crate::common::MODES;

type Reported = HashMap<(MetricKind, String, Vec<(String, String)>), DebugValue>;

fn reported(recorder: &DebuggingRecorder) -> Reported {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value): (CompositeKey, _, _, DebugValue)| {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            ((kind, key.name().to_string(), labels), value)
        })
        .collect()
}

fn label(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A named model on 2 shards of 4 lanes, 3 streams calling 5 times each:
/// tract's counters and histograms under `runnable` add up to the runner's
/// own snapshot; the gauges per shard say what each shard holds.
#[test]
fn a_recorder_sees_tract_names_and_our_gauges() {
    for mode in MODES {
        let f = fixtures::small_tdnn();
        let mut model = f.model.clone();
        model.set_name("tdnn-small");
        let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(model).unwrap().into();
        let recorder = DebuggingRecorder::new();
        // Handles bind to the recorder installed where the runner is built.
        let runner = metrics::with_local_recorder(&recorder, || {
            LanedRunner::new(plan, RunnerConfig::builder().mode(mode).shards(2).max_lanes(4).build()).unwrap()
        });
        let mut streams: Vec<_> = (0..3).map(|_| runner.try_spawn().unwrap()).collect();
        for call in 0..5 {
            for (s, h) in streams.iter_mut().enumerate() {
                h.call(f.inputs(1, (s * 10 + call) as u64)).unwrap();
            }
        }
        let snapshot = runner.metrics();
        let got = reported(&recorder);
        let runnable = label(&[("runnable", "tdnn-small")]);
        let value = |kind, name: &str, labels: &Vec<(String, String)>| {
            got.get(&(kind, name.to_string(), labels.clone()))
                .unwrap_or_else(|| panic!("{name} {labels:?} not reported: {:?}", got.keys().collect::<Vec<_>>()))
        };
        assert_eq!(
            value(MetricKind::Counter, "tract_autobatch_turns_total", &runnable),
            &DebugValue::Counter(snapshot.turns)
        );
        assert_eq!(
            value(MetricKind::Counter, "tract_autobatch_seats_total", &runnable),
            &DebugValue::Counter(15)
        );
        let samples = |name: &str| match value(MetricKind::Histogram, name, &runnable) {
            DebugValue::Histogram(v) => v.clone(),
            other => panic!("{name} is {other:?}"),
        };
        let per_turn = samples("tract_autobatch_seats_per_turn");
        assert_eq!(per_turn.len() as u64, snapshot.turns);
        assert_eq!(per_turn.iter().map(|v| v.into_inner()).sum::<f64>(), 15.0);
        assert_eq!(samples("tract_autobatch_queue_wait_seconds").len(), 15);
        assert_eq!(samples("tract_autobatch_turn_seconds").len() as u64, snapshot.turns);
        // Per shard: lanes, taken, free, queued; every stream on some shard.
        let mut taken = 0.0;
        for shard in 0..2 {
            let shard = shard.to_string();
            let labels = label(&[("runnable", "tdnn-small"), ("shard", &shard)]);
            let gauge = |name: &str| match value(MetricKind::Gauge, name, &labels) {
                DebugValue::Gauge(v) => v.into_inner(),
                other => panic!("{name} is {other:?}"),
            };
            assert_eq!(gauge("laned_lanes_max"), 4.0);
            let held = gauge("tract_autobatch_lanes_taken");
            assert_eq!(gauge("laned_lanes_free"), 4.0 - held);
            assert_eq!(gauge("laned_seats_queued"), 0.0);
            let held_here = streams.iter().filter(|h| h.shard().to_string() == shard).count() as f64;
            assert_eq!(held, held_here, "shard {shard}");
            taken += held;
        }
        assert_eq!(taken, 3.0);
        assert_eq!(
            value(MetricKind::Gauge, "laned_spawners_waiting", &runnable),
            &DebugValue::Gauge(0.0.into())
        );
        drop(streams);
    }
}

/// A model without a name is reported without the `runnable` label, as
/// tract reports it.
#[test]
fn an_unnamed_model_is_reported_without_a_runnable_label() {
    let f = fixtures::small_tdnn();
    let mut model = f.model.clone();
    model.properties.remove("tract.name");
    assert_eq!(model.name(), None);
    let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(model).unwrap().into();
    let recorder = DebuggingRecorder::new();
    let runner = metrics::with_local_recorder(&recorder, || {
        LanedRunner::new(plan, RunnerConfig::builder().shards(1).max_lanes(2).build()).unwrap()
    });
    runner.try_spawn().unwrap().call(f.inputs(1, 0)).unwrap();
    let got = reported(&recorder);
    assert_eq!(
        got.get(&(MetricKind::Counter, "tract_autobatch_turns_total".into(), vec![])),
        Some(&DebugValue::Counter(1))
    );
}

/// What goes wrong is on the facade too, under `laned_*` names and equal
/// to the runner's own counters: admissions, a refusal (a full runner), a
/// failed turn and its seats (a panicking model), a seat after its lost
/// state, a policy change.
#[test]
fn refusals_and_failures_reach_the_recorder_under_laned_names() {
    for mode in MODES {
        let f = fixtures::panicking().unwrap();
        let mut model = f.model.clone();
        model.set_name("poisonable");
        let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(model).unwrap().into();
        let recorder = DebuggingRecorder::new();
        let runner = metrics::with_local_recorder(&recorder, || {
            LanedRunner::new(plan, RunnerConfig::builder().mode(mode).shards(1).max_lanes(2).build()).unwrap()
        });
        let (mut a, mut b) = (runner.try_spawn().unwrap(), runner.try_spawn().unwrap());
        assert!(runner.try_spawn().is_err(), "full: refused");
        b.call(f.inputs(1, 1)).unwrap();
        let mut poisoned = f.inputs(1, 1);
        poisoned[0] = Tensor::from_shape(&[1, 40, 4], &[fixtures::POISON; 160])
            .unwrap()
            .into_tvalue();
        assert!(a.call(poisoned).is_err(), "the turn panics");
        assert!(a.call(f.inputs(1, 2)).is_err(), "its state is lost");
        runner.set_max_seats(1);

        let snapshot = runner.metrics();
        assert_eq!(
            (snapshot.admissions, snapshot.admissions_refused, snapshot.failed_turns),
            (2, 1, 1)
        );
        assert_eq!(snapshot.failed_seats, 2, "the poisoned seat and the lost one");
        let got = reported(&recorder);
        let runnable = label(&[("runnable", "poisonable")]);
        let counter = |name: &str| match got.get(&(MetricKind::Counter, name.to_string(), runnable.clone())) {
            Some(DebugValue::Counter(n)) => *n,
            other => panic!("{name}: {other:?} in {:?}", got.keys().collect::<Vec<_>>()),
        };
        assert_eq!(counter("laned_admissions_total"), snapshot.admissions, "{mode:?}");
        assert_eq!(counter("laned_admissions_waited_total"), snapshot.admissions_waited);
        assert_eq!(counter("laned_admissions_refused_total"), snapshot.admissions_refused);
        assert_eq!(counter("laned_failed_turns_total"), snapshot.failed_turns);
        assert_eq!(counter("laned_failed_seats_total"), snapshot.failed_seats);
        assert_eq!(counter("laned_deadline_misses_total"), snapshot.deadline_misses);
        assert_eq!(counter("laned_policy_changes_total"), snapshot.policy_changes);
        assert_eq!(snapshot.policy_changes, 1);
        // tract's names carry nothing of ours.
        assert!(
            got.keys().all(|(_, name, _)| !name.starts_with("tract_autobatch_")
                || [
                    "turns_total",
                    "seats_total",
                    "seats_per_turn",
                    "lanes_taken",
                    "queue_wait_seconds",
                    "turn_seconds"
                ]
                .iter()
                .any(|n| name == &format!("tract_autobatch_{n}"))),
            "{:?}",
            got.keys().collect::<Vec<_>>()
        );
    }
}
