//! The turn filler: which queued seats the coming turn runs, as a pure
//! function over the queue and the table.
//!
//! The rules, each kept by [`fill_into`]:
//! - one seat per lane per turn (a stream's state is sequential);
//! - at most `max_seats` seats, clamped to the table's lanes;
//! - oldest first, and one group key per turn: the oldest seat's (seats
//!   disagreeing on the model's shared inputs cannot share a turn);
//! - a call's first seat (place 0, its *lead*) sits in the lane its caller
//!   holds, so it continues the stream; the call's later seats *borrow* free
//!   lanes, lowest first (the caller resets them), also when a call wider
//!   than what is free is split at the turn boundary: a remainder never sits
//!   in the caller's lane, whose state belongs to the stream. A caller that
//!   wants every wide call to progress keeps a lane free for borrowing;
//! - the oldest seat is always seated (so every seat is served eventually);
//!   then leads are seated before any other borrowed seat, so a wide call
//!   never makes a one-seat call behind it wait a turn it would have fit in;
//! - a stream's calls run in order: while a lead waits, no later call on the
//!   same lane is seated, and a call's seats are seated in place order.

use crate::{LaneId, LaneTable};

/// What the filler needs to know of one queued seat.
///
/// The seats of one call must sit next to each other in the queue, in place
/// order (which is what queueing a call's seats at once gives). A seat's
/// place is its row in the call; place 0 is the one continuing the stream.
pub trait QueuedSeat {
    /// Seats share a turn only when their groups are equal.
    type Group: PartialEq + ?Sized;
    /// The call this seat answers; unique per call.
    fn call(&self) -> u64;
    /// The seat's place in its call: 0 for the first row the caller fed.
    fn place(&self) -> usize;
    /// The lane the seat's caller holds.
    fn lane(&self) -> LaneId;
    /// Seats share a turn only with seats of an equal group.
    fn group(&self) -> &Self::Group;
}

/// A queued seat as plain data, for callers with nothing to attach to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeatInfo<G> {
    /// The call this seat answers; unique per call.
    pub call: u64,
    /// The seat's place in its call: 0 for the first row the caller fed.
    pub place: usize,
    /// The lane the seat's caller holds.
    pub lane: LaneId,
    /// Seats share a turn only with seats of an equal group.
    pub group: G,
}

impl<G: PartialEq> QueuedSeat for SeatInfo<G> {
    type Group = G;
    fn call(&self) -> u64 {
        self.call
    }
    fn place(&self) -> usize {
        self.place
    }
    fn lane(&self) -> LaneId {
        self.lane
    }
    fn group(&self) -> &G {
        &self.group
    }
}

/// One seat of the coming turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// Its index in the queue handed to the filler.
    pub queue_ix: usize,
    /// The lane it sits in: its caller's, or a borrowed one.
    pub lane: LaneId,
    /// Whether `lane` is borrowed (free before the turn, reset for it).
    pub borrowed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Waiting,
    Own,
    Borrowed(LaneId),
}

/// The filler's answer: the seats the turn runs (in seat order, which is queue
/// order), the lanes it borrows, and the queue indices that stay queued. Its
/// buffers are reused by [`fill_into`], so a steady worker allocates nothing.
#[derive(Debug, Clone, Default)]
pub struct Fill {
    seated: Vec<Placed>,
    borrowed: Vec<LaneId>,
    waiting: Vec<usize>,
    /// Scratch, per lane: seated this turn.
    used: Vec<bool>,
    /// Scratch, per lane: a lead on it waits, so later calls on it wait too.
    blocked: Vec<bool>,
    /// Scratch, per queued seat.
    slots: Vec<Slot>,
}

impl Fill {
    /// The seats of the turn, in seat order.
    pub fn seated(&self) -> &[Placed] {
        &self.seated
    }

    /// The free lanes the turn borrows, lowest first. The caller takes them
    /// ([`LaneTable::take_lane`]), resets them, and gives them back after.
    pub fn borrowed(&self) -> &[LaneId] {
        &self.borrowed
    }

    /// Queue indices that stay queued, oldest first.
    pub fn waiting(&self) -> &[usize] {
        &self.waiting
    }
}

/// The seats the coming turn runs. See [`fill_into`] for the rules.
pub fn fill<S: QueuedSeat>(queue: &[S], table: &LaneTable, max_seats: usize) -> Fill {
    let mut out = Fill::default();
    fill_into(queue, table, max_seats, &mut out);
    out
}

/// The seats the coming turn runs, written into `out` (its buffers reused).
///
/// `queue` is oldest first. Seats whose lane is not held are never seated:
/// the caller drops the seats of a stream before giving its lane back.
pub fn fill_into<S: QueuedSeat>(queue: &[S], table: &LaneTable, max_seats: usize, out: &mut Fill) {
    let lanes = table.max_lanes();
    out.seated.clear();
    out.borrowed.clear();
    out.waiting.clear();
    out.used.clear();
    out.used.resize(lanes, false);
    out.blocked.clear();
    out.blocked.resize(lanes, false);
    out.slots.clear();
    out.slots.resize(queue.len(), Slot::Waiting);
    let cap = max_seats.min(lanes);
    // The turn's group is the oldest seatable seat's.
    let Some(oldest) = queue.iter().find(|s| table.is_taken(s.lane())) else {
        out.waiting.extend(0..queue.len());
        return;
    };
    let group = oldest.group();
    let mut count = 0;

    // The oldest seat first, whatever it is, so that every seat is served
    // eventually (a remainder of a wide call included).
    let mut next_free = 0;
    if queue[0].place() != 0 && table.is_taken(queue[0].lane()) && cap > 0 {
        while next_free < lanes && table.is_taken(LaneId(next_free)) {
            next_free += 1;
        }
        if next_free < lanes {
            out.used[next_free] = true;
            out.borrowed.push(LaneId(next_free));
            out.slots[0] = Slot::Borrowed(LaneId(next_free));
            count += 1;
        }
    }

    // Then leads (place 0), oldest first, each in its caller's lane.
    for (ix, seat) in queue.iter().enumerate() {
        if seat.place() != 0 {
            continue;
        }
        let lane = seat.lane().0;
        if !table.is_taken(seat.lane()) {
            continue;
        }
        if count < cap && seat.group() == group && !out.used[lane] && !out.blocked[lane] {
            out.slots[ix] = Slot::Own;
            out.used[lane] = true;
            count += 1;
        } else {
            out.blocked[lane] = true;
        }
    }

    // Then the later seats of calls, oldest first, each once the seat before
    // it in its call is served (this turn or an earlier one), in the lowest
    // free lane nobody sits in.
    for ix in 0..queue.len() {
        if count == cap {
            break;
        }
        let seat = &queue[ix];
        if seat.place() == 0 || out.slots[ix] != Slot::Waiting || seat.group() != group || !table.is_taken(seat.lane())
        {
            continue;
        }
        let before_served = ix == 0 || queue[ix - 1].call() != seat.call() || out.slots[ix - 1] != Slot::Waiting;
        if !before_served {
            continue;
        }
        while next_free < lanes && (table.is_taken(LaneId(next_free)) || out.used[next_free]) {
            next_free += 1;
        }
        if next_free == lanes {
            break;
        }
        let lane = LaneId(next_free);
        out.used[next_free] = true;
        out.borrowed.push(lane);
        out.slots[ix] = Slot::Borrowed(lane);
        count += 1;
    }

    for (queue_ix, slot) in out.slots.iter().enumerate() {
        match *slot {
            Slot::Waiting => out.waiting.push(queue_ix),
            Slot::Own => out.seated.push(Placed {
                queue_ix,
                lane: queue[queue_ix].lane(),
                borrowed: false,
            }),
            Slot::Borrowed(lane) => out.seated.push(Placed {
                queue_ix,
                lane,
                borrowed: true,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seat(call: u64, place: usize, lane: usize, group: u8) -> SeatInfo<u8> {
        SeatInfo {
            call,
            place,
            lane: LaneId(lane),
            group,
        }
    }

    /// A table of `max` lanes with lanes `0..held` taken.
    fn table(max: usize, held: usize) -> LaneTable {
        let mut table = LaneTable::new(max).unwrap();
        for _ in 0..held {
            table.take();
        }
        table
    }

    fn seated_lanes(fill: &Fill) -> Vec<(usize, usize)> {
        fill.seated().iter().map(|p| (p.queue_ix, p.lane.0)).collect()
    }

    #[test]
    fn one_seat_per_lane_per_turn() {
        // Two calls of the same stream: the second waits for the next turn.
        let queue = [seat(1, 0, 0, 0), seat(2, 0, 0, 0), seat(3, 0, 1, 0)];
        let fill = fill(&queue, &table(4, 2), 8);
        assert_eq!(seated_lanes(&fill), vec![(0, 0), (2, 1)]);
        assert_eq!(fill.waiting(), &[1]);
    }

    #[test]
    fn at_most_max_seats_oldest_first() {
        let queue: Vec<_> = (0..4).map(|s| seat(s, 0, s as usize, 0)).collect();
        let fill = fill(&queue, &table(4, 4), 3);
        assert_eq!(seated_lanes(&fill), vec![(0, 0), (1, 1), (2, 2)]);
        assert_eq!(fill.waiting(), &[3]);
        // max_seats is clamped to the lanes.
        let fill = super::fill(&queue, &table(4, 4), 100);
        assert_eq!(fill.seated().len(), 4);
    }

    #[test]
    fn one_group_per_turn_the_oldest_seats() {
        let queue = [seat(1, 0, 0, 7), seat(2, 0, 1, 8), seat(3, 0, 2, 7)];
        let fill = fill(&queue, &table(3, 3), 8);
        assert_eq!(seated_lanes(&fill), vec![(0, 0), (2, 2)]);
        assert_eq!(fill.waiting(), &[1]);
    }

    #[test]
    fn a_wide_call_borrows_free_lanes_and_splits_at_the_boundary() {
        // The diagram of tract's lanes module: 4 lanes, A holds 0, B holds 1,
        // A asks for 5 seats, B for one.
        let mut queue: Vec<_> = (0..5).map(|p| seat(1, p, 0, 0)).collect();
        queue.push(seat(2, 0, 1, 0));
        let fill = fill(&queue, &table(4, 2), 8);
        assert_eq!(seated_lanes(&fill), vec![(0, 0), (1, 2), (2, 3), (5, 1)]);
        assert_eq!(fill.borrowed(), &[LaneId(2), LaneId(3)]);
        assert_eq!(fill.waiting(), &[3, 4]);
        assert!(fill.seated()[1].borrowed && !fill.seated()[0].borrowed);
        // Next turn: the remainder borrows again (lanes 2 and 3); lane 0
        // carries A's stream and is never handed to a later row.
        let queue = [seat(1, 3, 0, 0), seat(1, 4, 0, 0)];
        let fill = super::fill(&queue, &table(4, 2), 8);
        assert_eq!(seated_lanes(&fill), vec![(0, 2), (1, 3)]);
        assert!(fill.seated().iter().all(|p| p.borrowed));
    }

    #[test]
    fn a_wide_call_never_delays_a_one_seat_call_behind_it() {
        // max_seats 2: A's lead and B fit; A's second seat waits, not B.
        let queue = [seat(1, 0, 0, 0), seat(1, 1, 0, 0), seat(2, 0, 1, 0)];
        let fill = fill(&queue, &table(4, 2), 2);
        assert_eq!(seated_lanes(&fill), vec![(0, 0), (2, 1)]);
        assert_eq!(fill.waiting(), &[1]);
    }

    #[test]
    fn a_stream_keeps_its_calls_in_order() {
        // Call 1 on lane 0 is of another group and waits; call 3, also on
        // lane 0, must not overtake it.
        let queue = [seat(9, 0, 1, 5), seat(1, 0, 0, 6), seat(3, 0, 0, 5)];
        let fill = fill(&queue, &table(2, 2), 8);
        assert_eq!(seated_lanes(&fill), vec![(0, 1)]);
        assert_eq!(fill.waiting(), &[1, 2]);
    }

    #[test]
    fn seats_of_released_lanes_are_not_seated() {
        let queue = [seat(1, 0, 1, 0), seat(2, 0, 0, 0)];
        let fill = fill(&queue, &table(2, 1), 8);
        assert_eq!(seated_lanes(&fill), vec![(1, 0)]);
    }

    #[test]
    fn nothing_to_seat_from_an_empty_queue() {
        let queue: [SeatInfo<u8>; 0] = [];
        let fill = fill(&queue, &table(2, 1), 8);
        assert!(fill.seated().is_empty() && fill.waiting().is_empty());
    }
}
