//! Who holds a shard's engine on this thread, in types: the thread-local
//! knowledge a waker needs when it calls back into the runner from inside
//! a holder (as tokio's worker keeps its `Core` in its thread's context
//! while it runs a task, and takes it back after).
//!
//! - **Lent engines.** The thread holding a shard's engine runs the tasks'
//!   wakes it kept (`Shared::wake_kept`) without
//!   letting the lock go; for their duration it *moves* the engine out of
//!   its lock into [`LENT`], so that a waker calling back into that shard
//!   (a spawn, a call, a dropped handle) is served with it on the spot
//!   ([`with_lent`]) instead of waiting for a lock its own thread holds.
//!   When the wakes return (or unwind), the engine moves back. A stack: a
//!   waker may hold another shard and lend it in turn. No pointer is kept:
//!   whoever uses a lent engine has it by value for the while, so it is
//!   never reached two ways at once.
//! - **The worker's home.** A worker thread records its shard
//!   ([`set_worker`]): its own waker, run between its rounds with the
//!   engine let go, is served on the spot rather than left waiting for the
//!   worker, which is itself.
//!
//! A shard is known here only as an owner of an engine (any `Arc`), so the
//! shared part uses this module and not the other way round.

use std::any::Any;
use std::cell::RefCell;
use std::sync::Arc;

use crate::engine::Engine;

/// A shard, as this module knows it: who owns the engine.
type Owner = Arc<dyn Any + Send + Sync>;

/// Whether `owner` is `shard`.
fn is<T: Any + Send + Sync>(owner: &Owner, shard: &T) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(owner), shard as *const T)
}

/// One engine lent to this thread's wakers: its shard, and the engine
/// (`None` while a waker uses it).
struct Lent {
    shard: Owner,
    engine: Option<Box<Engine>>,
}

thread_local! {
    /// The engines this thread's holders lent to the wakes they run, the
    /// latest last. Who may touch it: this thread only.
    static LENT: RefCell<Vec<Lent>> = const { RefCell::new(Vec::new()) };
    /// The shard whose worker this thread is, `None` on any other thread.
    static WORKER_OF: RefCell<Option<Owner>> = const { RefCell::new(None) };
}

/// Run `wakes` with the engine in `slot` (taken out of its lock, which
/// the caller keeps holding) lent to them, then put it back, even if
/// `wakes` unwinds. On a thread whose locals are being torn down (a call
/// from another thread-local's destructor) the wakes run unlent: the
/// engine never leaves its lock for a stack that is gone.
pub(super) fn lend<T: Any + Send + Sync>(shard: &Arc<T>, slot: &mut Option<Box<Engine>>, wakes: impl FnOnce()) {
    /// Puts the engine back into its lock when the wakes are over.
    struct Back<'a> {
        slot: &'a mut Option<Box<Engine>>,
        depth: usize,
    }
    impl Drop for Back<'_> {
        fn drop(&mut self) {
            // Wakers lend in turn and take back before returning, so the
            // entry pushed below is the last one again. The stack is alive:
            // it was when the entry was pushed, and a thread's locals are
            // torn down one after the other, not while one of them runs.
            let lent = LENT.try_with(|l| {
                let mut l = l.borrow_mut();
                debug_assert_eq!(l.len(), self.depth + 1, "a waker's lend outlived it");
                l.pop()
            });
            *self.slot = lent.ok().flatten().and_then(|lent| lent.engine);
        }
    }
    let pushed = LENT.try_with(|l| {
        let mut l = l.borrow_mut();
        l.push(Lent {
            shard: shard.clone() as Owner,
            engine: slot.take(),
        });
        l.len() - 1
    });
    match pushed {
        Ok(depth) => {
            let _back = Back { slot, depth };
            wakes();
        }
        Err(_) => wakes(),
    }
}

/// Run `f` with `shard`'s engine if this thread lent it to the wakes it
/// runs (a waker calling back); `None` when it did not. The engine is
/// taken out of its entry for the while and put back after, even if `f`
/// unwinds; `f` may lend other engines in turn.
pub(super) fn with_lent<T: Any + Send + Sync, R>(shard: &Arc<T>, f: impl FnOnce(&mut Engine) -> R) -> Option<R> {
    /// Puts the engine back into its entry when `f` is over.
    struct Back {
        at: usize,
        engine: Option<Box<Engine>>,
    }
    impl Drop for Back {
        fn drop(&mut self) {
            let engine = self.engine.take();
            let _ = LENT.try_with(|l| l.borrow_mut()[self.at].engine = engine);
        }
    }
    let (at, engine) = LENT
        .try_with(|l| {
            let mut l = l.borrow_mut();
            let at = l.iter().rposition(|lent| is(&lent.shard, &**shard))?;
            // Already in use further up this thread: a waker's serving never
            // runs wakes itself (they stay kept for the lender), so this is
            // not reached; the caller then waits for the lock as anyone
            // would.
            let engine = l[at].engine.take()?;
            Some((at, engine))
        })
        .ok()
        .flatten()?;
    let mut back = Back {
        at,
        engine: Some(engine),
    };
    Some(f(back.engine.as_deref_mut().expect("taken above")))
}

/// The shard this thread serves while it runs tasks' wakes (a waker
/// calling back into the runner): the one whose engine it lent last, or
/// the one it is the worker of.
pub(super) fn home<T: Any + Send + Sync>() -> Option<Arc<T>> {
    // Nothing while this thread's locals are torn down.
    let lent = LENT.try_with(|l| l.borrow().last().map(|lent| lent.shard.clone()));
    lent.ok()
        .flatten()
        .or_else(|| WORKER_OF.try_with(|w| w.borrow().clone()).ok().flatten())
        .and_then(|owner| owner.downcast().ok())
}

/// This thread is `shard`'s worker, from now on.
pub(super) fn set_worker<T: Any + Send + Sync>(shard: &Arc<T>) {
    WORKER_OF.with(|w| *w.borrow_mut() = Some(shard.clone() as Owner));
}

/// Whether this thread is `shard`'s worker.
pub(super) fn is_worker_of<T: Any + Send + Sync>(shard: &T) -> bool {
    WORKER_OF
        .try_with(|w| w.borrow().as_ref().is_some_and(|me| is(me, shard)))
        .unwrap_or(false)
}
