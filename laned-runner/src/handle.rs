//! One stream's handle (tract's `State`): its calls, its explicit state,
//! the end of its stream; and the lane it holds, given back when its last
//! handle goes.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use tract_core::internal::*;

use crate::cancel::CancelToken;
use crate::common::Common;
use crate::drive::{Task, Thread, Wait};
use crate::err::{EndReason, RunError, RunErrorKind};
use crate::protocol::{CallResult, Grant, Request};
use crate::shard::Shard;
use crate::slot::Slot;
use crate::wire::StreamState;

/// The lane a stream holds, shared by its handle's clones; the last one
/// dropped sends the lane back.
pub(crate) struct Stream {
    pub(crate) grant: Grant,
    /// The shard the stream was placed on, for its whole life.
    pub(crate) shard: usize,
    pub(crate) core: Arc<Common>,
    /// Set once `finish` fed the stream's last pulse (any clone's).
    pub(crate) finished: crate::sync::AtomicBool,
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
    /// A call whose future was dropped before its answer was taken: its
    /// verdict, to come or come (see [`LanedStateHandle::settle`]).
    pub(crate) dropped: Option<Dropped>,
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
            dropped: None,
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

    /// One round trip to the stream's engine: `request` carries the slot
    /// the answer comes back in. The one implementation of every state
    /// operation, waiting as `w` does (see [`crate::drive`]). In combining
    /// mode it serves the state while it is free, as a call does.
    async fn ask<T, W: Wait>(&self, w: &mut W, request: impl FnOnce(Arc<Slot<T>>) -> Request) -> T {
        let slot = Arc::new(Slot::new());
        let shard = self.stream.shard();
        // A shard closed by now answers the request itself, at once.
        shard.push(request(slot.clone()));
        crate::drive::value(w, shard, &slot).await
    }

    /// The stream's state and the pulses it fed, read together; for
    /// `export`, refused once the stream lost its state.
    async fn read<W: Wait>(&self, export: bool, w: &mut W) -> Result<(TVec<Tensor>, u64), RunError> {
        let stream = self.stream.grant;
        self.ask(w, |slot| Request::ReadState { stream, export, slot })
            .await
            .map_err(|e| self.stream.core.told(e))
    }

    async fn snapshot<W: Wait>(&self, w: &mut W) -> Result<TVec<Tensor>, RunError> {
        Ok(self.read(false, w).await?.0)
    }

    /// Overwrite the stream's state; with `pulses`, the count it fed too.
    async fn write<W: Wait>(&mut self, state: TVec<Tensor>, pulses: Option<u64>, w: &mut W) -> Result<(), RunError> {
        let stream = self.stream.grant;
        self.ask(w, |slot| Request::WriteState {
            stream,
            state,
            pulses,
            slot,
        })
        .await
        .map_err(|e| self.stream.core.told(e))
    }

    async fn restore<W: Wait>(&mut self, state: TVec<Tensor>, w: &mut W) -> Result<(), RunError> {
        self.write(state, None, w).await
    }

    async fn export<W: Wait>(&self, w: &mut W) -> Result<StreamState, RunError> {
        let (tensors, pulses) = self.read(true, w).await?;
        self.stream.core.wire.export(&tensors, pulses)
    }

    /// The state checked whole (version, model, each tensor, each position
    /// against the pulses it says the stream fed) before anything is
    /// written; then the state and the count, in one write.
    async fn import<W: Wait>(&mut self, state: &StreamState, w: &mut W) -> Result<(), RunError> {
        let (tensors, pulses) = self.stream.core.wire.import(state)?;
        self.write(tensors, Some(pulses), w).await
    }

    /// This stream's explicit state (a tensor per state pair, the batch
    /// axis of extent 1), read between turns: to save it, or to move the
    /// stream to another runner with [`LanedStateHandle::restore_state`].
    pub fn state_snapshot(&self) -> Result<TVec<Tensor>, RunError> {
        crate::drive::block(self.snapshot(&mut Thread))
    }

    /// [`LanedStateHandle::state_snapshot`] for a task: no thread waits.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads; a dropped read changes nothing.
    pub async fn state_snapshot_async(&self) -> Result<TVec<Tensor>, RunError> {
        self.snapshot(&mut Task).await
    }

    /// Overwrite this stream's explicit state (as `state_snapshot` gives
    /// it); the next call continues from it. Where the model keeps a
    /// stream position (a PulsePad's, kept per lane), the stream then
    /// stands at the pulse that position says, so `finish` ends it at its
    /// own length; a position no pulse reaches is refused, the stream's
    /// state left as it was.
    pub fn restore_state(&mut self, state: TVec<Tensor>) -> Result<(), RunError> {
        crate::drive::block(self.restore(state, &mut Thread))
    }

    /// [`LanedStateHandle::restore_state`] for a task: no thread waits.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: once the future was first polled the write is on
    /// its way to the engine and happens whether or not the future is
    /// polled again; a dropped write may or may not have been applied.
    /// Read [`LanedStateHandle::state_snapshot_async`] to know.
    pub async fn restore_state_async(&mut self, state: TVec<Tensor>) -> Result<(), RunError> {
        self.restore(state, &mut Task).await
    }

    /// [`LanedStateHandle::export_state`] for a task: no thread waits.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn export_state_async(&self) -> Result<StreamState, RunError> {
        self.export(&mut Task).await
    }

    /// This stream's explicit state on the wire ([`StreamState`]): to
    /// hand the stream over to another runner, in another process (a
    /// replica draining), where [`LanedStateHandle::import_state`]
    /// continues it exactly.
    pub fn export_state(&self) -> Result<StreamState, RunError> {
        crate::drive::block(self.export(&mut Thread))
    }

    /// Continue from `state`, exported by
    /// [`LanedStateHandle::export_state`] of a runner serving the same
    /// model. Refused, naming both, for another version or another model's
    /// state; the stream's own state is then left as it was.
    pub fn import_state(&mut self, state: &StreamState) -> Result<(), RunError> {
        crate::drive::block(self.import(state, &mut Thread))
    }

    /// [`LanedStateHandle::import_state`] for a task: the checks on the
    /// caller's side, then the write without a thread waiting.
    ///
    /// # Cancel safety
    ///
    /// As [`LanedStateHandle::restore_state_async`]'s: once first polled
    /// past its checks, the write happens whether or not the future is
    /// polled again.
    pub async fn import_state_async(&mut self, state: &StreamState) -> Result<(), RunError> {
        self.import(state, &mut Task).await
    }

    /// This stream's number on its shard: a shard numbers its streams in
    /// the order it admitted them (for logs, and to see admission order).
    pub fn stream_id(&self) -> u64 {
        self.stream.grant.stream
    }

    /// The lane this stream holds on its shard.
    pub fn lane(&self) -> usize {
        self.stream.grant.lane.0
    }

    /// Run one call: one seat per row of the batched inputs (usually one).
    /// Inputs are checked against the model's facts first; a refused call
    /// hands its inputs back in the error.
    pub fn call(&mut self, inputs: TVec<TValue>) -> Result<TVec<TValue>, RunError> {
        self.call_on_thread(inputs, None, None)
    }

    /// [`LanedStateHandle::call`], cancellable from another thread through
    /// `token`.
    pub fn call_with(&mut self, inputs: TVec<TValue>, token: &CancelToken) -> Result<TVec<TValue>, RunError> {
        self.call_on_thread(inputs, Some(token), None)
    }

    /// [`LanedStateHandle::call`] with a deadline, as a per-request timeout:
    /// if none of the call's seats is seated when `deadline` passes, its
    /// seats leave the queue and the call is answered
    /// [`RunErrorKind::DeadlineExceeded`], exactly as a cancelled call is
    /// answered `Cancelled`; a call already in a turn completes and gets
    /// its answer. A deadline already past refuses the call before it is
    /// queued, its inputs handed back.
    pub fn call_until(&mut self, inputs: TVec<TValue>, deadline: Instant) -> Result<TVec<TValue>, RunError> {
        self.call_on_thread(inputs, None, Some(deadline))
    }

    /// The one call ([`crate::call`]), driven on this thread.
    fn call_on_thread(
        &mut self,
        inputs: TVec<TValue>,
        token: Option<&CancelToken>,
        deadline: Option<Instant>,
    ) -> Result<TVec<TValue>, RunError> {
        crate::drive::block(self.call_op(inputs, token, deadline, &mut Thread))
    }

    /// [`LanedStateHandle::call`] for a task: the same checks, turn rules
    /// and answers, but no thread waits; the answer wakes the task. Needs no
    /// particular executor. The first poll queues the call and is never
    /// ready (in combining mode the task wakes itself to come back), so a
    /// task calling back to back never keeps its executor thread from its
    /// other tasks, whatever the mode; in combining mode, a task that finds
    /// the state free then runs the turn in its own `poll`, on the
    /// executor's thread, as a calling thread would.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe in the sense that dropping the future may lose its
    /// answer, but never silently: dropping it cancels the call, as a
    /// [`CancelToken`] does (seats not yet seated leave the queue; a call
    /// already seated completes). Which of the two happened is *settled*
    /// before this handle's next call: [`LanedStateHandle::settle_async`]
    /// says whether the dropped call ran and hands over its outputs if it
    /// did; a call made without settling first is refused
    /// ([`RunErrorKind::Unsettled`], inputs handed back) when the dropped
    /// one ran or its verdict has not landed yet, and goes ahead only when
    /// it is known not to have run. So a pulse retried after a timeout is
    /// never fed twice unknowingly, and a `settle` always settles one call,
    /// the last one dropped (see the README's timeout-and-retry pattern).
    pub async fn call_async(&mut self, inputs: TVec<TValue>) -> Result<TVec<TValue>, RunError> {
        // The one call, in `call.rs`, awaited by this task.
        self.call_op(inputs, None, None, &mut Task).await
    }

    /// [`LanedStateHandle::call_until`] for a task: past `deadline`, a call
    /// none of whose seats was seated leaves the queue and is answered
    /// [`RunErrorKind::DeadlineExceeded`]; one already in a turn completes.
    /// The runner's deadline thread (one per runner) wakes the task then:
    /// no executor timer is needed.
    ///
    /// # Cancel safety
    ///
    /// As [`LanedStateHandle::call_async`]'s.
    pub async fn call_until_async(
        &mut self,
        inputs: TVec<TValue>,
        deadline: Instant,
    ) -> Result<TVec<TValue>, RunError> {
        self.call_op(inputs, None, Some(deadline), &mut Task).await
    }

    /// Settle a call whose future was dropped before its answer was taken:
    /// wait for its verdict (at the latest after the turn it is in) and say
    /// whether it ran, handing over its outputs if it did. `None` when no
    /// dropped call is unsettled. Blocks; for a task,
    /// [`LanedStateHandle::settle_async`].
    pub fn settle(&mut self) -> Option<Settled> {
        crate::drive::block(self.settle_op(&mut Thread))
    }

    /// [`LanedStateHandle::settle`] for a task.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it is ready, the dropped call stays
    /// unsettled, its verdict kept for the next `settle`.
    pub async fn settle_async(&mut self) -> Option<Settled> {
        self.settle_op(&mut Task).await
    }

    async fn settle_op<W: Wait>(&mut self, w: &mut W) -> Option<Settled> {
        self.verdict(w).await;
        match self.dropped.take()? {
            Dropped::Settled { settled, .. } => Some(settled),
            Dropped::Pending { .. } => unreachable!("settled above"),
        }
    }

    /// End the stream: feed its last pulse (`last`, of which only the first
    /// `real_frames` frames are signal; `None` when the stream ended on a
    /// pulse boundary), with the model's stream symbol resolved to the
    /// stream's true length, then pulses of silence until every output frame
    /// is out (the model's `pulse.delay`). Returns the outputs of those
    /// calls, in order; the lane then goes back (once the last clone is
    /// dropped).
    ///
    /// The stream's length is the stream's, whichever clone fed its
    /// pulses: its engine counts every pulse a turn ran. A dropped call not
    /// settled yet is settled first, and another clone's dropped call is
    /// decided before the count is read; a call another clone makes while
    /// `finish` runs races it (end a stream from one handle).
    pub fn finish(self, last: Option<TVec<TValue>>, real_frames: usize) -> Result<Vec<TVec<TValue>>, RunError> {
        crate::drive::block(self.finish_op(last, real_frames, &mut Thread))
    }

    /// [`LanedStateHandle::finish`] for a task, through
    /// [`LanedStateHandle::call_async`].
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: it consumes the handle, so a dropped `finish_async`
    /// ends the stream where it stood (its call in flight cancelled as a
    /// dropped `call_async`'s).
    pub async fn finish_async(
        self,
        last: Option<TVec<TValue>>,
        real_frames: usize,
    ) -> Result<Vec<TVec<TValue>>, RunError> {
        self.finish_op(last, real_frames, &mut Task).await
    }

    /// The one end of a stream, waiting as `w` does.
    async fn finish_op<W: Wait>(
        mut self,
        last: Option<TVec<TValue>>,
        real_frames: usize,
        w: &mut W,
    ) -> Result<Vec<TVec<TValue>>, RunError> {
        let _ = self.settle_op(w).await;
        // The stream's pulses as its engine counted them, every clone's
        // calls included: asked after this handle's own dropped call is
        // settled, and after any other clone's dropped call was cancelled
        // (the inbox is taken in order), so none of those is undecided.
        let stream = self.stream.grant;
        let fed = self
            .ask(w, |slot| Request::Pulses { stream, slot })
            .await
            .map_err(|e| self.stream.core.told(e))?;
        let (symbol, length, pulses) = self.last_pulses(last, real_frames, fed)?;
        let mut outputs = vec![];
        for pulse in pulses {
            self.resolve(&symbol, length)?;
            outputs.push(self.call_op(pulse, None, None, w).await?);
        }
        self.stream.finished.store(true, crate::sync::Ordering::Release);
        Ok(outputs)
    }

    /// What ending the stream feeds, `fed` pulses into it: the stream
    /// symbol, the stream's length it is resolved to, and the pulses (the
    /// last one, then silence).
    fn last_pulses(
        &self,
        last: Option<TVec<TValue>>,
        real_frames: usize,
        fed: u64,
    ) -> Result<(Symbol, i64, Vec<TVec<TValue>>), RunError> {
        let iface = &self.stream.core.iface;
        let Some(pulse) = iface.pulse.clone() else {
            return Err(RunError::new(RunErrorKind::Finish(
                "the model carries no pulse properties (pulse.streaming_symbol, pulse.input_axes, pulse.delay): pulsify it with tract-pulse".into(),
            )));
        };
        if self.stream.finished.load(crate::sync::Ordering::Acquire) {
            return Err(RunError::new(RunErrorKind::Finished));
        }
        if real_frames > pulse.pulse || (last.is_none() && real_frames > 0) {
            return Err(RunError::new(RunErrorKind::Finish(format!(
                "the last pulse holds {real_frames} real frames; a pulse holds at most {} (and none without a last pulse)",
                pulse.pulse
            ))));
        }
        let frames = fed as usize * pulse.pulse;
        let total = frames + real_frames;
        let mut fed = frames;
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
        crate::drive::block(self.end_reason_op(&mut Thread))
    }

    /// [`LanedStateHandle::end_reason`] for a task: the same round trip,
    /// no thread waits.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn end_reason_async(&self) -> Option<EndReason> {
        self.end_reason_op(&mut Task).await
    }

    async fn end_reason_op<W: Wait>(&self, w: &mut W) -> Option<EndReason> {
        use crate::sync::Ordering;
        let core = &self.stream.core;
        if self.stream.finished.load(Ordering::Acquire) {
            return Some(EndReason::Finished);
        }
        let stream = self.stream.grant;
        let status = self.ask(w, |slot| Request::Status { stream, slot }).await;
        core.told_end(status)
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

/// A call whose future was dropped before its answer was taken, kept by
/// its handle until settled (see [`LanedStateHandle::settle`]).
pub(crate) enum Dropped {
    /// Its verdict is still to land in this slot (its own, the handle
    /// having moved to a fresh one): a cancel is on its way.
    Pending { slot: Arc<Slot<CallResult>> },
    /// Its verdict came; `ran`: its pulse was fed (its outputs may still
    /// have failed to be cut).
    Settled { settled: Settled, ran: bool },
}

/// What became of a call whose future was dropped before its answer was
/// taken ([`LanedStateHandle::settle`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Settled {
    /// It ran: its pulse was fed, here are its outputs.
    Ran(TVec<TValue>),
    /// It never ran (it was withdrawn before any of its seats was seated):
    /// the stream is as before it.
    NotRun,
    /// It was answered with this error (a failed turn, a lost stream, a
    /// closed runner): what the error says holds for the stream.
    Failed(RunError),
}

impl Settled {
    /// Whether the dropped call ran (its pulse was fed to the stream).
    pub fn ran(&self) -> bool {
        matches!(self, Settled::Ran(_))
    }
}
