//! One call, from its checks to its answer: the one implementation behind
//! `call`, `call_with`, `call_until` (a thread drives it with
//! [`Thread`](crate::drive::Thread)) and `call_async`, `call_until_async`
//! (a task awaits it with [`Task`](crate::drive::Task)); and the settling
//! of a call whose future was dropped before its answer was taken.
//!
//! A call's steps, in order (each a step of [`LanedStateHandle::call_op`]):
//!
//! 1. Refused before anything is queued, its inputs handed back: a
//!    finished stream, a closed runner, a deadline already past.
//! 2. A dropped call whose verdict has not landed refuses this call
//!    (`Unsettled`); one that ran refuses it too until `settle` takes its
//!    answer; one that did not run is forgotten.
//! 3. The slot begins a new call (its number, for cancels), a cancel token
//!    guards it, a token already cancelled refuses it.
//! 4. Checked against the model's facts and pushed to the shard's inbox.
//! 5. Armed: the deadline thread cancels a task's call at its deadline (a
//!    thread's wait gives up by itself).
//! 6. A task yields once (see `call_async`).
//! 7. The answer awaited. Cancelled or timed out: a cancel goes to the
//!    engine, which withdraws the call if none of its seats was seated
//!    (answering `Cancelled`) or lets it complete; the one verdict awaited.
//! 8. Delivered: its rows cut from the turn's outputs (the engine counted
//!    its pulse when the turn ran it, for `finish`).
//!
//! A call whose future is dropped between 4 and 8 is cancelled as in 7 and
//! its verdict left to settle (step 2 of the next call).

use std::sync::Arc;
use std::time::Instant;

use tract_core::internal::*;

use crate::cancel::CancelToken;
use crate::drive::Wait;
use crate::err::{RunError, RunErrorKind};
use crate::handle::{Dropped, LanedStateHandle, Settled};
use crate::iface::Group;
use crate::protocol::{Call, CallResult, Request};
use crate::slot::{Cancel, Slot, Wake};

impl LanedStateHandle {
    /// The one call (see the steps above), waiting as `w` does. Its
    /// errors say what the runner's ending says (a closed runner's refusal
    /// reads `Draining` once a drain closed it).
    pub(crate) async fn call_op<W: Wait>(
        &mut self,
        inputs: TVec<TValue>,
        token: Option<&CancelToken>,
        deadline: Option<Instant>,
        w: &mut W,
    ) -> Result<TVec<TValue>, RunError> {
        let core = self.stream.core.clone();
        self.steps(inputs, token, deadline, w).await.map_err(|e| {
            core.book_call_end(e.kind());
            core.told(e)
        })
    }

    /// Steps 1 to 8, errors as the engine gave them.
    async fn steps<W: Wait>(
        &mut self,
        inputs: TVec<TValue>,
        token: Option<&CancelToken>,
        deadline: Option<Instant>,
        w: &mut W,
    ) -> Result<TVec<TValue>, RunError> {
        // Step 1.
        let inputs = self.may_call(inputs, deadline)?;
        // Step 2.
        let inputs = self.settle_first(inputs, w).await?;
        // Step 3. The call's number on the slot: a cancel meant for an
        // earlier call that raced its answer finds another number, and is
        // ignored. Guard first, then look: a cancel landing in between
        // still reaches the slot. Unguarded when this function returns.
        let call_no = self.slot.begin();
        let _guarded = token.map(|token| token.guard(self.slot.clone() as Arc<dyn Cancel>, call_no));
        if token.is_some_and(CancelToken::is_cancelled) {
            return Err(RunError::with_inputs(RunErrorKind::Cancelled, inputs));
        }
        // Step 4.
        self.submit(inputs, deadline)?;
        // Step 5: armed until this call ends, answered or dropped.
        let _armed = w.arm(
            &self.stream.core.timer,
            deadline,
            &(self.slot.clone() as Arc<dyn Cancel>),
            call_no,
        );
        // Steps 6 and 7; dropped from here on, the call is cancelled.
        let mut in_flight = InFlight { handle: Some(self) };
        let answer = in_flight.answer(w, deadline).await;
        let handle = in_flight.handle.take().expect("in flight until answered");
        // Step 8.
        handle.deliver(answer)
    }

    /// Step 1: what is refused before anything is queued. The inputs come
    /// back either way.
    fn may_call(&self, inputs: TVec<TValue>, deadline: Option<Instant>) -> Result<TVec<TValue>, RunError> {
        // Finished first: a finished stream is told so, closed runner or
        // not, as `end_reason` says.
        if self.stream.finished.load(crate::sync::Ordering::Acquire) {
            return Err(RunError::with_inputs(RunErrorKind::Finished, inputs));
        }
        if self.stream.shard().is_closed() {
            return Err(RunError::with_inputs(RunErrorKind::Closed, inputs));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(RunError::with_inputs(RunErrorKind::DeadlineExceeded, inputs));
        }
        Ok(inputs)
    }

    /// Step 2: the verdict of a dropped call, if any. One not decided yet
    /// (its verdict has not landed) refuses this call: were this one
    /// dropped too, a later `settle` could not say which of the two it
    /// settles. One that did not run is forgotten; one that ran refuses
    /// this call until [`LanedStateHandle::settle`] takes its answer. So a
    /// call that goes ahead after a drop means the dropped one never ran,
    /// and a later `settle` is about this call only.
    async fn settle_first<W: Wait>(&mut self, inputs: TVec<TValue>, w: &mut W) -> Result<TVec<TValue>, RunError> {
        match &self.dropped {
            None => return Ok(inputs),
            Some(Dropped::Pending { slot }) if !slot.is_filled() => {
                return Err(RunError::with_inputs(RunErrorKind::Unsettled, inputs))
            }
            Some(_) => (),
        }
        // Landed: taken at once, without waiting.
        self.verdict(w).await;
        match &self.dropped {
            Some(Dropped::Settled { ran: true, .. }) => Err(RunError::with_inputs(RunErrorKind::Unsettled, inputs)),
            _ => {
                self.dropped = None;
                Ok(inputs)
            }
        }
    }

    /// Wait for a dropped call's verdict and keep it (cancel-safe: the
    /// verdict is taken and kept in one poll).
    pub(crate) async fn verdict<W: Wait>(&mut self, w: &mut W) {
        let Some(Dropped::Pending { slot }) = &self.dropped else {
            return;
        };
        let slot = slot.clone();
        let answer = crate::drive::value(w, self.stream.shard(), &slot).await;
        let (settled, ran) = match answer {
            Ok(answer) => {
                // It ran: the pulse was fed (and counted by the engine),
                // whether or not its outputs can be cut.
                match answer.into_outputs(&self.stream.core.iface.data_batch_out) {
                    Ok(outputs) => (Settled::Ran(outputs), true),
                    Err(e) => (Settled::Failed(e), true),
                }
            }
            Err(e) if matches!(e.kind(), RunErrorKind::Cancelled | RunErrorKind::DeadlineExceeded) => {
                // A dropped call withdrawn unserved: booked here, the one
                // place its end is learned.
                self.stream.core.book_call_end(e.kind());
                (Settled::NotRun, false)
            }
            Err(e) => (Settled::Failed(self.stream.core.told(e)), false),
        };
        self.dropped = Some(Dropped::Settled { settled, ran });
    }

    /// Step 4: check `inputs` and queue them as a call answering into this
    /// handle's slot. A refused call hands its inputs back.
    fn submit(&mut self, inputs: TVec<TValue>, deadline: Option<Instant>) -> Result<(), RunError> {
        // Resolved symbols hold for this call only, refused or not.
        let resolved = std::mem::take(&mut self.resolved);
        let checked = self.stream.core.iface.check(inputs, &resolved)?;
        let call = Call {
            stream: self.stream.grant,
            seats: checked.seats,
            group: Group::new(checked.shared, resolved, checked.shapes),
            slot: self.slot.clone(),
            queued: Instant::now(),
            deadline,
        };
        self.stream.shard().push(Request::Call(call));
        Ok(())
    }

    /// Step 8: a call's answer as the caller gets it: its outputs (its row
    /// cut from the turn's; its engine counted the pulse it fed).
    fn deliver(&mut self, answer: CallResult) -> Result<TVec<TValue>, RunError> {
        let iface = &self.stream.core.iface;
        answer?.into_outputs(&iface.data_batch_out)
    }
}

/// A call queued and not answered yet: cancels the call if dropped first
/// (a task's future dropped), leaving its verdict to settle.
struct InFlight<'a> {
    /// `None` once answered.
    handle: Option<&'a mut LanedStateHandle>,
}

impl InFlight<'_> {
    /// Steps 6 and 7.
    async fn answer<W: Wait>(&mut self, w: &mut W, deadline: Option<Instant>) -> CallResult {
        let handle = self.handle.as_deref().expect("in flight");
        let (shard, slot) = (handle.stream.shard(), &*handle.slot);
        if W::YIELDS_FIRST {
            crate::drive::yield_once(shard, slot).await;
        }
        let timed_out = match crate::drive::answer(w, shard, slot, deadline).await {
            Wake::Value(answer) => return answer,
            woke => matches!(woke, Wake::TimedOut),
        };
        // Cancelled, or its deadline passed: the engine drops the call if
        // none of its seats was seated yet and answers `Cancelled`;
        // otherwise the call completes and its answer comes. Either way the
        // slot gets exactly one verdict, at the latest after the turn
        // running now, and the caller learns whether its call ran.
        shard.push(Request::Cancel(handle.slot.clone()));
        shard.tend();
        let answer = crate::drive::value(w, shard, slot).await;
        past_deadline(answer, timed_out)
    }
}

/// A call cancelled because its deadline passed is answered
/// `DeadlineExceeded`, not `Cancelled`.
fn past_deadline(answer: CallResult, timed_out: bool) -> CallResult {
    match answer {
        Err(e) if timed_out && *e.kind() == RunErrorKind::Cancelled => {
            Err(RunError::new(RunErrorKind::DeadlineExceeded))
        }
        other => other,
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else { return };
        // The handle answers into a fresh slot from now on; the old one
        // receives this call's verdict, to be settled before the next call.
        let old = std::mem::replace(&mut handle.slot, Arc::new(Slot::new()));
        if !old.is_filled() {
            // As a cancel token's: seats not yet seated leave the queue; a
            // call already seated completes. Either way one verdict lands.
            handle.stream.shard().push(Request::Cancel(old.clone()));
            handle.stream.shard().tend();
        }
        old.forget_waker();
        handle.dropped = Some(Dropped::Pending { slot: old });
    }
}
