//! A lock-free log-linear histogram of durations: four buckets per power of
//! two of nanoseconds, so any recorded value is off by at most 25% in its
//! bucket's upper bound, and recording is a handful of integer operations and
//! two relaxed atomic adds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Buckets per power of two.
const SUB: u32 = 4;
/// Bits of sub-bucket.
const SUB_BITS: u32 = 2;
/// Enough buckets for every `u64` of nanoseconds.
pub(crate) const BUCKETS: usize = (SUB as usize) + (64 - SUB_BITS as usize) * SUB as usize;

/// The bucket holding `nanos`.
pub(crate) fn bucket_of(nanos: u64) -> usize {
    if nanos < SUB as u64 {
        return nanos as usize;
    }
    let msb = 63 - nanos.leading_zeros();
    let sub = (nanos >> (msb - SUB_BITS)) & (SUB as u64 - 1);
    (SUB + (msb - SUB_BITS) * SUB + sub as u32) as usize
}

/// The largest value bucket `ix` holds.
pub(crate) fn upper_bound(ix: usize) -> u64 {
    if ix < SUB as usize {
        return ix as u64;
    }
    let octave = (ix as u32 - SUB) / SUB;
    let sub = (ix as u32 - SUB) % SUB;
    let msb = octave + SUB_BITS;
    let low = (SUB as u64 + sub as u64) << (msb - SUB_BITS);
    low.saturating_add((1u64 << (msb - SUB_BITS)) - 1)
}

/// Recording side: who may touch it: any thread, through `&self`.
pub(crate) struct AtomicHistogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl AtomicHistogram {
    pub(crate) fn new() -> AtomicHistogram {
        AtomicHistogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn record(&self, value: Duration) {
        let nanos = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(nanos)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(nanos, Ordering::Relaxed);
        self.max_ns.fetch_max(nanos, Ordering::Relaxed);
    }

    /// A copy; concurrent recording may land between two reads, so the count
    /// and the buckets can be a record apart, never more wrong than that.
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .filter_map(|(ix, b)| {
                let n = b.load(Ordering::Relaxed);
                (n > 0).then_some((ix as u32, n))
            })
            .collect::<Vec<_>>();
        HistogramSnapshot {
            count: buckets.iter().map(|(_, n)| n).sum(),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
            max_ns: self.max_ns.load(Ordering::Relaxed),
            buckets,
        }
    }
}

/// A histogram of durations as read at one instant: serialisable, comparable,
/// and subtractable ([`HistogramSnapshot::delta`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramSnapshot {
    /// Values recorded.
    pub count: u64,
    /// Their sum, in nanoseconds.
    pub sum_ns: u64,
    /// The largest, in nanoseconds.
    pub max_ns: u64,
    /// Non-empty buckets as (bucket index, values in it), by index.
    pub buckets: Vec<(u32, u64)>,
}

impl HistogramSnapshot {
    /// The value under which a fraction `q` (0..=1) of the recorded values
    /// fall, to the bucket's resolution, never above the recorded maximum.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (ix, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return Duration::from_nanos(upper_bound(*ix as usize).min(self.max_ns));
            }
        }
        Duration::from_nanos(self.max_ns)
    }

    /// The median: [`quantile`](Self::quantile) at 0.5.
    pub fn p50(&self) -> Duration {
        self.quantile(0.50)
    }

    /// [`quantile`](Self::quantile) at 0.9.
    pub fn p90(&self) -> Duration {
        self.quantile(0.90)
    }

    /// [`quantile`](Self::quantile) at 0.99.
    pub fn p99(&self) -> Duration {
        self.quantile(0.99)
    }

    /// The largest recorded value (zero when none was).
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns)
    }

    /// The mean of the recorded values, rounded down to the nanosecond (zero when none was).
    pub fn mean(&self) -> Duration {
        Duration::from_nanos(self.sum_ns.checked_div(self.count).unwrap_or(0))
    }

    /// What was recorded after `earlier` (a snapshot of the same histogram).
    /// The maximum of the window is known to the bucket's resolution only.
    pub fn delta(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        let buckets: Vec<(u32, u64)> = self
            .buckets
            .iter()
            .filter_map(|(ix, n)| {
                let before = earlier
                    .buckets
                    .iter()
                    .find(|(e, _)| e == ix)
                    .map(|(_, n)| *n)
                    .unwrap_or(0);
                let n = n.saturating_sub(before);
                (n > 0).then_some((*ix, n))
            })
            .collect();
        let max_ns = buckets
            .last()
            .map(|(ix, _)| upper_bound(*ix as usize).min(self.max_ns))
            .unwrap_or(0);
        HistogramSnapshot {
            count: buckets.iter().map(|(_, n)| n).sum(),
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
            max_ns,
            buckets,
        }
    }

    /// Both histograms' values together (shards summed into a total).
    pub fn merge(&self, other: &HistogramSnapshot) -> HistogramSnapshot {
        let mut buckets = self.buckets.clone();
        for (ix, n) in &other.buckets {
            match buckets.iter_mut().find(|(b, _)| b == ix) {
                Some((_, m)) => *m += n,
                None => buckets.push((*ix, *n)),
            }
        }
        buckets.sort();
        HistogramSnapshot {
            count: self.count + other.count,
            sum_ns: self.sum_ns + other.sum_ns,
            max_ns: self.max_ns.max(other.max_ns),
            buckets,
        }
    }

    /// How many values are at most `nanos`, counting whole buckets only.
    pub(crate) fn count_at_most(&self, nanos: u64) -> u64 {
        self.buckets
            .iter()
            .filter(|(ix, _)| upper_bound(*ix as usize) <= nanos)
            .map(|(_, n)| n)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(3), 3);
        assert_eq!(bucket_of(4), 4);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(upper_bound(BUCKETS - 1), u64::MAX);
    }

    proptest! {
        #[test]
        fn a_value_lies_in_its_bucket_within_a_quarter(v in any::<u64>()) {
            let ix = bucket_of(v);
            prop_assert!(v <= upper_bound(ix));
            if ix > 0 {
                prop_assert!(v > upper_bound(ix - 1));
            }
            prop_assert!((upper_bound(ix) - v) as f64 <= v as f64 * 0.25 + 1.0);
        }
    }

    #[test]
    fn quantiles_follow_the_recorded_values() {
        let h = AtomicHistogram::new();
        for us in 1..=100u64 {
            h.record(Duration::from_micros(us));
        }
        let s = h.snapshot();
        assert_eq!(s.count, 100);
        let p50 = s.p50().as_micros() as f64;
        assert!((50.0..=63.0).contains(&p50), "p50 {p50}");
        let p99 = s.p99().as_micros() as f64;
        assert!((99.0..=100.0).contains(&p99), "p99 {p99}");
        assert_eq!(s.max(), Duration::from_micros(100));
        assert_eq!(s.mean(), Duration::from_nanos(50_500));
    }

    #[test]
    fn a_delta_holds_only_the_later_values() {
        let h = AtomicHistogram::new();
        h.record(Duration::from_millis(10));
        let before = h.snapshot();
        h.record(Duration::from_micros(5));
        let delta = h.snapshot().delta(&before);
        assert_eq!(delta.count, 1);
        assert_eq!(delta.sum_ns, 5_000);
        assert!(delta.max() <= Duration::from_micros(6), "{:?}", delta.max());
    }
}
