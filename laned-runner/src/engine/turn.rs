//! The turn: seat what the filler picks from the queue, run the model once,
//! and land each seat's row with its call; on failure, fail those seats and
//! recover the state. It owns what only a turn uses (the fill, the seated
//! buffer, the wake list, the arrival rate it measures) and borrows the
//! engine's other parts for the turn's length ([`Parts`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lane_table::{fill_into, Fill, LaneId};
use tract_core::internal::*;

use crate::err::{RunError, RunErrorKind};
use crate::policy::{LearnedTurnTimes, TurnPolicy};
use crate::protocol::{Answer, CallResult, Live};
use crate::slot::Slot;
use crate::trace::event;
use crate::width::Width;

use super::model::{Failure, Model};
use super::queue::{QSeat, Queue};
use super::records::Records;
use super::streams::Streams;

/// The engine's parts a turn works on.
pub(super) struct Parts<'a> {
    pub(super) queue: &'a mut Queue,
    pub(super) streams: &'a mut Streams,
    pub(super) model: &'a mut Model,
    pub(super) records: &'a Records,
    pub(super) times: &'a LearnedTurnTimes,
    pub(super) width: &'a mut Width,
    pub(super) live: &'a Live,
    /// The shard's index, for the events.
    pub(super) shard: usize,
}

/// Seats served per second lately: in steady state, the arrival rate the
/// budget policy plans with.
#[derive(Default)]
struct Arrivals {
    /// Seats per turn and seconds between turn starts, each an exponential
    /// average over turns (weight 1/8); the rate is their ratio.
    averages: Option<(f64, f64)>,
    per_sec: f64,
    /// The start of the last turn.
    last_turn: Option<Instant>,
}

impl Arrivals {
    /// A turn of `seats` started at `started`.
    fn observe(&mut self, started: Instant, seats: usize) {
        let Some(last) = self.last_turn.replace(started) else {
            return;
        };
        // Seats and intervals averaged apart, the rate their ratio: an
        // average of each turn's seats / interval would be dominated by
        // the turns that follow another closely (a tiny interval), and
        // overstate the rate many times over.
        let dt = started.saturating_duration_since(last).as_secs_f64();
        let seats = seats as f64;
        let (avg_seats, avg_dt) = match self.averages {
            None => (seats, dt),
            Some((s, d)) => ((s * 7.0 + seats) / 8.0, (d * 7.0 + dt) / 8.0),
        };
        self.averages = Some((avg_seats, avg_dt));
        self.per_sec = avg_seats / avg_dt.max(1e-6);
    }
}

#[derive(Default)]
pub(super) struct Turn {
    fill: Fill,
    /// Reused buffer: the seats of the turn running, in seat order.
    seated: Vec<QSeat>,
    /// The turn's answered callers that sleep, woken together at its end.
    wakes: Vec<Arc<Slot<CallResult>>>,
    arrivals: Arrivals,
}

/// Withdraw call `id` if none of its seats was seated yet, answering it
/// with `why` (a cancel, a deadline); a call partly served completes.
pub(super) fn withdraw(queue: &mut Queue, streams: &mut Streams, id: u64, why: RunErrorKind) {
    let Some(pending) = queue.withdraw(id) else { return };
    // The stream called and was answered (cancelled) now: its idle time
    // starts here, as after any other answer.
    streams.touch(pending.lane, Instant::now());
    pending.slot.fill(Err(RunError::new(why)));
}

impl Turn {
    /// The arrival rate measured over the last turns, in seats a second.
    pub(super) fn arrivals_per_sec(&self) -> f64 {
        self.arrivals.per_sec
    }

    /// Run one turn from the head of the queue.
    pub(super) fn run(&mut self, on: Parts<'_>) {
        let Parts {
            queue,
            streams,
            model,
            records,
            times,
            width,
            live,
            shard,
        } = on;
        queue.sweep();
        if !queue.has_seats() || !model.is_open() {
            return;
        }
        let mut started;
        // The learned width (or a probe of it) caps the turn, below
        // `max_seats`; decided once, before the deadline passes below.
        let widest = width.next_turn(live, times, queue.len());
        records.learned_width(width.cap(live));
        loop {
            fill_into(queue.seats(), streams.table(), widest, &mut self.fill);
            if self.fill.seated().is_empty() {
                return;
            }
            started = Instant::now();
            // Whoever runs the turn (a combining caller serving others
            // included), a call past its deadline with no seat seated yet
            // is answered `DeadlineExceeded`, never seated late; then the
            // turn is picked again without it.
            // A call partly served already (a wide call's row 0 ran in an
            // earlier turn) completes: only calls none of whose rows ran
            // are withdrawn, so every pass withdraws at least one, or ends.
            let overdue = queue.overdue(&self.fill, started);
            if overdue.is_empty() {
                break;
            }
            for id in overdue {
                withdraw(queue, streams, id, RunErrorKind::DeadlineExceeded);
            }
            queue.sweep();
            if !queue.has_seats() {
                records.seats_queued(queue.len());
                return;
            }
        }
        self.arrivals.observe(started, self.fill.seated().len());
        // Split the queue: seated seats in seat order, the rest stay queued.
        let mut lanes: Vec<LaneId> = Vec::with_capacity(self.fill.seated().len());
        let mut seated = std::mem::take(&mut self.seated);
        queue.take_seated(&self.fill, &mut seated, &mut lanes);
        // Seated seats are queued no longer: the gauge says so for the
        // turn's length, not only after it.
        records.seats_queued(queue.len());
        for seat in &seated {
            records.queue_wait(started.saturating_duration_since(seat.queued));
        }
        let borrowed: Vec<LaneId> = self.fill.borrowed().to_vec();
        for lane in &borrowed {
            streams.borrow(*lane);
        }

        let ran = Instant::now();
        let result = model.run(&seated, &lanes, &borrowed);
        if result.is_ok() {
            times.record(seated.len(), ran.elapsed());
        }

        for lane in &borrowed {
            streams.give_back(*lane);
        }
        let occupancy = seated.len();
        let now = Instant::now();
        for seat in &seated {
            if seat.place == 0 {
                streams.touch(seat.lane, now);
            }
        }
        // Record before answering: a caller reading the metrics after its
        // answer sees its own turn counted.
        records.turn(occupancy, started.elapsed());
        records.seats_queued(queue.len());
        if let TurnPolicy::LatencyBudget { us } = live.policy {
            let budget = Duration::from_micros(us);
            let late = seated
                .iter()
                .filter(|s| now.saturating_duration_since(s.queued) > budget)
                .count();
            if late > 0 {
                records.deadline_misses(late);
            }
        }
        match result {
            Ok(outputs) => {
                let outputs = Arc::new(outputs);
                for (ix, seat) in seated.iter().enumerate() {
                    // Counted before any answer: a caller that has its
                    // answer finds its pulse in the stream's count.
                    if seat.place == 0 {
                        streams.fed(seat.lane);
                    }
                    let answer = Answer::Row {
                        turn: outputs.clone(),
                        seat: ix,
                    };
                    if let Some(pending) = queue.take_one_row(seat.call) {
                        if pending.slot.fill_quietly(Ok(answer)) {
                            self.wakes.push(pending.slot);
                        }
                    } else {
                        let row = answer.into_outputs(&model.iface().data_batch_out);
                        let row = row.map_err(|e| (e.to_string(), None));
                        land(queue, streams, model, seat.call, seat.place, row);
                    }
                }
                // One wake per sleeping caller would cost this thread a
                // system call each: wake them as a tree instead.
                crate::slot::wake_all(&mut self.wakes);
            }
            Err(Failure { why, touched, cause }) => {
                records.failed_turn(occupancy);
                event!(warn, shard, seats = occupancy, touched, "a turn failed: {why}");
                if touched {
                    recover(streams, model, records, &seated, &lanes, &borrowed, &why, shard);
                }
                for seat in &seated {
                    let failed = Err((why.clone(), cause.clone()));
                    land(queue, streams, model, seat.call, seat.place, failed);
                }
            }
        }
        records.lost_streams(streams.take_newly_lost());
        seated.clear();
        self.seated = seated;
    }
}

/// After a failed turn that touched the state: the seated streams' lanes
/// are reset and marked lost (their state may be half-advanced); if even
/// that fails (or panics), the state is rebuilt and every stream is lost.
#[allow(clippy::too_many_arguments)]
fn recover(
    streams: &mut Streams,
    model: &mut Model,
    records: &Records,
    seated: &[QSeat],
    lanes: &[LaneId],
    borrowed: &[LaneId],
    why: &str,
    shard: usize,
) {
    if model.clean(lanes) {
        for seat in seated {
            if !borrowed.contains(&seat.lane) {
                streams.lose(seat.lane, why.to_string());
            }
        }
        return;
    }
    rebuild(streams, model, records, why, shard);
}

/// A fresh state in place of the current one; the streams holding a lane
/// lose their state (`why` says why). If even that fails, the current state
/// is kept: its next turn fails too, and says so.
// `shard` only names the shard in the events.
#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
fn rebuild(streams: &mut Streams, model: &mut Model, records: &Records, why: &str, shard: usize) {
    if model.rebuild() {
        streams.lose_all(why);
        records.rebuilt_state();
        event!(
            error,
            shard,
            streams = streams.taken(),
            "the state was rebuilt, every stream on the shard lost its state: {why}"
        );
    } else {
        event!(error, shard, "the state could not be rebuilt, it is kept: {why}");
    }
}

/// One seat of call `id` landed; answer the call once all have.
fn land(
    queue: &mut Queue,
    streams: &mut Streams,
    model: &Model,
    id: u64,
    place: usize,
    outputs: Result<TVec<TValue>, (String, Option<Arc<TractError>>)>,
) {
    match outputs {
        Err((why, cause)) => {
            // The call's seats still queued go with it.
            let Some(pending) = queue.fail(id) else { return };
            // Its row 0 ran in an earlier turn and advanced the stream's
            // state, yet the call fails: the stream cannot go on as if it
            // had not been made.
            if pending.served[0].is_some() {
                streams.lose(
                    pending.lane,
                    format!("part of a wide call ran before the rest failed: {why}"),
                );
            }
            pending
                .slot
                .fill(Err(RunError::new(RunErrorKind::Turn(why)).caused_by(cause)));
        }
        Ok(outputs) => {
            if let Some(pending) = queue.land(id, place, outputs) {
                let answer = assemble(pending.served, &model.iface().data_batch_out);
                pending.slot.fill(answer.map(Answer::Outputs));
            }
        }
    }
}

/// A call's answer from its seats' outputs: the batched ones stacked back in
/// place order, the shared ones as the first seat got them.
fn assemble(served: TVec<Option<TVec<TValue>>>, batch_out: &[bool]) -> Result<TVec<TValue>, RunError> {
    let served: Vec<TVec<TValue>> = served.into_iter().map(|s| s.expect("every seat landed")).collect();
    if served.len() == 1 {
        return Ok(served.into_iter().next().expect("one"));
    }
    let mut answer = TVec::new();
    for ix in 0..served[0].len() {
        if batch_out.get(ix).copied().unwrap_or(false) {
            let rows: TVec<&Tensor> = served.iter().map(|s| &*s[ix]).collect();
            let stacked = Tensor::stack_tensors(0, &rows)
                .map_err(|e| RunError::new(RunErrorKind::Turn(format!("stacking output {ix}: {e:#}"))))?;
            answer.push(stacked.into_tvalue());
        } else {
            answer.push(served[0][ix].clone());
        }
    }
    Ok(answer)
}
