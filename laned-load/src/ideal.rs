//! The ideal loop: the ceiling every figure of ours is measured against.
//! **ideal: the model as given on one plain batched tract state.**
//!
//! - The model as the user gave it: the `Runnable` the caller passes (the
//!   plan tract prepared from the user's model), never the plan a runner
//!   serves (no lift of the ops' state, nothing of `laned-runner`).
//! - For the `n` streams a thread carries, ONE plain state spawned from
//!   that plan, run with every batched input `n` rows high: tract resolves
//!   the batch symbol from the inputs on each run, as a user batching by
//!   hand gets it.
//! - No lanes API: never `seat`, never `reset_lanes`. The ops' own state (a
//!   pulsed model's Delay and PulsePad buffers, a Scan's hidden state) then
//!   lives in tract's plain op states under the state's default seating,
//!   `Seating::single()` (one lane, `max_lanes` 1): tract-pulse-opl 0.23.9's
//!   Delay and PulsePad size their buffers from the first input they see
//!   (the `n` rows on axis 0 included, no lane axis added) and advance all
//!   rows together with one ring head, which is exactly `n` streams started
//!   together and called in lockstep. A plain state with `n` rows needs that
//!   default seating and gets it from `spawn`: nothing here changes it.
//! - The explicit state (the model's state inputs and outputs) fed back by
//!   hand ([`FeedBack`]), its rows stacked on its batch axis.
//! - Inputs pre-stacked once, before the timed loop.
//!
//! `laned bench` and the bench binaries both run it, each handing it its own
//! inputs ([`Batch`]).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use tract_core::internal::*;

use crate::{threads, FeedBack, Throughput};

/// What the ideal loop feeds one plain state: every model input but the
/// explicit state ones, in model order, with the state's rows stacked on
/// axis 0 of the batched ones (a shared input as it is); and each explicit
/// state as `(model input, model output, initial value)`, its rows stacked
/// on the state's batch axis.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The inputs, pre-stacked: the same every run.
    pub inputs: TVec<TValue>,
    /// The explicit state pairs and their initial values, rows stacked.
    pub state: Vec<(usize, usize, Tensor)>,
}

/// One plain state of `plan` for a batch whose explicit state starts at
/// `state` (empty: the model has none): `plan.spawn()`, behind a
/// [`FeedBack`] feeding the state back by hand where there is one. Never
/// seated, never reset: its ops keep their state under the default seating
/// (see the module's doc).
pub fn state(plan: &Arc<dyn Runnable>, state: Vec<(usize, usize, Tensor)>) -> TractResult<Box<dyn State>> {
    if state.is_empty() {
        plan.spawn()
    } else {
        FeedBack::pairs(plan.clone(), state).spawn()
    }
}

/// The rows each of `threads` threads carries of `n` streams, spread as
/// evenly as a runner's placement spreads streams over its shards (the
/// first `n % threads` one more); never more threads than streams, at
/// least one.
pub fn shares(n: usize, threads: usize) -> Vec<Range<usize>> {
    let threads = threads.clamp(1, n.max(1));
    let mut start = 0;
    (0..threads)
        .map(|t| {
            let rows = n / threads + usize::from(t < n % threads);
            start += rows;
            start - rows..start
        })
        .collect()
}

/// The ideal loop: `threads` threads (at most one per stream), thread `t`
/// carrying rows [`shares`]`(n, threads)[t]` of the `n` streams on one
/// plain [`state`] of `plan`, run over and over with `batch(rows)`'s inputs
/// (built once, in the thread's setup) until `duration` has passed. Calls
/// per second counts a row of a run as one call.
pub fn closed_loop(
    plan: Arc<dyn Runnable>,
    n: usize,
    threads: usize,
    duration: Duration,
    batch: impl Fn(Range<usize>) -> TractResult<Batch> + Send + Sync + 'static,
) -> TractResult<Throughput> {
    let shares = shares(n, threads);
    threads::closed_loop(
        shares.len(),
        duration,
        move |t| {
            let rows = shares[t].clone();
            let Batch { inputs, state: kept } = batch(rows.clone())?;
            Ok((state(&plan, kept)?, inputs, rows.len() as u64))
        },
        |(state, inputs, rows)| {
            state.run(inputs.clone())?;
            Ok(*rows)
        },
    )
}

/// Ours above the ideal: the ideal is the ceiling, so a figure over it is
/// said, never shown silently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Above {
    /// Ours' median is over the ideal's, but not over the ideal's best
    /// round: within the rounds' spread.
    WithinSpread,
    /// Ours' median is over every round of the ideal's: not noise. A bug
    /// (ours skipped work, or the ideal did more than the model), or a
    /// reason to find and say.
    PastSpread,
}

impl Above {
    /// Whether ours (its rounds' figures) came out above the ideal (its
    /// rounds'), and how far: `None` at or below the ideal's median.
    pub fn of(ours: &[f64], ideal: &[f64]) -> Option<Above> {
        let (o, i) = (crate::median(ours), crate::median(ideal));
        if o.partial_cmp(&i) != Some(std::cmp::Ordering::Greater) {
            return None;
        }
        let best = ideal.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(if o > best {
            Above::PastSpread
        } else {
            Above::WithinSpread
        })
    }

    /// The flag a table's row carries.
    pub fn flag(self) -> &'static str {
        match self {
            Above::WithinSpread => "(above ideal)",
            Above::PastSpread => "(ABOVE IDEAL!)",
        }
    }
}

impl std::fmt::Display for Above {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Above::WithinSpread => "above the ideal's median but not its best round: within the rounds' spread, noise",
            Above::PastSpread => {
                "above every round of the ideal's: the ideal is the model as given on one plain batched tract state, \
                 the ceiling, so this is a bug (ours skipped work, or the ideal did more than the model) or a reason to find"
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn above_the_ideal_is_said_and_told_from_noise() {
        assert_eq!(Above::of(&[9.0, 10.0, 11.0], &[10.0, 12.0, 11.0]), None);
        assert_eq!(Above::of(&[11.0], &[11.0]), None);
        assert_eq!(Above::of(&[11.5], &[10.0, 11.0, 12.0]), Some(Above::WithinSpread));
        assert_eq!(Above::of(&[13.0, 14.0], &[10.0, 11.0, 12.0]), Some(Above::PastSpread));
        assert!(Above::PastSpread.to_string().contains("bug"));
    }

    #[test]
    fn shares_spread_every_stream_once_as_evenly_as_placement() {
        assert_eq!(shares(5, 2), vec![0..3, 3..5]);
        assert_eq!(shares(4, 4), vec![0..1, 1..2, 2..3, 3..4]);
        // Never more threads than streams, never none.
        assert_eq!(shares(2, 8), vec![0..1, 1..2]);
        assert_eq!(shares(3, 0), vec![0..3]);
        assert_eq!(shares(0, 2), vec![0..0]);
        for (n, t) in [(64, 3), (7, 7), (1, 1), (100, 16)] {
            let s = shares(n, t);
            assert_eq!(s.first().unwrap().start, 0);
            assert_eq!(s.last().unwrap().end, n);
            assert!(s.windows(2).all(|w| w[0].end == w[1].start));
            let lens: Vec<usize> = s.iter().map(|r| r.len()).collect();
            assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1, "{lens:?}");
        }
    }
}
