//! The turn width learned per model: how many rows a turn seats at most
//! when batching wider stops paying.
//!
//! Most models cost less per row the wider the turn (one weight read for
//! many rows), but not all: some run slower per row batched wide (their ops
//! loop row by row over a working set that outgrows the cache, as
//! openWakeWord does in tract). Seating every queued stream would then serve
//! fewer streams than turns of a few rows. The engine already learns what a
//! turn of each width costs ([`LearnedTurnTimes`]); this reads a row's cost
//! off it and caps each turn at the cheapest-per-row width, as follows:
//!
//! 1. A width counts once [`MIN_SAMPLES`] turns of it ran.
//! 2. The cheapest width is the widest of those whose cost per row is
//!    within [`TOLERANCE`] of the lowest: noise between near-equal widths
//!    never narrows a turn.
//! 3. The cap is that width only while a wider width counts and costs more
//!    per row: past the widest width seen, wider is assumed to pay (as it
//!    does for most models), so a fresh runner seats everything queued.
//! 4. Probes keep the curve current: while the turn's width counts and no
//!    width up to its half does, the turn seats half (so a model that only
//!    ever ran wide learns whether narrower pays, in a few turns, and walks
//!    down while it does); and while capped, one turn in [`PROBE_EVERY`]
//!    cut to the cap seats one row more (so a cap that stopped paying is
//!    lifted a width at a time, never by a full-width turn).
//! 5. A turn is cut to the cap only where that pays for what is queued: the
//!    turns of the cap and the one of the rest cost less, by the learned
//!    times, than one turn of all of it.
//!
//! Off when `RunnerConfig::learn_width` is false or `max_seats` was given
//! in the config or set while serving (a width set is the width served);
//! tract's knob `TRACT_MAX_SEATS` only bounds it. Never wider than
//! `max_seats`.

use std::time::Duration;

use crate::policy::{LearnedTurnTimes, TurnTimes};
use crate::protocol::Live;

/// Turns of a width before its cost counts.
pub(crate) const MIN_SAMPLES: u32 = 4;

/// Costs per row within this factor of the lowest are taken as equal.
pub(crate) const TOLERANCE: f64 = 1.10;

/// While capped, one turn in this many probes one row wider.
pub(crate) const PROBE_EVERY: u64 = 32;

/// Turns between two readings of the learned curve: reading it costs a
/// pass over every width, which a turn of a small model would feel.
pub(crate) const REREAD_EVERY: u64 = 8;

/// The engine's width state. Owned by the engine (touched by its holder
/// only); the cap it learned is published as the `learned_width` gauge.
#[derive(Debug, Default)]
pub(crate) struct Width {
    /// Turns planned, for the probes' rhythm and the rereads.
    turns: u64,
    /// The curve as last read: the cap (steps 1 to 3) and the narrowest
    /// width that counts.
    cap: Option<usize>,
    narrowest: Option<usize>,
}

/// The turn width that costs least per row, of `per_row`'s (width, cost
/// of a row at that width, in any unit): the widest of those within a
/// tenth of the lowest cost, so noise between near-equal widths keeps the
/// wider. The rule a runner learns its cap by (`RunnerConfig::learn_width`),
/// for a tool that times widths itself (`laned check` does).
///
/// ```
/// assert_eq!(laned_runner::cheapest_width(&[(1, 10.0), (2, 6.0), (4, 7.0)]), Some(2));
/// assert_eq!(laned_runner::cheapest_width(&[(1, 10.0), (2, 6.0), (4, 6.5)]), Some(4));
/// assert_eq!(laned_runner::cheapest_width(&[]), None);
/// ```
pub fn cheapest_width(per_row: &[(usize, f64)]) -> Option<usize> {
    let lowest = per_row.iter().map(|(_, cost)| *cost).fold(f64::INFINITY, f64::min);
    per_row
        .iter()
        .filter(|(_, cost)| *cost <= lowest * TOLERANCE)
        .map(|(width, _)| *width)
        .max()
}

/// The cheapest-per-row width learned so far, and whether it caps turns:
/// `None` while no wider width counts and costs more (steps 1 to 3).
pub(crate) fn learned(times: &LearnedTurnTimes, widest: usize) -> Option<usize> {
    let per_row: Vec<(usize, f64)> = (1..=widest)
        .filter_map(|w| {
            times
                .counted(w, MIN_SAMPLES)
                .map(|t| (w, t.as_nanos() as f64 / w as f64))
        })
        .collect();
    let cheapest = cheapest_width(&per_row)?;
    per_row.iter().any(|(w, _)| *w > cheapest).then_some(cheapest)
}

impl Width {
    /// The cap now in force (`None`: none, or the learning is off).
    pub fn cap(&self, live: &Live) -> Option<usize> {
        if live.learn_width {
            self.cap.map(|w| w.min(live.max_seats))
        } else {
            None
        }
    }

    /// The most rows the policy plans a turn for: `max_seats`, capped by the
    /// learned width when learning is on.
    pub fn planned(&self, live: &Live) -> usize {
        self.cap(live).unwrap_or(live.max_seats)
    }

    /// The most rows the next turn seats, with `queued` seats queued: the
    /// planned width, or a probe's (step 4).
    pub fn next_turn(&mut self, live: &Live, times: &LearnedTurnTimes, queued: usize) -> usize {
        if !live.learn_width {
            return live.max_seats;
        }
        if self.turns.is_multiple_of(REREAD_EVERY) {
            self.cap = learned(times, live.max_seats);
            self.narrowest = (1..=live.max_seats).find(|w| times.counted(*w, MIN_SAMPLES).is_some());
        }
        self.turns += 1;
        let queued = queued.clamp(1, live.max_seats);
        let mut width = self.planned(live).min(queued);
        if width < queued && !splitting_pays(times, width, queued) {
            width = queued;
        }
        let half = width / 2;
        // This width ran often enough to count and nothing up to its half
        // does: only a probe down learns whether narrower pays.
        if half >= 1 && self.narrowest.is_none_or(|n| n > half) && times.counted(width, MIN_SAMPLES).is_some() {
            return half;
        }
        match self.cap(live) {
            // Only a turn cut to the cap probes past it: one widened to all
            // queued (step 5) already seats more.
            Some(cap) if width == cap && cap < live.max_seats && self.turns.is_multiple_of(PROBE_EVERY) => cap + 1,
            _ => width,
        }
    }
}

/// Whether serving `queued` seats in turns of `width` (and one of the
/// rest) costs less than one turn of them all, by the learned times (step
/// 5): a cap barely cheaper per row than the width queued would leave a
/// remainder to a narrow, dear turn.
fn splitting_pays(times: &LearnedTurnTimes, width: usize, queued: usize) -> bool {
    let (Some(whole), Some(part)) = (times.estimate(queued), times.estimate(width)) else {
        return true;
    };
    let rest = queued % width;
    let rest = if rest == 0 {
        Duration::ZERO
    } else {
        times.estimate(rest).unwrap_or(Duration::ZERO)
    };
    part * (queued / width) as u32 + rest < whole
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::TurnPolicy;

    fn live(max_seats: usize) -> Live {
        Live {
            policy: TurnPolicy::Immediate,
            max_seats,
            learn_width: true,
        }
    }

    /// Turns of `cost(w)` at each width, `MIN_SAMPLES` times each.
    fn taught(widths: &[usize], cost: impl Fn(usize) -> u64) -> LearnedTurnTimes {
        let times = LearnedTurnTimes::new(64);
        for &w in widths {
            for _ in 0..MIN_SAMPLES {
                times.record(w, Duration::from_micros(cost(w)));
            }
        }
        times
    }

    /// A model cheaper per row the wider (a fixed cost per turn) is never
    /// capped, however many widths were seen.
    #[test]
    fn a_model_that_pays_wide_is_never_capped() {
        let times = taught(&[1, 2, 8, 16, 33, 64], |w| 20 + w as u64);
        assert_eq!(learned(&times, 64), None);
        let mut width = Width::default();
        assert_eq!(width.next_turn(&live(64), &times, 64), 64);
        assert_eq!(width.planned(&live(64)), 64);
    }

    /// A model dearer per row the wider (a cost per pair of rows) is capped
    /// at its cheapest width, and the policy plans for no more.
    #[test]
    fn a_model_slower_batched_is_capped_at_its_cheapest_width() {
        // 30 + 10 w² µs a turn: per row 30/w + 10w, lowest at w = 2 (35
        // µs; 1 and 3 cost 40).
        let times = taught(&[1, 2, 3, 4, 8, 16], |w| 30 + 10 * (w * w) as u64);
        assert_eq!(learned(&times, 64), Some(2));
        let mut width = Width::default();
        assert_eq!(width.next_turn(&live(64), &times, 16), 2);
        assert_eq!(width.planned(&live(64)), 2);
        assert_eq!(width.planned(&live(2)), 2, "never past max_seats");
        let off = Live {
            learn_width: false,
            ..live(64)
        };
        assert_eq!(width.planned(&off), 64, "off: max_seats");
        assert_eq!(width.next_turn(&off, &times, 16), 64);
    }

    /// Widths within the tolerance count as equal: the widest of them wins,
    /// so noise never narrows a turn.
    #[test]
    fn near_equal_costs_keep_the_wider_width() {
        let times = taught(&[16, 32], |w| if w == 16 { 160 } else { 335 });
        assert_eq!(learned(&times, 64), None);
    }

    /// A runner that only ever ran 16 wide probes 8, then 4 while narrower
    /// keeps paying, and stops probing down once a half costs more per row.
    #[test]
    fn probes_walk_down_while_narrower_pays() {
        let times = taught(&[16], |w| 4 * (w * w) as u64);
        assert_eq!(Width::default().next_turn(&live(64), &times, 16), 8);
        // A width that never counted is not probed below.
        assert_eq!(Width::default().next_turn(&live(64), &times, 12), 12);
        let times = taught(&[16, 8], |w| 4 * (w * w) as u64);
        // 8 counts and is cheaper: the cap is 8, its half 4 is probed.
        assert_eq!(Width::default().next_turn(&live(64), &times, 16), 4);
        // A model that pays wide: 8 costs more per row than 16, no cap, and
        // 4 is not probed.
        let times = taught(&[16, 8], |w| 100 + w as u64);
        assert_eq!(Width::default().next_turn(&live(64), &times, 16), 16);
    }

    /// A cap barely cheaper per row than the width queued is not worth the
    /// dear turn of the remainder: 16 queued under a cap of 15 sit together.
    #[test]
    fn a_turn_is_cut_only_where_the_split_pays() {
        let times = taught(&[1, 15, 16], |w| match w {
            1 => 50,
            15 => 100,
            _ => 150,
        });
        assert_eq!(learned(&times, 64), Some(15));
        let mut width = Width::default();
        assert_eq!(width.next_turn(&live(64), &times, 16), 16);
        assert_eq!(width.next_turn(&live(64), &times, 15), 15);
    }

    /// While capped, one turn in `PROBE_EVERY` seats one row more than the
    /// cap, never more.
    #[test]
    fn a_capped_runner_probes_one_row_wider_now_and_then() {
        let times = taught(&[1, 2, 3, 4, 8, 16], |w| 30 + 10 * (w * w) as u64);
        let mut width = Width::default();
        let widths: Vec<usize> = (0..PROBE_EVERY * 4)
            .map(|_| width.next_turn(&live(64), &times, 16))
            .collect();
        assert_eq!(widths.iter().filter(|w| **w == 3).count(), 4);
        assert!(widths.iter().all(|w| *w == 2 || *w == 3), "{widths:?}");
    }
}
