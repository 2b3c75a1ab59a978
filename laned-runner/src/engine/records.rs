//! A shard's records: each event is one call here, which books it in the
//! shard's `laned_metrics::Metrics` (what `LanedRunner::metrics` and the
//! capacity gauges read) and in the `metrics` facade's handles (feature
//! `metrics-facade`; nothing otherwise), so the two never disagree and no
//! caller can book one and forget the other.
//!
//! Touched by the engine's holder only (the engine owns it); recording is
//! an atomic operation per counter, no allocation, no lock.

use std::sync::Arc;
use std::time::Duration;

use laned_metrics::Metrics;

use crate::facade::Meters;

/// The shard's counters and facade handles, booked together.
pub(crate) struct Records {
    metrics: Arc<Metrics>,
    meters: Meters,
}

impl Records {
    /// Records for a shard of `lanes_max` streams at most.
    pub fn new(metrics: Arc<Metrics>, meters: Meters, lanes_max: usize) -> Records {
        metrics.set_lanes_max(lanes_max);
        Records { metrics, meters }
    }

    /// A turn of `occupancy` seats that took `took`.
    pub fn turn(&self, occupancy: usize, took: Duration) {
        self.metrics.record_turn(occupancy, took);
        self.meters.turn(occupancy, took);
    }

    /// A seat's wait from queued to the start of its turn.
    pub fn queue_wait(&self, wait: Duration) {
        self.metrics.record_queue_wait(wait);
        self.meters.queue_wait(wait);
    }

    /// The lanes now taken by streams.
    pub fn lanes_taken(&self, taken: usize) {
        self.metrics.set_lanes_taken(taken);
        self.meters.lanes(taken);
    }

    /// The seats now queued.
    pub fn seats_queued(&self, seats: usize) {
        self.metrics.set_seats_queued(seats);
        self.meters.seats_queued(seats);
    }

    /// A turn that failed, with its `occupancy` seats.
    pub fn failed_turn(&self, occupancy: usize) {
        self.metrics.record_failed_turn();
        self.metrics.record_failed_seats(occupancy);
        self.meters.failed_turn();
        self.meters.failed_seats(occupancy);
    }

    /// Seats refused without a turn (their stream's lane was lost).
    pub fn failed_seats(&self, seats: usize) {
        self.metrics.record_failed_seats(seats);
        self.meters.failed_seats(seats);
    }

    /// Seats a turn ran past the latency budget.
    pub fn deadline_misses(&self, seats: usize) {
        self.metrics.record_deadline_misses(seats);
        self.meters.deadline_misses(seats);
    }

    /// The width the turns are capped at (`None`: none).
    pub fn learned_width(&self, width: Option<usize>) {
        self.metrics.set_learned_width(width.unwrap_or(0));
        self.meters.learned_width(width.unwrap_or(0));
    }

    /// A stream evicted for being idle.
    pub fn eviction(&self) {
        self.metrics.record_eviction();
        self.meters.eviction();
    }

    /// `streams` streams lost their state.
    pub fn lost_streams(&self, streams: usize) {
        if streams > 0 {
            self.metrics.record_lost_streams(streams);
            self.meters.lost_streams(streams);
        }
    }

    /// The state was rebuilt.
    pub fn rebuilt_state(&self) {
        self.metrics.record_rebuilt_state();
        self.meters.rebuilt_state();
    }

    /// A wait the turn policy imposed.
    pub fn policy_wait(&self, wait: Duration) {
        self.metrics.record_policy_wait(wait);
        self.meters.policy_wait(wait);
    }

    /// A stream admitted, after waiting `waited` for its lane (`None`: at
    /// once).
    pub fn admission(&self, waited: Option<Duration>) {
        match waited {
            Some(wait) => self.metrics.record_admission_waited(wait),
            None => self.metrics.record_admission(),
        }
        self.meters.admission(waited);
    }
}
