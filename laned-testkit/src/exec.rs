//! A strict test executor, which fails on a lost wake-up, and test wakers.
//!
//! [`Strict`] polls a task only when its waker was called. A task that
//! returns `Pending` and is never woken again within the bound is a
//! [`Stall`], not a hang: the test fails, naming the task.
//!
//! ```
//! use std::task::Poll;
//! use std::time::Duration;
//! use laned_testkit::exec::Strict;
//!
//! assert_eq!(Strict::block_on(async { 7 }, Duration::from_secs(10)).unwrap(), 7);
//! // Pending without keeping the waker: nobody can wake it again.
//! let lost = std::future::poll_fn(|_| Poll::<()>::Pending);
//! assert!(Strict::block_on(lost, Duration::from_millis(20)).is_err());
//! ```
//!
//! The wakers ([`panicking_waker`], [`counting_waker`],
//! [`never_repolled_waker`], [`reentrant_waker`]) are for polling a future by
//! hand with [`poll_once`]. Std only: no runtime, no runner.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

mod wakers;
pub use wakers::{counting_waker, never_repolled_waker, panicking_waker, poll_once, reentrant_waker, WakeCount};

/// A task of a [`Strict`] executor (its index in spawn order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub usize);

/// Tasks left unfinished with no wake-up within the bound: a lost wake-up
/// (a future returned `Pending` and nobody ever woke it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stall {
    /// The tasks not finished, in spawn order.
    pub pending: Vec<TaskId>,
    /// How long the executor waited for a wake-up, in total.
    pub waited: Duration,
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<String> = self.pending.iter().map(|t| t.0.to_string()).collect();
        write!(
            f,
            "tasks [{}] were never woken again after returning pending (a lost wake-up); waited {:?}",
            ids.join(", "),
            self.waited
        )
    }
}

impl std::error::Error for Stall {}

/// The output of a spawned task, once it finished.
#[derive(Debug)]
pub struct Join<T> {
    id: TaskId,
    output: Rc<RefCell<Option<T>>>,
}

impl<T> Join<T> {
    /// The task.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// The output, once: `None` before the task finished, after it was
    /// dropped, or when taken already.
    pub fn take(&self) -> Option<T> {
        self.output.borrow_mut().take()
    }
}

/// What the wakers share with their executor: the woken tasks, in order.
#[derive(Default)]
struct Shared {
    woken: Mutex<VecDeque<usize>>,
    ready: Condvar,
}

impl Shared {
    fn push(&self, id: usize) {
        self.woken.lock().unwrap_or_else(|e| e.into_inner()).push_back(id);
        self.ready.notify_one();
    }

    fn pop(&self) -> Option<usize> {
        self.woken.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
    }

    /// Waits until some task is woken or `timeout` passed; true if woken.
    fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut woken = self.woken.lock().unwrap_or_else(|e| e.into_inner());
        while woken.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            woken = self
                .ready
                .wait_timeout(woken, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

/// One task's waker: queues the task once until it is polled again.
struct TaskWaker {
    id: usize,
    queued: AtomicBool,
    wakes: AtomicUsize,
    shared: Arc<Shared>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::Relaxed);
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.shared.push(self.id);
        }
    }
}

struct Task {
    /// `None` once finished or dropped.
    future: Option<Pin<Box<dyn Future<Output = ()>>>>,
    done: bool,
    polls: usize,
    waker: Arc<TaskWaker>,
}

/// A single-threaded executor for tests that fails on a lost wake-up.
///
/// A task is polled once when spawned, then only after its waker was called
/// (from any thread). Futures need not be `Send`; the wakers are `Send +
/// Sync` and count their wakes. A wake of a finished or dropped task is
/// ignored. A future that wakes itself on every poll keeps it busy: that is
/// progress, not a stall, so [`run`](Strict::run) bounds waiting only.
#[derive(Default)]
pub struct Strict {
    tasks: Vec<Task>,
    shared: Arc<Shared>,
}

impl Strict {
    /// An executor with no tasks.
    pub fn new() -> Strict {
        Strict::default()
    }

    /// Runs `future` to its end, waiting at most `bound` in total for its
    /// wake-ups.
    pub fn block_on<F: Future<Output = T> + 'static, T: 'static>(future: F, bound: Duration) -> Result<T, Stall> {
        let mut strict = Strict::new();
        let join = strict.spawn(future);
        strict.run(bound)?;
        Ok(join.take().expect("a finished task left its output"))
    }

    /// Adds a task, woken so that it is polled on the next run.
    pub fn spawn<F: Future<Output = T> + 'static, T: 'static>(&mut self, future: F) -> Join<T> {
        let id = self.tasks.len();
        let output = Rc::new(RefCell::new(None));
        let slot = output.clone();
        let waker = Arc::new(TaskWaker {
            id,
            queued: AtomicBool::new(false),
            wakes: AtomicUsize::new(0),
            shared: self.shared.clone(),
        });
        waker.queued.store(true, Ordering::Release);
        self.shared.push(id);
        let future = Box::pin(async move { *slot.borrow_mut() = Some(future.await) });
        self.tasks.push(Task {
            future: Some(future),
            done: false,
            polls: 0,
            waker,
        });
        Join { id: TaskId(id), output }
    }

    /// Polls every woken task until none is woken; returns the polls made.
    pub fn run_until_stalled(&mut self) -> usize {
        let mut polls = 0;
        while let Some(id) = self.shared.pop() {
            let task = &mut self.tasks[id];
            task.waker.queued.store(false, Ordering::Release);
            let Some(future) = task.future.as_mut() else { continue };
            let waker = Waker::from(task.waker.clone());
            task.polls += 1;
            polls += 1;
            if future.as_mut().poll(&mut Context::from_waker(&waker)).is_ready() {
                task.future = None;
                task.done = true;
            }
        }
        polls
    }

    /// Runs until every task finished, waiting for wake-ups at most `bound`
    /// in total; a [`Stall`] names the tasks still pending after that.
    pub fn run(&mut self, bound: Duration) -> Result<(), Stall> {
        let mut waited = Duration::ZERO;
        loop {
            self.run_until_stalled();
            let pending = self.pending();
            if pending.is_empty() {
                return Ok(());
            }
            let start = Instant::now();
            let woken = self.shared.wait(bound.saturating_sub(waited));
            waited += start.elapsed();
            if !woken {
                return Err(Stall { pending, waited });
            }
        }
    }

    /// The tasks neither finished nor dropped, in spawn order.
    pub fn pending(&self) -> Vec<TaskId> {
        let live = self.tasks.iter().enumerate().filter(|(_, t)| t.future.is_some());
        live.map(|(i, _)| TaskId(i)).collect()
    }

    /// Whether the task returned `Ready` (a dropped task is not done).
    pub fn is_done(&self, id: TaskId) -> bool {
        self.task(id).done
    }

    /// Drops the task's future where it stands (to test cancel safety at a
    /// poll point); later wakes of it are ignored.
    pub fn drop_task(&mut self, id: TaskId) {
        let future = self.tasks.get_mut(id.0).and_then(|t| t.future.take());
        drop(future);
    }

    /// How many times the task was polled.
    pub fn polls(&self, id: TaskId) -> usize {
        self.task(id).polls
    }

    /// How many times the task's waker was called (not counting the spawn).
    pub fn wakes(&self, id: TaskId) -> usize {
        self.task(id).waker.wakes.load(Ordering::Relaxed)
    }

    fn task(&self, id: TaskId) -> &Task {
        self.tasks
            .get(id.0)
            .unwrap_or_else(|| panic!("no task {} in this executor", id.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Poll;

    const BOUND: Duration = Duration::from_secs(10);

    /// A future pending without keeping its waker is a stall naming it.
    #[test]
    fn exec_lost_wake_up_is_a_stall() {
        let mut strict = Strict::new();
        let fine = strict.spawn(async { 1 });
        let lost = strict.spawn(std::future::poll_fn(|_| Poll::<()>::Pending));
        let stall = strict.run(Duration::from_millis(50)).unwrap_err();
        assert_eq!(stall.pending, vec![lost.id()]);
        assert!(stall.waited >= Duration::from_millis(50));
        assert!(
            stall.to_string().contains("tasks [1] were never woken again"),
            "{stall}"
        );
        assert_eq!(
            (fine.take(), strict.polls(lost.id()), strict.is_done(lost.id())),
            (Some(1), 1, false)
        );
    }

    /// A future woken from another thread after 50 ms completes.
    #[test]
    fn exec_wake_from_another_thread_completes() {
        let fired = Arc::new(AtomicBool::new(false));
        let future = std::future::poll_fn(move |cx| {
            if fired.load(Ordering::SeqCst) {
                return Poll::Ready("woken");
            }
            let (fired, waker) = (fired.clone(), cx.waker().clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                fired.store(true, Ordering::SeqCst);
                waker.wake();
            });
            Poll::Pending
        });
        let mut strict = Strict::new();
        let join = strict.spawn(future);
        assert_eq!(strict.run(BOUND), Ok(()));
        assert_eq!(
            (join.take(), strict.polls(join.id()), strict.wakes(join.id())),
            (Some("woken"), 2, 1)
        );
        assert!(strict.is_done(join.id()));
    }

    /// `drop_task` runs the future's Drop; a later wake of it is ignored.
    #[test]
    fn exec_drop_task_drops_the_future() {
        struct Guard(Arc<AtomicBool>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let (dropped, kept) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(None)));
        let (guard, slot) = (Guard(dropped.clone()), kept.clone());
        let mut strict = Strict::new();
        let join = strict.spawn(std::future::poll_fn(move |cx| {
            let _guard = &guard;
            *slot.lock().unwrap() = Some(cx.waker().clone());
            Poll::<()>::Pending
        }));
        assert_eq!(strict.run_until_stalled(), 1);
        strict.drop_task(join.id());
        assert!(dropped.load(Ordering::SeqCst));
        kept.lock().unwrap().take().unwrap().wake();
        assert_eq!(strict.run_until_stalled(), 0);
        assert_eq!((strict.is_done(join.id()), join.take()), (false, None));
        assert_eq!(strict.run(BOUND), Ok(()));
    }

    /// A wake of a finished task is ignored, and `block_on` gives the output.
    #[test]
    fn exec_wake_after_finish_is_ignored() {
        let kept = Arc::new(Mutex::new(None));
        let slot = kept.clone();
        let mut strict = Strict::new();
        let join = strict.spawn(std::future::poll_fn(move |cx| {
            *slot.lock().unwrap() = Some(cx.waker().clone());
            Poll::Ready(())
        }));
        assert_eq!(strict.run_until_stalled(), 1);
        kept.lock().unwrap().take().unwrap().wake();
        assert_eq!((strict.run_until_stalled(), strict.polls(join.id())), (0, 1));
        assert_eq!(Strict::block_on(async { "out" }, BOUND), Ok("out"));
    }

    /// The executor's wakers may cross threads.
    #[test]
    fn exec_wakers_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<TaskWaker>();
    }
}
