//! A one-value answer channel, reused call after call, which can also be
//! *cancelled*: its waiter should stop waiting for the call it serves now.
//!
//! A cancel names the call it was meant for (the number [`Slot::begin`]
//! handed out): one that arrives after its call ended, racing the answer,
//! finds another number and is ignored, so it never reaches the next call.
//! An answer always wins over a cancel it raced: the waiter takes the value
//! and forgets the cancel.
//!
//! A waiter is a thread (it spins, then parks on the condvar) or a task (it
//! polls, leaving its `Waker`): whoever lands the value wakes whichever
//! waits. A task that goes away (its future dropped) *abandons* the slot: a
//! value landing later is refused and handed back to whoever offered it
//! (a lane granted to a spawner that left goes back to the table).

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::sync::{AtomicBool, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};

/// Who may touch it: the waiter (one thread: the handle's or spawner's
/// caller) begins calls, waits and takes; whoever answers (the worker, a
/// combining caller or the helper) offers; a [`CancelToken`](crate::CancelToken)
/// cancels. All go through `inner`.
pub(crate) struct Slot<T> {
    inner: Mutex<Inner<T>>,
    cv: Condvar,
    /// Set (after `inner` changed) by whoever wakes the waiter, so that the
    /// waiter can spin on it for a moment before parking: an answer landing
    /// within the spin costs no futex wake on either side.
    signalled: AtomicBool,
    /// The engine's id of the call answering into this slot now, written
    /// by the engine when it queues the call and read by it when a cancel
    /// for this slot arrives (so a cancel finds its call without a search).
    /// Who may touch it: the thread holding the engine only.
    engine_call: AtomicUsize,
}

struct Inner<T> {
    value: Option<T>,
    /// The call the slot serves now: bumped by the waiter at each call's
    /// start (`begin`), compared by `cancel`.
    call: u64,
    /// Set by a cancel of the current call; consumed by the waiter, or
    /// forgotten when the answer is taken first.
    cancelled: bool,
    /// Set by the waiter while it sleeps on `cv`: only then does a signal
    /// need a futex wake (a spinning or running waiter sees the change
    /// itself), which saves a system call per answer.
    parked: bool,
    /// Other waiters this one wakes when it takes its value (see
    /// [`wake_all`]). Set only while it is parked with its value landed, so
    /// the waiter takes both at once.
    duty: Vec<Arc<Slot<T>>>,
    /// A task waiting: left by its `poll`, taken and woken by whoever lands
    /// the value.
    waker: Option<Waker>,
    /// Set by a task that went away: values are refused from then on.
    abandoned: bool,
}

/// Who waits for a value that just landed.
enum Waiter {
    /// Nobody asleep: the waiter sees the value itself.
    Awake,
    /// A thread parked on the condvar.
    Parked,
    /// A task, to be woken through its waker.
    Task(Waker),
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
                call: 0,
                cancelled: false,
                parked: false,
                duty: Vec::new(),
                waker: None,
                abandoned: false,
            }),
            cv: Condvar::new(),
            signalled: AtomicBool::new(false),
            engine_call: AtomicUsize::new(usize::MAX),
        }
    }

    /// The engine queued call `id` to answer into this slot.
    pub fn set_engine_call(&self, id: usize) {
        self.engine_call.store(id, Ordering::Relaxed);
    }

    /// The engine's id of the call last queued to answer into this slot.
    pub fn engine_call(&self) -> usize {
        self.engine_call.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        // Nothing panics while this lock is held; recover anyway.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new call starts on this slot: a cancel meant for an earlier one is
    /// forgotten, and later ones for it are ignored. Returns the call's
    /// number, for [`Slot::cancel`].
    pub fn begin(&self) -> u64 {
        let mut inner = self.lock();
        inner.call = inner.call.wrapping_add(1);
        inner.cancelled = false;
        inner.call
    }

    /// Hand the waiter its answer; refused and handed back once the waiter
    /// went away.
    pub fn offer(&self, value: T) -> Result<(), T> {
        match self.land(value)? {
            Waiter::Awake => (),
            Waiter::Parked => self.cv.notify_one(),
            Waiter::Task(waker) => crate::wake::wake(waker),
        }
        Ok(())
    }

    /// [`Slot::offer`], for answers nobody needs back.
    pub fn fill(&self, value: T) {
        let _ = self.offer(value);
    }

    /// [`Slot::fill`] without the futex wake: returns whether a thread is
    /// parked on it, in which case the caller must see it woken
    /// ([`wake_all`]). A task waiting is woken at once (a waker is no
    /// system call of this thread's).
    pub fn fill_quietly(&self, value: T) -> bool {
        match self.land(value) {
            Ok(Waiter::Parked) => true,
            Ok(Waiter::Task(waker)) => {
                crate::wake::wake(waker);
                false
            }
            Ok(Waiter::Awake) | Err(_) => false,
        }
    }

    /// Store the answer unless the waiter went away; returns who waits (read
    /// under the lock a thread parks under and a task leaves its waker
    /// under, so a waiter about to sleep sees the value instead).
    fn land(&self, value: T) -> Result<Waiter, T> {
        let mut inner = self.lock();
        if inner.abandoned {
            return Err(value);
        }
        inner.value = Some(value);
        let waiter = match inner.waker.take() {
            Some(waker) => Waiter::Task(waker),
            None if inner.parked => Waiter::Parked,
            None => Waiter::Awake,
        };
        drop(inner);
        self.signalled.store(true, Ordering::Release);
        Ok(waiter)
    }

    /// [`Slot::poll_answer`] for a slot nobody cancels (a spawner's, a
    /// state round trip's): the value, or the task's waker left.
    pub fn poll_value(&self, cx: &mut Context<'_>) -> Poll<T> {
        loop {
            match self.poll_answer(cx) {
                Poll::Ready(Ok(value)) => return Poll::Ready(value),
                // A cancel is consumed by the look: look again.
                Poll::Ready(Err(())) => continue,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Whether the waiter has something to see ([`Slot::is_settled`]);
    /// if not, the task's waker is left to be woken when it does. Takes
    /// nothing: the next [`Slot::poll_answer`] does.
    pub fn watch(&self, cx: &mut Context<'_>) -> bool {
        let mut inner = self.lock();
        if inner.value.is_some() || inner.cancelled {
            return true;
        }
        leave_waker(&mut inner, cx);
        false
    }

    /// The task waiting went away, but whoever owns the slot will read its
    /// value later: no wake is due to the task any more.
    pub fn forget_waker(&self) {
        self.lock().waker = None;
    }

    /// The task waiting went away: later values are refused. Returns the
    /// value if it landed first, for the caller to undo.
    pub fn abandon(&self) -> Option<T> {
        let mut inner = self.lock();
        inner.abandoned = true;
        inner.waker = None;
        inner.value.take()
    }

    /// Wake the waiter if it sleeps.
    fn wake(&self) {
        if self.lock().parked {
            self.cv.notify_one();
        }
    }

    /// Hand `duty` to the waiter if it still sleeps with its value landed
    /// (it performs it on taking the value); otherwise give it back.
    fn assign(&self, duty: Vec<Arc<Slot<T>>>) -> Result<(), Vec<Arc<Slot<T>>>> {
        let mut inner = self.lock();
        if inner.parked && inner.value.is_some() {
            inner.duty = duty;
            Ok(())
        } else {
            Err(duty)
        }
    }

    /// Cancel call number `call`: ignored when the slot serves another call
    /// by now (the cancel lost the race with the answer).
    pub fn cancel(&self, call: u64) {
        let mut inner = self.lock();
        if inner.call != call {
            return;
        }
        inner.cancelled = true;
        // A task waiting is woken to see the cancel (its deadline passed).
        let waker = inner.waker.take();
        self.signal(inner);
        if let Some(waker) = waker {
            crate::wake::wake(waker);
        }
    }

    /// A task's wait for a call that may be cancelled: the value if it
    /// landed (a cancel it raced forgotten), `Err(())` once for a cancel of
    /// the current call, otherwise the task's waker is left to be woken by
    /// either.
    pub fn poll_answer(&self, cx: &mut Context<'_>) -> Poll<Result<T, ()>> {
        let mut inner = self.lock();
        if let Some(value) = inner.value.take() {
            inner.cancelled = false;
            inner.waker = None;
            return Poll::Ready(Ok(value));
        }
        if inner.cancelled {
            inner.cancelled = false;
            return Poll::Ready(Err(()));
        }
        leave_waker(&mut inner, cx);
        Poll::Pending
    }

    /// Wake the task waiting on this slot, if one is (its value not landed,
    /// not abandoned), without giving it anything: its poll finds no
    /// answer and goes on (a combining task then tries to run the turn
    /// itself). True where a task was woken; a thread waiter is left alone.
    pub fn nudge(&self) -> bool {
        let mut inner = self.lock();
        if inner.value.is_some() || inner.abandoned {
            return false;
        }
        let Some(waker) = inner.waker.take() else {
            return false;
        };
        drop(inner);
        crate::wake::wake(waker);
        true
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

    /// Whether the waiter has something to see: a value, or a cancel of
    /// the current call (a combining caller stops serving others' turns
    /// then, to settle its own call first).
    pub fn is_settled(&self) -> bool {
        let inner = self.lock();
        inner.value.is_some() || inner.cancelled
    }

    /// Whether the waiter went away ([`Slot::abandon`]): nobody takes a
    /// value from it any more.
    pub fn is_abandoned(&self) -> bool {
        self.lock().abandoned
    }

    /// Block until a value lands, the current call is cancelled, or
    /// `deadline` passes. A value wins over a cancel: taking it forgets the
    /// cancel, which came too late to matter.
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
                inner.cancelled = false;
                let duty = std::mem::take(&mut inner.duty);
                drop(inner);
                for other in duty {
                    other.wake();
                }
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

/// Leave the task's waker in `inner` (kept if it is the same task's).
fn leave_waker<T>(inner: &mut Inner<T>, cx: &Context<'_>) {
    match &inner.waker {
        Some(waker) if waker.will_wake(cx.waker()) => (),
        _ => inner.waker = Some(cx.waker().clone()),
    }
}

/// Wake the parked waiters of `slots` (their values landed with
/// [`Slot::fill_quietly`]) as a tree: this thread wakes the first two, and
/// each waiter woken wakes two more as it takes its value. The thread that
/// answered a wide turn makes two system calls instead of one per waiter;
/// the rest are spread over the waiters' own threads, off the thread that
/// runs the next turn.
pub(crate) fn wake_all<T>(slots: &mut Vec<Arc<Slot<T>>>) {
    const ROOTS: usize = 2;
    // Waiter `i` (from ROOTS on) is woken by waiter `(i - ROOTS) / 2`.
    // Duties are handed out children first, before any root wakes, so a
    // waiter rarely wakes before it knows its duty; one that did (a
    // spurious wake-up) refuses it, and this thread does it instead.
    let n = slots.len();
    for parent in (0..n.saturating_sub(ROOTS).div_ceil(2)).rev() {
        let children: Vec<Arc<Slot<T>>> = (2 * parent + ROOTS..(2 * parent + ROOTS + 2).min(n))
            .map(|c| slots[c].clone())
            .collect();
        if let Err(children) = slots[parent].assign(children) {
            for child in children {
                child.wake();
            }
        }
    }
    for root in slots.iter().take(ROOTS) {
        root.wake();
    }
    slots.clear();
}

/// What a cancel token can reach: the slot of the call it guards.
pub(crate) trait Cancel: Send + Sync {
    /// Cancel call number `call` of the slot (see [`Slot::begin`]).
    fn cancel(&self, call: u64);
}

impl<T: Send> Cancel for Slot<T> {
    fn cancel(&self, call: u64) {
        Slot::cancel(self, call)
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// An answer and a cancel racing leave exactly one outcome (the answer,
    /// seen at once or after the cancel), and the next call on the slot is
    /// clean: the cancel, however late it lands, never reaches it.
    #[test]
    fn an_answer_and_a_cancel_racing_leave_one_outcome_and_a_clean_next_call() {
        loom::model(|| {
            let slot = Arc::new(Slot::<u32>::new());
            let call = slot.begin();
            let (answerer, canceller) = (slot.clone(), slot.clone());
            let answering = loom::thread::spawn(move || answerer.fill(1));
            let cancelling = loom::thread::spawn(move || canceller.cancel(call));
            // As the runner does: a cancel seen first is followed by waiting
            // for the verdict, which here is the answer.
            let first = match slot.wait_until(None, false) {
                Wake::Value(v) => v,
                Wake::Cancelled => match slot.wait_until(None, false) {
                    Wake::Value(v) => v,
                    _ => panic!("one cancel seen twice"),
                },
                Wake::TimedOut => unreachable!("no deadline"),
            };
            assert_eq!(first, 1);
            answering.join().unwrap();
            // The next call, the cancel possibly still on its way.
            let next = slot.begin();
            assert_ne!(next, call);
            slot.fill(2);
            assert!(matches!(slot.wait_until(None, false), Wake::Value(2)));
            cancelling.join().unwrap();
            assert!(!slot.lock().cancelled, "a cancel of an ended call lingers in the slot");
        });
    }

    /// A cancel of a call still waiting wakes its waiter, once.
    #[test]
    fn a_cancel_wakes_its_waiter() {
        loom::model(|| {
            let slot = Arc::new(Slot::<u32>::new());
            let call = slot.begin();
            let canceller = slot.clone();
            let cancelling = loom::thread::spawn(move || canceller.cancel(call));
            assert!(matches!(slot.wait_until(None, false), Wake::Cancelled));
            cancelling.join().unwrap();
            slot.fill(7);
            assert!(matches!(slot.wait_until(None, false), Wake::Value(7)));
        });
    }

    /// Three waiters answered quietly and woken as a tree: whatever the
    /// interleaving (a waiter not asleep refuses its duty, which someone
    /// else then does), every waiter gets its value and none sleeps forever.
    #[test]
    fn a_wake_tree_leaves_no_waiter_asleep() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(2);
        model.check(|| {
            let slots: Vec<Arc<Slot<usize>>> = (0..3).map(|_| Arc::new(Slot::new())).collect();
            let waiters: Vec<_> = slots
                .iter()
                .map(|slot| {
                    let slot = slot.clone();
                    loom::thread::spawn(move || match slot.wait_until(None, false) {
                        Wake::Value(v) => v,
                        _ => panic!("no cancel, no deadline"),
                    })
                })
                .collect();
            // Every slot goes in the tree, asleep or not: a waiter that is not
            // parked when handed its duty (it has not slept yet, or took its
            // value already) must refuse it, and the duty still be done.
            let mut wakes = vec![];
            for (v, slot) in slots.iter().enumerate() {
                slot.fill_quietly(v);
                wakes.push(slot.clone());
            }
            wake_all(&mut wakes);
            let got: Vec<usize> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
            assert_eq!(got, vec![0, 1, 2]);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Threads parked on `n` slots, each sending its value once woken.
    fn parked_waiters(n: usize) -> (Vec<Arc<Slot<usize>>>, mpsc::Receiver<usize>) {
        let (tx, rx) = mpsc::channel();
        let slots: Vec<Arc<Slot<usize>>> = (0..n).map(|_| Arc::new(Slot::new())).collect();
        for slot in &slots {
            let (slot, tx) = (slot.clone(), tx.clone());
            std::thread::spawn(move || {
                if let Wake::Value(v) = slot.wait_until(None, false) {
                    let _ = tx.send(v);
                }
            });
        }
        for slot in &slots {
            while !slot.lock().parked {
                std::thread::yield_now();
            }
        }
        (slots, rx)
    }

    fn received(rx: &mpsc::Receiver<usize>, n: usize) -> Vec<usize> {
        let mut got: Vec<usize> = (0..n)
            .map_while(|_| rx.recv_timeout(Duration::from_secs(10)).ok())
            .collect();
        got.sort_unstable();
        got
    }

    /// Every parked waiter of a wide turn gets its value, though the
    /// answering thread wakes only two of them itself.
    #[test]
    fn a_wake_tree_reaches_every_parked_waiter() {
        for n in [1, 2, 3, 7, 40] {
            let (slots, rx) = parked_waiters(n);
            let mut wakes = vec![];
            for (v, slot) in slots.iter().enumerate() {
                assert!(slot.fill_quietly(v), "waiter {v} is parked");
                wakes.push(slot.clone());
            }
            wake_all(&mut wakes);
            assert_eq!(received(&rx, n), (0..n).collect::<Vec<_>>(), "{n} waiters");
            assert!(wakes.is_empty());
        }
    }

    /// A waiter that is not asleep refuses a duty; the answering thread
    /// then wakes that waiter's share itself.
    #[test]
    fn a_refused_duty_is_done_by_the_answering_thread() {
        let (slots, rx) = parked_waiters(4);
        // Two roots nobody waits on: each refuses its two children.
        let roots: Vec<Arc<Slot<usize>>> = (0..2).map(|_| Arc::new(Slot::new())).collect();
        let mut wakes: Vec<Arc<Slot<usize>>> = roots.clone();
        for (v, slot) in slots.iter().enumerate() {
            assert!(slot.fill_quietly(v));
            wakes.push(slot.clone());
        }
        for root in &roots {
            assert!(!root.fill_quietly(99), "nobody is parked on a root");
        }
        wake_all(&mut wakes);
        assert_eq!(received(&rx, 4), vec![0, 1, 2, 3]);
    }
}
