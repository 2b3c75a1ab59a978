//! The `tracing` events (feature `tracing`): a failed turn, an evicted
//! stream, a drain's start and end reach the process's subscriber under
//! target `laned`, from whichever runner thread they happen on.
#![cfg(feature = "tracing")]

use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use laned_runner::{LanedRunner, RunnerConfig};
use laned_testkit::fixtures;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tract_core::internal::*;

use crate::common::MODES;

/// Every event seen, as "LEVEL target: message field=value ...".
static SEEN: Mutex<Vec<String>> = Mutex::new(vec![]);

/// Keeps events, ignores spans.
struct Keep;

struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?} {}", self.0);
        } else {
            self.0 += &format!(" {}={value:?}", field.name());
        }
    }
}

impl Subscriber for Keep {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        let meta = event.metadata();
        SEEN.lock()
            .unwrap()
            .push(format!("{} {}: {}", meta.level(), meta.target(), text.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// The subscriber, installed once for the process (the runner's threads
/// are not the test's, so a thread-local default would not see them).
fn install() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| tracing::subscriber::set_global_default(Keep).unwrap());
}

fn seen(what: &str) -> Vec<String> {
    SEEN.lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(what))
        .cloned()
        .collect()
}

/// A panicking turn, an idle stream evicted, a drain: each one event, with
/// its shard and its reason.
#[test]
fn failures_evictions_and_drains_are_traced() {
    install();
    for mode in MODES {
        SEEN.lock().unwrap().clear();
        let f = fixtures::panicking().unwrap();
        let r = LanedRunner::new(
            f.runnable().unwrap(),
            RunnerConfig::builder()
                .mode(mode)
                .shards(1)
                .max_lanes(2)
                .idle_timeout(Duration::from_millis(50))
                .build(),
        )
        .unwrap();
        let mut a = r.try_spawn().unwrap();
        let mut poisoned = f.inputs(1, 1);
        poisoned[0] = Tensor::from_shape(&[1, 40, 4], &[fixtures::POISON; 160])
            .unwrap()
            .into_tvalue();
        assert!(a.call(poisoned).is_err());
        let failed = seen("a turn failed");
        assert_eq!(failed.len(), 1, "{mode:?}: {:?}", SEEN.lock().unwrap());
        assert!(failed[0].starts_with("WARN laned: "), "{}", failed[0]);
        assert!(
            failed[0].contains("poisoned input") && failed[0].contains("shard=0"),
            "{}",
            failed[0]
        );

        // An idle stream, evicted when another spawns after its timeout.
        let _idle = r.try_spawn().unwrap();
        thread::sleep(Duration::from_millis(120));
        let _next = r.try_spawn().unwrap();
        let evicted = seen("a stream was evicted");
        assert!(!evicted.is_empty(), "{mode:?}: {:?}", SEEN.lock().unwrap());
        assert!(evicted[0].starts_with("INFO laned: ") && evicted[0].contains("did not call for"));

        let drained = r.drain(Instant::now() + Duration::from_millis(10));
        assert_eq!(seen("a drain started").len(), 1);
        let ended = seen("a drain's wait ended");
        assert_eq!(ended.len(), 1);
        assert!(
            ended[0].contains(&format!("stragglers={}", drained.stragglers)),
            "{}",
            ended[0]
        );
    }
}
