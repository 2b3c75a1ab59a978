//! Where in the first period a real-time stream starts: seeded, so a run
//! is the same every time, and spread, so the streams do not all send at
//! once.

use std::time::Duration;

/// Stream `stream`'s start within the first `period` of a real-time run
/// seeded `seed`: in `[0, period)`, the same for the same three.
pub fn phase(seed: u64, stream: usize, period: Duration) -> Duration {
    let period = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX).max(1);
    Duration::from_nanos(fastrand::Rng::with_seed(seed.wrapping_add(stream as u64)).u64(..period))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within the period, the same for the same seed and stream, and not
    /// the same for every stream.
    #[test]
    fn a_phase_is_seeded_and_within_the_period() {
        let period = Duration::from_millis(32);
        let phases: Vec<Duration> = (0..16).map(|s| phase(7, s, period)).collect();
        assert!(phases.iter().all(|p| *p < period), "{phases:?}");
        assert_eq!(phases, (0..16).map(|s| phase(7, s, period)).collect::<Vec<_>>());
        assert!(phases.iter().any(|p| *p != phases[0]), "{phases:?}");
        assert_eq!(phase(7, 0, Duration::ZERO), Duration::ZERO);
    }
}
