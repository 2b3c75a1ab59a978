//! A one-value answer channel, which can also be *cancelled* (its waiter
//! should give up) and *abandoned* (its waiter gave up: a late answer is
//! refused and handed back to whoever offered it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Who may touch it: the waiter (one thread: the handle's or spawner's
/// caller) waits, takes and abandons; whoever answers (the worker, a
/// combining caller or the helper) offers; a [`CancelToken`](crate::CancelToken)
/// cancels. All go through `inner`.
pub(crate) struct Slot<T> {
    inner: Mutex<Inner<T>>,
    cv: Condvar,
    /// Set (after `inner` changed) by whoever wakes the waiter, so that the
    /// waiter can spin on it for a moment before parking: an answer landing
    /// within the spin costs no futex wake on either side.
    signalled: AtomicBool,
}

struct Inner<T> {
    value: Option<T>,
    /// Set by a cancel token; consumed by the waiter.
    cancelled: bool,
    /// Set by the waiter once it gave up: no value is accepted any more.
    abandoned: bool,
    /// Set by the waiter while it sleeps on `cv`: only then does a signal
    /// need a futex wake (a spinning or running waiter sees the change
    /// itself), which saves a system call per answer.
    parked: bool,
}

/// Spin iterations before parking (a few tens of microseconds).
const SPINS: usize = 20_000;

pub(crate) enum Wake<T> {
    Value(T),
    Cancelled,
    TimedOut,
}

impl<T> Slot<T> {
    pub fn new() -> Slot<T> {
        Slot {
            inner: Mutex::new(Inner {
                value: None,
                cancelled: false,
                abandoned: false,
                parked: false,
            }),
            cv: Condvar::new(),
            signalled: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        // Nothing panics while this lock is held; recover anyway.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hand the waiter its answer; refused (and handed back) once the waiter
    /// gave up.
    pub fn offer(&self, value: T) -> Result<(), T> {
        let mut inner = self.lock();
        if inner.abandoned {
            return Err(value);
        }
        inner.value = Some(value);
        self.signal(inner);
        Ok(())
    }

    /// [`Slot::offer`] for answers nobody needs back.
    pub fn fill(&self, value: T) {
        let _ = self.offer(value);
    }

    pub fn cancel(&self) {
        let mut inner = self.lock();
        inner.cancelled = true;
        self.signal(inner);
    }

    /// Tell the waiter `inner` changed. `parked` is read under the lock the
    /// waiter sets it under before sleeping, so a waiter about to sleep
    /// either sees the change before it sleeps or is woken.
    fn signal(&self, inner: MutexGuard<'_, Inner<T>>) {
        let parked = inner.parked;
        drop(inner);
        self.signalled.store(true, Ordering::Release);
        if parked {
            self.cv.notify_one();
        }
    }

    pub fn is_filled(&self) -> bool {
        self.lock().value.is_some()
    }

    /// Give up waiting: from now on offers are refused. Returns the answer
    /// if it landed first.
    pub fn abandon(&self) -> Option<T> {
        let mut inner = self.lock();
        inner.abandoned = true;
        inner.value.take()
    }

    /// Block until a value lands, the slot is cancelled, or
    /// `deadline` passes.
    pub fn wait_until(&self, deadline: Option<Instant>, spin: bool) -> Wake<T> {
        // With `spin`, a short spin first: a light model's turn is often
        // shorter than a park and a wake-up. Bounded, so a waiter never
        // burns a core for long.
        if spin {
            for _ in 0..SPINS {
                if self.signalled.load(Ordering::Acquire) {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        self.signalled.store(false, Ordering::Relaxed);
        let mut inner = self.lock();
        loop {
            if let Some(v) = inner.value.take() {
                return Wake::Value(v);
            }
            if inner.cancelled {
                inner.cancelled = false;
                return Wake::Cancelled;
            }
            inner.parked = true;
            match deadline {
                None => inner = self.cv.wait(inner).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        inner.parked = false;
                        return Wake::TimedOut;
                    }
                    inner = self
                        .cv
                        .wait_timeout(inner, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            inner.parked = false;
        }
    }
}

/// What a cancel token can reach: the slot of the call it guards.
pub(crate) trait Cancel: Send + Sync {
    fn cancel(&self);
}

impl<T: Send> Cancel for Slot<T> {
    fn cancel(&self) {
        Slot::cancel(self)
    }
}
