//! A state machine over the table and the filler: streams take and give back
//! lanes, call with one or several seats, and turns are filled and completed,
//! against a reference model of who holds what and what is queued.

use std::collections::BTreeMap;

use lane_table::{fill, LaneId, LaneTable, SeatInfo};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// A new stream asks for a lane.
    Take,
    /// The `n`th live stream (modulo) ends: its queued seats are dropped and
    /// its lane goes back.
    GiveBack(usize),
    /// The `n`th live stream calls with `width` seats of group `group`.
    Call { stream: usize, width: usize, group: u8 },
    /// A turn of at most `max_seats` is filled and completed.
    Turn { max_seats: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Take),
        1 => any::<usize>().prop_map(Op::GiveBack),
        4 => (any::<usize>(), 1..4usize, 0..2u8)
            .prop_map(|(stream, width, group)| Op::Call { stream, width, group }),
        4 => (1..6usize).prop_map(|max_seats| Op::Turn { max_seats }),
    ]
}

/// The reference: which stream holds which lane, and the queue of seats.
#[derive(Default)]
struct Model {
    /// stream id -> lane it holds.
    streams: BTreeMap<u64, LaneId>,
    next_stream: u64,
    queue: Vec<SeatInfo<u8>>,
    next_call: u64,
}

/// Runs `ops` on a table of `max_lanes`, checking every rule after each step,
/// then drains the queue with turns of `max_seats` 1 and checks it empties.
fn check(max_lanes: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut table = LaneTable::new(max_lanes).unwrap();
    let mut model = Model::default();
    for op in ops {
        step(&mut table, &mut model, op)?;
        let held: Vec<LaneId> = table.taken_lanes().collect();
        let mut expected: Vec<LaneId> = model.streams.values().copied().collect();
        expected.sort();
        prop_assert_eq!(&held, &expected, "the table and the model disagree on held lanes");
        let mut distinct = expected.clone();
        distinct.dedup();
        prop_assert_eq!(distinct.len(), expected.len(), "a lane is held by two streams");
    }
    // Every queued seat is eventually served, even by the narrowest turns.
    let bound = model.queue.len() + 1;
    for _ in 0..bound {
        if model.queue.is_empty() {
            break;
        }
        step(&mut table, &mut model, &Op::Turn { max_seats: 1 })?;
    }
    prop_assert!(model.queue.is_empty(), "{} seats never served", model.queue.len());
    Ok(())
}

fn nth_stream(model: &Model, n: usize) -> Option<(u64, LaneId)> {
    if model.streams.is_empty() {
        return None;
    }
    model.streams.iter().nth(n % model.streams.len()).map(|(s, l)| (*s, *l))
}

fn step(table: &mut LaneTable, model: &mut Model, op: &Op) -> Result<(), TestCaseError> {
    match op {
        // One lane stays free for borrowing, as the runner keeps it, so that
        // the rows of wide calls always progress.
        Op::Take if model.streams.len() + 1 >= table.max_lanes() => {}
        Op::Take => {
            let lowest_free = (0..table.max_lanes())
                .map(LaneId)
                .find(|l| !model.streams.values().any(|h| h == l));
            let took = table.take();
            prop_assert_eq!(took, lowest_free, "take() must hand out the lowest free lane");
            if let Some(lane) = took {
                model.streams.insert(model.next_stream, lane);
                model.next_stream += 1;
            }
        }
        Op::GiveBack(n) => {
            if let Some((stream, lane)) = nth_stream(model, *n) {
                model.queue.retain(|s| s.lane != lane);
                model.streams.remove(&stream);
                prop_assert!(table.give_back(lane).is_ok());
                prop_assert!(table.give_back(lane).is_err(), "a lane was released twice");
            }
        }
        Op::Call { stream, width, group } => {
            if let Some((_, lane)) = nth_stream(model, *stream) {
                let call = model.next_call;
                model.next_call += 1;
                for place in 0..*width {
                    model.queue.push(SeatInfo {
                        call,
                        place,
                        lane,
                        group: *group,
                    });
                }
            }
        }
        Op::Turn { max_seats } => turn(table, model, *max_seats)?,
    }
    Ok(())
}

fn turn(table: &mut LaneTable, model: &mut Model, max_seats: usize) -> Result<(), TestCaseError> {
    let free_before: Vec<LaneId> = table.free_lanes().collect();
    let fill = fill(&model.queue, table, max_seats);
    let seated = fill.seated();
    let queue = &model.queue;

    // Every queued seat is either seated or waiting, once.
    let mut all: Vec<usize> = seated
        .iter()
        .map(|p| p.queue_ix)
        .chain(fill.waiting().iter().copied())
        .collect();
    all.sort();
    prop_assert_eq!(all, (0..queue.len()).collect::<Vec<_>>());
    prop_assert!(
        seated.windows(2).all(|w| w[0].queue_ix < w[1].queue_ix),
        "seat order is queue order"
    );

    // Progress: a non-empty queue seats its oldest seat.
    if !queue.is_empty() {
        prop_assert_eq!(seated.first().map(|p| p.queue_ix), Some(0), "the oldest seat waits");
    }
    prop_assert!(seated.len() <= max_seats.min(table.max_lanes()));
    // A remainder of a split call never sits in its caller's lane.
    for placed in seated {
        if queue[placed.queue_ix].place > 0 {
            prop_assert!(placed.borrowed && placed.lane != queue[placed.queue_ix].lane);
        }
    }

    // One seat per lane; the seating is accepted by the table once borrowed
    // lanes are taken; borrowed lanes were free.
    for lane in fill.borrowed() {
        prop_assert!(free_before.contains(lane), "borrowed {lane}, which was held");
        table.take_lane(*lane).unwrap();
    }
    let lanes: Vec<LaneId> = seated.iter().map(|p| p.lane).collect();
    prop_assert!(table.seat(&lanes).is_ok(), "{:?}", table.seat(&lanes));

    for (i, placed) in seated.iter().enumerate() {
        let seat = &queue[placed.queue_ix];
        // One group per turn.
        prop_assert_eq!(seat.group, queue[seated[0].queue_ix].group, "two groups share a turn");
        // Leads (place 0) sit in their caller's lane; later seats borrow.
        let lead = seat.place == 0;
        prop_assert_eq!(placed.borrowed, !lead);
        if lead {
            prop_assert_eq!(placed.lane, seat.lane);
        }
        // FIFO per call: a seated seat's predecessor in its call, if still
        // queued, is seated too.
        let ix = placed.queue_ix;
        if ix > 0 && queue[ix - 1].call == seat.call {
            prop_assert!(
                i > 0 && seated.iter().any(|p| p.queue_ix == ix - 1),
                "a call's seats overtook each other"
            );
        }
        // A stream's calls in order: no older call on this lane keeps its
        // lead queued (its remainder rows are independent of the stream).
        let lane = seat.lane;
        let older_waits = fill.waiting().iter().any(|&w| {
            w < placed.queue_ix && queue[w].lane == lane && queue[w].call != seat.call && queue[w].place == 0
        });
        prop_assert!(!older_waits, "a call overtook an older call of its stream");
    }

    // A wide call never delays a one-seat lead that could have sat.
    if fill.seated().iter().any(|p| p.borrowed && p.queue_ix != 0) {
        let group = queue[seated[0].queue_ix].group;
        for &w in fill.waiting() {
            let seat = &queue[w];
            let lead = seat.place == 0;
            let lane_busy = (0..w).any(|o| queue[o].lane == seat.lane);
            prop_assert!(
                !(lead && seat.group == group && !lane_busy),
                "lead {w} waits while a borrowed seat runs"
            );
        }
    }

    // Complete the turn: seated seats leave the queue, borrowed lanes go back.
    for lane in fill.borrowed() {
        table.give_back(*lane).unwrap();
    }
    let waiting: Vec<SeatInfo<u8>> = fill.waiting().iter().map(|&w| queue[w].clone()).collect();
    model.queue = waiting;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn the_table_and_the_filler_keep_every_rule(max_lanes in 2..6usize, ops in prop::collection::vec(op(), 0..60)) {
        check(max_lanes, &ops)?;
    }
}

/// Pinned: the tract diagram's wide call beside a one-seat call.
#[test]
fn pinned_wide_call_beside_a_one_seat_call() {
    let ops = [
        Op::Take,
        Op::Take,
        Op::Call {
            stream: 0,
            width: 5,
            group: 0,
        },
        Op::Call {
            stream: 1,
            width: 1,
            group: 0,
        },
        Op::Turn { max_seats: 2 },
        Op::Turn { max_seats: 4 },
    ];
    check(4, &ops).unwrap();
}

/// Pinned: a stream's two calls of different groups, interleaved with another's.
#[test]
fn pinned_groups_and_order_within_a_stream() {
    let ops = [
        Op::Take,
        Op::Take,
        Op::Call {
            stream: 0,
            width: 1,
            group: 1,
        },
        Op::Call {
            stream: 1,
            width: 2,
            group: 0,
        },
        Op::Call {
            stream: 1,
            width: 1,
            group: 1,
        },
        Op::GiveBack(0),
        Op::Take,
        Op::Turn { max_seats: 3 },
    ];
    check(3, &ops).unwrap();
}
