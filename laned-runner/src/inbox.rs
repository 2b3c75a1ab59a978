//! A shard's inbox: the requests its engine has not seen yet, the lock the
//! runner's life (`life`) is stepped under for its shard, and the *sleeper rule* that decides which push wakes
//! the thread serving the engine.
//!
//! The rule: that thread, before it sleeps on the inbox, says after how
//! many more queued seats it must be woken ([`Inbox::sleep`]); a push of a
//! call signals only once the seats pushed since reach that count, any
//! other push (a spawn, a release, a cancel) signals at once. Arrivals
//! change a turn policy's decision only by filling the turn, so nothing is
//! decided late, and a lingering worker is not woken once per call. A
//! sleeper that was signalled, or that woke for another reason, clears its
//! wish, so a later push never signals a thread that is not asleep.
//!
//! Model-checked with loom (`cargo xtask loom`): a sleeper waiting for seats
//! is woken once they are pushed, and by any other push.

use std::time::Duration;

use std::sync::Arc;

use crate::life::Life;
use crate::sync::{AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};

/// Who may touch it: any thread pushes (handles, spawners, drops, the
/// closing thread); the thread holding the engine takes the requests and
/// sleeps on it.
pub(crate) struct Inbox<R> {
    state: Mutex<Inner<R>>,
    /// Signalled by a push that can change the sleeper's mind, and by
    /// [`Inbox::notify_all`] (close, drain, a new policy).
    arrived: Condvar,
    /// Requests ever pushed: incremented under the lock, read without it by
    /// a worker spinning for the next arrival.
    pushed: AtomicUsize,
    /// Seats of the calls in `requests` (pushed, not taken in by the
    /// engine yet): written under the lock, read without it by
    /// `LanedRunner::capacity`, which counts them as queued.
    waiting_seats: AtomicUsize,
    /// The runner's life: steps 5 (draining) and 7 (closed) are set under
    /// this inbox's lock, and its sleepers woken, by [`Inbox::start_draining`]
    /// and [`Inbox::close`]; read by whoever holds the lock.
    life: Arc<Life>,
}

/// What the inbox lock guards.
pub(crate) struct Inner<R> {
    pub requests: Vec<R>,
    /// While the engine's thread sleeps on `arrived`: the seats that must
    /// be pushed before it is woken. `None`: nobody sleeps, pushes need not
    /// signal. Set by the sleeper, cleared by the push that wakes it or by
    /// the sleeper on waking.
    sleeper: Option<usize>,
    /// Seats pushed since the sleeper went to sleep.
    pushed_seats: usize,
    /// Seats of the calls in `requests`, taken back by [`Inbox::take`].
    seats: usize,
}

impl<R> Inbox<R> {
    pub fn new(life: Arc<Life>) -> Inbox<R> {
        Inbox {
            state: Mutex::new(Inner {
                requests: Vec::new(),
                sleeper: None,
                pushed_seats: 0,
                seats: 0,
            }),
            arrived: Condvar::new(),
            pushed: AtomicUsize::new(0),
            waiting_seats: AtomicUsize::new(0),
            life,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner<R>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `request`, a call of `seats` seats or (`None`) anything else,
    /// and wake the sleeper if it is what it waits for. Handed back once the
    /// inbox is closed: nobody takes requests any more, the caller answers.
    pub fn push(&self, request: R, seats: Option<usize>) -> Result<(), R> {
        let mut inner = self.lock();
        if self.life.is_closed() {
            return Err(request);
        }
        // Only a push that can change the sleeper's mind signals: a futex
        // wake and a context switch per call would cost the worker more
        // than the turn under a linger or a latency budget.
        let wake = match (seats, inner.sleeper) {
            (_, None) => false,
            (Some(seats), Some(wanted)) => {
                inner.pushed_seats += seats;
                inner.pushed_seats >= wanted
            }
            (None, Some(_)) => true,
        };
        inner.requests.push(request);
        self.pushed.fetch_add(1, Ordering::Release);
        if let Some(seats) = seats {
            inner.seats += seats;
            self.waiting_seats.fetch_add(seats, Ordering::Relaxed);
        }
        if wake {
            inner.sleeper = None;
        }
        drop(inner);
        if wake {
            self.arrived.notify_one();
        }
        Ok(())
    }

    /// Take every request pushed so far (the engine's thread, holding the
    /// lock).
    pub fn take(&self, inner: &mut Inner<R>) -> Vec<R> {
        self.waiting_seats
            .fetch_sub(std::mem::take(&mut inner.seats), Ordering::Relaxed);
        std::mem::take(&mut inner.requests)
    }

    /// Seats pushed and not taken in yet (a gauge: read without the lock).
    pub fn waiting_seats(&self) -> usize {
        self.waiting_seats.load(Ordering::Relaxed)
    }

    /// Requests ever pushed (see `pushed`).
    pub fn pushed(&self) -> usize {
        self.pushed.load(Ordering::Acquire)
    }

    /// Sleep (the engine's thread) until `seats` more seats are pushed, or
    /// anything else is, or [`Inbox::notify_all`] is called, or `timeout`
    /// passes (`None`: no timeout). May wake early: the caller looks again.
    pub fn sleep<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner<R>>,
        seats: usize,
        timeout: Option<Duration>,
    ) -> MutexGuard<'a, Inner<R>> {
        inner.sleeper = Some(seats.max(1));
        inner.pushed_seats = 0;
        let mut inner = match timeout {
            None => self.arrived.wait(inner).unwrap_or_else(|e| e.into_inner()),
            Some(timeout) => {
                self.arrived
                    .wait_timeout(inner, timeout)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
        };
        inner.sleeper = None;
        inner
    }

    /// Wake whoever sleeps on the inbox (a new policy).
    pub fn notify_all(&self) {
        self.arrived.notify_all();
    }

    /// The runner's life, as this inbox's lock holder reads it.
    pub fn life(&self) -> &Life {
        &self.life
    }

    /// Step 5 for this shard: the runner drains; whoever sleeps on the
    /// inbox is woken to see it.
    pub fn start_draining(&self) {
        let inner = self.lock();
        self.life.start_draining();
        drop(inner);
        self.arrived.notify_all();
    }

    /// Step 7 for this shard: the runner is closed; from now on a push is
    /// handed back, and whoever sleeps on the inbox is woken to see it.
    pub fn close(&self) {
        let inner = self.lock();
        self.life.close();
        drop(inner);
        self.arrived.notify_all();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Takes requests until `wanted` seats came, sleeping as the engine's
    /// thread does in between; returns the requests taken.
    fn serve_until(inbox: &Inbox<usize>, wanted: usize) -> Vec<usize> {
        let mut taken = vec![];
        let mut inner = inbox.lock();
        loop {
            taken.append(&mut inbox.take(&mut inner));
            let seats: usize = taken.iter().sum();
            if seats >= wanted || inbox.life().is_closed() {
                return taken;
            }
            inner = inbox.sleep(inner, wanted - seats, None);
        }
    }

    /// A sleeper waiting for two seats is woken once two single-seat calls
    /// are pushed, whatever the interleaving: no missed wake-up.
    #[test]
    fn seats_pushed_wake_a_sleeper_waiting_for_them() {
        loom::model(|| {
            let inbox = Arc::new(Inbox::new(std::sync::Arc::new(Life::new())));
            let pushers: Vec<_> = (0..2)
                .map(|_| {
                    let inbox = inbox.clone();
                    loom::thread::spawn(move || inbox.push(1, Some(1)).unwrap())
                })
                .collect();
            let taken = serve_until(&inbox, 2);
            assert_eq!(taken, vec![1, 1]);
            for p in pushers {
                p.join().unwrap();
            }
        });
    }

    /// A request that is not a call wakes a sleeper at once, however many
    /// seats it waits for; so does a close.
    #[test]
    fn anything_but_a_call_wakes_the_sleeper() {
        loom::model(|| {
            let inbox = Arc::new(Inbox::new(std::sync::Arc::new(Life::new())));
            let other = inbox.clone();
            let pusher = loom::thread::spawn(move || other.push(0, None).unwrap());
            let mut inner = inbox.lock();
            while inner.requests.is_empty() {
                inner = inbox.sleep(inner, 64, None);
            }
            assert_eq!(inner.requests.drain(..).collect::<Vec<_>>(), vec![0usize]);
            drop(inner);
            pusher.join().unwrap();

            let closer = inbox.clone();
            let closing = loom::thread::spawn(move || {
                closer.close();
            });
            let taken = serve_until(&inbox, 64);
            assert!(taken.is_empty());
            closing.join().unwrap();
            assert!(inbox.push(1, Some(1)).is_err(), "a closed inbox hands requests back");
        });
    }
}
