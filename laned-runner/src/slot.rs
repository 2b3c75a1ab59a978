//! A one-value answer channel, reused by a handle from call to call, which can
//! also be *promoted*: told that its waiter should take over running turns
//! (combining mode).

use std::sync::{Condvar, Mutex, MutexGuard};

/// Who may touch it: the waiter (one thread: the handle's caller) waits and
/// takes; whoever answers (the worker or a combining caller) fills or
/// promotes. Both sides go through `inner`.
pub(crate) struct Slot<T> {
    inner: Mutex<Inner<T>>,
    cv: Condvar,
}

struct Inner<T> {
    value: Option<T>,
    /// Set by a combiner leaving while this call is still queued; consumed by
    /// the waiter, which then tries to take the state over.
    promoted: bool,
}

pub(crate) enum Wake<T> {
    Value(T),
    Promoted,
}

impl<T> Slot<T> {
    pub fn new() -> Slot<T> {
        Slot { inner: Mutex::new(Inner { value: None, promoted: false }), cv: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        // A panic never happens while this lock is held; recover anyway.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn fill(&self, value: T) {
        let mut inner = self.lock();
        inner.value = Some(value);
        drop(inner);
        self.cv.notify_one();
    }

    pub fn promote(&self) {
        let mut inner = self.lock();
        inner.promoted = true;
        drop(inner);
        self.cv.notify_one();
    }

    pub fn is_filled(&self) -> bool {
        self.lock().value.is_some()
    }

    /// Block until a value lands or the slot is promoted.
    pub fn wait(&self) -> Wake<T> {
        let mut inner = self.lock();
        loop {
            if let Some(v) = inner.value.take() {
                inner.promoted = false;
                return Wake::Value(v);
            }
            if inner.promoted {
                inner.promoted = false;
                return Wake::Promoted;
            }
            inner = self.cv.wait(inner).unwrap_or_else(|e| e.into_inner());
        }
    }
}
