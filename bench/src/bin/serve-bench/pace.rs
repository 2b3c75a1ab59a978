//! One connection's streams paced on one clock, for the multiplexed fronts'
//! clients (mux.rs, grpc.rs): stream `s`'s pulse falls due every `PERIOD`
//! from the first until the end, each stream waits for its answer before
//! its next pulse, and a late answer delays only its own stream.

use std::time::Instant;

use crate::PERIOD;

/// The schedule of `k` streams and the latencies measured so far.
pub(crate) struct Pace {
    /// When each stream's next pulse falls due.
    due: Vec<Instant>,
    /// When each stream's pulse in flight was sent (`None`: none in flight).
    sent: Vec<Option<Instant>>,
    /// Pulses sent from this instant on are counted.
    counted: Instant,
    /// No pulse falls due from this instant on.
    end: Instant,
    /// Microseconds from a counted pulse's send to its answer.
    latencies: Vec<u64>,
}

impl Pace {
    /// `k` streams, every first pulse due at `first`.
    pub(crate) fn new(k: usize, (first, counted, end): (Instant, Instant, Instant)) -> Pace {
        Pace {
            due: vec![first; k],
            sent: vec![None; k],
            counted,
            end,
            latencies: Vec::new(),
        }
    }

    /// The streams whose pulse is due at `now`, each marked sent then.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<usize> {
        let mut due = Vec::new();
        for s in 0..self.due.len() {
            if self.sent[s].is_none() && self.due[s] <= now && self.due[s] < self.end {
                self.sent[s] = Some(now);
                due.push(s);
            }
        }
        due
    }

    /// When the next pulse not yet sent falls due, if one does before the
    /// end.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        (0..self.due.len())
            .filter(|&s| self.sent[s].is_none() && self.due[s] < self.end)
            .map(|s| self.due[s])
            .min()
    }

    /// Whether every pulse was sent and answered: nothing in flight, nothing
    /// due before the end.
    pub(crate) fn done(&self) -> bool {
        self.sent.iter().all(Option::is_none) && self.next_due().is_none()
    }

    /// Stream `s`'s answer came: its latency counted (if its pulse was sent
    /// from `counted` on), its next pulse due a period after this one's.
    /// An answer with no pulse in flight is ignored.
    pub(crate) fn answered(&mut self, s: usize) {
        if let Some(at) = self.sent[s].take() {
            if at >= self.counted {
                self.latencies.push(at.elapsed().as_micros() as u64);
            }
            self.due[s] += PERIOD;
        }
    }

    /// The latencies measured, in microseconds.
    pub(crate) fn latencies(self) -> Vec<u64> {
        self.latencies
    }
}
