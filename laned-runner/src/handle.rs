//! One stream's handle (tract's `State`): its calls, its explicit state,
//! the end of its stream; and the lane it holds, given back when its last
//! handle goes.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use tract_core::internal::*;

use crate::cancel::CancelToken;
use crate::common::Common;
use crate::err::{EndReason, RunError, RunErrorKind};
use crate::iface::Group;
use crate::protocol::{Call, CallResult, Grant, Request};
use crate::shard::Shard;
use crate::slot::{Cancel, Slot, Wake};
use crate::wire::{StateTensor, StreamState, STREAM_STATE_VERSION};

/// The lane a stream holds, shared by its handle's clones; the last one
/// dropped sends the lane back.
pub(crate) struct Stream {
    pub(crate) grant: Grant,
    /// The shard the stream was placed on, for its whole life.
    pub(crate) shard: usize,
    pub(crate) core: Arc<Common>,
    /// Set once `finish` fed the stream's last pulse (any clone's).
    pub(crate) finished: std::sync::atomic::AtomicBool,
}

impl Stream {
    pub(crate) fn shard(&self) -> &Shard {
        &self.core.shards[self.shard]
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.shard().push(Request::Release(self.grant));
        self.shard().tend();
    }
}

/// One stream's view of a [`LanedRunner`](crate::LanedRunner). Clones are the same stream
/// (same lane); each clone has its own answer slot, and a symbol resolved on
/// one clone holds for that clone's next call only.
pub struct LanedStateHandle {
    pub(crate) stream: Arc<Stream>,
    /// This clone's answer channel, reused call after call.
    pub(crate) slot: Arc<Slot<CallResult>>,
    /// Symbols resolved for the next call only.
    pub(crate) resolved: Vec<(Symbol, i64)>,
    /// Frames this clone fed its stream so far (pulsed models), for `finish`.
    pub(crate) frames: usize,
    /// Set once a dropped call left it unknown whether its pulse ran.
    pub(crate) frames_unknown: bool,
    /// A copy of the runner that does not keep it open, for
    /// [`State::runnable`].
    pub(crate) runner: Arc<dyn Runnable>,
}

impl Clone for LanedStateHandle {
    fn clone(&self) -> LanedStateHandle {
        LanedStateHandle {
            stream: self.stream.clone(),
            slot: Arc::new(Slot::new()),
            resolved: vec![],
            frames: self.frames,
            frames_unknown: self.frames_unknown,
            runner: self.runner.clone(),
        }
    }
}

impl fmt::Debug for LanedStateHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LanedStateHandle(lane {})", self.stream.grant.lane.0)
    }
}

impl LanedStateHandle {
    /// The shard this stream was placed on (for its whole life).
    pub fn shard(&self) -> usize {
        self.stream.shard
    }

    /// This stream's explicit state (a tensor per state pair, the batch
    /// axis of extent 1), read between turns: to save it, or to move the
    /// stream to another runner with [`LanedStateHandle::restore_state`].
    pub fn state_snapshot(&self) -> Result<TVec<Tensor>, RunError> {
        let slot = Arc::new(Slot::new());
        self.stream.shard().push(Request::ReadState {
            stream: self.stream.grant,
            slot: slot.clone(),
        });
        match self.stream.shard().wait(&slot, None) {
            Wake::Value(read) => read,
            _ => Err(RunError::new(RunErrorKind::Closed)),
        }
    }

    /// Overwrite this stream's explicit state (as `state_snapshot` gives
    /// it); the next call continues from it.
    pub fn restore_state(&mut self, state: TVec<Tensor>) -> Result<(), RunError> {
        let slot = Arc::new(Slot::new());
        self.stream.shard().push(Request::WriteState {
            stream: self.stream.grant,
            state,
            slot: slot.clone(),
        });
        match self.stream.shard().wait(&slot, None) {
            Wake::Value(written) => written,
            _ => Err(RunError::new(RunErrorKind::Closed)),
        }
    }

    /// This stream's explicit state on the wire ([`StreamState`]): to
    /// hand the stream over to another runner, in another process (a
    /// replica draining), where [`LanedStateHandle::import_state`]
    /// continues it exactly.
    pub fn export_state(&self) -> Result<StreamState, RunError> {
        let tensors = self
            .state_snapshot()?
            .iter()
            .map(StateTensor::of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| RunError::new(RunErrorKind::State(why)))?;
        Ok(StreamState {
            version: STREAM_STATE_VERSION,
            model: self.model_identity(),
            tensors,
        })
    }

    /// Continue from `state`, exported by
    /// [`LanedStateHandle::export_state`] of a runner serving the same
    /// model. Refused, naming both, for another version or another model's
    /// state; the stream's own state is then left as it was.
    pub fn import_state(&mut self, state: &StreamState) -> Result<(), RunError> {
        let refuse = |why: String| Err(RunError::new(RunErrorKind::State(why)));
        if state.version != STREAM_STATE_VERSION {
            return refuse(format!(
                "the stream state is of version {}, this runner reads version {STREAM_STATE_VERSION}",
                state.version
            ));
        }
        let ours = self.model_identity();
        if state.model != ours {
            return refuse(format!(
                "the stream state is of model {:?}, this runner serves {ours:?}",
                state.model
            ));
        }
        let tensors = state
            .tensors
            .iter()
            .map(StateTensor::to_tensor)
            .collect::<Result<TVec<_>, _>>()
            .map_err(|why| RunError::new(RunErrorKind::State(why)))?;
        self.restore_state(tensors)
    }

    fn model_identity(&self) -> String {
        let core = &self.stream.core;
        core.iface
            .state_identity(core.inner.typed_model().and_then(|m| m.name()))
    }

    /// The lane this stream holds on its shard.
    pub fn lane(&self) -> usize {
        self.stream.grant.lane.0
    }

    /// Run one call: one seat per row of the batched inputs (usually one).
    /// Inputs are checked against the model's facts first; a refused call
    /// hands its inputs back in the error.
    pub fn call(&mut self, inputs: TVec<TValue>) -> Result<TVec<TValue>, RunError> {
        self.call_inner(inputs, None, None)
    }

    /// [`LanedStateHandle::call`], cancellable from another thread through
    /// `token`.
    pub fn call_with(&mut self, inputs: TVec<TValue>, token: &CancelToken) -> Result<TVec<TValue>, RunError> {
        self.call_inner(inputs, Some(token), None)
    }

    /// [`LanedStateHandle::call`] with a deadline, as a per-request timeout:
    /// if none of the call's seats is seated when `deadline` passes, its
    /// seats leave the queue and the call is answered
    /// [`RunErrorKind::DeadlineExceeded`], exactly as a cancelled call is
    /// answered `Cancelled`; a call already in a turn completes and gets
    /// its answer. A deadline already past refuses the call before it is
    /// queued, its inputs handed back.
    pub fn call_until(&mut self, inputs: TVec<TValue>, deadline: Instant) -> Result<TVec<TValue>, RunError> {
        self.call_inner(inputs, None, Some(deadline))
    }

    fn call_inner(
        &mut self,
        inputs: TVec<TValue>,
        token: Option<&CancelToken>,
        deadline: Option<Instant>,
    ) -> Result<TVec<TValue>, RunError> {
        let core = self.stream.core.clone();
        self.call_blocking(inputs, token, deadline).map_err(|e| core.told(e))
    }

    fn call_blocking(
        &mut self,
        inputs: TVec<TValue>,
        token: Option<&CancelToken>,
        deadline: Option<Instant>,
    ) -> Result<TVec<TValue>, RunError> {
        let inputs = self.may_call(inputs, deadline)?;
        // The call's number on the slot: a cancel meant for an earlier call
        // that raced its answer finds another number, and is ignored.
        let call_no = self.slot.begin();
        // Guard first, then look: a cancel landing in between still reaches
        // the slot. Unguarded when this function returns, however.
        let _guarded = token.map(|token| token.guard(self.slot.clone() as Arc<dyn Cancel>, call_no));
        if token.is_some_and(CancelToken::is_cancelled) {
            return Err(RunError::with_inputs(RunErrorKind::Cancelled, inputs));
        }
        let rows = self.submit(inputs)?;
        let mut timed_out = false;
        let answer = match self.stream.shard().wait(&self.slot, deadline) {
            Wake::Value(answer) => answer,
            woke @ (Wake::Cancelled | Wake::TimedOut) => {
                timed_out = matches!(woke, Wake::TimedOut);
                // Cancelled: the engine drops the call if none of its seats
                // was seated yet and answers `Cancelled`; otherwise the call
                // completes and its answer comes. Either way the slot gets
                // exactly one verdict, at the latest after the turn running
                // now, and the caller learns whether its call ran.
                self.stream.shard().push(Request::Cancel(self.slot.clone()));
                loop {
                    if let Wake::Value(answer) = self.stream.shard().wait(&self.slot, None) {
                        break answer;
                    }
                }
            }
        };
        self.deliver(past_deadline(answer, timed_out), rows)
    }

    /// [`LanedStateHandle::call`] for a task: the same checks, turn rules
    /// and answers, but no thread waits; the answer wakes the task. Dropping
    /// the future before it is ready cancels the call, as a
    /// [`CancelToken`] does: seats not yet seated are removed, a call
    /// already seated completes and its answer is dropped (then
    /// [`LanedStateHandle::finish`] refuses, not knowing whether that pulse
    /// ran). Needs no particular executor.
    ///
    /// In combining mode, a task that finds the state free runs the turn in
    /// its own `poll`, on the executor's thread, as a calling thread would.
    pub async fn call_async(&mut self, inputs: TVec<TValue>) -> Result<TVec<TValue>, RunError> {
        let core = self.stream.core.clone();
        self.call_async_inner(inputs, None).await.map_err(|e| core.told(e))
    }

    /// [`LanedStateHandle::call_until`] for a task: past `deadline`, a call
    /// none of whose seats was seated leaves the queue and is answered
    /// [`RunErrorKind::DeadlineExceeded`]; one already in a turn completes.
    /// The runner's deadline thread (one per runner) wakes the task then:
    /// no executor timer is needed.
    pub async fn call_until_async(
        &mut self,
        inputs: TVec<TValue>,
        deadline: Instant,
    ) -> Result<TVec<TValue>, RunError> {
        let core = self.stream.core.clone();
        self.call_async_inner(inputs, Some(deadline))
            .await
            .map_err(|e| core.told(e))
    }

    async fn call_async_inner(
        &mut self,
        inputs: TVec<TValue>,
        deadline: Option<Instant>,
    ) -> Result<TVec<TValue>, RunError> {
        let inputs = self.may_call(inputs, deadline)?;
        let call_no = self.slot.begin();
        let rows = self.submit(inputs)?;
        // Armed until this call ends, answered or dropped (`None` once the
        // runner closed: the close answers the call).
        let _armed = deadline.and_then(|deadline| {
            let slot: Arc<dyn Cancel> = self.slot.clone();
            self.stream.core.timer.add(deadline, Arc::downgrade(&slot), call_no)
        });
        let mut pending = PendingCall {
            handle: Some(self),
            timed_out: false,
        };
        let answer = std::future::poll_fn(|cx| pending.poll(cx)).await;
        let timed_out = pending.timed_out;
        let handle = pending.handle.take().expect("armed until answered");
        handle.deliver(past_deadline(answer, timed_out), rows)
    }

    /// What both call paths refuse before anything is queued: a closed
    /// runner, a deadline already past. The inputs come back either way.
    fn may_call(&self, inputs: TVec<TValue>, deadline: Option<Instant>) -> Result<TVec<TValue>, RunError> {
        if self.stream.shard().is_closed() {
            return Err(RunError::with_inputs(RunErrorKind::Closed, inputs));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(RunError::with_inputs(RunErrorKind::DeadlineExceeded, inputs));
        }
        Ok(inputs)
    }

    /// Check `inputs` and queue them as a call answering into this handle's
    /// slot; returns its rows. A refused call hands its inputs back.
    fn submit(&mut self, inputs: TVec<TValue>) -> Result<usize, RunError> {
        // Resolved symbols hold for this call only, refused or not.
        let resolved = std::mem::take(&mut self.resolved);
        let checked = self.stream.core.iface.check(inputs, &resolved)?;
        let rows = checked.seats.len();
        let call = Call {
            stream: self.stream.grant,
            seats: checked.seats,
            group: Group::new(checked.shared, resolved, checked.shapes),
            slot: self.slot.clone(),
            queued: Instant::now(),
        };
        self.stream.shard().push(Request::Call(call));
        Ok(rows)
    }

    /// A call's answer as the caller gets it: its outputs (its row cut from
    /// the turn's), the frames it fed counted.
    fn deliver(&mut self, answer: CallResult, rows: usize) -> Result<TVec<TValue>, RunError> {
        let iface = &self.stream.core.iface;
        let outputs = answer?.into_outputs(&iface.data_batch_out)?;
        if let Some(pulse) = &iface.pulse {
            if rows >= 1 {
                self.frames += pulse.pulse;
            }
        }
        Ok(outputs)
    }

    /// End the stream: feed its last pulse (`last`, of which only the first
    /// `real_frames` frames are signal; `None` when the stream ended on a
    /// pulse boundary), with the model's stream symbol resolved to the
    /// stream's true length, then pulses of silence until every output frame
    /// is out (the model's `pulse.delay`). Returns the outputs of those
    /// calls, in order; the lane then goes back (once the last clone is
    /// dropped).
    pub fn finish(mut self, last: Option<TVec<TValue>>, real_frames: usize) -> Result<Vec<TVec<TValue>>, RunError> {
        let (symbol, length, pulses) = self.last_pulses(last, real_frames)?;
        let mut outputs = vec![];
        for pulse in pulses {
            self.resolve(&symbol, length)?;
            outputs.push(self.call(pulse)?);
        }
        self.stream.finished.store(true, std::sync::atomic::Ordering::Release);
        Ok(outputs)
    }

    /// [`LanedStateHandle::finish`] for a task, through
    /// [`LanedStateHandle::call_async`].
    pub async fn finish_async(
        mut self,
        last: Option<TVec<TValue>>,
        real_frames: usize,
    ) -> Result<Vec<TVec<TValue>>, RunError> {
        let (symbol, length, pulses) = self.last_pulses(last, real_frames)?;
        let mut outputs = vec![];
        for pulse in pulses {
            self.resolve(&symbol, length)?;
            outputs.push(self.call_async(pulse).await?);
        }
        self.stream.finished.store(true, std::sync::atomic::Ordering::Release);
        Ok(outputs)
    }

    /// What ending the stream feeds: the stream symbol, the stream's length
    /// it is resolved to, and the pulses (the last one, then silence).
    fn last_pulses(
        &self,
        last: Option<TVec<TValue>>,
        real_frames: usize,
    ) -> Result<(Symbol, i64, Vec<TVec<TValue>>), RunError> {
        let iface = &self.stream.core.iface;
        let Some(pulse) = iface.pulse.clone() else {
            return Err(RunError::new(RunErrorKind::Finish(
                "the model carries no pulse properties (pulse.streaming_symbol, pulse.input_axes, pulse.delay): pulsify it with tract-pulse".into(),
            )));
        };
        if self.frames_unknown {
            return Err(RunError::new(RunErrorKind::Finish(
                "a dropped call may or may not have fed its pulse, so the stream's length is unknown".into(),
            )));
        }
        if real_frames > pulse.pulse || (last.is_none() && real_frames > 0) {
            return Err(RunError::new(RunErrorKind::Finish(format!(
                "the last pulse holds {real_frames} real frames; a pulse holds at most {} (and none without a last pulse)",
                pulse.pulse
            ))));
        }
        let total = self.frames + real_frames;
        let mut fed = self.frames;
        let mut pulses = vec![];
        if let Some(last) = last {
            pulses.push(last);
            fed += pulse.pulse;
        }
        while fed < total + pulse.delay {
            pulses.push(iface.silence().map_err(|e| RunError::new(RunErrorKind::Finish(e)))?);
            fed += pulse.pulse;
        }
        Ok((pulse.symbol, total as i64, pulses))
    }

    /// Why this stream ended, or `None` while it can still be served: the
    /// question a server asks before telling its client "retry" or "bye".
    /// [`EndReason::Finished`] once `finish` fed its last pulse (read on a
    /// clone); [`EndReason::Evicted`] or [`EndReason::Lost`] as its shard
    /// recorded it (a round trip to the shard, served between turns);
    /// [`EndReason::Drained`] or [`EndReason::Closed`] once the runner
    /// closed. A cancelled call does not end its stream: see
    /// [`RunError::end_reason`].
    pub fn end_reason(&self) -> Option<EndReason> {
        use std::sync::atomic::Ordering;
        let core = &self.stream.core;
        if self.stream.finished.load(Ordering::Acquire) {
            return Some(EndReason::Finished);
        }
        let closed = || {
            Some(if core.drained.load(Ordering::Acquire) {
                EndReason::Drained
            } else {
                EndReason::Closed
            })
        };
        let shard = self.stream.shard();
        if shard.is_closed() {
            return closed();
        }
        let slot = Arc::new(Slot::new());
        shard.push(Request::Status {
            stream: self.stream.grant,
            slot: slot.clone(),
        });
        let status = loop {
            if let Wake::Value(status) = shard.wait(&slot, None) {
                break status;
            }
        };
        match status {
            Some(EndReason::Closed) => closed(),
            other => other,
        }
    }

    /// Pin `symbol` to `value` for this handle's next call only (a stream's
    /// last, partial pulse). Seats resolving different values never share a
    /// turn.
    pub fn resolve(&mut self, symbol: &Symbol, value: i64) -> Result<(), RunError> {
        let core = &self.stream.core;
        if *symbol == core.iface.batch {
            return Err(RunError::new(RunErrorKind::Symbol(format!(
                "{symbol} is the batch symbol, which stands for the turn's occupancy, not for one stream"
            ))));
        }
        if !self.stream.shard().can_forget_symbols() {
            return Err(RunError::new(RunErrorKind::Symbol(
                "this state cannot forget a resolved symbol after the turn".into(),
            )));
        }
        self.resolved.retain(|(s, _)| s != symbol);
        self.resolved.push((symbol.clone(), value));
        Ok(())
    }
}

impl State for LanedStateHandle {
    fn run(&mut self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        Ok(self.call(inputs)?)
    }

    fn resolve_symbol(&mut self, symbol: &Symbol, value: i64) -> TractResult<()> {
        Ok(self.resolve(symbol, value)?)
    }

    fn runnable(&self) -> &dyn Runnable {
        &*self.runner
    }
}

/// A task's call in flight: polls the answer (serving the state itself in
/// combining mode when it is free), and cancels the call if dropped first.
struct PendingCall<'a> {
    /// `None` once answered.
    handle: Option<&'a mut LanedStateHandle>,
    /// Set once the deadline thread cancelled the call: a `Cancelled`
    /// verdict then reads `DeadlineExceeded`.
    timed_out: bool,
}

impl PendingCall<'_> {
    fn poll(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<CallResult> {
        let handle = self.handle.as_ref().expect("polled after its answer");
        let slot = &handle.slot;
        loop {
            handle.stream.shard().serve(&|| slot.is_filled());
            match slot.poll_answer(cx) {
                std::task::Poll::Ready(Ok(answer)) => return std::task::Poll::Ready(answer),
                // The deadline passed: as a cancel token's, the engine
                // drops the seats if none was seated (answering
                // `Cancelled`), or the call completes; either way one
                // verdict comes, and this poll waits for it.
                std::task::Poll::Ready(Err(())) => {
                    self.timed_out = true;
                    handle.stream.shard().push(Request::Cancel(slot.clone()));
                    handle.stream.shard().tend();
                }
                std::task::Poll::Pending => return std::task::Poll::Pending,
            }
        }
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

impl Drop for PendingCall<'_> {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else { return };
        // The handle answers into a fresh slot from now on; the old one
        // refuses whatever still lands in it.
        let old = std::mem::replace(&mut handle.slot, Arc::new(Slot::new()));
        if let Some(answer) = old.abandon() {
            // Answered, but never polled: its answer goes, and whether it
            // fed its pulse is known.
            if let (Ok(_), Some(pulse)) = (answer, &handle.stream.core.iface.pulse) {
                handle.frames += pulse.pulse;
            }
            return;
        }
        if handle.stream.core.iface.pulse.is_some() {
            handle.frames_unknown = true;
        }
        // As a cancel token's: seats not yet seated leave the queue; a call
        // already seated completes into the abandoned slot.
        handle.stream.shard().push(Request::Cancel(old));
        handle.stream.shard().tend();
    }
}
