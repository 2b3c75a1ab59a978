//! Test wakers, for polling a future by hand with [`poll_once`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Wake, Waker};

/// Polls `future` once with `waker`.
pub fn poll_once<F: Future>(future: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(waker))
}

struct Panicking(&'static str);

impl Wake for Panicking {
    fn wake(self: Arc<Self>) {
        panic!("{}", self.0)
    }

    fn wake_by_ref(self: &Arc<Self>) {
        panic!("{}", self.0)
    }
}

/// A waker whose `wake` and `wake_by_ref` panic with `message`; cloning and
/// dropping it do not.
pub fn panicking_waker(message: &'static str) -> Waker {
    Waker::from(Arc::new(Panicking(message)))
}

struct Reentrant<F>(F);

impl<F: Fn() + Send + Sync + 'static> Wake for Reentrant<F> {
    fn wake(self: Arc<Self>) {
        (self.0)()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        (self.0)()
    }
}

/// A waker that runs `f` on every wake (one calling back into the runner).
pub fn reentrant_waker(f: impl Fn() + Send + Sync + 'static) -> Waker {
    Waker::from(Arc::new(Reentrant(f)))
}

/// What the wakers of one [`counting_waker`] call did.
#[derive(Debug, Default)]
pub struct WakeCount {
    wakes: AtomicUsize,
    clones: AtomicUsize,
    live: AtomicUsize,
}

impl WakeCount {
    /// Calls of `wake` and `wake_by_ref`.
    pub fn wakes(&self) -> usize {
        self.wakes.load(Ordering::SeqCst)
    }

    /// Clones made, ever.
    pub fn clones(&self) -> usize {
        self.clones.load(Ordering::SeqCst)
    }

    /// Wakers alive now, the first one included (1 when only it is).
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

/// Data pointer: an `Arc<WakeCount>` from `Arc::into_raw`, one strong count
/// per live waker. One static vtable, so clones satisfy `will_wake`.
static COUNTING: RawWakerVTable = RawWakerVTable::new(count_clone, count_wake, count_wake_by_ref, count_drop);

/// # Safety
/// `data` is the pointer of a live counting waker (see [`COUNTING`]).
unsafe fn count<'a>(data: *const ()) -> &'a WakeCount {
    // SAFETY: the waker calling holds a strong count, so the `WakeCount` is
    // alive for the call; the reference never outlives a vtable function.
    unsafe { &*data.cast::<WakeCount>() }
}

unsafe fn count_clone(data: *const ()) -> RawWaker {
    // SAFETY: `data` came from `Arc::into_raw` and the cloned waker holds a
    // count; the new waker owns the one added here.
    unsafe { Arc::increment_strong_count(data.cast::<WakeCount>()) };
    let count = unsafe { count(data) };
    count.clones.fetch_add(1, Ordering::SeqCst);
    count.live.fetch_add(1, Ordering::SeqCst);
    RawWaker::new(data, &COUNTING)
}

unsafe fn count_wake(data: *const ()) {
    // SAFETY: waking by value consumes the waker: count, then drop it.
    unsafe {
        count_wake_by_ref(data);
        count_drop(data);
    }
}

unsafe fn count_wake_by_ref(data: *const ()) {
    unsafe { count(data) }.wakes.fetch_add(1, Ordering::SeqCst);
}

unsafe fn count_drop(data: *const ()) {
    unsafe { count(data) }.live.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: gives back the count this waker owned; last use of `data`.
    unsafe { Arc::decrement_strong_count(data.cast::<WakeCount>()) };
}

/// A waker counting its wakes, clones and live copies; its clones share one
/// data pointer and vtable, so they `will_wake` each other.
pub fn counting_waker() -> (Waker, Arc<WakeCount>) {
    let counts = Arc::new(WakeCount {
        live: AtomicUsize::new(1),
        ..WakeCount::default()
    });
    let data = Arc::into_raw(counts.clone()).cast::<()>();
    // SAFETY: the vtable keeps the `RawWaker` contract: a clone owns a strong
    // count of the same `Arc` and the same vtable, a drop or a wake by value
    // gives it back, and the counters are atomics, so any thread may use it.
    (unsafe { Waker::from_raw(RawWaker::new(data, &COUNTING)) }, counts)
}

/// A waker that records wakes while nothing ever polls again: for a future
/// polled once, then abandoned without being dropped. A [`counting_waker`].
pub fn never_repolled_waker() -> (Waker, Arc<WakeCount>) {
    counting_waker()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    /// The panicking waker panics on wake, by value or by reference, not on clone.
    #[test]
    fn exec_panicking_waker_panics_on_wake_only() {
        let waker = panicking_waker("woken for nothing");
        let clone = waker.clone();
        let message = catch_unwind(AssertUnwindSafe(|| waker.wake_by_ref())).unwrap_err();
        assert_eq!(
            message.downcast_ref::<String>().map(String::as_str),
            Some("woken for nothing")
        );
        assert!(catch_unwind(AssertUnwindSafe(move || clone.wake())).is_err());
        drop(waker);
    }

    /// The counting waker counts clones, drops and wakes; clones `will_wake`.
    #[test]
    fn exec_counting_waker_counts() {
        let (waker, counts) = counting_waker();
        let clones: Vec<Waker> = (0..2000).map(|_| waker.clone()).collect();
        assert_eq!((counts.clones(), counts.live()), (2000, 2001));
        assert!(clones.iter().all(|c| c.will_wake(&waker)));
        assert!(!waker.will_wake(&counting_waker().0));
        clones[0].wake_by_ref();
        drop(clones);
        assert_eq!((counts.wakes(), counts.live()), (1, 1));
        let by_value = waker.clone();
        by_value.wake();
        assert_eq!((counts.wakes(), counts.clones(), counts.live()), (2, 2001, 1));
        drop(waker);
        assert_eq!((counts.live(), Arc::strong_count(&counts)), (0, 1));
    }

    /// A future polled once then abandoned still records its wakes.
    #[test]
    fn exec_never_repolled_waker_records_wakes() {
        let (waker, counts) = never_repolled_waker();
        let mut future = std::pin::pin!(std::future::poll_fn(|cx| {
            cx.waker().wake_by_ref();
            Poll::<()>::Pending
        }));
        assert!(poll_once(future.as_mut(), &waker).is_pending());
        assert_eq!(counts.wakes(), 1);
    }

    /// The reentrant waker runs its closure on every wake.
    #[test]
    fn exec_reentrant_waker_runs_its_closure() {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let waker = reentrant_waker(move || {
            seen.fetch_add(1, Ordering::SeqCst);
        });
        waker.wake_by_ref();
        let by_value = waker.clone();
        by_value.wake();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    /// The counting waker may cross threads.
    #[test]
    fn exec_counting_waker_is_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<WakeCount>();
    }
}
