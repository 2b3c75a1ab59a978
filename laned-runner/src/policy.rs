//! The turn policy: when to run the next turn, decided from plain data (the
//! queue's state, a model of turn time by occupancy, the time now), so that
//! it is testable with a synthetic clock and no thread.

use crate::sync::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

pub use crate::policy_syntax::{ParsePolicyError, PolicyError};

/// `LatencyBudget` plans turns to end within `1 / HEADROOM` of the budget.
pub const HEADROOM: u32 = 2;

/// `LatencyBudget` waits only while serving the arrivals at the width
/// queued now would keep the state busier than this fraction of the time:
/// below it a turn runs at once, as `Immediate`, since the state has time to
/// spare and a wider turn would only add latency.
pub const BUSY: f64 = 0.5;

/// When a turn starts once a seat is queued.
///
/// Written as text one way everywhere (`FromStr`, `Display`, serde):
/// `immediate`, `linger:<us>`, `budget:<us>`, `tick:<us>` (see
/// [`ParsePolicyError`] for what is refused). serde also reads the older
/// table form (`{ kind = "latency_budget", us = 20000 }`).
///
/// ```
/// use laned_runner::TurnPolicy;
/// let policy: TurnPolicy = "budget:20000".parse().unwrap();
/// assert_eq!(policy, TurnPolicy::LatencyBudget { us: 20000 });
/// assert_eq!(policy.to_string(), "budget:20000");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
#[non_exhaustive]
pub enum TurnPolicy {
    /// At once, with whatever is queued.
    Immediate,
    /// Wait up to `us` microseconds after the oldest queued seat arrived, and
    /// start early once every held lane has a seat queued (nothing more can
    /// come) or the turn is full. tract's knob, with the early close.
    Linger {
        /// The longest wait, in microseconds.
        us: u64,
    },
    /// Every seat answered within `us` microseconds of its arrival. While the
    /// state has time to spare (serving the recent arrival rate at the width
    /// queued now would keep it busy less than half the time) a turn runs at
    /// once, as `Immediate`: waiting would only add latency. Once it would be
    /// busier, start at the latest instant that still meets the oldest
    /// seat's deadline, given the learned turn time and keeping half the
    /// budget as headroom for scheduling; at once when nothing more can come
    /// or the turn is full, and at once when the budget is below the turn
    /// time.
    LatencyBudget {
        /// The budget, in microseconds.
        us: u64,
    },
    /// Turns at fixed instants, every `period_us` microseconds since the
    /// runner started, for streams that all send at the same cadence.
    Tick {
        /// The period, in microseconds.
        period_us: u64,
    },
}

impl TurnPolicy {
    /// [`TurnPolicy::Linger`] of `d`.
    pub fn linger(d: Duration) -> TurnPolicy {
        TurnPolicy::Linger {
            us: u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// [`TurnPolicy::LatencyBudget`] of `d`.
    pub fn latency_budget(d: Duration) -> TurnPolicy {
        TurnPolicy::LatencyBudget {
            us: u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// [`TurnPolicy::Tick`] of `period`.
    pub fn tick(period: Duration) -> TurnPolicy {
        TurnPolicy::Tick {
            period_us: u64::try_from(period.as_micros().max(1)).unwrap_or(u64::MAX),
        }
    }
}

/// What the policy sees of the queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueState {
    /// When the oldest queued seat arrived.
    pub oldest: Instant,
    /// Seats queued.
    pub queued: usize,
    /// Lanes held by streams.
    pub held: usize,
    /// Held lanes with a seat queued.
    pub lanes_queued: usize,
    /// The widest turn.
    pub max_seats: usize,
    /// The runner's start: `Tick` counts its periods from it.
    pub epoch: Instant,
    /// Seats arriving per second lately (a running estimate; 0 when unknown):
    /// how wide a turn that waits will be.
    pub arrivals_per_sec: f64,
}

impl QueueState {
    /// Nothing more can join the next turn: every held lane has a seat
    /// queued, or the turn is full.
    pub fn full(&self) -> bool {
        self.lanes_queued >= self.held || self.queued >= self.max_seats
    }
}

/// A model of how long a turn of a given occupancy takes.
pub trait TurnTimes {
    /// `None` while nothing is known.
    fn estimate(&self, occupancy: usize) -> Option<Duration>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    RunNow,
    WaitUntil(Instant),
}

/// The longest wait a policy may plan (a linger, a latency budget, a tick
/// period), in microseconds: an hour.
pub(crate) const MAX_WAIT_US: u64 = 3_600_000_000;

impl TurnPolicy {
    /// Whether this policy can be served: every way a policy arrives (its
    /// text, serde, a [`RunnerConfig`](crate::RunnerConfig),
    /// [`LanedRunner::set_policy`](crate::LanedRunner::set_policy)) is
    /// checked here, and refused with this error. Refused: a wait past an
    /// hour (3,600,000,000 µs; a wait that long is a unit
    /// mistake), and a tick period of 0 (a turn every instant).
    pub fn check(&self) -> Result<(), PolicyError> {
        self.check_as(&self.to_string())
    }

    /// [`TurnPolicy::check`], the policy named as it was given (`input`).
    pub(crate) fn check_as(&self, input: &str) -> Result<(), PolicyError> {
        let us = match *self {
            TurnPolicy::Immediate => 0,
            TurnPolicy::Linger { us } | TurnPolicy::LatencyBudget { us } => us,
            TurnPolicy::Tick { period_us: 0 } => {
                return Err(PolicyError::new(
                    input,
                    "a tick period of 0 µs: turns are a microsecond apart at the closest",
                ))
            }
            TurnPolicy::Tick { period_us } => period_us,
        };
        if us > MAX_WAIT_US {
            return Err(PolicyError::new(
                input,
                format!("waits {us} µs, past the limit of {MAX_WAIT_US} µs (an hour)"),
            ));
        }
        Ok(())
    }
}

/// `t + d`, or a day after `t` where that would overflow the clock: a wait
/// that long is as good as forever, and is re-decided on every arrival.
fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .or_else(|| t.checked_add(Duration::from_secs(86_400)))
        .unwrap_or(t)
}

/// The decision for the queue in `q` at `now`.
pub fn decide(policy: &TurnPolicy, q: &QueueState, times: &dyn TurnTimes, now: Instant) -> Decision {
    let at = |t: Instant| {
        if now >= t {
            Decision::RunNow
        } else {
            Decision::WaitUntil(t)
        }
    };
    match *policy {
        TurnPolicy::Immediate => Decision::RunNow,
        TurnPolicy::Linger { us } => {
            if q.full() {
                Decision::RunNow
            } else {
                at(later(q.oldest, Duration::from_micros(us)))
            }
        }
        TurnPolicy::LatencyBudget { us } => {
            if q.full() {
                return Decision::RunNow;
            }
            // Waiting pays only when the state would otherwise be busy:
            // under light load (or a contended machine's, where every wait
            // is stretched by the scheduler) a wider turn saves CPU nobody
            // needs and spends latency everybody sees.
            let width = q.queued.max(1);
            match times.estimate(width) {
                Some(turn) if q.arrivals_per_sec * turn.as_secs_f64() / (width as f64) >= BUSY => (),
                _ => return Decision::RunNow,
            }
            // Half the budget is left to what the runner cannot see: the
            // timer's slack and the callers' own wake-ups, which grow with
            // the load and count in the latency a stream observes.
            let budget = Duration::from_micros(us) / HEADROOM;
            let Some(turn) = times.estimate(planned_width(q, budget, now)) else {
                return Decision::RunNow;
            };
            match budget.checked_sub(turn) {
                Some(slack) => at(later(q.oldest, slack)),
                None => Decision::RunNow,
            }
        }
        TurnPolicy::Tick { period_us } => {
            let period = Duration::from_micros(period_us.max(1));
            let since = q.oldest.saturating_duration_since(q.epoch);
            let ticks = since.as_nanos().div_ceil(period.as_nanos());
            let next = u32::try_from(ticks)
                .ok()
                .and_then(|ticks| period.checked_mul(ticks))
                .map_or_else(|| later(q.oldest, period), |d| later(q.epoch, d));
            at(next)
        }
    }
}

/// The width `LatencyBudget` plans the turn for: the seats queued plus
/// those expected at the recent arrival rate until the oldest seat's
/// planned end, at most the held lanes and `max_seats`. Planning for every
/// held lane instead would, under load, see a turn too long for the budget
/// and run at once, narrow, when waiting was still free.
fn planned_width(q: &QueueState, budget: Duration, now: Instant) -> usize {
    let widest = q.held.min(q.max_seats).max(1);
    let left = later(q.oldest, budget).saturating_duration_since(now).as_secs_f64();
    let expected = q.queued as f64 + (q.arrivals_per_sec.max(0.0) * left).ceil();
    (expected.min(widest as f64) as usize).max(1)
}

/// After how many more queued seats a decision to wait must be made again:
/// once the turn can be full (every held lane queued, or `max_seats`), and
/// for `LatencyBudget` once more seats came than the turn was planned for
/// (a wider turn takes longer, so it must start sooner). Arrivals change no
/// other decision.
pub fn recheck_after(policy: &TurnPolicy, q: &QueueState, now: Instant) -> usize {
    let fill = q
        .held
        .saturating_sub(q.lanes_queued)
        .min(q.max_seats.saturating_sub(q.queued));
    let planned = match *policy {
        TurnPolicy::LatencyBudget { us } => {
            planned_width(q, Duration::from_micros(us) / HEADROOM, now).saturating_sub(q.queued) + 1
        }
        _ => usize::MAX,
    };
    fill.min(planned).max(1)
}

/// Turn time by occupancy, learned online: per exact occupancy, the first
/// turn's time replaced by the second's (a first turn is often cold), the
/// plain mean of the next few, then an exponential moving average (weight
/// 1/8); interpolated linearly from the nearest known occupancy where one
/// was never seen. Lock-free: the engine records,
/// anyone reads.
#[derive(Debug)]
pub struct LearnedTurnTimes {
    /// Nanoseconds per occupancy; 0 while unknown.
    ewma_ns: Box<[AtomicU64]>,
    /// Turns recorded per occupancy (saturating), for the learned width.
    seen: Box<[AtomicU64]>,
}

impl LearnedTurnTimes {
    pub fn new(max_occupancy: usize) -> LearnedTurnTimes {
        LearnedTurnTimes {
            ewma_ns: (0..=max_occupancy.max(1)).map(|_| AtomicU64::new(0)).collect(),
            seen: (0..=max_occupancy.max(1)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub fn record(&self, occupancy: usize, took: Duration) {
        let Some(slot) = self.ewma_ns.get(occupancy) else {
            return;
        };
        let ns = took.as_nanos().max(1) as u64;
        let old = slot.load(Ordering::Relaxed);
        let seen = self.seen.get(occupancy).map_or(0, |s| s.load(Ordering::Relaxed));
        // The first turn of a width is often a cold one (buffers allocated,
        // caches empty): the second replaces it, the next few are averaged
        // plainly, and only then does the moving average take over, so no
        // single cold turn weighs on a width long.
        let new = match seen {
            0 | 1 => ns,
            n if n < 8 => (old * (n - 1) + ns) / n,
            _ => (old * 7 + ns) / 8,
        };
        slot.store(new.max(1), Ordering::Relaxed);
        if let Some(s) = self.seen.get(occupancy) {
            s.store(seen.saturating_add(1), Ordering::Relaxed);
        }
    }

    /// The learned time of a turn of `occupancy` seats, once at least
    /// `samples` such turns were recorded.
    pub fn counted(&self, occupancy: usize, samples: u32) -> Option<Duration> {
        let seen = self.seen.get(occupancy)?.load(Ordering::Relaxed);
        let ns = self.ewma_ns.get(occupancy)?.load(Ordering::Relaxed);
        (seen >= u64::from(samples) && ns > 0).then(|| Duration::from_nanos(ns))
    }

    /// The learned points, as (occupancy, turn time).
    pub fn curve(&self) -> Vec<(usize, Duration)> {
        self.ewma_ns
            .iter()
            .enumerate()
            .filter_map(|(k, ns)| {
                let ns = ns.load(Ordering::Relaxed);
                (ns > 0).then(|| (k, Duration::from_nanos(ns)))
            })
            .collect()
    }
}

impl TurnTimes for LearnedTurnTimes {
    fn estimate(&self, occupancy: usize) -> Option<Duration> {
        let known = |k: usize| {
            self.ewma_ns
                .get(k)
                .map(|n| n.load(Ordering::Relaxed))
                .filter(|n| *n > 0)
        };
        if let Some(ns) = known(occupancy) {
            return Some(Duration::from_nanos(ns));
        }
        // The nearest known occupancy, scaled linearly.
        let len = self.ewma_ns.len();
        for d in 1..len {
            for k in [occupancy.checked_sub(d), Some(occupancy + d)].into_iter().flatten() {
                if k > 0 {
                    if let Some(ns) = known(k) {
                        return Some(Duration::from_nanos(ns * occupancy.max(1) as u64 / k as u64));
                    }
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed turn-time model: `per_seat` per seat plus `base`.
    struct Linear {
        base: Duration,
        per_seat: Duration,
    }

    impl TurnTimes for Linear {
        fn estimate(&self, k: usize) -> Option<Duration> {
            Some(self.base + self.per_seat * k as u32)
        }
    }

    fn q(t0: Instant, queued: usize, held: usize, lanes_queued: usize) -> QueueState {
        QueueState {
            oldest: t0,
            queued,
            held,
            lanes_queued,
            max_seats: 64,
            epoch: t0,
            arrivals_per_sec: 0.0,
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn immediate_runs_at_once() {
        let t0 = Instant::now();
        let times = Linear { base: MS, per_seat: MS };
        assert_eq!(
            decide(&TurnPolicy::Immediate, &q(t0, 1, 8, 1), &times, t0),
            Decision::RunNow
        );
    }

    #[test]
    fn linger_waits_from_the_oldest_seat_and_closes_early() {
        let t0 = Instant::now();
        let times = Linear { base: MS, per_seat: MS };
        let p = TurnPolicy::linger(5 * MS);
        assert_eq!(
            decide(&p, &q(t0, 1, 8, 1), &times, t0 + MS),
            Decision::WaitUntil(t0 + 5 * MS)
        );
        assert_eq!(decide(&p, &q(t0, 1, 8, 1), &times, t0 + 6 * MS), Decision::RunNow);
        assert_eq!(
            decide(&p, &q(t0, 8, 8, 8), &times, t0),
            Decision::RunNow,
            "every held lane queued"
        );
    }

    /// The budget policy starts at the latest instant meeting the oldest
    /// seat's deadline: never later (a deadline it could meet is met), never
    /// earlier (the turn is as wide as the budget allows).
    #[test]
    fn latency_budget_starts_at_the_latest_instant_meeting_the_deadline() {
        let t0 = Instant::now();
        let times = Linear {
            base: MS,
            per_seat: Duration::from_micros(100),
        };
        let budget = 10 * MS;
        let p = TurnPolicy::latency_budget(budget);
        // Seats arriving fast enough to fill the 8 held lanes: the widest
        // turn takes 1.8 ms; planned to end at half the budget, it starts
        // by 3.2 ms.
        let mut busy = q(t0, 3, 8, 3);
        busy.arrivals_per_sec = 10_000.0;
        let start = t0 + budget / HEADROOM - times.estimate(8).unwrap();
        for now in [t0, t0 + MS, t0 + 3 * MS] {
            assert_eq!(decide(&p, &busy, &times, now), Decision::WaitUntil(start));
        }
        assert_eq!(decide(&p, &busy, &times, start), Decision::RunNow);
        // Started then, the turn ends by the deadline, with the headroom left.
        assert_eq!(start + times.estimate(8).unwrap(), t0 + budget / HEADROOM);
        // Nothing more can come: run at once, however much budget is left.
        assert_eq!(decide(&p, &q(t0, 8, 8, 8), &times, t0), Decision::RunNow);
        let mut capped = q(t0, 4, 8, 4);
        capped.max_seats = 4;
        assert_eq!(decide(&p, &capped, &times, t0), Decision::RunNow, "the turn is full");
    }

    /// The planned width follows the arrival rate: with nothing more
    /// expected the turn is planned as wide as its queue (it may wait
    /// longer); seats beyond the plan make the runner decide again.
    #[test]
    fn latency_budget_plans_for_the_seats_expected() {
        let t0 = Instant::now();
        let times = Linear {
            base: MS,
            per_seat: Duration::from_micros(100),
        };
        let budget = 10 * MS;
        let p = TurnPolicy::latency_budget(budget);
        let quiet = q(t0, 3, 8, 3);
        assert_eq!(recheck_after(&p, &quiet, t0), 1, "a fourth seat is beyond the plan");
        // 2000 seats/s over the 5 ms left: 10 more expected, 8 planned.
        let mut steady = quiet;
        steady.arrivals_per_sec = 2000.0;
        assert_eq!(
            decide(&p, &steady, &times, t0),
            Decision::WaitUntil(t0 + budget / HEADROOM - times.estimate(8).unwrap())
        );
        assert_eq!(recheck_after(&p, &steady, t0), 5, "the turn is full after 5 more");
        // Under load (widest turn too long for the budget) it still waits
        // for the turn it expects, instead of degrading to Immediate.
        let slow = Linear { base: MS, per_seat: MS };
        let mut load = q(t0, 1, 64, 1);
        load.arrivals_per_sec = 300.0;
        assert_eq!(
            decide(&p, &load, &slow, t0),
            Decision::WaitUntil(t0 + budget / HEADROOM - slow.estimate(3).unwrap())
        );
        assert_eq!(recheck_after(&p, &load, t0), 3);
        assert_eq!(recheck_after(&TurnPolicy::linger(MS), &load, t0), 63);
    }

    /// While the state has time to spare the budget policy runs at once;
    /// it waits once serving the arrivals at the queued width would keep
    /// the state busy half the time or more.
    #[test]
    fn latency_budget_waits_only_when_the_state_would_be_busy() {
        let t0 = Instant::now();
        // 1 ms + 100 µs a seat: one seat alone costs 1.1 ms.
        let times = Linear {
            base: MS,
            per_seat: Duration::from_micros(100),
        };
        let p = TurnPolicy::latency_budget(10 * MS);
        let mut light = q(t0, 1, 64, 1);
        for (rate, waits) in [
            (0.0, false),
            (100.0, false),
            (400.0, false),
            (460.0, true),
            (5000.0, true),
        ] {
            light.arrivals_per_sec = rate;
            let decision = decide(&p, &light, &times, t0);
            assert_eq!(
                decision != Decision::RunNow,
                waits,
                "{rate} seats/s, 1.1 ms a seat alone: {decision:?}"
            );
        }
        // At 5000 seats/s, 10 queued cost 0.2 ms a seat: busy still (1.0);
        // at 2000 seats/s the same queue keeps it busy 0.4: run now.
        let mut wide = q(t0, 10, 64, 10);
        wide.arrivals_per_sec = 5000.0;
        assert_ne!(decide(&p, &wide, &times, t0), Decision::RunNow);
        wide.arrivals_per_sec = 2000.0;
        assert_eq!(decide(&p, &wide, &times, t0), Decision::RunNow);
    }

    #[test]
    fn latency_budget_below_the_turn_time_degrades_to_immediate() {
        let t0 = Instant::now();
        let times = Linear {
            base: 5 * MS,
            per_seat: MS,
        };
        let p = TurnPolicy::latency_budget(2 * MS);
        assert_eq!(decide(&p, &q(t0, 1, 8, 1), &times, t0), Decision::RunNow);
    }

    #[test]
    fn latency_budget_runs_at_once_while_it_knows_nothing() {
        let t0 = Instant::now();
        let p = TurnPolicy::latency_budget(10 * MS);
        assert_eq!(
            decide(&p, &q(t0, 1, 8, 1), &LearnedTurnTimes::new(8), t0),
            Decision::RunNow
        );
    }

    #[test]
    fn tick_runs_at_fixed_instants() {
        let t0 = Instant::now();
        let times = Linear { base: MS, per_seat: MS };
        let p = TurnPolicy::tick(4 * MS);
        let mut state = q(t0, 1, 8, 1);
        state.oldest = t0 + 5 * MS;
        assert_eq!(
            decide(&p, &state, &times, t0 + 5 * MS),
            Decision::WaitUntil(t0 + 8 * MS)
        );
        assert_eq!(decide(&p, &state, &times, t0 + 8 * MS), Decision::RunNow);
    }

    #[test]
    fn learned_times_average_and_interpolate() {
        let t = LearnedTurnTimes::new(16);
        assert_eq!(t.estimate(4), None);
        t.record(4, Duration::from_micros(400));
        assert_eq!(t.estimate(4), Some(Duration::from_micros(400)));
        assert_eq!(
            t.estimate(8),
            Some(Duration::from_micros(800)),
            "scaled from the nearest known"
        );
        // The second turn replaces the first (often a cold one), the next
        // few are averaged plainly, then each moves the average 1/8 of the
        // way.
        t.record(4, Duration::from_micros(800));
        assert_eq!(t.estimate(4), Some(Duration::from_micros(800)), "the first replaced");
        t.record(4, Duration::from_micros(400));
        assert_eq!(t.estimate(4), Some(Duration::from_micros(600)), "a plain mean");
        for _ in 3..8 {
            t.record(4, Duration::from_micros(600));
        }
        assert_eq!(t.estimate(4), Some(Duration::from_micros(600)));
        t.record(4, Duration::from_micros(1400));
        assert_eq!(t.estimate(4), Some(Duration::from_micros(700)), "moves 1/8 of the way");
        assert_eq!(t.curve(), vec![(4, Duration::from_micros(700))]);
    }
}
