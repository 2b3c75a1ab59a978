//! The runner's records through the `metrics` facade (feature
//! `metrics-facade`), so that whatever recorder the host installed
//! (`metrics-exporter-prometheus`, say) sees laned beside tract's own
//! `LanedRunnable`. Without the feature every method here is empty and
//! compiles away.
//!
//! Names and labels:
//! - tract's, as tract-core 0.23.9 records its runner:
//!   `tract_autobatch_turns_total`, `_seats_total` (counters),
//!   `_seats_per_turn`, `_queue_wait_seconds`, `_turn_seconds`
//!   (histograms), `_lanes_taken` (gauge), labelled `runnable` with the
//!   model's `tract.name` where it has one;
//! - ours, for everything tract does not count: `laned_lanes_max`,
//!   `laned_lanes_free`, `laned_seats_queued` (gauges per shard),
//!   `laned_spawners_waiting` (runner-wide gauge); the counters
//!   `laned_admissions_total`, `laned_admissions_waited_total`,
//!   `laned_admissions_refused_total`, `laned_failed_seats_total`,
//!   `laned_failed_turns_total`, `laned_deadline_misses_total`,
//!   `laned_policy_changes_total`; the histograms
//!   `laned_admission_wait_seconds`, `laned_policy_wait_seconds`. The same
//!   names `laned_metrics::Snapshot::to_prometheus` renders.
//!
//! Counters and histograms carry the `runnable` label only, so every
//! shard adds into one series, as tract's one worker does; gauges are
//! per shard and carry a `shard` label too (sum them for the runner).
//! Handles are bound when the runner is built, to the recorder installed
//! then (tract's rule too); recording is an atomic operation on a handle,
//! no allocation.

#[cfg(feature = "metrics-facade")]
mod on {
    use std::sync::Once;
    use std::time::Duration;

    use metrics::{Counter, Gauge, Histogram, Label, Unit};

    fn describe() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            metrics::describe_counter!("tract_autobatch_turns_total", "Turns an autobatched runnable ran");
            metrics::describe_counter!(
                "tract_autobatch_seats_total",
                "Seats an autobatched runnable filled over its turns"
            );
            metrics::describe_histogram!(
                "tract_autobatch_seats_per_turn",
                "Seats one turn of an autobatched runnable filled"
            );
            metrics::describe_gauge!(
                "tract_autobatch_lanes_taken",
                "Lanes held by the streams of an autobatched runnable"
            );
            metrics::describe_histogram!(
                "tract_autobatch_queue_wait_seconds",
                Unit::Seconds,
                "From a seat queued to the start of the turn seating it, linger included"
            );
            metrics::describe_histogram!(
                "tract_autobatch_turn_seconds",
                Unit::Seconds,
                "One turn of an autobatched runnable, stacking and slicing included"
            );
            metrics::describe_gauge!("laned_lanes_max", "Lanes a shard of a laned runner has");
            metrics::describe_gauge!("laned_lanes_free", "Lanes of a shard free for a new stream");
            metrics::describe_gauge!("laned_seats_queued", "Seats queued on a shard for a turn");
            metrics::describe_gauge!(
                "laned_learned_width",
                "The turn width a shard learned to cost least per row, where it caps turns (0: no cap)"
            );
            metrics::describe_gauge!("laned_spawners_waiting", "Spawners waiting for a lane of the runner");
            metrics::describe_counter!("laned_admissions_total", "Streams given a lane");
            metrics::describe_counter!(
                "laned_admissions_waited_total",
                "Streams given a lane after waiting for one"
            );
            metrics::describe_histogram!(
                "laned_admission_wait_seconds",
                Unit::Seconds,
                "How long admitted streams waited for a lane"
            );
            metrics::describe_counter!("laned_admissions_refused_total", "Streams refused a lane");
            metrics::describe_counter!("laned_failed_seats_total", "Seats answered with an error");
            metrics::describe_counter!("laned_failed_turns_total", "Turns that failed as a whole");
            metrics::describe_counter!(
                "laned_deadline_misses_total",
                "Seats answered later than the LatencyBudget policy's budget (not DeadlineExceeded calls)"
            );
            metrics::describe_counter!("laned_evictions_total", "Streams evicted for being idle");
            metrics::describe_counter!("laned_cancelled_total", "Calls answered Cancelled, withdrawn unserved");
            metrics::describe_counter!(
                "laned_deadline_exceeded_total",
                "Calls answered DeadlineExceeded: their deadline passed before they were seated"
            );
            metrics::describe_counter!(
                "laned_lost_streams_total",
                "Streams that lost their state in a failed turn or a rebuilt state"
            );
            metrics::describe_counter!(
                "laned_rebuilt_states_total",
                "States rebuilt after a failed turn that could not be cleaned"
            );
            metrics::describe_histogram!(
                "laned_policy_wait_seconds",
                Unit::Seconds,
                "Waits the turn policy chose before turns"
            );
            metrics::describe_counter!(
                "laned_policy_changes_total",
                "Changes of the turn policy or max_seats while serving"
            );
        });
    }

    fn runnable(name: Option<&str>) -> Vec<Label> {
        name.map(|name| Label::new("runnable", name.to_string()))
            .into_iter()
            .collect()
    }

    /// One shard's handles.
    pub(crate) struct Meters {
        turns: Counter,
        seats: Counter,
        seats_per_turn: Histogram,
        queue_wait: Histogram,
        turn: Histogram,
        lanes_taken: Gauge,
        lanes_max: usize,
        lanes_free: Gauge,
        seats_queued: Gauge,
        learned_width: Gauge,
        admissions: Counter,
        admissions_waited: Counter,
        admission_wait: Histogram,
        failed_seats: Counter,
        failed_turns: Counter,
        deadline_misses: Counter,
        policy_wait: Histogram,
        evictions: Counter,
        lost_streams: Counter,
        rebuilt_states: Counter,
    }

    impl Meters {
        pub fn new(name: Option<&str>, shard: usize, lanes_max: usize) -> Meters {
            describe();
            let labels = runnable(name);
            let mut per_shard = labels.clone();
            per_shard.push(Label::new("shard", shard.to_string()));
            let meters = Meters {
                turns: metrics::counter!("tract_autobatch_turns_total", labels.clone()),
                seats: metrics::counter!("tract_autobatch_seats_total", labels.clone()),
                seats_per_turn: metrics::histogram!("tract_autobatch_seats_per_turn", labels.clone()),
                queue_wait: metrics::histogram!("tract_autobatch_queue_wait_seconds", labels.clone()),
                turn: metrics::histogram!("tract_autobatch_turn_seconds", labels.clone()),
                lanes_taken: metrics::gauge!("tract_autobatch_lanes_taken", per_shard.clone()),
                lanes_max,
                lanes_free: metrics::gauge!("laned_lanes_free", per_shard.clone()),
                seats_queued: metrics::gauge!("laned_seats_queued", per_shard.clone()),
                learned_width: metrics::gauge!("laned_learned_width", per_shard.clone()),
                admissions: metrics::counter!("laned_admissions_total", labels.clone()),
                admissions_waited: metrics::counter!("laned_admissions_waited_total", labels.clone()),
                admission_wait: metrics::histogram!("laned_admission_wait_seconds", labels.clone()),
                failed_seats: metrics::counter!("laned_failed_seats_total", labels.clone()),
                failed_turns: metrics::counter!("laned_failed_turns_total", labels.clone()),
                deadline_misses: metrics::counter!("laned_deadline_misses_total", labels.clone()),
                policy_wait: metrics::histogram!("laned_policy_wait_seconds", labels.clone()),
                evictions: metrics::counter!("laned_evictions_total", labels.clone()),
                lost_streams: metrics::counter!("laned_lost_streams_total", labels.clone()),
                rebuilt_states: metrics::counter!("laned_rebuilt_states_total", labels.clone()),
            };
            metrics::gauge!("laned_lanes_max", per_shard).set(lanes_max as f64);
            meters.lanes(0);
            meters.seats_queued(0);
            meters
        }

        pub fn turn(&self, occupancy: usize, took: Duration) {
            self.turns.increment(1);
            self.seats.increment(occupancy as u64);
            self.seats_per_turn.record(occupancy as f64);
            self.turn.record(took);
        }

        pub fn queue_wait(&self, wait: Duration) {
            self.queue_wait.record(wait);
        }

        pub fn lanes(&self, taken: usize) {
            self.lanes_taken.set(taken as f64);
            self.lanes_free.set(self.lanes_max.saturating_sub(taken) as f64);
        }

        pub fn seats_queued(&self, seats: usize) {
            self.seats_queued.set(seats as f64);
        }

        pub fn learned_width(&self, width: usize) {
            self.learned_width.set(width as f64);
        }

        pub fn admission(&self, waited: Option<Duration>) {
            self.admissions.increment(1);
            if let Some(wait) = waited {
                self.admissions_waited.increment(1);
                self.admission_wait.record(wait);
            }
        }

        pub fn failed_seats(&self, seats: usize) {
            self.failed_seats.increment(seats as u64);
        }

        pub fn failed_turn(&self) {
            self.failed_turns.increment(1);
        }

        pub fn deadline_misses(&self, seats: usize) {
            self.deadline_misses.increment(seats as u64);
        }

        pub fn policy_wait(&self, wait: Duration) {
            self.policy_wait.record(wait);
        }

        pub fn eviction(&self) {
            self.evictions.increment(1);
        }

        pub fn lost_streams(&self, streams: usize) {
            self.lost_streams.increment(streams as u64);
        }

        pub fn rebuilt_state(&self) {
            self.rebuilt_states.increment(1);
        }
    }

    /// The runner-wide handles: the admission queue's gauge, refusals,
    /// policy changes.
    pub(crate) struct AdmissionMeters {
        waiting: Gauge,
        refused: Counter,
        policy_changes: Counter,
        cancelled: Counter,
        deadline_exceeded: Counter,
    }

    impl AdmissionMeters {
        pub fn new(name: Option<&str>) -> AdmissionMeters {
            describe();
            let meters = AdmissionMeters {
                waiting: metrics::gauge!("laned_spawners_waiting", runnable(name)),
                refused: metrics::counter!("laned_admissions_refused_total", runnable(name)),
                policy_changes: metrics::counter!("laned_policy_changes_total", runnable(name)),
                cancelled: metrics::counter!("laned_cancelled_total", runnable(name)),
                deadline_exceeded: metrics::counter!("laned_deadline_exceeded_total", runnable(name)),
            };
            meters.waiting(0);
            meters
        }

        pub fn waiting(&self, spawners: usize) {
            self.waiting.set(spawners as f64);
        }

        pub fn refused(&self) {
            self.refused.increment(1);
        }

        pub fn policy_change(&self) {
            self.policy_changes.increment(1);
        }

        pub fn cancelled(&self) {
            self.cancelled.increment(1);
        }

        pub fn deadline_exceeded(&self) {
            self.deadline_exceeded.increment(1);
        }
    }
}

#[cfg(not(feature = "metrics-facade"))]
mod on {
    use std::time::Duration;

    /// Nothing: the feature is off.
    pub(crate) struct Meters;

    impl Meters {
        pub fn new(_name: Option<&str>, _shard: usize, _lanes_max: usize) -> Meters {
            Meters
        }
        pub fn turn(&self, _occupancy: usize, _took: Duration) {}
        pub fn queue_wait(&self, _wait: Duration) {}
        pub fn lanes(&self, _taken: usize) {}
        pub fn seats_queued(&self, _seats: usize) {}
        pub fn learned_width(&self, _width: usize) {}
        pub fn admission(&self, _waited: Option<Duration>) {}
        pub fn failed_seats(&self, _seats: usize) {}
        pub fn failed_turn(&self) {}
        pub fn deadline_misses(&self, _seats: usize) {}
        pub fn policy_wait(&self, _wait: Duration) {}
        pub fn eviction(&self) {}
        pub fn lost_streams(&self, _streams: usize) {}
        pub fn rebuilt_state(&self) {}
    }

    /// Nothing: the feature is off.
    pub(crate) struct AdmissionMeters;

    impl AdmissionMeters {
        pub fn new(_name: Option<&str>) -> AdmissionMeters {
            AdmissionMeters
        }
        pub fn waiting(&self, _spawners: usize) {}
        pub fn refused(&self) {}
        pub fn policy_change(&self) {}
        pub fn cancelled(&self) {}
        pub fn deadline_exceeded(&self) {}
    }
}

pub(crate) use on::{AdmissionMeters, Meters};

#[cfg(all(test, feature = "metrics-facade", not(loom)))]
mod tests {
    //! The facade's recording, under allocation-counter's allocator,
    //! which the crate's unit tests link (see `stack.rs`).

    use std::time::Duration;

    use crate::stack::tests::allocations_of;
    use metrics_util::debugging::DebuggingRecorder;

    use super::*;

    /// Recording a turn, its waits, lanes and queue allocates nothing of
    /// ours: nothing at all with no recorder installed (the handles are
    /// no-ops), and nothing for the counters and gauges of a host's
    /// recorder; only that recorder's own histogram storage grows, a block
    /// at a time.
    #[test]
    fn recording_allocates_nothing_of_ours() {
        let meters = Meters::new(Some("m"), 0, 8);
        let bare = allocations_of(|| {
            for k in 0..1000 {
                meters.turn(k % 8, Duration::from_micros(k as u64));
                meters.queue_wait(Duration::from_micros(3));
                meters.lanes(k % 8);
                meters.seats_queued(k % 5);
            }
        });
        assert_eq!(bare, 0, "no recorder: {bare} allocations");
        let recorder = DebuggingRecorder::new();
        let meters = metrics::with_local_recorder(&recorder, || Meters::new(Some("m"), 0, 8));
        let gauges = allocations_of(|| {
            for k in 0..1000 {
                meters.lanes(k % 8);
                meters.seats_queued(k % 5);
            }
        });
        assert_eq!(gauges, 0, "gauges: {gauges} allocations");
        let turns = allocations_of(|| {
            for k in 0..1000 {
                meters.turn(k % 8, Duration::from_micros(k as u64));
            }
        });
        // Two histogram samples per turn, 2000 in all: the recorder's
        // buckets grow by blocks, far fewer than one per sample.
        assert!(turns < 200, "turns: {turns} allocations for 1000 turns");
        let counted = allocations_of(|| drop(recorder.snapshotter().snapshot()));
        assert!(counted > 0, "the counting allocator counts");
    }
}
