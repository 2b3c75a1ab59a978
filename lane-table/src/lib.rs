//! The bookkeeping of one laned state, and the decision of what a turn seats.
//!
//! A laned state serves many streams at once: each stream holds a *lane* (a
//! row of the state's per-stream buffers) and each *turn* runs the model once
//! for the streams that have a pulse queued, one *seat* (a row of the turn's
//! tensors) per stream. This crate is that bookkeeping as plain data: it knows
//! nothing about tract, threads or time, so every rule it keeps is testable
//! with nothing but values.
//!
//! ```
//! use lane_table::{fill, LaneTable, SeatInfo};
//!
//! let mut table = LaneTable::new(4)?;
//! let a = table.take().unwrap(); // lane 0
//! let b = table.take().unwrap(); // lane 1
//! // A asks for two rows at once, B for one; all agree on the shared inputs (group 0).
//! let queue = [
//!     SeatInfo { call: 7, place: 0, lane: a, group: 0 },
//!     SeatInfo { call: 7, place: 1, lane: a, group: 0 },
//!     SeatInfo { call: 8, place: 0, lane: b, group: 0 },
//! ];
//! let turn = fill(&queue, &table, 8);
//! assert_eq!(turn.seated().len(), 3);
//! // A's second row borrows the lowest free lane.
//! assert_eq!(turn.borrowed(), &[lane_table::LaneId(2)]);
//! assert!(turn.waiting().is_empty());
//! # Ok::<(), lane_table::NewTableError>(())
//! ```

#![warn(missing_docs)]

mod err;
mod fill;

pub use err::{GiveBackError, NewTableError, SeatError, TakeLaneError};
pub use fill::{fill, fill_into, Fill, Placed, QueuedSeat, SeatInfo};

/// Where one stream's state sits inside a laned state: an index on the lane
/// axis (axis 0) of the state's per-stream buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LaneId(pub usize);

impl std::fmt::Display for LaneId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lane {}", self.0)
    }
}

/// Which lanes of one laned state are held by a stream.
///
/// Taking a lane does not clear it: whoever owns the state resets a lane
/// before handing it to a new stream, since that writes the state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LaneTable {
    /// One flag per lane, true while the lane is taken. The length is the
    /// state's lane count, fixed for its life.
    taken: Vec<bool>,
    /// How many flags are true, kept so `taken()` and `free()` are O(1).
    count: usize,
}

impl LaneTable {
    /// A table of `max_lanes` free lanes. A state with no lane serves nothing,
    /// so 0 is refused.
    pub fn new(max_lanes: usize) -> Result<LaneTable, NewTableError> {
        if max_lanes == 0 {
            return Err(NewTableError);
        }
        Ok(LaneTable {
            taken: vec![false; max_lanes],
            count: 0,
        })
    }

    /// The extent of the lane axis, fixed for the life of the state.
    pub fn max_lanes(&self) -> usize {
        self.taken.len()
    }

    /// How many lanes are held.
    pub fn taken(&self) -> usize {
        self.count
    }

    /// How many lanes are free.
    pub fn free(&self) -> usize {
        self.max_lanes() - self.count
    }

    /// Whether `lane` is held. A lane past the table is never held.
    pub fn is_taken(&self, lane: LaneId) -> bool {
        self.taken.get(lane.0).copied().unwrap_or(false)
    }

    /// Take the lowest free lane, `None` when all are held. Lowest first, so
    /// a full turn seats a run of consecutive lanes.
    pub fn take(&mut self) -> Option<LaneId> {
        let lane = self.taken.iter().position(|t| !t)?;
        self.taken[lane] = true;
        self.count += 1;
        Some(LaneId(lane))
    }

    /// Take one given lane, which must be free: how a turn marks the lanes it
    /// borrows (see [`Fill::borrowed`]).
    pub fn take_lane(&mut self, lane: LaneId) -> Result<(), TakeLaneError> {
        match self.taken.get(lane.0) {
            None => Err(TakeLaneError::OutOfRange {
                lane,
                max_lanes: self.max_lanes(),
            }),
            Some(true) => Err(TakeLaneError::Taken { lane }),
            Some(false) => {
                self.taken[lane.0] = true;
                self.count += 1;
                Ok(())
            }
        }
    }

    /// Hand `lane` back for another stream. Giving back a lane that is not
    /// held is an error, so a lane is never released twice.
    pub fn give_back(&mut self, lane: LaneId) -> Result<(), GiveBackError> {
        if !self.is_taken(lane) {
            return Err(GiveBackError {
                lane,
                max_lanes: self.max_lanes(),
            });
        }
        self.taken[lane.0] = false;
        self.count -= 1;
        Ok(())
    }

    /// The free lanes, lowest first.
    pub fn free_lanes(&self) -> impl Iterator<Item = LaneId> + '_ {
        self.taken
            .iter()
            .enumerate()
            .filter(|(_, t)| !**t)
            .map(|(ix, _)| LaneId(ix))
    }

    /// The held lanes, lowest first.
    pub fn taken_lanes(&self) -> impl Iterator<Item = LaneId> + '_ {
        self.taken
            .iter()
            .enumerate()
            .filter(|(_, t)| **t)
            .map(|(ix, _)| LaneId(ix))
    }

    /// A seating plan for `lanes` in seat order: seat `ix` of the turn reads
    /// and writes `lanes[ix]`. Every lane must be held (a stream that ended
    /// cannot be seated by a stale handle) and none may appear twice (a
    /// stream's state is sequential).
    pub fn seat(&self, lanes: &[LaneId]) -> Result<SeatingPlan, SeatError> {
        for (seat, lane) in lanes.iter().enumerate() {
            if !self.is_taken(*lane) {
                return Err(SeatError::NotTaken { seat, lane: *lane });
            }
            if let Some(first) = lanes[..seat].iter().position(|l| l == lane) {
                return Err(SeatError::Twice {
                    lane: *lane,
                    first,
                    second: seat,
                });
            }
        }
        Ok(SeatingPlan {
            lanes: lanes.to_vec(),
            max_lanes: self.max_lanes(),
        })
    }
}

/// The lanes one turn seats, in seat order, checked by [`LaneTable::seat`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SeatingPlan {
    lanes: Vec<LaneId>,
    max_lanes: usize,
}

impl SeatingPlan {
    /// The lane each seat sits in, in seat order.
    pub fn lanes(&self) -> &[LaneId] {
        &self.lanes
    }

    /// The extent of the lane axis of the state the plan was made for.
    pub fn max_lanes(&self) -> usize {
        self.max_lanes
    }

    /// Seats in the turn: the extent of axis 0 of its tensors.
    pub fn occupancy(&self) -> usize {
        self.lanes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_lanes_is_refused() {
        assert_eq!(
            LaneTable::new(0).unwrap_err().to_string(),
            "a laned state needs one lane at least"
        );
    }

    #[test]
    fn takes_the_lowest_free_lane() {
        let mut table = LaneTable::new(3).unwrap();
        assert_eq!(table.take(), Some(LaneId(0)));
        assert_eq!(table.take(), Some(LaneId(1)));
        table.give_back(LaneId(0)).unwrap();
        assert_eq!(table.take(), Some(LaneId(0)));
        assert_eq!(table.take(), Some(LaneId(2)));
        assert_eq!(table.take(), None);
        assert_eq!(table.taken(), 3);
        assert_eq!(table.free(), 0);
    }

    #[test]
    fn gives_back_a_taken_lane_only_once() {
        let mut table = LaneTable::new(2).unwrap();
        let err = table.give_back(LaneId(0)).unwrap_err();
        assert_eq!(err.to_string(), "lane 0 of 2 is not taken, so it cannot be given back");
        table.take();
        table.give_back(LaneId(0)).unwrap();
        assert!(table.give_back(LaneId(0)).is_err());
        assert!(table.give_back(LaneId(9)).is_err());
        assert_eq!(table.taken(), 0);
    }

    #[test]
    fn takes_a_given_lane_only_when_free() {
        let mut table = LaneTable::new(2).unwrap();
        table.take_lane(LaneId(1)).unwrap();
        assert!(table.is_taken(LaneId(1)));
        assert_eq!(
            table.take_lane(LaneId(1)).unwrap_err().to_string(),
            "lane 1 is already taken"
        );
        assert_eq!(
            table.take_lane(LaneId(2)).unwrap_err().to_string(),
            "lane 2 is past the 2 lanes of the table"
        );
        assert_eq!(table.take(), Some(LaneId(0)));
    }

    #[test]
    fn seats_taken_lanes_in_order_and_none_twice() {
        let mut table = LaneTable::new(4).unwrap();
        for _ in 0..3 {
            table.take();
        }
        table.give_back(LaneId(1)).unwrap();
        let plan = table.seat(&[LaneId(2), LaneId(0)]).unwrap();
        assert_eq!(plan.lanes(), &[LaneId(2), LaneId(0)]);
        assert_eq!(plan.occupancy(), 2);
        assert_eq!(plan.max_lanes(), 4);
        assert_eq!(
            table.seat(&[LaneId(0), LaneId(1)]).unwrap_err().to_string(),
            "seat 1 sits in lane 1, which no stream holds"
        );
        assert_eq!(
            table.seat(&[LaneId(0), LaneId(2), LaneId(0)]).unwrap_err().to_string(),
            "lane 0 takes seats 0 and 2 of one turn"
        );
    }

    #[test]
    fn lists_free_and_taken_lanes() {
        let mut table = LaneTable::new(3).unwrap();
        table.take();
        table.take();
        table.give_back(LaneId(0)).unwrap();
        assert_eq!(table.free_lanes().collect::<Vec<_>>(), vec![LaneId(0), LaneId(2)]);
        assert_eq!(table.taken_lanes().collect::<Vec<_>>(), vec![LaneId(1)]);
    }
}

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
