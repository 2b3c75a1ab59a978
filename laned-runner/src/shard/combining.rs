//! `Mode::Combining`: no hand-off while the state is idle. The calling
//! thread that finds the state free runs the turn itself; a caller whose
//! own call is answered leaves at once, handing what is still queued to the
//! shard's helper thread, which serves it as a worker would until nothing is
//! queued for a moment. While no calling thread sleeps on an answer (the
//! callers are tasks), the helper runs one turn and hands the next back to
//! a queued task, whose poll runs it on its own executor thread.

use std::sync::{Arc, TryLockError};
use std::time::Duration;

use crate::config::Resolved;
use crate::engine::{Engine, Parts};
use crate::err::NewRunnerError;
use crate::sync::{lock, AtomicBool, Condvar, MutexGuard, Ordering};
use crate::wake::Deferred;

use super::{Flavor, Shard};

/// Combining mode's own part of a shard.
pub(super) struct Combining {
    /// Signalled (with the inbox lock) when help is wanted or the shard
    /// closes; the helper sleeps on it.
    pub(super) help: Condvar,
    /// Set by a combiner leaving the state with seats still queued, taken
    /// by the helper, which then serves the queue. Who may touch it: only
    /// with the inbox lock held (so the helper's look and sleep never miss
    /// it).
    help_wanted: AtomicBool,
}

impl Combining {
    pub(super) fn new() -> Combining {
        Combining {
            help: Condvar::new(),
            help_wanted: AtomicBool::new(false),
        }
    }
}

/// How long the helper keeps the state once nothing is queued.
const HELPER_HOLD: Duration = Duration::from_micros(200);

impl Shard {
    /// Build the engine on this thread and start the helper.
    pub(super) fn start_combining(parts: Parts, config: &Resolved) -> Result<Arc<Shard>, NewRunnerError> {
        let (index, live) = (parts.index, parts.live.clone());
        let engine = Engine::start(parts, config)?;
        let shard = Arc::new(Shard::new(engine, config, live));
        let helper = shard.clone();
        let thread = std::thread::Builder::new()
            .name(format!("laned-helper-{index}"))
            .spawn(move || {
                if let Flavor::Combining(combining) = &helper.flavor {
                    helper.help(combining);
                }
            })
            .map_err(|e| NewRunnerError::Spawn(format!("starting the helper thread: {e}")))?;
        *lock(&shard.worker) = Some(thread);
        Ok(shard)
    }

    /// Combining mode: the state, if it is free and the shard open, with
    /// idle streams evicted. `None` when busy: whoever holds it looks at the
    /// inbox after letting go, and hands queued seats to the helper. `None`
    /// once closed: the closing thread answers everyone, stay out of its
    /// way.
    pub(super) fn hold(&self) -> Option<MutexGuard<'_, Engine>> {
        if self.is_closed() {
            return None;
        }
        let mut engine = match self.engine.try_lock() {
            Ok(engine) => engine,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        // A close between the look above and the lock: the engine is closed
        // (its state gone), and the closing thread answers everyone.
        if engine.is_closed() {
            return None;
        }
        // Taking the inbox in evicts idle streams, as of the take: a stream
        // whose call waits there is not idle, however long the last turn.
        self.take_inbox(&mut engine);
        Some(engine)
    }

    /// Combining mode: while `done` is false and the state is free, hold it
    /// and run turns. With `hold_when_empty` (the helper), wait that long
    /// for the next request once nothing is queued before letting go.
    /// Leaving with seats queued, hand them to the helper.
    pub(super) fn combine(&self, combining: &Combining, done: &dyn Fn() -> bool, hold_when_empty: Option<Duration>) {
        loop {
            // Wakes asked for while holding the state run once it is let go
            // (see `wake`): the scope closes after the guard below drops.
            let _wakes = Deferred::open();
            let Some(mut engine) = self.hold() else {
                return;
            };
            // Set when the helper handed the next turn to a task: the turns
            // run by then.
            let mut passed = None;
            loop {
                self.take_inbox(&mut engine);
                if !engine.has_queue() {
                    // The callers just answered come back soon under load:
                    // the helper waiting for them keeps their seats in one
                    // turn, where a caller finding the state free would run
                    // a narrow one of its own.
                    // Not while draining: no new call can join, and the
                    // drain waits for the state.
                    if !engine.is_draining() && hold_when_empty.is_some() {
                        // The turn's answers wake their tasks before the
                        // helper waits for more.
                        self.wake_kept(&mut engine);
                    }
                    // Only threads wait for the helper's hold: a task whose
                    // call arrives runs its turn in its own poll.
                    let hold = hold_when_empty.filter(|_| self.threads_wait());
                    if !engine.is_draining() && hold.is_some_and(|hold| self.arrival_within(hold)) {
                        continue;
                    }
                    break;
                }
                // Our own call answered, we leave at once: another turn here
                // would keep this thread from its own stream's next call,
                // which may be the one the others wait for. The helper
                // serves what is queued.
                // A caller (no `hold_when_empty`) runs only a turn that is
                // due now: waiting out the turn policy is the helper's job,
                // so that a caller (or a task, in its poll) never sleeps
                // holding the state where its own cancel or deadline cannot
                // reach it.
                let due = match hold_when_empty {
                    Some(_) => self.wait_for_turn(&mut engine),
                    None => self.turn_is_due(&mut engine),
                };
                let Some(live) = due.filter(|_| !done()) else {
                    break;
                };
                self.wake_kept(&mut engine);
                engine.turn(&live);
                // Serving turn after turn: each turn's answers wake their
                // tasks now, not when the state is let go.
                self.wake_kept(&mut engine);
                // The helper, with seats still queued and no thread asleep
                // on an answer: every queued caller is a task (or a thread
                // about to try the state itself). One of those tasks runs
                // the next turn in its poll, where its answers wake their
                // tasks on their own executor: the helper lets go and wakes
                // it (after the state is let go, as every wake), instead of
                // waking each task from outside the executor, turn after
                // turn.
                if hold_when_empty.is_some()
                    && !engine.is_draining()
                    && !self.threads_wait()
                    && engine.has_queue()
                    && engine.pass_to_a_task()
                {
                    passed = Some(engine.turns_run());
                    break;
                }
            }
            if let Some(turns) = passed {
                // Let go, and the task's wake runs (it was kept while the
                // state was held). Then make sure the turn was taken: a
                // task woken need not be polled soon (its future dropped,
                // its owner busy elsewhere, its waker a panicking one).
                drop(engine);
                drop(_wakes);
                if self.handed_turn_taken(turns) {
                    return;
                }
                continue;
            }
            let queued = engine.has_queue();
            drop(engine);
            // A request pushed while we held the state found it busy and
            // relies on us: queued seats go to the helper, and requests
            // still in the inbox make us go round once more.
            let inbox = self.inbox.lock();
            if queued {
                combining.help_wanted.store(true, Ordering::Relaxed);
                drop(inbox);
                combining.help.notify_one();
                return;
            }
            if inbox.requests.is_empty() {
                return;
            }
        }
    }

    /// Combining mode, the helper's loop: sleep until a combiner leaves
    /// seats queued, then serve the state until nothing is queued, lingering
    /// as the turn policy says. It has no call of its own, so under steady
    /// load it serves as a worker would, and no caller is held up serving
    /// others.
    ///
    /// With an idle timeout it also wakes every `idle_tick` to look after
    /// idle streams (`tend`): callers may all be tasks, or all asleep, and
    /// no other thread of the runner's watches the clock in this mode.
    pub(super) fn help(&self, combining: &Combining) {
        // Only with an idle timeout: no other thread of the runner's
        // watches the clock in this mode (callers may all be asleep, or
        // tasks).
        let tick = self.idle_timeout.map(|_| Duration::from_millis(5));
        loop {
            let wanted = {
                let mut inbox = self.inbox.lock();
                let mut ticked = false;
                while !combining.help_wanted.load(Ordering::Relaxed) && !inbox.closed && !ticked {
                    inbox = match tick {
                        None => combining.help.wait(inbox).unwrap_or_else(|e| e.into_inner()),
                        Some(tick) => {
                            let (inbox, timeout) = combining
                                .help
                                .wait_timeout(inbox, tick)
                                .unwrap_or_else(|e| e.into_inner());
                            ticked = timeout.timed_out();
                            inbox
                        }
                    };
                }
                if inbox.closed {
                    return;
                }
                combining.help_wanted.swap(false, Ordering::Relaxed)
            };
            if wanted {
                // Never done: it has no call of its own.
                self.combine(combining, &|| false, Some(HELPER_HOLD));
            } else {
                self.tend();
            }
        }
    }

    /// After handing the next turn to a task (`turns` run by then): wait
    /// up to `HELPER_HOLD` for it to take the state. True once a turn ran
    /// since, or someone holds the state, or nothing waits to be served;
    /// false when the state is still free with seats queued or requests in
    /// the inbox and no turn ran: the helper serves again.
    fn handed_turn_taken(&self, turns: u64) -> bool {
        let until = std::time::Instant::now() + HELPER_HOLD;
        loop {
            std::thread::sleep(HELPER_HOLD / 4);
            let engine = match self.engine.try_lock() {
                Ok(engine) => engine,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                // Someone holds it: they look at the queue and the inbox
                // when they let go, as every holder does.
                Err(TryLockError::WouldBlock) => return true,
            };
            if engine.is_closed() || engine.turns_run() != turns {
                return true;
            }
            if !engine.has_queue() && self.inbox.lock().requests.is_empty() {
                return true;
            }
            drop(engine);
            if std::time::Instant::now() >= until {
                return false;
            }
        }
    }

    /// Whether a calling thread sleeps on its answer now (one counted in
    /// `Shard::wait`): the helper then keeps serving, for nobody else would.
    fn threads_wait(&self) -> bool {
        self.waiters.load(Ordering::Relaxed) > 0
    }

    /// Sleep until a request arrives (true) or `hold` passes or the shard
    /// closes (false).
    pub(super) fn arrival_within(&self, hold: Duration) -> bool {
        let mut inbox = self.inbox.lock();
        if inbox.requests.is_empty() && !inbox.closed {
            inbox = self.inbox.sleep(inbox, 1, Some(hold));
        }
        !inbox.requests.is_empty() && !inbox.closed
    }

    /// Draining, step 6 in combining mode: this thread holds the state and
    /// serves the queue until it is empty.
    pub(super) fn drain_combining(&self) {
        let _wakes = Deferred::open();
        let mut engine = lock(&self.engine);
        engine.start_draining();
        loop {
            self.take_inbox(&mut engine);
            if !engine.has_queue() {
                break;
            }
            self.wake_kept(&mut engine);
            engine.turn(&self.live.load());
        }
    }

    /// Closing, steps 9 and 10 in combining mode, on the closing thread.
    pub(super) fn close_combining(&self) {
        let _wakes = Deferred::open();
        let mut engine = lock(&self.engine);
        engine.close();
        // Requests pushed after the close are answered by the same close:
        // the engine is closed for good.
        let requests = self.inbox.take(&mut self.inbox.lock());
        engine.accept_batch(requests, std::time::Instant::now());
    }
}
