//! The turn: seat what the filler picks from the queue, stack its inputs,
//! run the state once, and land each seat's row with its call; on failure,
//! fail those seats and recover the state.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use lane_table::{fill_into, LaneId};
use tract_core::internal::*;
use tract_core::plan::Seating;

use crate::err::{RunError, RunErrorKind};
use crate::policy::TurnPolicy;
use crate::protocol::Answer;

use super::queue::QSeat;
use super::{panic_text, reset_caught, tract_lane, Engine};

/// Why a turn failed, and whether the state was touched before it did: a
/// turn refused before tract saw it (its inputs could not be stacked, a
/// borrowed lane could not be reset) leaves every stream's state as it was.
struct Failure {
    why: String,
    touched: bool,
}

impl Failure {
    pub(super) fn untouched(why: String) -> Failure {
        Failure { why, touched: false }
    }

    pub(super) fn touched(why: String) -> Failure {
        Failure { why, touched: true }
    }
}

impl Engine {
    /// Run one turn from the head of the queue.
    pub fn turn(&mut self) {
        self.sweep();
        if self.queue.is_empty() || self.state.is_none() {
            return;
        }
        let live = self.live.load();
        let mut started;
        loop {
            fill_into(&self.queue, &self.table, live.max_seats, &mut self.fill);
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
            let (queue, pending) = (&self.queue, &self.pending);
            let overdue: Vec<u64> = self
                .fill
                .seated()
                .iter()
                .map(|placed| &queue[placed.queue_ix])
                .filter(|seat| seat.deadline.is_some_and(|d| d <= started))
                .filter(|seat| pending.get(&seat.call).is_some_and(|p| p.remaining == p.served.len()))
                .map(|seat| seat.call)
                .collect();
            if overdue.is_empty() {
                break;
            }
            for id in overdue {
                self.withdraw(id, RunErrorKind::DeadlineExceeded);
            }
            self.sweep();
            if self.queue.is_empty() {
                self.publish_queue();
                return;
            }
        }
        if let Some(last) = self.last_turn.replace(started) {
            // Seats and intervals averaged apart, the rate their ratio: an
            // average of each turn's seats / interval would be dominated
            // by the turns that follow another closely (a tiny interval),
            // and overstate the rate many times over.
            let dt = started.saturating_duration_since(last).as_secs_f64();
            let seats = self.fill.seated().len() as f64;
            let (avg_seats, avg_dt) = match self.arrivals {
                None => (seats, dt),
                Some((s, d)) => ((s * 7.0 + seats) / 8.0, (d * 7.0 + dt) / 8.0),
            };
            self.arrivals = Some((avg_seats, avg_dt));
            self.arrivals_per_sec = avg_seats / avg_dt.max(1e-6);
        }
        // Split the queue: seated seats in seat order, the rest stay queued.
        let mut is_seated = std::mem::take(&mut self.spare);
        debug_assert!(is_seated.is_empty());
        let mut lanes: Vec<LaneId> = Vec::with_capacity(self.fill.seated().len());
        let mut next = self.fill.seated().iter().peekable();
        for (ix, seat) in self.queue.drain(..).enumerate() {
            match next.peek() {
                Some(placed) if placed.queue_ix == ix => {
                    lanes.push(placed.lane);
                    next.next();
                    self.seated.push(seat);
                }
                _ => is_seated.push(seat),
            }
        }
        self.spare = std::mem::replace(&mut self.queue, is_seated);
        let seated = std::mem::take(&mut self.seated);
        for seat in &seated {
            self.unqueued(seat.lane);
            self.records.queue_wait(started.saturating_duration_since(seat.queued));
        }
        let borrowed: Vec<LaneId> = self.fill.borrowed().to_vec();
        for lane in &borrowed {
            let _ = self.table.take_lane(*lane);
        }

        let ran = Instant::now();
        // `run_seated` catches what tract raises; this catches the rest (a
        // bug of ours while stacking or scattering), so that a turn never
        // unwinds into the thread serving the shard.
        let result = catch_unwind(AssertUnwindSafe(|| self.run_seated(&seated, lanes.clone(), &borrowed)))
            .unwrap_or_else(|panic| Err(Failure::touched(format!("the turn panicked: {}", panic_text(panic)))));
        if result.is_ok() {
            self.times.record(seated.len(), ran.elapsed());
        }

        for lane in &borrowed {
            let _ = self.table.give_back(*lane);
        }
        let occupancy = seated.len();
        let now = Instant::now();
        for seat in &seated {
            if seat.place == 0 {
                self.last_active[seat.lane.0] = now;
            }
        }
        // Record before answering: a caller reading the metrics after its
        // answer sees its own turn counted.
        let took = started.elapsed();
        self.records.turn(occupancy, took);
        self.publish_queue();
        if let TurnPolicy::LatencyBudget { us } = live.policy {
            let budget = std::time::Duration::from_micros(us);
            let late = seated
                .iter()
                .filter(|s| now.saturating_duration_since(s.queued) > budget)
                .count();
            if late > 0 {
                self.records.deadline_misses(late);
            }
        }
        match result {
            Ok(outputs) => {
                let outputs = Arc::new(outputs);
                for (ix, seat) in seated.iter().enumerate() {
                    let one_row = self.pending.get(&seat.call).is_some_and(|p| p.served.len() == 1);
                    if one_row {
                        let pending = self.pending.remove(&seat.call).expect("present");
                        let answer = Ok(Answer::Row {
                            turn: outputs.clone(),
                            seat: ix,
                        });
                        if pending.slot.fill_quietly(answer) {
                            self.wakes.push(pending.slot);
                        }
                    } else {
                        let row = Answer::Row {
                            turn: outputs.clone(),
                            seat: ix,
                        }
                        .into_outputs(&self.iface.data_batch_out);
                        self.land(seat.call, seat.place, row.map_err(|e| e.to_string()));
                    }
                }
                // One wake per sleeping caller would cost this thread a
                // system call each: wake them as a tree instead.
                crate::slot::wake_all(&mut self.wakes);
            }
            Err(Failure { why, touched }) => {
                self.records.failed_turn(occupancy);
                if touched {
                    self.recover(&seated, &lanes, &borrowed, &why);
                }
                for seat in &seated {
                    self.land(seat.call, seat.place, Err(why.clone()));
                }
            }
        }
        let mut seated = seated;
        seated.clear();
        self.seated = seated;
    }

    /// After a failed turn that touched the state: the seated streams' lanes
    /// are reset and marked lost (their state may be half-advanced); if even
    /// that fails (or panics), the state is rebuilt and every stream is lost.
    pub(super) fn recover(&mut self, seated: &[QSeat], lanes: &[LaneId], borrowed: &[LaneId], why: &str) {
        let cleaned = catch_unwind(AssertUnwindSafe(|| self.clean(lanes))).unwrap_or(false);
        if cleaned {
            for seat in seated {
                if !borrowed.contains(&seat.lane) {
                    self.lost[seat.lane.0] = Some(why.to_string());
                }
            }
            return;
        }
        self.rebuild(why);
    }

    /// Clear what a failed run left in the state, and reset `lanes`: true
    /// when the state is clean again.
    pub(super) fn clean(&mut self, lanes: &[LaneId]) -> bool {
        let Some(state) = self.state.as_mut() else {
            return false;
        };
        let Some(simple) = state.downcast_mut::<TypedSimpleState>() else {
            return false;
        };
        // A run cut short leaves the turn's values and symbols (the batch
        // extent among them) in the state; the next turn must start clean.
        // A state that failed before its first value was set has no value
        // table yet, and tract's `reset_turn` would index the empty one:
        // then there are only the symbols to clear.
        if simple.turn_state.values.is_empty() {
            simple.turn_state.resolved_symbols = SymbolValues::default();
        } else if simple.reset_turn().is_err() {
            return false;
        }
        if let Some(at_spawn) = &self.symbols_at_spawn {
            simple.turn_state.resolved_symbols = at_spawn.clone();
        }
        let lane_ixs: Vec<usize> = lanes.iter().map(|l| l.0).collect();
        reset_caught(&mut **state, lanes).is_ok() && self.explicit.reset(&lane_ixs).is_ok()
    }

    /// Stack the seats' inputs, run the state once, slice the outputs back.
    fn run_seated(
        &mut self,
        seated: &[QSeat],
        lanes: Vec<LaneId>,
        borrowed: &[LaneId],
    ) -> Result<TVec<TValue>, Failure> {
        let occupancy = seated.len();
        let group = seated[0].group.clone();
        // Borrowed lanes are reset before anything reads them: the explicit
        // state gathered below must be the initial one, not what the lane's
        // last borrower left.
        // A borrowed lane that fails to reset fails the turn before the
        // state ran: its streams keep their state, and the lane is reset
        // again at its next use.
        if !borrowed.is_empty() {
            let borrowed_ixs: Vec<usize> = borrowed.iter().map(|l| l.0).collect();
            let state = self.state.as_mut().expect("open engine has a state");
            reset_caught(&mut **state, borrowed)
                .and_then(|_| self.explicit.reset(&borrowed_ixs).map_err(|e| format!("{e:#}")))
                .map_err(|why| Failure::untouched(format!("resetting borrowed lanes: {why}")))?;
        }
        let mut inputs: TVec<TValue> = TVec::with_capacity(self.iface.inputs.len());
        let mut batched_slot = 0;
        let mut shared_slot = 0;
        for ix in 0..self.iface.inputs.len() {
            if let Some(gathered) = self.explicit.gather(ix, &lanes) {
                inputs.push(gathered.map_err(|e| Failure::untouched(format!("gathering state input {ix}: {e:#}")))?);
            } else if self.iface.inputs[ix].batched {
                let k = batched_slot;
                batched_slot += 1;
                if occupancy == 1 {
                    inputs.push(seated[0].inputs[k].clone());
                } else {
                    inputs.push(
                        self.stacker
                            .stack(ix, seated.iter().map(|s| &*s.inputs[k]))
                            .map_err(|e| Failure::untouched(format!("stacking input {ix}: {e:#}")))?,
                    );
                }
            } else {
                inputs.push(group.shared()[shared_slot].clone());
                shared_slot += 1;
            }
        }
        let state = self.state.as_mut().expect("open engine has a state");
        let seating = Seating::new(self.table.max_lanes(), lanes.iter().map(|l| tract_lane(*l)))
            .map_err(|e| Failure::untouched(format!("{e:#}")))?;
        state.seat(seating).map_err(|e| Failure::touched(format!("{e:#}")))?;
        let resolved = group.resolved();
        if !resolved.is_empty() {
            let simple = state.downcast_mut::<TypedSimpleState>().expect("checked at enqueue");
            for (symbol, value) in resolved {
                simple.turn_state.resolved_symbols.set(symbol, *value);
            }
        }
        let ran = catch_unwind(AssertUnwindSafe(|| state.run(inputs)));
        if !resolved.is_empty() {
            if let (Some(simple), Some(at_spawn)) = (state.downcast_mut::<TypedSimpleState>(), &self.symbols_at_spawn) {
                simple.turn_state.resolved_symbols = at_spawn.clone();
            }
        }
        let outputs = match ran {
            Ok(Ok(outputs)) => outputs,
            Ok(Err(e)) => return Err(Failure::touched(format!("{e:#}"))),
            Err(panic) => return Err(Failure::touched(format!("the model panicked: {}", panic_text(panic)))),
        };
        for (ix, output) in outputs.iter().enumerate() {
            if self.iface.batch_out.get(ix).copied().unwrap_or(false)
                && (output.rank() == 0 || output.shape()[0] != occupancy)
            {
                return Err(Failure::touched(format!(
                    "the turn seats {occupancy}, output {ix} has shape {:?}",
                    output.shape()
                )));
            }
        }
        // Explicit state goes back to its lanes; the caller gets the rest.
        if self.iface.state.is_empty() {
            return Ok(outputs);
        }
        self.explicit
            .scatter(&outputs, &lanes)
            .map_err(|e| Failure::touched(format!("{e:#}")))?;
        Ok(self.iface.data_outputs.iter().map(|ix| outputs[*ix].clone()).collect())
    }

    /// One seat of call `id` landed; answer the call once all have.
    pub(super) fn land(&mut self, id: u64, place: usize, outputs: Result<TVec<TValue>, String>) {
        let Some(pending) = self.pending.get_mut(&id) else {
            return;
        };
        match outputs {
            Err(why) => {
                let pending = self.pending.remove(&id).expect("present");
                // Drop the call's seats still queued.
                self.unqueue_where(|seat| seat.call == id);
                // Its row 0 ran in an earlier turn and advanced the stream's
                // state, yet the call fails: the stream cannot go on as if
                // it had not been made.
                if pending.served[0].is_some() {
                    self.lost[pending.lane.0] = Some(format!("part of a wide call ran before the rest failed: {why}"));
                }
                pending.slot.fill(Err(RunError::new(RunErrorKind::Turn(why))));
            }
            Ok(outputs) => {
                pending.served[place] = Some(outputs);
                pending.remaining -= 1;
                if pending.remaining == 0 {
                    let pending = self.pending.remove(&id).expect("present");
                    let answer = assemble(pending.served, &self.iface.data_batch_out);
                    pending.slot.fill(answer.map(Answer::Outputs));
                }
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
