//! What passes between a stream's handle (or a spawner) and the engine of
//! its shard: the requests, the checked call, the answers and grants, and
//! the settings that change while serving. Plain data: no locks, no
//! threads; the answer slots carry it across.

use std::sync::Arc;
use std::time::Instant;

use tract_core::internal::*;

use crate::err::{EndReason, RunError, RunErrorKind, SpawnError};
use crate::iface::Group;
use crate::policy::TurnPolicy;
use crate::slot::Slot;

pub(crate) type CallResult = Result<Answer, RunError>;

/// The settings that can change while the runner serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Live {
    pub policy: TurnPolicy,
    pub max_seats: usize,
    /// Whether turns are capped at the learned width (`crate::width`).
    pub learn_width: bool,
}

/// What a call is answered with. A one-row call gets the whole turn's
/// outputs and its seat: its caller slices its own row, off the worker's
/// critical path.
pub(crate) enum Answer {
    Outputs(TVec<TValue>),
    Row { turn: Arc<TVec<TValue>>, seat: usize },
}

impl Answer {
    /// The call's outputs, its row sliced out of the turn's where needed.
    pub fn into_outputs(self, batch_out: &[bool]) -> Result<TVec<TValue>, RunError> {
        match self {
            Answer::Outputs(outputs) => Ok(outputs),
            Answer::Row { turn, seat } => turn
                .iter()
                .enumerate()
                .map(|(ix, output)| {
                    if batch_out.get(ix).copied().unwrap_or(false) && output.shape()[0] > 1 {
                        output
                            .slice(0, seat, seat + 1)
                            .map(|t| t.into_tvalue())
                            .map_err(|e| RunError::new(RunErrorKind::Output(format!("slicing output {ix}: {e:#}"))))
                    } else {
                        Ok(output.clone())
                    }
                })
                .collect(),
        }
    }
}
pub(crate) type SpawnResult = Result<Grant, SpawnError>;

/// What reading a stream's state answers: its tensors and the pulses it
/// fed, read between the same two turns.
pub(crate) type ReadResult = Result<(TVec<Tensor>, u64), RunError>;

/// A lane handed to a new stream, with the stream's id: the engine answers
/// the stream's requests only while the lane is still that stream's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The shard whose engine granted it (a waiter of the admission queue
    /// may be granted a lane by any shard).
    pub shard: usize,
    pub lane: lane_table::LaneId,
    pub stream: u64,
}

/// What a handle asks of the engine.
// `Call` is the common request and is moved, not boxed: no allocation per call.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Request {
    /// A new stream wants a lane (`waited`: how long it waited in the
    /// runner's admission queue, for the metrics).
    Spawn {
        slot: Arc<Slot<SpawnResult>>,
        waited: Option<std::time::Duration>,
    },
    /// A spawner joined the admission queue and the gauges showed this
    /// shard a free lane: grant free lanes to the oldest waiters.
    Admit,
    /// A stream wants one or several seats.
    Call(Call),
    /// The last handle of a stream was dropped: its lane goes back.
    Release(Grant),
    /// The call answering into this slot was cancelled: drop its queued seats.
    Cancel(Arc<Slot<CallResult>>),
    /// A stream reads its state, with the pulses it fed (read together,
    /// between the same two turns).
    /// `export`: for a state that travels, refused once the stream lost
    /// its state (what is left of it is not the stream's).
    ReadState {
        stream: Grant,
        export: bool,
        slot: Arc<Slot<ReadResult>>,
    },
    /// Whether a stream can still be served, and why not (`None`: it can).
    Status {
        stream: Grant,
        slot: Arc<Slot<Option<EndReason>>>,
    },
    /// How many pulses a stream fed so far (every clone's calls), for
    /// `finish`.
    Pulses {
        stream: Grant,
        slot: Arc<Slot<Result<u64, RunError>>>,
    },
    /// A stream overwrites its state, and with an imported one (`pulses`
    /// given) the pulses it fed.
    WriteState {
        stream: Grant,
        state: TVec<Tensor>,
        pulses: Option<u64>,
        slot: Arc<Slot<Result<(), RunError>>>,
    },
}

/// One checked call, already split into seats on the caller's thread.
pub(crate) struct Call {
    pub stream: Grant,
    pub seats: TVec<TVec<TValue>>,
    pub group: Group,
    pub slot: Arc<Slot<CallResult>>,
    pub queued: Instant,
    /// Past this instant, none of the call's seats may be seated: whoever
    /// runs the turn answers it `DeadlineExceeded` instead.
    pub deadline: Option<Instant>,
}
