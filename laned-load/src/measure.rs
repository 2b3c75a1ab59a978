//! What a run found: a closed loop's throughput, a real-time run's
//! latencies, and how repeated runs are summed up.

use std::time::Duration;

/// What a closed-loop run served.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// Pulses per second, all streams together.
    pub per_sec: f64,
    /// CPU time of the whole process (every thread: callers, runner,
    /// anything else running) per pulse over the timed part of the run;
    /// `None` where the platform does not tell.
    pub cpu_per_pulse: Option<Duration>,
}

/// Latencies of a real-time run.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    /// Every pulse's latency in microseconds (from the instant it was due,
    /// or from its send where the driver says so) to its answer, sorted.
    pub sorted_us: Vec<u64>,
}

impl Latencies {
    /// The latencies of every pulse served, in microseconds, in any order.
    pub fn new(mut us: Vec<u64>) -> Latencies {
        us.sort_unstable();
        Latencies { sorted_us: us }
    }

    /// Pulses served.
    pub fn pulses(&self) -> u64 {
        self.sorted_us.len() as u64
    }

    /// The latency, in microseconds, that a fraction `q` (0..=1) of the pulses
    /// did not exceed (nearest rank); 0 when no pulse was served.
    pub fn quantile_us(&self, q: f64) -> u64 {
        if self.sorted_us.is_empty() {
            return 0;
        }
        let ix = ((q * self.sorted_us.len() as f64).ceil() as usize).clamp(1, self.sorted_us.len()) - 1;
        self.sorted_us[ix]
    }
}

/// The median of `v` (the mean of the two middle values for an even
/// count): how the benches sum up repeated runs. `NaN` for no value.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The smallest and the largest of `v` (`(NaN, NaN)` for no value): the
/// spread the tables show beside a median.
pub fn spread(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
