//! One error type per operation of the table.

use std::fmt;

use crate::LaneId;

/// [`LaneTable::new`](crate::LaneTable::new) was asked for zero lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewTableError;

impl fmt::Display for NewTableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a laned state needs one lane at least")
    }
}

impl std::error::Error for NewTableError {}

/// [`LaneTable::give_back`](crate::LaneTable::give_back) was handed a lane no
/// stream holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiveBackError {
    /// The lane handed back.
    pub lane: LaneId,
    /// The table's lane count.
    pub max_lanes: usize,
}

impl fmt::Display for GiveBackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lane {} of {} is not taken, so it cannot be given back",
            self.lane.0, self.max_lanes
        )
    }
}

impl std::error::Error for GiveBackError {}

/// [`LaneTable::take_lane`](crate::LaneTable::take_lane) was asked for a lane
/// it cannot hand out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeLaneError {
    /// The lane is held already.
    Taken {
        /// The lane asked for.
        lane: LaneId,
    },
    /// The lane is past the table.
    OutOfRange {
        /// The lane asked for.
        lane: LaneId,
        /// The table's lane count.
        max_lanes: usize,
    },
}

impl fmt::Display for TakeLaneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TakeLaneError::Taken { lane } => write!(f, "{lane} is already taken"),
            TakeLaneError::OutOfRange { lane, max_lanes } => {
                write!(f, "{lane} is past the {max_lanes} lanes of the table")
            }
        }
    }
}

impl std::error::Error for TakeLaneError {}

/// [`LaneTable::seat`](crate::LaneTable::seat) was handed a seating that would
/// break a stream's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeatError {
    /// A seat sits in a lane no stream holds.
    NotTaken {
        /// The seat's index in the seating.
        seat: usize,
        /// The lane it sits in.
        lane: LaneId,
    },
    /// One lane takes two seats of one turn.
    Twice {
        /// The lane seated twice.
        lane: LaneId,
        /// The index of its first seat in the seating.
        first: usize,
        /// The index of its second seat in the seating.
        second: usize,
    },
}

impl fmt::Display for SeatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SeatError::NotTaken { seat, lane } => {
                write!(f, "seat {seat} sits in {lane}, which no stream holds")
            }
            SeatError::Twice { lane, first, second } => {
                write!(f, "{lane} takes seats {first} and {second} of one turn")
            }
        }
    }
}

impl std::error::Error for SeatError {}
