//! The capacity search: the most streams a probe (a real-time run within
//! its latency budget) accepts, doubling then bisecting, a single missed
//! probe never taken for a refusal.

use tract_core::internal::*;

/// What a capacity search found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacity {
    /// The most streams accepted.
    pub streams: usize,
    /// Every count whose probes disagreed (one missed, another passed):
    /// where the system sits near its limit or the machine hiccuped.
    pub disputed: Vec<Disputed>,
}

/// A count whose probes disagreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Disputed {
    /// The stream count probed.
    pub streams: usize,
    /// Probes within the budget.
    pub passed: u32,
    /// Probes run at this count (2 or 3).
    pub probes: u32,
}

/// The most streams `probe` accepts: doubling from `start` up to `max`,
/// then bisecting between the last accepted and the first refused count
/// until they are within a sixteenth (at most `bisections` probes). 0 if
/// `start` is refused.
///
/// A count is refused only when two of three probes refuse it: a probe
/// that misses is run again (and a third time if the second passes), so a
/// single hiccup (another process's burst, a page fault storm) cannot stop
/// the doubling early or pull the bisection down. Counts whose probes
/// disagreed are handed back in [`Capacity::disputed`].
pub fn search_capacity(
    start: usize,
    max: usize,
    bisections: usize,
    mut probe: impl FnMut(usize) -> TractResult<bool>,
) -> TractResult<Capacity> {
    let mut disputed = vec![];
    let mut probe = |n: usize| -> TractResult<bool> {
        if probe(n)? {
            return Ok(true);
        }
        if !probe(n)? {
            return Ok(false);
        }
        let third = probe(n)?;
        disputed.push(Disputed {
            streams: n,
            passed: 1 + u32::from(third),
            probes: 3,
        });
        Ok(third)
    };
    let (mut good, mut bad) = (0usize, None::<usize>);
    let mut n = start.max(1);
    while n <= max {
        if probe(n)? {
            good = n;
            n *= 2;
        } else {
            bad = Some(n);
            break;
        }
    }
    if let Some(mut bad) = bad {
        for _ in 0..bisections {
            if bad - good <= (good / 16).max(1) {
                break;
            }
            let mid = (good + bad) / 2;
            if probe(mid.max(1))? {
                good = mid;
            } else {
                bad = mid;
            }
        }
    }
    Ok(Capacity {
        streams: good,
        disputed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The search finds the largest accepted count within a sixteenth, and
    /// 0 when even the first probe fails.
    #[test]
    fn capacity_search_doubles_then_bisects() {
        let mut probed = vec![];
        let cap = search_capacity(8, 2048, 8, |n| {
            probed.push(n);
            Ok(n <= 300)
        })
        .unwrap()
        .streams;
        assert!((300 - 300 / 16..=300).contains(&cap), "found {cap}");
        assert_eq!(&probed[..7], &[8, 16, 32, 64, 128, 256, 512]);
        assert_eq!(search_capacity(8, 2048, 8, |_| Ok(false)).unwrap().streams, 0);
        assert_eq!(search_capacity(8, 64, 8, |_| Ok(true)).unwrap().streams, 64);
    }

    /// One hiccup (a single probe missing where the system holds) neither
    /// stops the doubling nor pulls the bisection down; a count missed
    /// twice in three probes is refused.
    #[test]
    fn a_single_hiccup_cannot_halve_a_capacity() {
        for hiccup_at in [8, 64, 256, 384] {
            let mut hiccuped = false;
            let cap = search_capacity(8, 2048, 8, |n| {
                if n == hiccup_at && !hiccuped {
                    hiccuped = true;
                    return Ok(false);
                }
                Ok(n <= 300)
            })
            .unwrap();
            assert!(
                (300 - 300 / 16..=300).contains(&cap.streams),
                "hiccup at {hiccup_at}: found {cap:?}"
            );
            // The hiccup shows as a dispute where it hit a count the system holds.
            if hiccup_at <= 300 {
                assert!(
                    cap.disputed.iter().any(|d| d.streams == hiccup_at && d.passed == 2),
                    "hiccup at {hiccup_at} not reported: {cap:?}"
                );
            }
        }
        // Missing two probes of three is a refusal.
        let mut calls_at_64 = 0;
        let cap = search_capacity(8, 2048, 8, |n| {
            if n == 64 {
                calls_at_64 += 1;
                return Ok(calls_at_64 == 2);
            }
            Ok(n <= 300)
        })
        .unwrap();
        assert!(cap.streams < 64, "found {cap:?}");
        assert_eq!(
            cap.disputed,
            vec![Disputed {
                streams: 64,
                passed: 1,
                probes: 3
            }]
        );
    }
}
