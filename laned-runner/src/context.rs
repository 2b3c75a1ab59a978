//! What a thread holds for the runner, in one place (as tokio keeps its
//! runtime's per-thread state in its `context` module): every thread-local
//! of the crate is declared here, with who sets it and when. The modules
//! that act on them keep their logic (`wake` the kept wakes, `drive` the
//! parking, the shard's serving the lent engine); the lent engine and the
//! worker's home are handled here in full, since nothing else touches them.
//!
//! | key         | set by                                   | when                                            | read by                                   |
//! |-------------|------------------------------------------|-------------------------------------------------|-------------------------------------------|
//! | [`LENT`]    | the engine's holder ([`lend`])            | while it runs the wakes it kept, lock held       | a waker calling back ([`with_lent`], [`home`]) |
//! | [`WORKER_OF`] | a worker thread ([`set_worker`])        | once, before its loop                           | its own waker ([`is_worker_of`], [`home`]) |
//! | [`KEPT`]    | whoever holds an engine (`wake::Deferred`) | from taking the engine to the scope's close  | `wake::wake`, the holder between turns    |
//! | [`PARKER`]  | a blocking drive (`drive::on`)           | between drives (taken while one runs)           | the next drive on the thread              |
//!
//! Four keys, not one struct: each registers its destructor when first
//! used and is torn down on its own, so a waker dropped with one key at a
//! thread's end may still find the others, as before they were gathered
//! here. Every access outside a drive's own parker goes through
//! `try_with`: a call from another thread-local's destructor finds a key
//! gone and does without it (a wake runs at once, an engine stays in its
//! lock, a thread is nobody's worker).
//!
//! This module is a leaf: it knows a shard only as an owner (any `Arc`)
//! and the engine only by its type, given by whoever lends it.
//!
//! # Lent engines
//!
//! The thread holding a shard's engine runs the tasks' wakes it kept
//! (`Shared::wake_kept`) without letting the lock go; for their duration it
//! *moves* the engine out of its lock into [`LENT`], so that a waker calling
//! back into that shard (a spawn, a call, a dropped handle) is served with
//! it on the spot ([`with_lent`]) instead of waiting for a lock its own
//! thread holds. When the wakes return (or unwind), the engine moves back.
//! A stack: a waker may hold another shard and lend it in turn. No pointer
//! is kept: whoever uses a lent engine has it by value for the while, so it
//! is never reached two ways at once.
//!
//! # The worker's home
//!
//! A worker thread records its shard ([`set_worker`]): its own waker, run
//! between its rounds with the engine let go, is served on the spot rather
//! than left waiting for the worker, which is itself.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Waker;

/// A shard, as this module knows it: who owns the engine.
type Owner = Arc<dyn Any + Send + Sync>;

/// One engine lent to this thread's wakers: its shard, and the engine
/// (`None` while a waker uses it), its type erased (this module is a leaf).
struct Lent {
    shard: Owner,
    engine: Option<Box<dyn Any>>,
}

/// The wakes kept by this thread's open scopes (see `wake`).
pub(crate) struct Kept {
    /// Scopes open on this thread (nested scopes run their wakes when the
    /// outermost closes).
    pub(crate) open: usize,
    pub(crate) wakers: Vec<Waker>,
}

/// Wakes the thread driving a future (see `drive::on`).
pub(crate) struct Parker {
    pub(crate) thread: std::thread::Thread,
    /// Set by a wake, taken by the driver before it parks: a wake that
    /// lands between a poll and the park is not lost.
    pub(crate) woken: AtomicBool,
}

impl std::task::Wake for Parker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

thread_local! {
    /// The engines this thread's holders lent to the wakes they run, the
    /// latest last. Set by [`lend`] (the holder, around `run_kept`), taken
    /// and put back by [`with_lent`] (a waker calling back), popped when
    /// the wakes are over. Who may touch it: this thread only.
    static LENT: RefCell<Vec<Lent>> = const { RefCell::new(Vec::new()) };
    /// The shard whose worker this thread is, `None` on any other thread.
    /// Set once by [`set_worker`], at the top of the worker's loop; read by
    /// its own wakers. Who may touch it: this thread only.
    static WORKER_OF: RefCell<Option<Owner>> = const { RefCell::new(None) };
    /// The wakes kept by the open scope of this thread, if one is open.
    /// Opened by whoever takes an engine (`wake::Deferred`), filled by
    /// `wake::wake` meanwhile, run at the outermost scope's close or
    /// between turns (`wake::run_kept`). Who may touch it: this thread
    /// only.
    pub(crate) static KEPT: RefCell<Kept> = const { RefCell::new(Kept { open: 0, wakers: Vec::new() }) };
    /// This thread's parker, kept between drives so a blocking call
    /// allocates none; taken while a drive uses it, so a drive nested in
    /// another (a waker calling back) gets its own and never takes the
    /// outer one's wake. Taken and put back by `drive::on`. Who may touch
    /// it: this thread only.
    pub(crate) static PARKER: Cell<Option<Arc<Parker>>> = const { Cell::new(None) };
}

/// Whether `owner` is `shard`.
fn is<T: Any + Send + Sync>(owner: &Owner, shard: &T) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(owner), shard as *const T)
}

/// Run `wakes` with the engine in `slot` (taken out of its lock, which
/// the caller keeps holding) lent to them, then put it back, even if
/// `wakes` unwinds. On a thread whose locals are being torn down (a call
/// from another thread-local's destructor) the wakes run unlent: the
/// engine never leaves its lock for a stack that is gone.
pub(crate) fn lend<T: Any + Send + Sync, E: Any>(shard: &Arc<T>, slot: &mut Option<Box<E>>, wakes: impl FnOnce()) {
    /// Puts the engine back into its lock when the wakes are over.
    struct Back<'a, E: Any> {
        slot: &'a mut Option<Box<E>>,
        depth: usize,
    }
    impl<E: Any> Drop for Back<'_, E> {
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
            // The engine comes back as the type it was lent as.
            *self.slot = lent
                .ok()
                .flatten()
                .and_then(|lent| lent.engine)
                .and_then(|engine| engine.downcast().ok());
        }
    }
    let pushed = LENT.try_with(|l| {
        let mut l = l.borrow_mut();
        l.push(Lent {
            shard: shard.clone() as Owner,
            engine: slot.take().map(|engine| engine as Box<dyn Any>),
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
pub(crate) fn with_lent<T: Any + Send + Sync, E: Any, R>(shard: &Arc<T>, f: impl FnOnce(&mut E) -> R) -> Option<R> {
    /// Puts the engine back into its entry when `f` is over.
    struct Back<E: Any> {
        at: usize,
        engine: Option<Box<E>>,
    }
    impl<E: Any> Drop for Back<E> {
        fn drop(&mut self) {
            let engine = self.engine.take().map(|engine| engine as Box<dyn Any>);
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
            // A shard lends one type of engine: this is it.
            match engine.downcast::<E>() {
                Ok(engine) => Some((at, engine)),
                Err(engine) => {
                    l[at].engine = Some(engine);
                    None
                }
            }
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
pub(crate) fn home<T: Any + Send + Sync>() -> Option<Arc<T>> {
    // Nothing while this thread's locals are torn down.
    let lent = LENT.try_with(|l| l.borrow().last().map(|lent| lent.shard.clone()));
    lent.ok()
        .flatten()
        .or_else(|| WORKER_OF.try_with(|w| w.borrow().clone()).ok().flatten())
        .and_then(|owner| owner.downcast().ok())
}

/// This thread is `shard`'s worker, from now on.
pub(crate) fn set_worker<T: Any + Send + Sync>(shard: &Arc<T>) {
    WORKER_OF.with(|w| *w.borrow_mut() = Some(shard.clone() as Owner));
}

/// Whether this thread is `shard`'s worker.
pub(crate) fn is_worker_of<T: Any + Send + Sync>(shard: &T) -> bool {
    WORKER_OF
        .try_with(|w| w.borrow().as_ref().is_some_and(|me| is(me, shard)))
        .unwrap_or(false)
}
