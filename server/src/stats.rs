//! The KServe v2 `statistics` extension: per model, its infer requests
//! counted and timed as Triton reports them (`GET /v2/models/stats`,
//! `GET /v2/models/NAME/stats`, gRPC `ModelStatistics`). Counted at one
//! place, the infer path both fronts share ([`Clock`] and
//! [`ModelStats::record`]), with atomics only (no lock on a request's
//! path).
//!
//! What each duration covers (each measured with `Instant`):
//! - `success`: a request's whole time on the server, from its front
//!   having its bytes (the REST body read, the gRPC message decoded) to
//!   its answer built; `fail` the same for a request refused or failed.
//! - `queue`: the wait for the model's turn, inside the sequence's call:
//!   the sequence taken from the table (or started or resumed), and a new
//!   sequence's lane admitted (up to `admission_wait_ms`).
//! - `compute_input`: the request's checks and its pulse's tensors built.
//! - `compute_infer`: the call on the sequence's lane: the batched step
//!   the pulse rides in, with the other lanes' pulses of that step.
//! - `compute_output`: the answer's bytes and message built.
//!
//! Each request is one inference and one execution of its own as a client
//! sees it (`inference_count` and `execution_count` are the successes;
//! the runner batches lanes into steps beneath, which is not counted
//! here).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// A count and the nanoseconds summed over it.
#[derive(Debug, Default)]
pub(crate) struct Stat {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Stat {
    fn add(&self, d: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.ns
            .fetch_add(d.as_nanos().try_into().unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Its count and nanoseconds.
    pub(crate) fn get(&self) -> (u64, u64) {
        (self.count.load(Ordering::Relaxed), self.ns.load(Ordering::Relaxed))
    }

    fn json(&self) -> Value {
        let (count, ns) = self.get();
        json!({ "count": count, "ns": ns })
    }
}

/// One model's statistics.
#[derive(Debug, Default)]
pub(crate) struct ModelStats {
    /// Milliseconds since the epoch of the last success (0: none yet).
    pub(crate) last_inference: AtomicU64,
    pub(crate) success: Stat,
    pub(crate) fail: Stat,
    pub(crate) queue: Stat,
    pub(crate) compute_input: Stat,
    pub(crate) compute_infer: Stat,
    pub(crate) compute_output: Stat,
}

/// One request's clock: started as its front has its bytes, marked as it
/// passes each part.
#[derive(Debug)]
pub(crate) struct Clock {
    start: Instant,
    /// The checks done (the pulse built).
    checked: Option<Instant>,
    /// The sequence's call begun, and its lane's call begun (after the
    /// queue).
    pub(crate) called: Option<Instant>,
    pub(crate) ran: Option<Instant>,
    /// The call returned.
    answered: Option<Instant>,
}

impl Clock {
    pub(crate) fn start() -> Clock {
        Clock {
            start: Instant::now(),
            checked: None,
            called: None,
            ran: None,
            answered: None,
        }
    }

    /// The checks done, the call about to begin.
    pub(crate) fn checked(&mut self) {
        let now = Instant::now();
        self.checked = Some(now);
        self.called = Some(now);
    }

    /// The call returned.
    pub(crate) fn answered(&mut self) {
        self.answered = Some(Instant::now());
    }
}

impl ModelStats {
    /// Request `clock`'s end: a success with each part's time, or a
    /// failure with its whole time.
    pub(crate) fn record(&self, clock: &Clock, ok: bool) {
        let end = Instant::now();
        let total = end - clock.start;
        if !ok {
            self.fail.add(total);
            return;
        }
        let (checked, called, answered) = (
            clock.checked.unwrap_or(clock.start),
            clock.called.unwrap_or(clock.start),
            clock.answered.unwrap_or(end),
        );
        let ran = clock.ran.unwrap_or(called);
        self.success.add(total);
        self.compute_input.add(checked - clock.start);
        self.queue.add(ran.saturating_duration_since(called));
        self.compute_infer.add(answered.saturating_duration_since(ran));
        self.compute_output.add(end.saturating_duration_since(answered));
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.last_inference.fetch_max(ms, Ordering::Relaxed);
    }

    /// Triton's JSON of model `name`'s statistics.
    pub(crate) fn json(&self, name: &str) -> Value {
        let successes = self.success.get().0;
        json!({
            "name": name,
            "version": "1",
            "last_inference": self.last_inference.load(Ordering::Relaxed),
            "inference_count": successes,
            "execution_count": successes,
            "inference_stats": {
                "success": self.success.json(),
                "fail": self.fail.json(),
                "queue": self.queue.json(),
                "compute_input": self.compute_input.json(),
                "compute_infer": self.compute_infer.json(),
                "compute_output": self.compute_output.json(),
                "cache_hit": { "count": 0, "ns": 0 },
                "cache_miss": { "count": 0, "ns": 0 },
            },
            "batch_stats": [],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_counts_each_part_and_a_failure_only_fail() {
        let s = ModelStats::default();
        let mut c = Clock::start();
        std::thread::sleep(Duration::from_millis(1));
        c.checked();
        c.ran = Some(Instant::now());
        c.answered();
        s.record(&c, true);
        s.record(&Clock::start(), false);
        assert_eq!(s.success.get().0, 1);
        assert_eq!(s.fail.get().0, 1);
        for part in [&s.queue, &s.compute_input, &s.compute_infer, &s.compute_output] {
            assert_eq!(part.get().0, 1);
        }
        assert!(s.compute_input.get().1 >= 1_000_000);
        assert!(s.success.get().1 >= s.compute_input.get().1);
        let j = s.json("m");
        assert_eq!(j["inference_count"], 1);
        assert!(j["last_inference"].as_u64().unwrap() > 0);
    }
}
