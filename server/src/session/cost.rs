//! What a client may cost a session beyond its audio: a budget of frames
//! that carry none ([`ControlBudget`]), and whether it takes its replies
//! ([`Taken`]).

use std::time::Duration;

use axum::extract::ws::Message;

/// Non-audio frames (pings, pongs, empty binary frames) a connection may
/// send in a burst; past it, [`CONTROL_PER_SEC`] a second. A connection
/// over it is closed 1008: a flood of frames that carry no audio costs the
/// server at most this many frames' reading (each at most 125 bytes of
/// control payload), whether or not the client reads its pongs.
pub const CONTROL_BURST: u32 = 64;
/// See [`CONTROL_BURST`].
pub const CONTROL_PER_SEC: u32 = 32;

/// The reason a connection flooding non-audio frames is closed with.
pub(crate) fn too_many_frames() -> String {
    format!("too many frames without audio: {CONTROL_BURST} at once, {CONTROL_PER_SEC} a second at most")
}

/// A connection's budget of non-audio frames (a token bucket).
pub(crate) struct ControlBudget {
    tokens: f64,
    at: tokio::time::Instant,
}

impl ControlBudget {
    pub(crate) fn new() -> ControlBudget {
        ControlBudget {
            tokens: CONTROL_BURST as f64,
            at: tokio::time::Instant::now(),
        }
    }

    /// Spend one frame's token; `false` when none is left.
    pub(crate) fn spend(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        let earned = (now - self.at).as_secs_f64() * CONTROL_PER_SEC as f64;
        self.tokens = (self.tokens + earned).min(CONTROL_BURST as f64);
        self.at = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

/// Whether the client takes its replies: the server pings after replying
/// (at most every quarter of `idle`), and a ping not answered (pong) within
/// `idle` means the client has read nothing since (every WebSocket client
/// answers a ping when it reads): the session is closed 1008 and its lane
/// freed, however much the kernel's buffers could still hold.
pub(crate) struct Taken {
    idle: Duration,
    /// The ping waiting for its pong, sent then.
    outstanding: Option<tokio::time::Instant>,
    /// The last ping sent.
    last: Option<tokio::time::Instant>,
}

impl Taken {
    pub(crate) fn new(idle: Duration) -> Taken {
        Taken {
            idle,
            outstanding: None,
            last: None,
        }
    }

    /// Past when the client has not taken its replies.
    pub(crate) fn deadline(&self) -> Option<tokio::time::Instant> {
        self.outstanding.map(|at| at + self.idle)
    }

    /// Whether the deadline has passed.
    pub(crate) fn overdue(&self) -> bool {
        self.deadline().is_some_and(|d| tokio::time::Instant::now() >= d)
    }

    /// A pong came: the client reads.
    pub(crate) fn ponged(&mut self) {
        self.outstanding = None;
    }

    /// The ping to follow the replies just sent to answer call `n`, if one
    /// is due.
    pub(crate) fn ping(&mut self, n: u64) -> Option<Message> {
        let now = tokio::time::Instant::now();
        let due = self.outstanding.is_none() && self.last.is_none_or(|at| now >= at + self.idle / 4);
        due.then(|| {
            self.outstanding = Some(now);
            self.last = Some(now);
            Message::Ping(n.to_le_bytes().to_vec().into())
        })
    }
}
