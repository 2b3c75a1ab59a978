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
//! - ours: `laned_lanes_max`, `laned_lanes_free`, `laned_seats_queued`
//!   (gauges per shard) and `laned_spawners_waiting` (runner-wide gauge).
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
            metrics::describe_gauge!("laned_spawners_waiting", "Spawners waiting for a lane of the runner");
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
                turn: metrics::histogram!("tract_autobatch_turn_seconds", labels),
                lanes_taken: metrics::gauge!("tract_autobatch_lanes_taken", per_shard.clone()),
                lanes_max,
                lanes_free: metrics::gauge!("laned_lanes_free", per_shard.clone()),
                seats_queued: metrics::gauge!("laned_seats_queued", per_shard.clone()),
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
    }

    /// The runner's admission queue's gauge.
    pub(crate) struct AdmissionMeters {
        waiting: Gauge,
    }

    impl AdmissionMeters {
        pub fn new(name: Option<&str>) -> AdmissionMeters {
            describe();
            let meters = AdmissionMeters {
                waiting: metrics::gauge!("laned_spawners_waiting", runnable(name)),
            };
            meters.waiting(0);
            meters
        }

        pub fn waiting(&self, spawners: usize) {
            self.waiting.set(spawners as f64);
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
    }

    /// Nothing: the feature is off.
    pub(crate) struct AdmissionMeters;

    impl AdmissionMeters {
        pub fn new(_name: Option<&str>) -> AdmissionMeters {
            AdmissionMeters
        }
        pub fn waiting(&self, _spawners: usize) {}
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
