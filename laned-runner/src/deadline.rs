//! Deadlines of calls made by tasks (`call_until_async`): one thread per
//! runner, started with it and asleep until the first such call, that
//! cancels each call whose deadline passes, exactly as a
//! [`CancelToken`](crate::CancelToken) does (the engine then drops its
//! seats if none was seated, and the call is answered `DeadlineExceeded`).
//! A blocking `call_until` needs no thread: its caller waits with a timeout
//! and cancels the call itself.
//!
//! A call's entry leaves the timer when the call ends, answered or
//! dropped (its [`Armed`] guard), so the timer holds the deadlines of the
//! calls in flight only, however far off those deadlines are.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use crate::slot::Cancel;
use crate::sync::{lock, Condvar, Mutex};

/// Who may touch it: any task registering a deadline or dropping its
/// entry; the timer thread taking the due ones; the closing thread.
pub(crate) struct Timer {
    state: Mutex<State>,
    cv: Condvar,
}

/// An entry's place: its deadline, ties broken by arrival, so that no two
/// entries share a key.
type Key = (Instant, u64);

struct State {
    /// Deadlines, the earliest first: each call's slot and its number there.
    due: BTreeMap<Key, (Weak<dyn Cancel>, u64)>,
    next: u64,
    closed: bool,
}

/// A deadline registered for one call; dropping it takes the entry out.
pub(crate) struct Armed {
    timer: Arc<Timer>,
    key: Key,
}

impl Drop for Armed {
    fn drop(&mut self) {
        lock(&self.timer.state).due.remove(&self.key);
    }
}

impl Timer {
    pub fn new() -> Timer {
        Timer {
            state: Mutex::new(State {
                due: BTreeMap::new(),
                next: 0,
                closed: false,
            }),
            cv: Condvar::new(),
        }
    }

    /// Start the thread: once, when the runner is built.
    pub fn start(self: &Arc<Timer>) -> Result<(), String> {
        let timer = self.clone();
        std::thread::Builder::new()
            .name("laned-deadlines".into())
            .spawn(move || timer.run())
            .map(|_| ())
            .map_err(|e| format!("starting the deadline thread: {e}"))
    }

    /// Cancel call number `call` of `slot` at `at`, unless the returned
    /// entry is dropped first. `None` once the runner closed: the close
    /// answers the call.
    pub fn add(self: &Arc<Timer>, at: Instant, slot: Weak<dyn Cancel>, call: u64) -> Option<Armed> {
        let mut state = lock(&self.state);
        if state.closed {
            return None;
        }
        let key = (at, state.next);
        state.next += 1;
        let earliest = state.due.first_key_value().is_none_or(|(first, _)| key < *first);
        state.due.insert(key, (slot, call));
        if earliest {
            drop(state);
            self.cv.notify_one();
        }
        Some(Armed {
            timer: self.clone(),
            key,
        })
    }

    /// The deadlines registered now (calls in flight with one).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.state).due.len()
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
            while let Some(entry) = state.due.first_entry().filter(|e| e.key().0 <= now) {
                due.push(entry.remove());
            }
            if !due.is_empty() {
                // Cancelled outside the lock: a cancel takes the slot's.
                drop(state);
                for (slot, call) in due {
                    if let Some(slot) = slot.upgrade() {
                        slot.cancel(call);
                    }
                }
                state = lock(&self.state);
                continue;
            }
            state = match state.due.first_key_value().map(|((at, _), _)| *at) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// Records the call numbers cancelled.
    #[derive(Default)]
    struct Seen(AtomicU64);

    impl Cancel for Seen {
        fn cancel(&self, call: u64) {
            self.0.fetch_add(call, Ordering::SeqCst);
        }
    }

    /// Entries of calls that ended leave at once, however far off their
    /// deadline (the timer holds the calls in flight only); a deadline
    /// still armed fires.
    #[test]
    fn ended_calls_leave_the_timer_and_armed_ones_fire() {
        let timer = Arc::new(Timer::new());
        timer.start().unwrap();
        let seen: Arc<dyn Cancel> = Arc::new(Seen::default());
        let far = Instant::now() + Duration::from_secs(3600);
        for call in 0..10_000 {
            let armed = timer.add(far, Arc::downgrade(&seen), call).unwrap();
            assert_eq!(timer.len(), 1);
            drop(armed);
        }
        assert_eq!(timer.len(), 0, "entries of ended calls stayed");
        let seen_here = Arc::new(Seen::default());
        let as_cancel: Arc<dyn Cancel> = seen_here.clone();
        let _armed = timer
            .add(Instant::now() + Duration::from_millis(5), Arc::downgrade(&as_cancel), 7)
            .unwrap();
        let start = Instant::now();
        while seen_here.0.load(Ordering::SeqCst) != 7 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the armed deadline never fired"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(timer.len(), 0);
        timer.close();
        assert!(timer.add(far, Arc::downgrade(&as_cancel), 8).is_none());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::{AtomicUsize, Ordering};

    /// Counts the cancels it gets.
    #[derive(Default)]
    struct Seen(AtomicUsize);

    impl Cancel for Seen {
        fn cancel(&self, _call: u64) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A deadline already due and a close racing the timer thread: the
    /// thread always stops (no lost wake-up on the close), and the call is
    /// cancelled at most once.
    #[test]
    fn a_close_racing_a_due_deadline_stops_the_thread_and_cancels_once() {
        loom::model(|| {
            let timer = Arc::new(Timer::new());
            let seen = Arc::new(Seen::default());
            let as_cancel: Arc<dyn Cancel> = seen.clone();
            let running = {
                let timer = timer.clone();
                loom::thread::spawn(move || timer.run())
            };
            let armed = timer.add(Instant::now(), Arc::downgrade(&as_cancel), 1);
            let closer = {
                let timer = timer.clone();
                loom::thread::spawn(move || timer.close())
            };
            closer.join().unwrap();
            running.join().unwrap();
            drop(armed);
            assert!(seen.0.load(Ordering::SeqCst) <= 1, "cancelled twice");
        });
    }

    /// An entry whose call ended (its guard dropped) before the timer
    /// looked is never cancelled, and the thread sleeps on until closed.
    #[test]
    fn an_ended_call_is_never_cancelled() {
        loom::model(|| {
            let timer = Arc::new(Timer::new());
            let seen = Arc::new(Seen::default());
            let as_cancel: Arc<dyn Cancel> = seen.clone();
            let armed = timer.add(Instant::now(), Arc::downgrade(&as_cancel), 1);
            drop(armed);
            let running = {
                let timer = timer.clone();
                loom::thread::spawn(move || timer.run())
            };
            timer.close();
            running.join().unwrap();
            assert_eq!(seen.0.load(Ordering::SeqCst), 0);
        });
    }
}
