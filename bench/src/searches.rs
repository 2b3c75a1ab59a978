//! Several capacity searches per real-time system, as the model benches
//! (`silero-bench`, `audio-bench`) run and print them: each system's
//! search once per round (interleaved, so drift hits all alike), then a row
//! per system with the median search's capacity, every search's figure,
//! the latencies at that capacity and the median search's probes.

use std::time::Duration;

/// One probe of a search: streams, p50 and p99 latency in µs.
pub type Probe = (usize, u64, u64);

/// The searches of every system so far.
#[derive(Debug)]
pub struct Searches {
    budget_us: u64,
    /// Per system, per search: capacity, "p50 / p99" at it, the probes.
    found: Vec<Vec<(usize, String, String)>>,
}

impl Searches {
    /// The table's header, two lines of markdown.
    pub const HEADER: &'static str = "| system | capacity | searches | p50 / p99 ms at capacity | probes of the median search (streams: p99 ms) |\n|---|---|---|---|---|";

    /// No search yet of `systems` systems, probes passing within `budget`.
    pub fn new(systems: usize, budget: Duration) -> Searches {
        Searches {
            budget_us: budget.as_micros() as u64,
            found: vec![vec![]; systems],
        }
    }

    /// System `system`'s search found `capacity` after `probes`.
    pub fn record(&mut self, system: usize, capacity: usize, probes: &[Probe]) {
        // The latencies of the last probe that passed at the capacity:
        // never one over the budget.
        let at = probes
            .iter()
            .rev()
            .find(|(n, _, p99)| *n == capacity && *p99 <= self.budget_us)
            .map(|(_, p50, p99)| format!("{:.1} / {:.1}", *p50 as f64 / 1000.0, *p99 as f64 / 1000.0))
            .unwrap_or_else(|| "-".into());
        let probes: Vec<String> = probes
            .iter()
            .map(|(n, _, p99)| format!("{n}: {:.1}", *p99 as f64 / 1000.0))
            .collect();
        self.found[system].push((capacity, at, probes.join(", ")));
    }

    /// A markdown row per system, in the order of `labels` (one per
    /// system, as given to [`Searches::new`]).
    pub fn rows<'a>(self, labels: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        labels
            .into_iter()
            .zip(self.found)
            .filter(|(_, runs)| !runs.is_empty())
            .map(|(label, mut runs)| {
                let all: Vec<String> = runs.iter().map(|(c, ..)| c.to_string()).collect();
                runs.sort_by_key(|(c, ..)| *c);
                let (median, at, probes) = &runs[runs.len() / 2];
                format!("| {label} | {median} | {} | {at} | {probes} |", all.join(", "))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row gives the median search, every search in order, and the
    /// latencies of a passing probe at the capacity, never a missed one.
    #[test]
    fn a_row_is_the_median_search_and_its_passing_probe() {
        let mut s = Searches::new(1, Duration::from_millis(4));
        s.record(0, 16, &[(8, 500, 1000), (16, 900, 3900), (32, 2000, 9000)]);
        // Capacity 32: its last probe missed, an earlier one at 32 passed.
        s.record(0, 32, &[(32, 1000, 3000), (32, 1500, 4100)]);
        s.record(0, 24, &[(24, 700, 3500), (32, 1800, 5000)]);
        let rows = s.rows(["ours"]);
        assert_eq!(rows, ["| ours | 24 | 16, 32, 24 | 0.7 / 3.5 | 24: 3.5, 32: 5.0 |"]);
        let mut s = Searches::new(1, Duration::from_millis(4));
        s.record(0, 32, &[(32, 1000, 3000), (32, 1500, 4100)]);
        assert_eq!(s.rows(["x"]), ["| x | 32 | 32 | 1.0 / 3.0 | 32: 3.0, 32: 4.1 |"]);
        let mut s = Searches::new(1, Duration::from_millis(4));
        s.record(0, 0, &[(4, 1000, 9000)]);
        assert_eq!(s.rows(["none"]), ["| none | 0 | 0 | - | 4: 9.0 |"]);
    }
}
