//! The admission queue: spawners waiting for a lane on any shard, served in
//! arrival order. A waiter takes a ticket; only the front ticket tries the
//! shards; every freed lane (any shard) wakes the waiters.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::sync::{lock, Condvar, Mutex, MutexGuard};

use crate::err::SpawnError;

/// Who may touch it: spawners (take and return tickets, wait), engines (tell
/// a lane freed up), the closing or draining thread (refuse everyone).
pub(crate) struct Admission {
    state: Mutex<State>,
    cv: Condvar,
    max_waiting: usize,
    /// The spawners-waiting gauge of the `metrics` facade (nothing without
    /// the feature); set under the lock, so it follows the queue in order.
    meters: crate::facade::AdmissionMeters,
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
    /// Tasks waiting (`spawn_async`), woken with the threads on the condvar.
    wakers: Vec<Waker>,
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
    pub fn new(max_waiting: usize, meters: crate::facade::AdmissionMeters) -> Admission {
        Admission {
            state: Mutex::new(State {
                next_ticket: 0,
                queue: VecDeque::new(),
                freed: 0,
                refused: None,
                wakers: Vec::new(),
            }),
            cv: Condvar::new(),
            max_waiting,
            meters,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Wake every waiter, threads and tasks, to look again.
    fn wake_all(&self, mut state: MutexGuard<'_, State>) {
        let wakers = std::mem::take(&mut state.wakers);
        drop(state);
        self.cv.notify_all();
        for waker in wakers {
            waker.wake();
        }
    }

    /// A task's [`Admission::wait_turn`] without deadline: ready to try the
    /// shards when `ticket` is at the front and either it did not try at
    /// the front last time (`tried` false: it moved up since) or a lane was
    /// freed since `seen`; or once woken after it registered (anything may
    /// have changed); an error once refused.
    pub fn poll_turn(
        &self,
        ticket: &Ticket,
        seen_freed: u64,
        tried: bool,
        registered: &mut bool,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), SpawnError>> {
        let mut state = self.lock();
        if let Some(e) = &state.refused {
            return Poll::Ready(Err(e.clone()));
        }
        let front = state.queue.front() == Some(&ticket.0);
        // A ticket that reached the front after its last look (the one
        // before it left between that look and this poll, and woke only
        // those registered then) must try now: no later wake is due.
        if *registered || (front && (!tried || state.freed != seen_freed)) {
            return Poll::Ready(Ok(()));
        }
        state.wakers.push(cx.waker().clone());
        *registered = true;
        Poll::Pending
    }

    /// Whether new spawners are refused (a drain or a close started).
    pub fn is_refused(&self) -> bool {
        self.lock().refused.is_some()
    }

    /// Why spawns are refused, if they are (`Draining` after a drain
    /// started, `Closed` after a close): what a spawn request reaching an
    /// engine then is told, whichever path it took.
    pub fn refusal(&self) -> Option<SpawnError> {
        self.lock().refused.clone()
    }

    /// The `freed` counter: a lane was freed (or a drain started) since a
    /// caller read it if it moved. Blocks until it moves past `seen` or
    /// `until` passes.
    pub fn wait_freed(&self, seen: u64, until: Instant) {
        let mut state = self.lock();
        while state.freed == seen {
            let now = Instant::now();
            if now >= until {
                return;
            }
            state = self
                .cv
                .wait_timeout(state, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Spawners waiting now.
    pub fn waiting(&self) -> usize {
        self.lock().queue.len()
    }

    /// A ticket at the back of the queue, or `Busy` past `max_waiting`.
    pub fn enter(&self) -> Result<Ticket, SpawnError> {
        self.ticket(|queued| queued >= self.max_waiting)
    }

    /// A ticket taken at arrival, before trying any shard (a task's spawn):
    /// nobody overtakes anybody, not even while lanes are free. A spawner
    /// finding the queue empty always gets one (it tries at once, and waits
    /// only if `max_waiting` allows: see [`Admission::may_wait`]). The
    /// tickets ahead may be tries still in flight, not waits: with
    /// `lanes_free` lanes free (the gauges' reading) that many of them get
    /// a lane, and only the rest count as waiting against `max_waiting`.
    pub fn arrive(&self, lanes_free: usize) -> Result<Ticket, SpawnError> {
        self.ticket(|queued| queued > 0 && queued >= self.max_waiting.saturating_add(lanes_free))
    }

    /// A ticket at the back of the queue, unless refused or `busy` (given
    /// the spawners queued now).
    fn ticket(&self, busy: impl Fn(usize) -> bool) -> Result<Ticket, SpawnError> {
        let mut state = self.lock();
        if let Some(e) = &state.refused {
            return Err(e.clone());
        }
        if busy(state.queue.len()) {
            return Err(SpawnError::Busy {
                waiting: state.queue.len(),
                max_waiting: self.max_waiting,
            });
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.queue.push_back(ticket);
        self.meters.waiting(state.queue.len());
        Ok(Ticket(ticket))
    }

    /// Whether a spawner at the front that found no free lane may wait
    /// (`max_waiting` is not 0); refused as busy otherwise.
    pub fn may_wait(&self) -> Result<(), SpawnError> {
        if self.max_waiting == 0 {
            return Err(SpawnError::Busy {
                waiting: 0,
                max_waiting: 0,
            });
        }
        Ok(())
    }

    /// Whether `ticket` is the oldest waiting.
    pub fn at_front(&self, ticket: &Ticket) -> bool {
        self.lock().queue.front() == Some(&ticket.0)
    }

    /// The `freed` counter, read before trying the shards.
    pub fn freed(&self) -> u64 {
        self.lock().freed
    }

    /// Wait until `ticket` is at the front and a lane may be free (it did
    /// not try at the front last time, `tried` false, or a lane was freed
    /// since `seen_freed`), or until `deadline` (`None`: a wait too long for
    /// the clock, forever).
    pub fn wait_turn(&self, ticket: &Ticket, seen_freed: u64, tried: bool, deadline: Option<Instant>) -> Next {
        let mut state = self.lock();
        let mut first = true;
        loop {
            if let Some(e) = &state.refused {
                return Next::Leave(e.clone());
            }
            let front = state.queue.front() == Some(&ticket.0);
            if front && (!tried || state.freed != seen_freed || !first) {
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
            // seen at the latest after 20 ms.
            let mut until = now + Duration::from_millis(20);
            if let Some(deadline) = deadline {
                until = until.min(deadline);
            }
            state = self
                .cv
                .wait_timeout(state, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            first = false;
        }
    }

    /// Leave the queue (admitted, refused or out of time); the next waiter
    /// moves to the front.
    pub fn leave(&self, ticket: Ticket) {
        let mut state = self.lock();
        state.queue.retain(|t| *t != ticket.0);
        self.meters.waiting(state.queue.len());
        self.wake_all(state);
    }

    /// A lane freed up on some shard: waiters try again.
    pub fn lane_freed(&self) {
        let mut state = self.lock();
        state.freed += 1;
        self.wake_all(state);
    }

    /// Refuse every waiter and every later spawner with `why`.
    pub fn refuse(&self, why: SpawnError) {
        let mut state = self.lock();
        state.refused.get_or_insert(why);
        self.wake_all(state);
    }
}

/// A task's place in the queue: leaves it however the task's future ends
/// (admitted, refused, or dropped while waiting).
pub(crate) struct Place<'a> {
    admission: &'a Admission,
    ticket: Option<Ticket>,
}

impl<'a> Place<'a> {
    pub fn new(admission: &'a Admission, ticket: Ticket) -> Place<'a> {
        Place {
            admission,
            ticket: Some(ticket),
        }
    }

    pub fn ticket(&self) -> &Ticket {
        self.ticket.as_ref().expect("held until dropped")
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.admission.leave(ticket);
        }
    }
}
