//! What a row costs at each turn width: the model run on a plain state of
//! its own at a few widths (1, 2, 4, ... up to the runner's lanes), a few
//! turns each, explicit state fed back, timed. `laned check` prints it and
//! the width that costs least per row, which a runner learns too while
//! serving and caps its turns at (`RunnerConfig::learn_width`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use laned_load::FeedBack;
use tract_core::internal::*;

use crate::feed::Feed;

/// Turns timed per width, after one untimed.
const TURNS: u32 = 8;

/// Time spent per width at most, past the first turn: a slow model is
/// timed over fewer turns.
const BUDGET: Duration = Duration::from_millis(100);

/// The widths timed: powers of two up to `widest`, and `widest`.
pub fn widths(widest: usize) -> Vec<usize> {
    let mut w: Vec<usize> = std::iter::successors(Some(1usize), |w| Some(w * 2))
        .take_while(|w| *w < widest)
        .collect();
    w.push(widest.max(1));
    w
}

/// A row's cost at each of `widths`: (width, time per row).
pub fn per_row(plan: &Arc<dyn Runnable>, feed: &Feed, widths: &[usize]) -> TractResult<Vec<(usize, Duration)>> {
    widths
        .iter()
        .map(|&width| {
            // Explicit state fed back as a stream of the runner's would be.
            let mut state = FeedBack::pairs(plan.clone(), feed.state(width)?).spawn()?;
            let streams: Vec<u64> = (0..width as u64).collect();
            let inputs = feed.inputs(&streams)?;
            let turn = |state: &mut Box<dyn State>| state.run(inputs.clone()).map(drop);
            turn(&mut state)?;
            let started = Instant::now();
            let mut turns = 0u32;
            while turns < TURNS && (turns == 0 || started.elapsed() < BUDGET) {
                turn(&mut state)?;
                turns += 1;
            }
            Ok((width, started.elapsed() / (turns * width as u32)))
        })
        .collect()
}

/// The width of `costs` that costs least per row, by the runner's own rule
/// ([`laned_runner::cheapest_width`]).
pub fn cheapest(costs: &[(usize, Duration)]) -> Option<usize> {
    let per_row: Vec<(usize, f64)> = costs.iter().map(|(w, c)| (*w, c.as_secs_f64())).collect();
    laned_runner::cheapest_width(&per_row)
}

/// The line `laned check` prints.
pub fn fact(costs: &[(usize, Duration)]) -> String {
    let listed: Vec<String> = costs
        .iter()
        .map(|(w, c)| format!("{w}: {:.1}", c.as_secs_f64() * 1e6))
        .collect();
    let widest = costs.iter().map(|(w, _)| *w).max().unwrap_or(1);
    match cheapest(costs) {
        Some(w) if w == widest => format!(
            "width: µs a row by turn width ({}): cheapest per row at {w}, the widest timed: wider turns pay, and the runner seats every queued stream",
            listed.join(", ")
        ),
        Some(w) => format!(
            "width: µs a row by turn width ({}): cheapest per row at {w}; a runner learns this while serving and caps its turns there (learn_width)",
            listed.join(", ")
        ),
        None => "width: not timed".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Powers of two up to the lanes, the lanes last; within a tenth of the
    /// lowest cost, the widest wins.
    #[test]
    fn widths_and_the_cheapest() {
        assert_eq!(widths(64), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(widths(6), vec![1, 2, 4, 6]);
        assert_eq!(widths(1), vec![1]);
        let us = Duration::from_micros;
        assert_eq!(cheapest(&[(1, us(10)), (2, us(6)), (4, us(7))]), Some(2));
        assert_eq!(cheapest(&[(1, us(10)), (2, us(6)), (4, us(6))]), Some(4));
        assert!(fact(&[(1, us(10)), (2, us(6)), (4, us(9))]).contains("caps its turns there"));
        assert!(fact(&[(1, us(10)), (2, us(6)), (4, us(5))]).contains("wider turns pay"));
    }
}
