//! Waking tasks: never while the engine is held, never unguarded.
//!
//! A task's [`Waker`] is the task's code, not ours: it may panic, or call
//! back into the runner (a `try_spawn` from `wake()`). So the runner never
//! calls one from inside the engine, where a panic would unwind through the
//! state and a call back would find the engine taken. Whoever holds the
//! engine opens a [`Deferred`] scope first; every wake asked for on that
//! thread meanwhile ([`wake`]) is kept, and run when the scope closes, after
//! the engine was let go. Each wake runs under its own `catch_unwind`, so a
//! panicking waker costs its own task its wake-up and nothing else: the
//! thread, the other wakers in the list and the runner go on.
//!
//! Outside a scope (a cancel from the deadline thread, an admission refusal
//! from a closing thread) a wake runs at once, guarded the same way.
//!
//! A holder that keeps the engine a while (a combining helper serving turn
//! after turn, a worker lingering for more seats) runs the wakes kept so
//! far between turns and before it sleeps ([`run_kept`]), so no task is
//! woken late; a waker calling back into that same shard then is served on
//! the spot with the engine its holder lent it (`Shared::wake_kept`,
//! `context::lend`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::Waker;

// The kept wakes are this thread's (`context`'s `KEPT`).
use crate::context::KEPT;

/// Wake `waker`: at the close of this thread's open [`Deferred`] scope, or
/// now if none is open; a panic inside it is caught and dropped.
pub(crate) fn wake(waker: Waker) {
    let mut waker = Some(waker);
    let _ = KEPT.try_with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.open > 0 {
            kept.wakers.extend(waker.take());
        }
    });
    // No scope open, or the thread is ending (its locals gone): at once.
    if let Some(waker) = waker {
        guarded(waker);
    }
}

/// Run one wake, its panic caught: a task's waker never unwinds into ours.
fn guarded(waker: Waker) {
    let _ = catch_unwind(AssertUnwindSafe(move || waker.wake()));
}

/// A scope in which wakes are kept, to run when it closes (see the module
/// doc). Open it before taking the engine, so that it closes after the
/// engine's guard is dropped.
pub(crate) struct Deferred(());

impl Deferred {
    pub fn open() -> Deferred {
        let _ = KEPT.try_with(|kept| kept.borrow_mut().open += 1);
        Deferred(())
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        // The outermost scope takes the list and runs it with no scope
        // open: a wake that calls back into the runner (and so opens a
        // scope of its own) finds the thread as a fresh caller would.
        let wakers = KEPT.try_with(|kept| {
            let mut kept = kept.borrow_mut();
            kept.open -= 1;
            if kept.open == 0 {
                std::mem::take(&mut kept.wakers)
            } else {
                Vec::new()
            }
        });
        if let Ok(wakers) = wakers {
            run(wakers);
        }
    }
}

/// Run `wakers`, each guarded, then give the list's buffer back, so a
/// steady engine allocates nothing per turn for its wakes (unless a wake
/// kept more meanwhile).
fn run(mut wakers: Vec<Waker>) {
    for waker in wakers.drain(..) {
        guarded(waker);
    }
    let _ = KEPT.try_with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.wakers.is_empty() {
            kept.wakers = wakers;
        }
    });
}

/// Whether this thread kept wakes not run yet.
pub(crate) fn any_kept() -> bool {
    KEPT.try_with(|kept| !kept.borrow().wakers.is_empty()).unwrap_or(false)
}

/// Run the wakes kept so far now, the scope staying open: the thread
/// holding the engine calls it between turns and before it sleeps, so a
/// task is not woken late by a holder that keeps the engine (see
/// `Shared::wake_kept`, `context::lend` for the waker that calls back).
pub(crate) fn run_kept() {
    if let Ok(wakers) = KEPT.try_with(|kept| std::mem::take(&mut kept.borrow_mut().wakers)) {
        run(wakers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Counting(AtomicUsize);
    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    struct Panicking;
    impl Wake for Panicking {
        fn wake(self: Arc<Self>) {
            panic!("a hostile waker");
        }
    }

    /// Wakes inside a scope run only when it closes, every one of them,
    /// though one between them panics.
    #[test]
    fn kept_wakes_run_at_the_close_and_a_panic_costs_only_its_own() {
        let count = Arc::new(Counting(AtomicUsize::new(0)));
        {
            let _outer = Deferred::open();
            {
                let _inner = Deferred::open();
                wake(Waker::from(count.clone()));
                wake(Waker::from(Arc::new(Panicking)));
            }
            wake(Waker::from(count.clone()));
            assert_eq!(count.0.load(Ordering::SeqCst), 0, "woken inside the scope");
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        // Outside a scope: at once, still guarded.
        wake(Waker::from(Arc::new(Panicking)));
        wake(Waker::from(count.clone()));
        assert_eq!(count.0.load(Ordering::SeqCst), 3);
    }
}
