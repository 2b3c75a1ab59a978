//! Driving one of the runner's futures on a thread: the blocking forms of
//! operations whose one implementation is a future (a spawn waiting in the
//! admission queue, a round trip to an engine). The thread polls, then
//! parks until the future's waker unparks it or the deadline passes.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Instant;

/// Wakes the thread driving a future.
struct Parker {
    thread: Thread,
    /// Set by a wake, taken by the driver before it parks: a wake that
    /// lands between a poll and the park is not lost.
    woken: AtomicBool,
}

impl Wake for Parker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Drive `fut` to completion on this thread, or give up at `deadline`
/// (`None`: never), dropping it there: `None` then.
pub(crate) fn on<F: Future>(fut: F, deadline: Option<Instant>) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let parker = Arc::new(Parker {
        thread: std::thread::current(),
        woken: AtomicBool::new(false),
    });
    let waker = Waker::from(parker.clone());
    let mut cx = Context::from_waker(&waker);
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
