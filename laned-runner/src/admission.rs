//! The admission queue: spawners waiting for a lane on any shard, served in
//! arrival order. A waiter takes a ticket; only the front ticket tries the
//! shards; every freed lane (any shard) wakes the waiters.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::err::SpawnError;

/// Who may touch it: spawners (take and return tickets, wait), engines (tell
/// a lane freed up), the closing or draining thread (refuse everyone).
pub(crate) struct Admission {
    state: Mutex<State>,
    cv: Condvar,
    max_waiting: usize,
}

struct State {
    next_ticket: u64,
    /// Tickets of waiting spawners, oldest first.
    queue: VecDeque<u64>,
    /// Bumped by every freed lane: a waiter that saw it move retries at once
    /// instead of waiting for a wake-up it may have missed.
    freed: u64,
    /// Set by close or drain: every waiter leaves with this.
    refused: Option<SpawnError>,
}

/// A waiter's place in the queue.
pub(crate) struct Ticket(u64);

pub(crate) enum Next {
    /// This ticket is at the front: try the shards now.
    Try,
    /// Refused (closed, draining) or out of time.
    Leave(SpawnError),
}

impl Admission {
    pub fn new(max_waiting: usize) -> Admission {
        Admission {
            state: Mutex::new(State {
                next_ticket: 0,
                queue: VecDeque::new(),
                freed: 0,
                refused: None,
            }),
            cv: Condvar::new(),
            max_waiting,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Spawners waiting now.
    pub fn waiting(&self) -> usize {
        self.lock().queue.len()
    }

    /// A ticket at the back of the queue, or `Busy` past `max_waiting`.
    pub fn enter(&self) -> Result<Ticket, SpawnError> {
        let mut state = self.lock();
        if let Some(e) = &state.refused {
            return Err(e.clone());
        }
        if state.queue.len() >= self.max_waiting {
            return Err(SpawnError::Busy {
                waiting: state.queue.len(),
                max_waiting: self.max_waiting,
            });
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.queue.push_back(ticket);
        Ok(Ticket(ticket))
    }

    /// Whether `ticket` is the oldest waiting.
    pub fn at_front(&self, ticket: &Ticket) -> bool {
        self.lock().queue.front() == Some(&ticket.0)
    }

    /// The `freed` counter, read before trying the shards.
    pub fn freed(&self) -> u64 {
        self.lock().freed
    }

    /// Wait until `ticket` is at the front and a lane may be free (or
    /// `tick` passed, for callers that must look after idle streams), or
    /// until `deadline` (`None`: a wait too long for the clock, forever).
    pub fn wait_turn(
        &self,
        ticket: &Ticket,
        seen_freed: u64,
        deadline: Option<Instant>,
        tick: Option<Duration>,
    ) -> Next {
        let mut state = self.lock();
        let mut first = true;
        loop {
            if let Some(e) = &state.refused {
                return Next::Leave(e.clone());
            }
            let front = state.queue.front() == Some(&ticket.0);
            if front && (state.freed != seen_freed || !first) {
                return Next::Try;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Next::Leave(SpawnError::TimedOut {
                    waited: Duration::ZERO,
                    total_lanes: 0,
                });
            }
            // A bounded wait: a lane freed between the try and this wait is
            // seen at the latest after the tick.
            let mut until = now + Duration::from_millis(20);
            if let Some(deadline) = deadline {
                until = until.min(deadline);
            }
            if let Some(tick) = tick {
                until = until.min(now + tick);
            }
            let (guard, timeout) = self
                .cv
                .wait_timeout(state, until - now)
                .unwrap_or_else(|e| e.into_inner());
            state = guard;
            first = false;
            if timeout.timed_out() && tick.is_some() {
                return Next::Try;
            }
        }
    }

    /// Leave the queue (admitted, refused or out of time); the next waiter
    /// moves to the front.
    pub fn leave(&self, ticket: Ticket) {
        let mut state = self.lock();
        state.queue.retain(|t| *t != ticket.0);
        drop(state);
        self.cv.notify_all();
    }

    pub fn lane_freed(&self) {
        self.lock().freed += 1;
        self.cv.notify_all();
    }

    /// Refuse every waiter and every later spawner with `why`.
    pub fn refuse(&self, why: SpawnError) {
        self.lock().refused.get_or_insert(why);
        self.cv.notify_all();
    }
}
