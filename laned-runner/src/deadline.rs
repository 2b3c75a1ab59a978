//! Deadlines of calls made by tasks (`call_until_async`): one thread per
//! runner, started at the first such call, that cancels each call whose
//! deadline passes, exactly as a [`CancelToken`](crate::CancelToken) does
//! (the engine then drops its seats if none was seated, and the call is
//! answered `DeadlineExceeded`). A blocking `call_until` needs no thread:
//! its caller waits with a timeout and cancels the call itself.
//!
//! Entries of calls answered before their deadline stay until it passes
//! (their slot has moved on to another call number by then, so the cancel
//! is ignored, as a late token's is); the heap holds at most the deadlines
//! of the last few seconds.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use crate::slot::Cancel;
use crate::sync::{lock, Condvar, Mutex};

/// Who may touch it: any task registering a deadline; the timer thread
/// taking the due ones; the closing thread.
pub(crate) struct Timer {
    state: Mutex<State>,
    cv: Condvar,
}

struct State {
    /// Deadlines, the earliest first.
    due: BinaryHeap<Reverse<Entry>>,
    next: u64,
    started: bool,
    closed: bool,
}

struct Entry {
    at: Instant,
    /// Ties broken by arrival, so entries never compare equal.
    seq: u64,
    slot: Weak<dyn Cancel>,
    call: u64,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Entry) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Entry) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl Timer {
    pub fn new() -> Timer {
        Timer {
            state: Mutex::new(State {
                due: BinaryHeap::new(),
                next: 0,
                started: false,
                closed: false,
            }),
            cv: Condvar::new(),
        }
    }

    /// Cancel call number `call` of `slot` at `at`. Returns false once the
    /// runner closed, or when the thread cannot be started (the caller
    /// then answers the call as a closed runner would).
    pub fn add(self: &Arc<Timer>, at: Instant, slot: Weak<dyn Cancel>, call: u64) -> bool {
        let mut state = lock(&self.state);
        if state.closed {
            return false;
        }
        let seq = state.next;
        state.next += 1;
        let earliest = state.due.peek().is_none_or(|Reverse(e)| at < e.at);
        state.due.push(Reverse(Entry { at, seq, slot, call }));
        if !state.started {
            let timer = self.clone();
            let started = std::thread::Builder::new()
                .name("laned-deadlines".into())
                .spawn(move || timer.run());
            if started.is_err() {
                state.due.clear();
                return false;
            }
            state.started = true;
        } else if earliest {
            drop(state);
            self.cv.notify_one();
        }
        true
    }

    /// The thread: sleep until the earliest deadline, cancel what is due,
    /// until closed.
    fn run(&self) {
        let mut state = lock(&self.state);
        loop {
            if state.closed {
                return;
            }
            let now = Instant::now();
            let mut due = vec![];
            while state.due.peek().is_some_and(|Reverse(e)| e.at <= now) {
                let Reverse(entry) = state.due.pop().expect("peeked");
                due.push(entry);
            }
            if !due.is_empty() {
                // Cancelled outside the lock: a cancel takes the slot's.
                drop(state);
                for entry in due {
                    if let Some(slot) = entry.slot.upgrade() {
                        slot.cancel(entry.call);
                    }
                }
                state = lock(&self.state);
                continue;
            }
            state = match state.due.peek().map(|Reverse(e)| e.at) {
                Some(at) => {
                    self.cv
                        .wait_timeout(state, at.saturating_duration_since(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.cv.wait(state).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }

    /// Stop the thread (it exits at its next look) and forget every
    /// deadline: the runner answers every call itself on closing.
    pub fn close(&self) {
        let mut state = lock(&self.state);
        state.closed = true;
        state.due.clear();
        drop(state);
        self.cv.notify_all();
    }
}
