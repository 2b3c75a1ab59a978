//! The two drivers of the runner's operations. Every operation a handle or
//! a spawner performs (a call, a spawn's try of the shards, a state round
//! trip, settling, ending a stream) is written once, as a future generic
//! over a [`Wait`]: the one step where it waits for an engine's answer. A
//! task awaits it with [`Task`]; a blocking caller drives the very same
//! future on its thread with [`Thread`], through [`block`] (or [`on`],
//! which gives up at a deadline).
//!
//! - [`Task`] leaves the task's `Waker` in the answer slot and returns
//!   `Pending`; whoever lands the answer wakes it (in combining mode the
//!   poll first runs turns while the state is free).
//! - [`Thread`] blocks inside the poll, in [`Shard::wait`]: it spins a
//!   moment, then parks on the slot's condvar (so the engine can wake a
//!   wide turn's parked callers as a tree), and in combining mode runs
//!   turns while the state is free. Its waits never return `Pending`.
//!
//! Awaits that are not answer waits (a spawner's place in the admission
//! queue) wake the driver through its `Waker`: [`on`] parks the thread
//! until then, or until its deadline passes.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::context::{Parker, PARKER};
use crate::deadline::{Armed, Timer};
use crate::shard::Shard;
use crate::slot::{Cancel, Slot, Wake};

/// How an operation waits for the answer to a request it pushed.
pub(crate) trait Wait {
    /// A task's first poll of a call queues it and yields (see
    /// `call_async`); a thread has no executor to yield to.
    const YIELDS_FIRST: bool;

    /// Wait for `slot`'s answer to a request pushed to `shard`, or for a
    /// cancel of its call: [`Wake::Value`], [`Wake::Cancelled`] (a cancel
    /// token), [`Wake::TimedOut`] (the call's deadline: a thread gives up
    /// at `until`, a task is cancelled by the deadline thread).
    fn poll_answer<T>(
        &mut self,
        shard: &Shard,
        slot: &Slot<T>,
        until: Option<Instant>,
        cx: &mut Context<'_>,
    ) -> Poll<Wake<T>>;

    /// A call with a deadline is queued: whatever must cancel it when
    /// the deadline passes, kept until the call ends (`None`: nothing, the
    /// wait gives up by itself).
    fn arm(&self, timer: &Arc<Timer>, deadline: Option<Instant>, slot: &Arc<dyn Cancel>, call: u64) -> Option<Armed>;
}

/// A task's wait: leaves its waker, returns.
pub(crate) struct Task;

impl Wait for Task {
    const YIELDS_FIRST: bool = true;

    fn poll_answer<T>(
        &mut self,
        shard: &Shard,
        slot: &Slot<T>,
        _until: Option<Instant>,
        cx: &mut Context<'_>,
    ) -> Poll<Wake<T>> {
        // Combining mode: serve the state while it is free, until this
        // answer is here or its call cancelled (a deadline passing stops it
        // serving others' turns: its own seat goes first).
        shard.serve(&|| slot.is_settled());
        slot.poll_answer(cx).map(|answer| match answer {
            Ok(value) => Wake::Value(value),
            // Only the deadline thread cancels a task's call.
            Err(()) => Wake::TimedOut,
        })
    }

    fn arm(&self, timer: &Arc<Timer>, deadline: Option<Instant>, slot: &Arc<dyn Cancel>, call: u64) -> Option<Armed> {
        // `None` once the runner closed: the close answers the call.
        timer.add(deadline?, Arc::downgrade(slot), call)
    }
}

/// A thread's wait: blocks in the poll until there is something to see.
pub(crate) struct Thread;

impl Wait for Thread {
    const YIELDS_FIRST: bool = false;

    fn poll_answer<T>(
        &mut self,
        shard: &Shard,
        slot: &Slot<T>,
        until: Option<Instant>,
        _cx: &mut Context<'_>,
    ) -> Poll<Wake<T>> {
        Poll::Ready(shard.wait(slot, until))
    }

    fn arm(&self, _: &Arc<Timer>, _: Option<Instant>, _: &Arc<dyn Cancel>, _: u64) -> Option<Armed> {
        None
    }
}

/// A task's first poll of a call: never ready, serving nothing, so the
/// executor runs its other tasks (whose calls may join this one's turn)
/// before this one comes back, and a task calling back to back never
/// starves it. It wakes itself where nobody else would wake it soon: in
/// combining mode (it may have to run the turn itself) or when its answer
/// (or its cancel) is here already; otherwise the answer's wake brings it
/// back.
pub(crate) async fn yield_once<T>(shard: &Shard, slot: &Slot<T>) {
    let mut first = true;
    std::future::poll_fn(|cx| {
        if !std::mem::take(&mut first) {
            return Poll::Ready(());
        }
        if slot.watch(cx) || shard.may_run_turns() {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    })
    .await
}

/// Drive `fut` to completion on this thread, or give up at `deadline`
/// (`None`: never), dropping it there: `None` then.
pub(crate) fn on<F: Future>(fut: F, deadline: Option<Instant>) -> Option<F::Output> {
    let parker = PARKER.with(Cell::take).unwrap_or_else(|| {
        Arc::new(Parker {
            thread: std::thread::current(),
            woken: AtomicBool::new(false),
        })
    });
    parker.woken.store(false, Ordering::Relaxed);
    let waker = Waker::from(parker.clone());
    let done = drive(std::pin::pin!(fut), &parker, &waker, deadline);
    drop(waker);
    PARKER.with(|p| p.set(Some(parker)));
    done
}

/// Drive `fut` to completion on this thread, however long it takes.
pub(crate) fn block<F: Future>(fut: F) -> F::Output {
    on(fut, None).expect("without a deadline a drive only ends ready")
}

fn drive<F: Future>(
    mut fut: std::pin::Pin<&mut F>,
    parker: &Parker,
    waker: &Waker,
    deadline: Option<Instant>,
) -> Option<F::Output> {
    let mut cx = Context::from_waker(waker);
    loop {
        if let Poll::Ready(value) = fut.as_mut().poll(&mut cx) {
            return Some(value);
        }
        while !parker.woken.swap(false, Ordering::Acquire) {
            match deadline {
                None => std::thread::park(),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return None;
                    }
                    std::thread::park_timeout(deadline - now);
                }
            }
        }
    }
}

/// The answer to a request pushed to `shard` (see [`Wait::poll_answer`]).
pub(crate) async fn answer<W: Wait, T>(w: &mut W, shard: &Shard, slot: &Slot<T>, until: Option<Instant>) -> Wake<T> {
    std::future::poll_fn(|cx| w.poll_answer(shard, slot, until, cx)).await
}

/// The answer to a request nobody cancels and nothing times out (a
/// spawn's try, a state round trip, a dropped call's verdict).
pub(crate) async fn value<W: Wait, T>(w: &mut W, shard: &Shard, slot: &Slot<T>) -> T {
    loop {
        if let Wake::Value(value) = answer(w, shard, slot, None).await {
            return value;
        }
    }
}
