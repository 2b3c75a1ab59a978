//! One error type per operation: building a runner, spawning a stream, and
//! running a call. A call refused before it was queued hands its inputs back.

use std::fmt;

use std::sync::Arc;

use tract_core::internal::{TValue, TVec, TractError};

/// [`LanedRunner::new`](crate::LanedRunner::new) refused the model or the
/// configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NewRunnerError {
    /// The configuration (or an environment knob) is invalid.
    Config(String),
    /// The batch axis is not one symbol on axis 0 of the batched tensors.
    BatchAxis(String),
    /// No output carries the batch axis, so no stream could get its row.
    NoBatchedOutput {
        /// The model's outputs, none batched.
        outputs: usize,
    },
    /// An output without the batch axis depends on a batched input: it
    /// would mix the streams of a turn into one value every stream gets.
    MixedOutput {
        /// The output, by index and name.
        output: String,
        /// A batched input (or explicit state) that flows into it.
        input: String,
    },
    /// The model describes itself incompletely (a fact could not be read).
    Model(String),
    /// Resetting every lane once up front failed: an op state that cannot
    /// serve several streams.
    Reset {
        /// The node whose op state refused, when it could be found.
        node: Option<String>,
        /// That node's op.
        op: Option<String>,
        /// What the reset said.
        cause: String,
    },
    /// The state could not be spawned, or the worker thread not started.
    Spawn(String),
}

impl fmt::Display for NewRunnerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NewRunnerError::Config(why) => write!(f, "invalid runner configuration: {why}"),
            NewRunnerError::BatchAxis(why) => write!(f, "the model has no usable batch axis: {why}"),
            NewRunnerError::NoBatchedOutput { outputs } => write!(
                f,
                "none of the model's {outputs} outputs carries the batch symbol on axis 0, so no stream could get its row back"
            ),
            NewRunnerError::MixedOutput { output, input } => write!(
                f,
                "output {output} carries no batch axis yet depends on batched input {input}: every stream of a turn would get the same value, mixed from all of them"
            ),
            NewRunnerError::Model(why) => write!(f, "cannot read the model's interface: {why}"),
            NewRunnerError::Reset { node, op, cause } => {
                write!(f, "the state cannot serve several streams: resetting its lanes failed")?;
                if let Some(node) = node {
                    write!(f, " at node {node:?}")?;
                }
                if let Some(op) = op {
                    write!(f, " (op {op})")?;
                }
                write!(f, ": {cause}")
            }
            NewRunnerError::Spawn(why) => write!(f, "cannot start the laned state: {why}"),
        }
    }
}

impl std::error::Error for NewRunnerError {}

/// A stream was not given a lane.
///
/// "Lanes" here are the runner's, every shard's together (what
/// `LanedRunner::total_lanes` says), unlike `RunnerConfig::max_lanes`,
/// which counts one shard's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpawnError {
    /// Every lane is taken (and the caller would not wait).
    Full {
        /// Lanes of every shard together, all taken.
        total_lanes: usize,
        /// Spawners waiting for a lane meanwhile.
        waiting: usize,
    },
    /// The admission queue is full: busy, retry later.
    Busy {
        /// Spawners waiting now.
        waiting: usize,
        /// Spawners that may wait (`RunnerConfig::max_waiting`).
        max_waiting: usize,
    },
    /// No lane freed up within the wait.
    TimedOut {
        /// How long the spawner waited.
        waited: std::time::Duration,
        /// Lanes of every shard together.
        total_lanes: usize,
    },
    /// The runner is draining (`stop_admitting`, or `drain`, during its
    /// wait and after it): it takes no new stream; retry elsewhere. Every
    /// spawn path is refused so (`try_spawn`, `spawn_timeout`,
    /// `spawn_async`), and converts into [`EndReason::Drained`], the end
    /// its streams are told.
    Draining,
    /// The runner was closed (`close`, or its last clone dropped) without
    /// a drain: every spawn path is refused so, and converts into
    /// [`EndReason::Closed`], the end its streams are told.
    Closed,
    /// Resetting the lane for the new stream failed.
    Reset(String),
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpawnError::Full { total_lanes, waiting } => {
                write!(
                    f,
                    "every one of the {total_lanes} lanes is taken ({waiting} streams waiting for one)"
                )
            }
            SpawnError::Busy { waiting, max_waiting } => {
                write!(
                    f,
                    "busy: {waiting} streams already wait for a lane (at most {max_waiting} may); retry later"
                )
            }
            SpawnError::TimedOut { waited, total_lanes } => {
                write!(f, "no lane of the {total_lanes} freed up within {waited:?}")
            }
            SpawnError::Draining => f.write_str("the laned runner is draining and takes no new stream"),
            SpawnError::Closed => f.write_str("the laned runner was closed and takes no new stream"),
            SpawnError::Reset(why) => write!(f, "resetting the new stream's lane failed: {why}"),
        }
    }
}

impl std::error::Error for SpawnError {}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunErrorKind {
    /// The call fed another number of inputs than the model takes.
    InputCount {
        /// Inputs the call fed.
        got: usize,
        /// Inputs the model takes (its explicit state left out).
        wanted: usize,
    },
    /// An input does not match the model's fact for it.
    Input {
        /// The input's position among the caller's inputs.
        index: usize,
        /// The input's name in the model.
        name: String,
        /// The datum type and shape the call fed.
        got: String,
        /// The datum type and shape the model wants (with any symbol
        /// resolved for the call).
        wanted: String,
    },
    /// The batched inputs disagree on how many rows the call feeds.
    Rows {
        /// The input's position among the caller's inputs.
        index: usize,
        /// The input's name in the model.
        name: String,
        /// Rows it feeds.
        got: usize,
        /// Rows the batched inputs before it feed.
        first: usize,
    },
    /// A symbol that cannot be resolved per stream.
    Symbol(String),
    /// The stream's state was lost in a failed turn: spawn a new stream.
    Lost(String),
    /// The turn seating this call failed.
    Turn(String),
    /// The turn ran, but this call's outputs (or its stream's state) could
    /// not be cut from it or read.
    Output(String),
    /// The stream lost its lane for being idle: spawn a new stream.
    Evicted(String),
    /// The call was cancelled before it was answered.
    Cancelled,
    /// The call's deadline passed before any of its seats was seated: its
    /// seats left the queue, as a cancelled call's do.
    DeadlineExceeded,
    /// The runner drained past its deadline and takes no new call (after
    /// a hard close, calls are told [`RunErrorKind::Closed`]).
    Draining,
    /// Ending the stream is not possible for this model.
    Finish(String),
    /// The stream was ended with `finish`: it takes no more calls.
    Finished,
    /// An earlier call of this handle, dropped before its answer was
    /// taken, ran after all (its pulse was fed), or its verdict has not
    /// landed yet. The handle refuses new calls until
    /// [`LanedStateHandle::settle`] says which (and hands the answer over
    /// if it ran), so that a pulse retried after a timeout is never fed
    /// twice unknowingly, and a `settle` always settles one call.
    ///
    /// [`LanedStateHandle::settle`]: crate::LanedStateHandle::settle
    Unsettled,
    /// A stream's explicit state cannot be set so.
    State(String),
    /// The runner was dropped or closed (`close`).
    Closed,
    /// No stream to call: spawning it failed (a [`SpawnError`] turned into
    /// a `RunError` by `?`, so one function can spawn and call). Its
    /// [`source`](std::error::Error::source) is the spawn error.
    Spawn(SpawnError),
}

/// [`LanedStateHandle::call`](crate::LanedStateHandle::call) failed.
///
/// When the call was refused before it was queued (bad input, lost stream,
/// closed runner), [`RunError::into_inputs`] hands its inputs back.
#[derive(Debug, Clone)]
pub struct RunError {
    /// Boxed: errors are rare, and a small `Result` keeps the hot path lean.
    inner: Box<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    kind: RunErrorKind,
    inputs: Option<TVec<TValue>>,
    /// tract's own error, where tract raised one (a failed turn): the
    /// error's `source()`.
    cause: Option<Arc<TractError>>,
}

impl RunError {
    pub(crate) fn new(kind: RunErrorKind) -> RunError {
        RunError {
            inner: Box::new(Inner {
                kind,
                inputs: None,
                cause: None,
            }),
        }
    }

    pub(crate) fn with_inputs(kind: RunErrorKind, inputs: TVec<TValue>) -> RunError {
        RunError {
            inner: Box::new(Inner {
                kind,
                inputs: Some(inputs),
                cause: None,
            }),
        }
    }

    /// The same error, carrying tract's error that caused it.
    pub(crate) fn caused_by(mut self, cause: Option<Arc<TractError>>) -> RunError {
        self.inner.cause = cause;
        self
    }

    /// Why the call failed.
    pub fn kind(&self) -> &RunErrorKind {
        &self.inner.kind
    }

    /// Whether the stream is gone for good: it lost its state in a failed
    /// turn, was evicted, was ended with `finish`, or its runner was closed
    /// (dropped, or drained past its deadline). Its handle will never
    /// serve again; spawn a new stream. Any other failure concerns this
    /// call only, and the stream may call again.
    pub fn stream_is_gone(&self) -> bool {
        matches!(
            self.kind(),
            RunErrorKind::Lost(_)
                | RunErrorKind::Evicted(_)
                | RunErrorKind::Closed
                | RunErrorKind::Draining
                | RunErrorKind::Finished
        )
    }

    /// Why the stream (or, for a cancelled call, the call) ended, where
    /// this error says it ended: what a server needs to tell its client
    /// "retry" (evicted, lost, drained) or "bye" (finished, cancelled,
    /// closed). `None` for a failure of this call only (bad input, a
    /// failed turn that kept the stream's state): the stream may call
    /// again.
    ///
    /// A cancelled call, or one past its deadline, ends the call, not the
    /// stream: `Some(EndReason::Cancelled)`, while
    /// [`RunError::stream_is_gone`] stays false.
    pub fn end_reason(&self) -> Option<EndReason> {
        Some(match self.kind() {
            RunErrorKind::Lost(_) => EndReason::Lost,
            RunErrorKind::Evicted(_) => EndReason::Evicted,
            RunErrorKind::Closed => EndReason::Closed,
            RunErrorKind::Draining => EndReason::Drained,
            RunErrorKind::Finished => EndReason::Finished,
            RunErrorKind::Cancelled | RunErrorKind::DeadlineExceeded => EndReason::Cancelled,
            RunErrorKind::Spawn(SpawnError::Draining) => EndReason::Drained,
            RunErrorKind::Spawn(SpawnError::Closed) => EndReason::Closed,
            _ => return None,
        })
    }

    /// The inputs of a call refused before it was queued.
    pub fn into_inputs(self) -> Option<TVec<TValue>> {
        self.inner.inputs
    }
}

impl PartialEq for RunError {
    fn eq(&self, other: &RunError) -> bool {
        self.kind() == other.kind()
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            RunErrorKind::InputCount { got, wanted } => {
                write!(f, "the call feeds {got} inputs, the model takes {wanted}")
            }
            RunErrorKind::Input {
                index,
                name,
                got,
                wanted,
            } => {
                write!(f, "input {index} ({name:?}) is {got}, the model wants {wanted}")
            }
            RunErrorKind::Rows {
                index,
                name,
                got,
                first,
            } => write!(
                f,
                "input {index} ({name:?}) feeds {got} rows on axis 0, the batched inputs before it feed {first}"
            ),
            RunErrorKind::Symbol(why) => write!(f, "cannot resolve the symbol: {why}"),
            RunErrorKind::Lost(why) => {
                write!(
                    f,
                    "the stream lost its state in a failed turn ({why}); spawn a new stream"
                )
            }
            RunErrorKind::Turn(why) => write!(f, "the turn seating this call failed: {why}"),
            RunErrorKind::Output(why) => write!(f, "the call's outputs could not be delivered: {why}"),
            RunErrorKind::Evicted(why) => write!(f, "the stream was evicted ({why}); spawn a new stream"),
            RunErrorKind::Cancelled => f.write_str("the call was cancelled"),
            RunErrorKind::DeadlineExceeded => f.write_str("the call's deadline passed before it was seated"),
            RunErrorKind::Draining => f.write_str("the laned runner is draining and takes no new call"),
            RunErrorKind::Finish(why) => write!(f, "cannot end the stream: {why}"),
            RunErrorKind::Finished => f.write_str("the stream was finished and takes no more calls; spawn a new stream"),
            RunErrorKind::Unsettled => f.write_str(
                "an earlier call of this handle, dropped before its answer was taken, ran after all or is not decided yet: `settle` it before calling again",
            ),
            RunErrorKind::State(why) => write!(f, "cannot set the stream's state: {why}"),
            RunErrorKind::Closed => f.write_str("the laned runner was closed"),
            RunErrorKind::Spawn(why) => write!(f, "no stream to call: {why}"),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match (self.kind(), &self.inner.cause) {
            (RunErrorKind::Spawn(why), _) => Some(why),
            // tract's error chain, whole (`anyhow`'s `chain()` walks it).
            (_, Some(cause)) => {
                let cause: &(dyn std::error::Error + Send + Sync + 'static) = (**cause).as_ref();
                Some(cause)
            }
            _ => None,
        }
    }
}

/// A spawn refused, as the error of a function that spawns and then calls.
impl From<SpawnError> for RunError {
    fn from(why: SpawnError) -> RunError {
        RunError::new(RunErrorKind::Spawn(why))
    }
}

/// Why a stream ended, as [`LanedStateHandle::end_reason`] and
/// [`RunError::end_reason`] tell it.
///
/// [`LanedStateHandle::end_reason`]: crate::LanedStateHandle::end_reason
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EndReason {
    /// The stream was ended by its caller: `finish` fed its last pulse.
    Finished,
    /// The stream lost its lane for being idle.
    Evicted,
    /// The stream's state was lost in a failed turn.
    Lost,
    /// The call was cancelled (a token, a deadline, a dropped future). It
    /// ends the call only: the stream may call again.
    Cancelled,
    /// The runner was drained (`LanedRunner::drain`) and its deadline
    /// passed before this stream ended.
    Drained,
    /// The runner was dropped or closed.
    Closed,
}

impl EndReason {
    /// Whether a client told of this end may come back and be served as a
    /// new stream (on this runner or on another replica): evicted, lost,
    /// drained.
    pub fn may_retry(self) -> bool {
        matches!(self, EndReason::Evicted | EndReason::Lost | EndReason::Drained)
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EndReason::Finished => "finished",
            EndReason::Evicted => "evicted for being idle",
            EndReason::Lost => "lost its state in a failed turn",
            EndReason::Cancelled => "cancelled",
            EndReason::Drained => "drained: the runner is going away",
            EndReason::Closed => "closed: the runner was closed or dropped",
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// One function may spawn and call with `?`: a refused spawn becomes a
    /// `RunError` that says so, keeps the spawn error as its source, and
    /// tells a draining runner's refusal as the end it is.
    #[test]
    fn a_spawn_error_becomes_a_run_error_with_its_source() {
        fn spawn_then_call(spawned: Result<(), SpawnError>) -> Result<(), RunError> {
            spawned?;
            Ok(())
        }
        let busy = SpawnError::Busy {
            waiting: 3,
            max_waiting: 3,
        };
        let e = spawn_then_call(Err(busy.clone())).unwrap_err();
        assert_eq!(*e.kind(), RunErrorKind::Spawn(busy.clone()));
        assert_eq!(e.to_string(), format!("no stream to call: {busy}"));
        let source = std::error::Error::source(&e).expect("the spawn error as source");
        assert_eq!(source.downcast_ref::<SpawnError>(), Some(&busy));
        assert_eq!(e.end_reason(), None);
        let draining = spawn_then_call(Err(SpawnError::Draining)).unwrap_err();
        assert_eq!(draining.end_reason(), Some(EndReason::Drained));
        assert!(std::error::Error::source(&RunError::new(RunErrorKind::Cancelled)).is_none());
    }
}
