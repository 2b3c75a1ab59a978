//! One stream of the soak: what it sends (drawn from the seed), and what
//! happened to it (every answer it got, each resume and restart and what
//! it was told, how it ended), as every front records it.

use std::time::{Duration, Instant};

/// After an interruption (a close, a drop, a refusal, no answer), how long
/// a client keeps trying before its stream is counted lost: `laned
/// client`'s `--resume-for-ms` default.
pub const RESUME_FOR: Duration = Duration::from_secs(30);

/// How long a client waits for an answer, a hello or an upgrade before it
/// takes the connection for gone (the longest stall the faults make is
/// 4 s).
pub const WAIT: Duration = Duration::from_secs(10);

/// A stream's plan: its id, its model (an index into the soak's models),
/// its pulses.
#[derive(Debug, Clone)]
pub struct Plan {
    pub id: String,
    pub model: usize,
    pub pulses: Vec<Vec<u8>>,
}

/// One answer as it came: the pulse it answers, its bytes, when the pulse
/// was sent and when the answer came.
#[derive(Debug, Clone)]
pub struct Answer {
    pub pulse: usize,
    pub bytes: Vec<u8>,
    pub sent: Instant,
    pub got: Instant,
}

/// How a stream ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// Every pulse answered.
    Done,
    /// Given up after [`RESUME_FOR`] of interruptions: the last thing the
    /// server said of it (a close's code and reason, a status and its
    /// message), `None` where nothing was said (a connection dropped, an
    /// answer that never came).
    Lost { told: Option<String> },
}

/// What happened to one stream, on one front.
#[derive(Debug, Clone)]
pub struct Run {
    pub front: &'static str,
    pub plan: Plan,
    pub answers: Vec<Answer>,
    /// Each time it went on past an interruption from where the server
    /// said (a record's position above 0).
    pub resumes: u32,
    /// Each time it started again at pulse 0 after answers, with the reason
    /// it was told.
    pub restarts: Vec<String>,
    /// What the server did that no client may see: an answer numbered for
    /// another pulse, a resume past what was sent.
    pub broken: Vec<String>,
    pub ended: Ended,
}

impl Run {
    /// A stream about to start.
    pub fn new(front: &'static str, plan: Plan) -> Run {
        Run {
            front,
            plan,
            answers: vec![],
            resumes: 0,
            restarts: vec![],
            broken: vec![],
            ended: Ended::Lost { told: None },
        }
    }

    /// The server said to go on from pulse `at`, the client having sent up
    /// to `next`: the pulse to send next. Past `next` is broken (a record
    /// ahead of the stream); 0 after answers a restart, with `why`.
    pub fn resume_at(&mut self, at: usize, next: usize, why: impl FnOnce() -> String) -> usize {
        if at > next {
            self.broken
                .push(format!("told to resume at pulse {at}, past the {next} pulses sent"));
            return next;
        }
        if at == 0 && next > 0 {
            self.restarts.push(why());
        } else if at > 0 {
            self.resumes += 1;
        }
        at
    }
}

/// The interruptions of one stream since its last answer: when they
/// began, and the last thing said.
#[derive(Debug, Default)]
pub struct Interrupted {
    since: Option<Instant>,
    pub told: Option<String>,
}

impl Interrupted {
    /// One more interruption, with what was said (`None`: nothing).
    pub fn add(&mut self, told: Option<String>) {
        self.since.get_or_insert_with(Instant::now);
        if told.is_some() {
            self.told = told;
        }
    }

    /// An answer came: the stream goes on.
    pub fn clear(&mut self) {
        *self = Interrupted::default();
    }

    /// Whether the client gives the stream up.
    pub fn given_up(&self) -> bool {
        self.since.is_some_and(|s| s.elapsed() > RESUME_FOR)
    }

    /// Whether an interruption is under way (the next try waits a little).
    pub fn active(&self) -> bool {
        self.since.is_some()
    }
}

/// The time before the next pulse of a stream paced at `period`, its last
/// pulse sent at `last`.
pub async fn pace(last: Option<Instant>, period: Duration) {
    if let Some(last) = last {
        tokio::time::sleep_until((last + period).into()).await;
    }
}
