//! What an operator reads to tune a laned runtime: turns, seats, occupancy,
//! queue wait, turn time, lanes taken, admissions and failures.
//!
//! Recording is lock-free and allocation-free (relaxed atomics), so the
//! worker calls it from its hot path. Reading is a [`Snapshot`]: plain,
//! serde-serialisable data that subtracts ([`Snapshot::delta`]) and renders
//! the Prometheus text format with tract's metric names
//! ([`Snapshot::to_prometheus`]), so dashboards built for tract carry over.
//!
//! ```
//! use std::time::Duration;
//! use laned_metrics::Metrics;
//!
//! let metrics = Metrics::new(8);
//! metrics.record_turn(3, Duration::from_micros(120));
//! metrics.record_queue_wait(Duration::from_micros(40));
//! let snap = metrics.snapshot();
//! assert_eq!((snap.turns, snap.seats), (1, 3));
//! assert_eq!(snap.mean_occupancy(), 3.0);
//! assert!(snap.to_prometheus(&[("runnable", "tdnn")]).contains("tract_autobatch_turns_total{runnable=\"tdnn\"} 1"));
//! ```

#![warn(missing_docs)]

mod histogram;
mod prometheus;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use histogram::AtomicHistogram;
pub use histogram::HistogramSnapshot;
use serde::{Deserialize, Serialize};

/// The counters of one laned state (or one runner). Every field is written by
/// any thread through `&self` with relaxed atomics: each is an independent
/// tally, no reader infers one field from another's value.
pub struct Metrics {
    turns: AtomicU64,
    seats: AtomicU64,
    /// Turns by exact occupancy; the last bucket also takes any wider turn.
    occupancy: Box<[AtomicU64]>,
    queue_wait: AtomicHistogram,
    turn_time: AtomicHistogram,
    lanes_taken: AtomicU64,
    lanes_max: AtomicU64,
    seats_queued: AtomicU64,
    learned_width: AtomicU64,
    spawners_waiting: AtomicU64,
    admissions: AtomicU64,
    admissions_waited: AtomicU64,
    admission_wait: AtomicHistogram,
    admissions_refused: AtomicU64,
    failed_seats: AtomicU64,
    failed_turns: AtomicU64,
    policy_waits: AtomicHistogram,
    deadline_misses: AtomicU64,
    policy_changes: AtomicU64,
    evictions: AtomicU64,
    cancelled: AtomicU64,
    deadline_exceeded: AtomicU64,
    lost_streams: AtomicU64,
    rebuilt_states: AtomicU64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("turns", &self.turns.load(Ordering::Relaxed))
            .field("seats", &self.seats.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Counters for a state whose turns seat at most `max_occupancy` streams.
    pub fn new(max_occupancy: usize) -> Metrics {
        Metrics {
            turns: AtomicU64::new(0),
            seats: AtomicU64::new(0),
            occupancy: (0..=max_occupancy.max(1)).map(|_| AtomicU64::new(0)).collect(),
            queue_wait: AtomicHistogram::new(),
            turn_time: AtomicHistogram::new(),
            lanes_taken: AtomicU64::new(0),
            lanes_max: AtomicU64::new(0),
            seats_queued: AtomicU64::new(0),
            learned_width: AtomicU64::new(0),
            spawners_waiting: AtomicU64::new(0),
            admissions: AtomicU64::new(0),
            admissions_waited: AtomicU64::new(0),
            admission_wait: AtomicHistogram::new(),
            admissions_refused: AtomicU64::new(0),
            failed_seats: AtomicU64::new(0),
            failed_turns: AtomicU64::new(0),
            policy_waits: AtomicHistogram::new(),
            deadline_misses: AtomicU64::new(0),
            policy_changes: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            deadline_exceeded: AtomicU64::new(0),
            lost_streams: AtomicU64::new(0),
            rebuilt_states: AtomicU64::new(0),
        }
    }

    /// One turn of `occupancy` seats took `duration`, stacking and slicing
    /// included.
    pub fn record_turn(&self, occupancy: usize, duration: Duration) {
        self.turns.fetch_add(1, Ordering::Relaxed);
        self.seats.fetch_add(occupancy as u64, Ordering::Relaxed);
        let bucket = occupancy.min(self.occupancy.len() - 1);
        self.occupancy[bucket].fetch_add(1, Ordering::Relaxed);
        self.turn_time.record(duration);
    }

    /// A seat waited `wait` from being queued to its turn's start.
    pub fn record_queue_wait(&self, wait: Duration) {
        self.queue_wait.record(wait);
    }

    /// Streams now holding a lane.
    pub fn set_lanes_taken(&self, lanes: usize) {
        self.lanes_taken.store(lanes as u64, Ordering::Relaxed);
    }

    /// Streams holding a lane now (the gauge's last value).
    pub fn lanes_taken(&self) -> u64 {
        self.lanes_taken.load(Ordering::Relaxed)
    }

    /// Lanes this state (or runner) has: a gauge, set once by its owner.
    pub fn set_lanes_max(&self, lanes: usize) {
        self.lanes_max.store(lanes as u64, Ordering::Relaxed);
    }

    /// Seats queued for a turn now (a gauge).
    pub fn set_seats_queued(&self, seats: usize) {
        self.seats_queued.store(seats as u64, Ordering::Relaxed);
    }

    /// Seats queued for a turn (the gauge's last value).
    pub fn seats_queued(&self) -> u64 {
        self.seats_queued.load(Ordering::Relaxed)
    }

    /// The turn width learned to cost least per row, where it caps turns; 0
    /// where none does (a gauge).
    pub fn set_learned_width(&self, width: usize) {
        self.learned_width.store(width as u64, Ordering::Relaxed);
    }

    /// The learned width's gauge, its last value.
    pub fn learned_width(&self) -> u64 {
        self.learned_width.load(Ordering::Relaxed)
    }

    /// Spawners waiting for a lane now (a gauge).
    pub fn set_spawners_waiting(&self, spawners: usize) {
        self.spawners_waiting.store(spawners as u64, Ordering::Relaxed);
    }

    /// A stream got a lane at once.
    pub fn record_admission(&self) {
        self.admissions.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream got a lane after waiting `wait` for one.
    pub fn record_admission_waited(&self, wait: Duration) {
        self.admissions.fetch_add(1, Ordering::Relaxed);
        self.admissions_waited.fetch_add(1, Ordering::Relaxed);
        self.admission_wait.record(wait);
    }

    /// A stream was refused a lane.
    pub fn record_admission_refused(&self) {
        self.admissions_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// `seats` seats were answered with an error.
    pub fn record_failed_seats(&self, seats: usize) {
        self.failed_seats.fetch_add(seats as u64, Ordering::Relaxed);
    }

    /// A turn failed as a whole (its state errored or panicked).
    pub fn record_failed_turn(&self) {
        self.failed_turns.fetch_add(1, Ordering::Relaxed);
    }

    /// The turn policy chose to wait `wait` before a turn.
    pub fn record_policy_wait(&self, wait: Duration) {
        self.policy_waits.record(wait);
    }

    /// `seats` seats were answered later than their latency budget.
    pub fn record_deadline_misses(&self, seats: usize) {
        self.deadline_misses.fetch_add(seats as u64, Ordering::Relaxed);
    }

    /// The turn policy or `max_seats` was changed while serving.
    pub fn record_policy_change(&self) {
        self.policy_changes.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream evicted for being idle.
    pub fn record_eviction(&self) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }

    /// A call answered `Cancelled` (withdrawn unserved).
    pub fn record_cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// A call answered `DeadlineExceeded` (its deadline passed before any
    /// of its seats was seated).
    pub fn record_deadline_exceeded(&self) {
        self.deadline_exceeded.fetch_add(1, Ordering::Relaxed);
    }

    /// `streams` streams lost their state (a failed turn that had touched
    /// it, or a rebuilt state).
    pub fn record_lost_streams(&self, streams: usize) {
        self.lost_streams.fetch_add(streams as u64, Ordering::Relaxed);
    }

    /// The state was rebuilt after a turn failed and it could not be
    /// cleaned.
    pub fn record_rebuilt_state(&self) {
        self.rebuilt_states.fetch_add(1, Ordering::Relaxed);
    }

    /// Everything recorded so far, as plain data.
    pub fn snapshot(&self) -> Snapshot {
        let occupancy: Vec<u64> = self.occupancy.iter().map(|n| n.load(Ordering::Relaxed)).collect();
        Snapshot {
            turns: self.turns.load(Ordering::Relaxed),
            seats: self.seats.load(Ordering::Relaxed),
            occupancy,
            queue_wait: self.queue_wait.snapshot(),
            turn_time: self.turn_time.snapshot(),
            lanes_taken: self.lanes_taken.load(Ordering::Relaxed),
            lanes_max: self.lanes_max.load(Ordering::Relaxed),
            seats_queued: self.seats_queued.load(Ordering::Relaxed),
            learned_width: self.learned_width.load(Ordering::Relaxed),
            spawners_waiting: self.spawners_waiting.load(Ordering::Relaxed),
            admissions: self.admissions.load(Ordering::Relaxed),
            admissions_waited: self.admissions_waited.load(Ordering::Relaxed),
            admission_wait: self.admission_wait.snapshot(),
            admissions_refused: self.admissions_refused.load(Ordering::Relaxed),
            failed_seats: self.failed_seats.load(Ordering::Relaxed),
            failed_turns: self.failed_turns.load(Ordering::Relaxed),
            policy_waits: self.policy_waits.snapshot(),
            deadline_misses: self.deadline_misses.load(Ordering::Relaxed),
            policy_changes: self.policy_changes.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            cancelled: self.cancelled.load(Ordering::Relaxed),
            deadline_exceeded: self.deadline_exceeded.load(Ordering::Relaxed),
            lost_streams: self.lost_streams.load(Ordering::Relaxed),
            rebuilt_states: self.rebuilt_states.load(Ordering::Relaxed),
        }
    }
}

/// The metrics as read at one instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Turns run.
    pub turns: u64,
    /// Seats filled over those turns.
    pub seats: u64,
    /// Turns by exact occupancy: `occupancy[k]` turns seated `k` streams.
    pub occupancy: Vec<u64>,
    /// From a seat queued to the start of its turn, linger included.
    pub queue_wait: HistogramSnapshot,
    /// One turn, stacking and slicing included.
    pub turn_time: HistogramSnapshot,
    /// Streams holding a lane at the instant of the snapshot (a gauge).
    pub lanes_taken: u64,
    /// Lanes there are (a gauge): `lanes_max - lanes_taken` are free.
    #[serde(default)]
    pub lanes_max: u64,
    /// Seats queued for a turn at the instant of the snapshot (a gauge).
    #[serde(default)]
    pub seats_queued: u64,
    /// The turn width learned to cost least per row, where it caps turns;
    /// 0 where none does (a gauge; a runner's snapshot holds its shards'
    /// widest).
    #[serde(default)]
    pub learned_width: u64,
    /// Spawners waiting for a lane at the instant of the snapshot (a
    /// gauge; runner-wide, so in the runner's snapshot, not a shard's).
    #[serde(default)]
    pub spawners_waiting: u64,
    /// Streams admitted, at once or after waiting.
    pub admissions: u64,
    /// Streams admitted after waiting for a lane.
    pub admissions_waited: u64,
    /// How long admitted streams waited.
    pub admission_wait: HistogramSnapshot,
    /// Streams refused a lane.
    pub admissions_refused: u64,
    /// Seats answered with an error.
    pub failed_seats: u64,
    /// Turns that failed as a whole.
    pub failed_turns: u64,
    /// The waits the turn policy chose before turns.
    #[serde(default)]
    pub policy_waits: HistogramSnapshot,
    /// Seats answered later than the latency budget of the `LatencyBudget`
    /// policy (not calls answered `DeadlineExceeded`: `deadline_exceeded`).
    #[serde(default)]
    pub deadline_misses: u64,
    /// Changes of the turn policy or `max_seats` while serving.
    #[serde(default)]
    pub policy_changes: u64,
    /// Streams evicted for being idle.
    #[serde(default)]
    pub evictions: u64,
    /// Calls answered `Cancelled`: withdrawn unserved (a dropped call, a
    /// cancel token). Runner-wide, in the runner's snapshot.
    #[serde(default)]
    pub cancelled: u64,
    /// Calls answered `DeadlineExceeded`: their deadline passed before any
    /// of their seats was seated. Runner-wide, in the runner's snapshot.
    #[serde(default)]
    pub deadline_exceeded: u64,
    /// Streams that lost their state: a failed turn had touched it, or the
    /// state was rebuilt (each such stream is told `Lost` at its next call).
    #[serde(default)]
    pub lost_streams: u64,
    /// States rebuilt after a failed turn that could not be cleaned.
    #[serde(default)]
    pub rebuilt_states: u64,
}

impl Snapshot {
    /// Seats per turn: the dial turn policy is tuned against.
    pub fn mean_occupancy(&self) -> f64 {
        if self.turns == 0 {
            0.0
        } else {
            self.seats as f64 / self.turns as f64
        }
    }

    /// Lanes free at the instant of the snapshot.
    pub fn lanes_free(&self) -> u64 {
        self.lanes_max.saturating_sub(self.lanes_taken)
    }

    /// What happened after `earlier`, a snapshot of the same metrics. Gauges
    /// (`lanes_taken`, `lanes_max`, `seats_queued`, `learned_width`,
    /// `spawners_waiting`) keep
    /// this snapshot's value.
    pub fn delta(&self, earlier: &Snapshot) -> Snapshot {
        let occupancy = self
            .occupancy
            .iter()
            .enumerate()
            .map(|(k, n)| n.saturating_sub(earlier.occupancy.get(k).copied().unwrap_or(0)))
            .collect();
        Snapshot {
            turns: self.turns.saturating_sub(earlier.turns),
            seats: self.seats.saturating_sub(earlier.seats),
            occupancy,
            queue_wait: self.queue_wait.delta(&earlier.queue_wait),
            turn_time: self.turn_time.delta(&earlier.turn_time),
            lanes_taken: self.lanes_taken,
            lanes_max: self.lanes_max,
            seats_queued: self.seats_queued,
            learned_width: self.learned_width,
            spawners_waiting: self.spawners_waiting,
            admissions: self.admissions.saturating_sub(earlier.admissions),
            admissions_waited: self.admissions_waited.saturating_sub(earlier.admissions_waited),
            admission_wait: self.admission_wait.delta(&earlier.admission_wait),
            admissions_refused: self.admissions_refused.saturating_sub(earlier.admissions_refused),
            failed_seats: self.failed_seats.saturating_sub(earlier.failed_seats),
            failed_turns: self.failed_turns.saturating_sub(earlier.failed_turns),
            policy_waits: self.policy_waits.delta(&earlier.policy_waits),
            deadline_misses: self.deadline_misses.saturating_sub(earlier.deadline_misses),
            policy_changes: self.policy_changes.saturating_sub(earlier.policy_changes),
            evictions: self.evictions.saturating_sub(earlier.evictions),
            cancelled: self.cancelled.saturating_sub(earlier.cancelled),
            deadline_exceeded: self.deadline_exceeded.saturating_sub(earlier.deadline_exceeded),
            lost_streams: self.lost_streams.saturating_sub(earlier.lost_streams),
            rebuilt_states: self.rebuilt_states.saturating_sub(earlier.rebuilt_states),
        }
    }

    /// Both snapshots together: how a runner of several states totals them.
    pub fn merge(&self, other: &Snapshot) -> Snapshot {
        let len = self.occupancy.len().max(other.occupancy.len());
        let occupancy = (0..len)
            .map(|k| self.occupancy.get(k).copied().unwrap_or(0) + other.occupancy.get(k).copied().unwrap_or(0))
            .collect();
        Snapshot {
            turns: self.turns + other.turns,
            seats: self.seats + other.seats,
            occupancy,
            queue_wait: self.queue_wait.merge(&other.queue_wait),
            turn_time: self.turn_time.merge(&other.turn_time),
            lanes_taken: self.lanes_taken + other.lanes_taken,
            lanes_max: self.lanes_max + other.lanes_max,
            seats_queued: self.seats_queued + other.seats_queued,
            learned_width: self.learned_width.max(other.learned_width),
            spawners_waiting: self.spawners_waiting + other.spawners_waiting,
            admissions: self.admissions + other.admissions,
            admissions_waited: self.admissions_waited + other.admissions_waited,
            admission_wait: self.admission_wait.merge(&other.admission_wait),
            admissions_refused: self.admissions_refused + other.admissions_refused,
            failed_seats: self.failed_seats + other.failed_seats,
            failed_turns: self.failed_turns + other.failed_turns,
            policy_waits: self.policy_waits.merge(&other.policy_waits),
            deadline_misses: self.deadline_misses + other.deadline_misses,
            policy_changes: self.policy_changes + other.policy_changes,
            evictions: self.evictions + other.evictions,
            cancelled: self.cancelled + other.cancelled,
            deadline_exceeded: self.deadline_exceeded + other.deadline_exceeded,
            lost_streams: self.lost_streams + other.lost_streams,
            rebuilt_states: self.rebuilt_states + other.rebuilt_states,
        }
    }

    /// The Prometheus text exposition of this snapshot, each sample carrying
    /// `labels`. See [`prometheus`](crate::Snapshot::to_prometheus) for names.
    pub fn to_prometheus(&self, labels: &[(&str, &str)]) -> String {
        prometheus::render(self, labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy() -> Metrics {
        let m = Metrics::new(4);
        m.record_turn(2, Duration::from_micros(100));
        m.record_turn(4, Duration::from_micros(300));
        m.record_turn(9, Duration::from_micros(200));
        for us in [10, 20, 30] {
            m.record_queue_wait(Duration::from_micros(us));
        }
        m.set_lanes_taken(3);
        m.record_admission();
        m.record_admission_waited(Duration::from_millis(2));
        m.record_admission_refused();
        m.record_failed_seats(2);
        m.record_failed_turn();
        m
    }

    #[test]
    fn counts_turns_seats_and_occupancy() {
        let s = busy().snapshot();
        assert_eq!(s.turns, 3);
        assert_eq!(s.seats, 15);
        assert_eq!(s.mean_occupancy(), 5.0);
        // A turn wider than the histogram lands in its last bucket.
        assert_eq!(s.occupancy, vec![0, 0, 1, 0, 2]);
        assert_eq!(s.turn_time.count, 3);
        assert_eq!(s.turn_time.max(), Duration::from_micros(300));
        assert_eq!(s.queue_wait.count, 3);
        assert_eq!((s.admissions, s.admissions_waited, s.admissions_refused), (2, 1, 1));
        assert_eq!((s.failed_seats, s.failed_turns, s.lanes_taken), (2, 1, 3));
    }

    #[test]
    fn a_snapshot_round_trips_through_json() {
        let s = busy().snapshot();
        let json = serde_json::to_string(&s).unwrap();
        let back: Snapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn a_delta_holds_what_happened_between_two_snapshots() {
        let m = busy();
        let before = m.snapshot();
        m.record_turn(1, Duration::from_micros(50));
        m.record_failed_seats(1);
        let d = m.snapshot().delta(&before);
        assert_eq!((d.turns, d.seats, d.failed_seats, d.failed_turns), (1, 1, 1, 0));
        assert_eq!(d.occupancy, vec![0, 1, 0, 0, 0]);
        assert_eq!(d.turn_time.count, 1);
        assert_eq!(d.lanes_taken, 3, "a gauge keeps its latest value");
    }

    #[test]
    fn merging_sums_two_states() {
        let a = busy().snapshot();
        let total = a.merge(&a);
        assert_eq!(total.turns, 6);
        assert_eq!(total.occupancy, vec![0, 0, 2, 0, 4]);
        assert_eq!(total.turn_time.count, 6);
        assert_eq!(total.lanes_taken, 6);
    }

    /// Recording from many threads at once loses no count.
    #[test]
    fn concurrent_recording_loses_nothing() {
        let m = std::sync::Arc::new(Metrics::new(8));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for k in 0..1000 {
                        m.record_turn(k % 8 + 1, Duration::from_micros(k as u64));
                        m.record_queue_wait(Duration::from_nanos(k as u64));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = m.snapshot();
        assert_eq!(s.turns, 4000);
        assert_eq!(s.seats, 4 * (0..1000).map(|k| k % 8 + 1).sum::<usize>() as u64);
        assert_eq!(s.occupancy.iter().sum::<u64>(), 4000);
        assert_eq!(s.queue_wait.count, 4000);
    }
}

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
